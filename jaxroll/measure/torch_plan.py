"""What a torch patch will do to a model of one config, checked from the config alone (no weights).

`check(interventions, config) -> Plan` reads a transformers config: the
family (`jaxroll.measure.layer_maps`), its position encoding, its heads and
layers. Each logit intervention becomes one step of a `LogitChange`,

    z'_{t,h}(i, j) = a_{t,h}(i) (s q_i . k_j) + c_{t,h}(i) b_h(i, j) + d_{t,h}(i, j),

(``s q . k`` the content logit, b the ALiBi bias in logit units), the branch
scale a per-layer gamma, a rotary rescale per-head ratios, sink tokens a
count for the caller; `jaxroll.measure.patching.patch` makes the plan
on a loaded model, and the measurement's recomputed attention rows apply
the same `LogitChange`. Everything a model cannot take is refused here, in
one line naming the field, before any weights load (`parse_for` is what the
commands call).
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np

from ..errors import ConfigError

__all__ = ["LogitChange", "Plan", "check", "parse_for", "config_json", "sink_token", "position_limit",
           "check_sink_length", "rope_type", "INTERFACE_FAMILIES", "MODULE_FAMILIES", "ROTARY_FAMILIES"]

INTERFACE_FAMILIES = ("gpt2", "opt", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma2",
                      "gemma3_text", "phi3", "olmo2", "stablelm", "starcoder2")
"""Layer maps whose attention calls transformers' attention interface: logit changes wrap its entries."""
MODULE_FAMILIES = ("bloom", "mpt")
"""Layer maps whose attention builds its scores itself, patched by hooks on their modules."""


