"""The O(N) structured products against the plain NumPy float64 oracle.

Oracles: tests/oracle.py (dense masked softmax kernels in NumPy float64, no
jaxroll code), a plain Python loop for the recurrence, central finite
differences for gradients, and the theory's properties (row-stochastic
transitions give non-negative profiles of mass 1).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jaxroll
from jaxroll.engine import structured, structured_products
from conftest import ROLLOUT_CONFIGS

import oracle

_product = jax.jit(structured.row_times_kernel,
               static_argnames=("mask", "window", "head_chunk", "block", "transient", "settled"))
# The causal mixture called directly, compiled: run eagerly, its op-by-op dispatch recompiled every
# primitive for each drawn N (9-15 s an example on 2 shared cores; compiled, 2-3 s).
_mixture = jax.jit(structured_products._causal_mixture, static_argnums=(4, 5))


def _oracle_product(v, slopes, diagonal, weights, temperature, mask, window):
    """``v^T A`` with A the oracle's dense layer kernel (float64)."""
    arrays = {"slopes": np.asarray(slopes)[None], "diagonal": np.asarray(diagonal)[None],
              "base": np.zeros((1, len(slopes))), "weights": np.asarray(weights)[None],
              "temperature": float(temperature), "mask": mask, "window": window}
    return np.asarray(v) @ oracle.layer_kernel(arrays, 0, len(v))


def _structured_product(v, slopes, diagonal, weights, temperature, mask, window, **options):
    as_array = lambda x: jnp.asarray(np.asarray(x, dtype=np.float64))  # noqa: E731
    return np.asarray(_product(as_array(v), as_array(slopes), as_array(diagonal),
                               as_array(np.zeros(len(slopes))), as_array(weights),
                               as_array(temperature), mask=mask, window=window, **options))


def test_reverse_discounted_cumsum_matches_the_recurrence():
    """Blocked recursion (3 levels at n = 1000, block 8) against the loop
    ``X_j = u_j + r X_{j+1}`` in float64; 1e-12 relative to the largest X
    (sums of 1000 non-negative terms, float64 epsilon 2.2e-16)."""
    rng = np.random.default_rng(0)
    decays = np.array([0.0, 1e-3, 0.3, 5.0, 200.0])
    for n in (1, 7, 8, 9, 64, 1000):
        u = rng.uniform(0, 1, (len(decays), n))
        expected = np.zeros_like(u)
        running = np.zeros(len(decays))
        for j in reversed(range(n)):
            running = u[:, j] + np.exp(-decays) * running
            expected[:, j] = running
        got = jax.jit(structured.reverse_discounted_cumsum, static_argnames="block")(
            jnp.asarray(u), jnp.asarray(decays), block=8)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)


masks = st.sampled_from(["causal", "sliding", "full"])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), n=st.integers(1, 300), heads=st.integers(1, 5), mask=masks)
def test_random_models_match_the_dense_oracle(data, n, heads, mask):
    """Random slopes, content, temperatures, weights, masks, windows and N in
    1..300, with head chunks of 2 and blocks of 4 (several recursion levels):
    1e-12 absolute in float64 (entries are at most 1, sums of <= 300 terms)."""
    floats = lambda lo, hi: st.floats(lo, hi, allow_nan=False)  # noqa: E731
    slopes = data.draw(st.lists(st.one_of(st.just(0.0), floats(0, 10)), min_size=heads, max_size=heads))
    diagonal = data.draw(st.lists(floats(-50, 50), min_size=heads, max_size=heads))
    weights = data.draw(st.lists(floats(0.01, 1), min_size=heads, max_size=heads))
    temperature = data.draw(floats(0.1, 10))
    window = data.draw(st.integers(1, n + 2)) if mask == "sliding" else None
    v = np.random.default_rng(n).uniform(0, 1, n)
    expected = _oracle_product(v, slopes, diagonal, weights, temperature, mask, window)
    got = _structured_product(v, slopes, diagonal, weights, temperature, mask, window, head_chunk=2, block=4)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


EXTREMES = [
    # slopes, content, temperature
    ([0.0, 10.0], [1000.0, -1000.0], 0.1),
    ([0.0, 0.0], [-1000.0, 1000.0], 10.0),
    ([10.0, 1e-9], [0.0, -1000.0], 0.1),
    ([10.0, 10.0], [-1000.0, 0.0], 10.0),
]


