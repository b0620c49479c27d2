"""The probability path (`jaxroll.engine.probability`) against a NumPy float64 oracle written here.

The oracle forms each layer from per-head logits written out below (ALiBi's
``(-m (i - j) + d [i = j] + b) / tau``, a table's ``f(i - j)``, a dense
kernel's ``log A``), ``A_h = rowsoftmax``, the branch weights
``W_h(i) = 1 - rho + rho sigma_h(i)``, ``B = sum_h w_h W_h A_h``,
``W = sum_h w_h W_h`` and the row ``((1 - lambda) e_i + lambda B_i) /
(1 - lambda + lambda W_i)``, and multiplies the last row through the layers:
nothing of jaxroll's is used in it. Each intervention's oracle transforms the
logits and the logit gains by hand (``tau``: both divided; SSMax: both times
``s ln(i + 1)``; slope, distance, rotary, sinks: the logits only).
"""

import dataclasses
import math
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import interventions as iv
from jaxroll.engine.probability import share_from_ratio
from jaxroll.errors import ConfigError
from jaxroll.kernel_types import DenseKernel, TableKernel
from jaxroll.metrics import middle_mass
from jaxroll.model import RolloutModel, with_probability_path

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


def softmax_rows(z):
    a = np.exp(z - z.max(axis=-1, keepdims=True))
    return a / a.sum(axis=-1, keepdims=True)


def oracle_layer(logits, weights, lam, share, gains):
    """R of one layer: logits (H, n, n), weights (H,), gains (H,) or (H, n) (per row)."""
    n = logits.shape[-1]
    weights = weights / weights.sum()
    gains = np.broadcast_to(np.asarray(gains, dtype=float).reshape(len(weights), -1), (len(weights), n))
    branch, total = np.zeros((n, n)), np.zeros(n)
    for z, w, sigma in zip(logits, weights, gains):
        factor = 1 - share + share * sigma  # (n,): row i's
        branch += w * factor[:, None] * softmax_rows(z)
        total += w * factor
    return ((1 - lam) * np.eye(n) + lam * branch) / (1 - lam + lam * total)[:, None]


def oracle_profile(logits, weights, lambdas, shares, gains):
    n = logits.shape[-1]
    row = np.zeros(n)
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        row = row @ oracle_layer(logits[t], weights[t], lambdas[t], shares[t], gains[t])
    return row / row.sum()


def oracle_middle(*args):
    p = oracle_profile(*args)
    k = max(1, round(0.1 * len(p)))
    return p[k: len(p) - k].sum()


# Three kernels with their oracle logits ---------------------------------------------------------------

T, H = 3, 2
LAMBDAS = np.array([0.3, 0.55, 0.8])
SHARES = np.array([0.4, 0.7, 0.2])
GAINS = np.array([[0.6, 1.5], [0.8, 0.5], [2.0, 1.2]])
SLOPES = np.array([[0.5, 0.125], [0.3, 0.05], [0.8, 0.2]])
DIAGONAL = RNG.normal(size=(T, H))
BASE = RNG.normal(size=(T, H))
WEIGHTS = np.array([[0.7, 0.3], [0.5, 0.5], [0.2, 0.8]])
TABLE = RNG.normal(size=(T, H, 2 * N)) - 0.15 * np.arange(1, 2 * N + 1)


def dense_array():
    return softmax_rows(np.where(causal(N), RNG.normal(size=(T, N, N)) * 1.5, -np.inf))


DENSE = dense_array()


def case(kind):
    """(plain model, oracle logits (T, H, n, n), oracle weights (T, H), logit gains (T, H))."""
    if kind == "alibi":
        model = RolloutModel.create(num_layers=T, num_heads=H, lambdas=LAMBDAS, alibi_slopes=SLOPES,
                                    diagonal_scores=DIAGONAL, base_scores=BASE, head_weights=WEIGHTS,
                                    temperature=1.3, sequence_length=N)
        return model, alibi_logits(SLOPES, DIAGONAL, BASE, 1.3, N), WEIGHTS, GAINS
    if kind == "table":
        kernel = TableKernel.create(num_layers=T, num_heads=H, offset_scores=TABLE, diagonal_scores=DIAGONAL,
                                    head_weights=WEIGHTS)
        model = RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=N)
        return model, table_logits(TABLE, DIAGONAL, N), WEIGHTS, GAINS
    model = RolloutModel.create(kernel=DenseKernel.create(DENSE), lambdas=LAMBDAS, sequence_length=N)
    return model, dense_logits(DENSE, N), np.ones((T, 1)), GAINS[:, :1]


