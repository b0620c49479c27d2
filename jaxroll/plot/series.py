"""A series over training (`jaxroll.measure.series`): the profile, lambda_t and the prediction's agreement by step.

Steps are drawn one column per checkpoint, labelled with their step: a
geometric schedule (0, 1, 2, 4, ..., 4096) is then evenly spaced, and step 0
has a place, which a log axis would not give it.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm

from ._canvas import POSITION_LABEL, _figure, _log_axis

STEP_LABEL = "training step (one column per checkpoint)"


def _step_ticks(axes, steps) -> None:
    """At most about 10 labelled checkpoints on the x axis, the first and last among them."""
    count = len(steps)
    shown = np.unique(np.round(np.linspace(0, count - 1, min(count, 10))).astype(int))
    axes.set_xticks(shown, [str(int(steps[k])) for k in shown], rotation=45 if count > 6 else 0, fontsize=8)
    axes.set_xlim(-0.5, count - 0.5)
    axes.set_xlabel(STEP_LABEL)


def series_figure(steps, measured, lambdas, w1_over_noise, *, title: str = ""):
    """Three panels over the C checkpoints of a series.

    Args:
        steps: (C,) training steps, increasing.
        measured: (C, N) measured influence profiles: a heatmap of position
            against step on a log colour scale (values <= 0 left blank) set by
            positions 0..N-2; the last position, where it is larger, is drawn at
            the top colour (the colour bar's arrow and label say so).
        lambdas: (C, L) measured ``lambda_t``: one line per layer over steps.
        w1_over_noise: (C,) ``W1(p, m) / noise`` of the rollout's prediction
            p against the measured m, on a log axis with 1 marked (a perfect
            prediction sits about there).
    """
    steps = np.asarray(steps)
    measured = np.asarray(measured, dtype=np.float64)
    lambdas = np.asarray(lambdas, dtype=np.float64)
    ratio = np.asarray(w1_over_noise, dtype=np.float64)
    count, n = measured.shape
    figure, ((heat, lines, agreement),) = _figure(17, 5.0, 3, left=0.8, right=0.35, bottom=0.95, top=0.75, gap=1.25)
    # The last token holds most of the mass (often > 0.5 against ~1/N elsewhere): a scale spanning it left
    # the other positions one colour, so the scale is set by positions 0..N-2 and the last one, above it,
    # is drawn at the top colour (the colour bar's arrow), which the bar's label says.
    body = measured[:, :-1] if n > 1 else measured
    positive = body[body > 0] if np.any(body > 0) else measured[measured > 0]
    norm = LogNorm(vmin=float(positive.min()), vmax=float(positive.max())) if positive.size else None
    above = bool(norm is not None and np.any(measured[:, -1] > norm.vmax))
    image = heat.imshow(np.ma.masked_less_equal(measured.T, 0.0), origin="lower", aspect="auto", cmap="viridis",
                        norm=norm, interpolation="nearest", extent=(-0.5, count - 0.5, -0.5, n - 0.5))
    label = "measured influence m(j) (log colour)"
    if n > 1:
        label += f"\nscale from j = 0..{n - 2}" + (f"; j = {n - 1}, above it: top colour" if above else "")
    bar = figure.colorbar(image, ax=heat, pad=0.02, extend="max" if above else "neither")
    bar.set_label(label, fontsize=8)
    _step_ticks(heat, steps)
    heat.set_ylabel(POSITION_LABEL)
    heat.set_title("measured profile by step", fontsize=9, y=1.0)
    layers = lambdas.shape[1]
    colours = [f"C{t % 10}" for t in range(layers)]
    for t in range(layers):
        lines.plot(np.arange(count), lambdas[:, t], "o-", markersize=3, color=colours[t],
                   label=f"layer {t}" if layers <= 12 or t in (0, layers - 1) else None)
    _step_ticks(lines, steps)
    lines.set_ylabel("lambda_t (attention share of the residual update)")
    lines.set_ylim(0.0, max(1e-3, float(np.nanmax(lambdas))) * 1.1)
    lines.set_title(f"lambda_t by step ({layers} layers)", fontsize=9, y=1.0)
    lines.legend(fontsize=7, ncol=2 if layers > 6 else 1)
    finite = ratio[np.isfinite(ratio) & (ratio > 0)]
    agreement.plot(np.arange(count), np.where(ratio > 0, ratio, np.nan), "o-", color="C3",
                   label="W1(prediction, measured) / noise")
    agreement.axhline(1.0, color="k", linestyle="--", linewidth=1, label="1: as close as the noise allows")
    if finite.size:
        _log_axis(agreement, min(float(finite.min()), 1.0), max(float(finite.max()), 1.0))
    _step_ticks(agreement, steps)
    agreement.set_ylabel("W1 / noise (log)")
    agreement.set_title("residual-aware rollout against the measurement", fontsize=9, y=1.0)
    agreement.legend(fontsize=7)
    figure.suptitle(title or "position bias over training", fontsize=10)
    return figure