@pytest.mark.parametrize("mask, window", [("causal", None), ("sliding", 1), ("sliding", 5),
                                          ("sliding", 40), ("full", None)])
@pytest.mark.parametrize("slopes, content, temperature", EXTREMES)
@pytest.mark.parametrize("n", [1, 40])
def test_extreme_values(mask, window, slopes, content, temperature, n, float32):
    """Content +-1000, slopes 0 and 10, temperatures 0.1 and 10, windows 1,
    inside and equal to N, N = 1 and 40 (N = 2 is among the random cases).
    float64: 1e-12 against the oracle. float32: finite, non-negative, and
    within 1e-6 relative (plus 1e-7 absolute) of the float64 oracle: float32
    epsilon 6e-8 times a few roundings; under the full mask entries of
    ``v^T A`` reach 12 (every row reads the last token), observed 1.3e-7."""
    v = np.random.default_rng(3).uniform(0, 1, n)
    weights = [0.3, 0.7]
    expected = _oracle_product(v, slopes, content, weights, temperature, mask, window)
    got = _structured_product(v, slopes, content, weights, temperature, mask, window)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    with float32:
        single = np.asarray(structured.row_times_kernel(
            jnp.asarray(v, jnp.float32), *(jnp.asarray(x, jnp.float32) for x in
                                           (slopes, content, [0.0, 0.0], weights, temperature)),
            mask, window))
        assert single.dtype == np.float32
        assert np.all(np.isfinite(single)) and np.all(single >= 0)
        np.testing.assert_allclose(single, expected, rtol=1e-6, atol=1e-7)


def test_small_slopes_do_not_cancel_in_float32(float32):
    """m = 1e-6 with a window of 1500 in N = 2048: a shifted-copy subtraction
    would lose ~N/W digits here; the segmented sums keep float32 within 1e-6
    relative of the float64 oracle's product (observed about 1e-7)."""
    n, window = 2048, 1500
    v = np.random.default_rng(4).uniform(0, 1, n)
    args = ([1e-6, 1e-3], [0.5, -2.0], [1.0, 1.0], 1.0, "sliding", window)
    expected = _oracle_product(v, *args)
    with float32:
        got = np.asarray(structured.row_times_kernel(
            jnp.asarray(v, jnp.float32), jnp.asarray(args[0], jnp.float32),
            jnp.asarray(args[1], jnp.float32), jnp.zeros(2, jnp.float32),
            jnp.asarray(args[2], jnp.float32), jnp.float32(1.0), "sliding", window))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("path", ROLLOUT_CONFIGS[::8], ids=lambda p: str(p).split("rollout/")[-1])
def test_reference_configs_at_a_new_length(path):
    """Every 8th published configuration at N = 128 against oracle.influence:
    1e-12 absolute in float64 (all 33 at N = 4096 are in the benchmark)."""
    n = 128
    config = oracle.read_config(path)
    expected = oracle.influence(oracle.config_arrays(config), n)
    profile = jaxroll.influence(jaxroll.load_config(path), n, method="structured")
    np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-12)


def _small_model(mask="causal", window=None, n=24, slope_zero=False):
    rng = np.random.default_rng(7)
    slopes = rng.uniform(0.05, 1, (3, 2))
    if slope_zero:
        slopes[1, 0] = 0.0
    return jaxroll.RolloutModel.create(
        num_layers=3, num_heads=2, lambdas=rng.uniform(0.2, 0.9, 3), alibi_slopes=slopes,
        diagonal_scores=rng.normal(0, 2, (3, 2)), head_weights=rng.uniform(0.2, 1, (3, 2)),
        temperature=0.8, mask=mask, window=window, sequence_length=n)


def test_auto_is_structured_and_agrees_with_dense():
    model = _small_model()
    auto = jaxroll.influence(model, method="auto")
    np.testing.assert_array_equal(auto, jaxroll.influence(model, method="structured"))
    np.testing.assert_allclose(auto, jaxroll.influence(model, method="dense"), rtol=0, atol=1e-12)


