"""The probability path (`jaxroll.engine.probability`) against a NumPy float64 oracle written here.

The oracle forms each layer from per-head logits written out below (ALiBi's
``(-m (i - j) + d [i = j] + b) / tau``, a table's ``f(i - j)``, a dense
kernel's ``log A``), then ``A_h = rowsoftmax``, ``S_h = |z - zbar|``,
``B = sum_h w_h (A_h + g A_h S_h)``, ``c = sum_h w_h sum_j A_h S_h`` and the row
``((1 - lambda) e_i + lambda B_i) / (1 + lambda g c_i)``, and multiplies the
last row through the layers: nothing of jaxroll's is used in it.
"""

import math
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import interventions as iv
from jaxroll.engine.probability import MAX_LENGTH, gain_from_ratio, row_spreads
from jaxroll.errors import ConfigError
from jaxroll.kernel_types import DenseKernel, TableKernel
from jaxroll.metrics import middle_mass
from jaxroll.model import RolloutModel, with_probability_gains

N = 12
RNG = np.random.default_rng(53)


# The oracle -----------------------------------------------------------------------------------------

def causal(n):
    return np.tril(np.ones((n, n), dtype=bool))


def alibi_logits(slopes, diagonal, base, tau, n):
    """(T, H, n, n) per-head ALiBi + content logits, -inf above the diagonal."""
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    z = (-slopes[..., None, None] * offsets + diagonal[..., None, None] * np.eye(n) + base[..., None, None])
    return np.where(causal(n), z / tau, -np.inf)


def table_logits(table, diagonal, n):
    """(T, H, n, n): f(0) = diagonal, f(k) = table[k - 1]."""
    scores = np.concatenate([diagonal[..., None], table[..., : n - 1]], axis=-1)
    offsets = np.maximum(np.arange(n)[:, None] - np.arange(n)[None, :], 0)
    return np.where(causal(n), scores[..., offsets], -np.inf)


def dense_logits(kernels, n):
    """(T, 1, n, n): log A where A > 0."""
    block = kernels[:, :n, :n]
    with np.errstate(divide="ignore"):
        return np.where(block > 0, np.log(block), -np.inf)[:, None]


def oracle_layer(logits, weights, lam, gain):
    n = logits.shape[-1]
    weights = weights / weights.sum()
    b, c = np.zeros((n, n)), np.zeros(n)
    for z, w in zip(logits, weights):
        a = np.exp(z - z.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        finite = np.where(np.isfinite(z), z, 0.0)
        mean = (a * finite).sum(axis=1, keepdims=True)
        s = np.where(np.isfinite(z), np.abs(finite - mean), 0.0)
        b += w * (a + gain * a * s)
        c += w * (a * s).sum(axis=1)
    return ((1 - lam) * np.eye(n) + lam * b) / (1 + lam * gain * c)[:, None]


def oracle_profile(logits, weights, lambdas, gains):
    n = logits.shape[-1]
    row = np.zeros(n)
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        row = row @ oracle_layer(logits[t], weights[t], lambdas[t], gains[t])
    return row / row.sum()


def oracle_middle(logits, weights, lambdas, gains):
    p = oracle_profile(logits, weights, lambdas, gains)
    k = max(1, round(0.1 * len(p)))
    return p[k: len(p) - k].sum()


# Three kernels with their oracle logits ---------------------------------------------------------------

T, H = 3, 2
LAMBDAS = np.array([0.3, 0.55, 0.8])
GAINS = np.array([0.7, 1.5, 0.25])
SLOPES = np.array([[0.5, 0.125], [0.3, 0.05], [0.8, 0.2]])
DIAGONAL = RNG.normal(size=(T, H))
BASE = RNG.normal(size=(T, H))
WEIGHTS = np.array([[0.7, 0.3], [0.5, 0.5], [0.2, 0.8]])
TABLE = RNG.normal(size=(T, H, 2 * N)) - 0.15 * np.arange(1, 2 * N + 1)


def dense_array():
    z = RNG.normal(size=(T, N, N)) * 1.5
    z = np.where(causal(N), z, -np.inf)
    a = np.exp(z - z.max(axis=-1, keepdims=True))
    return a / a.sum(axis=-1, keepdims=True)


DENSE = dense_array()


def case(kind):
    """(plain model, oracle logits (T, H, n, n), oracle weights (T, H))."""
    if kind == "alibi":
        model = RolloutModel.create(num_layers=T, num_heads=H, lambdas=LAMBDAS, alibi_slopes=SLOPES,
                                    diagonal_scores=DIAGONAL, base_scores=BASE, head_weights=WEIGHTS,
                                    temperature=1.3, sequence_length=N)
        return model, alibi_logits(SLOPES, DIAGONAL, BASE, 1.3, N), WEIGHTS
    if kind == "table":
        kernel = TableKernel.create(num_layers=T, num_heads=H, offset_scores=TABLE, diagonal_scores=DIAGONAL,
                                    head_weights=WEIGHTS)
        return RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=N), \
            table_logits(TABLE, DIAGONAL, N), WEIGHTS
    kernel = DenseKernel.create(DENSE)
    return RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=N), dense_logits(DENSE, N), \
        np.ones((T, 1))