KINDS = ("alibi", "table", "dense")


@pytest.mark.parametrize("kind", KINDS)
def test_extended_rollout_matches_oracle(kind):
    model, logits, weights, gains = case(kind)
    extended = with_probability_path(model, SHARES, gains)
    expected = oracle_profile(logits, weights, LAMBDAS, SHARES, gains)
    for method in ("auto", "dense"):
        np.testing.assert_allclose(jaxroll.influence(extended, method=method), expected, rtol=0, atol=1e-12)


def test_matrix_and_transitions_match_oracle():
    model, logits, weights, gains = case("table")
    extended = with_probability_path(model, SHARES, gains)
    expected = oracle_profile(logits, weights, LAMBDAS, SHARES, gains)
    matrix = np.asarray(jaxroll.rollout_matrix(extended))
    np.testing.assert_allclose(matrix[-1] / matrix[-1].sum(), expected, rtol=0, atol=1e-12)
    t = 1
    np.testing.assert_allclose(jaxroll.transition(extended, t),
                               oracle_layer(logits[t], weights[t], LAMBDAS[t], SHARES[t], gains[t]), rtol=0, atol=1e-12)
    kernels = np.asarray(jaxroll.model.layer_kernels(extended, N))
    np.testing.assert_allclose(kernels.sum(axis=-1), 1.0, rtol=0, atol=1e-13)  # K stays row-stochastic


@pytest.mark.parametrize("kind", KINDS)
def test_neutral_setting_is_todays_rollout(kind):
    model, _, _, gains = case(kind)
    today = jaxroll.influence(model)
    # At the measured setting (logit gains 1) any share is today's layer; a share of 0 is, at any gains.
    np.testing.assert_allclose(jaxroll.influence(with_probability_path(model, SHARES)), today, rtol=0, atol=1e-12)
    np.testing.assert_allclose(jaxroll.influence(with_probability_path(model, 0.0, gains)), today, rtol=0, atol=1e-12)
    assert np.all(np.asarray(model.probability_shares) == 0.0) and np.all(np.asarray(model.logit_gains) == 1.0)


@pytest.mark.parametrize("kind", ["alibi", "dense"])
def test_gradients_against_central_differences(kind):
    model, logits, weights, gains = case(kind)

    @jax.jit
    def statistic(lambdas, shares, logit_gains):
        changed = with_probability_path(dataclasses.replace(model, lambdas=lambdas), shares, logit_gains)
        return middle_mass(jaxroll.influence(changed))

    grads = jax.grad(statistic, argnums=(0, 1, 2))(jnp.asarray(LAMBDAS), jnp.asarray(SHARES), jnp.asarray(gains))
    h = 1e-6
    for t in range(T):
        step = np.eye(T)[t] * h
        numeric = [(oracle_middle(logits, weights, LAMBDAS + step, SHARES, gains)
                    - oracle_middle(logits, weights, LAMBDAS - step, SHARES, gains)) / (2 * h),
                   (oracle_middle(logits, weights, LAMBDAS, SHARES + step, gains)
                    - oracle_middle(logits, weights, LAMBDAS, SHARES - step, gains)) / (2 * h)]
        bump = np.zeros_like(gains)
        bump[t, -1] = h
        numeric.append((oracle_middle(logits, weights, LAMBDAS, SHARES, gains + bump)
                        - oracle_middle(logits, weights, LAMBDAS, SHARES, gains - bump)) / (2 * h))
        got = [grads[0][t], grads[1][t], grads[2][t, -1]]
        np.testing.assert_allclose(got, numeric, rtol=0, atol=1e-8)