@dataclasses.dataclass(frozen=True)
class LogitChange:
    """``z' = a(i) (s q_i . k_j) + c(i) b(i, j) + d(i, j)`` per layer and head (module docstring).

    Attributes:
        steps: ``(kind, values (T, H) float64, g)`` in the order they apply;
            kind is ``"divide"`` (tau), ``"bias_scale"`` (slope_scale),
            ``"add"`` (kappa, with g the distance function) or
            ``"log_length"`` (ssmax_scale).
        rotary_ratios: `RotaryRescale`'s ``r (T, H)`` float64, or None: the
            query of head h in layer t is rotated at positions ``p / r_{t,h}``
            instead of p before the content logit is formed (`rerotate`), and
            so are its keys without grouped-query attention; under it, see
            `key_rotary_ratios`.
        groups: query heads per key-value head (num_attention_heads /
            num_key_value_heads; 1 without grouped-query attention).
    """

    steps: tuple
    rotary_ratios: np.ndarray | None = None
    groups: int = 1

    @property
    def key_rotary_ratios(self) -> np.ndarray | None:
        """``r_{t, g(h)} (T, H)``: the ratio at which the keys query head h reads are rotated, or None.

        Under grouped-query attention (``groups`` = num_attention_heads /
        num_key_value_heads query heads share one key head) the shared keys
        are rotated once, at the ratio of the group's first query head,
        ``g(h) = groups floor(h / groups)``, as Ms-PoE's code does
        (``sample_rotary_emb``: ``cos[::num_key_value_groups]``); each query
        is rotated at its own head's ratio. Without groups this is
        `rotary_ratios` itself.
        """
        if self.rotary_ratios is None:
            return None
        heads = self.rotary_ratios.shape[1]
        return self.rotary_ratios[:, (np.arange(heads) // self.groups) * self.groups]

    def terms(self, layer: int, rows, keys, counts):
        """``(a, c, d)`` of `layer` in float64, or None where a term is untouched (a = c = 1, d = 0).

        Args:
            rows: the query positions i ``(q,)``; keys: the key positions j ``(k,)``.
            counts: n_i, the keys each row sees, broadcastable to ``(B, 1, q, 1)``.

        Returns:
            a and c ``(B|1, H, q, 1)``, d ``(B|1, H, q, k)``.
        """
        import torch

        a = c = d = None
        device = rows.device
        for kind, values, distance in self.steps:
            heads = torch.as_tensor(values[layer], dtype=torch.float64, device=device)[None, :, None, None]
            if kind == "divide":
                factor = 1.0 / heads
            elif kind == "bias_scale":
                c = heads if c is None else c * heads
                continue
            elif kind == "add":
                offsets = (rows[:, None] - keys[None, :]).clamp(min=0).to(torch.float64)
                term = heads * distance(offsets)[None, None]
                d = term if d is None else d + term
                continue
            else:  # "log_length": SSMax's s ln n_i
                factor = heads * torch.log(counts.to(device=device, dtype=torch.float64))
            a = factor if a is None else a * factor
            c = factor if c is None else c * factor
            d = None if d is None else d * factor
        return a, c, d

    def logits(self, layer: int, content, bias, rows, keys, counts):
        """``a content + c bias + d``: `content` ``(B, H, q, k)`` float64, `bias` broadcastable to it or None."""
        a, c, d = self.terms(layer, rows, keys, counts)
        logits = content if a is None else a * content
        if bias is not None:
            logits = logits + (bias if c is None else c * bias)
        return logits if d is None else logits + d


def _log1p(distance):
    return distance.log1p()


def _unsquash(k: float):
    alpha = 1.0 / k

    def g(distance):  # jaxroll.interventions.kernels.unsquash_distance, in torch
        return (distance + alpha).lgamma() - (distance + 1.0).lgamma() - math.lgamma(alpha)
    return g


# The torch form of each distance function `DistanceBias.torch_distance` names (form, k).
_DISTANCES = {"log1p": lambda k: _log1p, "unsquash": _unsquash}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `patch` will do to a model of one config: its logit change and branch scales, both checked."""

    family: str
    change: LogitChange | None
    gammas: np.ndarray | None  # (T,)
    sinks: int = 0  # SinkTokens: prepended by the caller (measure, task), not by `patch`


def _num_layers(config) -> int:
    return int(getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
               or getattr(config, "n_layers", 0))


ROTARY_FAMILIES = ("llama", "mistral", "qwen2")
"""Rotary families whose layer map names the rotary module (its ``inv_freq``): a rotary rescale applies there."""


def rope_type(config) -> str:
    """The config's rope type (``rope_type`` or ``type`` of ``rope_parameters`` or ``rope_scaling``); default: "default"."""
    for name in ("rope_parameters", "rope_scaling"):
        parameters = getattr(config, name, None)
        if isinstance(parameters, dict) and parameters:
            if all(isinstance(value, dict) for value in parameters.values()):  # one per layer type (Gemma 3)
                kinds = {value.get("rope_type", value.get("type", "default")) for value in parameters.values()}
                return kinds.pop() if len(kinds) == 1 else "per layer type"
            return str(parameters.get("rope_type", parameters.get("type", "default")))
    return "default"


def _rotary_ratios(intervention, config, layer_map, num_layers: int, num_heads: int) -> np.ndarray:
    """`RotaryRescale`'s ratios ``(T, H)``, checked against the config: one line naming the field otherwise."""
    if layer_map.position != "rope":
        raise ConfigError(f"rotary_ratio: a {layer_map.name} model has {layer_map.position} positions, no rotary "
                          f"angles; allowed: a rotary model of {', '.join(ROTARY_FAMILIES)}")
    if layer_map.name not in ROTARY_FAMILIES:
        raise ConfigError(f"rotary_ratio: the {layer_map.name} family's rotary module is not mapped; allowed: a "
                          f"model of {', '.join(ROTARY_FAMILIES)}")
    kind = rope_type(config)
    if kind != "default":
        raise ConfigError(f"rotary_ratio: rope_scaling type {kind!r} is not supported; allowed: the default rope "
                          "type (no rope_scaling)")
    parameters = getattr(config, "rope_parameters", None) or {}
    partial = float(parameters.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0)
    if partial != 1.0:
        raise ConfigError(f"rotary_ratio: partial_rotary_factor={partial}; allowed: 1 (every dimension rotated)")
    ratios = intervention.torch_values(num_layers, num_heads)
    key_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    if key_heads < 1 or num_heads % key_heads:
        raise ConfigError(f"rotary_ratio: num_key_value_heads={key_heads} does not divide num_attention_heads="
                          f"{num_heads}; allowed: a divisor")
    return ratios


def _check_logit_change(field: str, kind: str, config, layer_map) -> None:
    """One line naming `field` when the model cannot take a change of its attention logits of `kind`."""
    if kind == "bias_scale" and layer_map.position != "alibi":
        raise ConfigError(f"{field}: a {layer_map.name} model has {layer_map.position} positions, no ALiBi "
                          "slopes; allowed: an ALiBi model (bloom, mpt, falcon with alibi)")
    if layer_map.name not in INTERFACE_FAMILIES + MODULE_FAMILIES:
        raise ConfigError(f"{field}: the {layer_map.name} family's attention cannot be patched; allowed: gamma "
                          f"alone, or a model of {', '.join(INTERFACE_FAMILIES + MODULE_FAMILIES)}")
    if getattr(config, "attn_logit_softcapping", None):
        raise ConfigError(f"{field}: a model with soft-capped attention logits (attn_logit_softcapping="
                          f"{config.attn_logit_softcapping}); allowed: gamma alone")
    attn_config = getattr(config, "attn_config", None)  # an object in transformers, a mapping in config.json
    clip = (attn_config.get("clip_qkv") if isinstance(attn_config, dict) else getattr(attn_config, "clip_qkv", None))
    if clip and kind in ("divide", "log_length"):  # both multiply the query
        raise ConfigError(f"{field}: MPT clips its fused q/k/v (clip_qkv={clip}), so a scaled query is clipped "
                          "differently; allowed: slope_scale, kappa, gamma")
    if getattr(config, "reorder_and_upcast_attn", False):
        raise ConfigError(f"{field}: GPT-2 with reorder_and_upcast_attn bypasses the attention interface; "
                          "allowed: gamma alone, or reorder_and_upcast_attn=False")


def check(interventions, config) -> Plan:
    """`interventions` checked against a model's transformers `config` (no weights): a `Plan`.

    Raises:
        ConfigError: one line naming the field: an intervention without a
            torch patch, slope_scale on a model without ALiBi, a logit change
            on a family that cannot be patched (Falcon) or with
            soft-capped logits, a shape that does not fit the model.
    """
    from ..interventions import intervention_types  # JAX: here, so that `config_json` reads without it
    from .layer_maps import layer_map_for

    layer_map = layer_map_for(SimpleNamespace(config=config))
    num_layers = _num_layers(config)
    num_heads = int(getattr(config, layer_map.num_heads))
    steps, gammas, sinks, ratios = [], None, 0, None
    for intervention in interventions:
        kind = getattr(intervention, "torch_change", None)  # declared on the type: how the patch applies it
        if kind is None:
            raise ConfigError(f"intervention: {type(intervention).__name__} has no torch patch; allowed: "
                              + ", ".join(t.__name__ for t in intervention_types() if t.torch_change is not None))
        if kind == "sinks":
            sinks = intervention.value
            continue
        if kind == "branch":
            gammas = intervention.torch_values(num_layers, num_heads)
            continue
        _check_logit_change(intervention.name, kind, config, layer_map)
        if kind == "rotary":
            ratios = _rotary_ratios(intervention, config, layer_map, num_layers, num_heads)
            continue
        distance = intervention.torch_distance()
        steps.append((kind, intervention.torch_values(num_layers, num_heads),
                      None if distance is None else _DISTANCES[distance[0]](distance[1])))
    groups = num_heads // int(getattr(config, "num_key_value_heads", None) or num_heads)
    change = LogitChange(tuple(steps), ratios, max(groups, 1)) if steps or ratios is not None else None
    return Plan(layer_map.name, change, gammas, sinks)


def sink_token(tokenizer, config) -> tuple[int, str]:
    """The id `SinkTokens` prepends, and where it came from: the tokenizer's ``bos_token_id``, else its
    ``eos_token_id``; without a tokenizer the config's (same order); else 0."""
    for owner, name in ((tokenizer, "tokenizer"), (None if tokenizer is not None else config, "config")):
        for field in ("bos_token_id", "eos_token_id"):
            value = getattr(owner, field, None) if owner is not None else None
            if isinstance(value, (list, tuple)):  # some configs list several end tokens
                value = value[0] if value else None
            if value is not None:
                return int(value), f"the {name}'s {field}"
    return 0, "no bos_token_id or eos_token_id"


def position_limit(config) -> tuple[int | None, str | None]:
    """The longest sequence the model's positions allow and the field that says so: MPT's ``max_seq_len``,
    a learned table's ``n_positions`` (GPT-2) or ``max_position_embeddings`` (OPT); (None, None) for
    rotary and ALiBi models, whose positions have no table."""
    from .layer_maps import layer_map_for

    layer_map = layer_map_for(SimpleNamespace(config=config))
    if layer_map.name == "mpt":
        return int(config.max_seq_len), "max_seq_len"
    if layer_map.position == "learned":
        for field in ("n_positions", "max_position_embeddings"):
            if getattr(config, field, None):
                return int(getattr(config, field)), field
    return None, None


def check_sink_length(config, length: int, sinks: int, flag: str = "--length") -> None:
    """One line when ``length + sinks`` exceeds the model's `position_limit`."""
    limit, field = position_limit(config)
    if sinks and limit is not None and length + sinks > limit:
        raise ConfigError(f"{flag}: {length} with sinks={sinks} runs {length + sinks} positions; allowed: at most "
                          f"the model's {field} ({limit}), so {flag} {limit - sinks} or fewer sinks")


def parse_for(text: str | None, config) -> list:
    """``--intervene TEXT`` read (`jaxroll.interventions.parse`) and checked against a model's `config`
    (`check`): the interventions, or ``[]`` for None. Commands call it before any weights load."""
    if text is None:
        return []
    from ..interventions import parse

    interventions = parse(text)
    check(interventions, config)
    return interventions


def config_json(directory) -> SimpleNamespace | None:
    """``directory/config.json`` read with `json` (no transformers): its fields as attributes, or None.

    A stand-in for the transformers config in `check`, `position_limit` and
    `check_sink_length`, so that the commands refuse what config.json
    decides before torch and transformers import (nested sections stay
    mappings: `check` reads MPT's ``attn_config`` either way). None, leaving
    the decision to the transformers config, where the file is missing or
    not a JSON object, its model type has no layer map, or it lacks a field
    transformers would fill in with a default (the layer and head counts,
    the hidden size, MPT's ``max_seq_len``), so that a field absent here is
    never read as 0.
    """
    import json
    from pathlib import Path

    from .families import FAMILIES
    from .layer_maps import layer_map_for

    try:
        fields = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(fields, dict) or fields.get("model_type") not in FAMILIES:
        return None
    config = SimpleNamespace(**{str(key): value for key, value in fields.items()})
    layer_map = layer_map_for(SimpleNamespace(config=config))
    needed = [layer_map.num_heads, layer_map.hidden_size] + (["max_seq_len"] if layer_map.name == "mpt" else [])
    if not _num_layers(config) or any(not isinstance(getattr(config, name, None), int) for name in needed):
        return None
    return config
