"""Interventions on positions: a rotary position rescale per head, and attention-sink tokens.

`RotaryRescale` changes what distance a rotary head reads (Ms-PoE, position
interpolation): on the theory's relative kernel ``s_{t,h}(i, j) = f_{t,h}(i - j)``
the distance is divided by a ratio per head. `SinkTokens` prepends k tokens
to every sequence (StreamingLLM's attention sinks): the model runs at length
n + k and the profile over the n original positions is read off the end.
Both transforms keep arXiv 2602.16837's rollout
``R_t = (1 - lambda_t) I + lambda_t A_t`` (``A[i, j]`` the weight with which
token i reads token j); each class says whether its transform is exact in the
theory or an approximation, and which.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import check_positive_int, check_range, is_concrete
from ..engine.offset import table_at_distances
from ..errors import ConfigError
from ..model import RolloutModel, check_model
from ._base import AbstractIntervention, checked_parameter
from .registry import register_intervention

__all__ = ["RotaryRescale", "SinkTokens", "ms_poe_ratios", "ms_poe_order", "table_at_distances"]


@register_intervention
class RotaryRescale(AbstractIntervention):
    """Rotary positions compressed by ``r_{t,h} > 0`` per head: the angle at distance m becomes the angle at m / r.

    Ms-PoE (Zhang et al. 2024, "Found in the Middle", arXiv 2403.04797,
    github.com/VITA-Group/Ms-PoE) divides the position indices of head h by
    its own ratio ``r_h >= 1`` (`ms_poe_ratios`); position interpolation
    (Chen et al. 2023, arXiv 2306.15595) is the one-ratio case. `ratio` is a
    number, ``(H,)``, ``(T, 1)`` or ``(T, H)`` (a ``(T,)`` array is per layer
    unless T == H); ``r > 1`` compresses distances (head h sees far tokens as
    nearer), ``r < 1`` stretches them.

    Rollout transform, on the offset kernel of a rotary model, whose head h
    scores a causal pair by its distance, ``s_{t,h}(i, j) = f_{t,h}(i - j)``
    with ``f(0) = d`` the diagonal (content) score:

        f'_{t,h}(k) = f_{t,h}(k / r_{t,h})   (k >= 1),   f'_{t,h}(0) = d_{t,h}.

    - `PowerKernel` (``f(k) = -m k^alpha``, the form read at real distances):
      ``f'(k) = -m (k / r)^alpha``, again a `PowerKernel`, with slopes
      ``m' = m r^(-alpha)``; defined at every length.
    - `TableKernel` (``f(k)`` at k = 1..K): the table read at ``k / r`` by
      linear interpolation between integer distances, held at ``f(1)`` below
      distance 1 (`table_at_distances`); again a `TableKernel` of K offsets.
      A ratio below 1 reads distances up to ``(n - 1) / r``, which the table
      must reach at the model's length n (refused otherwise; under tracing the
      value is held at ``f(K)``).

    An APPROXIMATION: a rotary model's logits ``q_i^T R_{(i - j) theta} k_j``
    depend on content as well as distance, and its measured offset kernel is
    a mean over sequences (and over heads, when fitted with fewer heads), so
    the rescaled mean is not the mean of the rescaled model; the values
    between integer distances (the table's interpolation, the power form's
    continuation) are assumed, not measured. The diagonal score stays on the
    diagonal (distance 0 is 0 at every ratio). Differentiable in `ratio`
    (the table's interpolation has kinks where k / r is an integer).
    Refused on ALiBi kernels (no rotary positions) and on measured dense
    kernels (not a function of distance; `jaxroll fit-kernel` fits one).

    Under grouped-query attention, ratios that differ inside a key-value
    group are a second APPROXIMATION. The patched model
    (`jaxroll.measure.patching`, as Ms-PoE's code) rotates the group's shared
    keys once, at the ratio ``r_g`` of its first query head, and each query at
    its own ``r_h``, so head h scores ``q_i^T R(theta (i / r_h - j / r_g)) k_j``,
    and ``i / r_h - j / r_g = (i - j) / r_h + j (1 / r_h - 1 / r_g)``: a
    distance read at ``1 / r_h`` plus a turn that grows with the key's
    absolute position, which no kernel of distance holds. The transform here
    keeps the first term and drops the second (exact for the group's first
    head and where a group shares one ratio).
    """

    name, parameter, neutral, order, lowest = "rotary_ratio", "ratio", 1.0, 10, (0.0, True)
    torch_change = "rotary"  # before anything that changes the distance scores

    ratio: Float[Array, "..."]

    def __init__(self, ratio):
        self.ratio = checked_parameter("rotary_ratio", ratio, 0.0, low_open=True)

    def apply(self, model: RolloutModel) -> RolloutModel:
        kernel = check_model(model).kernel.read_at_distances(self.ratio, model.sequence_length, "rotary_ratio")
        return dataclasses.replace(model, kernel=kernel)


def ms_poe_ratios(num_heads: int, low: float = 1.2, high: float = 1.8, order=None) -> Float[Array, " heads"]:
    """Ms-PoE's ratios per head: ``r_k = low + (high - low) k / H`` (k = 0..H-1), head h taking ``r_{order[h]}``.

    As in Ms-PoE's code (VITA-Group/Ms-PoE, ``utils/modify_arch/llama.py``,
    ``MsPoELlamaRotaryEmbedding``: ``min + (max - min) * arange(H) / H``, so
    `high` itself is never reached; defaults 1.2 and 1.8 as in their
    ``inference.py`` and ``src/ms_poe.sh``, arXiv 2403.04797). Their heads
    read their tables through ``head_order`` (``cos[head_order]``): head h
    takes ratio ``r_{head_order[h]}``, where ``head_order`` is the argsort of
    minus each head's outlier fraction (the share of the last query row's
    attention weights above 3x the row mean, measured once on the first
    input; `ms_poe_order`). Give that permutation as `order` (default: head h
    takes ``r_h``).
    Their scripts rescale layers 2..31 of a 32-layer model and leave layers 0
    and 1 alone: a ``(T, H)`` ratio with rows of ones there.

    Returns:
        ``(H,)``, the ratios for `RotaryRescale`.
    """
    num_heads = check_positive_int("num_heads", num_heads)
    if is_concrete(low) and is_concrete(high):
        check_range("low", np.asarray(low, dtype=np.float64), 0.0, None, low_open=True)
        check_range("high", np.asarray(high, dtype=np.float64), float(low), None)
    ratios = low + (high - low) * jnp.arange(num_heads) / num_heads
    if order is None:
        return ratios
    order = np.asarray(order)
    if order.shape != (num_heads,) or not np.array_equal(np.sort(order), np.arange(num_heads)):
        raise ConfigError(f"order: got {order.tolist()!r:.60}; allowed: a permutation of 0..{num_heads - 1}")
    return ratios[order]


def ms_poe_order(query, key, *, threshold: float = 3.0, max_tokens: int = 4096) -> np.ndarray:
    """Ms-PoE's head order: heads by their outlier fraction on the last row, most first, ``(H,)`` int.

    As VITA-Group/Ms-PoE's ``_head_wise_statistics`` and ``_calculate_outlier``
    compute it, once, on the first input: from the layer's *unrotated*
    projections of one sequence, `query` ``(H, n, d)`` and `key`
    ``(H_kv, n, d)`` (each key head shared by ``H / H_kv`` query heads), cut
    to their first ``m = min(n, max_tokens)`` tokens (the later
    ``mspoe_models.py`` caps them at 4,096), the last row's weights
    ``w_h(j) = softmax_j(q_{h, m-1} . k_{g(h), j} / sqrt(d))``, j < m, and the
    outlier fraction ``o_h = #{j : w_h(j) > threshold / m} / m`` (the row's mean
    is 1 / m); the order is ``argsort(-o)`` (ties: the lower head first, a
    stable sort; the authors' torch argsort leaves ties unspecified). Give it
    to `ms_poe_ratios` as `order`.
    """
    query, key = np.asarray(query, dtype=np.float64), np.asarray(key, dtype=np.float64)
    if query.ndim != 3 or key.ndim != 3 or key.shape[1:] != query.shape[1:] or query.shape[0] % key.shape[0]:
        raise ConfigError(f"query, key: shapes {query.shape}, {key.shape}; allowed: (H, n, d) and (H_kv, n, d) "
                          "with H_kv dividing H")
    m = min(query.shape[1], check_positive_int("max_tokens", max_tokens))
    keys = np.repeat(key[:, :m], query.shape[0] // key.shape[0], axis=0)
    logits = np.einsum("hd,hjd->hj", query[:, m - 1], keys) / math.sqrt(query.shape[2])
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    outliers = (weights > threshold / m).mean(-1)
    return np.argsort(-outliers, kind="stable")


@register_intervention
class SinkTokens(AbstractIntervention):
    """k tokens prepended to every sequence (attention sinks): the model at length n + k, read over the n originals.

    StreamingLLM (Xiao et al. 2023, arXiv 2309.17453) keeps the first tokens
    of a stream as "attention sinks", and a learned sink token prepended in
    training serves the same purpose. In the rollout the sinks are positions
    ``0..k-1`` of the same model at length n + k: ``apply(model)`` returns
    the model with ``sequence_length = n + k`` (`length`), kernel and lambdas
    unchanged, and ``influence`` of it is the profile
    ``p_T(j) = P_T[n + k - 1, j]`` whose first k entries are the sinks.
    `split` reads it as the sinks' mass and the profile over the n original
    positions, renormalised:

        sink_mass = sum_{j < k} p_T(j),   p'(j) = p_T(k + j) / sum_{i >= k} p_T(i),   j = 0..n-1.

    Exact in the theory for a kernel of positions alone (ALiBi + content,
    relative kernels): the sinks are tokens like any other, at the front. A
    model of real sinks: an approximation where the sinks' keys draw extra
    attention by their content (a kernel of positions does not see it).
    `num_sinks` is an integer >= 0 (0: the identity, `split` returns the
    profile unchanged), static: it sets a shape, so it takes no gradient and
    does not `vmap`. A measured dense kernel of N positions takes n + k <= N.
    """

    name, parameter, neutral, order, changes = "sinks", "num_sinks", 0, 0, "length"  # first: sets the length
    lowest, shapes, torch_change = (0.0, False), ("global",), "sinks"

    def record(self) -> dict:
        return {"sinks": self.num_sinks}

    num_sinks: int = eqx.field(static=True)

    def __init__(self, num_sinks):
        self.num_sinks = _sink_count(num_sinks)

    def length(self, n: int) -> int:
        """``n + k``: the length the model runs at with the sinks in front of n tokens."""
        return n + self.num_sinks

    def apply(self, model: RolloutModel) -> RolloutModel:
        model = check_model(model)
        n = self.length(model.sequence_length)
        try:
            kernel = model.kernel.prepend_sinks(self.num_sinks, model.sequence_length)
        except ConfigError as error:  # a measured kernel of N positions: name the route that fits in it
            k, size, kept = self.num_sinks, model.kernel.default_length(), model.sequence_length
            here = f", or --length {size - k} or less with this one" if size > k else ""
            raise ConfigError(f"sinks: {k} sink tokens make the length {n}; {error} (for n = {kept}: a baseline "
                              f"measured at N >= {n}, then jaxroll rollout BASE/config.yaml --length {kept} "
                              f"--intervene sinks={k}{here})") from None
        return dataclasses.replace(model, kernel=kernel, sequence_length=n)

    def split(self, profile: Float[Array, "... length"]) -> tuple[Float[Array, "..."], Float[Array, "... n"]]:
        """``(sink_mass, profile over the n original positions renormalised)`` of a profile at length n + k.

        The mass is the sinks' share of the profile's total; without sinks it
        is 0 and the profile comes back unchanged. Leading axes are batch axes.
        """
        profile = jnp.asarray(profile)
        k = self.num_sinks
        if profile.ndim < 1 or profile.shape[-1] <= k:
            raise ConfigError(f"profile: got shape {profile.shape}; allowed: a last axis longer than the "
                              f"{k} sinks")
        if k == 0:
            return jnp.zeros(profile.shape[:-1], profile.dtype), profile
        sinks, originals = profile[..., :k], profile[..., k:]
        original_mass = jnp.sum(originals, axis=-1, keepdims=True)
        sink_mass = jnp.sum(sinks, axis=-1)
        return sink_mass / (sink_mass + original_mass[..., 0]), originals / original_mass


def _sink_count(value) -> int:
    """An integer >= 0 (an integral float, as ``--intervene sinks=4`` reads, included); one line otherwise."""
    integral = (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
                and math.isfinite(value) and value == int(value))
    if not integral or value < 0:
        raise ConfigError(f"sinks: got {int(value) if integral else value!r:.60}; allowed: an integer >= 0")
    return int(value)
