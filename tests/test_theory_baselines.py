"""Closed-form baselines (`jaxroll.theory.baselines`) against what they approximate.

The Cesàro rollout: its exact profile against a dense NumPy product of the
literal matrices and against `jaxroll.influence` of a uniform-causal model
(1e-12 in float64: both are sums of non-negative terms, observed 1e-16); its
binomial-mixture form against scipy quadrature; its continuum and deep limits
by their convergence rates. The power law by distance: recovery and interval
coverage on synthetic data with known parameters.
"""

import numpy as np
import pytest
import scipy.integrate
import scipy.optimize
import scipy.special
import scipy.stats

import jaxroll
from jaxroll import ConfigError
from jaxroll.theory import baselines


def _dense_cesaro_row(n, alphas):
    """The literal rollout: M[i, j] = 1/(i + 1) for j <= i, P = R_T ... R_1, its last row."""
    M = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    P = np.eye(n)
    for a in alphas:
        P = ((1 - a) * np.eye(n) + a * M) @ P
    return P[-1]


@pytest.mark.parametrize("n, alpha, layers", [(1, 0.5, 3), (2, 0.3, 1), (40, 0.0, 5), (40, 1.0, 7), (64, 0.25, 12),
                                              (97, [0.9, 0.1, 0.5, 0.0, 0.33], 5)])
def test_cesaro_profile_is_the_last_row_of_the_dense_product(n, alpha, layers):
    alphas = np.broadcast_to(np.asarray(alpha, dtype=float), (layers,))
    expected = _dense_cesaro_row(n, alphas)
    profile = np.asarray(baselines.cesaro_profile(n, alpha, layers))
    np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-12)
    assert abs(profile.sum() - 1) < 1e-12 and profile.min() >= 0


@pytest.mark.parametrize("alpha", [0.2, np.linspace(0.6, 0.05, 16)])
def test_cesaro_profile_is_the_rollout_of_a_uniform_causal_model(alpha):
    """ALiBi slope 0, no content, causal: every head is the Cesàro matrix."""
    n, layers = 300, 16
    model = jaxroll.RolloutModel.create(num_layers=layers, num_heads=2,
                                        lambdas=np.broadcast_to(alpha, (layers,)),
                                        alibi_slopes=[[0.0, 0.0]], diagonal_scores=[[0.0]], sequence_length=n)
    for method in ("dense", "structured"):
        np.testing.assert_allclose(np.asarray(baselines.cesaro_profile(n, alpha, layers)),
                                   np.asarray(jaxroll.influence(model, method=method)), rtol=0, atol=1e-12)


def test_mixing_count_is_the_binomial_law_for_constant_alpha():
    np.testing.assert_allclose(np.asarray(baselines.mixing_count(0.3, 9)),
                               scipy.stats.binom.pmf(np.arange(10), 9, 0.3), rtol=1e-13)


def _density(t, alpha, layers):
    """The continuum density written out for the test: sum_{s >= 1} Binom(s; T, alpha) (-ln t)^(s-1)/(s-1)!."""
    s = np.arange(1, layers + 1)
    return float(np.sum(scipy.stats.binom.pmf(s, layers, alpha) * (-np.log(t)) ** (s - 1)
                        / scipy.special.factorial(s - 1)))