def _oracle_loss(model, target):
    arrays = {"lambdas": np.asarray(model.lambdas), "slopes": np.asarray(model.alibi_slopes),
              "diagonal": np.asarray(model.diagonal_scores), "base": np.asarray(model.base_scores),
              "weights": np.asarray(model.head_weights), "temperature": float(model.temperature),
              "mask": model.mask, "window": model.window}
    p = oracle.influence(arrays, model.sequence_length)
    return np.sum(np.abs(np.cumsum(p - target)[:-1])) / (len(p) - 1)


@pytest.mark.parametrize("mask, window, slope_zero", [("causal", None, False), ("causal", None, True),
                                                      ("sliding", 5, False), ("full", None, False)])
def test_gradients_match_finite_differences(mask, window, slope_zero):
    """``jax.grad`` of the Wasserstein loss through the structured path wrt
    lambdas, slopes and content, against central differences of the NumPy
    oracle (step 1e-6: truncation ~1e-12, rounding ~1e-16/1e-6 = 1e-10),
    so 1e-7 absolute. With ``slope_zero`` one slope is exactly 0, the edge
    of the allowed range, where the differences step to -1e-6 (the oracle's
    softmax is defined there)."""
    model = _small_model(mask, window, slope_zero=slope_zero)
    target = np.random.default_rng(8).dirichlet(np.ones(model.sequence_length))

    def loss(m):
        return jaxroll.metrics.wasserstein(jaxroll.influence(m, method="structured"), jnp.asarray(target))

    gradient = jax.grad(loss)(model)
    step = 1e-6
    for field in ("lambdas", "alibi_slopes", "diagonal_scores"):
        values = np.asarray(getattr(model, field), dtype=np.float64)
        got = np.asarray(getattr(gradient, field))
        for index in np.ndindex(values.shape):
            up, down = values.copy(), values.copy()
            up[index] += step
            down[index] -= step
            difference = (_oracle_loss(dataclasses.replace(model, **{field: up}), target)
                          - _oracle_loss(dataclasses.replace(model, **{field: down}), target)) / (2 * step)
            assert abs(got[index] - difference) < 1e-7, (field, index, got[index], difference)


def test_properties_at_two_to_the_sixteen(float32):
    """N = 65536 in float32 for every mask: finite, non-negative, mass 1
    within 1e-6 (the standard of the core issue)."""
    base = jaxroll.RolloutModel.create(num_layers=3, num_heads=4, lambdas=[0.9, 0.5, 0.7],
                                       diagonal_scores=[3.0, -2.0, 0.0, 250.0], sequence_length=2**16)
    with float32:
        for mask, window in (("causal", None), ("sliding", 1000), ("full", None)):
            model = dataclasses.replace(base, mask=mask, window=window)
            profile, mass = jaxroll.influence_with_mass(model)
            profile = np.asarray(profile)
            assert profile.dtype == np.float32
            assert np.all(np.isfinite(profile)) and np.all(profile >= 0), mask
            assert abs(float(np.sum(profile, dtype=np.float64)) - 1.0) < 1e-6, mask
            assert abs(float(mass) - 1.0) < 1e-6, mask


