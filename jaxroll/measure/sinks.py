"""Attention-sink statistics (Gu et al. 2024, arXiv 2410.10781), registered as ``"sinks"``.

From the attention probabilities ``A^{l,h}[i, k]`` (query i reads key k,
causal, N tokens) of every layer l and head h:

- received attention at key k, normalised by the queries that can see it,
  ``alpha^{l,h}(k) = (1 / (N - k)) sum_{i >= k} A^{l,h}[i, k]``, averaged
  over sequences: ``sink_received (L, H, N)``;
- the sink rate ``sink_rate(k) = (1 / (L H)) sum_{l,h} 1[alpha^{l,h}(k) > eps]``,
  ``eps = 0.3`` (Gu et al.'s threshold), ``(N,)``; ``sink_rate[0]`` is the
  share of heads with a sink at the first token. Computed from alpha
  averaged over sequences (means merge exactly across processes); the
  per-sequence rate at the first token is ``sink_rate_first_per_sequence (S,)``;
- the first-k share ``sink_first_share(k) = mean_{l,h,i} sum_{j < k} A^{l,h}[i, j]``
  (mean over layers, heads and all N queries; index k - 1 holds the first k
  tokens), ``(N,)``, and its boost over uniform causal attention
  ``sink_first_boost(k) = sink_first_share(k) / u(k)`` with
  ``u(k) = mean_i min(k, i + 1) / (i + 1)`` (row i spreads 1 over i + 1 keys).

Reads the probabilities as row chunks recomputed from q and k
(`_observe_rows`, the same sums chunk by chunk: `jaxroll.measure.attention_rows`,
on an efficient attention and on an eager one whose logit the family states
exactly), or, where the rows cannot be recomputed exactly, from the hooked
eager probabilities (`_observe`).
"""

from __future__ import annotations

import numpy as np

from .registry import Shapes, Statistic, register_statistic

__all__ = ["SINK_EPSILON", "uniform_first_share"]

SINK_EPSILON = 0.3
"""The attention-sink threshold epsilon = 0.3 of Gu et al. (2024, arXiv 2410.10781)."""


def uniform_first_share(length: int) -> np.ndarray:
    """``u(k) = mean_i min(k, i + 1) / (i + 1)`` for k = 1..N, ``(N,)``: uniform causal rows."""
    i = np.arange(length)[:, None]
    k = np.arange(1, length + 1)[None, :]
    return (np.minimum(k, i + 1) / (i + 1)).mean(axis=0)


def _allocate(shape: Shapes) -> dict:
    return {"sink_received_sum": np.zeros((shape.layers, shape.heads, shape.length)),
            "sink_first_share_sum": np.zeros(shape.length),
            "sink_rate_first_per_sequence": np.full(shape.sequences, np.nan)}


def _observe(state, kind, layer, p):
    p = p[0].double()  # (H, N, N), rows: queries
    n = p.shape[-1]
    # alpha(k) = sum_{i >= k} A[i, k] / (N - k): causal rows are 0 above the diagonal.
    received = p.sum(dim=1) / _queries_seeing(n, p)
    share = p.cumsum(dim=-1).mean(dim=(0, 1))  # (N,): mean over heads and queries
    state.setdefault("received", {})[layer] = received.cpu().numpy()
    state.setdefault("share", {})[layer] = share.cpu().numpy()


def _observe_rows(state, layer, start, rows):
    rows = rows[0]  # (H, c, N): queries start .. start + c - 1
    n = rows.shape[-1]
    partial = state.setdefault("partial", {})
    received, share = partial.get(layer, (0.0, 0.0))
    received = received + rows.sum(dim=1)  # sum over these queries, per key
    share = share + rows.sum(dim=(0, 1)).cumsum(dim=-1)  # the cumulative sum after the sum: no (H, c, N) copy
    if start + rows.shape[1] < n:
        partial[layer] = (received, share)
        return
    partial.pop(layer, None)
    state.setdefault("received", {})[layer] = (received / _queries_seeing(n, received)).cpu().numpy()
    state.setdefault("share", {})[layer] = (share / (rows.shape[0] * n)).cpu().numpy()


def _queries_seeing(n, like):
    import torch

    return torch.arange(n, 0, -1, dtype=like.dtype, device=like.device)  # N - k


def _accumulate(sums, state, index):
    received = np.stack([state["received"][layer] for layer in sorted(state["received"])])
    sums["sink_received_sum"] += received
    sums["sink_first_share_sum"] += np.mean([state["share"][layer] for layer in sorted(state["share"])], axis=0)
    sums["sink_rate_first_per_sequence"][index] = float(np.mean(received[:, :, 0] > SINK_EPSILON))


def _finish(sums, count, shape: Shapes) -> dict:
    received = sums["sink_received_sum"] / count
    share = sums["sink_first_share_sum"] / count
    return {"sink_received": received,
            "sink_rate": (received > SINK_EPSILON).mean(axis=(0, 1)).astype(np.float64),
            "sink_first_share": share,
            "sink_first_boost": share / uniform_first_share(shape.length),
            "sink_rate_first_per_sequence": sums["sink_rate_first_per_sequence"],
            "sink_epsilon": np.asarray(SINK_EPSILON)}


def _summary(outputs: dict) -> str:
    rate, share, boost = outputs["sink_rate"], outputs["sink_first_share"], outputs["sink_first_boost"]
    return (f"sinks (eps {SINK_EPSILON}): {100 * rate[0]:.3g}% of (layer, head) pairs sink at token 0; "
            f"token 0 gets {share[0]:.3g} of attention ({boost[0]:.3g}x uniform)")


register_statistic(Statistic(
    name="sinks", hooks=("probabilities",), allocate=_allocate, observe=_observe, accumulate=_accumulate,
    finish=_finish, per_sequence=("sink_rate_first_per_sequence",), needs_eager=True, observe_rows=_observe_rows,
    memory=lambda shape: 8 * (shape.layers * shape.heads * shape.length + shape.length + shape.sequences),
    summary=_summary))
