"""The claims of arXiv 2602.16837 (as docs/design.md, "The mathematics", states
them), each as a test that would fail if the claim were false for jaxroll's code.

Reference models: the authors' published no_content configurations of BLOOM-176B,
BLOOM-7B1, MPT-7B, MPT-30B and Falcon-RW-7B (N = 256), read from
the published configurations shipped in the package
(jaxroll.published). float64 throughout (conftest).
"""

import dataclasses

import jax
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings, strategies as st

import jaxroll
from jaxroll import metrics, schedules, theory
from conftest import REFERENCE_CONFIGS

import oracle

MODELS = ("bloom", "bloom-7b1", "mpt-7b", "mpt-30b", "falcon-rw-7b")
NO_CONTENT = REFERENCE_CONFIGS / "rollout" / "alibi" / "no_content"
# Rounding in float64 products of <= 70 row-stochastic 256x256 transitions is
# ~T N eps ~ 4e-12; comparisons that the theory makes exact (dominance, equal
# drifts) allow 1e-10.
TOL = 1e-10


def _truncate(model, depth):
    """The first `depth` layers of a model."""
    return dataclasses.replace(
        model, lambdas=model.lambdas[:depth], alibi_slopes=model.alibi_slopes[:depth],
        diagonal_scores=model.diagonal_scores[:depth], base_scores=model.base_scores[:depth],
        head_weights=model.head_weights[:depth])


