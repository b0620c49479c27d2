"""theory.* against the plain NumPy float64 oracle (tests/oracle.py) and closed forms.

Tolerances: products of at most ~50 transitions of 32x32 row-stochastic
matrices in float64 round to ~T n eps ~ 1e-13; 1e-12 is asserted. The
depth scan's 10^4-step comparison allows 1e-10 (10^4 steps of rounding).
"""

import dataclasses

import jax
import numpy as np
import pytest

import jaxroll
from jaxroll import schedules, theory
from jaxroll.errors import ConfigError

import oracle

TOL = 1e-12


def _arrays(model):
    """The oracle's dict of explicit float64 arrays for a jaxroll model."""
    return {
        "lambdas": np.asarray(model.lambdas, np.float64),
        "slopes": np.asarray(model.alibi_slopes, np.float64),
        "diagonal": np.asarray(model.diagonal_scores, np.float64),
        "base": np.asarray(model.base_scores, np.float64),
        "weights": np.asarray(model.head_weights, np.float64),
        "temperature": float(model.temperature),
        "mask": model.mask,
        "window": model.window,
    }


def _random_model(seed, *, layers=6, heads=3, mask="causal", window=None, content=3.0):
    rng = np.random.default_rng(seed)
    return jaxroll.RolloutModel.create(
        num_layers=layers, num_heads=heads,
        lambdas=rng.uniform(0.05, 1.0, layers),
        alibi_slopes=rng.uniform(0.0, 1.0, (layers, heads)) * (rng.random((layers, heads)) > 0.2),
        diagonal_scores=rng.uniform(-content, content, (layers, heads)),
        base_scores=rng.normal(size=(layers, heads)),
        head_weights=rng.uniform(0.1, 1.0, (layers, heads)),
        temperature=rng.uniform(0.5, 2.0), mask=mask, window=window, sequence_length=24,
    )


@pytest.mark.parametrize("seed, mask, window", [(0, "causal", None), (1, "sliding", 5), (2, "causal", None)])
def test_diagonal_bound_collapse_against_oracle(seed, mask, window):
    model = _random_model(seed, mask=mask, window=window)
    n = 24
    product = oracle.rollout_matrix(_arrays(model), n)
    np.testing.assert_allclose(theory.diagonal(model, n), np.diag(product), rtol=0, atol=TOL)
    assert abs(float(theory.collapse_mass(model, n)) - product[:, 0].min()) < TOL
    assert abs(float(theory.total_mixing(model)) - np.asarray(model.lambdas).sum()) < TOL
    # The bound from the oracle's own kernels: prod_t (1 - lambda_t max_i (1 - A_t[i, i])).
    arrays = _arrays(model)
    deltas = [1 - np.diag(oracle.layer_kernel(arrays, t, n)).min() for t in range(model.num_layers)]
    bound = np.prod(1 - arrays["lambdas"] * np.array(deltas))
    assert abs(float(theory.diagonal_lower_bound(model, n)) - bound) < TOL
    assert np.all(np.diag(product) >= bound - TOL)  # the theorem, on the oracle's matrix
    # Row sums of P_T are 1, so P_T[i, 0] <= 1 - P_T[i, i] for i > 0.
    assert float(theory.collapse_mass(model, n)) <= 1 - np.diag(product)[1:].max() + TOL


def test_diagonal_extreme_content_stays_finite():
    # Measured content reaches +-250; +-1000 in logits must neither overflow nor give NaN.
    for content in (1000.0, -1000.0):
        model = jaxroll.RolloutModel.create(num_layers=3, num_heads=2, lambdas=0.7,
                                            alibi_slopes=[0.0, 2.0], diagonal_scores=content)
        diagonal = np.asarray(theory.diagonal(model, 16))
        assert np.all(np.isfinite(diagonal))
        # d = +1000: A[i, i] = 1 to rounding, P_T[i, i] = 1; d = -1000: A[i, i] = 0 (i > 0),
        # so P_T[i, i] = (1 - lambda)^T exactly.
        expected = 1.0 if content > 0 else 0.3**3
        np.testing.assert_allclose(diagonal[1:], expected, rtol=1e-12, atol=0)


def test_full_mask_rejected():
    model = jaxroll.RolloutModel.create(num_layers=2, num_heads=1, lambdas=0.5, mask="full")
    with pytest.raises(ConfigError, match="mask: got 'full'"):
        theory.diagonal(model, 8)


def _one_layer(seed=3, heads=4, n=20):
    rng = np.random.default_rng(seed)
    return jaxroll.RolloutModel.create(num_layers=1, num_heads=heads, lambdas=1.0,
                                       alibi_slopes=rng.uniform(0, 0.8, heads),
                                       diagonal_scores=rng.uniform(-1, 1, heads), sequence_length=n)


def test_depth_profile_against_oracle():
    kernel_model = _one_layer()
    n, depths = 20, [1, 7, 30]
    schedule = schedules.power_decay(0.9, 0.7, 30)
    result = theory.depth_profile(kernel_model, schedule, depths)
    for k, depth in enumerate(depths):
        # The oracle's model: the same kernel in every one of `depth` layers.
        model = jaxroll.RolloutModel.create(
            num_layers=depth, num_heads=4, lambdas=schedule[:depth],
            alibi_slopes=kernel_model.alibi_slopes[0], diagonal_scores=kernel_model.diagonal_scores[0])
        product = oracle.rollout_matrix(_arrays(model), n)
        np.testing.assert_allclose(result.profiles[k], product[-1], rtol=0, atol=TOL)
        np.testing.assert_allclose(result.diagonal[k], np.diag(product), rtol=0, atol=TOL)
        assert abs(float(result.collapse_mass[k]) - product[:, 0].min()) < TOL
        assert abs(float(result.total_mixing[k]) - schedule[:depth].sum()) < TOL
        assert abs(float(result.diagonal_lower_bound[k]) - float(theory.diagonal_lower_bound(model, n))) < TOL
    # A dense kernel gives the same as the model that made it.
    dense = np.asarray(jaxroll.attention_kernel(kernel_model, 0, n))
    again = theory.depth_profile(dense, schedule, depths)
    np.testing.assert_allclose(again.profiles, result.profiles, rtol=0, atol=TOL)


