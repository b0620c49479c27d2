"""validation/interventions.py's issue-53 pieces: today's layer beside the extended one, and the targets' verdicts.

- `today_models` drops the probability path: its influence is the NumPy
  float64 rollout ``e_{N-1}^T R_T ... R_1`` with ``R_t = (1 - lambda_t) I +
  lambda_t A_t`` written here, and the extended model at its measured
  setting (logit gains 1) gives the same profile (docs/design.md, "The
  probability path"), while a temperature moves the two apart;
- `target_a` and `target_middle` give the issue's verdicts on rows written
  by hand (thresholds 3x, 2x, 1.25x and the interval's sign).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import validation_scripts  # tests/validation_scripts.py

pytest.importorskip("torch")
pytest.importorskip("transformers")

import jaxroll  # noqa: E402
from jaxroll import interventions as jinterventions  # noqa: E402
from jaxroll.kernel_types import DenseKernel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def loop():
    sys.path.insert(0, str(ROOT / "validation"))
    return validation_scripts.load("interventions")


def _kernels(layers, n, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(layers, n, n))
    logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    kernels = np.exp(logits - logits.max(-1, keepdims=True))
    return kernels / kernels.sum(-1, keepdims=True)


def test_today_is_the_plain_rollout_and_the_extended_layer_equals_it_unchanged(loop):
    import jax

    jax.config.update("jax_enable_x64", True)
    layers, n = 3, 7
    kernels, lambdas = _kernels(layers, n, 0), np.array([0.2, 0.35, 0.5])
    plain = jaxroll.RolloutModel.create(kernel=DenseKernel.create(kernels), lambdas=lambdas, sequence_length=n)
    extended = jaxroll.model.with_probability_path(plain, np.array([0.4, 0.5, 0.3]))
    today = loop.today_models({"m": extended})["m"]
    product = np.eye(n)
    for t in range(layers):  # P = R_T ... R_1, the last row the influence on the last position
        product = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * kernels[t]) @ product
    oracle = product[-1] / product[-1].sum()
    np.testing.assert_allclose(np.asarray(jaxroll.influence(today)), oracle, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(extended)), oracle, rtol=0, atol=1e-12)
    tau = jinterventions.parse("tau=1.5")
    moved = np.asarray(jaxroll.influence(jinterventions.apply_all(extended, tau)))
    kept = np.asarray(jaxroll.influence(jinterventions.apply_all(today, tau)))
    assert np.max(np.abs(moved - kept)) > 1e-4  # the probability path answers a temperature; today's does not


def _row(**values):
    row = {"intervention": "tau=0.7", "effect_ratio": 5.0, "unchanged_ratio": 3.0, "extended_ratio": 1.9,
           "middle_measured": 0.02, "middle_measured_interval": [0.01, 0.03], "middle_extended": 0.018}
    return row | values


def test_target_a_needs_within_2x_and_closer_than_unchanged(loop):
    assert loop.target_a(_row(effect_ratio=2.9)) is None
    assert loop.target_a(_row()) == "met"
    assert loop.target_a(_row(unchanged_ratio=1.8)) == "missed"
    assert loop.target_a(_row(extended_ratio=2.1, unchanged_ratio=9.0)) == "missed"


def test_target_middle_sign_and_size(loop):
    assert loop.target_middle(_row()) == "met (sign)"
    assert loop.target_middle(_row(middle_extended=-0.01)) == "missed (sign)"
    assert loop.target_middle(_row(middle_measured_interval=[-0.01, 0.03])) == "not significant"
    size = _row(intervention="gamma=2", middle_measured=0.1, middle_measured_interval=[0.08, 0.12])
    assert loop.target_middle(size | {"middle_extended": 0.124}) == "met (1.24x)"
    assert loop.target_middle(size | {"middle_extended": 0.126}).startswith("missed")
    assert loop.target_middle(size | {"middle_extended": 0.079}).startswith("missed")
    assert loop.target_middle(_row(intervention="sinks=4")) is None
