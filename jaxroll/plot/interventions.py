"""Predicted influence profiles under interventions (`jaxroll.interventions`), beside the baseline."""

from __future__ import annotations

import numpy as np

from ._canvas import INFLUENCE_LABEL, POSITION_LABEL, _figure, _log_axis, _regions


def interventions_figure(baseline, changed: dict, *, title: str = ""):
    """The baseline profile and each intervened one: linear axes (left), log axis (right).

    `baseline` ``(N,)``; `changed` maps a label (the intervention and its
    strength) to its predicted profile ``(N,)``. Each legend entry gives the
    profile's middle mass (positions between the first and last 10 %) so the
    change of the middle reads off the legend; the right panel shows the ends.
    """
    baseline = np.asarray(baseline, dtype=np.float64)
    n = baseline.size
    edge = int(np.ceil(0.1 * n))

    def middle(profile):
        return float(profile[edge:n - edge].sum())

    figure, axes = _figure(13, 4.6, 2, top=0.75)
    positions = np.arange(n)
    curves = {f"baseline (middle mass {middle(baseline):.3f})": baseline}
    curves |= {f"{label} (middle mass {middle(np.asarray(p)):.3f})": np.asarray(p, dtype=np.float64)
               for label, p in changed.items()}
    for panel in axes[0]:
        _regions(panel, n)
        for k, (label, profile) in enumerate(curves.items()):
            panel.plot(positions, profile, color="k" if k == 0 else f"C{k - 1}", lw=2.0 if k == 0 else 1.3,
                       label=label)
        panel.set_xlim(-0.5, n - 0.5)
        panel.set_xlabel(POSITION_LABEL)
        panel.set_ylabel(INFLUENCE_LABEL)
    axes[0, 0].set_ylim(bottom=0.0)
    axes[0, 0].set_title("linear axes", fontsize=10)
    values = np.concatenate(list(curves.values()))
    _log_axis(axes[0, 1], float(values[values > 0].min()), float(values.max()))
    axes[0, 1].set_title("log axis: the ends and the middle's floor", fontsize=10)
    axes[0, 0].legend(fontsize=7.5)
    figure.suptitle(title, fontsize=11)
    return figure
