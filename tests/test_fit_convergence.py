"""How `jaxroll.fit` stops (issue 20): `steps` is a maximum, and `FitResult`
says whether the fit converged, why it stopped and after how many steps.

Oracles: the plain NumPy float64 rollout (tests/oracle.py) and scipy's
bounded scalar minimiser on the NumPy loss; closed forms for the reasons.
Every fit here is small (T = 6, H = 4, n = 16) so that each compiles in
seconds.
"""

import sys
from pathlib import Path

import numpy as np
import optax
import pytest
import scipy.optimize

import jaxroll
from jaxroll import schedules
from jaxroll.errors import ConfigError
from jaxroll.fitting import LBFGS_MAX_PARAMETERS, PATIENCE

sys.path.insert(0, str(Path(__file__).parent))
import oracle  # noqa: E402

T, H, N = 6, 4, 16


def model_of(lambdas):
    return jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=lambdas, diagonal_scores=0.5,
                                       sequence_length=N)


def profile_of(lambdas):
    model = model_of(lambdas)
    arrays = {"lambdas": np.asarray(model.lambdas, dtype=np.float64),
              "slopes": np.asarray(model.alibi_slopes, dtype=np.float64),
              "diagonal": np.asarray(model.diagonal_scores, dtype=np.float64),
              "base": np.asarray(model.base_scores, dtype=np.float64),
              "weights": np.asarray(model.head_weights, dtype=np.float64),
              "temperature": 1.0, "mask": "causal", "window": None}
    return oracle.influence(arrays, N)


# A target no constant schedule reproduces: a smooth (l2) minimum with loss > 0.
TARGET = profile_of(schedules.power_decay(0.8, 1.0, T))


def test_a_smooth_minimum_stops_on_the_gradient_test_at_the_oracle_minimiser():
    """Constant schedule, l2 loss: one parameter, default L-BFGS. The fit stops
    by the gradient test (not the step limit), long before 2000 steps, at the
    minimiser of the NumPy l2 loss (scipy's bounded Brent to xatol 1e-12;
    agreement to 1e-6 in lambda: the loss is quadratic there, so a gradient
    of 1e-8 in the logit moves the minimiser by ~1e-8 / curvature)."""
    result = jaxroll.fit(model_of(0.2), TARGET, schedule="constant", loss="l2")
    assert result.converged and result.optimizer == "lbfgs"
    assert result.stop_reason.startswith("converged: gradient norm"), result.stop_reason
    assert f"after {result.steps} steps" in result.stop_reason
    assert 1 <= result.steps < 200 and result.losses.shape == (result.steps + 1,)

    def numpy_loss(value):
        return float(np.sum((profile_of(value) - TARGET) ** 2))

    best = scipy.optimize.minimize_scalar(numpy_loss, bounds=(0.01, 0.99), method="bounded",
                                          options={"xatol": 1e-12})
    assert result.schedule_parameters["lambda_const"] == pytest.approx(best.x, abs=1e-6)
    assert result.final_loss == pytest.approx(best.fun, rel=1e-8)


def test_an_exact_target_stops_at_the_floor_and_skips_the_other_restarts():
    """The truth is in the model class: the smooth l2 loss falls quadratically
    to 10 eps (2.2e-15 in float64) from the best design point (the first
    restart), and the restarts after it are skipped (loss inf). (With W1 a
    restart may instead stop as stationary at ~1e-11, at the kink.)"""
    target = profile_of(0.7)
    result = jaxroll.fit(model_of(0.2), target, schedule="constant", loss="l2", restarts=3)
    assert result.converged and "reached the floor 2.2e-15" in result.stop_reason
    assert result.final_loss <= 2.3e-15
    # l2 <= 2.2e-15 bounds ||p - q||_2 by 5e-8; ||dp/dlambda||_2 is O(0.1) here,
    # so lambda is pinned to ~1e-6: 1e-5 leaves a margin.
    assert result.schedule_parameters["lambda_const"] == pytest.approx(0.7, abs=1e-5)
    losses = result.restart_losses
    assert losses.shape == (3,) and losses[0] <= 2.3e-15 and np.all(np.isinf(losses[1:]))


def test_the_step_limit_is_reported_as_not_converged():
    """Adam (12 free parameters: above LBFGS_MAX_PARAMETERS) stopped after 3
    steps: not converged, the reason names the limit, 4 losses (u_0 .. u_3),
    the first the oracle's W1 of the start (u_0 is the model itself)."""
    assert 2 * T > LBFGS_MAX_PARAMETERS
    result = jaxroll.fit(model_of(0.2), TARGET, fit="lambdas,diagonal_scores", steps=3)
    assert not result.converged and result.optimizer == "adam"
    assert result.stop_reason.startswith("not converged: stopped at the step limit 3")
    assert result.steps == 3 and result.max_steps == 3 and result.losses.shape == (4,)
    w1 = np.abs(np.cumsum(profile_of(0.2) - TARGET)[:-1]).sum() / (N - 1)
    assert result.losses[0] == pytest.approx(w1, rel=1e-10)


