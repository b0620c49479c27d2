"""A predicted change against a measured one (`jaxroll effect`): two measurements and the rollout's prediction."""

from __future__ import annotations

import numpy as np

from ._canvas import POSITION_LABEL, _band, _figure, _few_ticks, _regions
from .measured import _log_panel, peaked

BASELINE_COLOR, INTERVENED_COLOR, PREDICTED_COLOR = "C0", "C3", "k"


def effect_figure(baseline, intervened, predicted, *, bands=(None, None), labels=("", "", "", ""),
                  predicted_baseline=None, level: float = 0.95, title: str = ""):
    """The measured baseline (blue) and intervened (red) profiles over their pointwise bands, and the
    rollout's predicted intervened profile (black, dashed); the predicted baseline (grey, dotted) where given.

    `bands`: per measurement None or ``(2, N)`` lower and upper ends
    (`jaxroll.measure.uncertainty.profile_band`). `labels`: the legend
    entries of baseline, intervened, prediction and predicted baseline
    ("" names them plainly). The title may run to several lines.
    Edges and middle are shaded as `jaxroll.metrics` defines them (the
    middle mass is one of the changes reported). When a curve is `peaked`,
    a second panel shows the measurements on a log y axis.
    """
    baseline, intervened, predicted = (np.asarray(p, dtype=np.float64) for p in (baseline, intervened, predicted))
    names = tuple(label or default for label, default in zip(labels, (
        "baseline, measured (mean over sequences)", "intervened, measured (mean over sequences)",
        "intervened, predicted (rollout)", "baseline, predicted (rollout)")))
    spike = peaked(baseline, intervened, predicted)
    lines = title.count("\n") + 1
    figure, panels = _figure(8 * (1 + spike), 4.4 + 0.17 * lines, 1 + spike, top=0.25 + 0.17 * lines + 0.3 * spike)
    axes = panels[0, 0]
    positions = np.arange(baseline.size)
    _regions(axes, baseline.size)
    for band, color, name in zip(bands, (BASELINE_COLOR, INTERVENED_COLOR), ("baseline", "intervened")):
        _band(axes, band, level, color=color, label=f"{name}: {100 * level:g}% pointwise bootstrap band")
    axes.plot(positions, baseline, color=BASELINE_COLOR, label=names[0])
    axes.plot(positions, intervened, color=INTERVENED_COLOR, label=names[1])
    axes.plot(positions, predicted, color=PREDICTED_COLOR, linestyle="--", label=names[2])
    if predicted_baseline is not None:
        axes.plot(positions, np.asarray(predicted_baseline, dtype=np.float64), color="0.45", linestyle=":",
                  label=names[3])
    axes.set_xlim(-0.5, baseline.size - 0.5)
    axes.set_ylim(bottom=0.0)
    axes.set_xlabel(POSITION_LABEL)
    axes.set_ylabel("normalised influence (sums to 1)")
    _few_ticks(axes)
    axes.set_title(title if not spike else "linear axes", fontsize=9, y=1.0)
    axes.legend(fontsize=7)
    if spike:
        _log_panel(panels[0, 1], [(names[0], baseline, BASELINE_COLOR), (names[1], intervened, INTERVENED_COLOR),
                                  (names[2], predicted, PREDICTED_COLOR)], [*bands, None], level)
        panels[0, 1].lines[-1].set_linestyle("--")  # the prediction dashed on both panels
        panels[0, 1].legend(fontsize=7)
        figure.suptitle(title, fontsize=9)
    return figure
