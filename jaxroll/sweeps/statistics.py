"""The tidy table of a sweep: one row per (point, length), with the shape statistics of `jaxroll.metrics`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import metrics
from .plan import _Plan

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep

STATISTICS = metrics.Shape._fields
"""The shape statistics of every point in `SweepResult.table` (`jaxroll.metrics.Shape`)."""


def _one_length(p, fraction: float) -> dict:
    """`jaxroll.metrics.shape_statistics` of profiles ``(S, n)``, traced: the same definitions
    (``k = max(1, round(fraction n))`` edge positions)."""
    n = p.shape[-1]
    k = metrics.edge_count(n, fraction)
    first_mass, last_mass = p[:, :k].sum(axis=1), p[:, n - k:].sum(axis=1)
    middle = p[:, k: max(k, n - k)].sum(axis=1)
    u_index = ((jnp.minimum(first_mass, last_mass) / k) / (middle / (n - 2 * k)) - 1.0 if n > 2 * k
               else jnp.full(p.shape[0], jnp.nan, p.dtype))
    return {"first": p[:, 0], "last": p[:, -1], "argmin": jnp.argmin(p, axis=1),
            "center_of_mass": p @ jnp.arange(n, dtype=p.dtype) / max(n - 1, 1),
            "first_mass": first_mass, "middle_mass": middle, "last_mass": last_mass, "u_index": u_index}


@functools.partial(jax.jit, static_argnames=("lengths", "fraction"))
def shape_statistics(profiles, lengths: tuple[int, ...], fraction: float) -> dict:
    """The `STATISTICS` of a chunk's profiles ``(S, L, N_max)`` at each length, ``(S, L)`` each.

    Under `jit` on the device where the profiles live (in their dtype), so
    only ``S L`` numbers per statistic go to the host, not the profiles.
    """
    per_length = [_one_length(profiles[:, position, :n], fraction) for position, n in enumerate(lengths)]
    return {name: jnp.stack([values[name] for values in per_length], axis=1) for name in STATISTICS}


def _table(plan: _Plan, total_mixing: np.ndarray, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per (point, length), the length fastest: the point's columns, the length, the statistics ``(S, L)``."""
    count, lengths = plan.count, len(plan.lengths)
    table = {name: np.repeat(column, lengths) for name, column in plan.columns.items()}
    table["total_mixing"] = np.repeat(total_mixing, lengths)
    table["length"] = np.tile(np.asarray(plan.lengths), count)
    for name in STATISTICS:
        table[name] = statistics[name].reshape(count * lengths).astype(np.int64 if name == "argmin" else np.float64)
    return table