def test_gradient_through_kernel_fields_and_vmap():
    model, logits, weights, gains = case("alibi")
    extended = with_probability_path(model, SHARES, gains)

    @jax.jit
    def statistic(slopes):
        return middle_mass(jaxroll.influence(RolloutModel(extended.lambdas, extended.kernel, N, alibi_slopes=slopes)))

    grad = jax.grad(statistic)(jnp.asarray(SLOPES))
    h = 1e-6
    bump = np.zeros_like(SLOPES)
    bump[1, 0] = h
    at = [oracle_middle(alibi_logits(SLOPES + s * bump, DIAGONAL, BASE, 1.3, N), weights, LAMBDAS, SHARES, gains)
          for s in (1, -1)]
    numeric = (at[0] - at[1]) / (2 * h)
    assert abs(grad[1, 0] - numeric) < 1e-8
    shares = np.stack([SHARES * s for s in (0.0, 0.5, 1.2)])
    batched = jax.vmap(lambda rho: jaxroll.influence(with_probability_path(model, rho, gains)))(jnp.asarray(shares))
    for row, rho in zip(batched, shares):
        np.testing.assert_allclose(row, oracle_profile(logits, weights, LAMBDAS, rho, gains), rtol=0, atol=1e-12)


def test_share_from_ratio_and_refusals():
    np.testing.assert_allclose(share_from_ratio(np.array([0.0, 1.0, 3.0])), [0.0, 0.5, 0.75], rtol=0, atol=1e-15)
    with pytest.raises(ConfigError, match="ratio"):
        share_from_ratio(-1.0)
    model, _, _, _ = case("alibi")
    refused = (([0.1, 1.0, 0.2], 1.0, "probability_shares"), ([0.1, -0.1, 0.2], 1.0, "probability_shares"),
               ([0.1, 0.2], 1.0, "probability_shares"), (0.5, 0.0, "logit_gains"), (0.5, np.ones((2, 2)), "logit_gains"))
    for shares, gains, field in refused:
        with pytest.raises(ConfigError) as error:
            with_probability_path(model, shares, gains)
        assert error.value.field == field and "\n" not in str(error.value), (shares, gains, str(error.value))


def test_yaml_round_trip_and_absent_is_neutral():
    model, _, _, gains = case("alibi")
    extended = iv.Temperature(1.7).apply(with_probability_path(model, SHARES, gains))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "config.yaml")
        jaxroll.save_config(extended, path)
        back = jaxroll.load_config(path)
    np.testing.assert_array_equal(back.probability_shares, SHARES)
    np.testing.assert_array_equal(back.logit_gains, np.asarray(extended.logit_gains))
    np.testing.assert_array_equal(jaxroll.influence(back), jaxroll.influence(extended))
    config = jaxroll.schema.config_from_model(model)
    assert "probability_shares" not in config and "logit_gains" not in config
    config["probability_shares"] = 0.5
    back = jaxroll.schema.model_from_config(config)
    np.testing.assert_array_equal(back.probability_shares, np.full(T, 0.5))
    assert "logit_gains" not in jaxroll.schema.config_from_model(back)  # gains of 1 are not written
    config["probability_shares"] = [0.5, 1.5, 0.0]
    with pytest.raises(ConfigError, match="probability_shares"):
        jaxroll.schema.model_from_config(config)


# Every rollout transform on the extended layer -------------------------------------------------------

def _log_rows(n):
    return np.log(np.arange(1, n + 1, dtype=float))  # ln n_i, n_i = i + 1 keys under a causal mask


