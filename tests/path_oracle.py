"""The paths of one block separated by hand (detach), for tests of `jaxroll.measure.paths` and `path_stats`.

Written against each family's modules directly (not through jaxroll's layer maps), so that the oracle
and the code under test do not share the module lookup. `attention_and_output(..., mode)` recomputes a
block from its input ``h`` with: ``"value"`` the softmax detached (probabilities held fixed: the value
path), ``"probability"`` the values detached (the probability path), ``"full"`` nothing detached; it
returns the attention sub-layer's output (after the output projection) and the block's output.
"""

from __future__ import annotations

import torch
import transformers


def tiny_config(family, *, heads: int, hidden: int, vocab: int, key_value_heads: int = 1):
    """A 2-layer configuration of `family` for these tests (MLP width 2 x hidden; grouped-query families with
    `key_value_heads`)."""
    common = dict(num_hidden_layers=2, num_attention_heads=heads, hidden_size=hidden, vocab_size=vocab)
    if family == "bloom":
        return transformers.BloomConfig(n_layer=2, n_head=heads, hidden_size=hidden, vocab_size=vocab)
    if family == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_head=heads, n_embd=hidden, vocab_size=vocab, n_positions=32,
                                       bos_token_id=0, eos_token_id=0)
    if family == "falcon":  # ALiBi: its eager path adds the bias twice, its sdpa path once
        return transformers.FalconConfig(**common, alibi=True, new_decoder_architecture=False, multi_query=False,
                                         parallel_attn=True, bias=True)
    if family == "gpt_neox":  # partial rotary; use_parallel_residual (the default): the MLP reads the block input
        return transformers.GPTNeoXConfig(**common, intermediate_size=2 * hidden, rotary_pct=0.5,
                                          max_position_embeddings=32)
    if family == "mistral":  # a window shorter than N: keys i - j >= W carry nothing
        return transformers.MistralConfig(**common, num_key_value_heads=key_value_heads, intermediate_size=2 * hidden,
                                          sliding_window=4, head_dim=hidden // heads)
    if family == "qwen2":  # biases on q, k, v
        return transformers.Qwen2Config(**common, num_key_value_heads=key_value_heads, intermediate_size=2 * hidden)
    return transformers.LlamaConfig(**common, num_key_value_heads=key_value_heads, intermediate_size=2 * hidden)


def blocks(model, family):
    if family == "gpt_neox":
        return model.gpt_neox.layers
    return model.transformer.h if family in ("bloom", "gpt2") else model.model.layers


def attention_output(block, family):
    return {"bloom": lambda: block.self_attention.dense, "gpt2": lambda: block.attn.c_proj,
            "llama": lambda: block.self_attn.o_proj, "gpt_neox": lambda: block.attention.dense}[family]()


def detach_values(block, family, heads: int, hidden: int):
    """The module whose output holds the values, and the function that detaches them in that output."""
    if family == "llama":
        return block.self_attn.v_proj, lambda out: out.detach()
    if family in ("bloom", "gpt_neox"):  # (B, N, H*3*d) laid out as (H, 3, d)
        def fused(out):
            parts = out.view(*out.shape[:2], heads, 3, hidden // heads)
            kept = [parts[..., 0, :], parts[..., 1, :], parts[..., 2, :].detach()]
            return torch.stack(kept, dim=3).reshape(out.shape)
        return (block.attention if family == "gpt_neox" else block.self_attention).query_key_value, fused

    def gpt2(out):  # GPT-2: (q | k | v) along the last dimension
        query, key, value = out.split(hidden, dim=-1)
        return torch.cat([query, key, value.detach()], dim=-1)
    return block.attn.c_attn, gpt2


class DetachedSoftmax:
    """``torch.nn.functional.softmax`` returning detached probabilities while entered."""

    def __enter__(self):
        self.original = torch.nn.functional.softmax
        torch.nn.functional.softmax = lambda *a, **k: self.original(*a, **k).detach()

    def __exit__(self, *exc):
        torch.nn.functional.softmax = self.original


def block_calls(model, family, token_ids):
    """Each block's ``(args, kwargs, input h)`` from one forward pass of `token_ids`."""
    calls = []

    def hook(module, args, kwargs):
        calls.append((args, kwargs, (args[0] if args else kwargs["hidden_states"]).detach().clone()))

    handles = [b.register_forward_pre_hook(hook, with_kwargs=True) for b in blocks(model, family)]
    with torch.no_grad():
        model(input_ids=torch.as_tensor(token_ids), use_cache=False)
    for handle in handles:
        handle.remove()
    return calls


def run_block(block, args, kwargs, h):
    """The block's output (its first output) for input `h`, with the recorded other arguments."""
    out = block(h, *args[1:], **kwargs) if args else block(**dict(kwargs, hidden_states=h))
    return out[0] if isinstance(out, (tuple, list)) else out


def attention_and_output(block, family, args, kwargs, h, mode: str, heads: int, hidden: int):
    """``(attention sub-layer output, block output)`` for input `h`, the paths separated by `mode` (module doc)."""
    kept = {}
    handles = [attention_output(block, family).register_forward_hook(lambda m, a, out: kept.__setitem__("a", out))]
    if mode == "probability":
        module, detach = detach_values(block, family, heads, hidden)
        handles.append(module.register_forward_hook(lambda m, a, out: detach(out)))
    try:
        if mode == "value":
            with DetachedSoftmax():
                out = run_block(block, args, kwargs, h)
        else:
            out = run_block(block, args, kwargs, h)
    finally:
        for handle in handles:
            handle.remove()
    return kept["a"], out
