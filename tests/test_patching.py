"""`jaxroll.measure.patching`: each torch patch against a hand-written forward of the intervened attention.

The oracle computes, in float64 NumPy from each attention module's own
weights and the hidden state that enters it (read by a plain pre-hook), the
queries and keys (rotary rotation from the config's ``rope_theta``, ALiBi
slopes ``2^(-8 (h + 1) / H)`` from Press et al. 2022), and the intervened
logit in closed form, in the order `parse` gives:

    z' = s_ssmax ln(i + 1) [ (s q_i . k_j + slope_scale m_h j) / tau + kappa g(i - j) ],

with ``g = log1p`` or Attributor's ``ln c_m`` from `scipy.special.gammaln`.
Its softmax is compared with the probabilities the patched eager model
returns, and ``W_O (A v)`` with the attention output of the patched SDPA
model; the chunked row recomputation of `jaxroll.measure.attention_rows`
with the same oracle. Tolerances: 1e-10 in float64, 1e-6 in float32.
Cleanliness: the state dict, every module's hook dictionaries and the
attention registry are the same after the ``with`` block, also when it raises.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy.special import gammaln

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxroll import ConfigError  # noqa: E402
from jaxroll.interventions import (BranchScale, DistanceBias, LengthScaledLogits, SlopeScale,  # noqa: E402
                                   Temperature, parse)
from jaxroll.measure.patching import patch  # noqa: E402
from jaxroll.measure.torch_plan import check  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

VOCAB, HEADS, HIDDEN, LAYERS, N, BATCH = 61, 4, 16, 2, 9, 2
HEAD_DIM = HIDDEN // HEADS
ROTARY = dict(num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2, hidden_size=HIDDEN,
              intermediate_size=24, vocab_size=VOCAB, max_position_embeddings=32)


def _config(family):
    T = transformers
    return {"bloom": lambda: T.BloomConfig(n_layer=LAYERS, n_head=HEADS, hidden_size=HIDDEN, vocab_size=VOCAB),
            "mpt": lambda: T.MptConfig(n_layers=LAYERS, n_heads=HEADS, d_model=HIDDEN, vocab_size=VOCAB,
                                       max_seq_len=16),
            "llama": lambda: T.LlamaConfig(**ROTARY),
            "qwen2": lambda: T.Qwen2Config(**ROTARY),
            "gpt2": lambda: T.GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=HIDDEN, vocab_size=VOCAB,
                                         n_positions=32, bos_token_id=0, eos_token_id=0)}[family]()


def tiny(family, implementation="eager", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=implementation)
    with torch.no_grad():  # larger weights than the init: the logits are O(1), the changes visible
        for parameter in model.parameters():
            parameter.mul_(6.0) if parameter.ndim == 2 else parameter.add_(0.1 * torch.randn_like(parameter))
    return model.to(dtype).eval()


def _ids(seed=1):
    return torch.as_tensor(np.random.default_rng(seed).integers(0, VOCAB, size=(BATCH, N)))


def _np(tensor):
    return tensor.detach().double().cpu().numpy()


def _attentions(model, family):
    return {"bloom": lambda: [block.self_attention for block in model.transformer.h],
            "gpt2": lambda: [block.attn for block in model.transformer.h],
            "mpt": lambda: [block.attn for block in model.transformer.blocks]}.get(
        family, lambda: [layer.self_attn for layer in model.model.layers])()


# The hand-written attention: q, k, v and W_O from each family's own weights.

def _rotate(x, theta):  # x (B, N, H, d): Hugging Face's rotate_half convention
    d = x.shape[-1]
    inverse = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = np.arange(x.shape[1])[:, None] * inverse[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    turned = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos[None, :, None, :] + turned * sin[None, :, None, :]


def _linear(module, x):
    return x @ _np(module.weight).T + (0.0 if module.bias is None else _np(module.bias))


def hand_qkv(family, attention, x, config):
    """q, k, v ``(B, N, H, d)`` and the ALiBi slopes (or None) from the module's weights; x ``(B, N, D)``."""
    B = x.shape[0]
    if family == "bloom":
        fused = _linear(attention.query_key_value, x).reshape(B, N, HEADS, 3, HEAD_DIM)
        slopes = 2.0 ** (-8.0 * np.arange(1, HEADS + 1) / HEADS)
        return fused[..., 0, :], fused[..., 1, :], fused[..., 2, :], slopes
    if family == "mpt":  # (3, H, d) per token; MPT's bias m_h (j - (N_max - 1)) is m_h j up to a row constant
        fused = _linear(attention.Wqkv, x)
        q, k, v = (fused[..., i * HIDDEN:(i + 1) * HIDDEN].reshape(B, N, HEADS, HEAD_DIM) for i in range(3))
        return q, k, v, 2.0 ** (-8.0 * np.arange(1, HEADS + 1) / HEADS)
    if family == "gpt2":  # Conv1D: x W + b
        fused = x @ _np(attention.c_attn.weight) + _np(attention.c_attn.bias)
        q, k, v = (fused[..., i * HIDDEN:(i + 1) * HIDDEN].reshape(B, N, HEADS, HEAD_DIM) for i in range(3))
        return q, k, v, None
    theta = config.rope_parameters["rope_theta"]
    q = _linear(attention.q_proj, x).reshape(B, N, HEADS, HEAD_DIM)
    k = _linear(attention.k_proj, x).reshape(B, N, -1, HEAD_DIM)
    v = _linear(attention.v_proj, x).reshape(B, N, -1, HEAD_DIM)
    groups = HEADS // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    return _rotate(q, theta), _rotate(k, theta), v, None