@settings(max_examples=8, deadline=None)
@given(data=st.data(), n=st.integers(65, 200), heads=st.integers(1, 4))
def test_stationary_split_matches_the_dense_oracle(data, n, heads):
    """The causal path with exact normalisers on the first 64 rows only and the
    stationary ``Z_inf`` beyond (``transient=64``), on N = 65..200. Slopes
    over temperature are at least 0.6, so ``e^{-a P} <= e^{-38} < 2.2e-16``
    and the split is taken (the test also calls it directly); content
    +-1000. 1e-12 absolute in float64, as for the exact path."""
    floats = lambda lo, hi: st.floats(lo, hi, allow_nan=False)  # noqa: E731
    temperature = data.draw(floats(0.1, 1))
    slopes = data.draw(st.lists(floats(0.6, 10), min_size=heads, max_size=heads))
    diagonal = data.draw(st.lists(st.one_of(floats(-50, 50), st.sampled_from([-1000.0, 1000.0])),
                                  min_size=heads, max_size=heads))
    weights = data.draw(st.lists(floats(0.01, 1), min_size=heads, max_size=heads))
    v = np.random.default_rng(n).uniform(0, 1, n)
    expected = _oracle_product(v, slopes, diagonal, weights, temperature, "causal", None)
    got = _structured_product(v, slopes, diagonal, weights, temperature, "causal", None, transient=64)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    w = np.asarray(weights) / np.sum(weights)
    direct = _mixture(jnp.asarray(v), jnp.asarray(slopes) / temperature, jnp.asarray(diagonal) / temperature,
                      jnp.asarray(w), 64, 16)
    np.testing.assert_allclose(direct, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("slopes, weights", [([0.0, 2.0], [0.5, 0.5]), ([1e-3, 2.0], [0.5, 0.5]),
                                             ([0.0, 2.0], [0.0, 1.0])])
def test_unsettled_heads_fall_back_to_exact_normalisers(slopes, weights):
    """A head whose normaliser is still growing at row P (slope 0 or 1e-3 with
    P = 32, N = 200: ``e^{-a P}`` near 1) must not get the stationary split:
    the product still matches the oracle to 1e-12 (the split alone would be
    off by about 1e-2). A head of weight 0 does not count."""
    n = 200
    v = np.random.default_rng(5).uniform(0, 1, n)
    expected = _oracle_product(v, slopes, [0.5, -1.0], weights, 1.0, "causal", None)
    got = _structured_product(v, slopes, [0.5, -1.0], weights, 1.0, "causal", None, transient=32)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    if weights[0] > 0:  # the split really would be wrong here, so the fallback matters
        w = np.asarray(weights) / np.sum(weights)
        split = _mixture(jnp.asarray(v), jnp.asarray(slopes), jnp.asarray([0.5, -1.0]), jnp.asarray(w), 32, 16)
        assert np.max(np.abs(np.asarray(split) - expected)) > 1e-6


# 3 examples (each a new n compiles both gradients, ~15 s); tests/test_adjoint.py
# covers the adjoint's branches at fixed points.
@settings(max_examples=3, deadline=None)
@given(data=st.data(), n=st.integers(2, 80), mask=masks, transient=st.sampled_from([16, 1000]))
def test_layer_gradients_match_autodiff_of_the_dense_kernel(data, n, mask, transient):
    """``jax.grad`` of ``<g, v^T A>`` through the structured product (its custom
    VJP) against ``jax.grad`` through ``kernels.layer_kernel`` (dense softmax),
    wrt v, slopes, content, head weights and temperature; slopes 0 and 1e-3..10,
    content +-1000 among the draws, temperature 0.1..10, every mask; with
    ``transient=16`` causal products of N > 16 take the stationary split
    (or its fallback when a slope is small). 1e-10 relative to the largest
    gradient entry plus 1e-10: float64 sums of <= 80 terms of size <= 1e3
    (the content derivative carries 1/tau <= 10)."""
    heads = 3
    floats = lambda lo, hi: st.floats(lo, hi, allow_nan=False)  # noqa: E731
    # Slopes in (0, 1e-3) are left out: the closed-form derivative of g_i loses digits there.
    slopes = np.asarray(data.draw(st.lists(st.one_of(st.just(0.0), floats(1e-3, 10)), min_size=heads, max_size=heads)))
    diagonal = np.asarray(data.draw(st.lists(st.one_of(floats(-20, 20), st.sampled_from([-1000.0, 1000.0])),
                                             min_size=heads, max_size=heads)))
    weights = np.asarray(data.draw(st.lists(floats(0.05, 1), min_size=heads, max_size=heads)))
    temperature = data.draw(floats(0.1, 10))
    window = data.draw(st.integers(1, n + 1)) if mask == "sliding" else None
    rng = np.random.default_rng(n)
    v, g = rng.uniform(0, 1, n), rng.normal(0, 1, n)
    zeros = jnp.zeros(heads)

    def structured_loss(v, m, d, w, tau):
        return jnp.dot(g, structured.row_times_kernel(v, m, d, zeros, w, tau, mask, window, transient=transient))

    def dense_loss(v, m, d, w, tau):
        return jnp.dot(g, v @ jaxroll.engine.alibi.layer_kernel(m, d, zeros, w, tau, n, mask, window))

    args = tuple(jnp.asarray(x) for x in (v, slopes, diagonal, weights, temperature))
    # Both gradients compiled (jit), as the rollout takes them: eagerly, each new n dispatched and
    # compiled the products' primitives one by one (17-25 s an example; compiled, 3.5-7 s).
    got = jax.jit(jax.grad(structured_loss, argnums=range(5)))(*args)
    expected = jax.jit(jax.grad(dense_loss, argnums=range(5)))(*args)
    for name, x, y in zip(("v", "slopes", "content", "weights", "temperature"), got, expected):
        scale = float(np.max(np.abs(y)))
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-10 * (1 + scale), err_msg=name)


