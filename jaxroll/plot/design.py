"""A design's profiles: before and after the designed interventions, and the target (`jaxroll design`)."""

from __future__ import annotations

import numpy as np

from ._canvas import INFLUENCE_LABEL, POSITION_LABEL, _figure, _log_axis, _regions, edge_count


_SHOWN_VALUES = 8  # values of one parameter written in the box; more are counted (interventions.yaml has all)


def designed_text(designed, kl=None, kl_budget=None) -> str:
    """The box's text: each designed parameter's value(s) (``tau = 0.8123``; an array flattened,
    ``tau (3 values) = 0.81, 0.75, 0.92``), then the largest kernel KL per layer and its budget."""
    lines = ["designed (interventions.yaml):"]
    for name, value in designed.items():
        if isinstance(value, str):  # a form, not a number (kappa_form: log1p)
            lines.append(f"{name} = {value}")
            continue
        flat = np.ravel(np.asarray(value, dtype=np.float64))
        shown = ", ".join(f"{x:.4g}" for x in flat[:_SHOWN_VALUES])
        more = f", ... ({flat.size - _SHOWN_VALUES} more)" if flat.size > _SHOWN_VALUES else ""
        lines.append(f"{name} = {shown}" if flat.size == 1 else f"{name} ({flat.size} values) = {shown}{more}")
    if kl is not None and np.size(kl):
        budget = "" if kl_budget is None else f" (budget {kl_budget:g})"
        lines.append(f"kernel KL, largest layer: {float(np.max(kl)):.4g}{budget}")
    return "\n".join(lines)


def design_figure(before, after, target=None, *, fraction: float = 0.1, title: str = "", designed=None, kl=None,
                  kl_budget=None):
    """The profile before and after a design (and its target, dashed): linear axes (left), log axis (right).

    Each legend entry gives the profile's middle mass ``sum p[k:n-k]``, ``k = edge_count(n, fraction)``,
    the statistic a shape goal raises; the shaded bands are the edges that define it. `designed`
    (``{name: value}``, what interventions.yaml holds) is written in a box on the log panel
    (`designed_text`), with the largest of the per-layer kernel KLs `kl` and its `kl_budget`.
    """
    before, after = (np.asarray(p, dtype=np.float64) for p in (before, after))
    n = before.size
    k = edge_count(n, fraction)

    def middle(profile):
        return float(profile[k:max(k, n - k)].sum())

    curves = {f"before (middle mass {middle(before):.3f})": (before, "k", "-", 2.0),
              f"after the design (middle mass {middle(after):.3f})": (after, "C3", "-", 1.6)}
    if target is not None:
        target = np.asarray(target, dtype=np.float64)
        curves[f"target (middle mass {middle(target):.3f})"] = (target, "C0", "--", 1.3)
    figure, axes = _figure(13, 4.6, 2, top=0.75)
    positions = np.arange(n)
    for panel in axes[0]:
        _regions(panel, n)
        for label, (profile, color, style, width) in curves.items():
            panel.plot(positions, profile, color=color, linestyle=style, lw=width, label=label)
        panel.set_xlim(-0.5, n - 0.5)
        panel.set_xlabel(POSITION_LABEL)
        panel.set_ylabel(INFLUENCE_LABEL)
    axes[0, 0].set_ylim(bottom=0.0)
    axes[0, 0].set_title("linear axes", fontsize=10)
    values = np.concatenate([curve[0] for curve in curves.values()])
    _log_axis(axes[0, 1], float(values[values > 0].min()), float(values.max()))
    axes[0, 1].set_title("log axis: the ends and the middle's floor", fontsize=10)
    axes[0, 0].legend(fontsize=7.5)
    if designed:
        axes[0, 1].text(0.97, 0.96, designed_text(designed, kl, kl_budget), transform=axes[0, 1].transAxes,
                        ha="right", va="top", multialignment="left", fontsize=8,
                        bbox=dict(boxstyle="round", facecolor="white",
                                                                  edgecolor="0.6", alpha=0.9))
    figure.suptitle(title, fontsize=10.5)
    return figure
