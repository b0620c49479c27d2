"""Dense rollouts against the NumPy float64 oracle, the theory's properties, and
transformations (jit, vmap, grad)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll.engine.plan import Path, plan
from conftest import ROLLOUT_CONFIGS

import oracle


@pytest.mark.parametrize("path", ROLLOUT_CONFIGS, ids=lambda p: str(p).split("rollout/")[-1])
def test_reference_config_matches_the_oracle(path, float32):
    """Every published configuration, at its own N, against oracle.influence.

    float64: 1e-12 absolute (observed below 1e-13: the attention-only BLOOM
    files, whose 70 near-uniform averages lose the most, reach 7e-14).
    float32: 1e-5 absolute (float32 epsilon 1.2e-7 times roughly T = 70
    layers of accumulated rounding).
    """
    config = oracle.read_config(path)
    expected = oracle.influence(oracle.config_arrays(config), config["sequence_length"])
    model = jaxroll.load_config(path)
    profile, mass = jaxroll.influence_with_mass(model, method="dense")
    assert profile.dtype == jnp.float64
    np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-12)
    assert abs(float(mass) - 1.0) < 1e-12
    with float32:
        profile32 = jaxroll.influence(model, method="dense")
        assert profile32.dtype == jnp.float32
        np.testing.assert_allclose(profile32, expected, rtol=0, atol=1e-5)
        assert abs(float(jnp.sum(profile32)) - 1.0) < 1e-6


def _random_model(rng, num_layers=4, num_heads=3, mask="causal", window=None, n=12):
    return jaxroll.RolloutModel.create(
        num_layers=num_layers, num_heads=num_heads,
        lambdas=rng.uniform(0, 1, num_layers),
        alibi_slopes=rng.uniform(0, 2, (num_layers, num_heads)),
        diagonal_scores=rng.normal(0, 3, (num_layers, num_heads)),
        base_scores=rng.normal(0, 1, (num_layers, num_heads)),
        head_weights=rng.uniform(0.1, 1, (num_layers, num_heads)),
        temperature=rng.uniform(0.5, 2), mask=mask, window=window, sequence_length=n)


def _oracle_arrays(model):
    return {"lambdas": np.asarray(model.lambdas), "slopes": np.asarray(model.alibi_slopes),
            "diagonal": np.asarray(model.diagonal_scores), "base": np.asarray(model.base_scores),
            "weights": np.asarray(model.head_weights), "temperature": float(model.temperature),
            "mask": model.mask, "window": model.window}


@pytest.mark.parametrize("mask, window", [("causal", None), ("sliding", 3), ("sliding", 1), ("full", None)])
def test_rollout_matrix_and_influence_match_the_oracle_for_every_mask(mask, window):
    model = _random_model(np.random.default_rng(1), mask=mask, window=window)
    arrays = _oracle_arrays(model)
    expected = oracle.rollout_matrix(arrays, 12)
    np.testing.assert_allclose(jaxroll.rollout_matrix(model), expected, rtol=0, atol=1e-13)
    last = oracle.influence(arrays, 12)
    np.testing.assert_allclose(jaxroll.influence(model), last / last.sum(), rtol=0, atol=1e-13)
    for layer in range(model.num_layers):
        np.testing.assert_allclose(jaxroll.attention_kernel(model, layer), oracle.layer_kernel(arrays, layer, 12),
                                   rtol=0, atol=1e-14)


def test_rollout_matrix_properties():
    """Causal: rows sum to 1, entries >= 0, lower triangular, last row = influence."""
    model = _random_model(np.random.default_rng(2), n=20)
    matrix = np.asarray(jaxroll.rollout_matrix(model))
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=0, atol=1e-13)
    assert matrix.min() >= 0.0
    assert np.all(np.triu(matrix, 1) == 0.0)
    np.testing.assert_allclose(jaxroll.influence(model), matrix[-1], rtol=0, atol=1e-14)


def test_causal_prefix_property():
    """The first n rows and columns of P at length N are P at length n."""
    model = _random_model(np.random.default_rng(3), n=30)
    full = np.asarray(jaxroll.rollout_matrix(model, 30))
    for n in (1, 2, 7, 29):
        np.testing.assert_allclose(jaxroll.rollout_matrix(model, n), full[:n, :n], rtol=0, atol=1e-14)


def test_lambda_zero_keeps_the_last_token():
    model = dataclasses.replace(_random_model(np.random.default_rng(4)), lambdas=np.zeros(4))
    np.testing.assert_array_equal(jaxroll.influence(model, 9), np.eye(9)[-1])


def test_uniform_causal_averaging_closed_form():
    """lambda = 1, slope 0, no content: A[i, j] = 1 / (i + 1) for j <= i.

    One layer: p = 1/N everywhere. Two layers: p_j = (1/N) sum_{i >= j} 1/(i+1).
    """
    n = 10
    one = jaxroll.RolloutModel.create(num_layers=1, num_heads=2, lambdas=1.0, alibi_slopes=0.0)
    np.testing.assert_allclose(jaxroll.influence(one, n), np.full(n, 1 / n), rtol=0, atol=1e-15)
    two = jaxroll.RolloutModel.create(num_layers=2, num_heads=1, lambdas=1.0, alibi_slopes=0.0)
    harmonic_tail = np.array([np.sum(1.0 / np.arange(j + 1, n + 1)) for j in range(n)])
    np.testing.assert_allclose(jaxroll.influence(two, n), harmonic_tail / n, rtol=0, atol=1e-15)


def test_attention_only_collapses_onto_the_first_token_with_depth():
    p = [float(jaxroll.influence(jaxroll.RolloutModel.create(
        num_layers=t, num_heads=1, lambdas=1.0, alibi_slopes=0.0), 16)[0]) for t in (1, 4, 16, 64)]
    assert p == sorted(p) and p[-1] > 0.99


@pytest.mark.parametrize("content", [1000.0, -1000.0])
@pytest.mark.parametrize("slope", [0.0, 10.0])
def test_softmax_is_stable_for_extreme_scores(content, slope, float32):
    model = jaxroll.RolloutModel.create(num_layers=3, num_heads=2, lambdas=0.5,
                                        alibi_slopes=[slope, 0.5], diagonal_scores=[content, -content])
    arrays = _oracle_arrays(model)
    expected = oracle.influence(arrays, 16)
    np.testing.assert_allclose(jaxroll.influence(model, 16), expected, rtol=0, atol=1e-13)
    with float32:
        profile = np.asarray(jaxroll.influence(model, 16))
        assert np.all(np.isfinite(profile)) and profile.min() >= 0
        np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-6)


def test_jit_vmap_over_lambda_schedules():
    base = _random_model(np.random.default_rng(5))
    schedules = jnp.asarray(np.random.default_rng(6).uniform(0, 1, (5, 4)))
    batched = jax.vmap(lambda lam: jaxroll.influence(dataclasses.replace(base, lambdas=lam)))(schedules)
    for k in range(5):
        expected = oracle.influence({**_oracle_arrays(base), "lambdas": np.asarray(schedules[k])}, 12)
        np.testing.assert_allclose(batched[k], expected, rtol=0, atol=1e-13)


def test_second_call_does_not_recompile():
    model = _random_model(np.random.default_rng(7))
    jaxroll.influence(model, 11)
    other = dataclasses.replace(model, lambdas=np.full(4, 0.3))
    with jax.log_compiles(True):
        import logging

        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            jaxroll.influence(other, 11)
        finally:
            logger.removeHandler(handler)
    assert not [r for r in records if "Compiling" in r.getMessage()]


def _finite_difference(function, array, step=1e-6):
    array = np.asarray(array, dtype=np.float64)
    gradient = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        up, down = array.copy(), array.copy()
        up[index] += step
        down[index] -= step
        gradient[index] = (function(up) - function(down)) / (2 * step)
    return gradient


@pytest.mark.parametrize("field", ["lambdas", "alibi_slopes", "diagonal_scores", "head_weights", "temperature"])
def test_gradient_matches_central_finite_differences(field):
    """d/dtheta of a scalar of the profile, relative 1e-6 (step 1e-6: truncation
    error ~1e-12, rounding ~1e-10 relative to values of order 1)."""
    rng = np.random.default_rng(8)
    model = _random_model(rng, num_layers=3, num_heads=2, n=10)
    weights = jnp.asarray(rng.uniform(size=10))

    def scalar(value):
        changed = dataclasses.replace(model, **{field: value})
        return jnp.sum(weights * jaxroll.influence(changed) ** 2)

    analytic = np.asarray(jax.grad(scalar)(jnp.asarray(getattr(model, field))))
    numeric = _finite_difference(lambda v: float(scalar(jnp.asarray(v))), getattr(model, field))
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-10)
    assert np.abs(analytic).max() > 1e-6  # the check is not vacuous


def test_gradient_with_respect_to_the_whole_model_is_finite():
    model = _random_model(np.random.default_rng(9), mask="sliding", window=2)
    gradients = jax.grad(lambda m: jaxroll.influence(m)[0])(model)
    for leaf in jax.tree.leaves(gradients):
        assert np.all(np.isfinite(leaf))


def test_bad_arguments():
    model = _random_model(np.random.default_rng(10))
    with pytest.raises(jaxroll.ConfigError, match="n: got 0"):
        jaxroll.influence(model, 0)
    with pytest.raises(jaxroll.ConfigError, match="method: got 'fast'"):
        jaxroll.influence(model, 4, method="fast")
    with pytest.raises(jaxroll.ConfigError, match="layer: got 4; allowed: 0 to 3"):
        jaxroll.attention_kernel(model, 4, 5)


def _settles(model, n):
    """The planner's ``(settled, transient)`` for `model` at length n."""
    path = plan(model, n, "structured")
    return path.settled, path.transient