def _interventions():
    """(name, kind, intervention, oracle (logits, weights, gains, lambdas) -> the same, transformed, at n)."""
    tau = np.array([0.7, 1.6])
    scale = np.array([0.5, 1.5])
    ratio = np.array([1.2, 1.8])
    kappa = 0.4
    gamma = np.array([0.5, 2.0, 1.0])

    def tempered(logits, weights, gains, lambdas, n):
        return logits / tau[None, :, None, None], weights, gains / tau, lambdas

    def dense_tempered(logits, weights, gains, lambdas, n):
        return logits / 1.4, weights, gains / 1.4, lambdas

    def slopes(logits, weights, gains, lambdas, n):
        return alibi_logits(SLOPES * scale, DIAGONAL, BASE, 1.3, n), weights, gains, lambdas

    def distance(logits, weights, gains, lambdas, n):
        offsets = np.maximum(np.arange(n)[:, None] - np.arange(n)[None, :], 0)
        return logits + kappa * np.log1p(offsets), weights, gains, lambdas

    def branch(logits, weights, gains, lambdas, n):
        return logits, weights, gains, gamma * lambdas / (gamma * lambdas + 1 - lambdas)

    def ssmax(logits, weights, gains, lambdas, n):
        factor = scale[None, :, None] * _log_rows(n)[None, None, :]  # (1, H, n): head h, row i
        finite = np.isfinite(logits)
        scaled = np.where(finite, np.where(finite, logits, 0.0) * factor[..., None], -np.inf)
        return scaled, weights, gains[..., None] * factor, lambdas

    def rotary(logits, weights, gains, lambdas, n):
        k = np.arange(1, TABLE.shape[-1] + 1)
        table = np.array([[np.interp(k / r, k, TABLE[t, h]) for h, r in enumerate(ratio)] for t in range(T)])
        return table_logits(table, DIAGONAL, n), weights, gains, lambdas

    def sinks(logits, weights, gains, lambdas, n):
        return alibi_logits(SLOPES, DIAGONAL, BASE, 1.3, n), weights, gains, lambdas

    return [("tau", "alibi", iv.Temperature(tau), tempered), ("tau", "table", iv.Temperature(tau), tempered),
            ("tau", "dense", iv.Temperature(1.4), dense_tempered),
            ("slope_scale", "alibi", iv.SlopeScale(scale), slopes),
            ("kappa", "alibi", iv.DistanceBias(kappa), distance),
            ("kappa", "table", iv.DistanceBias(kappa), distance), ("gamma", "alibi", iv.BranchScale(gamma), branch),
            ("ssmax_scale", "alibi", iv.LengthScaledLogits(scale), ssmax),
            ("ssmax_scale", "table", iv.LengthScaledLogits(scale), ssmax),
            ("rotary_ratio", "table", iv.RotaryRescale(ratio), rotary), ("sinks", "alibi", iv.SinkTokens(3), sinks)]


@pytest.mark.parametrize("name, kind, change, transform", _interventions(),
                         ids=[f"{name}-{kind}" for name, kind, _, _ in _interventions()])
def test_interventions_act_on_the_extended_layer(name, kind, change, transform):
    model, logits, weights, gains = case(kind)
    changed = change.apply(with_probability_path(model, SHARES, gains))
    n = changed.sequence_length
    logits, weights, gains, lambdas = transform(logits, weights, gains, LAMBDAS, n)
    expected = oracle_profile(logits, weights, lambdas, SHARES, gains)
    np.testing.assert_allclose(jaxroll.influence(changed), expected, rtol=0, atol=1e-12)
    # From the measured setting (logit gains 1), the extended prediction leaves today's only where the
    # change moves the logits' derivative (temperature, SSMax); position changes act on A alone.
    today = jaxroll.influence(change.apply(model))
    moved = np.abs(np.asarray(today) - jaxroll.influence(change.apply(with_probability_path(model, SHARES)))).max()
    assert (moved > 1e-4) == (name in ("tau", "ssmax_scale")), (name, moved)


