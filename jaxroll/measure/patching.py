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
positions ``p / r``. Llama, Mistral and Qwen2 with the default rope type.
Under grouped-query attention each query head is rotated at its own ratio
and the keys of a group, shared by its query heads, at the ratio of the
group's first head (`LogitChange.key_rotary_ratios`), as Ms-PoE's code runs
it (VITA-Group/Ms-PoE, ``sample_rotary_emb``: ``cos[::num_key_value_groups]``).
Query head h of group g then scores ``q_i^T R(theta (p_i / r_h - p_j / r_g)) k_j``:
a function of the distance alone only where ``r_h = r_g``.

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

import contextlib
import sys

from ..errors import ConfigError
from .torch_plan import MODULE_FAMILIES, LogitChange, check

__all__ = ["Patch", "patch", "rerotate", "interface_entry"]

IMPLEMENTATIONS = ("eager", "sdpa")
"""The attention implementations a logit change wraps."""


def patch(model, interventions, resolved=None) -> "Patch":
    """``with patch(model, interventions): ...``: the model intervened inside the block, as before after it.

    `interventions` are `jaxroll.interventions` objects (`parse` gives them);
    checked by `check` here, before anything is registered. See `Patch`.
    """
    return Patch(model, interventions, resolved)


@contextlib.contextmanager
def interface_entry(key: str, wrap):
    """While inside, transformers' attention interface answers `key` with ``wrap(previous)``, ``previous`` what
    it answered before (the entry, or None where it had none: eager's modeling-file function); the entry as it
    was (set or absent) comes back on exit, also after an error."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    had, before = key in local, local.get(key)
    previous = ALL_ATTENTION_FUNCTIONS[key] if key in ALL_ATTENTION_FUNCTIONS else None
    local[key] = wrap(previous)
    try:
        yield
    finally:
        if had:
            local[key] = before
        else:
            local.pop(key, None)


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
        from .layer_maps import resolve

        self.model = model
        self.plan = check(list(interventions), model.config)
        self.resolved = resolved or resolve(model)
        self._handles = []
        self._entries = contextlib.ExitStack()  # the attention interface entries replaced (interface_entry)
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
        self._entries.close()  # in reverse order of entering

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
            from .attention_rows import rotary_module

            rotary = rotary_module(self.model, resolved)
        self._wrap_interface({id(module): (module, layer) for layer, module in enumerate(resolved.attentions)},
                             change, rotary)

    def _wrap_interface(self, owned, change: LogitChange, rotary) -> None:
        for key in IMPLEMENTATIONS:
            self._entries.enter_context(interface_entry(
                key, lambda previous: _interface_wrapper(previous, owned, change, rotary)))

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
    angles of `rotary`'s ``inv_freq``); the key heads (``(B, H_kv, k, d)``,
    before transformers repeats them), shared by groups of query heads, take
    the ratio of their group's first query head (`LogitChange.key_rotary_ratios`).
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