def test_the_profile_is_a_binomial_mixture_over_the_continuum_law():
    """p(j) = atom [j = n] + int_0^1 C(n, j) t^j (1 - t)^(n - j) g(t) dt, by scipy quadrature
    (the recursion and the density meet only here): 1e-9, quad's tolerance."""
    n_tokens, alpha, layers = 30, 0.4, 4
    n = n_tokens - 1
    profile = np.asarray(baselines.cesaro_profile(n_tokens, alpha, layers))
    atom = float(baselines.cesaro_atom(alpha, layers))
    for j in (0, 1, 7, 15, 28, 29):
        value, _ = scipy.integrate.quad(lambda t: scipy.stats.binom.pmf(j, n, t) * _density(t, alpha, layers),
                                        0, 1, limit=200, epsabs=1e-13, epsrel=1e-11)
        assert abs(value + atom * (j == n) - profile[j]) < 1e-9, j
    mass, _ = scipy.integrate.quad(lambda t: _density(t, alpha, layers), 0, 1, limit=200, epsabs=1e-13)
    assert abs(mass + atom - 1) < 1e-9
    assert atom == pytest.approx((1 - alpha) ** layers, rel=1e-14)
    x = np.array([1e-300, 1e-9, 0.01, 0.37, 0.999, 1.0])
    np.testing.assert_allclose(np.asarray(baselines.cesaro_density(x, alpha, layers)),
                               [_density(t, alpha, layers) for t in x], rtol=1e-13)


def test_the_continuum_limit_holds_inside_at_rate_one_over_n():
    """(N + 1) p(j) -> g((j + 1)/(N + 1)) on [0.1, 0.9]; doubling N halves the error (observed ratios 2.0)."""
    alpha, layers = 0.3, 6
    errors = []
    for n in (400, 800, 1600):
        p = np.asarray(baselines.cesaro_profile(n, alpha, layers))
        x = np.arange(1, n + 1) / (n + 1)
        inside = (x > 0.1) & (x < 0.9)
        g = np.asarray(baselines.cesaro_density(x[inside], alpha, layers))
        errors.append(np.max(np.abs((n + 1) * p[inside] - g)))
        # The last token keeps the atom, plus O(1/N) of the density.
        assert abs(p[-1] - float(baselines.cesaro_atom(alpha, layers))) < 2 * layers / n
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 1.7) & (ratios < 2.3)), ratios
    # The primacy tail: the density diverges like (-ln x)^(T-1) at 0, the first tokens carry it.
    assert float(baselines.cesaro_density(1e-12, alpha, layers)) > 10 * float(baselines.cesaro_density(0.5, alpha,
                                                                                                    layers))


def test_the_deep_limit_is_the_bessel_density_at_rate_one_over_t():
    """alpha = c / T, T -> infinity: Binomial -> Poisson, error O(1/T) (observed ratios 2.0); the
    Bessel form against its Poisson series written out here, and its mass by quadrature."""
    c = 4.0
    x = np.linspace(0.02, 1.0, 50)
    limit = np.asarray(baselines.cesaro_poisson_density(x, c))
    s = np.arange(1, 80)
    series = [np.sum(scipy.stats.poisson.pmf(s, c) * (-np.log(t)) ** (s - 1) / scipy.special.factorial(s - 1))
              for t in x]
    np.testing.assert_allclose(limit, series, rtol=1e-12)
    errors = [np.max(np.abs(np.asarray(baselines.cesaro_density(x, c / t, t)) - limit)) for t in (50, 100, 200)]
    assert 1.7 < errors[0] / errors[1] < 2.3 and 1.7 < errors[1] / errors[2] < 2.3, errors

    def bessel(t):
        L = -np.log(t)
        return np.exp(-c) * np.sqrt(c / L) * scipy.special.i1(2 * np.sqrt(c * L))

    mass, _ = scipy.integrate.quad(bessel, 0, 1, limit=200)
    assert abs(mass + np.exp(-c) - 1) < 1e-9
    assert float(baselines.cesaro_poisson_density(1.0, c)) == pytest.approx(c * np.exp(-c), rel=1e-14)


def test_power_law_fit_recovers_noiseless_parameters():
    r = np.arange(0, 300)
    truth = (0.002, 0.3, 0.8)
    fit = baselines.fit_power_law(r, np.asarray(baselines.power_law(r, *truth)))
    np.testing.assert_allclose(fit.parameters, truth, rtol=1e-8, atol=1e-11)
    assert fit.rms < 1e-12
    assert not fit.at_bound
    # A straight line in r is no power law: p runs to the end of its range, and says so.
    assert baselines.fit_power_law(r, 1.0 - 1e-3 * r, p_bounds=(0.01, 5.0)).at_bound