def test_sweeps_run_the_extended_layer():
    """A sweep over lambda_0 and tau of an extended model (equal layers: a plain kernel would take the
    Krylov path, a polynomial in A over the lambdas) against the oracle, point by point."""
    n, slopes, shares, gains = 10, np.array([0.4, 0.1]), 0.6, np.array([1.5, 0.5])
    model = RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.5, alibi_slopes=slopes, diagonal_scores=1.0,
                                sequence_length=n, probability_shares=shares, logit_gains=gains)
    result = jaxroll.sweep(model, lambda_0=[0.3, 0.7], beta=[0.0], tau=[0.8, 1.5], progress=False)
    assert result.method == "vmap"
    profiles = np.asarray(result.profiles).reshape(2, 2, n)
    for a, lam in enumerate((0.3, 0.7)):
        for b, tau in enumerate((0.8, 1.5)):
            logits = np.stack([alibi_logits(slopes, np.ones(2), np.zeros(2), tau, n)] * 2)
            expected = oracle_profile(logits, np.full((2, 2), 0.5), [lam] * 2, [shares] * 2, [gains / tau] * 2)
            np.testing.assert_allclose(profiles[a, b], expected, rtol=0, atol=1e-12)


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
    ratio = float(torch.linalg.norm(probability_path, dim=(0, 2)).sum()
                  / torch.linalg.norm(value_path, dim=(0, 2)).sum())
    update = _attention_block(torch, x, values, 1.0)[-1]
    lam = float(torch.linalg.norm(update) / (torch.linalg.norm(x[-1]) + torch.linalg.norm(update)))
    logits = (10.0 * x[:, :1] @ x[:, :1].T).numpy()
    logits = np.where(causal(n), logits, -np.inf)
    attention = np.exp(logits - logits.max(axis=1, keepdims=True))
    attention /= attention.sum(axis=1, keepdims=True)
    model = RolloutModel.create(kernel=DenseKernel.create(attention[None]), lambdas=[lam], sequence_length=n)

    def predicted(share):
        extended = with_probability_path(model, share)
        at = [float(middle_mass(jaxroll.influence(iv.Temperature(1 + s * h).apply(extended)))) for s in (1, -1)]
        return (at[0] - at[1]) / (2 * h)

    extended, today = predicted(share_from_ratio(ratio)), predicted(0.0)
    # Measured (run 2026-12-06): -0.174; the extended layer -0.084; today's rollout +0.0067, the wrong sign.
    assert ratio > 3.0 and measured < -0.05
    assert extended < 0.0 and abs(extended - measured) < abs(today - measured)
    assert today > 0.0  # today's rollout predicts the opposite sign on this model (the finding)


# The path's own row shape (with_path_shape, path_weights, moved_shape) ----------------------------------

def oracle_weights(rows):
    """``A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)`` by loops, float64."""
    out = np.zeros_like(rows)
    for index in np.ndindex(rows.shape[:-1]):
        row = rows[index]
        for j in range(len(row)):
            others = sum(row[k] ** 2 for k in range(len(row)) if k != j)
            out[index + (j,)] = row[j] * math.sqrt((1 - row[j]) ** 2 + others)
    return out


def oracle_shaped_profile(attention, shape, lambdas, shares, gains):
    """The profile of layers ``B = (1 - rho) K + rho sigma_i shape_i / |shape_i|``, by hand."""
    n = attention.shape[-1]
    row = np.zeros(n)
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        hat = shape[t] / shape[t].sum(axis=-1, keepdims=True)
        branch = (1 - shares[t]) * attention[t] + shares[t] * gains[t][:, None] * hat
        total = 1 - lambdas[t] + lambdas[t] * branch.sum(-1)
        layer = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * branch) / total[:, None]
        row = row @ layer
    return row / row.sum()


def shaped_case():
    """Per-sequence rows (S = 3, H = 2) at two temperatures: the mean kernels, the moved shape, the row gains."""
    logits = np.where(causal(N), RNG.normal(size=(T, 3, 2, N, N)) * 1.5, -np.inf)
    rows, cooled = softmax_rows(logits), softmax_rows(logits / 0.7)
    weights, changed = oracle_weights(rows).mean(axis=(1, 2)), oracle_weights(cooled).mean(axis=(1, 2))
    base = rows.mean(axis=(1, 2))
    shape = base * np.where(weights > 0, changed / np.where(weights > 0, weights, 1.0), 1.0)
    gains = np.tile(np.linspace(0.6, 1.6, N), (T, 1))
    return rows, cooled, base, cooled.mean(axis=(1, 2)), shape, gains


def shaped_profile(attention, shape, shares, gains):
    from jaxroll.engine.probability import with_path_shape

    kernel = with_path_shape(attention, shape, shares, gains)
    return jaxroll.influence(RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=N))


