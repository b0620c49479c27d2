"""The interventions applied to a loaded Hugging Face model (torch): the change the rollout predicts, made.

`patch(model, interventions)` is a context manager: inside the ``with``
block the model computes the intervened attention; on leaving it (also
through an exception) every hook is removed and every registry entry
restored, so the model and transformers are as before, bit for bit.

**One logit change.** Head h of layer t scores a query i against a key j by
``z = s q_i . k_j + b_h(i, j)``: ``s q . k`` the content logit (after any
rotary rotation, s the model's logit scale), b the ALiBi bias in logit units
(0 for rotary and learned positions). Every logit intervention is a map

    z'_{t,h}(i, j) = a_{t,h}(i) (s q_i . k_j) + c_{t,h}(i) b_h(i, j) + d_{t,h}(i, j),

and several compose, in the order `jaxroll.interventions.parse` gives, as
maps of ``(a, c, d)`` starting from ``(1, 1, 0)``:

- `Temperature` tau: ``(a, c, d) / tau``;
- `SlopeScale` s: ``c s`` (ALiBi slopes times s; Press et al. 2022);
- `DistanceBias` kappa: ``d + kappa g(i - j)``, the g of
  `jaxroll.interventions.kernels` (``log1p`` or ``unsquash``);
- `LengthScaledLogits` s (SSMax, Nakanishi 2025): ``(a, c, d) s ln n_i``, n_i
  the number of keys row i sees under the model's own mask (causal:
  ``i + 1``; a sliding window W: ``min(i + 1, W)``), as `allowed` counts them
  on the rollout side.

These are the rollout transforms of `jaxroll.interventions.kernels` read on
the real logits (arXiv 2602.16837: the rollout of the changed model is the
prediction that a measurement under the patch tests).

**Where it acts.** Families whose attention goes through transformers'
attention interface (``ALL_ATTENTION_FUNCTIONS.get_interface``: GPT-2, OPT,
GPT-NeoX, GPT-J and the rotary decoders) get their ``"eager"`` and
``"sdpa"`` entries wrapped for the duration: for the attention modules of
the patched model only, the query is multiplied by ``a`` per head and row
(``s q . k`` is then ``a s q . k`` whatever kernel follows) and ``d`` is
added to the additive mask (an explicit float mask replaces a None or
boolean one; a sliding window already in the mask stays). A module of any
other model falls through to the entry it had. BLOOM builds its scores
itself (``baddbmm(alibi, q, k)``), MPT too (``q . k`` scaled plus a
``position_bias``): a forward pre-hook on each attention scales the ALiBi
bias by c and adds d (BLOOM: to the mask; MPT: to the position bias), and a
forward hook on the fused ``query_key_value`` / ``Wqkv`` projection
multiplies its query slice by a. That hook is registered after the ones
already there: a measurement that hooks the projection first reads the
model's own q (and its recomputed rows apply the change).

**RotaryRescale** r_{t,h}: in the same wrapper, q and k (rotated by the
model at positions p) are rotated again per head by ``theta_i p (1/r - 1)``
(`rerotate`, theta from the rotary module's ``inv_freq``): head h reads
positions ``p / r``. Llama, Mistral and Qwen2 with the default rope type;
one ratio per key-value group (shared keys).

**SinkTokens** k change the input, not the model: `check` records k in
``Plan.sinks`` and `patch` does nothing for them; `jaxroll.measure.measure`
and ``jaxroll task`` prepend the k ids of `sink_token`.

**BranchScale** gamma_t: a forward hook on the module whose output is the
attention's residual update ``a`` (the layer map's ``output_projection``:
after W_O and its bias, or after a post-norm) multiplies it by gamma_t. It
is registered first (``prepend``), so that a measurement's hook on the same
module reads the scaled update.

Falcon (its own attention code, with ALiBi in the mask on one path and
twice on the other) takes `BranchScale` only; a logit change there,
slope_scale on a model without ALiBi, soft-capped logits, GPT-2's
``reorder_and_upcast_attn`` and a query scale under MPT's ``clip_qkv`` are
refused by `check`, from the config alone, before any weights load.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from types import SimpleNamespace

import numpy as np

from ..errors import ConfigError
from ._base import layer_head_values
from .kernels import DistanceBias, LengthScaledLogits, SlopeScale, Temperature
from .mixing import BranchScale
from .positions import RotaryRescale, SinkTokens

__all__ = ["LogitChange", "Patch", "Plan", "check", "parse_for", "patch", "rerotate", "sink_token", "position_limit",
           "INTERFACE_FAMILIES", "MODULE_FAMILIES"]

INTERFACE_FAMILIES = ("gpt2", "opt", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma2",
                      "gemma3_text", "phi3", "olmo2", "stablelm", "starcoder2")
"""Layer maps whose attention calls transformers' attention interface: logit changes wrap its entries."""
MODULE_FAMILIES = ("bloom", "mpt")
"""Layer maps whose attention builds its scores itself, patched by hooks on their modules."""
IMPLEMENTATIONS = ("eager", "sdpa")
"""The attention implementations a logit change wraps."""


