"""Task scores versus predicted influence: a task curve beside the influence the rollout predicts at the same positions.

What ``jaxroll compare-task`` reports (the docs call it the bridge from the
rollout to task accuracy; `jaxroll.theory.bridge` is another bridge, from
the kinetic theory to the rollout).

For a task at prompt length L, cell d (one requested depth) holds n_d cases
whose relevant record covers tokens ``[depth_d, depth_d + r)``. The rollout
(arXiv 2602.16837; ``R_t = (1 - lambda_t) I + lambda_t A_t``,
``p = e_{L-1}^T R_T ... R_1``) predicts the influence of each position on
the last prompt token, which is where the first answer token is predicted.
The record's predicted influence is its share of that row,

    x_d = sum_{j = depth_d}^{depth_d + r - 1} p(j),

and the task curve is y_d, the cell's mean score (exact match, mean
log-probability in nats, or the fraction of answer tokens right). Reported:

- Spearman's rank correlation of (x_d, y_d) over the D cells, with a
  percentile bootstrap interval over cases (cases resampled within each
  cell, the prediction held fixed: the interval is the task's noise);
- a monotone link y = f(x), f non-decreasing, fitted by weighted isotonic
  regression (``scipy.optimize.isotonic_regression``, weights n_d), and the
  share of the depth effect it explains,
  ``1 - sum_d n_d (y_d - f(x_d))^2 / sum_d n_d (y_d - ybar)^2``, in sample
  (an isotonic fit has as many steps as it likes, so this is 1 whenever the
  ranks agree) and leaving each cell out in turn (f fitted to the other
  cells, interpolated at x_d): the honest one;
- the size of the depth effect against its noise,
  ``sum_d n_d (y_d - ybar)^2 / ((D - 1) s^2)`` with s^2 the pooled
  within-cell variance: about 1 when depth changes nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["SCORES", "TaskComparison", "compare_task", "record_influence", "plot_comparison", "select_rows"]

SCORES = ("exact", "logprob", "correct")
"""Task scores `compare_task` can compare: exact match, gold log-probability (nats), answer tokens right (fraction)."""
LEVEL = 0.95
MIN_DEPTHS = 5
"""Fewer depths than this: the statement draws no conclusion from Spearman."""


@dataclasses.dataclass
class TaskComparison:
    """A task curve and a predicted influence on the same cells (arrays ``(D,)``, cells by depth)."""

    task: str
    length: int
    score: str
    depths: np.ndarray
    depth_fractions: np.ndarray
    counts: np.ndarray
    task_curve: np.ndarray
    task_low: np.ndarray
    task_high: np.ndarray
    influence: np.ndarray
    profile: np.ndarray
    record_length: float
    spearman: float
    spearman_low: float
    spearman_high: float
    link: np.ndarray
    explained: float
    explained_out_of_sample: float
    depth_effect_to_noise: float
    source: str = ""

    def statement(self) -> list[str]:
        """What this comparison can and cannot conclude, in plain lines."""
        return conclusions(self)

    def table(self) -> list[dict]:
        """One dict per cell: depth, depth fraction, cases, task score and interval, predicted influence, link."""
        return [{"depth": int(d), "depth_fraction": float(f), "cases": int(n), self.score: float(y),
                 "low": float(lo), "high": float(hi), "influence": float(x), "link": float(g)}
                for d, f, n, y, lo, hi, x, g in zip(self.depths, self.depth_fractions, self.counts, self.task_curve,
                                                    self.task_low, self.task_high, self.influence, self.link)]


def select_rows(rows, task: str | None, length: int | None):
    """(task, length, rows of that task and length); defaults: the only task, the longest length."""
    tasks = sorted({row["task"] for row in rows})
    if not tasks:
        raise ConfigError("cases.jsonl: no scored cases; allowed: the --out of a finished jaxroll task run")
    if task is None:
        if len(tasks) > 1:
            raise ConfigError(f"--task: not given and the cases hold {','.join(tasks)}; allowed: one of them")
        task = tasks[0]
    if task not in tasks:
        raise ConfigError(f"--task: got {task!r}; allowed: one of {','.join(tasks)} (the tasks in cases.jsonl)")
    lengths = sorted({int(row["length"]) for row in rows if row["task"] == task})
    length = lengths[-1] if length is None else length
    if length not in lengths:
        raise ConfigError(f"--length: got {length}; allowed: one of {','.join(map(str, lengths))} (the lengths "
                          f"of {task} in cases.jsonl)")
    return task, length, [row for row in rows if row["task"] == task and int(row["length"]) == length]


def record_influence(profile, depth: int, record_length: int) -> float:
    """``sum_{j=depth}^{depth+record_length-1} p(j)``: the record's share of the predicted influence."""
    return float(np.sum(np.asarray(profile, dtype=np.float64)[depth: depth + record_length]))


