"""The ``paths`` statistic (jaxroll.measure.path_stats) against autograd with the paths separated by hand.

The oracle is tests/test_paths.py's, copied here: full Jacobians of the
block's output at the last query with respect to the block's input
(``torch.autograd.functional.jacobian``, float64), the probabilities
detached by replacing ``torch.nn.functional.softmax`` for the block call and
the values by a per-family hook written out below; the statistic's per-layer
sums over keys of their Frobenius norms are then formed here in NumPy. The
hidden width D = 8 is at most the statistic's R = 8 projections, so the
default route is exact and comparable to 1e-8.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402

from jaxroll import ConfigError  # noqa: E402
from jaxroll.measure import measure, read_measurement, write_measurement  # noqa: E402
from jaxroll.measure import path_stats  # noqa: E402
from jaxroll.measure.path_stats import (branch_share, measure_paths, path_ingredients, path_outputs,  # noqa: E402
                                        probability_over_value)
from jaxroll.measure.precision import full_precision  # noqa: E402

import path_oracle  # noqa: E402  (tests/path_oracle.py)

VOCAB, HEADS, HIDDEN, LENGTH, SEQUENCES = 64, 2, 8, 6, 3


def _config(family):
    return path_oracle.tiny_config(family, heads=HEADS, hidden=HIDDEN, vocab=VOCAB)


def tiny(family, implementation="eager", seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=implementation)
    with torch.no_grad():  # larger random weights, so that every path is well away from zero
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
    return model.double().eval()


def ids(seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (SEQUENCES, LENGTH))


def _oracle_sums(model, family, token_ids):
    """``(S, 4, L)``: per sequence, path (identity, value, probability, mlp) and layer, sum_j ||J(N-1, j)||_F."""
    with full_precision(model):
        sums = []
        for layer, (args, kwargs, h0) in enumerate(path_oracle.block_calls(model, family, token_ids)):
            block = path_oracle.blocks(model, family)[layer]

            def attention(h, mode):
                return path_oracle.attention_and_output(block, family, args, kwargs, h, mode, HEADS, HIDDEN)

            functions = [lambda h: attention(h, "value")[0][:, -1],
                         lambda h: attention(h, "probability")[0][:, -1],
                         lambda h: (lambda a, out: (out - h - a)[:, -1])(*attention(h, "full"))]
            layer_sums = [np.full(h0.shape[0], math.sqrt(HIDDEN))]
            for function in functions:
                full = torch.autograd.functional.jacobian(function, h0)  # (S, D, S, N, D)
                own = torch.stack([full[s, :, s] for s in range(h0.shape[0])])  # (S, D, N, D)
                layer_sums.append(own.pow(2).sum((1, 3)).sqrt().sum(-1).numpy())
            sums.append(np.stack(layer_sums, axis=1))  # (S, 4)
    return np.stack(sums, axis=2)


@pytest.mark.parametrize("family", ["bloom", "llama", "gpt2"])
def test_the_statistic_equals_sums_of_autograd_paths_separated_by_hand(family):
    model, token_ids = tiny(family), ids()
    result = measure(model, token_ids, stats=("lambda", "paths"), batch_size=2)
    oracle = _oracle_sums(model, family, token_ids)  # all S = 3 sequences
    assert result.metadata["paths"]["projections"] is None and result.metadata["paths"]["route"] == "forward"
    # The forward route (in the pass) gives identity, value and probability; the MLP path the backward route.
    np.testing.assert_allclose(result.extra["path_per_sequence"][:, :3], oracle[:, :3], rtol=1e-8, atol=1e-12)
    assert np.isnan(result.extra["path_per_sequence"][:, 3]).all() and np.isnan(result.extra["path_mlp"]).all()
    backward = measure_paths(model, token_ids, projections=None)  # D = 8 <= R: exact
    assert backward["record"]["route"] == "backward"
    np.testing.assert_allclose(backward["per_sequence"], oracle, rtol=1e-8, atol=1e-12)
    assert oracle[:, 1:].min() > 1e-3  # every path moves something
    for index, name in enumerate(("identity", "value", "probability")):
        np.testing.assert_allclose(result.extra[f"path_{name}"], oracle[:, index].mean(0), rtol=1e-8)
        np.testing.assert_allclose(result.extra[f"path_{name}_std"], oracle[:, index].std(0), rtol=1e-7,
                                   atol=1e-12)
    means = oracle.mean(0)
    np.testing.assert_allclose(result.extra["probability_over_value"], means[2] / means[1], rtol=1e-8)
    np.testing.assert_allclose(result.extra["branch_share"], (means[1] + means[2]) / means[:3].sum(0), rtol=1e-8)


def test_only_the_first_samples_are_measured_and_the_estimate_is_seeded():
    model, token_ids = tiny("llama"), ids(1)
    first = measure_paths(model, token_ids, samples=2, projections=None)["per_sequence"]
    np.testing.assert_allclose(first, _oracle_sums(model, "llama", token_ids[:2]), rtol=1e-8)
    estimate = measure_paths(model, token_ids, samples=2, projections=4, seed=5)
    assert estimate["record"]["projections"] == 4 and estimate["record"]["relative_standard_error"] == math.sqrt(0.5)
    again = measure_paths(model, token_ids, samples=2, projections=4, seed=5)["per_sequence"]
    np.testing.assert_array_equal(estimate["per_sequence"], again)
    assert not np.allclose(estimate["per_sequence"][:, 1:], first[:, 1:], rtol=1e-6)  # an estimate, not exact


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_sdpa_model_gives_the_eager_paths_through_measure_and_stays_sdpa(family):
    token_ids = ids(2)
    eager = measure_paths(tiny(family), token_ids, projections=None)["per_sequence"]
    model = tiny(family, "sdpa")
    assert model.config._attn_implementation == "sdpa"
    result = measure(model, token_ids, stats=("lambda", "paths"))
    np.testing.assert_allclose(result.extra["path_per_sequence"][:, :3], eager[:, :3], rtol=1e-10)
    assert model.config._attn_implementation == "sdpa"


def test_falcon_alibi_once_on_the_eager_view_equals_its_sdpa_path():
    token_ids = ids(3)
    with_eager = measure_paths(tiny("falcon", "eager"), token_ids, projections=None)["per_sequence"]
    with_sdpa = measure_paths(tiny("falcon", "sdpa"), token_ids, projections=None)["per_sequence"]
    np.testing.assert_allclose(with_sdpa, with_eager, rtol=1e-10)  # both: the bias once
    doubled = measure_paths(tiny("falcon", "eager"), token_ids, projections=None, falcon_alibi="doubled")
    assert not np.allclose(doubled["per_sequence"][:, 2], with_eager[:, 2], rtol=1e-6)


def test_the_run_interventions_apply_a_branch_scale_halves_both_attention_paths_at_the_first_layer():
    from jaxroll.interventions import parse

    model, token_ids = tiny("llama"), ids(4)
    plain = measure(model, token_ids, stats=("lambda", "paths")).extra["path_per_sequence"]
    halved = measure(model, token_ids, stats=("lambda", "paths"),
                     interventions=parse("gamma=0.5")).extra["path_per_sequence"]
    np.testing.assert_allclose(halved[:, 1:3, 0], 0.5 * plain[:, 1:3, 0], rtol=1e-10)


def test_ratio_share_and_spreads_against_their_definitions_on_hand_made_arrays():
    rng = np.random.default_rng(0)
    per_sequence = rng.uniform(0.1, 3.0, (5, 4, 3))
    per_sequence[:, 0] = 4.0
    out = path_outputs(per_sequence)
    identity, value, probability = 4.0, per_sequence[:, 1].mean(0), per_sequence[:, 2].mean(0)
    np.testing.assert_allclose(out["probability_over_value"], probability / value, rtol=1e-14)
    np.testing.assert_allclose(out["branch_share"], (value + probability) / (identity + value + probability),
                               rtol=1e-14)
    ratios = per_sequence[:, 2] / per_sequence[:, 1]
    np.testing.assert_allclose(out["probability_over_value_std"], np.sqrt(((ratios - ratios.mean(0)) ** 2).mean(0)))
    shares = (per_sequence[:, 1] + per_sequence[:, 2]) / per_sequence[:, :3].sum(1)
    np.testing.assert_allclose(out["branch_share_std"], np.sqrt(((shares - shares.mean(0)) ** 2).mean(0)))
    np.testing.assert_allclose(out["path_mlp_std"], per_sequence[:, 3].std(0))
    # no attention: share 0 and r undefined; no identity: share 1
    assert branch_share(4.0, 0.0, 0.0) == 0.0 and branch_share(0.0, 1.0, 2.0) == 1.0
    assert np.isnan(probability_over_value(1.0, 0.0)) and probability_over_value(1.0, 4.0) == 0.25


def test_path_ingredients_reads_a_measurement_and_its_folder(tmp_path):
    model, token_ids = tiny("gpt2"), ids(5)
    result = measure(model, token_ids, stats=("lambda", "paths"))
    (tmp_path / "out").mkdir()
    write_measurement(result, tmp_path / "out")
    for source in (result, tmp_path / "out", read_measurement(tmp_path / "out")):
        ingredients = path_ingredients(source)
        np.testing.assert_array_equal(ingredients["r"], result.extra["probability_over_value"])
        np.testing.assert_array_equal(ingredients["branch_share"], result.extra["branch_share"])
        np.testing.assert_array_equal(ingredients["lambda"], result.lambdas)
    assert "paths: per layer r_t" in path_stats._summary(result.extra)


def test_refusals_are_one_line():
    model = tiny("gpt2")
    cases = [(lambda: measure_paths(model, ids(), samples=0), "path_samples"),
             (lambda: measure_paths(model, ids()[0]), "token_ids"),
             (lambda: measure_paths(model, ids(), projections=0), "path_projections"),
             (lambda: measure_paths(model, ids(), projections="8"), "path_projections"),
             (lambda: path_ingredients({"lambdas": np.ones(2)}), "paths"),
             (lambda: path_outputs(np.ones((2, 3, 2))), "path_per_sequence")]
    for call, word in cases:
        with pytest.raises(ConfigError, match=word) as caught:
            call()
        assert "\n" not in str(caught.value)