@dataclasses.dataclass(frozen=True)
class LogitChange:
    """``z' = a(i) (s q_i . k_j) + c(i) b(i, j) + d(i, j)`` per layer and head (module docstring).

    Attributes:
        steps: ``(kind, values (T, H) float64, g)`` in the order they apply;
            kind is ``"divide"`` (tau), ``"bias_scale"`` (slope_scale),
            ``"add"`` (kappa, with g the distance function) or
            ``"log_length"`` (ssmax_scale).
        rotary_ratios: `RotaryRescale`'s ``r (T, H)`` float64, or None: q and
            k of head h in layer t are rotated at positions ``p / r_{t,h}``
            instead of p before the content logit is formed (`rerotate`).
    """

    steps: tuple
    rotary_ratios: np.ndarray | None = None

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


def _field(intervention) -> str:
    return {Temperature: "tau", SlopeScale: "slope_scale", DistanceBias: "kappa",
            LengthScaledLogits: "ssmax_scale", BranchScale: "gamma", RotaryRescale: "rotary_ratio"}[
        type(intervention)]


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
    ratios = np.asarray(layer_head_values("rotary_ratio", np.asarray(intervention.ratio), num_layers, num_heads),
                        dtype=np.float64)
    key_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    grouped = ratios.reshape(num_layers, key_heads, num_heads // key_heads)
    differ = np.argwhere(grouped.max(-1) != grouped.min(-1))
    if differ.size:
        layer, group = (int(value) for value in differ[0])
        raise ConfigError(f"rotary_ratio: layer {layer} gives different ratios to the query heads of key head "
                          f"{group} (num_key_value_heads={key_heads}, which they share); allowed: one ratio per "
                          "key-value group")
    return ratios


def check(interventions, config) -> Plan:
    """`interventions` checked against a model's transformers `config` (no weights): a `Plan`.

    Raises:
        ConfigError: one line naming the field: an intervention without a
            torch patch, slope_scale on a model without ALiBi, a logit change
            on a family that cannot be patched (Falcon) or with
            soft-capped logits, a shape that does not fit the model.
    """
    from ..measure.layer_maps import layer_map_for

    layer_map = layer_map_for(SimpleNamespace(config=config))
    num_layers = _num_layers(config)
    num_heads = int(getattr(config, layer_map.num_heads))
    steps, gammas, sinks, ratios = [], None, 0, None
    for intervention in interventions:
        if isinstance(intervention, SinkTokens):
            sinks = intervention.num_sinks
            continue
        if not isinstance(intervention, (Temperature, SlopeScale, DistanceBias, LengthScaledLogits, BranchScale,
                                         RotaryRescale)):
            raise ConfigError(f"intervention: {type(intervention).__name__} has no torch patch; allowed: "
                              "SinkTokens, RotaryRescale, Temperature, SlopeScale, DistanceBias, "
                              "LengthScaledLogits, BranchScale")
        field = _field(intervention)
        if isinstance(intervention, BranchScale):
            from .._checks import per_layer

            gammas = np.asarray(per_layer("gamma", np.asarray(intervention.gamma), num_layers), dtype=np.float64)
            continue
        if isinstance(intervention, SlopeScale) and layer_map.position != "alibi":
            raise ConfigError(f"slope_scale: a {layer_map.name} model has {layer_map.position} positions, no ALiBi "
                              "slopes; allowed: an ALiBi model (bloom, mpt, falcon with alibi)")
        if layer_map.name not in INTERFACE_FAMILIES + MODULE_FAMILIES:
            raise ConfigError(f"{field}: the {layer_map.name} family's attention cannot be patched; allowed: gamma "
                              f"alone, or a model of {', '.join(INTERFACE_FAMILIES + MODULE_FAMILIES)}")
        if getattr(config, "attn_logit_softcapping", None):
            raise ConfigError(f"{field}: a model with soft-capped attention logits (attn_logit_softcapping="
                              f"{config.attn_logit_softcapping}); allowed: gamma alone")
        clip = getattr(getattr(config, "attn_config", None), "clip_qkv", None)
        if clip and isinstance(intervention, (Temperature, LengthScaledLogits)):
            raise ConfigError(f"{field}: MPT clips its fused q/k/v (clip_qkv={clip}), so a scaled query is clipped "
                              "differently; allowed: slope_scale, kappa, gamma")
        if getattr(config, "reorder_and_upcast_attn", False):
            raise ConfigError(f"{field}: GPT-2 with reorder_and_upcast_attn bypasses the attention interface; "
                              "allowed: gamma alone, or reorder_and_upcast_attn=False")
        if isinstance(intervention, RotaryRescale):
            ratios = _rotary_ratios(intervention, config, layer_map, num_layers, num_heads)
            continue
        parameter = {Temperature: "tau", SlopeScale: "scale", DistanceBias: "kappa",
                     LengthScaledLogits: "scale"}[type(intervention)]
        values = np.asarray(layer_head_values(field, np.asarray(getattr(intervention, parameter)), num_layers,
                                              num_heads), dtype=np.float64)
        if isinstance(intervention, Temperature):
            steps.append(("divide", values, None))
        elif isinstance(intervention, SlopeScale):
            steps.append(("bias_scale", values, None))
        elif isinstance(intervention, DistanceBias):
            steps.append(("add", values, _unsquash(intervention.k) if intervention.form == "unsquash" else _log1p))
        else:
            steps.append(("log_length", values, None))
    change = LogitChange(tuple(steps), ratios) if steps or ratios is not None else None
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
    from ..measure.layer_maps import layer_map_for

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
    from .spec import parse

    interventions = parse(text)
    check(interventions, config)
    return interventions


def patch(model, interventions, resolved=None) -> "Patch":
    """``with patch(model, interventions): ...``: the model intervened inside the block, as before after it.

    `interventions` are `jaxroll.interventions` objects (`parse` gives them);
    checked by `check` here, before anything is registered. See `Patch`.
    """
    return Patch(model, interventions, resolved)


class Patch:
    """Context manager: apply `interventions` to `model` inside a ``with`` block (module docstring).

    Args:
        model: a Hugging Face ``*ForCausalLM`` of a family in the layer maps.
        interventions: `jaxroll.interventions` objects (`parse` gives them).
        resolved: the model's resolved layer map (`jaxroll.measure.layer_maps.resolve`), if at hand.

    Attributes:
        plan: the checked `Plan`; ``plan.change`` is what a recomputation of
            the attention rows applies (`jaxroll.measure.attention_rows`).

    Patches on different models nest (each falls through to the one
    before); leave them in the reverse order of entering, as ``with`` does.
    """

    def __init__(self, model, interventions, resolved=None):
        from ..measure.layer_maps import resolve

        self.model = model
        self.plan = check(list(interventions), model.config)
        self.resolved = resolved or resolve(model)
        self._handles = []
        self._entries = []  # (key, had a local entry, its previous value)
        self._pending = {}

    def __enter__(self) -> "Patch":
        try:
            self._apply()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()
        self._pending.clear()
        if self._entries:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            for key, had, previous in reversed(self._entries):
                if had:
                    ALL_ATTENTION_FUNCTIONS._local_mapping[key] = previous
                else:
                    del ALL_ATTENTION_FUNCTIONS._local_mapping[key]
            self._entries.clear()

    def _apply(self) -> None:
        plan, resolved = self.plan, self.resolved
        if plan.gammas is not None:
            for layer, module in enumerate(resolved.output_projections):
                self._handles.append(module.register_forward_hook(_branch_scale(float(plan.gammas[layer])),
                                                                  prepend=True))
        change = plan.change
        if change is None:
            return
        implementation = getattr(self.model.config, "_attn_implementation", None)
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"attn_implementation: got {implementation!r}; allowed for a logit change: "
                              f"{', '.join(IMPLEMENTATIONS)}")
        if plan.family in MODULE_FAMILIES:
            scores, layout = {"bloom": (self._bloom_scores, "interleaved"), "mpt": (self._mpt_scores, "chunks")}[
                plan.family]
            for layer, attention in enumerate(resolved.attentions):
                self._handles.append(attention.register_forward_pre_hook(scores(layer, change), with_kwargs=True))
                (projection,) = resolved.query_keys[layer]
                self._handles.append(projection.register_forward_hook(self._fused_query(layer, layout)))
            return
        rotary = None
        if change.rotary_ratios is not None:
            from ..measure.attention_rows import rotary_module

            rotary = rotary_module(self.model, resolved)
        self._wrap_interface({id(module): (module, layer) for layer, module in enumerate(resolved.attentions)},
                             change, rotary)

    def _wrap_interface(self, owned, change: LogitChange, rotary) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        local = ALL_ATTENTION_FUNCTIONS._local_mapping
        for key in IMPLEMENTATIONS:
            had = key in local
            # What get_interface returned before: the entry, or (eager) the modeling file's own function.
            previous = ALL_ATTENTION_FUNCTIONS[key] if key in ALL_ATTENTION_FUNCTIONS else None
            self._entries.append((key, had, local.get(key)))
            local[key] = _interface_wrapper(previous, owned, change, rotary)

    def _bloom_scores(self, layer: int, change: LogitChange):
        def hook(module, args, kwargs):
            alibi, mask = kwargs.get("alibi"), kwargs.get("attention_mask")
            if alibi is None or mask is None:
                raise ConfigError(f"layer {layer}: BLOOM's attention got no alibi or attention_mask keyword; allowed: "
                                  "transformers' BloomBlock call")
            batch_heads, _, kv = alibi.shape
            q = mask.shape[-2]
            rows, keys = _positions(q, kv, mask.device)
            visible = _visible(mask, rows, keys, True)
            a, c, d = change.terms(layer, rows, keys, visible.sum(-1, keepdim=True))
            if c is not None:
                heads = c.shape[1]
                scaled = alibi.double().view(-1, heads, 1, kv) * c
                kwargs["alibi"] = scaled.expand(-1, -1, q, -1).reshape(batch_heads, q, kv).to(alibi.dtype)
            if d is not None:
                kwargs["attention_mask"] = _biased_mask(mask, visible, d, mask.dtype)
            self._pending[layer] = a
            return args, kwargs
        return hook

    def _mpt_scores(self, layer: int, change: LogitChange):
        def hook(module, args, kwargs):
            bias, mask = kwargs.get("position_bias"), kwargs.get("attention_mask")
            if bias is None:
                raise ConfigError(f"layer {layer}: MPT's attention got no position_bias keyword; allowed: "
                                  "transformers' MptBlock call")
            hidden = args[0] if args else kwargs["hidden_states"]
            q = hidden.shape[1]
            kv = q if mask is None else mask.shape[-1]
            rows, keys = _positions(q, kv, hidden.device)
            # MPT's mask is boolean, True where a key is hidden.
            visible = _visible(None if mask is None else ~mask, rows, keys, True)
            counts = visible.sum(-1, keepdim=True)
            if not bool((counts == counts[:1]).all()):
                raise ConfigError("attention_mask: MPT's position bias is one per batch, and these rows see "
                                  "different numbers of keys; allowed: unpadded sequences of one length")
            a, c, d = change.terms(layer, rows, keys, counts[:1])
            # (H, 1, max_seq_len) -> its last kv keys (as MPT slices it), changed to (H, q, kv).
            changed = bias[:, :, bias.shape[-1] - kv:].double()[None]
            changed = changed if c is None else changed * c
            changed = changed if d is None else changed + d
            kwargs["position_bias"] = changed[0].expand(-1, q, -1).to(bias.dtype)
            self._pending[layer] = a
            return args, kwargs
        return hook

    def _fused_query(self, layer, layout: str):
        def hook(module, args, output):
            a = self._pending.pop(layer, None)
            if a is None:
                return None
            batch, length, _ = output.shape
            factor = _query_slot_factor(a, batch, length, layout, output.dtype)
            return (output.view(*factor.shape[:4], -1) * factor).view(batch, length, -1)
        return hook


