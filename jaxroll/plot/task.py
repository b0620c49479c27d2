"""Task accuracy by position (`jaxroll task`) and a task curve beside the predicted influence
(`jaxroll compare-task`).

The figures read the fields of `jaxroll.task.summary.Cell` and
`jaxroll.task.versus_influence.TaskComparison` but import neither: the task modules
call these functions, so an import back would be a cycle. Their threshold and
interval level arrive as arguments for the same reason.
"""

from __future__ import annotations

import numpy as np

from ._canvas import _figure

SCORE_LABELS = {"exact": "exact match", "logprob": "gold log-prob (nats)", "correct": "answer tokens right"}
"""Axis and legend names of the task scores of `jaxroll.task.versus_influence.SCORES`."""


def task_accuracy_figure(table, task: str, *, threshold: float, level: float, title: str = ""):
    """Exact match of one task by record depth and prompt length, in two panels.

    Left: a heatmap (depth fraction x length, each cell's mean exact match
    written in it). Right: one accuracy-by-depth line per length, with its
    `level` bootstrap interval, and a dotted line at `threshold` (the
    depth-averaged accuracy a length must reach to count as effective).
    `table`: the cells of `jaxroll.task.summary.cells`.
    """
    mine = [cell for cell in table if cell.task == task]
    lengths = sorted({cell.length for cell in mine})
    fractions = sorted({cell.depth_fraction for cell in mine})
    grid = np.full((len(fractions), len(lengths)), np.nan)
    for cell in mine:
        grid[fractions.index(cell.depth_fraction), lengths.index(cell.length)] = cell.accuracy
    figure, ((left, right),) = _figure(10, 4, 2, layout="constrained")
    image = left.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="upper")
    left.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    left.set_yticks(range(len(fractions)), [f"{f:.2g}" for f in fractions])
    left.set_xlabel("prompt length (tokens)")
    left.set_ylabel("record depth fraction (0: first, 1: last)")
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            left.text(j, i, f"{value:.2f}", ha="center", va="center", color="w" if value < 0.6 else "k", fontsize=8)
    figure.colorbar(image, ax=left, label="exact match (greedy = gold)")
    left.set_title("exact match by depth and length")
    for index, length in enumerate(lengths):
        line = sorted((cell for cell in mine if cell.length == length), key=lambda cell: cell.depth_fraction)
        x = np.array([cell.depth_fraction for cell in line])
        y = np.array([cell.accuracy for cell in line])
        error = np.array([[cell.accuracy - cell.accuracy_low for cell in line],
                          [cell.accuracy_high - cell.accuracy for cell in line]])
        right.errorbar(x, y, yerr=np.clip(error, 0, None), marker="o", capsize=3, color=f"C{index}",
                       label=f"L = {length}")
    right.axhline(threshold, color="0.6", linestyle=":", linewidth=1)
    right.set_ylim(-0.03, 1.03)
    right.set_xlabel("record depth fraction\n(0: right after the instruction, 1: right before the question)")
    right.set_ylabel(f"exact match ({level:.0%} bootstrap interval)")
    right.set_title("one line per length")
    right.legend(fontsize=8)
    figure.suptitle(title or f"jaxroll task: {task}")
    return figure


def task_comparison_figure(result, *, level: float, title: str = ""):
    """A task curve and the influence the rollout predicts, on the prompt's token axis.

    Left axis: the task score at each depth with its `level` interval, and
    the monotone link f(influence) fitted to it. Right axis: the predicted
    influence of a record starting at every token (the profile summed over a
    record's width), log-scaled when it spans more than a factor 100, and its
    value at the task's depths. The title carries Spearman's rho and its
    interval. `result`: a `jaxroll.task.versus_influence.TaskComparison`.
    """
    figure, ((left,),) = _figure(7.5, 4.8, layout="constrained")
    error = np.clip(np.stack([result.task_curve - result.task_low, result.task_high - result.task_curve]), 0, None)
    left.errorbar(result.depths, result.task_curve, yerr=error, marker="o", capsize=3, color="C0",
                  label=f"task: {SCORE_LABELS[result.score]} ({level:.0%} CI)")
    left.plot(result.depths, result.link, linestyle="--", color="C0", alpha=0.6, label="monotone link f(influence)")
    left.set_xlabel("record start (token index in the prompt)")
    left.set_ylabel(f"{result.task}: {SCORE_LABELS[result.score]}", color="C0")
    right = left.twinx()
    width = int(round(result.record_length))
    windows = np.convolve(result.profile, np.ones(width), mode="valid")  # influence of a record starting at j
    right.plot(np.arange(len(windows)), windows, color="C3", linewidth=1, alpha=0.7,
               label=f"predicted: influence of a {width}-token record")
    right.plot(result.depths, result.influence, "s", color="C3", markersize=5, label="predicted at the task's depths")
    if windows.min() > 0 and windows.max() / windows.min() > 100:
        right.set_yscale("log")
    right.set_ylabel("predicted influence on the last prompt token", color="C3")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    figure.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="outside lower center", ncols=2)
    rho = f"Spearman {result.spearman:.2f} [{result.spearman_low:.2f}, {result.spearman_high:.2f}]"
    left.set_title(title or f"{result.task}, L = {result.length}: task curve vs rollout prediction ({rho})",
                   fontsize=10)
    return figure