KINDS = ("alibi", "table", "dense")


@pytest.mark.parametrize("kind", KINDS)
def test_extended_rollout_matches_oracle(kind):
    model, logits, weights = case(kind)
    extended = with_probability_gains(model, GAINS)
    expected = oracle_profile(logits, weights, LAMBDAS, GAINS)
    for method in ("auto", "dense"):
        np.testing.assert_allclose(jaxroll.influence(extended, method=method), expected, rtol=0, atol=1e-12)


def test_matrix_and_transitions_match_oracle():
    model, logits, weights = case("table")
    extended = with_probability_gains(model, GAINS)
    expected = oracle_profile(logits, weights, LAMBDAS, GAINS)
    matrix = np.asarray(jaxroll.rollout_matrix(extended))
    np.testing.assert_allclose(matrix[-1] / matrix[-1].sum(), expected, rtol=0, atol=1e-12)
    t = 1
    np.testing.assert_allclose(jaxroll.transition(extended, t), oracle_layer(logits[t], weights[t], LAMBDAS[t], GAINS[t]),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_gain_is_todays_rollout(kind):
    model, _, _ = case(kind)
    extended = with_probability_gains(model, 0.0)
    np.testing.assert_allclose(jaxroll.influence(extended), jaxroll.influence(model), rtol=0, atol=1e-12)
    np.testing.assert_allclose(jaxroll.rollout_matrix(extended), jaxroll.rollout_matrix(model), rtol=0, atol=1e-12)
    assert np.all(np.asarray(jaxroll.RolloutModel.probability_gains.fget(model)) == 0.0)


def test_rows_stay_stochastic_and_kernel_is_k():
    model, logits, weights = case("alibi")
    extended = with_probability_gains(model, GAINS)
    kernels = np.asarray(jaxroll.model.layer_kernels(extended, N))
    np.testing.assert_allclose(kernels.sum(axis=-1), 1.0, rtol=0, atol=1e-13)
    for t in range(T):  # K = B / (1 + g c): the layer at lambda = 1
        np.testing.assert_allclose(kernels[t], oracle_layer(logits[t], weights[t], 1.0, GAINS[t]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["alibi", "dense"])
def test_gradients_against_central_differences(kind):
    model, logits, weights = case(kind)

    def statistic(lambdas, gains):
        return middle_mass(jaxroll.influence(with_probability_gains(dataclass_lambdas(model, lambdas), gains)))

    grad_lambdas, grad_gains = jax.grad(statistic, argnums=(0, 1))(jnp.asarray(LAMBDAS), jnp.asarray(GAINS))
    h = 1e-6
    for t in range(T):
        step = np.eye(T)[t] * h
        numeric_gain = (oracle_middle(logits, weights, LAMBDAS, GAINS + step)
                        - oracle_middle(logits, weights, LAMBDAS, GAINS - step)) / (2 * h)
        numeric_lambda = (oracle_middle(logits, weights, LAMBDAS + step, GAINS)
                          - oracle_middle(logits, weights, LAMBDAS - step, GAINS)) / (2 * h)
        assert abs(grad_gains[t] - numeric_gain) < 1e-8, (t, grad_gains[t], numeric_gain)
        assert abs(grad_lambdas[t] - numeric_lambda) < 1e-8, (t, grad_lambdas[t], numeric_lambda)


def dataclass_lambdas(model, lambdas):
    import dataclasses
    return dataclasses.replace(model, lambdas=lambdas)


def test_gradient_through_kernel_fields_and_vmap():
    model, _, _ = case("alibi")
    extended = with_probability_gains(model, GAINS)

    @jax.jit
    def statistic(slopes):
        return middle_mass(jaxroll.influence(jaxroll.RolloutModel(extended.lambdas, extended.kernel, N,
                                                                  alibi_slopes=slopes)))

    grad = jax.grad(statistic)(jnp.asarray(SLOPES))
    h = 1e-6
    bump = np.zeros_like(SLOPES)
    bump[1, 0] = h
    numeric = (statistic(SLOPES + bump) - statistic(SLOPES - bump)) / (2 * h)
    assert abs(grad[1, 0] - numeric) < 1e-8
    gains = jnp.asarray(np.stack([GAINS * s for s in (0.0, 0.5, 2.0)]))
    batched = jax.vmap(lambda g: jaxroll.influence(with_probability_gains(model, g)))(gains)
    _, logits, weights = case("alibi")
    for row, g in zip(batched, np.asarray(gains)):
        np.testing.assert_allclose(row, oracle_profile(logits, weights, LAMBDAS, g), rtol=0, atol=1e-12)


def test_gain_from_ratio_reproduces_the_measured_ratio():
    model, logits, weights = case("alibi")
    ratios = np.array([0.5, 2.0, 1.0])
    gains = np.asarray(gain_from_ratio(ratios, model))
    # The last row's probability-path mass over its value-path mass is g c(n - 1): the measured ratio.
    c_last = np.array([oracle_spread(logits[t], weights[t])[-1] for t in range(T)])
    np.testing.assert_allclose(gains * c_last, ratios, rtol=1e-12)
    np.testing.assert_allclose(row_spreads(model.kernel, N), [oracle_spread(logits[t], weights[t]) for t in range(T)],
                               rtol=0, atol=1e-12)
    rows = np.array([4, 9])
    mean_rows = np.asarray(gain_from_ratio(ratios, model, rows=rows))
    c_rows = np.array([oracle_spread(logits[t], weights[t])[rows].mean() for t in range(T)])
    np.testing.assert_allclose(mean_rows * c_rows, ratios, rtol=1e-12)


def oracle_spread(logits, weights):
    """c(i) = sum_h w_h sum_j A_h S_h: the oracle's row spreads, ``(n,)``."""
    n = logits.shape[-1]
    weights = weights / weights.sum()
    c = np.zeros(n)
    for z, w in zip(logits, weights):
        a = np.exp(z - z.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        finite = np.where(np.isfinite(z), z, 0.0)
        mean = (a * finite).sum(axis=1, keepdims=True)
        c += w * (a * np.where(np.isfinite(z), np.abs(finite - mean), 0.0)).sum(axis=1)
    return c


def test_refusals_are_one_line():
    model, _, _ = case("alibi")
    with pytest.raises(ConfigError) as error:
        with_probability_gains(model, [0.1, -1.0, 0.2])
    assert error.value.field == "probability_gains" and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="probability_gains"):
        with_probability_gains(model, [0.1, 0.2])
    with pytest.raises(ConfigError, match="at most 4096"):
        jaxroll.influence(with_probability_gains(model, 1.0), MAX_LENGTH + 1)
    with pytest.raises(ConfigError, match="ratio"):
        gain_from_ratio(-1.0, model)


def test_yaml_round_trip_and_absent_is_zero():
    model, _, _ = case("alibi")
    extended = with_probability_gains(model, GAINS)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "config.yaml")
        jaxroll.save_config(extended, path)
        back = jaxroll.load_config(path)
        np.testing.assert_array_equal(back.probability_gains, GAINS)
        np.testing.assert_array_equal(jaxroll.influence(back), jaxroll.influence(extended))
    config = jaxroll.schema.config_from_model(model)
    assert "probability_gains" not in config
    np.testing.assert_array_equal(jaxroll.schema.model_from_config(config).probability_gains, np.zeros(T))
    config["probability_gains"] = 0.5
    np.testing.assert_array_equal(jaxroll.schema.model_from_config(config).probability_gains, np.full(T, 0.5))
    config["probability_gains"] = [0.5, -1.0, 0.0]
    with pytest.raises(ConfigError, match="probability_gains"):
        jaxroll.schema.model_from_config(config)


# Temperature on a tiny torch model where the probability path dominates ------------------------------

def _attention_block(torch, x, values, tau, detach=None):
    """One causal attention layer, ``y = x + softmax(q k^T / tau) V``: keys close along the query's
    direction (x[:, 0] = 1 + 0.05 noise) and a large query (10 x[:, 0]), so the logits vary by about one
    unit yet are very sensitive to the keys: the probability path carries ~4x the value path."""
    n, d = x.shape
    q = 10.0 * x[:, :1]
    k = x[:, :1]
    v = x @ values
    probabilities = torch.softmax((q @ k.T / tau).masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)),
                                                              -torch.inf), dim=-1)
    if detach == "probabilities":
        probabilities = probabilities.detach()
    if detach == "values":
        v = v.detach()
    return probabilities @ v