def _query_slot_factor(a, batch, length, layout: str, dtype):
    """a (per head and row) on the query slot of a fused q/k/v output, 1 on the key and value slots.

    ``"interleaved"`` (BLOOM: ``(H, 3, d)`` per token, `layer_spec.split_fused_interleaved`) gives
    ``(B, N, H, 3, 1)``; ``"chunks"`` (MPT: ``(3, H, d)``, `layer_spec.split_fused_chunks`) ``(B, N, 3, H, 1)``.
    """
    import torch

    heads = a.shape[1]
    query = a[..., 0].transpose(1, 2).expand(batch, length, heads)  # (B, N, H)
    ones = torch.ones_like(query)
    slots = torch.stack((query, ones, ones), dim=-1 if layout == "interleaved" else 2)
    return slots[..., None].to(dtype)


def _branch_scale(gamma: float):
    def hook(module, args, output):
        return output * gamma
    return hook


def _positions(q: int, kv: int, device):
    import torch

    # With a cache the q queries are the last q of the kv positions.
    return torch.arange(kv - q, kv, device=device), torch.arange(kv, device=device)


def _visible(mask, rows, keys, is_causal: bool):
    """Which keys each row sees ``(B|1, 1|H, q, k)`` bool, from an additive, boolean or absent mask."""
    import torch

    if mask is None:
        if not is_causal:
            return torch.ones(1, 1, rows.numel(), keys.numel(), dtype=torch.bool, device=rows.device)
        return (keys[None, :] <= rows[:, None])[None, None]
    if mask.dtype == torch.bool:
        return mask
    # Hidden entries hold the dtype's minimum (or -inf); visible ones a finite bias near 0.
    return mask > torch.finfo(mask.dtype).min / 2


