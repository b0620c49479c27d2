"""jaxroll.measure.paths against torch.autograd.functional.jacobian with the paths separated by hand.

Both run with `jaxroll.measure.precision.full_precision` (float64 end to end).
The oracle here is independent of the library's patches: it detaches the
probabilities by replacing ``torch.nn.functional.softmax`` for the whole
block call (the tiny blocks have no other softmax), and the values by a
per-family hook written out below (Llama's ``v_proj``; BLOOM's, GPT-NeoX's
and GPT-2's fused projections split by hand), then takes full Jacobians of the block's
output at the query with respect to the block's input, in float64.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402

from jaxroll import ConfigError  # noqa: E402
from jaxroll.measure.paths import layer_paths  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

import path_oracle  # noqa: E402  (tests/path_oracle.py)

VOCAB, HEADS, HIDDEN, LENGTH, SEQUENCES = 64, 4, 16, 6, 2


def _config(family):
    return path_oracle.tiny_config(family, heads=HEADS, hidden=HIDDEN, vocab=VOCAB, key_value_heads=HEADS // 2)


def tiny(family, seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    with torch.no_grad():  # larger random weights, so that every path is well away from zero
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
    return model.double().eval()


def ids(seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (SEQUENCES, LENGTH))


def _jacobians(model, family, token_ids, query):
    """Per layer: {path: (S, N, D, D) Jacobian of the path's output at `query` w.r.t. the block input}."""
    # transformers computes some softmaxes and rotary tables in float32 even in a float64 model: the
    # precondition of a float64 comparison, not a path separation, so the project's switch is used as is
    with full_precision(model):
        return _jacobians_float64(model, family, token_ids, query)


def _jacobians_float64(model, family, token_ids, query):
    result = []
    for layer, (args, kwargs, h0) in enumerate(path_oracle.block_calls(model, family, token_ids)):
        block = path_oracle.blocks(model, family)[layer]

        def attention_at_query(h, mode):
            return path_oracle.attention_and_output(block, family, args, kwargs, h, mode, HEADS, HIDDEN)

        functions = {
            "value": lambda h: attention_at_query(h, "value")[0][:, query],
            "probability": lambda h: attention_at_query(h, "probability")[0][:, query],
            "attention": lambda h: attention_at_query(h, "full")[0][:, query],
            "mlp": lambda h: (lambda a, out: (out - h - a)[:, query])(*attention_at_query(h, "full")),
            "block": lambda h: path_oracle.run_block(block, args, kwargs, h)[:, query],
        }
        paths = {}
        for name, function in functions.items():
            full = torch.autograd.functional.jacobian(function, h0)  # (S, D, S, N, D)
            paths[name] = torch.stack([full[s, :, s].permute(1, 0, 2) for s in range(h0.shape[0])])
        result.append(paths)
    return result


def _norms(jacobian):
    return jacobian.pow(2).sum((-2, -1)).sqrt().mean(0).numpy()  # mean over sequences of ||J(i, j)||_F


@pytest.mark.parametrize("family", ["bloom", "llama", "gpt2", "gpt_neox"])
def test_each_path_equals_autograd_with_the_paths_separated_by_hand(family):
    model, token_ids = tiny(family), ids()
    paths = layer_paths(model, token_ids, queries=[-1, 2])
    assert paths.value.shape == (2, 2, LENGTH) and paths.value.dtype == np.float64
    for k, query in enumerate((LENGTH - 1, 2)):
        for layer, oracle in enumerate(_jacobians(model, family, token_ids, query)):
            for name in ("value", "probability", "mlp"):
                expected = _norms(oracle[name])
                if family == "gpt_neox" and name == "mlp":  # parallel: the MLP reads h_i alone
                    assert expected[query] > 1e-3 and np.all(np.delete(expected, query) == 0.0)
                else:
                    assert expected[: query + 1].min() > 1e-3 or name == "probability"
                np.testing.assert_allclose(getattr(paths, name)[layer, k], expected, rtol=1e-8, atol=1e-12)
            # the two attention paths sum to the attention's Jacobian (product rule), and the four to the block's
            torch.testing.assert_close(oracle["value"] + oracle["probability"], oracle["attention"],
                                       rtol=1e-10, atol=1e-12)
            identity = torch.zeros_like(oracle["block"])
            identity[:, query] = torch.eye(HIDDEN, dtype=identity.dtype)
            torch.testing.assert_close(identity + oracle["attention"] + oracle["mlp"], oracle["block"],
                                       rtol=1e-10, atol=1e-12)
            expected_identity = np.where(np.arange(LENGTH) == query, math.sqrt(HIDDEN), 0.0)
            np.testing.assert_array_equal(paths.identity[layer, k], expected_identity)


def test_the_probability_path_is_not_zero_and_paths_are_causal():
    paths = layer_paths(tiny("llama"), ids(), queries=[3])
    assert paths.probability[:, 0, :3].min() > 1e-6  # keys before the query move its probabilities
    for name in ("value", "probability", "mlp"):
        assert np.all(getattr(paths, name)[:, 0, 4:] == 0.0)  # keys after the query do not reach it


def test_random_projection_estimate_is_within_its_error_of_exact():
    model, token_ids = tiny("bloom"), ids(1)
    exact = layer_paths(model, token_ids)
    estimate = layer_paths(model, token_ids, projections=2000, seed=3)
    assert estimate.relative_standard_error == pytest.approx(math.sqrt(2 / 2000))
    for name in ("value", "probability", "mlp"):
        np.testing.assert_allclose(getattr(estimate, name), getattr(exact, name), rtol=0.10, atol=1e-12)


def test_bad_input_is_refused_before_any_work():
    model = tiny("gpt2")
    with pytest.raises(ConfigError, match="queries"):
        layer_paths(model, ids(), queries=[LENGTH])
    with pytest.raises(ConfigError, match="queries"):
        layer_paths(model, ids(), queries=["last"])
    with pytest.raises(ConfigError, match="projections"):
        layer_paths(model, ids(), projections=0)
    with pytest.raises(ConfigError, match="token_ids"):
        layer_paths(model, ids()[0])
    with pytest.raises(ConfigError, match="training"):
        layer_paths(model.train(), ids())


def test_the_plain_loop_where_a_batching_rule_is_missing_gives_the_same(monkeypatch):
    model, token_ids = tiny("llama"), ids(2)
    batched = layer_paths(model, token_ids, queries=[-1, 1])
    original = torch.autograd.grad

    def no_batching(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("no batching rule (simulated)")
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", no_batching)
    looped = layer_paths(model, token_ids, queries=[-1, 1])
    for name in ("value", "probability", "mlp"):
        np.testing.assert_allclose(getattr(looped, name), getattr(batched, name), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
def test_an_efficient_attention_gives_the_eager_paths(family):
    # the value path is the attention's Jacobian minus the probability path's: no probabilities are read
    token_ids = ids(3)
    eager = layer_paths(tiny(family), token_ids, queries=[-1, 3])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="sdpa")
    model.load_state_dict(tiny(family).state_dict())
    sdpa = layer_paths(model.double().eval(), token_ids, queries=[-1, 3])
    assert model.config._attn_implementation == "sdpa"
    for name in ("value", "probability", "mlp"):
        np.testing.assert_allclose(getattr(sdpa, name), getattr(eager, name), rtol=1e-9, atol=1e-13)
