"""Declarative layer maps: where a Hugging Face causal LM keeps what we measure.

A `LayerMap` names, relative to the ``*ForCausalLM`` module, the list of
blocks and, relative to one block, the attention sub-layer, its output
projection and its query/key projection(s), plus how to split the
projection's output into per-head queries and keys ``(B, N, H, d)``. For the
ALiBi families (BLOOM, MPT, Falcon with ``alibi=True``) it also gives the
architecture's exact softmax logit,

    BLOOM:  z_h(i, j) = (q_i . k_j) / sqrt(d) + m_h j
    MPT:    z_h(i, j) = (q_i . k_j) * softmax_scale + m_h (j - (N_max - 1))
    Falcon: z_h(i, j) = (q_i . k_j + c m_h j) / sqrt(d),   c = 1 (SDPA, intended)
                                                           or 2 (eager path)

(plus the causal mask), with the slopes ``m_h`` read from the model's own
ALiBi builder. A bias that depends on the key position j only is, under the
softmax of one row, the same as ``-m_h (i - j)``: the ALiBi term of
arXiv 2602.16837's kernel, with the slope in logit units
``m_h * bias_scale``.

The models are hooked, never modified: nothing here replaces an attention
class, whose signatures change between transformers releases.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from ..errors import ConfigError

__all__ = ["LayerMap", "LAYER_MAPS", "layer_map_for", "resolve"]

FALCON_VARIANTS = ("once", "doubled")


def _split_fused_interleaved(output, num_heads, head_dim, config):
    # BLOOM and Falcon (classic): the last dimension is (heads, 3, head_dim).
    batch, length, _ = output.shape
    fused = output.view(batch, length, num_heads, 3, head_dim)
    return fused[..., 0, :], fused[..., 1, :]


def _split_fused_chunks(output, num_heads, head_dim, config):
    # MPT and GPT-2: the last dimension is (3, heads, head_dim).
    batch, length, _ = output.shape
    clip = getattr(getattr(config, "attn_config", None), "clip_qkv", None)
    if clip:
        output = output.clamp(min=-clip, max=clip)
    query, key = output[..., : num_heads * head_dim], output[..., num_heads * head_dim: 2 * num_heads * head_dim]
    return query.reshape(batch, length, num_heads, head_dim), key.reshape(batch, length, num_heads, head_dim)


def _split_falcon(output, num_heads, head_dim, config):
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
    return _split_fused_interleaved(output, num_heads, head_dim, config)


def _split_separate(outputs, num_heads, head_dim, config):
    # Llama, Mistral, Qwen2: separate q_proj and k_proj; grouped keys repeat.
    query, key = outputs
    batch, length, _ = query.shape
    query = query.view(batch, length, num_heads, head_dim)
    key = key.view(batch, length, -1, head_dim)
    return query, key.repeat_interleave(num_heads // key.shape[2], dim=2)


def _bloom_slopes(model, num_heads):
    from transformers.models.bloom import modeling_bloom

    # BLOOM's own builder (the non-power-of-two rule for, e.g., 112 heads).
    alibi = modeling_bloom.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)
    return alibi.view(num_heads, 2)[:, 1].double()


def _bloom_bias(model, num_heads, length, dtype):
    # The model's path without an attention mask: slopes (float32) * arange, cast to the model dtype.
    from transformers.models.bloom import modeling_bloom

    slopes = modeling_bloom._get_alibi_slopes(num_heads, torch.device("cpu"))
    return (slopes[:, None] * torch.arange(length)).to(dtype)


def _mpt_slopes(model, num_heads):
    alibi = model.transformer.build_mpt_alibi_tensor(num_heads, 2)
    return -alibi.view(num_heads, 2)[:, 0].double()


def _mpt_bias(model, num_heads, length, dtype):
    alibi = model.transformer.build_mpt_alibi_tensor(num_heads, model.config.max_seq_len)
    return alibi.view(num_heads, -1)[:, -length:].to(dtype)


def _falcon_slopes(model, num_heads):
    from transformers.models.falcon import modeling_falcon

    # Falcon rounds its slopes to bfloat16 inside the builder: read them back.
    alibi = modeling_falcon.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)
    return alibi.view(num_heads, 2)[:, 1].double()


def _falcon_bias(model, num_heads, length, dtype):
    from transformers.models.falcon import modeling_falcon

    alibi = modeling_falcon.build_alibi_tensor(torch.ones(1, length, dtype=torch.long), num_heads, dtype)
    return alibi.view(num_heads, length)


def _inverse_sqrt_head_dim(config, head_dim):
    return 1.0 / math.sqrt(head_dim)


def _mpt_scale(config, head_dim):
    scale = config.attn_config.softmax_scale
    return float(scale) if scale is not None else 1.0 / math.sqrt(config.hidden_size / config.n_heads)


def _gpt2_scale(config, head_dim):
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
        rotary: rotary families: the module, from the ``*ForCausalLM``,
            whose forward returns ``(cos, sin)`` ``(B, N, d)`` for every layer
            (`jaxroll.measure.attention_rows` rotates the hooked q and k
            with them).
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
    rotary: str | None = None


LAYER_MAPS: dict[str, LayerMap] = {
    "bloom": LayerMap(
        "bloom", "transformer.h", "self_attention", "self_attention.dense",
        ("self_attention.query_key_value",), _split_fused_interleaved, "n_head", "hidden_size",
        "alibi", _inverse_sqrt_head_dim, _bloom_slopes, _bloom_bias,
        "z = (q_i . k_j) / sqrt(d) + m_h * j",
    ),
    "mpt": LayerMap(
        "mpt", "transformer.blocks", "attn", "attn.out_proj", ("attn.Wqkv",), _split_fused_chunks,
        "n_heads", "d_model", "alibi", _mpt_scale, _mpt_slopes, _mpt_bias,
        "z = (q_i . k_j) * softmax_scale + m_h * (j - (max_seq_len - 1))",
    ),
    "falcon": LayerMap(
        "falcon", "transformer.h", "self_attention", "self_attention.dense",
        ("self_attention.query_key_value",), _split_falcon, "num_attention_heads", "hidden_size",
        "alibi", _inverse_sqrt_head_dim, _falcon_slopes, _falcon_bias,
        "z = (q_i . k_j + c * m_h * j) / sqrt(d)",
    ),
    "gpt2": LayerMap(
        "gpt2", "transformer.h", "attn", "attn.c_proj", ("attn.c_attn",), _split_fused_chunks,
        "n_head", "n_embd", "learned", _gpt2_scale, formula="z = (q_i . k_j) / sqrt(d)",
    ),
    **{
        name: LayerMap(
            name, "model.layers", "self_attn", "self_attn.o_proj", ("self_attn.q_proj", "self_attn.k_proj"),
            _split_separate, "num_attention_heads", "hidden_size", "rope", _inverse_sqrt_head_dim,
            formula="z = (R_i q_i) . (R_j k_j) / sqrt(d)  (rotary)", rotary="model.rotary_emb",
        )
        for name in ("llama", "mistral", "qwen2")
    },
}
"""Hugging Face ``model_type`` -> the `LayerMap` that says where its blocks, attention and projections are."""


def layer_map_for(model) -> LayerMap:
    """The `LayerMap` of `model`, chosen by its ``config.model_type``.

    Falcon without ALiBi (rotary) gets the same modules with
    ``position="rope"``.

    Raises:
        ConfigError: a model type without a map, naming what a map needs.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in LAYER_MAPS:
        kind = ", ".join(getattr(config, "architectures", None) or [type(model).__name__])
        raise ConfigError(
            f"architecture: model_type {model_type!r} ({kind}) has no layer map; "
            f"allowed: {', '.join(sorted(LAYER_MAPS))}, or pass layer_map=LayerMap(blocks, attention, "
            "output_projection, query_key, split, ...)"
        )
    layer_map = LAYER_MAPS[model_type]
    if model_type == "falcon" and not getattr(config, "alibi", False):
        layer_map = dataclasses.replace(layer_map, position="rope", slopes=None, key_bias=None,
                                        formula="z = (R_i q_i) . (R_j k_j) / sqrt(d)  (rotary)")
    return layer_map