def test_power_law_intervals_cover_at_their_level():
    """200 noisy data sets with known parameters: each interval covers its truth in 95% +- 3 binomial
    standard deviations (0.015) of them."""
    rng = np.random.default_rng(2606)
    r = np.arange(0, 120)
    truth = np.array([0.001, 0.2, 0.8])
    clean = np.asarray(baselines.power_law(r, *truth))
    covered = np.zeros(3)
    trials = 200
    for _ in range(trials):
        fit = baselines.fit_power_law(r, clean + rng.normal(0, 2e-3, r.size))
        covered += (fit.interval[:, 0] <= truth) & (truth <= fit.interval[:, 1])
    rate = covered / trials
    assert np.all(np.abs(rate - 0.95) < 3 * np.sqrt(0.95 * 0.05 / trials) + 1e-9), rate


def test_power_law_fit_with_absolute_sigma_matches_curve_fit():
    """scipy.optimize.curve_fit, from the truth as its start, is the oracle for the estimate and covariance."""
    rng = np.random.default_rng(1)
    r = np.arange(0, 80)
    sigma = 1e-3 * (1 + r / 40)
    y = np.asarray(baselines.power_law(r, 0.01, 0.5, 1.2)) + rng.normal(0, 1, r.size) * sigma
    fit = baselines.fit_power_law(r, y, sigma, absolute_sigma=True)
    expected, covariance = scipy.optimize.curve_fit(lambda r, g, b, p: g + b * (r + 1.0) ** (-p), r, y,
                                                    p0=(0.01, 0.5, 1.2), sigma=sigma, absolute_sigma=True,
                                                    xtol=1e-14, ftol=1e-14)
    np.testing.assert_allclose(fit.parameters, expected, rtol=1e-6)
    np.testing.assert_allclose(fit.covariance, covariance, rtol=1e-4)


def test_by_distance_reads_a_function_of_distance_back():
    rng = np.random.default_rng(0)
    n = 40
    f = rng.uniform(0, 1, n)
    queries = np.array([5, 17, 39, 39, 22])
    rows = np.zeros((len(queries), n))
    for k, i in enumerate(queries):
        rows[k, : i + 1] = f[i - np.arange(i + 1)] * (1 + 0.1 * k)  # row k: f(i - j), scaled
    r, mean = baselines.by_distance(rows, queries)
    assert list(r) == list(range(40))
    scale = np.array([np.mean([1 + 0.1 * k for k, i in enumerate(queries) if i >= d]) for d in r])
    np.testing.assert_allclose(mean, f * scale, rtol=1e-14)
    _, median = baselines.by_distance(rows, queries, "median")
    assert median[0] == pytest.approx(f[0] * 1.2)  # median of the scales 1.0 .. 1.4


@pytest.mark.parametrize("call, message", [
    (lambda: baselines.cesaro_profile(0, 0.5, 3), "n: got 0; allowed: an integer >= 1"),
    (lambda: baselines.cesaro_profile(5, 1.5, 3), "alpha: got values in [1.5, 1.5]; allowed: [0, 1]"),
    (lambda: baselines.cesaro_profile(5, [0.1, 0.2], 3), "alpha: got shape (2,); allowed: a scalar or (3,)"),
    (lambda: baselines.fit_power_law([0, 1, 2], [1, 2, 3]), "r: got 3 points; allowed: at least 4"),
    (lambda: baselines.by_distance(np.ones((2, 3)), [0, 3]), "queries: got values outside [0, 3)"),
    (lambda: baselines.by_distance(np.ones((1, 3)), [1], "mode"), "statistic: got 'mode'"),
])
def test_bad_input_is_a_one_line_error(call, message):
    with pytest.raises(ConfigError) as error:
        call()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