def _long_model(slopes):
    """Two layers, two heads, content on the diagonal: every causal product's branch matters beyond row P."""
    return jaxroll.RolloutModel(
        lambdas=jnp.array([0.6, 0.9]), alibi_slopes=jnp.asarray(slopes, float),
        diagonal_scores=jnp.array([[0.5, -1.0], [1.5, 0.0]]), base_scores=jnp.zeros((2, 2)),
        head_weights=jnp.array([[1.0, 2.0], [1.0, 1.0]]), temperature=jnp.asarray(1.0))


def _w1_uniform(profile):
    n = profile.shape[-1]
    return jaxroll.metrics.wasserstein(profile, jnp.full(n, 1.0 / n))


def _by_row(model, n):
    row = jaxroll.rollout_row(model, jnp.zeros(n).at[n - 1].set(1.0))
    return row / jnp.sum(row)


# Compiled once for both models of the test below (same shapes): its cost is compilation.
_traced_profile = jax.jit(jaxroll.influence, static_argnums=1)
_traced_gradient = jax.jit(jax.grad(lambda m, n: _w1_uniform(jaxroll.influence(m, n))), static_argnums=1)
_row_profile = jax.jit(_by_row, static_argnums=1)
_row_gradient = jax.jit(jax.grad(lambda m, n: _w1_uniform(_by_row(m, n))), static_argnums=1)


