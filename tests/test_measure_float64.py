"""``--dtype float64`` is float64 end to end (`jaxroll.measure.precision`).

Two checks:

- Mistral, Qwen2, Llama and GPT-2 against a forward pass written here from
  the models' weights (no transformers module is called: RMSNorm / LayerNorm,
  rotary tables from ``rope_theta`` in float64, grouped-query attention with
  the causal or sliding-window mask, the gated or GELU MLP) and plain
  autograd on its input embeddings: lambda_t = mean_i ||a_i|| / (||x_i|| +
  ||a_i||), the head-averaged attention, the rollout of those, and the
  influence ||d max softmax(logits_N) / d e_j|| (mean over sequences,
  normalised) to 1e-12 (lambdas, attention, rollout) and 1e-10 (influence);
- every family: no operation of a measured float64 pass (forward, backward,
  the checkpointed recompute, the recomputed rows) produces a float32 tensor.
"""

from __future__ import annotations

import math
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from jaxroll.measure import measure  # noqa: E402

VOCAB, N, SEQUENCES = 53, 20, 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def _tiny(family, implementation="sdpa"):
    torch.manual_seed(1)
    T = transformers
    rotary = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                  intermediate_size=48, vocab_size=VOCAB, max_position_embeddings=64, rope_theta=10000.0)
    config = {
        "mistral": lambda: T.MistralConfig(**rotary, sliding_window=7),
        "qwen2": lambda: T.Qwen2Config(**rotary),
        "llama": lambda: T.LlamaConfig(**rotary),
        "gpt2": lambda: T.GPT2Config(n_layer=3, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=64),
    }[family]()
    model = T.AutoModelForCausalLM.from_config(config, attn_implementation=implementation).double().eval()
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for parameter in model.parameters():
            parameter.mul_(4.0) if parameter.ndim == 2 else parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _rms(x, weight, eps):
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _attention(q, k, v, window=None):
    """q (N, H, d), k, v (N, H_kv, d) -> (context (N, H d), probabilities (H, N, N)); float64."""
    n, heads, d = q.shape
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    logits = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else torch.zeros((n, n), dtype=torch.bool))
    p = torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)
    return torch.einsum("hij,jhd->ihd", p, v).reshape(n, -1), p


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos[:, None] + torch.cat((-x[..., half:], x[..., :half]), -1) * sin[:, None]