@pytest.mark.parametrize("slope, derivative_rtol", [(0.0, 1e-13), (1e-200, 1e-13), (1e-7, 1e-8), (0.004, 1e-12),
                                                     (0.7, 1e-13), (30.0, 1e-13), (1e5, 1e-13)])
def test_geometric_counts_match_the_direct_sums(slope, derivative_rtol):
    """The tables' row counts ``g_i = sum_{k<i} r^k`` and ``h_i = -dg/da = sum_{k<i} k r^k``, i < 300.

    Oracle: NumPy float64 cumulative sums of ``r^k`` and ``k r^k`` (terms
    non-negative, so accurate to ~i ulp). `_geometric_rows` builds them
    from blocks of 64 (``g_{bK+l} = g_l + r^l g_{bK}``); its forward-mode
    derivative is ``h``. Counts: relative 1e-13 (a few hundred ulp). The
    derivative of the closed form ``expm1(-a i) / expm1(-a)`` at the block
    level loses about ``log10(1 / (a i))`` digits for ``0 < a i << 1``
    (`_geometric`'s docstring): 1e-8 at a = 1e-7 (observed 2.7e-9, as
    with the expm1 form of every row), 1e-12 at a = 0.004.
    """
    n = 300
    k = np.arange(n, dtype=float)
    powers = np.exp(-slope * k)
    g = np.concatenate([[0.0], np.cumsum(powers)[:-1]])
    h = np.concatenate([[0.0], np.cumsum(k * powers)[:-1]])
    a = jnp.array([slope, 0.5])
    counts, slope_derivative = jax.jvp(lambda x: structured_products._geometric_rows(x, n), (a,),
                                       (jnp.array([1.0, 0.0]),))
    assert counts.shape == (n, 2)
    np.testing.assert_allclose(counts[:, 0], g, rtol=1e-13, atol=0)
    np.testing.assert_allclose(-slope_derivative[:, 0], h, rtol=derivative_rtol, atol=derivative_rtol)
    np.testing.assert_allclose(counts[:, 1], np.concatenate([[0.0], np.cumsum(np.exp(-0.5 * k))[:-1]]),
                               rtol=1e-13)


def test_the_shortest_settled_prefix_is_exact_and_a_shorter_one_is_not():
    """`settled_prefix`'s P makes the stationary split exact to rounding; half of it does not.

    One layer, N = 4000, a random v (every row of A carries weight), slopes
    0.6 and 0.01 with content: P = ceil(36.04 / 0.01) -> 3648 rows in
    float64. Oracle: v @ the dense NumPy float64 kernel (tests/oracle.py).
    At P the products agree to 1e-12 relative to their largest entry; at
    P / 2 the normalisers beyond row 1824 are off by up to e^{-18} ~ 1.5e-8
    relative, which the same comparison must see.
    """
    n, slopes, diagonal, weights = 4000, [0.6, 0.01], [0.5, -1.0], [1.0, 2.0]
    prefix = structured.settled_prefix(np.asarray(slopes), np.asarray(weights), 1.0, np.float64)
    assert prefix == 3648
    v = np.random.default_rng(3).random(n)
    expected = _oracle_product(v, slopes, diagonal, weights, 1.0, "causal", None)
    scale = np.abs(expected).max()
    exact = _structured_product(v, slopes, diagonal, weights, 1.0, "causal", None, transient=prefix, settled=True)
    np.testing.assert_allclose(exact, expected, rtol=0, atol=1e-12 * scale)
    short = _structured_product(v, slopes, diagonal, weights, 1.0, "causal", None, transient=prefix // 2, settled=True)
    assert np.abs(short - expected).max() > 1e-10 * scale