@pytest.fixture(scope="module")
def reference(reference_configs):
    """Per model: the four-forces ladder and the attention-only profiles (computed once)."""
    results = {}
    for name in MODELS:
        model = jaxroll.load_config(NO_CONTENT / f"{name}.yaml")
        attention_only = jaxroll.load_config(NO_CONTENT / f"{name}-noresidual.yaml")
        half = _truncate(attention_only, attention_only.num_layers // 2)
        results[name] = {
            "model": model,
            "forces": theory.forces(model),
            "attention_only": np.asarray(jaxroll.influence(attention_only)),
            "attention_only_half": np.asarray(jaxroll.influence(half)),
        }
    return results


@pytest.mark.parametrize("name", MODELS)
def test_attention_only_rollout_concentrates_on_first_token(reference, name):
    """"lambda = 1 everywhere is the attention-only rollout of earlier theory
    (Wu et al., ICML 2025): it collapses onto the first token as T grows."

    At N = 256 and the models' own depths, p[0] > 0.9 (measured 0.991 to
    0.99999997, so 0.9 is far from any rounding). Growth with depth: the
    theory proves p_T is stochastically decreasing in T for monotone kernels,
    so p[0] at depth T/2 <= p[0] at T.
    """
    full = reference[name]["attention_only"]
    half = reference[name]["attention_only_half"]
    assert abs(full.sum() - 1) < 1e-12 and np.all(np.isfinite(full))
    assert full[0] > 0.9
    assert half[0] <= full[0] + TOL
    assert full[0] > 1 / 256 * 100  # far from uniform: the collapse, not a flat profile


@pytest.mark.parametrize("name", MODELS)
def test_residual_aware_rollout_is_u_shaped(reference, name):
    """"explains the U-shaped ('lost in the middle') profile from architecture alone":
    with the measured lambdas, both the first and the last tenth carry more
    mass per position than the middle, and the minimum lies strictly inside.

    Checked in plain NumPy on the profile (k = round(0.1 * 256) = 26) and with
    metrics.u_index > 0; the measured margins (u_index 0.11 to 0.71) are far
    above rounding.
    """
    p = np.asarray(reference[name]["forces"].profiles[-1])
    n, k = p.size, 26
    middle = p[k:n - k].mean()
    assert p[:k].mean() > middle and p[-k:].mean() > middle
    assert 0 < int(np.argmin(p)) < n - 1
    assert float(metrics.u_index(p)) > 0
    assert abs(float(metrics.u_index(p)) - (min(p[:k].mean(), p[-k:].mean()) / middle - 1)) < 1e-12


def _cdf(p):
    return np.cumsum(np.asarray(p), axis=-1)


@pytest.mark.parametrize("name", MODELS)
def test_forces_move_mass_as_stated_on_reference_models(reference, name):
    """"causal masking drifts mass toward early positions (primacy), the residual
    identity path keeps mass at late positions (recency), recency-favouring
    position biases such as ALiBi add recency."

    Stronger than the centre of mass: each rung's CDF is ordered against the
    previous one (stochastic dominance, which the theory proves for monotone
    kernels), within 1e-10 of rounding. No content in these configs: the
    content force is 0 exactly.
    """
    result = reference[name]["forces"]
    drift = np.asarray(result.drift_center_of_mass)
    assert drift[0] < 0 and drift[1] > 0 and drift[2] > 0
    assert abs(drift[3]) < TOL
    causal, residual, alibi, _ = _cdf(result.profiles)
    assert np.all(residual <= causal + TOL)
    assert np.all(alibi <= residual + TOL)


# A property family of stochastically monotone kernels: causal ALiBi + diagonal
# content of one sign, random lambdas, slopes, head weights and temperature
# (fixed shapes T = 4, H = 3, n = 16 so one compilation serves every example).
families = st.tuples(st.integers(0, 2**31 - 1), st.sampled_from([-1.0, 1.0]))


@settings(max_examples=25, deadline=None)
@given(families)
def test_forces_directions_on_monotone_family(case):
    """The four forces' directions, on any stochastically monotone kernel:
    causal masking < 0, residual >= 0, ALiBi >= 0 in centre of mass, and "a
    positive diagonal content score adds recency while a negative one adds
    primacy". Each as CDF dominance within 1e-12 (float64 products of <= 4
    16x16 transitions round to ~1e-15).
    """
    seed, sign = case
    rng = np.random.default_rng(seed)
    model = jaxroll.RolloutModel.create(
        num_layers=4, num_heads=3, lambdas=rng.uniform(0.01, 1.0, 4),
        alibi_slopes=rng.uniform(0.0, 1.5, (4, 3)), diagonal_scores=sign * rng.uniform(0.0, 4.0, (4, 3)),
        head_weights=rng.uniform(0.05, 1.0, (4, 3)), temperature=rng.uniform(0.5, 2.0),
        sequence_length=16)
    assert theory.is_stochastically_monotone(model).holds
    result = theory.forces(model)
    causal, residual, alibi, content = _cdf(result.profiles)
    assert np.all(residual <= causal + 1e-12) and np.all(alibi <= residual + 1e-12)
    if sign > 0:
        assert np.all(content <= alibi + 1e-12)
    else:
        assert np.all(content >= alibi - 1e-12)
    drift = np.asarray(result.drift_center_of_mass)
    assert drift[0] < 0 and drift[1] >= -1e-12 and drift[2] >= -1e-12
    assert sign * drift[3] >= -1e-12


def test_diagonal_content_sign_moves_mass(reference):
    """"a positive diagonal content score adds recency while a negative one adds
    primacy": MPT-7B's measured lambdas and slopes at N = 64 with d = +2, 0, -2
    in every head; the CDFs are ordered (dominance within 1e-10) and the
    centre of mass strictly so (differences ~1e-2, far above rounding).
    """
    model = reference["mpt-7b"]["model"]
    profiles = [np.asarray(jaxroll.influence(
        dataclasses.replace(model, diagonal_scores=np.full_like(model.diagonal_scores, d)), 64))
        for d in (2.0, 0.0, -2.0)]
    positive, zero, negative = (_cdf(p) for p in profiles)
    assert np.all(positive <= zero + TOL) and np.all(zero <= negative + TOL)
    com = [float(metrics.center_of_mass(p)) for p in profiles]
    assert com[0] > com[1] > com[2]


BETAS = (0.5, 1.0, 1.5, 2.0)
DEPTHS = np.array([100, 1_000, 10_000, 100_000])
LAMBDA_0 = 0.5


@pytest.fixture(scope="module")
def dichotomy(reference_configs):
    """MPT-7B's first-layer kernel at n = 32, power-decay schedules to 10^5 layers."""
    model = _truncate(jaxroll.load_config(NO_CONTENT / "mpt-7b.yaml"), 1)
    n = 32
    # delta = max_i (1 - A[i, i]) from the oracle's own kernel (independent code).
    kernel = oracle.layer_kernel(oracle.config_arrays(oracle.read_config(NO_CONTENT / "mpt-7b.yaml")), 0, n)
    delta = 1 - np.diag(kernel).min()
    results = {beta: theory.depth_profile(model, schedules.power_decay(LAMBDA_0, beta, DEPTHS[-1]),
                                          DEPTHS, n=n) for beta in BETAS}
    return results, delta


@pytest.mark.parametrize("beta", BETAS)
def test_collapse_dichotomy(dichotomy, beta):
    """"For token i > 0 with A_t[i, i] <= 1 - delta, [P_T[i, i]] stays bounded
    away from 0 iff sum_t lambda_t < inf: finite total mixing, no collapse;
    infinite total mixing, collapse onto token 0."

    lambda_t = 0.5 / (t + 1)^beta at depths 10^2..10^5. Tested on trends with
    bounds the theory proves, never one depth's value:
    - always: min_i P_T[i, i] >= prod_t (1 - lambda_t delta) (equal here, the
      kernel being layer-independent; 1e-9 relative for the log-sum of 10^5
      terms), and collapse_mass is nondecreasing in T (P_T e_0 grows
      entrywise because (A - I) e_0 >= 0 and the R_t commute);
    - beta > 1: between depths T1 < T2 the diagonal falls by at most the
      factor 1 - delta sum_{T1 < t <= T2} lambda_t (it levels off), and stays
      above the depth-free constant exp(-delta lambda_0 zeta(beta) /
      (1 - lambda_0 delta)); collapse_mass <= 1 - that constant;
    - beta <= 1: it falls at least like exp(-delta sum_t lambda_t) between
      depths, a bound that tends to 0, and collapse_mass rises (to > 1 - 1e-6
      by 10^5 layers for beta = 0.5).
    """
    results, delta = dichotomy
    result = results[beta]
    t = np.arange(DEPTHS[-1], dtype=np.float64)
    lambdas = np.minimum(LAMBDA_0 / (t + 1) ** beta, 1.0)
    mixing = np.cumsum(lambdas)[DEPTHS - 1]
    log_bound = np.cumsum(np.log1p(-lambdas * delta))[DEPTHS - 1]
    diagonal_min = np.asarray(result.diagonal_min)
    collapse = np.asarray(result.collapse_mass)
    np.testing.assert_allclose(result.total_mixing, mixing, rtol=1e-12)
    assert abs(float(result.delta) - delta) < 1e-12
    assert np.all(np.log(diagonal_min) >= log_bound - 1e-9 * np.maximum(1, np.abs(log_bound)))
    assert np.all(np.diff(collapse) >= -1e-12)
    assert np.all(np.isfinite(result.profiles)) and np.all(np.abs(np.sum(result.profiles, -1) - 1) < 1e-12)
    ratios = diagonal_min[1:] / diagonal_min[:-1]
    if beta > 1:
        tail = np.diff(mixing)
        assert np.all(ratios >= 1 - delta * tail - 1e-12)
        floor = np.exp(-delta * LAMBDA_0 * scipy.special.zeta(beta) / (1 - LAMBDA_0 * delta))
        assert np.all(diagonal_min >= floor)
        assert np.all(collapse <= 1 - floor)
    else:
        assert np.all(ratios <= np.exp(-delta * np.diff(mixing)) * (1 + 1e-9))
        assert np.all(diagonal_min <= np.exp(-delta * mixing) * (1 + 1e-9))
        # strictly rising until it reaches 1 to rounding (beta = 0.5 saturates by 10^4)
        assert np.all((np.diff(collapse) > 0) | (collapse[1:] > 1 - 1e-12))
        if beta == 0.5:
            assert collapse[-1] > 1 - 1e-6