def _forward_llama_style(model, e, window):
    """Llama / Mistral / Qwen2 from their weights: logits of the last position, lambdas, attention."""
    config, body = model.config, model.model
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = config.hidden_size // heads
    eps = config.rms_norm_eps
    theta = config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(e.shape[0], dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    x, lambdas, attention = e, [], []
    for block in body.layers:
        s = block.self_attn
        h = _rms(x, block.input_layernorm.weight, eps)
        q = torch.nn.functional.linear(h, s.q_proj.weight, s.q_proj.bias).reshape(-1, heads, d)
        k = torch.nn.functional.linear(h, s.k_proj.weight, s.k_proj.bias).reshape(-1, kv, d)
        v = torch.nn.functional.linear(h, s.v_proj.weight, s.v_proj.bias).reshape(-1, kv, d)
        context, p = _attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, window)
        a = torch.nn.functional.linear(context, s.o_proj.weight, s.o_proj.bias)
        lambdas.append((a.norm(dim=-1) / (x.norm(dim=-1) + a.norm(dim=-1))).mean())
        attention.append(p.mean(0))
        x = x + a
        h = _rms(x, block.post_attention_layernorm.weight, eps)
        mlp = block.mlp
        gate = torch.nn.functional.silu(h @ mlp.gate_proj.weight.T)
        x = x + (gate * (h @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    x = _rms(x, body.norm.weight, eps)
    return x[-1] @ model.lm_head.weight.T, lambdas, attention


def _forward_gpt2(model, e, window):
    config, body = model.config, model.transformer
    heads, d = config.n_head, config.n_embd // config.n_head
    eps = config.layer_norm_epsilon

    def norm(x, module):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), module.weight, module.bias, eps)

    x, lambdas, attention = e + body.wpe.weight[: e.shape[0]], [], []
    for block in body.h:
        h = norm(x, block.ln_1)
        q, k, v = (h @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(config.n_embd, dim=-1)
        context, p = _attention(*(t.reshape(-1, heads, d) for t in (q, k, v)))
        a = context @ block.attn.c_proj.weight + block.attn.c_proj.bias
        lambdas.append((a.norm(dim=-1) / (x.norm(dim=-1) + a.norm(dim=-1))).mean())
        attention.append(p.mean(0))
        x = x + a
        h = norm(x, block.ln_2)
        inner = torch.nn.functional.gelu(h @ block.mlp.c_fc.weight + block.mlp.c_fc.bias, approximate="tanh")
        x = x + inner @ block.mlp.c_proj.weight + block.mlp.c_proj.bias
    x = norm(x, body.ln_f)
    return x[-1] @ model.lm_head.weight.T, lambdas, attention


def reference(model, family, ids):
    """The manual float64 forward and autograd: lambdas (S, L), attention (L, N, N) mean, influence (N,)."""
    window = model.config.sliding_window if family == "mistral" else None
    forward = _forward_gpt2 if family == "gpt2" else _forward_llama_style
    lambdas, attention, influence = [], [], []
    for row in ids:
        e = model.get_input_embeddings().weight[torch.as_tensor(row)].detach().clone().requires_grad_(True)
        logits, layer_lambdas, layer_attention = forward(model, e, window)
        (gradient,) = torch.autograd.grad(torch.softmax(logits, -1).max(), e)
        lambdas.append(torch.stack(layer_lambdas).detach().numpy())
        attention.append(torch.stack(layer_attention).detach().numpy())
        influence.append(gradient.norm(dim=-1).numpy())
    influence = np.mean(influence, axis=0)
    return np.array(lambdas), np.mean(attention, axis=0), influence / influence.sum()


def _rollout(lambdas, attention):
    # P_T = prod_t ((1 - lambda_t) I + lambda_t A_t), the influence of the last row (written here).
    n = attention.shape[-1]
    product = np.eye(n)
    for lam, a in zip(lambdas, attention):
        product = ((1 - lam) * np.eye(n) + lam * a) @ product
    return product[-1]


@pytest.mark.parametrize("family", ["mistral", "qwen2", "llama", "gpt2"])
def test_float64_measure_equals_a_float64_forward_written_here(family):
    model = _tiny(family)
    ids = np.random.default_rng(2).integers(0, VOCAB, (SEQUENCES, N))
    result = measure(model, ids, stats="lambda,influence,attention", batch_size=2)
    lambdas, attention, influence = reference(model, family, ids)
    assert np.abs(result.lambdas_per_sequence - lambdas).max() < 1e-12
    assert np.abs(result.attention_mean - attention).max() < 1e-12
    rollout = _rollout(result.lambdas, result.attention_mean)
    assert np.abs(rollout - _rollout(lambdas.mean(0), attention)).max() < 1e-12
    assert np.abs(result.influence - influence).max() < 1e-10


class _NoFloat32(TorchDispatchMode):
    """Records every aten operation that returns a float32 tensor (and where it was called).

    Left out: jaxroll's reading of the ALiBi slopes from the model's own
    builder before the pass (`layer_spec`), which is the model's slopes as it
    builds them (powers of two here, exact in float32).
    """

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
                stack = traceback.extract_stack()
                if not any(frame.filename.endswith("jaxroll/measure/layer_spec.py") for frame in stack):
                    self.seen.append((str(func), [f"{frame.filename}:{frame.lineno}" for frame in stack[-6:]]))
        return out


FAMILIES_FLOAT64 = ["gpt2", "opt", "bloom", "mpt", "falcon", "falcon_rope", "gpt_neox", "gptj", "llama", "mistral",
                    "mixtral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "olmo2", "stablelm", "starcoder2"]


@pytest.mark.parametrize("family", FAMILIES_FLOAT64)
def test_no_operation_of_a_float64_pass_is_float32(family):
    from test_families import N as LENGTH
    from test_families import tiny

    model = tiny(family)  # float64, eager attention: the float32 softmax of the eager paths is on the way
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, LENGTH))
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    recorder = _NoFloat32()
    with recorder:
        measure(model, ids, stats="lambda,influence,attention", batch_size=2)
    assert recorder.seen == []
    # After the pass the model is the one it was: its own buffers are back.
    after = dict(model.named_buffers())
    assert all(torch.equal(buffers[name], after[name]) for name in buffers)
    # Without full_precision transformers computes part of a float64 model in float32.
    recorder = _NoFloat32()
    with recorder, torch.no_grad():
        model(input_ids=torch.as_tensor(ids[:1]), use_cache=False)
    if family not in ("gpt2", "opt", "bloom", "mpt", "falcon"):
        assert recorder.seen


def test_frozen_eval_freezes_inside_and_restores_mode_and_flags_even_after_an_error():
    from jaxroll.measure.precision import frozen_eval

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.Linear(2, 1))
    model.train()
    model[2].weight.requires_grad_(False)  # a flag that is not the default must come back as it was
    before = [parameter.requires_grad for parameter in model.parameters()]
    with pytest.raises(RuntimeError):
        with frozen_eval(model):
            assert not model.training and not any(p.requires_grad for p in model.parameters())
            raise RuntimeError("inside")
    assert model.training and [parameter.requires_grad for parameter in model.parameters()] == before
    assert before == [True, True, False, True]
