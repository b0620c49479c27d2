"""Measurements of real models: lambdas by layer, the measured influence, two profiles side by side
(`jaxroll measure`, `jaxroll compare --plot`, `jaxroll score --plot`)."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from ._canvas import _band, _figure, _profile_panel


def lambdas_figure(lambdas, spread=None, *, title: str = ""):
    """Measured mixing coefficients ``lambda_t`` against layer, with their spread across sequences."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    layers = np.arange(1, lambdas.size + 1)
    figure, ((axes,),) = _figure(7, 4, top=0.4)
    axes.errorbar(layers, lambdas, yerr=spread, marker="o", capsize=3,
                  label="mean over sequences" + ("; bars: one standard deviation" if spread is not None else ""))
    axes.set_xlabel("layer t (1 = first)")
    # Layers are whole numbers: integer ticks inside 1..T only.
    axes.xaxis.set_major_locator(MaxNLocator(10, integer=True, steps=(1, 2, 5, 10)))
    axes.set_xlim(0.5, lambdas.size + 0.5)
    axes.set_ylabel("lambda_t = ||a|| / (||x|| + ||a||) (dimensionless)")
    top = lambdas if spread is None else lambdas + np.asarray(spread)
    axes.set_ylim(0.0, max(1e-3, float(np.max(top))) * 1.1)
    axes.set_title(title, fontsize=10, y=1.0)
    axes.legend(fontsize=8)
    return figure


def measured_influence_figure(influence, *, title: str = "", band=None, level: float = 0.95):
    """Measured gradient influence ``||df / de_j||`` (normalised to sum 1) on linear axes.

    `band` ``(2, N)``: a pointwise bootstrap band over sequences at `level`
    (`jaxroll.measure.uncertainty.profile_band`), drawn shaded.
    """
    influence = np.asarray(influence, dtype=np.float64)
    figure, ((axes,),) = _figure(7, 4.2, top=0.4)
    _band(axes, band, level)
    _profile_panel(axes, influence, label="measured gradient influence")
    axes.set_ylabel("normalised ||df / de_j|| (sums to 1)")
    axes.set_title(title, fontsize=10, y=1.0)
    axes.legend(fontsize=8)
    return figure


def two_profiles_figure(first, second, *, labels: tuple[str, str], bands=(None, None),
                        band_labels: tuple[str, str] = ("", ""), level: float = 0.95, title: str = ""):
    """Two profiles on one linear axis (first blue, second red), each over its pointwise band where given.

    `bands`: per profile ``None`` or ``(2, N)`` lower and upper ends
    (`jaxroll.measure.uncertainty.profile_band`: the ``(1 -+ level) / 2``
    quantiles of each position's bootstrap means), drawn shaded in the
    profile's colour. The first profile is drawn as `profile_figure` draws
    one (edges and middle shaded, its minimum marked).
    """
    first = np.asarray(first, dtype=np.float64)
    figure, ((axes,),) = _figure(8, 4.4, top=0.45)
    for band, color, band_label in zip(bands, ("C0", "C3"), band_labels):
        _band(axes, band, level, color=color, label=band_label)
    _profile_panel(axes, first, label=labels[0], minimum_of="the blue curve")
    axes.plot(np.arange(first.size), np.asarray(second, dtype=np.float64), color="C3", label=labels[1])
    axes.set_ylabel("normalised influence (sums to 1)")
    axes.set_title(title, fontsize=9, y=1.0)
    axes.legend(fontsize=8)
    return figure