def hand_output(family, attention, probabilities, v):
    context = np.einsum("bhij,bjhd->bihd", probabilities, v).reshape(v.shape[0], N, HIDDEN)
    if family == "gpt2":
        return context @ _np(attention.c_proj.weight) + _np(attention.c_proj.bias)
    return _linear(attention.out_proj if family == "mpt" else attention.o_proj, context)


def unsquash(m, k):
    alpha = 1.0 / k
    return gammaln(m + alpha) - gammaln(m + 1.0) - gammaln(alpha)


def intervened_logits(content, slopes, spec, layer):
    """The closed form of the module docstring; `spec` maps tau, slope_scale, kappa, ssmax to (T, H) arrays."""
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]

    def per_head(name, default):
        return np.broadcast_to(np.asarray(spec.get(name, default), dtype=np.float64), (LAYERS, HEADS))[layer][
            None, :, None, None]

    bias = 0.0 if slopes is None else slopes[None, :, None, None] * j[None, None]
    g = {"log1p": np.log1p, "unsquash": lambda m: unsquash(m, spec.get("kappa_k", 2.0))}[spec.get("form", "log1p")]
    z = (content + per_head("slope_scale", 1.0) * bias) / per_head("tau", 1.0)
    z = z + per_head("kappa", 0.0) * g(np.maximum(i - j, 0))[None, None]
    if "ssmax" in spec:
        z = per_head("ssmax", 1.0) * np.log(i + 1.0)[None, None] * z
    return np.where(j <= i, z, -np.inf)


def softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _interventions(spec):
    changes = []
    if "tau" in spec:
        changes.append(Temperature(spec["tau"]))
    if "slope_scale" in spec:
        changes.append(SlopeScale(spec["slope_scale"]))
    if "kappa" in spec:
        changes.append(DistanceBias(spec["kappa"], spec.get("form", "log1p"), k=spec.get("kappa_k", 2.0)))
    if "ssmax" in spec:
        changes.append(LengthScaledLogits(spec["ssmax"]))
    return changes


SPECS = {
    "tau per head": {"tau": [0.5, 1.0, 2.0, 0.8]},
    "kappa per layer": {"kappa": [[-1.0], [0.7]]},
    "kappa unsquash": {"kappa": 0.8, "form": "unsquash", "kappa_k": 3.0},
    "ssmax": {"ssmax": [[0.9], [1.4]]},
    "all": {"tau": 0.7, "kappa": 0.5, "ssmax": 1.3},
}
ALIBI_SPECS = {"slope per head": {"slope_scale": [0.0, 1.0, 3.0, 0.5]},
               "all with slopes": {"tau": [[0.6], [1.5]], "slope_scale": 2.0, "kappa": -0.4, "ssmax": 0.8}}
CASES = ([(family, "eager", name) for family in ("bloom", "mpt") for name in (*SPECS, *ALIBI_SPECS)]
         + [(family, implementation, name) for family in ("llama", "qwen2", "gpt2")
            for implementation in ("eager", "sdpa") for name in SPECS])


def _spec(name):
    return {**SPECS, **ALIBI_SPECS}[name]


