"""The kinetic closed form (jaxroll.theory.kinetic) against independent oracles.

Oracles: the issue's published reference values (6 digits), a plain NumPy
float64 implementation with `scipy.special.iv` written here, the power
series of psi summed with exact factorials, central finite differences, and
the end slope dS/ds located numerically.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import iv

from jaxroll.theory import kinetic

S_POINTS = np.array([0.02, 0.25, 0.5, 0.75, 0.98])
# The reference values (beta = 1, lambda = 1, M = 8, n_max = 20).
REFERENCE = {
    0.5: [0.522191, 0.484092, 0.561866, 0.673965, 0.806197],
    1.0: [1.664873, 1.195470, 1.265524, 1.422821, 1.618995],
    2.0: [7.486649, 3.532203, 3.174941, 3.162875, 3.264510],
}
T_CRIT = {0.1: 27.092952, 1.0: 2.457489, 2.0: 0.600716, 3.0: 0.174018}


def oracle_profile(s, t, beta, lam, M, n_max=20):
    """The closed form written directly in float64 NumPy with scipy's I_n."""
    s = np.asarray(s, dtype=np.float64)[..., None]
    n = np.arange(1, n_max + 1)
    a = n**2 * iv(n, beta)
    omega = np.exp(-np.pi**2 * n**2 / (2 * M**2))
    if lam == 0:
        y, prefactor = np.log(1 / s), 1.0
    else:
        y = np.log(np.expm1(lam) / np.expm1(lam * s))
        prefactor = lam * np.exp(lam * s) / np.expm1(lam)
    c = a * t
    psi = np.sqrt(c / y) * iv(1, 2 * np.sqrt(c * y))
    return np.sum(omega * prefactor * psi, axis=-1)


def oracle_t_crit(beta, lam, M, n_max=20):
    n = np.arange(1, n_max + 1)
    a = n**2 * iv(n, beta)
    omega = np.exp(-np.pi**2 * n**2 / (2 * M**2))
    return 2 * (1 - np.exp(-lam)) * np.sum(omega * a) / np.sum(omega * a**2)


@pytest.mark.parametrize("t", sorted(REFERENCE))
def test_reference_values(t):
    got = np.asarray(kinetic.profile(S_POINTS, t, 1.0, 1.0, 8.0))
    # The published values carry 6 decimals: half a unit of the last digit.
    np.testing.assert_allclose(got, REFERENCE[t], rtol=0, atol=5e-7)
    # Against the scipy oracle at full float64 precision.
    np.testing.assert_allclose(got, oracle_profile(S_POINTS, t, 1.0, 1.0, 8.0), rtol=1e-9, atol=0)


def test_reference_t_crit():
    betas = np.array(sorted(T_CRIT))
    got = np.asarray(kinetic.critical_time(betas, 1.0, 8.0))
    np.testing.assert_allclose(got, [T_CRIT[b] for b in betas], rtol=0, atol=5e-7)
    np.testing.assert_allclose(got, [oracle_t_crit(b, 1.0, 8.0) for b in betas], rtol=1e-9)


@pytest.mark.parametrize("lam", [0.0, 1e-5, 0.3, 4.0, 20.0, -2.0])
@pytest.mark.parametrize("beta", [0.2, 1.0, 5.0])
def test_profile_against_scipy(lam, beta):
    s = np.linspace(0.01, 0.99, 23)
    for t, M in ((0.1, 3.0), (1.5, 8.0), (6.0, 20.0)):
        got = np.asarray(kinetic.profile(s, t, beta, lam, M))
        np.testing.assert_allclose(got, oracle_profile(s, t, beta, lam, M), rtol=1e-9)


def test_log_bessel_i_against_scipy():
    order = np.arange(0, 21)[:, None]
    beta = np.array([1e-3, 0.1, 1.0, 3.0, 10.0, 30.0, 100.0])[None, :]
    got = np.asarray(kinetic.log_bessel_i(order, beta))
    # log I_n to 1e-12 absolute, i.e. I_n to 1e-12 relative.
    np.testing.assert_allclose(got, np.log(iv(order, beta)), rtol=0, atol=1e-12)


def series_psi(c, y, terms=300):
    """sum_k c^(k+1) y^k / (k! (k+1)!) by the term ratio c y / ((k+1)(k+2)), in float64."""
    term, total = c, 0.0
    for k in range(terms):
        total += term
        term *= c * y / ((k + 1) * (k + 2))
    return total


@pytest.mark.parametrize("c", [1e-6, 0.01, 0.7, 5.0, 40.0])
def test_psi_closed_form_against_series(c):
    y = np.array([0.0, 1e-9, 1e-4, 0.003, 0.1, 1.0, 2.5, 7.0])
    series = np.array([series_psi(c, v) for v in y])
    np.testing.assert_allclose(np.asarray(kinetic.psi(c, y)), series, rtol=1e-12)
    assert float(kinetic.psi(c, 0.0)) == pytest.approx(c, rel=1e-15)


def test_path_variable_and_prefactor_limits():
    s = np.linspace(0.05, 1.0, 20)
    np.testing.assert_allclose(np.asarray(kinetic.path_variable(s, 0.0)), np.log(1 / s), atol=1e-15)
    assert float(kinetic.path_variable(1.0, 3.0)) == 0.0
    # lambda -> 0 is continuous (the series branch meets the closed form).
    inner = s[:-1]
    for lam in (1e-3 * (1 - 1e-9), 1e-3 * (1 + 1e-9)):
        np.testing.assert_allclose(np.asarray(kinetic.profile(inner, 1.0, 1.0, lam, 8.0)),
                                   oracle_profile(inner, 1.0, 1.0, lam, 8.0), rtol=1e-12)
    np.testing.assert_allclose(np.exp(np.asarray(kinetic.log_prefactor(s, 2.0))),
                               2 * np.exp(2 * s) / np.expm1(2.0), rtol=1e-14)


