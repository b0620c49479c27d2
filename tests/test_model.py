"""Schedules, ALiBi slopes, presets and the keyword constructor."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import jaxroll
from jaxroll import ConfigError, schedules

import oracle
from conftest import REFERENCE_CONFIGS


def test_power_decay_closed_form_and_clipping():
    t = np.arange(6)
    np.testing.assert_allclose(schedules.power_decay(0.35, 1.3, 6), 0.35 / (t + 1.0) ** 1.3, rtol=1e-15)
    np.testing.assert_array_equal(schedules.power_decay(1.0, 0.5, 3)[0], 1.0)
    np.testing.assert_array_equal(schedules.constant(1.7, 2), [1.0, 1.0])  # computed: clipped
    np.testing.assert_array_equal(schedules.constant(-0.5, 2), [0.0, 0.0])


@pytest.mark.parametrize("call, message", [
    (lambda: schedules.custom([0.2, 1.2]), r"lambdas_custom.*1\.2.*\[0, 1\]"),
    (lambda: schedules.custom([]), "non-empty"),
    (lambda: schedules.power_decay(0.0, 1.0, 3), r"lambda_0.*\(0, inf\)"),
    (lambda: schedules.power_decay(0.5, -0.5, 3), r"beta.*-0\.5.*\[0, inf\)"),
    (lambda: schedules.constant(float("nan"), 3), "finite"),
    (lambda: schedules.constant(0.5, 0), r"num_layers.*>= 1"),
])
def test_schedule_errors(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_alibi_slopes_power_of_two_closed_form():
    for heads in (1, 2, 8, 32, 64):
        np.testing.assert_allclose(jaxroll.alibi_slopes(heads),
                                   2.0 ** (-8.0 * np.arange(1, heads + 1) / heads), rtol=1e-15)


@pytest.mark.parametrize("heads", [112, 12, 6, 64])
def test_alibi_slopes_match_bloom_build_alibi_tensor(heads):
    """The model's own slope builder (transformers' BLOOM) is the oracle.

    transformers computes the slopes in float32, hence rtol 1e-6 (float32
    epsilon 1.2e-7 over a power and a product)."""
    torch = pytest.importorskip("torch")
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    attention_mask = torch.ones(1, 2)
    alibi = bloom.build_alibi_tensor(attention_mask, heads, dtype=torch.float64)
    slopes = alibi.reshape(heads, 2)[:, 1].numpy()  # position 1 carries the slope
    np.testing.assert_allclose(jaxroll.alibi_slopes(heads), slopes, rtol=1e-6)


def test_bloom_176b_file_slopes_differ_from_the_models_rule():
    """docs/design.md, "Where jaxroll differs from the authors' code": the published BLOOM-176B files
    use 2^(-8(h+1)/112), not BLOOM's rule."""
    model = jaxroll.load_config(REFERENCE_CONFIGS / "rollout/alibi/no_content/bloom.yaml")
    np.testing.assert_allclose(model.alibi_slopes[0], 2.0 ** (-8.0 * np.arange(1, 113) / 112), rtol=1e-12)
    assert np.abs(model.alibi_slopes[0] - jaxroll.alibi_slopes(112)).max() > 0.01


def test_create_broadcasts_like_the_schema():
    model = jaxroll.RolloutModel.create(num_layers=3, num_heads=2, lambdas=0.5,
                                        alibi_slopes=[0.1, 0.2], diagonal_scores=[[1.0], [2.0], [3.0]])
    np.testing.assert_array_equal(model.lambdas, [0.5] * 3)
    np.testing.assert_array_equal(model.alibi_slopes, [[0.1, 0.2]] * 3)
    np.testing.assert_array_equal(model.diagonal_scores, [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    np.testing.assert_array_equal(model.head_weights, np.full((3, 2), 0.5))
    assert (model.num_layers, model.num_heads, model.mask) == (3, 2, "causal")


@pytest.mark.parametrize("kwargs, message", [
    ({"lambdas": [0.5, 0.5]}, r"lambdas: got length 2; allowed: one value per layer \(num_layers = 3\)"),
    ({"lambdas": 1.5}, r"lambdas.*1\.5.*\[0, 1\]"),
    ({"lambdas": 0.5, "alibi_slopes": -1.0}, r"alibi_slopes.*-1\.0"),
    ({"lambdas": 0.5, "temperature": 0.0}, "temperature"),
    ({"lambdas": 0.5, "mask": "sliding"}, "window"),
    ({"lambdas": 0.5, "mask": "sliding", "window": -2}, r"window.*>= 1"),
    ({"lambdas": 0.5, "mask": "diagonal"}, "mask: got 'diagonal'"),
    ({"lambdas": 0.5, "head_weights": [0.0, 0.0]}, "all-zero"),
    ({"lambdas": 0.5, "diagonal_scores": [1.0, 2.0, 3.0]}, r"inner list length 3.*num_heads \(2\)"),
    ({"lambdas": 0.5, "sequence_length": 0}, "sequence_length"),
    ({"lambdas": "half"}, r"lambdas: got a string \(.half.\); allowed: numbers"),
])
def test_create_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as error:
        jaxroll.RolloutModel.create(num_layers=3, num_heads=2, **kwargs)
    assert "\n" not in str(error.value)


def _derive_presets():
    path = Path(__file__).resolve().parents[1] / "scripts" / "derive_presets.py"
    spec = importlib.util.spec_from_file_location("derive_presets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", jaxroll.presets.names())
def test_presets_follow_the_documented_derivation(name):
    """The stored lambda_0, beta are the fit of scripts/derive_presets.py (to 4 digits),
    and the preset keeps the measured total mixing sum_t lambda_t within 0.1 %."""
    geometry = jaxroll.presets.GEOMETRIES[name]
    path = REFERENCE_CONFIGS / "rollout/alibi/no_content" / geometry.reference_file
    config = oracle.read_config(path)
    measured = np.asarray(config["lambda_schedule_config"]["lambdas_custom"])
    lambda_0, beta, _ = _derive_presets().fit_power_decay(measured)
    assert abs(lambda_0 - geometry.lambda_0) < 1e-4 and abs(beta - geometry.beta) < 1e-4
    model = jaxroll.presets.get(name)
    assert (model.num_layers, model.num_heads) == (config["num_layers"], config["attention_config"]["num_heads"])
    assert model.sequence_length == 256
    assert abs(model.lambdas.sum() / measured.sum() - 1) < 1e-3
    np.testing.assert_array_equal(model.alibi_slopes[0], jaxroll.alibi_slopes(model.num_heads))


def test_unknown_preset():
    with pytest.raises(ConfigError, match="preset: got 'gpt-5'; allowed: one of bloom-176b"):
        jaxroll.presets.get("gpt-5")
