"""Every row of the rollout, the predicted half: rows of ``P_T`` at query positions, and influence by distance.

The measured half is `jaxroll.measure.rows` (torch): gradient influence on
the same query positions; `normalised_rows` puts its norms on this module's
scale.

The theory predicts the whole matrix ``P_T = R_T ... R_1`` (arXiv
2602.16837), not only its last row: ``P_T[i, j]`` is the predicted influence
of input position j on position i. Under a causal mask the first ``i + 1``
rows and columns of ``P_T`` at length N are ``P_T`` at length ``i + 1``, so
row i is exactly the last-row profile of the same model at length ``i + 1``,
padded with zeros (`jaxroll.rollout_row` with the start row ``e_i``).

A refined rollout (`jaxroll.theory.refinements.RefinedRollout`, measured
kernels at one length N) gives its rows by the same reverse scan as its
profile, from the start rows ``e_i`` (`jaxroll.theory.refinements.refined_rows`);
`predicted_rows` takes either kind.

The measured counterpart is the gradient influence ``||d f_i / d e_j||`` of
every input embedding on the top next-token probability at query position i
(`jaxroll.measure.rows.influence_rows`), per sequence ``(S, K, N)``.

By distance ``r = i - j`` (Brändel et al., arXiv 2606.29139), the rows of
either kind go to `jaxroll.theory.baselines.by_distance` (the mean or median
over query positions) and `jaxroll.theory.baselines.fit_power_law`
(``gamma + beta (r + 1)^-p``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ..model import RolloutModel
from .refinements import RefinedRollout, refined_rows

__all__ = ["query_positions", "predicted_rows", "normalised_rows"]


def query_positions(length: int, queries) -> np.ndarray:
    """The query positions ``(K,)``, increasing, the last one ``N - 1``.

    Args:
        length: N, the tokens per sequence.
        queries: an int K (K evenly spaced positions ``round(linspace(0, N-1,
            K + 1))[1:]``, so the last is ``N - 1`` and position 0, whose row
            is the trivial ``e_0``, is left out), or a sequence of positions in
            ``[0, N - 1]``, or a comma-separated string of them.
    """
    if isinstance(queries, str):
        items = [item.strip() for item in queries.split(",") if item.strip()]
        try:
            queries = int(items[0]) if len(items) == 1 and "," not in queries else [int(item) for item in items]
        except (ValueError, IndexError):
            raise ConfigError(f"queries: got {queries!r}; allowed: a count K or comma-separated positions") from None
    if isinstance(queries, (int, np.integer)):
        count = int(queries)
        if not 1 <= count <= length - 1:
            raise ConfigError(f"queries: got {count}; allowed: a count in [1, {length - 1}] (N = {length})")
        return np.unique(np.round(np.linspace(0, length - 1, count + 1)[1:]).astype(np.int64))
    positions = np.asarray(list(queries))
    if positions.ndim != 1 or positions.size == 0 or not np.issubdtype(positions.dtype, np.integer):
        raise ConfigError(f"queries: got {list(queries)!r}; allowed: integer positions in [0, {length - 1}]")
    bad = positions[(positions < 0) | (positions >= length)]
    if bad.size:
        raise ConfigError(f"queries: position {int(bad[0])}; allowed: positions in [0, {length - 1}] (N = {length})")
    return np.unique(positions.astype(np.int64))


def predicted_rows(model: RolloutModel | RefinedRollout, queries, n: int | None = None) -> np.ndarray:
    """Rows ``P_T[q_k, :]`` of the rollout, float64 NumPy ``(K, N)``; each sums to 1.

    ``P_T[i, :] = e_i^T R_T ... R_1`` (`jaxroll.rollout_row`, vmapped over the
    K start rows: O(K T H N) for an ALiBi model, the kernel type's own
    products for any other kernel); `P_T` is never formed. A
    `jaxroll.theory.refinements.RefinedRollout` (measured at one length N,
    the default and only allowed `n`) takes its rows from
    `jaxroll.theory.refinements.refined_rows` (O(K T H N^2)).
    """
    if isinstance(model, RefinedRollout):  # measured kernels: their own length, their own scan
        length = model.lambdas.shape[-1]
        if n is not None and int(n) != length:
            raise ConfigError(f"n: got {n}; allowed: the refined rollout's measured length {length} (or None)")
        starts = jnp.eye(length, dtype=model.head_kernels.dtype)[query_positions(length, queries)]
        rows = np.asarray(refined_rows(model, starts), dtype=np.float64)
    else:
        from ..rollout import rollout_row

        n = model.sequence_length if n is None else int(n)
        starts = jnp.eye(n, dtype=jnp.result_type(float))[query_positions(n, queries)]
        rows = np.asarray(jax.vmap(lambda start: rollout_row(model, start))(starts)).astype(np.float64)
    return rows / rows.sum(axis=-1, keepdims=True)


def normalised_rows(rows_per_sequence) -> np.ndarray:
    """The measured rows ``(K, N)``: the mean over sequences of ``(S, K, N)`` norms, each row normalised.

    The same rule as the last-row profile (`jaxroll.measure.measure`): sequences
    enter by their gradient mass, ``m_k = sum_s g_sk / sum_{s, j} g_skj``.
    """
    rows = np.asarray(rows_per_sequence, dtype=np.float64)
    if rows.ndim != 3:
        raise ConfigError(f"rows: got shape {rows.shape}; allowed: (S, K, N) per-sequence rows")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise ConfigError("rows: non-finite or negative values; allowed: gradient norms >= 0")
    means = rows.mean(axis=0)
    totals = means.sum(axis=-1, keepdims=True)
    if np.any(totals <= 0):
        raise ConfigError("rows: a query row has total mass 0; allowed: rows with some influence")
    return means / totals