def end_slope(t, beta, lam, M):
    """dS/ds at s = 1 by a fourth-order one-sided finite difference (independent of autodiff)."""
    h = 1e-3
    values = np.asarray(kinetic.profile(1.0 - np.arange(5) * h, t, beta, lam, M))
    return (25 * values[0] - 48 * values[1] + 36 * values[2] - 16 * values[3] + 3 * values[4]) / (12 * h)


@pytest.mark.parametrize("beta,lam,M", [(0.1, 1.0, 8.0), (1.0, 1.0, 8.0), (2.0, 3.0, 4.0), (1.0, 0.2, 12.0)])
def test_t_crit_is_the_sign_change_of_the_end_slope(beta, lam, M):
    predicted = float(kinetic.critical_time(beta, lam, M))
    located = brentq(lambda t: end_slope(t, beta, lam, M), predicted / 4, predicted * 4, xtol=1e-12)
    # The finite difference is O(h^4) = 1e-12 accurate in the slope.
    assert located == pytest.approx(predicted, rel=1e-6)
    # And the autodiff slope at s = 1 exactly agrees with the finite difference.
    grad = jax.grad(lambda s: kinetic.profile(s, 1.3 * predicted, beta, lam, M))(1.0)
    assert float(grad) == pytest.approx(end_slope(1.3 * predicted, beta, lam, M), rel=1e-7)
    assert float(grad) < 0


@pytest.mark.parametrize("argument", ["t", "beta", "lam", "M"])
def test_gradients_against_finite_differences(argument):
    point = dict(t=1.3, beta=1.7, lam=2.5, M=6.0)
    s = jnp.array([0.05, 0.4, 0.9])

    def f(value):
        return jnp.sum(kinetic.log_profile(s, **{**point, argument: value}))

    h = 1e-5
    x = point[argument]
    fd = (float(f(x + h)) - float(f(x - h))) / (2 * h)
    assert float(jax.grad(f)(x)) == pytest.approx(fd, rel=1e-7)


def test_gradient_at_lambda_zero_is_finite_and_right():
    s = jnp.array([0.1, 0.5, 0.95])

    def f(lam):
        return jnp.sum(kinetic.profile(s, 1.0, 1.0, lam, 8.0))

    h = 1e-6
    fd = (float(f(h)) - float(f(-h))) / (2 * h)
    assert float(jax.grad(f)(0.0)) == pytest.approx(fd, rel=1e-6)


def test_float32_no_overflow(float32):
    s = np.concatenate([np.geomspace(1e-3, 0.5, 12), np.linspace(0.55, 1.0, 10)])
    grid = np.array([(lam, t, beta) for lam in (0.0, 1e-4, 1.0, 100.0, 1000.0)
                     for t in (1e-3, 1.0, 50.0) for beta in (0.1, 1.0, 5.0)])
    lam, t, beta = (grid[:, k:k + 1] for k in range(3))
    reference = np.asarray(kinetic.log_profile(s, t, beta, lam, 8.0))
    with float32:
        def total(parameters):
            return jnp.sum(kinetic.log_profile(jnp.asarray(s[:-1], jnp.float32), *parameters, 8.0))

        parameters = tuple(jnp.asarray(x, jnp.float32) for x in (t, beta, lam))
        got = np.asarray(kinetic.log_profile(jnp.asarray(s, jnp.float32), *parameters, 8.0))
        grads = jax.grad(total)(parameters)
    assert got.dtype == np.float32
    assert np.all(np.isfinite(got))
    # float32 log-space error: a few ulps of the terms summed (|log S| up to ~1000).
    np.testing.assert_allclose(got, reference, rtol=2e-5, atol=2e-4)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def test_jit_vmap_over_t_and_parameters():
    s = jnp.linspace(0.05, 0.95, 7)
    ts = jnp.array([0.3, 1.0, 2.0])
    betas = jnp.array([0.5, 1.0, 2.0])
    batched = jax.jit(jax.vmap(lambda t, b: kinetic.profile(s, t, b, 1.0, 8.0)))(ts, betas)
    looped = np.stack([oracle_profile(np.asarray(s), float(t), float(b), 1.0, 8.0) for t, b in zip(ts, betas)])
    np.testing.assert_allclose(np.asarray(batched), looped, rtol=1e-9)


def test_multi_head_profile_is_the_signed_sum():
    s = np.linspace(0.05, 0.95, 9)
    beta, lam, w = np.array([1.0, 2.0]), np.array([1.0, 5.0]), np.array([1.0, -0.3])
    got = np.asarray(kinetic.multi_head_profile(s, 0.8, beta, lam, w, 8.0))
    want = sum(w[h] * oracle_profile(s, 0.8, beta[h], lam[h], 8.0) for h in range(2))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    model = kinetic.KineticModel.create(beta=beta, lam=lam, weights=w, t=0.8, M=8.0)
    np.testing.assert_allclose(np.asarray(model(s)), want, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(model.critical_time()),
                               [oracle_t_crit(b, m, 8.0) for b, m in zip(beta, lam)], rtol=1e-9)


def test_effective_rate_reproduces_t_crit():
    beta, lam, M = 1.4, 2.0, 7.0
    assert float(2 * (1 - np.exp(-lam)) / kinetic.effective_rate(beta, M)) == pytest.approx(
        oracle_t_crit(beta, lam, M), rel=1e-12)
