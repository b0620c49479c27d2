"""The tidy table of a sweep: one row per (point, length), with the shape statistics of `jaxroll.metrics`."""

from __future__ import annotations

import numpy as np

from .. import metrics
from .plan import _Plan

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep

STATISTICS = metrics.Shape._fields
"""The shape statistics of every point in `SweepResult.table` (`jaxroll.metrics.Shape`)."""


def _shape_statistics(p: np.ndarray, fraction: float) -> dict[str, np.ndarray]:
    """`jaxroll.metrics.shape_statistics` of profiles ``(S, n)``, in host NumPy float64.

    The same definitions (``k = max(1, round(fraction n))`` edge positions),
    computed here without JAX: eager jnp would compile every operation anew
    for every length of a sweep.
    """
    n = p.shape[-1]
    k = metrics.edge_count(n, fraction)
    first_mass, last_mass = p[:, :k].sum(axis=1), p[:, n - k:].sum(axis=1)
    middle = p[:, k: max(k, n - k)].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        u_index = (np.minimum(first_mass, last_mass) / k) / (middle / (n - 2 * k)) - 1.0 \
            if n > 2 * k else np.full(p.shape[0], np.nan)
    return {"first": p[:, 0], "last": p[:, -1], "argmin": np.argmin(p, axis=1),
            "center_of_mass": p @ np.arange(n, dtype=np.float64) / max(n - 1, 1),
            "first_mass": first_mass, "middle_mass": middle, "last_mass": last_mass, "u_index": u_index}


def _table(plan: _Plan, profiles: np.ndarray, fraction: float) -> dict[str, np.ndarray]:
    """One row per (point, length): the point's columns, the length, the shape statistics."""
    count, lengths = profiles.shape[0], len(plan.lengths)
    table = {name: np.repeat(column, lengths) for name, column in plan.columns.items()}
    table["length"] = np.tile(np.asarray(plan.lengths), count)
    statistics = {name: np.zeros(count * lengths, np.int64 if name == "argmin" else np.float64)
                  for name in STATISTICS}
    for position, n in enumerate(plan.lengths):
        values = _shape_statistics(np.asarray(profiles[:, position, :n], np.float64), fraction)
        for name in STATISTICS:
            statistics[name][position::lengths] = values[name]
    table.update(statistics)
    return table
