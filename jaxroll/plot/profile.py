"""The influence profile of a rollout, and its attention-only contrast (`jaxroll rollout`)."""

from __future__ import annotations

import numpy as np

from ._canvas import (INFLUENCE_LABEL, POSITION_LABEL, _above, _few_ticks, _figure, _hidden_note, _log_axis,
                      _log_floor, _profile_panel)

COLLAPSE_THRESHOLD = 0.5
"""An attention-only profile has *collapsed* onto the first token when ``p[0] > 0.5``:
the first token outweighs all the others together. Only then is the contrast panel
titled a collapse."""


def collapsed(profile) -> bool:
    """True when ``profile[0] > COLLAPSE_THRESHOLD`` (see there)."""
    return bool(np.asarray(profile, dtype=np.float64)[0] > COLLAPSE_THRESHOLD)


def profile_figure(profile, attention_only=None, *, title: str = "", attention_only_model: bool = False):
    """The influence profile on linear axes; the attention-only contrast beside it on a log axis.

    Left: ``p_T(j)`` against position, the minimum marked, the first and
    last k positions and the middle between them shaded (exactly the
    first_mass, middle_mass and last_mass the summary prints; `_regions`). Right, when
    `attention_only` (the ``lambda = 1`` profile of the same kernels) is given:
    both profiles on a log axis, titled a collapse only when
    ``p[0] > COLLAPSE_THRESHOLD``; values below the `FLOOR_DECADES` floor are
    not drawn (the legend counts them).

    `attention_only_model`: the profile itself is an attention-only rollout
    (every ``lambda_t = 1``, e.g. ``--no-residual``); it is labelled so, and
    no contrast panel is drawn (it would show the same curve twice).
    """
    profile = np.asarray(profile, dtype=np.float64)
    if attention_only_model:
        attention_only = None
    label = "attention-only rollout (every lambda = 1)" if attention_only_model else "residual-aware rollout"
    panels = 1 if attention_only is None else 2
    figure, axes = _figure(6.5 * panels, 4.2, panels)
    _profile_panel(axes[0, 0], profile, label=label)
    axes[0, 0].set_title(f"{label} (linear axes)", y=1.0)
    axes[0, 0].legend(fontsize=8)
    if attention_only is not None:
        attention_only = np.asarray(attention_only, dtype=np.float64)
        contrast = axes[0, 1]
        positions = np.arange(profile.size)
        floor = _log_floor(profile)
        shown, hidden = _above(profile, floor)
        contrast.plot(positions, shown, color="C0", label=label + _hidden_note(hidden, floor))
        shown, hidden = _above(attention_only, floor)
        contrast.plot(positions, shown, color="C3", linestyle="--",
                      label=f"attention only (lambda = 1): p[0] = {attention_only[0]:.4g}"
                            + _hidden_note(hidden, floor))
        if attention_only[0] >= floor:  # visible even when every other value is below the floor
            contrast.plot([0], [attention_only[0]], "o", color="C3")
        _log_axis(contrast)
        contrast.set_ylim(bottom=floor)
        contrast.set_xlim(-0.5, profile.size - 0.5)
        contrast.set_xlabel(POSITION_LABEL)
        contrast.set_ylabel(f"{INFLUENCE_LABEL} (log)")
        _few_ticks(contrast)
        if collapsed(attention_only):
            contrast.set_title(f"contrast: the attention-only collapse (p[0] > {COLLAPSE_THRESHOLD:g})", y=1.0)
        else:
            contrast.set_title(f"contrast: attention only, no collapse (p[0] <= {COLLAPSE_THRESHOLD:g})", y=1.0)
        contrast.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    return figure