@pytest.mark.parametrize("slopes, rung, concrete", [
    ([[0.5, 0.01], [0.02, 1.0]], 0, (True, 3648)),      # settled within alibi_prefix (9280 rows)
    ([[0.5, 0.01], [0.003, 1.0]], 1, (True, 12032)),    # within TRANSIENT (16,384), not 9280
    ([[0.5, 0.01], [1e-4, 1.0]], 2, (False, None)),     # not within TRANSIENT: per-product branches
], ids=["settled early", "settled late", "one head not settled"])
def test_one_branch_for_the_whole_rollout_takes_each_layers_product(slopes, rung, concrete):
    """Beyond row P a causal product needs `e^{-a P} < eps` for the stationary split (float64 here).

    `influence` decides that once for all layers: before compilation for
    concrete arrays (the shortest settled prefix, no branch at all), by one
    `lax.switch` around the scan for traced ones (jit, grad): split at
    `alibi_prefix`, at `TRANSIENT`, or per-product branches. Oracle:
    `rollout_row` under jit, whose products keep their own per-call branch
    at TRANSIENT (tested against dense kernels in test_structured and
    test_adjoint); slope 1e-4 has e^{-a P} = 0.19 at P = 16,384, so the
    third model must take the exact branch. Profiles agree to 1e-12 and sum
    to 1; gradients of W1 (every model array) to 1e-10 of their largest
    entry.
    """
    n = jaxroll.engine.structured_products.TRANSIENT[True] + 64
    model = _long_model(slopes)
    settled = rung < 2
    assert _settles(model, n) == concrete
    assert int(jaxroll.engine.structured.settled_rung(model.alibi_slopes, model.head_weights, model.temperature,
                                               jnp.float64)) == rung
    expected = np.asarray(_row_profile(model, n))
    for profile in (np.asarray(jaxroll.influence(model, n)), np.asarray(_traced_profile(model, n))):
        np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-12)
        assert abs(profile.sum() - 1.0) < 1e-12
    # The stationary split would be wrong here by far more than the tolerance.
    if not settled:
        split = jaxroll.rollout.influence_on_path(model, n, Path(settled=True))[0]
        assert np.abs(np.asarray(split) - expected).max() > 1e-9

    got, want = _traced_gradient(model, n), _row_gradient(model, n)
    for field in ("lambdas", "alibi_slopes", "diagonal_scores", "head_weights", "temperature"):
        g, w = np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * np.abs(w).max(), err_msg=field)