def _run_patched(model, family, changes, ids, eager):
    """The patched model's forward: per layer the attention input, its probabilities (eager) and its output."""
    inputs, outputs = {}, {}
    attentions = _attentions(model, family)
    handles = []
    for layer, attention in enumerate(attentions):
        def before(module, args, kwargs, layer=layer):
            inputs[layer] = _np(args[0] if args else kwargs["hidden_states"])

        def after(module, args, output, layer=layer):
            outputs[layer] = _np(output[0])
        handles += [attention.register_forward_pre_hook(before, with_kwargs=True),
                    attention.register_forward_hook(after)]
    try:
        # full_precision: a float64 model without transformers' float32 softmax, norms and rotary tables.
        with torch.no_grad(), full_precision(model), patch(model, changes):
            result = model(ids, output_attentions=eager, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    probabilities = [_np(p) for p in result.attentions] if eager else None
    return inputs, outputs, probabilities


@pytest.mark.parametrize("family, implementation, name", CASES)
def test_each_patch_matches_the_hand_written_intervened_attention(family, implementation, name):
    spec = _spec(name)
    model = tiny(family, implementation)
    eager = implementation == "eager"
    inputs, outputs, probabilities = _run_patched(model, family, _interventions(spec), _ids(), eager)
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, v, slopes = hand_qkv(family, attention, inputs[layer], model.config)
        content = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(HEAD_DIM)
        expected = softmax(intervened_logits(content, slopes, spec, layer))
        if eager:
            np.testing.assert_allclose(probabilities[layer], expected, rtol=0, atol=1e-10)
        if family != "bloom":  # BLOOM's attention returns the residual sum, its probabilities are checked
            np.testing.assert_allclose(outputs[layer], hand_output(family, attention, expected, v), rtol=0,
                                       atol=1e-10)


@pytest.mark.parametrize("family, implementation", [("bloom", "eager"), ("mpt", "eager"), ("llama", "sdpa"),
                                                    ("gpt2", "eager")])
def test_float32_patches_match_the_float64_oracle(family, implementation):
    spec = _spec("all with slopes" if family in ("bloom", "mpt") else "all")
    model = tiny(family, implementation, dtype=torch.float32)
    eager = implementation == "eager"
    inputs, outputs, probabilities = _run_patched(model, family, _interventions(spec), _ids(), eager)
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, v, slopes = hand_qkv(family, attention, inputs[layer], model.config)
        expected = softmax(intervened_logits(np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(HEAD_DIM), slopes, spec,
                                             layer))
        if eager:
            np.testing.assert_allclose(probabilities[layer], expected, rtol=0, atol=1e-6)
        else:
            scale = np.abs(outputs[layer]).max()
            np.testing.assert_allclose(outputs[layer] / scale, hand_output(family, attention, expected, v) / scale,
                                       rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bloom", "mpt"])
def test_the_chunked_row_recomputation_applies_the_same_change(family):
    from jaxroll.measure.attention_rows import row_chunks

    spec = _spec("all with slopes" if family in ("bloom", "mpt") else "all")
    model = tiny(family, "eager")
    changes = _interventions(spec)
    inputs, _, probabilities = _run_patched(model, family, changes, _ids(), True)
    change = check(changes, model.config).change
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, _, slopes = hand_qkv(family, attention, inputs[layer], model.config)
        bias = None if slopes is None else torch.as_tensor(slopes[:, None] * np.arange(N)[None, :])
        rows = np.concatenate([_np(chunk) for _, chunk in row_chunks(
            torch.as_tensor(q), torch.as_tensor(k), scale=1.0 / np.sqrt(HEAD_DIM), bias=bias, chunk=4,
            change=functools.partial(change.logits, layer))], axis=2)
        expected = softmax(intervened_logits(np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(HEAD_DIM), slopes, spec,
                                             layer))
        np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(rows, probabilities[layer], rtol=0, atol=1e-10)  # and the patched model


def snapshot(model):
    """Everything a patch may touch: weights, every module's hooks and instance attributes, the registry."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    modules = [(name, dict(module._forward_hooks), dict(module._forward_pre_hooks),
                dict(module._forward_hooks_with_kwargs), dict(module._forward_pre_hooks_with_kwargs),
                dict(module._backward_hooks), sorted(vars(module))) for name, module in model.named_modules()]
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    return modules, dict(ALL_ATTENTION_FUNCTIONS._local_mapping), dict(AttentionInterface._global_mapping), weights


def assert_same(before, after):
    assert before[:3] == after[:3]
    assert before[3].keys() == after[3].keys()
    assert all(torch.equal(before[3][name], after[3][name]) for name in before[3])


IDENTITY = {"bloom": "tau=1,slope_scale=1,kappa=0,gamma=1", "mpt": "tau=1,slope_scale=1,kappa=0,gamma=1",
            "llama": "tau=1,kappa=0,gamma=1",
            "gpt2": "tau=1,kappa=0,gamma=1"}


@pytest.mark.parametrize("family, implementation", [("bloom", "eager"), ("mpt", "eager"), ("llama", "sdpa"),
                                                    ("llama", "eager"), ("gpt2", "sdpa")])
def test_the_model_is_bit_identical_after_the_block_even_when_it_raises(family, implementation):
    model = tiny(family, implementation)
    ids = _ids()
    with torch.no_grad():
        baseline = model(ids).logits
    before = snapshot(model)
    changes = parse("tau=0.5,kappa=1,ssmax_scale=1.2,gamma=0.3" + (",slope_scale=2" if family in ("bloom", "mpt")
                                                                   else ""))
    with torch.no_grad(), patch(model, changes):
        changed = model(ids).logits
    assert not torch.allclose(changed, baseline)
    assert_same(before, snapshot(model))
    with pytest.raises(RuntimeError, match="inside"):
        with torch.no_grad(), patch(model, changes):
            model(ids)
            raise RuntimeError("inside the block")
    assert_same(before, snapshot(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, baseline)
        with patch(model, parse(IDENTITY[family])):
            identity = model(ids).logits
    np.testing.assert_allclose(_np(identity), _np(baseline), rtol=0, atol=1e-12)


def test_a_patch_acts_on_its_own_model_only():
    patched, other = tiny("llama", "sdpa", seed=0), tiny("llama", "sdpa", seed=1)
    ids = _ids()
    with torch.no_grad():
        baseline = other(ids).logits
        with patch(patched, parse("tau=0.3,kappa=-2")):
            inside = other(ids).logits
    assert torch.equal(inside, baseline)


@pytest.mark.parametrize("family, implementation", [("llama", "sdpa"), ("bloom", "eager"), ("gpt2", "eager")])
def test_gamma_zero_removes_the_attention_branch(family, implementation):
    model = tiny(family, implementation)
    ids = _ids()
    projection = {"bloom": lambda: model.transformer.h[0].self_attention.dense,
                  "gpt2": lambda: model.transformer.h[0].attn.c_proj,
                  "llama": lambda: model.model.layers[0].self_attn.o_proj}[family]()
    # The hand-built forward: layer 0's attention output projection returns zeros.
    handle = projection.register_forward_hook(lambda module, args, output: torch.zeros_like(output))
    try:
        with torch.no_grad():
            expected = model(ids).logits
    finally:
        handle.remove()
    with torch.no_grad(), patch(model, [BranchScale([0.0, 1.0])]):
        removed = model(ids).logits
    np.testing.assert_allclose(_np(removed), _np(expected), rtol=0, atol=1e-12)


@pytest.mark.parametrize("family, text, message", [
    ("llama", "slope_scale=2", "slope_scale: a llama model has rope positions"),
    ("gpt2", "slope_scale=2", "slope_scale: a gpt2 model has learned positions"),
    ("mpt_clipped", "tau=0.5", "tau: MPT clips its fused q/k/v"),
    ("mpt_clipped", "kappa=0.5,slope_scale=2", None),
    ("falcon", "kappa=1", "kappa: the falcon family's attention cannot be patched"),
    ("gemma2", "ssmax_scale=1", "ssmax_scale: a model with soft-capped attention logits"),
    ("llama", "gamma=0.5", None),
    ("mpt", "gamma=0.5", None),
])
def test_check_refuses_what_cannot_be_patched_from_the_config_alone(family, text, message):
    T = transformers
    config = {"llama": lambda: T.LlamaConfig(**ROTARY), "gpt2": lambda: _config("gpt2"),
              "mpt": lambda: T.MptConfig(n_layers=2, n_heads=4, d_model=16, vocab_size=VOCAB),
              "mpt_clipped": lambda: T.MptConfig(n_layers=2, n_heads=4, d_model=16, vocab_size=VOCAB,
                                                 attn_config={"clip_qkv": 6.0}),
              "falcon": lambda: T.FalconConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=16,
                                               alibi=True, vocab_size=VOCAB),
              "gemma2": lambda: T.Gemma2Config(**ROTARY, head_dim=4)}[family]()
    if message is None:
        plan = check(parse(text), config)
        assert (plan.change is None) == ("gamma" in text) and (plan.gammas is None) == ("gamma" not in text)
        return
    with pytest.raises(ConfigError, match=message) as refused:
        check(parse(text), config)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text, message", [("tau=[1,2,3]", None), ("gamma=[1,1,1]", "gamma: got length")])
def test_check_refuses_shapes_that_do_not_fit_the_model(tmp_path, text, message):
    import yaml

    name, value = text.split("=")
    path = tmp_path / "changes.yaml"
    path.write_text(yaml.safe_dump({name: yaml.safe_load(value)}))
    with pytest.raises(ConfigError, match=message or "tau: inner list length 3"):
        check(parse(str(path)), transformers.LlamaConfig(**ROTARY))
