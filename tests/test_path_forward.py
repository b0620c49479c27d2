"""The forward route of the ``paths`` statistic (jaxroll.measure.path_forward) against the backward route and autograd.

The backward route (`path_stats.measure_paths` in its exact mode, D = 8
basis vectors) differentiates each block by backward passes, with the
paths separated by detaching the values; the forward route forms the same
norms from closed forms without any backward pass. They must agree to
float64 rounding on every family the forward route serves (grouped keys,
partial rotary, biases, a sliding window shorter than N, ALiBi). For the
families that tests/path_oracle.py writes out by hand, the forward route is
also compared with full ``torch.autograd.functional.jacobian`` matrices
(the paths separated by hand), formed here.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402

from jaxroll.measure import measure  # noqa: E402
from jaxroll.measure.layer_maps import resolve  # noqa: E402
from jaxroll.measure.path_forward import FORWARD_FAMILIES, forward_paths, unsupported  # noqa: E402
from jaxroll.measure.path_stats import measure_paths  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

import path_oracle  # noqa: E402  (tests/path_oracle.py)

VOCAB, HEADS, HIDDEN, LENGTH, SEQUENCES = 64, 2, 8, 7, 3


def _config(family):
    return path_oracle.tiny_config(family, heads=HEADS, hidden=HIDDEN, vocab=VOCAB)


def tiny(family, implementation="eager", seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=implementation)
    with torch.no_grad():  # larger random weights (and biases), so that every path is well away from zero
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
            elif name.endswith("bias"):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return model.double().eval()


def ids(seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (SEQUENCES, LENGTH))


@pytest.mark.parametrize("family", FORWARD_FAMILIES)
def test_the_forward_route_equals_the_backward_route_in_its_exact_mode(family):
    model, token_ids = tiny(family), ids(1)
    assert unsupported(model, resolve(model)) is None
    forward = forward_paths(model, token_ids)
    backward = measure_paths(model, token_ids, projections=None)["per_sequence"]  # D = 8 basis vectors: exact
    assert backward[:, 1:3].min() > 1e-4  # both attention paths move something
    np.testing.assert_allclose(forward[:, :3], backward[:, :3], rtol=1e-8, atol=1e-14)
    assert np.isnan(forward[:, 3]).all()  # no MLP path on this route


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_the_forward_route_equals_autograd_jacobians_separated_by_hand(family):
    model, token_ids = tiny(family), ids(2)
    forward = forward_paths(model, token_ids)
    with full_precision(model):
        for layer, (args, kwargs, h0) in enumerate(path_oracle.block_calls(model, family, token_ids)):
            block = path_oracle.blocks(model, family)[layer]
            for column, mode in ((1, "value"), (2, "probability")):
                def attention(h):
                    return path_oracle.attention_and_output(block, family, args, kwargs, h, mode, HEADS,
                                                            HIDDEN)[0][:, -1]
                full = torch.autograd.functional.jacobian(attention, h0)  # (S, D, S, N, D)
                own = np.stack([full[s, :, s].numpy() for s in range(h0.shape[0])])  # (S, D, N, D)
                sums = np.sqrt((own ** 2).sum(axis=(1, 3))).sum(-1)  # float64 NumPy: sum_j ||J(N-1, j)||_F
                np.testing.assert_allclose(forward[:, column, layer], sums, rtol=1e-8)
    np.testing.assert_allclose(forward[:, 0], math.sqrt(HIDDEN))


@pytest.mark.parametrize("batch_size", [1, 2])
def test_measure_runs_it_in_the_pass_on_every_sequence_eager_and_sdpa_alike(batch_size):
    token_ids = ids(3)
    reference = forward_paths(tiny("llama"), token_ids)
    for implementation in ("eager", "sdpa"):
        result = measure(tiny("llama", implementation), token_ids, stats=("lambda", "influence", "paths"),
                         batch_size=batch_size)  # influence: checkpointed blocks replay, and must not count twice
        assert result.metadata["paths"]["route"] == "forward" and result.metadata["paths"]["samples"] == SEQUENCES
        np.testing.assert_allclose(result.extra["path_per_sequence"][:, :3], reference[:, :3], rtol=1e-10)
        means = reference[:, :3].mean(0)
        np.testing.assert_allclose(result.extra["probability_over_value"], means[2] / means[1], rtol=1e-10)


def test_an_intervention_or_another_family_takes_the_backward_route():
    from jaxroll.interventions import parse
    from jaxroll.measure.patching import patch

    model = tiny("llama")
    resolved = resolve(model)
    assert unsupported(model, resolved, patch(model, parse("tau=1.5"), resolved)) is not None
    result = measure(model, ids(4), stats=("lambda", "paths"), interventions=parse("tau=1.5"))
    assert result.metadata["paths"]["route"] == "backward"
    assert np.isfinite(result.extra["path_mlp"]).all()  # the backward route gives the MLP path


def test_the_chunk_of_keys_does_not_change_the_sums(monkeypatch):
    from jaxroll.measure import path_forward

    model, token_ids = tiny("gpt_neox"), ids(5)
    whole = forward_paths(model, token_ids)
    monkeypatch.setattr(path_forward, "CHUNK_BYTES", 1)  # one key per chunk
    np.testing.assert_allclose(forward_paths(model, token_ids)[:, :3], whole[:, :3], rtol=1e-12)


def test_block_sums_project_the_normed_input_as_the_model_does():
    from jaxroll.measure.path_forward import ForwardPaths, block_sums

    model = tiny("qwen2")  # biases on q, k, v
    resolved = resolve(model)
    paths = ForwardPaths(model, resolved, LENGTH)
    found = []
    handles = paths.hooks(lambda layer, sums: found.append((layer, sums)))
    calls = {}
    def keep(module, args, kwargs):  # returns None: the call goes on unchanged
        calls.setdefault("x", (args[0] if args else kwargs["hidden_states"], kwargs))
    handles.append(resolved.blocks[0].register_forward_pre_hook(keep, with_kwargs=True))
    try:
        with torch.no_grad(), full_precision(model):  # the model's norm in float64, as the pass runs it
            model(input_ids=torch.as_tensor(ids(6)), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    x, kwargs = calls["x"]
    own = block_sums(paths.layers[0], x, heads=HEADS, scale=paths.scale, rotary=kwargs["position_embeddings"])
    np.testing.assert_allclose(own.numpy(), dict(found)[0].numpy(), rtol=1e-12)