def test_temperature_sign_where_the_probability_path_dominates():
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(2)
    n, d = 16, 8
    x = torch.randn(n, d, generator=generator, dtype=torch.float64) * 0.5
    x[:, 0] = 1.0 + 0.05 * torch.randn(n, generator=generator, dtype=torch.float64)
    values = torch.randn(d, d, generator=generator, dtype=torch.float64) * 0.3 / math.sqrt(d)
    jacobian = torch.autograd.functional.jacobian

    def measured_middle(tau):  # the gradient-influence profile of the last position, ||dy_{n-1} / dx_j||_F
        block = jacobian(lambda inputs: inputs[-1] + _attention_block(torch, inputs, values, tau)[-1], x)
        profile = torch.linalg.norm(block, dim=(0, 2)).numpy()
        return float(middle_mass(jnp.asarray(profile / profile.sum())))

    h = 1e-4
    measured = (measured_middle(1 + h) - measured_middle(1 - h)) / (2 * h)
    # What the rollout reads of this model: its attention (one sequence: a DenseKernel whose log is the
    # logits), the norm-ratio lambda at the last token, and the measured path ratio r (last query).
    value_path = jacobian(lambda inputs: _attention_block(torch, inputs, values, 1.0, "probabilities")[-1], x)
    probability_path = jacobian(lambda inputs: _attention_block(torch, inputs, values, 1.0, "values")[-1], x)
    ratio = float(torch.linalg.norm(probability_path, dim=(0, 2)).sum() / torch.linalg.norm(value_path, dim=(0, 2)).sum())
    update = _attention_block(torch, x, values, 1.0)[-1]
    lam = float(torch.linalg.norm(update) / (torch.linalg.norm(x[-1]) + torch.linalg.norm(update)))
    logits = (10.0 * x[:, :1] @ x[:, :1].T).numpy()
    logits = np.where(causal(n), logits, -np.inf)
    attention = np.exp(logits - logits.max(axis=1, keepdims=True))
    attention /= attention.sum(axis=1, keepdims=True)
    model = RolloutModel.create(kernel=DenseKernel.create(attention[None]), lambdas=[lam], sequence_length=n)
    gains = gain_from_ratio(ratio, model)

    def predicted(gain):
        extended = with_probability_gains(model, gain)
        at = [float(middle_mass(jaxroll.influence(iv.Temperature(1 + s * h).apply(extended)))) for s in (1, -1)]
        return (at[0] - at[1]) / (2 * h)

    extended, today = predicted(gains), predicted(0.0)
    # Measured (run 2026-12-06): -0.174; the extended layer -0.094; today's rollout (g = 0) +0.0067, the wrong sign.
    assert ratio > 3.0 and measured < -0.05
    assert extended < 0.0 and abs(extended - measured) < abs(today - measured)
    assert today > 0.0  # today's rollout predicts the opposite sign on this model (the finding)