def _biased_mask(mask, visible, d, dtype):
    """The additive mask plus d on the visible entries, in `dtype` (hidden entries keep the dtype's minimum)."""
    import torch

    if mask is None or mask.dtype == torch.bool:
        base = torch.zeros(visible.shape, dtype=torch.float64, device=visible.device).masked_fill(
            ~visible, torch.finfo(dtype).min)
    else:
        base = mask.double()
    return torch.where(visible, base + d, base).to(dtype)


def _interface_wrapper(previous, owned, change, rotary):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        entry = owned.get(id(module))
        target = previous if previous is not None else sys.modules[type(module).__module__].eager_attention_forward
        if entry is None or entry[0] is not module:
            return target(module, query, key, value, attention_mask, *args, **kwargs)
        query, key, attention_mask = _changed(change, entry[1], query, key, attention_mask,
                                              kwargs.get("is_causal", getattr(module, "is_causal", True)), rotary)
        return target(module, query, key, value, attention_mask, *args, **kwargs)
    return attention


def rerotate(x, positions, inv_freq, ratios):
    """x rotated at positions ``p`` (Hugging Face's ``x cos + rotate_half(x) sin``) -> rotated at ``p / r_h``.

    A rotation by the difference of the angles, ``theta_i p (1 / r_h - 1)``
    with ``theta_i`` the rotary module's `inv_freq` ``(d / 2,)``: rotations
    of one plane compose by adding angles. `x` ``(B, H, n, d)``, `positions`
    ``(n,)``, `ratios` ``(H,)`` (one per head of x: key heads take their
    group's). Computed in float64, returned in x's dtype. Only for the
    default rope type, where the tables carry no ``attention_scaling``.
    """
    import torch

    ratios = torch.as_tensor(ratios, dtype=torch.float64, device=x.device)
    angles = (positions.to(torch.float64)[None, :, None] * inv_freq.to(device=x.device, dtype=torch.float64)
              [None, None, :] * (1.0 / ratios - 1.0)[:, None, None])  # (H, n, d/2)
    angles = torch.cat((angles, angles), dim=-1)
    wide = x.double()
    half = wide.shape[-1] // 2
    turned = torch.cat((-wide[..., half:], wide[..., :half]), dim=-1)
    return (wide * angles.cos() + turned * angles.sin()).to(x.dtype)


