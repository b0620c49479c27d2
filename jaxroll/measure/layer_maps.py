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

from ..errors import ConfigError
from .families import FAMILIES, REFUSED, ROTARY_FORMULA, windows
from .layer_spec import FALCON_VARIANTS, LayerMap

__all__ = ["LayerMap", "LAYER_MAPS", "layer_map_for", "resolve", "is_parallel"]

LAYER_MAPS = FAMILIES
"""Hugging Face ``model_type`` -> its `LayerMap` (the table is `jaxroll.measure.families.FAMILIES`)."""


def layer_map_for(model) -> LayerMap:
    """The `LayerMap` of `model`, chosen by its ``config.model_type`` (`jaxroll.measure.families.FAMILIES`).

    Falcon without ALiBi (rotary) gets the same modules with
    ``position="rope"``; a parallel block is recorded as such.

    Raises:
        ConfigError: a model type without a map (or refused, saying why).
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED:
        raise ConfigError(f"architecture: model_type {model_type!r} is not supported: {REFUSED[model_type]}")
    if model_type not in FAMILIES:
        kind = ", ".join(getattr(config, "architectures", None) or [type(model).__name__])
        raise ConfigError(
            f"architecture: model_type {model_type!r} ({kind}) has no layer map; "
            f"allowed: {', '.join(sorted(FAMILIES))}, or pass layer_map=LayerMap(blocks, attention, "
            "output_projection, query_key, split, ...)"
        )
    layer_map = FAMILIES[model_type]
    if model_type == "falcon" and not getattr(config, "alibi", False):
        layer_map = dataclasses.replace(layer_map, position="rope", slopes=None, key_bias=None,
                                        formula=ROTARY_FORMULA)
    return layer_map


def is_parallel(layer_map: LayerMap, config) -> bool:
    """Whether the blocks compute ``x + a(LN(x)) + m(LN'(x))`` (attention and MLP read the same x)."""
    if isinstance(layer_map.parallel, str):
        return bool(getattr(config, layer_map.parallel, False))
    return bool(layer_map.parallel)


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
    windows: list  # per layer: the sliding window W, or None
    parallel: bool
    config: object = None


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
    if head_dim * num_heads != hidden and not getattr(config, "head_dim", None):
        raise ConfigError(f"{layer_map.hidden_size}: {hidden} is not {layer_map.num_heads} ({num_heads}) x a head "
                          "dimension; allowed: a config with head_dim")
    return Resolved(
        layer_map=layer_map,
        blocks=blocks,
        attentions=[_get(b, layer_map.attention, layer_map, "attention") for b in blocks],
        output_projections=[_get(b, layer_map.output_projection, layer_map, "output_projection") for b in blocks],
        query_keys=[tuple(_get(b, p, layer_map, "query_key") for p in layer_map.query_key) for b in blocks],
        num_heads=num_heads,
        head_dim=head_dim,
        windows=windows(config, len(blocks)),
        parallel=is_parallel(layer_map, config),
        config=config,
    )
