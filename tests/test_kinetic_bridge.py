"""The bridge: a rollout with one ALiBi head of slope lambda/N and total mixing c tends to a kinetic mode.

Oracles: the kinetic closed form (itself checked against scipy in
test_kinetic.py), the first-order rate of the binomial -> Poisson limit (the
error halves when T doubles), and the sign-flip corollary located by root
finding on rollout profiles.
"""

import jax
import numpy as np
import pytest
from scipy.optimize import brentq

import jaxroll
from jaxroll.errors import ConfigError
from jaxroll.theory import bridge, kinetic


def relative_error(c, lam, n, layers, window=(0.05, 0.95)):
    """max over s_j = j/N in the window of |N e^c P_T[N-1, j] - g(c; s_j)| / g(c; s_j)."""
    p = jaxroll.influence(bridge.mode_rollout(c, lam, n, layers))
    s, scaled = bridge.mode_from_rollout(p, c)
    g = kinetic.mode(c, s, lam)
    keep = (s >= window[0]) & (s <= window[1])
    return float(np.max(np.abs(np.asarray(scaled - g))[keep] / np.asarray(g)[keep]))


@pytest.mark.parametrize("beta,n_mode", [(1.0, 1), (1.0, 2), (2.0, 1)])
def test_rollout_converges_to_each_mode(beta, n_mode):
    # c = a_n t for mode n at t = 1.
    c = float(kinetic.rates(beta, n_max=n_mode)[n_mode - 1])
    coarse = relative_error(c, 1.0, 200, 50)
    fine = relative_error(c, 1.0, 400, 100)
    # Measured (docs/kinetic.md, the convergence table): about 0.5 c / T at these
    # sizes, first order, so doubling N and T halves the error (ratio 2 +- 0.3).
    assert fine < 0.02
    assert 1.7 < coarse / fine < 2.3


def test_mode_from_rollout_drops_the_query():
    p = jaxroll.influence(bridge.mode_rollout(1.0, 2.0, 64, 16))
    s, scaled = bridge.mode_from_rollout(p, 1.0)
    assert s.shape == (63,) and scaled.shape == (63,)
    np.testing.assert_allclose(np.asarray(s), np.arange(63) / 64)
    np.testing.assert_allclose(np.asarray(scaled), 64 * np.e * np.asarray(p[:-1]), rtol=1e-14)


def end_slope_of_rollout(c, m, n, layers):
    p = jaxroll.influence(jaxroll.RolloutModel.create(num_layers=layers, num_heads=1, lambdas=c / layers,
                                                      alibi_slopes=[m], sequence_length=n))
    return float(p[n - 2] - p[n - 3])


@pytest.mark.parametrize("mn", [1.0, 4.0])
def test_sign_flip_corollary(mn):
    n, layers = 800, 64
    predicted = float(bridge.sign_flip_mixing(mn))
    located = brentq(lambda c: end_slope_of_rollout(c, mn / n, n, layers), 0.3 * predicted,
                     min(3 * predicted, layers), xtol=1e-6)
    # The measurement: 1.257 vs 1.264 (m N = 1), 1.960 vs 1.963 (m N = 4).
    assert located == pytest.approx(predicted, rel=0.03)


def test_kinetic_counterpart_inverts_mode_rollout():
    model = bridge.mode_rollout(1.7, 3.0, 128, 32)
    back = bridge.kinetic_counterpart(model)
    assert back.lam == pytest.approx(3.0, rel=1e-14)
    assert back.total_mixing == pytest.approx(1.7, rel=1e-14)
    assert back.threshold == pytest.approx(2 * (1 - np.exp(-3.0)), rel=1e-14)
    with pytest.raises(ConfigError, match="heads"):
        bridge.kinetic_counterpart(jaxroll.presets.get("mpt-7b"))


def test_matching_rollout_has_the_kinetic_threshold():
    one = kinetic.KineticModel.create(beta=1.0, lam=1.0, t=2.0, M=8.0)
    model = bridge.matching_rollout(one, 256, 64)
    c = bridge.kinetic_counterpart(model).total_mixing
    # c / c* = t / t_crit: the same side of the threshold.
    ratio_kinetic = 2.0 / float(kinetic.critical_time(1.0, 1.0, 8.0))
    assert c / float(bridge.sign_flip_mixing(1.0)) == pytest.approx(ratio_kinetic, rel=1e-12)
    with pytest.raises(ConfigError, match="total_mixing"):
        bridge.mode_rollout(100.0, 1.0, 64, 16)


def test_bridge_rollouts_jit():
    # The mode rollouts are ordinary models: influence is jit-compatible in them.
    model = bridge.mode_rollout(1.0, 1.0, 32, 8)
    p = jax.jit(jaxroll.influence, static_argnums=1)(model, 32)
    assert float(np.sum(np.asarray(p))) == pytest.approx(1.0, abs=1e-12)