def _changed(change: LogitChange, layer: int, query, key, attention_mask, is_causal: bool, rotary=None):
    """The query scaled by a and the mask plus d, for one attention call of `layer` (query ``(B, H, q, d)``).

    Here the rotary families' q and k are already rotated at their positions
    (``_positions``: 0..n-1, the last q of them the queries): a rotary
    rescale re-rotates both per head to ``p / r`` (`rerotate`, with the
    angles of `rotary`'s ``inv_freq``); the key heads, shared by groups of
    query heads, take their group's ratio (`check` refuses ratios that
    differ within a group).
    """
    rows, keys = _positions(query.shape[2], key.shape[2], query.device)
    if change.rotary_ratios is not None:
        ratios = change.rotary_ratios[layer]
        query = rerotate(query, rows, rotary.inv_freq, ratios)
        key = rerotate(key, keys, rotary.inv_freq, ratios[:: ratios.shape[0] // key.shape[1]])
    visible = _visible(attention_mask, rows, keys, is_causal)
    a, _, d = change.terms(layer, rows, keys, visible.sum(-1, keepdim=True))
    if a is not None:
        query = (query.double() * a).to(query.dtype)
    if d is not None:
        attention_mask = _biased_mask(attention_mask, visible, d, query.dtype)
    return query, key, attention_mask
