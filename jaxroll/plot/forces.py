"""The forces ladder: causal masking alone, then residual, ALiBi and content added (`jaxroll forces`)."""

from __future__ import annotations

import numpy as np

from ._canvas import (INFLUENCE_LABEL, POSITION_LABEL, _above, _few_ticks, _figure, _hidden_note, _log_axis,
                      _log_floor, _regions)

FORCE_LABELS = {
    "causal": "causal masking alone (lambda = 1, no slopes, no content)",
    "residual": "+ residual (the measured lambdas)",
    "alibi": "+ ALiBi slopes",
    "content": "+ content (diagonal scores)",
}
"""Legend labels of the rungs of `jaxroll.theory.forces`."""


RUNG_STYLES = (("-", 1.5), (":", 3.6), ("--", 2.6), ("-", 1.3))
"""(linestyle, linewidth) of the forces rungs in order: each differs from the
others, and earlier rungs are drawn wider so that one under a later rung shows."""

COINCIDE = 1e-6
"""Two rungs *coincide* when ``max |p - q| <= COINCIDE * max q``; the legend says so."""


def _coincidences(profiles, labels) -> list[str]:
    """`labels`, each rung that coincides (`COINCIDE`) with an earlier rung saying so."""
    out = list(labels)
    for k in range(1, len(profiles)):
        for j in range(1, k):
            if np.max(np.abs(profiles[k] - profiles[j])) <= COINCIDE * np.max(np.abs(profiles[j])):
                out[k] = f"{labels[k]} (coincides with {labels[j]})"
                break
    return out


def forces_figure(profiles, names, *, title: str = ""):
    """The rungs of `jaxroll.theory.forces`, each labelled by the force it adds (`FORCE_LABELS`).

    `profiles` is ``(K, n)`` (causal masking alone, + residual, + ALiBi,
    + content). Left: the residual-aware rungs on linear axes (the shape each
    force gives). Right: every rung on a log axis; causal masking alone puts
    nearly all mass on token 0 (marked, its value in the legend) and leaves
    later tokens below the floor, which are not drawn.
    """
    profiles = np.asarray(profiles, dtype=np.float64)
    positions = np.arange(profiles.shape[-1])
    labels = [FORCE_LABELS.get(name, f"+ {name}") for name in names]
    figure, ((linear, logarithmic),) = _figure(13, 4.6, 2)
    _regions(linear, profiles.shape[-1])
    floor = _log_floor(profiles[1:])
    labels = _coincidences(profiles, labels)
    for k, (profile, label) in enumerate(zip(profiles, labels)):
        # A style and width of its own per rung, wider underneath, so a rung
        # that lies on a later one still shows round it.
        style, width = RUNG_STYLES[min(k, len(RUNG_STYLES) - 1)]
        if k > 0:
            linear.plot(positions, profile, color=f"C{k}", linestyle=style, linewidth=width, label=label)
        shown, hidden = _above(profile, floor)
        if k == 0:
            # Causal masking alone: every row reads itself and the past with
            # equal scores, T times; the mass drains onto token 0 and the rest
            # underflows. Mark p[0] so the rung is visible even when nothing
            # else is above the floor.
            label = f"{label}: p[0] = {profile[0]:.4g}"
            logarithmic.plot([0], [profile[0]], "o", color="C0")
        logarithmic.plot(positions, shown, color=f"C{k}", linestyle=style, linewidth=width,
                         label=label + _hidden_note(hidden, floor))
    # Scale to the full model (the last rung): an earlier rung's spike at
    # token 0 would flatten the shape that matters.
    top = 1.25 * float(profiles[-1].max())
    clipped = bool(profiles[1:].max() > top)
    linear.set_ylim(0.0, top)
    linear.set_title("residual-aware rungs (linear axes" + (", peaks clipped)" if clipped else ")"), y=1.0)
    _log_axis(logarithmic)
    logarithmic.set_ylim(bottom=floor, top=1.5)
    logarithmic.set_title(f"every rung (log axis; values < {floor:.1e} not drawn)", y=1.0)
    for axes in (linear, logarithmic):
        axes.set_xlim(-0.5, profiles.shape[-1] - 0.5)
        axes.set_xlabel(POSITION_LABEL)
        axes.set_ylabel(INFLUENCE_LABEL)
        _few_ticks(axes)
        axes.legend(fontsize=7, loc="lower center" if axes is logarithmic else "best")
    figure.suptitle(title, fontsize=10)
    return figure