def _brute_force_prefix(slopes, weights, temperature, eps, block, limit):
    """The smallest multiple of `block` with e^{-a P} < eps for every weighted head, by trying them all."""
    a = np.asarray(slopes, float) / temperature
    a = a[np.asarray(weights) != 0]
    for prefix in range(block, limit + 1, block):
        if np.all(a * prefix >= -np.log(eps)):
            return prefix
    return None


@pytest.mark.parametrize("slopes, weights, temperature", [
    ([[0.5, 0.01], [0.02, 1.0]], [[1.0, 2.0], [1.0, 1.0]], 1.0),
    ([[0.5, 0.01], [0.02, 1.0]], [[1.0, 0.0], [1.0, 1.0]], 1.0),   # the smallest slope carries no weight
    ([[0.5, 0.01], [0.02, 1.0]], [[1.0, 2.0], [1.0, 1.0]], 4.0),   # a = m / tau
    ([[2.0 ** -8, 1.0]], [[1.0, 1.0]], 1.0),                       # ALiBi's smallest slope
    ([[1e-4, 1.0]], [[1.0, 1.0]], 1.0),                            # beyond TRANSIENT: None
    ([[0.0, 1.0]], [[1.0, 1.0]], 1.0),                             # a weighted slope 0 never settles
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_settled_prefix_is_the_shortest_block_multiple(slopes, weights, temperature, dtype):
    """`settled_prefix` against trying every multiple of BLOCK up to the dtype's TRANSIENT."""
    eps = float(np.finfo(dtype).eps)
    limit = jaxroll.engine.structured_products.TRANSIENT[dtype == "float64"]
    expected = _brute_force_prefix(slopes, weights, temperature, eps, jaxroll.engine.structured.BLOCK, limit)
    got = jaxroll.engine.structured.settled_prefix(np.asarray(slopes), np.asarray(weights), temperature, np.dtype(dtype))
    assert got == expected


def test_the_shortest_prefix_splits_rows_that_were_exact_before():
    """N = 4000 is below TRANSIENT (all rows exact before); every weighted slope >= 0.01 splits it at 3648.

    Both `influence` and `rollout_row`. This model's profile barely reads
    rows far from the end, so a too-short prefix would pass here too:
    test_structured's product-level test is the one that sees it.

    Oracle: the NumPy float64 rollout head by head (tests/oracle.py's
    `influence_by_correlation`, no (n, n) kernel), 1e-12.
    """
    model = _long_model([[0.5, 0.01], [0.02, 1.0]])
    n = 4000
    assert _settles(model, n) == (True, 3648)
    arrays = {"lambdas": np.asarray(model.lambdas), "slopes": np.asarray(model.alibi_slopes),
              "diagonal": np.asarray(model.diagonal_scores), "base": np.zeros((2, 2)),
              "weights": np.asarray(model.head_weights), "temperature": 1.0, "mask": "causal", "window": None}
    expected = oracle.influence_by_correlation(arrays, n)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(model, n)), expected, rtol=0, atol=1e-12)
    # rollout_row (rows beyond the last, sweeps) makes the same static choice for concrete arrays.
    row = np.asarray(jaxroll.rollout_row(model, jnp.zeros(n).at[n - 1].set(1.0)))
    np.testing.assert_allclose(row / row.sum(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("smallest", [2.0 ** -8, 0.9 * 2.0 ** -8, 0.3 * 2.0 ** -8, 1e-5, 0.0])
@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_settled_rung_against_the_settling_condition(dtype, smallest, temperature):
    """`settled_rung` against e^{-a P} < eps (NumPy) at P = alibi_prefix and P = TRANSIENT.

    alibi_prefix is ceil(-log(eps) 2^8) rounded up to 64 rows (4096 / 9280)
    and ALiBi's own smallest slope 2^-8 settles there at tau = 1 only.
    """
    eps = float(np.finfo(dtype).eps)
    rung_rows = 64 * int(np.ceil(-np.log(eps) * 2.0 ** 8 / 64))
    assert jaxroll.engine.structured.alibi_prefix(np.dtype(dtype)) == rung_rows
    slopes = np.array([[1.0, smallest], [0.5, 0.25]])
    weights = np.ones((2, 2))
    a = slopes / temperature
    if np.all(a * rung_rows >= -np.log(eps)):
        expected = 0
    elif np.all(a * jaxroll.engine.structured_products.TRANSIENT[dtype == "float64"] >= -np.log(eps)):
        expected = 1
    else:
        expected = 2
    got = jaxroll.engine.structured.settled_rung(jnp.asarray(slopes), jnp.asarray(weights), jnp.asarray(temperature),
                                          np.dtype(dtype))
    assert int(got) == expected
    if smallest == 2.0 ** -8 and temperature == 1.0:
        assert expected == 0
