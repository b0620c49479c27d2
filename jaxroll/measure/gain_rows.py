"""The mean attention rows at a grid of logit gains, registered as ``"attention_gains"``: the tables of a
`jaxroll.kernel_types.GainTableKernel`.

For every layer t, each tabulated gain ``g_k`` (`jaxroll.measure.registry.GAIN_GRID`, 1 among them) and the
attention probabilities ``alpha^s_{t,h}`` of sequence s, head h (N x N, causal):

    alpha_g(i, :)              = softmax_j(g log alpha(i, j)) = alpha(i, :)^g / sum_j alpha(i, j)^g
                                 (the row at logit gain g: the logits are log alpha up to a row constant)
    gain_rows[t, k]            = mean_{s,h} alpha_{g_k}                                  (L, G, N, N)
    gain_weights[t, k]         = mean_{s,h} alpha_{g_k} (.) sqrt(1 - 2 alpha_{g_k} + sum_j alpha_{g_k}(i, j)^2)
    gain_grid                  = (g_1, ..., g_G)

``gain_rows`` at g = 1 is the mean attention (the ``attention`` statistic's). A rotary or learned-position
model's config.yaml is then a `GainTableKernel` over these tables (`jaxroll.measure.result`), an ALiBi model's
an `AnchoredTableKernel` (the tables moving its ALiBi + content kernel), so that a
temperature or SSMax changes the rows as each sequence's rows change (docs/design.md, "Rows at every logit
gain"). Float64 throughout; the rows are recomputed from q and k in row chunks wherever `attention` is
(`jaxroll.measure.attention_rows`), else read from the hooked eager probabilities; one state per batch
(``batch_rows``), so the sums are held twice (the batch's and the run's): ``2 x 2 L G N^2`` float64.
"""

from __future__ import annotations

import numpy as np

from .registry import GAIN_GRID, Shapes, Statistic, gain_table_bytes, register_statistic

__all__ = ["gain_sums", "gain_powers", "closed_path_weights"]


def closed_path_weights(rows):
    """``c(A)_ij = A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)`` of rows ``(..., N)`` (torch, float64), the
    closed form of `jaxroll.engine.probability.path_weights`, computed without cancellation: with m the row's
    largest entry, ``r = sum_{k != m} A_ik`` (= 1 - A_im) and ``q = sum_{k != m} A_ik^2``, the spread is
    ``r^2 + q`` at m and ``1 - 2 A_ij + sum_k A_ik^2`` elsewhere (at least 1/4 there, where ``A_ij <= 1/2``;
    at m that form loses every digit once a row is one key to 1e-10, 1e-8 of error in c)."""
    top, where = rows.max(dim=-1, keepdim=True)
    squares = rows.square()
    spread = rows.mul(-2.0).add_(squares.sum(dim=-1, keepdim=True) + 1.0)
    rest = rows.sum(dim=-1, keepdim=True) - top  # r to 1e-16 absolute: r^2 to 1e-16 r, relative
    others = squares.scatter_(-1, where, 0.0).sum(dim=-1, keepdim=True)
    spread.scatter_(-1, where, rest.square() + others)
    return spread.clamp_(min=0.0).sqrt_().mul_(rows)


def gain_powers(rows, grid=GAIN_GRID) -> dict:
    """``{g: rows^g}`` for every g in `grid` (unnormalised): a gain twice or half another's is that one squared
    or square-rooted (correctly rounded, like ``pow`` to an ulp), so `GAIN_GRID`'s eight take one ``pow``."""
    powers = {1.0: rows}
    for gain in sorted(grid, key=lambda g: (abs(np.log2(g)) % 1 != 0, abs(np.log2(g)))):
        if gain in powers:
            continue
        if gain / 2 in powers:
            powers[gain] = powers[gain / 2].square()
        elif gain * 2 in powers:
            powers[gain] = powers[gain * 2].sqrt()
        else:
            powers[gain] = rows.pow(gain)
    return powers


def gain_sums(rows, grid=GAIN_GRID):
    """``(rows_sum, weights_sum)``, each ``(G, c, N)``: rows ``(B, H, c, N)`` (probabilities, float64) at each
    gain in `grid`, ``alpha^g / sum_j alpha^g``, summed over the batch and averaged over heads, and their path
    weights (`closed_path_weights`) likewise.

    ``alpha^g`` needs no shift: every row holds a weight of at least 1 / N, so its largest power is at least
    ``N^-g`` (1e-33 at N = 2^17, g = 4), far above float64's underflow; a hidden key (0) stays 0."""
    import torch

    heads = rows.shape[1]
    powers = gain_powers(rows, grid)
    out_rows, out_weights = [], []
    for gain in grid:
        changed = rows if gain == 1.0 else powers[gain] / powers[gain].sum(dim=-1, keepdim=True)
        out_rows.append(changed.sum(dim=(0, 1)) / heads)
        out_weights.append(closed_path_weights(changed).sum(dim=(0, 1)) / heads)
    return torch.stack(out_rows), torch.stack(out_weights)


def _allocate(shape: Shapes) -> dict:
    size = (shape.layers, len(GAIN_GRID), shape.length, shape.length)
    return {"gain_rows_sum": np.zeros(size), "gain_weights_sum": np.zeros(size)}


def _observe_rows(state, layer, start, rows):
    table_rows, table_weights = gain_sums(rows)
    stop = start + rows.shape[2]
    if layer not in state:
        n = rows.shape[-1]
        state[layer] = (table_rows.new_zeros((len(GAIN_GRID), n, n)), table_weights.new_zeros((len(GAIN_GRID), n, n)))
    state[layer][0][:, start:stop] += table_rows
    state[layer][1][:, start:stop] += table_weights


def _observe(state, kind, layer, p):
    _observe_rows(state, layer, 0, p.double())


def _accumulate(sums, state, index):
    del index
    for layer in sorted(state):
        sums["gain_rows_sum"][layer] += state[layer][0].cpu().numpy()
        sums["gain_weights_sum"][layer] += state[layer][1].cpu().numpy()


def _finish(sums, count, shape: Shapes) -> dict:
    del shape
    # Kept as summed, like the mean attention: its rows at gain 1 are `attention_mean` to the bit, and the config
    # renormalises both alike (`Measurement.to_rollout_model`, only where a row misses 1 by more than 1e-6).
    return {"gain_rows": sums["gain_rows_sum"] / count, "gain_weights": sums["gain_weights_sum"] / count,
            "gain_grid": np.asarray(GAIN_GRID, dtype=np.float64)}


def _summary(outputs: dict) -> str:
    grid = outputs["gain_grid"]
    return f"attention_gains: mean rows and path weights at {len(grid)} logit gains ({grid[0]:.3g} to {grid[-1]:.3g})"


register_statistic(Statistic(
    name="attention_gains", hooks=("probabilities",), allocate=_allocate, observe=_observe, accumulate=_accumulate,
    finish=_finish, needs_eager=True, observe_rows=_observe_rows, batch_rows=True,
    positions=("alibi", "rope", "learned"), memory=lambda shape: 2 * gain_table_bytes(shape.layers, shape.length),
    summary=_summary))
