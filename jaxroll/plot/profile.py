"""The influence profile of a rollout, and its attention-only contrast or, after an intervention, the
baseline and the difference (`jaxroll rollout`)."""

from __future__ import annotations

import numpy as np

from ._canvas import (INFLUENCE_LABEL, POSITION_LABEL, _above, _few_ticks, _figure, _hidden_note, _log_axis,
                      _log_floor, _profile_panel, _regions)

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


def intervened_profile_figure(baseline, changed, *, change: str, title: str = ""):
    """The profile before and after an intervention (`jaxroll rollout --intervene`), and their difference.

    Left (linear axes): the baseline profile ``p_T(j)`` of the model as given (black) and the predicted
    profile of the changed model (red), each with its middle mass ``sum p[k:n-k]``,
    ``k = metrics.edge_count(n)`` (what the summary prints), the regions shaded. Right: the difference
    ``p'_T(j) - p_T(j)`` against position, zero marked, titled with the change of the middle mass.
    Both ``(N,)`` over the same N positions (with sinks, the changed profile over the original
    positions, renormalised).
    """
    from ._canvas import edge_count

    baseline, changed = (np.asarray(p, dtype=np.float64) for p in (baseline, changed))
    n = baseline.size
    k = edge_count(n)

    def middle(profile):
        return float(profile[k:max(k, n - k)].sum())

    figure, axes = _figure(13, 4.6, 2, top=0.75)
    left, right = axes[0]
    _profile_panel(left, changed, label=f"with {change} (predicted): middle mass {middle(changed):.4g}",
                   color="C3", minimum_of="the changed model")
    left.plot(np.arange(n), baseline, color="k", lw=1.4, label=f"baseline (no intervention): middle mass "
                                                             f"{middle(baseline):.4g}", zorder=1.5)
    left.set_ylim(bottom=0.0, top=1.05 * float(max(baseline.max(), changed.max())))
    left.set_title("baseline and changed model (linear axes)", y=1.0)
    left.legend(fontsize=7.5)
    difference = changed - baseline
    _regions(right, n)
    right.plot(np.arange(n), difference, color="C3", label=f"with {change} minus baseline")
    right.axhline(0.0, color="k", lw=0.8, label="0: no change")
    right.set_xlim(-0.5, n - 0.5)
    right.set_xlabel(POSITION_LABEL)
    right.set_ylabel("change of p_T(j) (changed - baseline)")
    _few_ticks(right)
    right.set_title(f"difference: middle mass {middle(baseline):.4g} -> {middle(changed):.4g} "
                    f"({middle(changed) - middle(baseline):+.4g})", y=1.0)
    right.legend(fontsize=7.5)
    figure.suptitle(title, fontsize=10)
    return figure
