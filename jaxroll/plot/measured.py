"""Measurements of real models: lambdas by layer, the measured influence, two profiles side by side
(`jaxroll measure`, `jaxroll compare --out DIR`, `jaxroll score --out DIR`)."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from ._canvas import INFLUENCE_LABEL, POSITION_LABEL, _band, _figure, _few_ticks, _log_axis, _log_floor, _profile_panel

PEAK_RATIO = 10.0
"""A profile is *peaked* when its largest value exceeds this many times its median (a
spike at the last positions): on a linear axis everything else is a flat line under the
spike, so the figures add a panel with a log y axis, where the curves and bands show."""


def peaked(*profiles) -> bool:
    """Whether any of `profiles` has ``max > PEAK_RATIO * median`` (see `PEAK_RATIO`)."""
    for profile in profiles:
        profile = np.asarray(profile, dtype=np.float64)
        positive = profile[profile > 0]
        if positive.size and float(positive.max()) > PEAK_RATIO * float(np.median(positive)):
            return True
    return False


def _log_panel(axes, curves, bands, level: float) -> None:
    """`curves` ``[(label, profile, color)]`` over their `bands` (``(2, N)`` or None) on a log y axis;
    values below the `_log_floor` are not drawn, band ends below it are drawn at it."""
    floor = _log_floor(*(profile for _, profile, _ in curves))
    for (label, profile, color), band in zip(curves, bands):
        if band is not None:
            low, high = np.asarray(band, dtype=np.float64)
            axes.fill_between(np.arange(low.size), np.maximum(low, floor), np.maximum(high, floor), color=color,
                              alpha=0.25, linewidth=0, label=f"{100 * level:g}% pointwise band")
        profile = np.asarray(profile, dtype=np.float64)
        axes.plot(np.arange(profile.size), np.ma.masked_less(profile, floor), color=color, label=label)
    values = np.concatenate([np.asarray(p, dtype=np.float64) for _, p, _ in curves])
    values = values[values >= floor]
    _log_axis(axes, float(values.min()), float(values.max()))
    axes.set_ylim(bottom=max(floor, 0.3 * float(values.min())))  # no empty decades under the curves
    axes.set_xlim(-0.5, len(curves[0][1]) - 0.5)
    axes.set_xlabel(POSITION_LABEL)
    axes.set_ylabel(f"{INFLUENCE_LABEL} (log)")
    _few_ticks(axes)
    axes.set_title("log y axis: the whole profile beside the peak", fontsize=9, y=1.0)
    axes.legend(fontsize=7)


def lambdas_figure(lambdas, spread=None, *, title: str = ""):
    """Measured mixing coefficients ``lambda_t`` against layer, with their spread across sequences."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    layers = np.arange(lambdas.size)  # numbered from 0, as every array and message numbers them
    figure, ((axes,),) = _figure(7, 4, top=0.4)
    axes.errorbar(layers, lambdas, yerr=spread, marker="o", capsize=3,
                  label="mean over sequences" + ("; bars: one standard deviation" if spread is not None else ""))
    axes.set_xlabel("layer t (0 = first)")
    # Layers are whole numbers: integer ticks inside 0..T-1 only.
    axes.xaxis.set_major_locator(MaxNLocator(10, integer=True, steps=(1, 2, 5, 10)))
    axes.set_xlim(-0.5, lambdas.size - 0.5)
    axes.set_ylabel("lambda_t = ||a|| / (||x|| + ||a||) (dimensionless)")
    top = lambdas if spread is None else lambdas + np.asarray(spread)
    axes.set_ylim(0.0, max(1e-3, float(np.max(top))) * 1.1)
    axes.set_title(title, fontsize=10, y=1.0)
    axes.legend(fontsize=8)
    return figure


def measured_influence_figure(influence, *, title: str = "", band=None, level: float = 0.95):
    """Measured gradient influence ``||df / de_j||`` (normalised to sum 1) on linear axes,
    and beside it on a log y axis when the profile is `peaked`.

    `band` ``(2, N)``: a pointwise bootstrap band over sequences at `level`
    (`jaxroll.measure.uncertainty.profile_band`), drawn shaded.
    """
    influence = np.asarray(influence, dtype=np.float64)
    spike = peaked(influence)
    figure, panels = _figure(7 * (1 + spike), 4.2, 1 + spike, top=0.4 + 0.3 * spike)
    axes = panels[0, 0]
    _band(axes, band, level)
    _profile_panel(axes, influence, label="measured gradient influence")
    axes.set_ylabel("normalised ||df / de_j|| (sums to 1)")
    axes.set_title(title if not spike else "linear axes", fontsize=10 if not spike else 9, y=1.0)
    axes.legend(fontsize=8)
    if spike:
        _log_panel(panels[0, 1], [("measured gradient influence", influence, "C0")], [band], level)
        figure.suptitle(title, fontsize=10)
    return figure


def two_profiles_figure(first, second, *, labels: tuple[str, str], bands=(None, None),
                        band_labels: tuple[str, str] = ("", ""), level: float = 0.95, title: str = ""):
    """Two profiles on one linear axis (first blue, second red), each over its pointwise band where given.

    `bands`: per profile ``None`` or ``(2, N)`` lower and upper ends
    (`jaxroll.measure.uncertainty.profile_band`: the ``(1 -+ level) / 2``
    quantiles of each position's bootstrap means), drawn shaded in the
    profile's colour. The first profile is drawn as `profile_figure` draws
    one (edges and middle shaded, its minimum marked). When either profile is
    `peaked`, a second panel shows both with their bands on a log y axis.
    """
    first = np.asarray(first, dtype=np.float64)
    second = np.asarray(second, dtype=np.float64)
    spike = peaked(first, second)
    figure, panels = _figure(8 * (1 + spike), 4.4, 1 + spike, top=0.45 + 0.3 * spike)
    axes = panels[0, 0]
    for band, color, band_label in zip(bands, ("C0", "C3"), band_labels):
        _band(axes, band, level, color=color, label=band_label)
    _profile_panel(axes, first, label=labels[0], minimum_of="the blue curve")
    axes.plot(np.arange(first.size), second, color="C3", label=labels[1])
    axes.set_ylabel("normalised influence (sums to 1)")
    axes.set_title(title if not spike else "linear axes", fontsize=9, y=1.0)
    axes.legend(fontsize=8)
    if spike:
        _log_panel(panels[0, 1], [(labels[0], first, "C0"), (labels[1], second, "C3")], bands, level)
        figure.suptitle(title, fontsize=9)
    return figure