def _value(row, score):
    if score == "correct":
        return row["correct"] / len(row["answer_ids"])
    return float(row[score])


def _spearman(x, y) -> float:
    from scipy import stats

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")  # a constant curve has no ranks to correlate
    return float(stats.spearmanr(x, y).statistic)


def _isotonic(x, y, weights):
    """Non-decreasing weighted least-squares fit of y on x, at the points x."""
    from scipy.optimize import isotonic_regression

    order = np.argsort(x, kind="stable")
    fitted = np.empty_like(y)
    fitted[order] = isotonic_regression(y[order], weights=weights[order], increasing=True).x
    return fitted


def _explained(y, fitted, weights) -> float:
    mean = np.average(y, weights=weights)
    total = np.sum(weights * (y - mean) ** 2)
    return float(1 - np.sum(weights * (y - fitted) ** 2) / total) if total > 0 else float("nan")


def _left_out(x, y, weights):
    """f(x_d) from the isotonic fit to every other cell (linear between fitted points, flat beyond)."""
    predicted = np.empty_like(y)
    for d in range(len(y)):
        keep = np.arange(len(y)) != d
        fitted = _isotonic(x[keep], y[keep], weights[keep])
        order = np.argsort(x[keep], kind="stable")
        predicted[d] = np.interp(x[d], x[keep][order], fitted[order])
    return predicted


def compare_task(rows, profile, *, task: str | None = None, length: int | None = None, score: str = "exact",
                 resamples: int = 2000, seed: int = 0, source: str = "") -> TaskComparison:
    """Compare the task curve of `rows` (``cases.jsonl`` rows) with a predicted influence `profile`.

    Args:
        rows: scored cases (`jaxroll.task.read_rows`).
        profile: the predicted influence ``p`` over the prompt's positions, shape ``(length,)``
            (e.g. ``jaxroll.influence(model, length)``).
        task: which task (default: the only one in `rows`).
        length: which prompt length (default: the longest).
        score: ``exact``, ``logprob`` or ``correct``.
        resamples: bootstrap resamples over cases.
        seed: the bootstrap's seed.
        source: where the profile came from, for the statement.

    Raises:
        ConfigError: an unknown score or task, a length not in the rows, a profile of another length,
            fewer than 3 depths.
    """
    if score not in SCORES:
        raise ConfigError(f"--score: got {score!r}; allowed: one of {', '.join(SCORES)}")
    try:
        from scipy.optimize import isotonic_regression  # noqa: F401  (scipy >= 1.12)
    except ImportError:
        raise ConfigError("compare-task: needs scipy >= 1.12 (scipy.optimize.isotonic_regression); install "
                          "jaxroll[measure]") from None
    task, length, mine = select_rows(rows, task, length)
    profile = np.asarray(profile, dtype=np.float64)
    if profile.shape != (length,):
        raise ConfigError(f"profile: shape {profile.shape}; allowed: ({length},), one value per prompt position")
    cells: dict = {}
    for row in mine:
        cells.setdefault(float(row["depth_fraction"]), []).append(row)
    fractions = np.array(sorted(cells))
    if len(fractions) < 3:
        raise ConfigError(f"--task {task} --length {length}: {len(fractions)} depths; allowed: at least 3 to rank")
    groups = [cells[f] for f in fractions]
    values = [np.array([_value(row, score) for row in group]) for group in groups]
    counts = np.array([len(v) for v in values], dtype=float)
    curve = np.array([v.mean() for v in values])
    x = np.array([np.mean([record_influence(profile, row["depth"], row["record_length"]) for row in group])
                  for group in groups])
    rng = np.random.default_rng(seed)
    boot_curves = np.stack([v[rng.integers(0, len(v), (resamples, len(v)))].mean(axis=1) for v in values], axis=1)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(boot_curves, tail, axis=0), np.quantile(boot_curves, 1 - tail, axis=0)
    rhos = np.array([_spearman(x, b) for b in boot_curves])
    rho_low, rho_high = (np.nanquantile(rhos, [tail, 1 - tail]) if np.isfinite(rhos).any() else (np.nan, np.nan))
    link = _isotonic(x, curve, counts)
    within = sum(float(np.sum((v - v.mean()) ** 2)) for v in values) / max(counts.sum() - len(values), 1)
    between = float(np.sum(counts * (curve - np.average(curve, weights=counts)) ** 2))
    ratio = between / ((len(values) - 1) * within) if within > 0 else (float("inf") if between > 0 else float("nan"))
    return TaskComparison(
        task=task, length=length, score=score, depths=np.array([np.mean([r["depth"] for r in g]) for g in groups]),
        depth_fractions=fractions, counts=counts.astype(int), task_curve=curve, task_low=low, task_high=high,
        influence=x, profile=profile, record_length=float(np.mean([r["record_length"] for r in mine])),
        spearman=_spearman(x, curve), spearman_low=float(rho_low), spearman_high=float(rho_high), link=link,
        explained=_explained(curve, link, counts),
        explained_out_of_sample=_explained(curve, _left_out(x, curve, counts), counts),
        depth_effect_to_noise=float(ratio), source=source)


