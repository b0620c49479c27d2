"""Measured rows under a distance score, read at any kappa: the distance tables of a `GainTableKernel`.

A distance score adds ``kappa g(i - j)`` to every logit of a sequence's rows. On a measured mean of rows
(``A = mean_{s,h} alpha^s_h``) reweighting the mean, ``A e^{kappa g} / sum``, is not the mean of the reweighted
rows, ``mean_{s,h} alpha^s_h e^{kappa g} / Z^s_h(i)``: each sequence's row has its own normaliser
``Z^s_h(i) = sum_j alpha^s_h(i, j) e^{kappa g(i - j)}``, and on rotary models the difference was most of the
distance scores' error (docs/interventions.md, "Rows under a distance score"). So the measurement tabulates
the mean of the reweighted rows at a grid of kappa for each tabulated form g (`jaxroll.measure.distance_rows`):

    tables[f, k] = mean_{s,h} softmax_j(log alpha^s_h(i, j) + kappa_k g_f(i - j))       (F, K, N, N) per layer

and a layer reads form f at kappa from its two neighbouring grid tables, each carried to kappa by the
reweighting from its own grid point, blended linearly in kappa:

    S(T, delta)(i, :) = T(i, :) e^{delta g(i - :)} / sum_j T(i, j) e^{delta g(i - j)}
    T_f(kappa)        = (1 - w) S(T_k, kappa - kappa_k) + w S(T_{k+1}, kappa - kappa_{k+1}),
                        w = (kappa - kappa_k) / (kappa_{k+1} - kappa_k)   (clipped to [0, 1]: beyond the grid,
                        the end table carried by the reweighting)

with the unchanged mean (the gain tables' rows at gain 1) as the table at kappa = 0. Exact at grid points; the
reweighting of the mean (today's `DenseKernel` route) is the special case of a grid of one point, kappa = 0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

__all__ = ["distance_key", "rows_at_kappa", "distance_ratio"]


def distance_key(form: str, k: float) -> str:
    """The name a table of rows under the distance form `form` is kept under: ``"log1p"`` (k has no role there)
    or ``"unsquash k=2"`` (`jaxroll.interventions.DistanceBias`'s forms)."""
    return form if form == "log1p" else f"{form} k={float(k):g}"


def _carried(table, delta, score):
    """``S(T, delta)``: rows ``(n, n)`` reweighted by ``e^{delta g(i - j)}`` and renormalised; `score` ``(n, n)``
    is ``g(i - j)`` on the causal triangle."""
    weighted = table * jnp.exp(delta * score)
    return weighted / jnp.sum(weighted, axis=-1, keepdims=True)


def rows_at_kappa(tables: Float[Array, "k n n"], base: Float[Array, "n n"], grid, score: Float[Array, "n n"],
                  kappa) -> Float[Array, "n n"]:
    """``T(kappa)`` of the module docstring: `tables` at the increasing nonzero kappas `grid` (static), `base` the
    table at kappa = 0, read at `kappa` (a scalar, traced or not; differentiable in it). Only the two
    neighbouring tables are read."""
    grid = np.asarray(grid, dtype=np.float64)
    below = int(np.sum(grid < 0))
    full = jnp.asarray(np.concatenate([grid[:below], [0.0], grid[below:]]), dtype=base.dtype)
    index = jnp.clip(jnp.searchsorted(full, kappa, side="right") - 1, 0, full.shape[0] - 2)

    def table(k):  # the full grid's k-th table: `base` at kappa = 0, else a measured one
        return jnp.where(k == below, base, tables[k - (k > below)])

    low, high = full[index], full[index + 1]
    above = jnp.clip((kappa - low) / (high - low), 0.0, 1.0)  # w of the module docstring
    return ((1.0 - above) * _carried(table(index), kappa - low, score)
            + above * _carried(table(index + 1), kappa - high, score))


def distance_ratio(base: Float[Array, "n n"], tables: Float[Array, "f k n n"], grid,
                   scores: Float[Array, "f n n"], kappas: Float[Array, " f"]) -> Float[Array, "n n"]:
    """The factor that carries the unchanged mean rows `base` to the mean rows under ``sum_f kappa_f g_f``:
    ``prod_f T_f(kappa_f) / base`` (``e^{kappa_f g_f}`` where `base` is 0). One form is exact at its grid
    points; several multiply (an approximation: each table holds one form's change alone).

    `tables` ``(F, K, n, n)`` at the K nonzero kappas of `grid`; `scores` ``(F, n, n)`` the forms'
    ``g_f(i - j)`` on the causal triangle (0 above it)."""
    positive = base > 0
    safe = jnp.where(positive, base, 1.0)
    ratio = jnp.ones_like(base)
    for form in range(tables.shape[0]):  # F static forms (two by default), each its own table
        read = rows_at_kappa(tables[form], base, grid, scores[form], kappas[form])
        ratio = ratio * jnp.where(positive, read / safe, jnp.exp(kappas[form] * scores[form]))
    return ratio