def test_depth_profile_long_scan_matches_numpy():
    # 10^4 layers against a NumPy loop of the same recursion (independent code).
    n, depth = 12, 10_000
    kernel = np.asarray(jaxroll.attention_kernel(_one_layer(n=n), 0, n))
    schedule = np.asarray(schedules.power_decay(1.0, 0.6, depth))
    result = theory.depth_profile(kernel, schedule, [depth])
    row = np.zeros(n)
    row[-1] = 1
    for weight in schedule:
        row = (1 - weight) * row + weight * row @ kernel
    np.testing.assert_allclose(result.profiles[0], row / row.sum(), rtol=0, atol=1e-10)
    assert abs(float(result.profiles[0].sum()) - 1) < 1e-12


def test_depth_profile_float32_sums_to_one(float32):
    with float32:
        result = theory.depth_profile(_one_layer(), schedules.power_decay(0.5, 0.5, 20_000),
                                      [10, 20_000])
        assert result.profiles.dtype == np.float32
        sums = np.asarray(result.profiles, np.float64).sum(axis=-1)
        assert np.all(np.abs(sums - 1) < 1e-6)
        assert np.all(np.isfinite(np.asarray(result.diagonal)))


@pytest.mark.parametrize("call, message", [
    (lambda k, s: theory.depth_profile(k, s, [5, 3]), "depths: got"),
    (lambda k, s: theory.depth_profile(k, s, [1, 11]), r"allowed: increasing integers in 1..10"),
    (lambda k, s: theory.depth_profile(k, s * 3, [1]), r"schedule: values outside \[0, 1\]"),
    (lambda k, s: theory.depth_profile(np.ones((4, 4)) / 4, s, [1]), "kernel: has entries above"),
    (lambda k, s: theory.depth_profile(np.eye(3)[:2], s, [1]), r"kernel: got shape \(2, 3\)"),
    (lambda k, s: theory.depth_profile(dataclasses.replace(
        k, lambdas=np.ones(2), alibi_slopes=np.ones((2, 4)), diagonal_scores=np.ones((2, 4)),
        base_scores=np.ones((2, 4)), head_weights=np.ones((2, 4))), s, [1]), "kernel: a model with 2 layers"),
])
def test_depth_profile_rejects_bad_input(call, message):
    with pytest.raises(ConfigError, match=message):
        call(_one_layer(), np.full(10, 0.5))


def _numpy_monotone(kernel, tol=1e-12):
    cdf = np.cumsum(kernel, axis=-1)
    return bool(np.all(cdf[1:] <= cdf[:-1] + tol))


def test_stochastic_monotonicity():
    for seed in range(4):
        # Any slopes and content signs: monotone (docs/design.md, "The four forces").
        model = _random_model(seed, content=8.0)
        check = theory.is_stochastically_monotone(model, n=16)
        assert check.holds
        arrays = _arrays(model)
        assert all(_numpy_monotone(oracle.layer_kernel(arrays, t, 16)) for t in range(model.num_layers))
    # Row 2 reads token 0 only while row 1 reads token 1: row 2 fails to dominate row 1 at j = 0.
    kernel = np.array([[1.0, 0, 0], [0, 1.0, 0], [1.0, 0, 0]])
    check = theory.is_stochastically_monotone(kernel)
    assert not check.holds and not _numpy_monotone(kernel)
    assert (check.row, check.next_row, check.position) == (1, 2, 0)
    assert abs(check.excess - 1.0) < TOL


def test_forces_ladder_structure():
    model = _random_model(5)
    result = theory.forces(model, 16)
    causal, residual, alibi, full = theory.ladder(model)
    assert np.all(np.asarray(causal.lambdas) == 1) and np.all(np.asarray(causal.alibi_slopes) == 0)
    assert np.all(np.asarray(causal.diagonal_scores) == 0)
    assert np.all(np.asarray(residual.lambdas) == np.asarray(model.lambdas))
    assert np.all(np.asarray(alibi.alibi_slopes) == np.asarray(model.alibi_slopes))
    assert np.all(np.asarray(alibi.diagonal_scores) == 0)
    for k, rung in enumerate((causal, residual, alibi, full)):
        np.testing.assert_allclose(result.profiles[k], oracle.influence(_arrays(rung), 16), rtol=0, atol=TOL)
    # Drifts telescope: their sum is the total change from e_{n-1} (center 1, first 0, last 1).
    positions = np.arange(16) / 15
    final = oracle.influence(_arrays(model), 16)
    assert abs(float(np.sum(result.drift_center_of_mass)) - (positions @ final - 1)) < TOL
    assert abs(float(np.sum(result.drift_first)) - final[:2].sum()) < TOL
    assert abs(float(np.sum(result.drift_last)) - (final[-2:].sum() - 1)) < TOL
