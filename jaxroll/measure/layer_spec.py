"""The `LayerMap` record and the functions a map names: q/k/v splits, ALiBi slopes and biases, logit scales.

The lowest of the layer-map modules: `jaxroll.measure.families` builds its
table from these, `jaxroll.measure.layer_maps` resolves a map on a model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from ..errors import ConfigError

__all__ = ["LayerMap", "FALCON_VARIANTS"]

FALCON_VARIANTS = ("once", "doubled")
"""Falcon's ALiBi bias, added once (its SDPA path, the intended formula) or twice (its eager path)."""


def split_fused_interleaved(output, num_heads, head_dim, config):
    # BLOOM and Falcon (classic): the last dimension is (heads, 3, head_dim).
    batch, length, _ = output.shape
    fused = output.view(batch, length, num_heads, 3, head_dim)
    return fused[..., 0, :], fused[..., 1, :]


def split_fused_chunks(output, num_heads, head_dim, config):
    # MPT and GPT-2: the last dimension is (3, heads, head_dim).
    batch, length, _ = output.shape
    clip = getattr(getattr(config, "attn_config", None), "clip_qkv", None)
    if clip:
        output = output.clamp(min=-clip, max=clip)
    query, key = output[..., : num_heads * head_dim], output[..., num_heads * head_dim: 2 * num_heads * head_dim]
    return query.reshape(batch, length, num_heads, head_dim), key.reshape(batch, length, num_heads, head_dim)


