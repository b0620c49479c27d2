"""A fit of a rollout to a target profile, and its loss curve (`jaxroll fit`)."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from ._canvas import INFLUENCE_LABEL, POSITION_LABEL, _few_ticks, _figure, _log_axis, _regions

CLIP_FACTOR = 1.25
"""The fit figure's profile panel clips its y range at this times the largest
value before the last token when a last-token spike would flatten the rest."""


def fit_figure(target, initial, fitted, losses=None, *, initial_loss: float | None = None, title: str = ""):
    """A fit: target, initial and fitted profiles on linear axes; the loss curve beside.

    The profile panel shades the regions of the printed statistics
    (`_regions`); when a spike at the last token would flatten the rest, its
    y range is clipped (`CLIP_FACTOR`) and each clipped last value is marked
    at the top edge, its value in the legend. The loss panel starts at
    `initial_loss` (the loss of the model given, the summary's "before") at
    step 0, then the loss at every iterate of `jaxroll.fit`'s returned
    restart (``FitResult.losses``; its start, the best point of the global
    design, at step 1), on a log axis with at least two labelled ticks when
    every loss is positive.
    """
    target, initial, fitted = (np.asarray(x, dtype=np.float64) for x in (target, initial, fitted))
    positions = np.arange(target.size)
    panels = 2 if losses is not None and len(losses) else 1
    figure, axes = _figure(6.5 * panels, 4.2, panels)
    profile_axes = axes[0, 0]
    _regions(profile_axes, target.size)
    curves = (("target", target, dict(color="k", linewidth=2)),
              ("initial", initial, dict(color="C3", linestyle="--")),
              ("fitted", fitted, dict(color="C0")))
    top = _clipped_top(target, initial, fitted)
    for name, profile, style in curves:
        profile_axes.plot(positions, profile, label=name, **style)
    if top is not None:
        # A spike at the last token: clip there and mark each clipped value at the top edge.
        last = target.size - 1
        for name, profile, style in curves:
            if profile[last] > top:
                profile_axes.plot([last], [0.97 * top], marker="^", linestyle="none", color=style["color"],
                                  label=f"{name} at j = {last}: {profile[last]:.3g} (above the clipped range)")
    profile_axes.set_xlim(-0.5, target.size - 0.5)
    profile_axes.set_ylim(0.0, top)
    profile_axes.set_xlabel(POSITION_LABEL)
    profile_axes.set_ylabel(INFLUENCE_LABEL)
    profile_axes.set_title("profiles (linear axes" + (", y clipped at the last token)" if top else ")"), y=1.0)
    _few_ticks(profile_axes)
    profile_axes.legend(fontsize=7)
    if panels == 2:
        _loss_panel(axes[0, 1], np.asarray(losses, dtype=np.float64), initial_loss)
    figure.suptitle(title, fontsize=10)
    return figure


def _clipped_top(*profiles) -> float | None:
    """The top of the profile panel when a last-token spike would flatten the
    rest (`CLIP_FACTOR` times the largest value before the last token, if a
    last value exceeds twice that), else None (the full range)."""
    stacked = np.stack(profiles)
    if stacked.shape[-1] < 3:
        return None
    rest = float(stacked[:, :-1].max())
    top = CLIP_FACTOR * rest
    return top if rest > 0 and float(stacked[:, -1].max()) > 2 * top else None


def _loss_panel(axes, losses, initial_loss: float | None) -> None:
    """The loss at x = 0 for the model given (the summary's "before", when
    known), then at every iterate of the returned restart (its first, x = 1,
    the best point of the global design)."""
    offset = 0 if initial_loss is None else 1
    steps = np.arange(losses.size) + offset
    if initial_loss is not None:
        axes.plot([0, 1], [initial_loss, losses[0]], color="C0", linestyle=":")
        axes.plot([0], [initial_loss], "o", color="C3", label=f"before: {initial_loss:.4g} (the model given)")
    axes.plot(steps, losses, color="C0",
              label=f"optimiser steps: {losses[0]:.4g} (its start) to {losses[-1]:.4g}")
    drawn = losses if initial_loss is None else np.r_[initial_loss, losses]
    if np.all(drawn > 0):
        _log_axis(axes, float(drawn.min()), float(drawn.max()))
    axes.set_xlabel("step (0 = the model given, 1 = the optimiser's start)" if offset else "optimisation step")
    axes.set_ylabel("loss" + (" (log)" if np.all(drawn > 0) else ""))
    axes.set_title("optimisation", y=1.0)
    axes.xaxis.set_major_locator(MaxNLocator(6, integer=True))
    axes.legend(fontsize=7)