def test_tolerances_can_be_raised_and_a_stationary_loss_stops():
    """Loose tolerances stop a fit earlier than the defaults; a loss tolerance of
    1 makes every step quiet, so the fit stops as stationary after exactly
    PATIENCE steps (the relative change is at most 1 for positive losses;
    step 0 has none)."""
    default = jaxroll.fit(model_of(0.2), TARGET, schedule="constant", loss="l2")
    loose = jaxroll.fit(model_of(0.2), TARGET, schedule="constant", loss="l2", gradient_tolerance=1e-3,
                        loss_tolerance=1e-3)
    assert loose.converged and loose.steps < default.steps
    quiet = jaxroll.fit(model_of(0.2), TARGET, fit="lambdas,diagonal_scores", loss_tolerance=1.0)
    assert quiet.converged and "for 10 steps in a row" in quiet.stop_reason and quiet.steps == PATIENCE


def test_any_optax_transformation_can_be_passed():
    result = jaxroll.fit(model_of(0.2), TARGET, schedule="constant", loss="l2",
                         optimizer=optax.sgd(0.5), steps=30)
    assert result.optimizer == "custom" and result.restart_losses.shape == (1,)
    assert result.final_loss < result.initial_loss and result.steps <= 30


@pytest.mark.parametrize("field,value", [("gradient_tolerance", -1.0), ("loss_tolerance", float("nan")),
                                         ("gradient_tolerance", "small")])
def test_bad_tolerances_are_one_line_errors(field, value):
    with pytest.raises(ConfigError, match=f"{field}: got .*; allowed: a finite number >= 0") as info:
        jaxroll.fit(model_of(0.2), TARGET, **{field: value})
    assert "\n" not in str(info.value)


def test_schedule_config_round_trips_through_save_config(tmp_path):
    """A power-decay fit's schedule_config is what save_config writes and
    load_config reads back to the same lambdas, bit for bit; a schedule that
    does not give the lambdas is refused."""
    result = jaxroll.fit(model_of(0.2), TARGET, schedule="power_decay", steps=5, search=0, restarts=1)
    config = result.schedule_config
    assert config["schedule_type"] == "power_decay" and set(config) == {"schedule_type", "lambda_0", "beta"}
    path = jaxroll.save_config(result.model, tmp_path / "fitted.yaml", schedule=config)
    assert "power_decay" in path.read_text()
    np.testing.assert_array_equal(jaxroll.load_config(path).lambdas, result.model.lambdas)
    with pytest.raises(ConfigError, match="does not give the model's lambdas"):
        jaxroll.save_config(result.model, tmp_path / "bad.yaml", schedule={"schedule_type": "constant",
                                                                           "lambda_const": 0.5})


def test_a_degenerate_fit_is_not_reported_converged():
    """Issue 46: the target is the attention-only profile of a 12-layer model,
    which no 6-layer power-decay schedule reaches: the fit drives every lambda
    to its upper bound (lambda_0 -> 1, beta -> 0), where the loss is flat,
    and the stopping test passes there. That is not a minimum inside the
    model's range: not converged, with one warning line that says so."""
    deeper = jaxroll.RolloutModel.create(num_layers=2 * T, num_heads=H, lambdas=1.0, diagonal_scores=0.5,
                                         sequence_length=N)
    target = np.asarray(jaxroll.influence(deeper), np.float64)
    result = jaxroll.fit(model_of(0.3), target, schedule="power_decay")
    lambdas = np.asarray(result.model.lambdas)
    assert np.sum((lambdas >= 1 - 1e-5) | (lambdas <= 1e-5)) >= T - 1  # the case is what it claims to be
    assert not result.converged
    assert result.stop_reason.startswith("not converged: the fit is degenerate"), result.stop_reason
    assert len(result.warnings) == 1 and "\n" not in result.warnings[0]
    assert result.warnings[0].startswith("warning: the fit is degenerate: 6 of 6 lambdas ended at a bound")


def test_a_fit_that_ends_worse_than_its_start_is_not_reported_converged():
    """The start reproduces the target exactly (loss 0) with alternating
    lambdas that no power-decay schedule represents: the power-decay fit ends
    worse than its start, which it says instead of "converged"."""
    alternating = np.array([0.9, 0.1, 0.9, 0.1, 0.9, 0.1])
    result = jaxroll.fit(model_of(alternating), profile_of(alternating), schedule="power_decay")
    assert result.final_loss > result.initial_loss
    assert not result.converged and result.stop_reason.startswith("not converged: the fit ended worse than its start")
    assert [w for w in result.warnings if "worse than its start" in w]


def test_restart_steps_hold_the_returned_restarts_count():
    result = jaxroll.fit(model_of(0.2), TARGET, schedule="constant", loss="l2")
    assert result.restart_steps.shape == result.restart_losses.shape
    assert result.steps == result.restart_steps[int(np.argmin(result.restart_losses))]