def split_falcon(output, num_heads, head_dim, config):
    batch, length, _ = output.shape
    if getattr(config, "new_decoder_architecture", False):
        kv_heads = config.num_kv_heads
        grouped = output.view(batch, length, kv_heads, num_heads // kv_heads + 2, head_dim)
        query = grouped[..., :-2, :].reshape(batch, length, num_heads, head_dim)
        key = grouped[..., -2:-1, :].expand(-1, -1, -1, num_heads // kv_heads, -1)
        return query, key.reshape(batch, length, num_heads, head_dim)
    if getattr(config, "multi_query", False):
        fused = output.view(batch, length, num_heads + 2, head_dim)
        return fused[..., :-2, :], fused[..., -2:-1, :].expand(-1, -1, num_heads, -1)
    return split_fused_interleaved(output, num_heads, head_dim, config)


def split_separate(outputs, num_heads, head_dim, config):
    # Separate q and k modules (projections, or the per-head / all-head QK-norms
    # after them): (B, N, H*d) or (B, N, H, d); grouped keys repeat.
    query, key = outputs
    batch, length = query.shape[:2]
    query = query.reshape(batch, length, num_heads, head_dim)
    key = key.reshape(batch, length, -1, head_dim)
    return query, key.repeat_interleave(num_heads // key.shape[2], dim=2)


def split_heads_first(outputs, num_heads, head_dim, config):
    # Gemma 3's QK-norms act on (B, H, N, d) (after the transpose).
    query, key = (tensor.transpose(1, 2) for tensor in outputs)
    return split_separate((query, key), num_heads, head_dim, config)


def split_phi3(output, num_heads, head_dim, config):
    # Phi-3's fused qkv_proj: (H*d | KV*d | KV*d) along the last dimension.
    batch, length, _ = output.shape
    kv = (output.shape[-1] - num_heads * head_dim) // 2
    query = output[..., : num_heads * head_dim]
    key = output[..., num_heads * head_dim: num_heads * head_dim + kv]
    return split_separate((query, key), num_heads, head_dim, config)


# Value vectors (B, N, H, d) from the value module's output, for the refinements.

def value_separate(output, num_heads, head_dim, config):
    values = output.reshape(*output.shape[:2], -1, head_dim)
    return values.repeat_interleave(num_heads // values.shape[2], dim=2)


def value_fused_interleaved(output, num_heads, head_dim, config):
    return output.reshape(*output.shape[:2], num_heads, 3, head_dim)[..., 2, :]


def value_fused_chunks(output, num_heads, head_dim, config):
    clip = getattr(getattr(config, "attn_config", None), "clip_qkv", None)
    if clip:  # MPT clips the whole fused output
        output = output.clamp(min=-clip, max=clip)
    return output[..., 2 * num_heads * head_dim:].reshape(*output.shape[:2], num_heads, head_dim)


def value_falcon(output, num_heads, head_dim, config):
    batch, length, _ = output.shape
    if getattr(config, "new_decoder_architecture", False):
        kv_heads = config.num_kv_heads
        grouped = output.view(batch, length, kv_heads, num_heads // kv_heads + 2, head_dim)
        return grouped[..., -1:, :].expand(-1, -1, -1, num_heads // kv_heads, -1).reshape(
            batch, length, num_heads, head_dim)
    if getattr(config, "multi_query", False):
        fused = output.view(batch, length, num_heads + 2, head_dim)
        return fused[..., -1:, :].expand(-1, -1, num_heads, -1)
    return value_fused_interleaved(output, num_heads, head_dim, config)


def value_phi3(output, num_heads, head_dim, config):
    kv = (output.shape[-1] - num_heads * head_dim) // 2
    return value_separate(output[..., num_heads * head_dim + kv:], num_heads, head_dim, config)


def bloom_slopes(model, num_heads):
    import torch  # here, not at the top: the commands read the layer maps before torch loads
    from transformers.models.bloom import modeling_bloom

    # BLOOM's own builder (the non-power-of-two rule for, e.g., 112 heads).
    alibi = modeling_bloom.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)
    return alibi.view(num_heads, 2)[:, 1].double()


def bloom_bias(model, num_heads, length, dtype):
    import torch
    # The model's path without an attention mask: slopes (float32) * arange, cast to the model dtype.
    from transformers.models.bloom import modeling_bloom

    slopes = modeling_bloom._get_alibi_slopes(num_heads, torch.device("cpu"))
    return (slopes[:, None] * torch.arange(length)).to(dtype)


def mpt_slopes(model, num_heads):
    alibi = model.transformer.build_mpt_alibi_tensor(num_heads, 2)
    return -alibi.view(num_heads, 2)[:, 0].double()


def mpt_bias(model, num_heads, length, dtype):
    alibi = model.transformer.build_mpt_alibi_tensor(num_heads, model.config.max_seq_len)
    return alibi.view(num_heads, -1)[:, -length:].to(dtype)


def falcon_slopes(model, num_heads):
    import torch
    from transformers.models.falcon import modeling_falcon

    # Falcon rounds its slopes to bfloat16 inside the builder: read them back.
    alibi = modeling_falcon.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)
    return alibi.view(num_heads, 2)[:, 1].double()


def falcon_bias(model, num_heads, length, dtype):
    import torch
    from transformers.models.falcon import modeling_falcon

    alibi = modeling_falcon.build_alibi_tensor(torch.ones(1, length, dtype=torch.long), num_heads, dtype)
    return alibi.view(num_heads, length)


def inverse_sqrt_head_dim(config, head_dim):
    return 1.0 / math.sqrt(head_dim)


def mpt_scale(config, head_dim):
    scale = config.attn_config.softmax_scale
    return float(scale) if scale is not None else 1.0 / math.sqrt(config.hidden_size / config.n_heads)


def gpt2_scale(config, head_dim):
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise ConfigError(
            "scale_attn_by_inverse_layer_idx: True scales each layer differently; "
            "allowed: False for content scores"
        )
    return 1.0 / math.sqrt(head_dim) if config.scale_attn_weights else 1.0


@dataclasses.dataclass(frozen=True)
class LayerMap:
    """Where to find one architecture's blocks, attention and projections.

    Attributes:
        name: the map's name (the transformers ``model_type``).
        blocks: dotted path of the block list, from the ``*ForCausalLM`` module.
        attention: the attention sub-layer, from a block. Its forward returns
            ``(output, probabilities)``; the probabilities are not None in
            the eager implementation.
        output_projection: the attention's output projection, from a block;
            its output is the attention sub-layer output ``a`` (after the
            bias, before dropout and the residual add).
        query_key: the projection(s) whose output(s) hold the queries and
            keys, from a block (one fused module or ``(q_proj, k_proj)``).
        split: ``(output(s), H, d, config) -> (q, k)``, each ``(B, N, H, d)``.
        num_heads / hidden_size: config attribute names.
        position: ``"alibi"``, ``"rope"`` or ``"learned"``: how positions
            enter the logits. Content scores are measured for ``alibi`` and
            ``learned`` (the logit is ``scale * q.k`` plus the bias), not for
            ``rope`` (the rotation after the projection changes ``q.k``).
        logit_scale: ``(config, d) -> float``, the factor on ``q.k`` in the
            softmax logit.
        slopes: ``(model, H) -> (H,)`` float64, the model's own ALiBi slopes.
        key_bias: ``(model, H, N, dtype) -> (H, N)``, the model's own additive
            bias per key position j, before any Falcon scaling.
        formula: the logit, as text, for the metadata.
        title / config_class: the family's name and transformers config class (docs, tests).
        value, value_split: the module holding the value vectors, from a block, and
            ``(output, H, d, config) -> (B, N, H, d)`` (the refinements' ``norm``).
        w_out: the linear module whose weight is W_O, from a block (default:
            `output_projection`; differs where a norm follows W_O).
        mlp_output: the module whose output is the MLP's residual update ``m``.
        attention_kind: MHA / GQA / MQA, as text (docs).
        parallel: True, or the config attribute that says, when attention and
            MLP read the same block input (`is_parallel`).
        refused: statistic -> why this family cannot give it.
        notes: one line for the docs' family table.
        rotary: the rotary embedding module, from the ``*ForCausalLM`` module,
            whose ``(cos, sin)`` rotate the hooked q and k when attention rows
            are recomputed under SDPA (`jaxroll.measure.attention_rows`); None
            for a rotary family whose recomputation is not checked against its
            eager probabilities (partial rotary, soft-capping, local bases):
            statistics that read attention rows then load it with eager attention.
        input_norm: the norm whose output the attention reads, from a block: the
            candidate names, the first that exists (Falcon's new decoder has
            ``ln_attn``); empty where the attention reads the block input
            (OLMo 2's norms follow the sub-layers). The refinements' ``input_norm``.
    """

    name: str
    blocks: str
    attention: str
    output_projection: str
    query_key: tuple[str, ...]
    split: Callable
    num_heads: str
    hidden_size: str
    position: str
    logit_scale: Callable
    slopes: Callable | None = None
    key_bias: Callable | None = None
    formula: str = ""
    title: str = ""
    config_class: str = ""
    value: str | None = None
    value_split: Callable | None = None
    w_out: str | None = None
    mlp_output: str | None = None
    attention_kind: str = ""
    parallel: bool | str | None = None
    refused: dict = dataclasses.field(default_factory=dict)
    notes: str = ""
    rotary: str | None = None
    input_norm: tuple[str, ...] = ("input_layernorm",)


