"""Mean attention by offset (a Toeplitz summary), registered as ``"attention_offsets"``: O(N) memory per head.

For layer l, head h and a sequence of N tokens with attention probabilities
``A[i, j]`` (query i, key j <= i), the mean attention at offset
``o = i - j``,

    a_{l,h}(o) = (1 / (N - o)) sum_{i >= o} A[i, i - o],    o = 0 .. N - 1,

averaged over sequences: ``attention_offsets (L, H, N)``. Accumulated row
chunk by row chunk (the rows recomputed from q and k under an efficient
attention or an eager one whose logit the family states exactly,
`jaxroll.measure.attention_rows`; the hooked eager probabilities only where
it does not): no ``(N, N)`` array is kept, and the working memory is one
chunk of rows and one zero-padded copy of it per head (`offset_sums`). The default statistic
of a model without ALiBi beyond `registry.DENSE_DEFAULT_BYTES`
(`registry.default_stats`): its measurement's config.yaml is the
`offset_rollout_model` below. A rotary or learned-position model's mean
attention is close to a function of the offset when content averages out;
`offset_rollout_model` turns the summary into a rollout whose layer kernel is

    K_t[i, j] = sum_h w_h a_{t,h}(i - j) / sum_{o <= i} a_{t,h}(o),   w_h = 1 / H,

(each row renormalised over the offsets it can see: the row-normaliser the
summary needs is the prefix sum of ``a``), a `TableKernel` with scores
``log a``, multiplied by FFT: a prediction at N = 32k without
``(T, N, N)`` arrays. How far it is from the dense measured-kernel rollout
is a property of the model (docs/measuring.md).
"""

from __future__ import annotations

import numpy as np

from .registry import Shapes, Statistic, register_statistic

__all__ = ["offset_sums", "offset_rollout_model"]

FLOOR = 1e-30
"""The smallest mean attention turned into a score (``log`` of it): offsets never attended keep a finite score."""


def offset_sums(start: int, rows):
    """``sum_i A[i, i - o]`` over the rows ``start ..`` of ``rows (H, c, N)``: ``(H, N)`` (torch, float64).

    Row i's entry at key ``j = i - o`` for every offset o, offsets beyond i
    (keys before 0) counting 0, read without an index: the rows are copied
    behind N zeros, ``P[h, r, N + j] = A[start + r, j]``, so that
    ``A[start + r, start + r - o] = P[h, r, start + r + 1 + p]`` with
    ``p = N - 1 - o``, a strided view (strides ``2 c N, 2 N + 1, 1``) whose
    sum over r is the sums by p, read backwards. One ``(H, c, 2 N)`` buffer.
    """
    import torch

    heads, count, n = rows.shape
    padded = rows.new_empty((heads, count, 2 * n))
    padded[..., :n].zero_()
    padded[..., n:].copy_(rows)
    diagonals = padded.as_strided((heads, count, n), (2 * count * n, 2 * n + 1, 1), start + 1)
    return torch.flip(diagonals.sum(dim=1), dims=(-1,))


def _allocate(shape: Shapes) -> dict:
    return {"attention_offsets_sum": np.zeros((shape.layers, shape.heads, shape.length))}


def _observe_rows(state, layer, start, rows):
    rows = rows[0].double()  # (H, c, N)
    total = state.setdefault("partial", {}).get(layer, 0.0) + offset_sums(start, rows)
    n = rows.shape[-1]
    if start + rows.shape[1] < n:
        state["partial"][layer] = total
        return
    state["partial"].pop(layer, None)
    counts = np.arange(n, 0, -1, dtype=np.float64)  # N - o queries see offset o
    state.setdefault("offsets", {})[layer] = total.cpu().numpy() / counts


def _observe(state, kind, layer, p):
    _observe_rows(state, layer, 0, p)


def _accumulate(sums, state, index):
    sums["attention_offsets_sum"] += np.stack([state["offsets"][t] for t in sorted(state["offsets"])])


def _finish(sums, count, shape: Shapes) -> dict:
    return {"attention_offsets": sums["attention_offsets_sum"] / count}


def offset_rollout_model(offsets, lambdas, sequence_length: int | None = None):
    """A `RolloutModel` with the Toeplitz kernel of `offsets` ``(L, H, N)`` (module docstring).

    `lambdas` ``(L,)`` in [0, 1] (clipped). Defined for lengths up to the
    measured N.
    """
    from ..kernel_types import TableKernel
    from ..model import RolloutModel

    offsets = np.asarray(offsets, dtype=np.float64)
    layers, heads, n = offsets.shape
    scores = np.log(np.maximum(offsets, FLOOR))
    kernel = TableKernel.create(num_layers=layers, num_heads=heads, offset_scores=scores[:, :, 1:] if n > 1
                                else scores, diagonal_scores=scores[:, :, 0])
    return RolloutModel.create(kernel=kernel, lambdas=np.clip(np.asarray(lambdas, dtype=np.float64), 0, 1),
                               sequence_length=sequence_length or n)


def _summary(offsets) -> str:
    mean = offsets.mean(axis=(0, 1))
    return (f"attention_offsets: mean attention {mean[0]:.3g} at offset 0, "
            f"{mean[min(1, mean.size - 1)]:.3g} at offset 1, {mean[-1]:.3g} at offset N - 1")


register_statistic(Statistic(
    name="attention_offsets", hooks=("probabilities",), allocate=_allocate, observe=_observe,
    accumulate=_accumulate, finish=_finish, needs_eager=True, observe_rows=_observe_rows,
    memory=lambda shape: 8 * shape.layers * shape.heads * shape.length,
    summary=lambda outputs: _summary(outputs["attention_offsets"])))
