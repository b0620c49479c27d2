"""Metrics against scipy and closed forms (float64, suite-wide x64).

Oracles: `scipy.stats.wasserstein_distance` on positions, `scipy.stats.spearmanr`,
`scipy.stats.entropy`, `scipy.spatial.distance.jensenshannon`, and plain NumPy
for the shape statistics. Tolerance 1e-12: each quantity is a sum of at most a
few hundred float64 terms of size <= 1 (rounding ~N eps ~ 1e-13).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.spatial.distance
import scipy.stats
from hypothesis import given, settings, strategies as st

from jaxroll import metrics
from jaxroll.errors import ConfigError

TOL = 1e-12


def _profile(rng, n, zeros=False, ties=False):
    p = rng.random(n)
    if ties:
        p = np.round(p * 4) / 4 + 0.01
    if zeros:
        p[rng.random(n) < 0.3] = 0.0
        p[0] += 0.1
    return p / p.sum()


JITTED = [jax.jit(f) for f in (metrics.wasserstein, metrics.total_variation, metrics.kl,
                                metrics.js, metrics.spearman)]
# A few fixed lengths: every new shape recompiles the eager jnp ops.
profiles = st.tuples(st.sampled_from([2, 5, 64, 256]), st.integers(0, 2**31 - 1), st.booleans(), st.booleans())


@settings(max_examples=30, deadline=None)
@given(profiles)
def test_distances_match_scipy(case):
    n, seed, zeros, ties = case
    wasserstein, total_variation, kl, js, spearman = JITTED
    rng = np.random.default_rng(seed)
    p, q = _profile(rng, n, zeros, ties), _profile(rng, n, False, ties)
    positions = np.arange(n)
    w1 = scipy.stats.wasserstein_distance(positions, positions, p, q) / (n - 1)
    assert abs(float(wasserstein(p, q)) - w1) < TOL
    assert abs(float(total_variation(p, q)) - 0.5 * np.abs(p - q).sum()) < TOL
    # q > 0 everywhere, so KL(p || q) is finite; scipy renormalises, p and q already sum to 1.
    assert abs(float(kl(p, q)) - scipy.stats.entropy(p, q)) < TOL
    assert abs(float(js(p, q)) - scipy.spatial.distance.jensenshannon(p, q) ** 2) < TOL
    if np.ptp(p) > 0 and np.ptp(q) > 0:
        rho = scipy.stats.spearmanr(p, q).statistic
        assert abs(float(spearman(p, q)) - rho) < TOL


def test_spearman_ties_and_constant():
    p = np.array([0.1, 0.2, 0.2, 0.2, 0.3])
    q = np.array([0.3, 0.1, 0.1, 0.25, 0.25])
    assert abs(float(metrics.spearman(p, q)) - scipy.stats.spearmanr(p, q).statistic) < TOL
    flat = np.full(5, 0.2)
    assert float(metrics.spearman(flat, q)) == 0.0  # documented convention: undefined -> 0
    assert float(metrics.spearman(q, q)) == pytest.approx(1.0, abs=TOL)


def test_kl_infinite_off_support_and_zero_terms():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.5, 0.0, 0.5])
    assert np.isinf(float(metrics.kl(p, q)))
    assert abs(float(metrics.kl(q[::-1].copy(), np.array([1 / 3] * 3))) -
               scipy.stats.entropy(q[::-1], [1 / 3] * 3)) < TOL
    assert 0 <= float(metrics.js(p, q)) <= np.log(2) + TOL


def test_batched_equals_rowwise():
    rng = np.random.default_rng(0)
    p = np.stack([_profile(rng, 40) for _ in range(6)]).reshape(2, 3, 40)
    q = np.stack([_profile(rng, 40) for _ in range(6)]).reshape(2, 3, 40)
    for function in (metrics.wasserstein, metrics.spearman, metrics.kl, metrics.js,
                     metrics.total_variation):
        function = jax.jit(function)  # one compile per shape, not one per eager op
        batched = np.asarray(function(p, q))
        rowwise = np.array([[float(function(p[a, b], q[a, b])) for b in range(3)] for a in range(2)])
        np.testing.assert_allclose(batched, rowwise, rtol=0, atol=TOL)


def test_shape_statistics_against_numpy():
    rng = np.random.default_rng(1)
    for n in (3, 10, 37, 256):
        p = _profile(rng, n)
        k = max(1, round(0.1 * n))
        assert abs(float(metrics.center_of_mass(p)) - np.dot(np.arange(n), p) / (n - 1)) < TOL
        np.testing.assert_allclose(metrics.edge_mass(p), [p[:k].sum(), p[-k:].sum()], atol=TOL)
        assert abs(float(metrics.middle_mass(p)) - p[k:n - k].sum()) < TOL
        u = min(p[:k].mean(), p[-k:].mean()) / p[k:n - k].mean() - 1
        assert abs(float(metrics.u_index(p)) - u) < TOL
        assert int(metrics.argmin(p)) == int(np.argmin(p))


def test_u_index_sign_is_the_u_shape():
    n = 50
    j = np.arange(n)
    u_shape = 1 + ((j - 24.5) / 24.5) ** 2
    assert float(metrics.u_index(u_shape / u_shape.sum())) > 0
    assert abs(float(metrics.u_index(np.full(n, 1 / n)))) < TOL  # flat: 0
    decreasing = np.exp(-j / 10.0)
    assert float(metrics.u_index(decreasing / decreasing.sum())) < 0  # last edge below middle
    with pytest.raises(ValueError, match="no middle"):
        metrics.u_index(np.full(2, 0.5))


def test_gradients_finite_differences_and_closed_forms():
    rng = np.random.default_rng(2)
    p, q = _profile(rng, 30), _profile(rng, 30)
    direction = rng.standard_normal(30)
    direction -= direction.mean()
    for function in (metrics.wasserstein, metrics.total_variation):
        # Piecewise linear: a central difference is exact away from kinks
        # (random p != q has none within h); 1e-9 covers rounding eps / h.
        gradient = jax.grad(function)(jnp.asarray(p), jnp.asarray(q))
        h = 1e-6
        numeric = (function(p + h * direction, q) - function(p - h * direction, q)) / (2 * h)
        assert abs(float(gradient @ direction) - float(numeric)) < 1e-9
    # Smooth ones against their closed-form gradients:
    # d KL(p||q) / dp = log(p / q) + 1;  d JS / dp = log(p / m) / 2, m = (p + q) / 2.
    np.testing.assert_allclose(jax.grad(metrics.kl)(jnp.asarray(p), jnp.asarray(q)),
                               np.log(p / q) + 1, rtol=0, atol=TOL)
    np.testing.assert_allclose(jax.grad(metrics.js)(jnp.asarray(p), jnp.asarray(q)),
                               np.log(2 * p / (p + q)) / 2, rtol=0, atol=TOL)
    assert jnp.all(jnp.isfinite(jax.grad(metrics.kl)(jnp.array([0.0, 0.5, 0.5]), jnp.full(3, 1 / 3))))
    jitted = jax.jit(metrics.wasserstein)(p, q)
    assert abs(float(jitted) - float(metrics.wasserstein(p, q))) < TOL


def test_compare_fields_and_float32_inputs(float32):
    rng = np.random.default_rng(3)
    p, q = _profile(rng, 64), _profile(rng, 64)
    with float32:
        result = metrics.compare(p, q)  # computed in float64 whatever the default
    positions = np.arange(64)
    assert abs(result.wasserstein - scipy.stats.wasserstein_distance(positions, positions, p, q) / 63) < TOL
    assert abs(result.kl - scipy.stats.entropy(p, q)) < TOL
    assert abs(result.spearman - scipy.stats.spearmanr(p, q).statistic) < TOL
    assert isinstance(result.p.argmin, int) and result.p.argmin == int(np.argmin(p))
    assert result.q.first == q[0] and result.q.last == q[-1]


@pytest.mark.parametrize("bad, message", [
    ([0.5, np.nan, 0.5], "p: value nan at index 1 is not finite"),
    ([0.5, -0.1, 0.6], "p: value -0.1 at index 1 is negative"),
    ([0.0, 0.0, 0.0], "p: total mass is 0"),
    ([0.2, 0.2, 0.2], "p: sums to 0.6"),
    ([], "p: got shape"),
])
def test_compare_rejects_bad_profiles(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        metrics.compare(np.array(bad), np.full(max(len(bad), 1), 1 / max(len(bad), 1)))
    assert "\n" not in str(error.value)


def test_compare_lengths_and_normalize():
    with pytest.raises(ConfigError, match="q: length 4 differs from p's length 3"):
        metrics.compare(np.full(3, 1 / 3), np.full(4, 0.25))
    raw = np.array([1.0, 2.0, 3.0, 2.0, 2.0])
    result = metrics.compare(raw, np.full(5, 1.0), normalize=True)
    assert abs(result.total_variation - 0.5 * np.abs(raw / 10 - 0.2).sum()) < TOL