def conclusions(result: TaskComparison) -> list[str]:
    """Plain statements: what the numbers support, and what no number here can support."""
    name = {"exact": "exact match", "logprob": "gold log-probability", "correct": "answer tokens right"}[result.score]
    lines = [f"{result.task} at L = {result.length}: {name} at {len(result.counts)} depths "
             f"({int(result.counts.sum())} cases) against the predicted influence of the record ({result.source})."]
    if not np.isfinite(result.spearman):
        lines.append("The task score is the same at every depth: there is no curve to rank, so no agreement or "
                     "disagreement can be read.")
    else:
        lines.append(f"Spearman rho = {result.spearman:.2f}, {LEVEL:.0%} bootstrap interval "
                     f"[{result.spearman_low:.2f}, {result.spearman_high:.2f}] over cases.")
        if len(result.counts) < MIN_DEPTHS:
            lines.append(f"Too few depths ({len(result.counts)} < {MIN_DEPTHS}) for a rank correlation to conclude "
                         "anything: Spearman over so few points takes a handful of values.")
        elif result.spearman_low > 0:
            lines.append("Can conclude: depths the rollout predicts to be more influential are, for this model, "
                         "task and length, the depths where the task succeeds more (the interval excludes 0).")
        elif result.spearman_high < 0:
            lines.append("Can conclude: the task curve runs against the predicted influence (the interval is "
                         "below 0): the prediction does not track this task.")
        else:
            lines.append("Cannot conclude an agreement or a disagreement: the interval includes 0.")
    ratio = result.depth_effect_to_noise
    if not np.isfinite(ratio):
        lines.append("Every case scored the same: there is no depth effect to explain.")
    else:
        lines.append(f"Depth effect / noise = {ratio:.2f} (about 1 when depth changes nothing); a monotone link "
                     f"explains {_percent(result.explained)} of it in sample, "
                     f"{_percent(result.explained_out_of_sample)} leaving each depth out.")
    if np.isfinite(ratio) and ratio < 2:
        lines.append("The depth effect is within a few times its noise: any link fitted to it is mostly noise.")
    lines.append("Cannot conclude: that influence causes the task score. Influence is a property of a position "
                 "(how much it moves the last position's output); the score also depends on the task, its "
                 "distractors and the answer's difficulty, which the rollout does not model. The correlation "
                 f"is over {len(result.counts)} depths of one length; another task or length needs its own run.")
    return lines


def _percent(value: float) -> str:
    return f"{100 * value:.0f}%" if np.isfinite(value) else "n/a (no depth effect)"


def plot_comparison(result: TaskComparison, path, *, title: str = "") -> Path:
    """One figure: the task curve (left axis, with intervals and the monotone link) and the predicted
    influence of a record at every start position (right axis), on the prompt's token axis.

    Drawn by `jaxroll.plot.task_comparison_figure`, intervals at this module's level.
    """
    from ..plot import plot_task_comparison

    return plot_task_comparison(path, result, level=LEVEL, title=title)
