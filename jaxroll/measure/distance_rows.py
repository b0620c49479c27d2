"""The mean attention rows under distance scores at a grid of kappa, registered as ``"attention_distances"``: the
distance tables of a `jaxroll.kernel_types.GainTableKernel` (and of an ALiBi model's `AnchoredTableKernel`).

For every layer t, each tabulated form ``g_f`` (`jaxroll.measure.registry.DISTANCE_FORMS`), each kappa
``kappa_k`` of `jaxroll.measure.registry.DISTANCE_GRID` and the attention probabilities ``alpha^s_{t,h}`` of
sequence s, head h (N x N, causal):

    alpha_k(i, j)          = alpha(i, j) e^{kappa_k g_f(i - j)} / sum_l alpha(i, l) e^{kappa_k g_f(i - l)}
                             (the row with ``kappa_k g_f(i - j)`` added to its logits)
    distance_rows[t, f, k] = mean_{s,h} alpha_k                                        (L, F, K, N, N)
    distance_scores[f]     = g_f(m), m = 0..N-1                                         (F, N)
    distance_grid          = (kappa_1, ..., kappa_K),   distance_keys = the forms' names (F,)

The mean of the reweighted rows, not the reweighted mean: each sequence's row keeps its own normaliser
(`jaxroll.engine.distance_tables`; docs/interventions.md, "Rows under a distance score"). Float64; the rows
are those ``attention_gains`` reads (recomputed from q and k in row chunks, or hooked), one state per batch.
"""

from __future__ import annotations

import numpy as np

from ..engine.distance_tables import distance_key
from .registry import DISTANCE_FORMS, DISTANCE_GRID, Shapes, Statistic, distance_table_bytes, register_statistic
from .torch_plan import _DISTANCES

__all__ = ["distance_sums", "distance_scores"]


def distance_scores(length: int) -> np.ndarray:
    """``g_f(m)`` for every form of `DISTANCE_FORMS` at m = 0..length-1, ``(F, length)`` float64."""
    import torch

    distance = torch.arange(length, dtype=torch.float64)
    return np.stack([_DISTANCES[form](k)(distance).numpy() for form, k in DISTANCE_FORMS])


def distance_sums(rows, start: int, grid=None):
    """``(F, K, c, N)``: rows ``(B, H, c, N)`` (probabilities of query rows ``start .. start + c - 1``, float64)
    reweighted by ``e^{kappa g_f(i - j)}`` for every form (`distance_scores`) and kappa, renormalised, summed
    over the batch and averaged over heads; `grid` the kappas (default `DISTANCE_GRID`)."""
    import torch

    grid = DISTANCE_GRID if grid is None else grid
    heads, count, n = rows.shape[1], rows.shape[2], rows.shape[3]
    query = torch.arange(start, start + count, device=rows.device)[:, None]
    offsets = (query - torch.arange(n, device=rows.device)[None, :]).clamp_(min=0)
    scores = torch.as_tensor(distance_scores(n), dtype=rows.dtype, device=rows.device)  # N lgammas: negligible
    kappas = torch.as_tensor(grid, dtype=rows.dtype, device=rows.device)[:, None, None]
    out = rows.new_empty((scores.shape[0], len(grid), count, n))
    for form in range(scores.shape[0]):
        # e^{kappa g(i - j)} for every kappa, (K, c, N); above the diagonal the rows are 0, any finite g will do.
        # sum_{b,h} alpha w / Z = w sum_{b,h} alpha / Z: two contractions over the rows instead of a changed copy
        # per kappa (the normalisers Z (K, B, H, c) are row sums, each a short dot product).
        weights = torch.exp(kappas * scores[form][offsets])
        normalisers = torch.einsum("bhcn,kcn->kbhc", rows, weights)
        out[form] = weights * torch.einsum("bhcn,kbhc->kcn", rows, normalisers.reciprocal()) / heads
    return out


def _allocate(shape: Shapes) -> dict:
    size = (shape.layers, len(DISTANCE_FORMS), len(DISTANCE_GRID), shape.length, shape.length)
    return {"distance_rows_sum": np.zeros(size)}


def _observe_rows(state, layer, start, rows):
    n = rows.shape[-1]
    sums = distance_sums(rows, start)
    if layer not in state:
        state[layer] = sums.new_zeros((len(DISTANCE_FORMS), len(DISTANCE_GRID), n, n))
    state[layer][:, :, start:start + rows.shape[2]] += sums


def _observe(state, kind, layer, p):
    _observe_rows(state, layer, 0, p.double())


def _accumulate(sums, state, index):
    del index
    for layer in sorted(state):
        sums["distance_rows_sum"][layer] += state[layer].cpu().numpy()


def _finish(sums, count, shape: Shapes) -> dict:
    return {"distance_rows": sums["distance_rows_sum"] / count, "distance_scores": distance_scores(shape.length),
            "distance_grid": np.asarray(DISTANCE_GRID, dtype=np.float64),
            "distance_keys": np.asarray([distance_key(form, k) for form, k in DISTANCE_FORMS])}


def _summary(outputs: dict) -> str:
    grid, keys = outputs["distance_grid"], outputs["distance_keys"]
    return (f"attention_distances: mean rows under {len(keys)} distance forms ({', '.join(map(str, keys))}) "
            f"at {len(grid)} kappas ({grid[0]:.3g} to {grid[-1]:.3g})")


register_statistic(Statistic(
    name="attention_distances", hooks=("probabilities",), allocate=_allocate, observe=_observe,
    accumulate=_accumulate, finish=_finish, needs_eager=True, observe_rows=_observe_rows, batch_rows=True,
    positions=("alibi", "rope", "learned"), memory=lambda shape: 2 * distance_table_bytes(shape.layers, shape.length),
    summary=_summary))