def _get(root, path: str, layer_map: LayerMap, field: str):
    module = root
    for part in path.split("."):
        if not hasattr(module, part):
            raise ConfigError(
                f"layer map {layer_map.name!r}: {field} {path!r} not found in {type(root).__name__}; "
                "allowed: a dotted path to an existing submodule"
            )
        module = getattr(module, part)
    return module


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A layer map applied to one model: the modules themselves."""

    layer_map: LayerMap
    blocks: list
    attentions: list
    output_projections: list
    query_keys: list  # per layer: tuple of modules
    num_heads: int
    head_dim: int


def resolve(model, layer_map: LayerMap | None = None) -> Resolved:
    """Find the modules of `layer_map` (default: `layer_map_for(model)`) in `model`.

    Raises:
        ConfigError: a module of the map is missing (naming it).
    """
    layer_map = layer_map or layer_map_for(model)
    blocks = list(_get(model, layer_map.blocks, layer_map, "blocks"))
    if not blocks:
        raise ConfigError(f"layer map {layer_map.name!r}: blocks {layer_map.blocks!r} is empty")
    config = model.config
    num_heads = int(getattr(config, layer_map.num_heads))
    hidden = int(getattr(config, layer_map.hidden_size))
    head_dim = int(getattr(config, "head_dim", None) or hidden // num_heads)
    return Resolved(
        layer_map=layer_map,
        blocks=blocks,
        attentions=[_get(b, layer_map.attention, layer_map, "attention") for b in blocks],
        output_projections=[_get(b, layer_map.output_projection, layer_map, "output_projection") for b in blocks],
        query_keys=[tuple(_get(b, p, layer_map, "query_key") for p in layer_map.query_key) for b in blocks],
        num_heads=num_heads,
        head_dim=head_dim,
    )
