"""The hand-written adjoint of the causal structured product (issue 24).

`structured_adjoint._causal_product`'s backward pass is written out
(`structured_adjoint._causal_adjoint`), not autodiff of the forward. Oracles: JAX
autodiff of the dense softmax kernel (`kernels.layer_kernel`, no structured
code) and central finite differences of a plain NumPy float64 product
(tests/oracle.py). Every branch of the product is exercised: exact
normalisers (N <= P), the stationary split (N > P, every head settled), its
fallback to head chunks (a small slope), the adjoint's row steps
(`ADJOINT_ROWS`) and zero-padded head chunks.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import rollout
from jaxroll.engine.plan import plan
from jaxroll.engine import structured, structured_adjoint

import oracle

ARGS = ("v", "slopes", "content", "weights", "temperature")


def _losses(g, n, heads, transient, head_chunk):
    zeros = jnp.zeros(heads)

    def structured_loss(v, m, d, w, tau):
        return jnp.dot(g, structured.row_times_kernel(v, m, d, zeros, w, tau, transient=transient,
                                                      head_chunk=head_chunk))

    def dense_loss(v, m, d, w, tau):
        return jnp.dot(g, v @ jaxroll.engine.alibi.layer_kernel(m, d, zeros, w, tau, n, "causal", None))

    return structured_loss, dense_loss


# (n, slopes, content, temperature, transient, head_chunk, rows)
CASES = {
    "exact, row steps, content +-1000, tau 0.1": (60, [1e3, 50.0, 0.2], [1000.0, -1000.0, 0.0], 0.1, 1000, 16, 16),
    "exact, zero blocks in front of the row steps, content +-1000": (100, [1e3, 50.0, 0.2], [1000.0, -1000.0, 0.0],
                                                                     0.1, 1000, 16, 48),
    "split, prefix in row steps": (150, [2.0, 3.0, 9.0], [5.0, -1000.0, 20.0], 0.5, 40, 16, 16),
    "fallback (slopes 0 and 1e-3), padded head chunks, row steps": (120, [0.0, 1e-3, 2.5], [0.5, -1.0, 3.0], 1.3, 40, 2, 32),
}


@pytest.mark.parametrize("case", CASES)
def test_adjoint_matches_autodiff_of_the_dense_kernel(case, monkeypatch):
    """``jax.grad`` of ``<g, v^T A>`` by the hand-written adjoint against
    ``jax.grad`` through the dense softmax kernel, wrt v, slopes, content,
    head weights and temperature. 1e-10 relative to the largest entry of
    each gradient plus 1e-12: float64 sums of <= 150 terms whose size is
    bounded by the content over tau (<= 1e4). The cases: exact normalisers
    (N <= P), the stationary split (N > P), its fallback to head chunks when
    a weighted slope is too small (zero-padded chunks of 2), each with the
    adjoint's exact rows in steps (`ADJOINT_ROWS`); 100 rows in steps of 48
    put two zero blocks of 16 in front of row 0 (with p = 0 there)."""
    n, slopes, content, temperature, transient, head_chunk, rows = CASES[case]
    monkeypatch.setattr(structured_adjoint, "ADJOINT_ROWS", rows)
    heads = len(slopes)
    rng = np.random.default_rng(n + heads)
    v, g = rng.uniform(0, 1, n), rng.normal(0, 1, n)
    weights = rng.uniform(0.1, 1, heads)
    structured_loss, dense_loss = _losses(jnp.asarray(g), n, heads, transient, head_chunk)
    args = tuple(jnp.asarray(np.asarray(x, np.float64)) for x in (v, slopes, content, weights, temperature))
    got = jax.jit(jax.grad(structured_loss, argnums=range(5)))(*args)
    expected = jax.jit(jax.grad(dense_loss, argnums=range(5)))(*args)
    for name, x, y in zip(ARGS, got, expected):
        assert np.all(np.isfinite(x)), name
        scale = float(np.max(np.abs(y)))
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-10 * scale + 1e-12, err_msg=name)


def _oracle_product(v, slopes, content, weights, temperature):
    arrays = {"slopes": np.asarray(slopes)[None], "diagonal": np.asarray(content)[None],
              "base": np.zeros((1, len(slopes))), "weights": np.asarray(weights)[None],
              "temperature": float(temperature), "mask": "causal", "window": None}
    return np.asarray(v) @ oracle.layer_kernel(arrays, 0, len(v))


def test_adjoint_matches_central_differences():
    """The adjoint's gradient wrt slopes, content, weights and temperature
    against central differences of the NumPy float64 product (step 1e-6:
    truncation ~1e-12 times the third derivative, rounding ~1e-16 / 1e-6),
    so 1e-8 absolute on gradients of size ~1; the stationary split (P = 24 < N = 80)."""
    n = 80
    rng = np.random.default_rng(3)
    v, g = rng.uniform(0, 1, n), rng.normal(0, 1, n)
    params = [np.array([0.8, 1.7, 3.0]), np.array([1.5, -2.0, 0.5]), np.array([0.2, 0.5, 0.3]), np.array(0.9)]
    structured_loss, _ = _losses(jnp.asarray(g), n, 3, 24, 16)
    got = jax.jit(jax.grad(structured_loss, argnums=(1, 2, 3, 4)))(jnp.asarray(v), *map(jnp.asarray, params))
    step = 1e-6
    for k, (value, gradient) in enumerate(zip(params, got)):
        for index in np.ndindex(value.shape):
            moved = []
            for sign in (1, -1):
                changed = [p.copy() for p in params]
                changed[k][index] += sign * step
                moved.append(g @ _oracle_product(v, *changed))
            difference = (moved[0] - moved[1]) / (2 * step)
            assert abs(float(np.asarray(gradient)[index]) - difference) < 1e-8, (ARGS[k + 1], index)


def _oracle_arrays(fields):
    return {"lambdas": fields["lambdas"], "slopes": fields["alibi_slopes"], "diagonal": fields["diagonal_scores"],
            "base": np.zeros_like(fields["alibi_slopes"]), "weights": fields["head_weights"],
            "temperature": float(fields["temperature"]), "mask": "causal", "window": None}


@pytest.mark.parametrize("equal_layers", [True, False])
def test_shared_kernel_path_gives_every_layer_its_gradient(equal_layers):
    """Below `SHARED_DENSE_MAX` a causal `influence` forms one dense kernel
    when every layer has the same one; its gradient must still be every
    layer's own. ``jax.grad`` of ``<g, p>`` wrt every model array against
    central differences of the NumPy oracle's profile (step 1e-6, so 1e-8
    absolute), at a point where the three layers are equal (the case that
    once sent every gradient to layer 0) and where they differ; the profile
    itself matches the oracle to 1e-12 at both."""
    n, layers, heads = 24, 3, 2
    rng = np.random.default_rng(4)
    fields = {"lambdas": np.array([0.9, 0.6, 0.8]),
              "alibi_slopes": np.tile([0.4, 1.3], (layers, 1)),
              "diagonal_scores": np.tile([1.0, -0.5], (layers, 1)),
              "head_weights": np.tile([0.3, 0.7], (layers, 1)),
              "temperature": np.array(0.8)}
    if not equal_layers:
        for name in ("alibi_slopes", "diagonal_scores", "head_weights"):
            fields[name] = fields[name] * rng.uniform(0.8, 1.2, (layers, heads))
    model = jaxroll.RolloutModel.create(num_layers=layers, num_heads=heads, lambdas=fields["lambdas"],
                                        alibi_slopes=fields["alibi_slopes"],
                                        diagonal_scores=fields["diagonal_scores"],
                                        head_weights=fields["head_weights"], temperature=float(fields["temperature"]),
                                        sequence_length=n)
    assert bool(structured.shares_one_kernel(model.alibi_slopes, model.diagonal_scores,
                                             model.head_weights)) == equal_layers
    g = rng.normal(0, 1, n)
    np.testing.assert_allclose(jaxroll.influence(model), oracle.influence(_oracle_arrays(fields), n),
                               rtol=0, atol=1e-12)
    gradient = jax.jit(jax.grad(lambda m: jnp.dot(jnp.asarray(g), jaxroll.influence(m))))(model)
    step = 1e-6
    for name, value in fields.items():
        got = np.asarray(getattr(gradient, name))
        for index in np.ndindex(value.shape):
            moved = []
            for sign in (1, -1):
                changed = {k: np.array(v, dtype=np.float64) for k, v in fields.items()}
                changed[name][index] += sign * step
                moved.append(g @ oracle.influence(_oracle_arrays(changed), n))
            difference = (moved[0] - moved[1]) / (2 * step)
            assert abs(float(got[index]) - difference) < 1e-8, (name, index, float(got[index]), difference)
    # The kernel's arrays concrete, lambdas and temperature traced: the shared
    # path itself runs under grad; the same gradients as the per-layer ones above.
    assert plan(model, n, "structured").shared_kernel == equal_layers

    def partial(lambdas, temperature):
        return jnp.dot(jnp.asarray(g), jaxroll.influence(dataclasses.replace(model, lambdas=lambdas,
                                                                             temperature=temperature)))

    by_lambdas, by_temperature = jax.grad(partial, argnums=(0, 1))(model.lambdas, model.temperature)
    np.testing.assert_allclose(by_lambdas, gradient.lambdas, rtol=0, atol=1e-12)
    np.testing.assert_allclose(by_temperature, gradient.temperature, rtol=0, atol=1e-12)


def test_stationary_sums_match_closed_forms():
    """`_stationary_sums` (the rows beyond P) against direct NumPy float64
    double sums: ``F_{h,i} = sum_{j<i} g_j r^{i-1-j} + r^i C_h``, the head
    mixture ``sum_h beta_h F_{h,i}``, the bilinear forms ``sum_i v_i F_{h,i}``
    and their slope derivatives
    ``-sum_i v_i (sum_{j<i} g_j (i-1-j) r^{i-1-j} + i r^i C_h) + sum_i v_i r^i dC_h``.
    Slopes down to 0.01 with blocks of 16, so ``r^B`` is far from 0 and the
    recurrence over blocks (and its derivative) carries weight; 300 rows, a
    partial last block. 1e-11 relative to each output's largest entry: float64
    sums of <= 300 terms."""
    n, block = 300, 16
    rng = np.random.default_rng(7)
    a = np.array([0.01, 0.07, 0.4, 3.0])
    v, g = rng.uniform(0, 1, n), rng.normal(0, 1, n)
    beta, carried, d_carried = rng.uniform(0.1, 1, 4), rng.normal(0, 1, 4), rng.normal(0, 1, 4)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    lag = np.where(j < i, i - 1 - j, 0)
    decay = np.where(j < i, np.exp(-a[:, None, None] * lag), 0.0)  # (H, i, j)
    start = np.exp(-a[:, None] * np.arange(n))  # r^i
    forward = decay @ g + start * carried[:, None]  # (H, n)
    d_forward = -(decay * lag) @ g - np.arange(n) * start * carried[:, None] + start * d_carried[:, None]
    expected = (beta @ forward, forward @ v, d_forward @ v)
    got = structured_adjoint._stationary_sums(*(jnp.asarray(x) for x in (v, g, a, beta, carried, d_carried)), block)
    for name, x, y in zip(("mixture", "bilinear", "derivative"), got, expected):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-11 * float(np.max(np.abs(y))), err_msg=name)
