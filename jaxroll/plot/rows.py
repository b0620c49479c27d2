"""Every measured row against the rollout (`jaxroll score --config`, `jaxroll compare --rows`): W1/noise by
query position, and the power law by distance measured and predicted."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._canvas import _figure, _save

MEASURED_COLOR, PREDICTED_COLOR, REJECTED_COLOR = "C0", "C3", "C3"


def _per_row(scores) -> dict:
    """The per-row numbers of a `RowScores` or of its ``as_dict()`` (rows.json), as arrays."""
    rows = (scores.as_dict() if hasattr(scores, "as_dict") else scores)["rows"]
    return {name: np.array([row[name] for row in rows]) for name in
            ("query", "ratio", "ratio_interval", "holm_rejected")}


def _distance_panel(axes, fitted: dict, name: str, color: str, marker: str) -> None:
    r, curve = np.asarray(fitted["distances"], dtype=np.float64), np.asarray(fitted["curve"], dtype=np.float64)
    shown = curve > 0  # a log axis: a non-positive mean or median has no place on it
    low, high = fitted["p_interval"]
    kind = "bootstrap over sequences" if fitted["interval_kind"] == "bootstrap" else "fit's interval"
    axes.plot(r[shown], curve[shown], marker, color=color, markersize=3, linewidth=0.8,
              label=f"{name}: p = {fitted['p']:.3g} [{low:.3g}, {high:.3g}] ({100 * fitted['level']:g}%, {kind})"
                    + (" at a bound" if fitted["at_bound"] else ""))
    model = fitted["gamma"] + fitted["beta"] * (r + 1.0) ** -fitted["p"]
    axes.plot(r[model > 0], model[model > 0], ":", color=color, linewidth=1.2,
              label=f"{name}: fit {fitted['gamma']:.2g} {'-' if fitted['beta'] < 0 else '+'} "
                    f"{abs(fitted['beta']):.2g} (r+1)^-{fitted['p']:.3g}")


def rows_figure(scores, distance_measured=None, distance_predicted=None, *, title: str = ""):
    """Left: ``W1 / noise`` of every row by its query position (bars: the ratio's interval; red: rejected
    by Holm at 5 %; dotted line at 1, a perfect prediction). Right: the curves by distance ``r >= 1``
    (dicts of `jaxroll.measure.row_scores.distance_exponent`), measured and predicted, on log-log
    axes, each with its fitted ``gamma + beta (r + 1)^(-p)`` and p's interval in the legend.
    """
    rows = _per_row(scores)
    figure, panels = _figure(13.0, 4.6 + 0.17 * (title.count("\n") + 1), 2, layout="constrained")
    axes = panels[0, 0]
    queries, ratio = rows["query"], rows["ratio"]
    interval = np.asarray(rows["ratio_interval"], dtype=np.float64).reshape(-1, 2)
    errors = np.stack([np.clip(ratio - interval[:, 0], 0, None), np.clip(interval[:, 1] - ratio, 0, None)])
    axes.errorbar(queries, ratio, yerr=errors, fmt="-o", color=MEASURED_COLOR, markersize=4, linewidth=1,
                  capsize=2, label="W1(predicted row, measured row) / noise of the measured mean")
    rejected = rows["holm_rejected"].astype(bool)
    if rejected.any():
        axes.plot(queries[rejected], ratio[rejected], "o", color=REJECTED_COLOR, markersize=7, fillstyle="none",
                  label="rejected at 5% (Holm over the rows)")
    axes.axhline(1.0, color="0.4", linestyle=":", linewidth=1, label="1 = as far as the noise (perfect prediction)")
    axes.set_ylim(bottom=0.0)
    axes.set_xlabel("query position i (row i of P_T, scored on positions 0..i)")
    axes.set_ylabel("W1 / noise of the measured mean")
    axes.set_title(f"{queries.size} rows: W1/noise, bars {100 * _level(scores):g}% intervals", fontsize=9)
    axes.legend(fontsize=7)
    axes = panels[0, 1]
    drawn = False
    for fitted, name, color, marker in ((distance_measured, "measured", MEASURED_COLOR, "-o"),
                                        (distance_predicted, "predicted", PREDICTED_COLOR, "--s")):
        if fitted is not None:
            _distance_panel(axes, fitted, name, color, marker)
            drawn = True
    if drawn:
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.legend(fontsize=7)
        statistic = (distance_measured or distance_predicted)["statistic"]
        buffer = (distance_measured or distance_predicted)["buffer"]
        axes.set_ylabel(f"{statistic} over queries of row-normalised influence")
        axes.set_title(f"by distance r = i - j (r >= 1{f', sources j >= {buffer}' if buffer else ''})", fontsize=9)
    axes.set_xlabel("distance r = i - j")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def _level(scores) -> float:
    return scores.level if hasattr(scores, "level") else scores["summary"]["level"]


def plot_rows(scores, distance_measured, distance_predicted, path, title: str = "") -> Path:
    """`rows_figure` (W1/noise by query; the power law by distance measured and predicted), written to `path`."""
    return _save(rows_figure(scores, distance_measured, distance_predicted, title=title), path)
