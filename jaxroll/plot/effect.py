"""A predicted change against a measured one (`jaxroll effect`): two measurements and the rollout's prediction."""

from __future__ import annotations

import numpy as np

from ._canvas import POSITION_LABEL, _band, _figure, _few_ticks, _regions
from .measured import _log_panel

BASELINE_COLOR, INTERVENED_COLOR, PREDICTED_COLOR, PREDICTED_BASELINE_COLOR = "C0", "C3", "k", "0.45"


def effect_labels(name: str = "", sequences=(None, None), predictor: str = "the rollout") -> tuple:
    """The legend entries, by the intervention's `name` (``tau=0.7``; "" for an unnamed one): the measured
    baseline and intervened profiles (with their numbers of sequences), the predicted intervened and baseline
    profiles (by `predictor`), the measured change and the predicted change."""
    name = name or "intervened"
    counts = [f" (mean of {count} sequences)" if count else "" for count in sequences]
    return (f"baseline, measured{counts[0]}", f"{name}, measured{counts[1]}",
            f"{name}, predicted by {predictor}", f"baseline, predicted by {predictor}",
            f"measured change: {name} - baseline", f"predicted change: rollout({name}) - rollout(baseline)")


def effect_figure(baseline, intervened, predicted, *, predicted_baseline=None, bands=(None, None),
                  change_band=None, name: str = "", sequences=(None, None), level: float = 0.95, title: str = "",
                  predictor: str = "the rollout"):
    """Three panels: the measured baseline (blue) and intervened (red) profiles over their pointwise bands with
    the rollout's predicted intervened (black, dashed) and baseline (grey, dotted) profiles, on linear and on
    log y axes; and the changes, measured ``m_I - m_B`` (over `change_band`) and predicted ``p_I - p_B``.

    `bands`: per measurement None or ``(2, N)`` lower and upper ends
    (`jaxroll.measure.uncertainty.profile_band`); `change_band` the same for
    ``m_I - m_B``. `name`: the intervention (``tau=0.7``), which names the
    legends (`effect_labels`, with the numbers of `sequences`). Without
    `predicted_baseline` the third panel has no predicted change. `predictor`
    names where the predicted profiles come from (``"the per-sequence rows"``
    for `jaxroll predict-rows`). The title
    (the figure's) may run to several lines. The edges and middle are shaded
    as `jaxroll.metrics` defines them (the middle mass is one of the changes
    reported).
    """
    baseline, intervened, predicted = (np.asarray(p, dtype=np.float64) for p in (baseline, intervened, predicted))
    names = effect_labels(name, sequences, predictor)
    lines = title.count("\n") + 1
    figure, panels = _figure(19, 5.0 + 0.17 * lines, 3, top=0.55 + 0.17 * lines)
    linear, logarithmic, change = panels[0]
    positions = np.arange(baseline.size)
    _regions(linear, baseline.size)
    for band, color, which in zip(bands, (BASELINE_COLOR, INTERVENED_COLOR), ("baseline", name or "intervened")):
        _band(linear, band, level, color=color, label=f"{which}: {100 * level:g}% pointwise bootstrap band")
    curves = [(names[0], baseline, BASELINE_COLOR), (names[1], intervened, INTERVENED_COLOR),
              (names[2], predicted, PREDICTED_COLOR)]
    if predicted_baseline is not None:
        curves.append((names[3], np.asarray(predicted_baseline, dtype=np.float64), PREDICTED_BASELINE_COLOR))
    for label, profile, color in curves:
        linear.plot(positions, profile, color=color, label=label)
    linear.set_xlim(-0.5, baseline.size - 0.5)
    linear.set_ylim(bottom=0.0)
    linear.set_xlabel(POSITION_LABEL)
    linear.set_ylabel("normalised influence (sums to 1)")
    _few_ticks(linear)
    linear.set_title("linear y axis", fontsize=9, y=1.0)
    _log_panel(logarithmic, curves, [*bands, *([None] * (len(curves) - 2))], level)
    for axes in (linear, logarithmic):  # the predictions dashed and dotted on both panels
        _predictions_styled(axes, names)
    linear.legend(fontsize=7)
    logarithmic.legend(fontsize=7)
    _change_panel(change, intervened - baseline, change_band, level, names,
                  None if predicted_baseline is None else predicted - np.asarray(predicted_baseline, np.float64))
    figure.suptitle(title, fontsize=9)
    return figure


def _predictions_styled(axes, names) -> None:
    styles = {names[2]: "--", names[3]: ":"}
    for line in axes.lines:
        if line.get_label() in styles:
            line.set_linestyle(styles[line.get_label()])


def _change_panel(axes, measured, band, level: float, names, predicted=None) -> None:
    """The measured change ``m_I - m_B`` over its band and the rollout's predicted change ``p_I - p_B`` (the
    headline of `jaxroll effect`), per position, around a zero line."""
    positions = np.arange(measured.size)
    _regions(axes, measured.size)
    axes.axhline(0.0, color="0.3", linewidth=0.8)
    _band(axes, band, level, color=INTERVENED_COLOR, label=f"{100 * level:g}% pointwise bootstrap band of the "
                                                            "measured change")
    axes.plot(positions, measured, color=INTERVENED_COLOR, label=names[4])
    if predicted is not None:
        axes.plot(positions, predicted, color=PREDICTED_COLOR, linestyle="--", label=names[5] + " (headline)")
    axes.set_xlim(-0.5, measured.size - 0.5)
    axes.set_xlabel(POSITION_LABEL)
    axes.set_ylabel("change of normalised influence")
    _few_ticks(axes)
    axes.set_title("the change, intervened - baseline", fontsize=9, y=1.0)
    axes.legend(fontsize=7)