def test_path_weights_and_moved_shape_match_oracle():
    from jaxroll.engine.probability import moved_shape, path_weights

    rows, cooled, base, _, shape, _ = shaped_case()
    np.testing.assert_allclose(path_weights(rows), oracle_weights(rows), rtol=0, atol=1e-12)
    moved = moved_shape(base, jnp.mean(path_weights(rows), axis=(1, 2)), jnp.mean(path_weights(cooled), axis=(1, 2)))
    np.testing.assert_allclose(moved, shape, rtol=0, atol=1e-12)
    # one key (row 0) or a one-hot row: no spread, weight 0; a uniform row of n: (1/n) sqrt(1 - 1/n)
    np.testing.assert_allclose(path_weights(np.eye(3)), np.zeros((3, 3)), rtol=0, atol=0)
    np.testing.assert_allclose(path_weights(np.full((1, 4), 0.25)), np.full((1, 4), 0.25 * math.sqrt(0.75)),
                               rtol=0, atol=1e-15)


def test_path_shape_rollout_matches_oracle_and_neutral_is_today():
    _, _, base, cooled, shape, gains = shaped_case()
    got = shaped_profile(cooled, shape, SHARES, gains)
    np.testing.assert_allclose(got, oracle_shaped_profile(cooled, shape, LAMBDAS, SHARES, gains), rtol=0, atol=1e-12)
    today = jaxroll.influence(RolloutModel.create(kernel=DenseKernel.create(base), lambdas=LAMBDAS, sequence_length=N))
    # neutral: the shape is the kernel's own rows (no change moved the weights) and the gains 1; or shares 0
    np.testing.assert_allclose(shaped_profile(base, base, SHARES, 1.0), today, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shaped_profile(base, shape, 0.0, gains), today, rtol=0, atol=1e-12)


def test_path_shape_gradients_against_central_differences_and_vmap():
    _, _, _, cooled, shape, gains = shaped_case()
    other = oracle_weights(softmax_rows(np.where(causal(N), RNG.normal(size=(T, N, N)), -np.inf)))

    def oracle(mix, shares):  # the shape moved toward another by mix, as the engine gets it
        return oracle_middle_of(oracle_shaped_profile(cooled, (1 - mix) * shape + mix * other, LAMBDAS, shares,
                                                      gains))

    @jax.jit
    def statistic(mix, shares):
        return middle_mass(shaped_profile(cooled, (1 - mix) * shape + mix * other, shares, gains))

    grads = jax.grad(statistic, argnums=(0, 1))(0.3, jnp.asarray(SHARES))
    h = 1e-6
    assert abs(grads[0] - (oracle(0.3 + h, SHARES) - oracle(0.3 - h, SHARES)) / (2 * h)) < 1e-8
    for t in range(T):
        step = np.eye(T)[t] * h
        assert abs(grads[1][t] - (oracle(0.3, SHARES + step) - oracle(0.3, SHARES - step)) / (2 * h)) < 1e-8
    shares = np.stack([SHARES * s for s in (0.0, 0.5, 1.2)])
    batched = jax.vmap(lambda rho: shaped_profile(cooled, shape, rho, gains))(jnp.asarray(shares))
    for row, rho in zip(batched, shares):
        np.testing.assert_allclose(row, oracle_shaped_profile(cooled, shape, LAMBDAS, rho, gains), rtol=0, atol=1e-12)


def oracle_middle_of(profile):
    k = max(1, round(0.1 * len(profile)))
    return profile[k: len(profile) - k].sum()


def test_path_shape_refusals():
    from jaxroll.engine.probability import with_path_shape

    _, _, base, _, shape, _ = shaped_case()
    with pytest.raises(ConfigError, match="path_shape"):
        with_path_shape(base, shape[:, :4, :4], SHARES)
    with pytest.raises(ConfigError, match="path_shape"):
        with_path_shape(base, -shape, SHARES)
    with pytest.raises(ConfigError, match="probability_shares"):
        with_path_shape(base, shape, 1.0)
    with pytest.raises(ConfigError, match="logit_gains"):
        with_path_shape(base, shape, SHARES, -0.5)
