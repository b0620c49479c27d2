"""Accuracy and log-probability by depth and length, bootstrap intervals, effective context length.

Pure NumPy (no torch): the summaries read ``cases.jsonl`` rows, so anyone
can recompute them from the file.

For a cell (task, length L, depth fraction f) with cases c = 1..n:

    accuracy(L, f) = (1/n) sum_c exact_c        logprob(L, f) = (1/n) sum_c logprob_c

with percentile bootstrap intervals over the cell's cases (resampled with
replacement). The *effective context length* of a task (RULER, Hsieh et al.
2024, arXiv 2404.06654, reports the longest length that passes a threshold)
is the longest length L whose depth-averaged accuracy
``(1/|f|) sum_f accuracy(L, f)`` is at least `THRESHOLD` = 0.5: the
greedy answer is right more often than not, wherever the record sits.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

__all__ = ["THRESHOLD", "Cell", "cells", "effective_length", "depth_average", "bootstrap_interval",
           "write_summary", "plot_task"]

THRESHOLD = 0.5
"""Depth-averaged exact match a length must reach to count as effective."""
LEVEL = 0.95
RESAMPLES = 2000


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (task, length, depth fraction) cell of the grid.

    ``depth`` is the mean token index of its records (one value: every
    case of a cell starts its record at the same token).
    """

    task: str
    length: int
    depth_fraction: float
    depth: float
    count: int
    accuracy: float
    accuracy_low: float
    accuracy_high: float
    logprob: float
    logprob_low: float
    logprob_high: float
    token_accuracy: float


def bootstrap_interval(values, *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0):
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement)."""
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def _group(rows):
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["task"], int(row["length"]), float(row["depth_fraction"])), []).append(row)
    return groups


def cells(rows, *, seed: int = 0) -> list[Cell]:
    """One `Cell` per (task, length, depth fraction) of `rows`, sorted."""
    result = []
    for (task, length, fraction), members in sorted(_group(rows).items()):
        exact = np.array([float(row["exact"]) for row in members])
        logprob = np.array([float(row["logprob"]) for row in members])
        correct = np.array([row.get("correct", np.nan) / len(row["answer_ids"]) for row in members], dtype=float)
        a_low, a_high = bootstrap_interval(exact, seed=seed)
        l_low, l_high = bootstrap_interval(logprob, seed=seed)
        result.append(Cell(task, length, fraction, float(np.mean([row["depth"] for row in members])), len(members),
                           float(exact.mean()), a_low, a_high, float(logprob.mean()), l_low, l_high,
                           float(correct.mean())))
    return result


def depth_average(table, task: str) -> dict[int, float]:
    """Length -> depth-averaged accuracy of `task` (each depth weighs the same)."""
    lengths: dict = {}
    for cell in table:
        if cell.task == task:
            lengths.setdefault(cell.length, []).append(cell.accuracy)
    return {length: float(np.mean(values)) for length, values in sorted(lengths.items())}


def effective_length(table, task: str, threshold: float = THRESHOLD) -> int | None:
    """The longest length whose depth-averaged accuracy is >= `threshold` (None: no length passes)."""
    passing = [length for length, value in depth_average(table, task).items() if value >= threshold]
    return max(passing) if passing else None


def write_summary(table, path) -> Path:
    """``summary.csv``: one line per cell, intervals at `LEVEL`."""
    path = Path(path)
    fields = [field.name for field in dataclasses.fields(Cell)]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for cell in table:
            writer.writerow([_format(getattr(cell, name)) for name in fields])
    return path


def _format(value):
    return f"{value:.6g}" if isinstance(value, float) else value


def plot_task(table, task: str, path, *, title: str = "") -> Path:
    """Heatmap (depth fraction x length, exact match) and one accuracy-by-depth line per length.

    Drawn by `jaxroll.plot.task_accuracy_figure`, with this module's `THRESHOLD` and interval level.
    """
    from ..plot import plot_task_accuracy

    return plot_task_accuracy(path, table, task, threshold=THRESHOLD, level=LEVEL, title=title)
