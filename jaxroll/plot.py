"""Figures. Matplotlib's Agg canvas: files, never a window.

Figures are `matplotlib.figure.Figure` objects on an Agg canvas, without
pyplot (no figure manager, no backend selection) and with fixed margins
instead of constrained layout: the layout engine measured every tick label
of every panel several times, which took most of a small rollout's time.
Log axes label their decades as plain text (``1e-05``), not mathtext.

Influence profiles are drawn on linear axes, where the U-shape of the paper
(primacy and recency, the lost middle) is visible; quantities that span many
orders of magnitude (the attention-only collapse, the causal-masking rung of
the forces ladder) get a log-scaled panel of their own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

POSITION_LABEL = "input position j (0 = first token)"
INFLUENCE_LABEL = "influence on the last position, p_T(j)"


def _figure(width: float, height: float, panels: int = 1, *, left: float = 0.75, right: float = 0.2,
            bottom: float = 0.55, top: float = 0.6, gap: float = 0.85, layout=None):
    """A `Figure` on an Agg canvas with `panels` axes side by side, margins in inches.

    `top` leaves room for a panel title and the figure's suptitle; `gap` for
    the next panel's y label. ``layout="constrained"`` for figures whose
    labels vary too much for fixed margins (sweep heatmaps).
    """
    figure = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, panels, squeeze=False)
    if layout is None:
        width_each = (width - left - right - gap * (panels - 1)) / panels
        figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                               top=1 - top / height, wspace=gap / width_each)
    return figure, axes


def _decade(value, _position) -> str:
    """A log axis's tick label as plain text (``1e-05``): no mathtext to lay out."""
    return f"{value:.0e}"


def _log_axis(axes, low: float | None = None, high: float | None = None) -> None:
    """A log-scaled y axis with plain-text labels and unlabelled minor ticks.

    Decades get labels; when the data (`low` .. `high`) span too little for
    two decade ticks, 2 and 5 times the decades are labelled as well, and
    below a factor of about 2.5 every integer multiple, so the axis always
    carries at least two labelled ticks inside its range.
    """
    axes.set_yscale("log")
    subs: tuple[float, ...] = (1.0,)
    if low is not None and high is not None and low > 0 and high > 0:
        span = np.log10(high / low)
        if _ticks_inside(low, high, (1.0,)) < 2:
            subs = (1.0, 2.0, 5.0) if _ticks_inside(low, high, (1.0, 2.0, 5.0)) >= 2 else \
                tuple(float(k) for k in range(1, 10))
        if span == 0:  # a flat curve: a range of a factor 2 around it
            low, high = low / np.sqrt(2.0), high * np.sqrt(2.0)
            axes.set_ylim(low, high)
            subs = tuple(float(k) for k in range(1, 10))
        if _ticks_inside(low, high, subs) < 2:  # flatter than 1 .. 9: widen to the nearest multiples
            axes.set_ylim(_multiple(low, np.floor), _multiple(high, np.ceil))
    axes.yaxis.set_major_locator(LogLocator(subs=subs, numticks=12))
    axes.yaxis.set_major_formatter(FuncFormatter(_decade))
    minor = (2.0, 5.0) if subs == (1.0,) else tuple(float(k) for k in range(1, 10) if float(k) not in subs)
    axes.yaxis.set_minor_locator(LogLocator(subs=minor or (1.0,), numticks=12))
    axes.yaxis.set_minor_formatter(NullFormatter())


def _multiple(value: float, rounding) -> float:
    """`value` rounded down (``np.floor``) or up (``np.ceil``) to ``k * 10^d``, k in 1 .. 9."""
    decade = 10.0 ** np.floor(np.log10(value))
    return float(max(1.0, rounding(value / decade)) * decade)


def _ticks_inside(low: float, high: float, subs) -> int:
    """How many values ``s * 10^d`` (s in `subs`) lie in ``[low, high]``."""
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    return sum(low <= s * 10.0**d <= high for d in decades for s in subs)


# Titles are placed at y = 1.0 explicitly (``set_title(..., y=1.0)``): an
# automatic title position measures every tick label of the axes to see
# whether any reaches above the top, and nothing here puts ticks on top.


def _few_ticks(axes) -> None:
    """At most about six labelled ticks per linear axis (each label is text to lay out and draw)."""
    axes.xaxis.set_major_locator(MaxNLocator(6, steps=(1, 2, 5, 10)))
    if axes.get_yscale() == "linear":
        axes.yaxis.set_major_locator(MaxNLocator(6, steps=(1, 2, 5, 10)))


def _regions(axes, n: int) -> None:
    """Shade the first and last k positions and the middle between them, as the
    printed statistics define them (`jaxroll.metrics`): ``first_mass = sum p[:k]``,
    ``middle_mass = sum p[k:n-k]``, ``last_mass = sum p[n-k:]``,
    ``k = metrics.edge_count(n)`` (a tenth of n, at least 1)."""
    from .metrics import edge_count

    k = edge_count(n)
    axes.axvspan(-0.5, k - 0.5, color="0.82", zorder=0,
                 label=f"first / last {k} positions (first_mass, last_mass)")
    axes.axvspan(n - k - 0.5, n - 0.5, color="0.82", zorder=0)
    if n - k > k:
        axes.axvspan(k - 0.5, n - k - 0.5, color="#f6f1e4", zorder=0,
                     label=f"middle, j = {k}..{n - k - 1} (middle_mass)")


def _profile_panel(axes, profile, *, label: str, color: str = "C0", minimum_of: str = "") -> None:
    """A profile on linear axes, its minimum marked (labelled as of `minimum_of` when given) and its edges
    and middle shaded (`_regions`)."""
    positions = np.arange(profile.size)
    _regions(axes, profile.size)
    axes.plot(positions, profile, color=color, label=label)
    lowest = int(np.argmin(profile))
    axes.plot([lowest], [profile[lowest]], "o", color="k",
              label=f"minimum{' of ' + minimum_of if minimum_of else ''} at j = {lowest} ({profile[lowest]:.3g})")
    axes.set_xlim(-0.5, profile.size - 0.5)
    axes.set_ylim(bottom=0.0)
    axes.set_xlabel(POSITION_LABEL)
    axes.set_ylabel(INFLUENCE_LABEL)
    _few_ticks(axes)


COLLAPSE_THRESHOLD = 0.5
"""An attention-only profile has *collapsed* onto the first token when ``p[0] > 0.5``:
the first token outweighs all the others together. Only then is the contrast panel
titled a collapse."""

FLOOR_DECADES = 3
"""Log panels draw values down to ``10^-3`` times the smallest positive value of the
residual-aware profile(s); smaller values (float underflow, or causal masking's
~1e-300 tail) are left out, not drawn at a made-up floor, and the legend says so."""


def collapsed(profile) -> bool:
    """True when ``profile[0] > COLLAPSE_THRESHOLD`` (see there)."""
    return bool(np.asarray(profile, dtype=np.float64)[0] > COLLAPSE_THRESHOLD)


def _log_floor(*arrays) -> float:
    """The lowest value a log panel draws: `FLOOR_DECADES` below the smallest positive entry."""
    values = np.concatenate([np.ravel(a) for a in arrays])
    values = values[values > 0]
    return float(values.min()) * 10.0**-FLOOR_DECADES if values.size else 1e-300


def _above(profile, floor: float):
    """`profile` with entries below `floor` masked (not drawn), and how many were masked."""
    hidden = profile < floor
    return np.ma.masked_where(hidden, profile), int(hidden.sum())


def _hidden_note(count: int, floor: float) -> str:
    return f"; {count} value{'s' if count != 1 else ''} < {floor:.1e} not drawn" if count else ""


def _save(figure, path) -> Path:
    """Write `figure` to `path` (a temporary name, then renamed) and close it."""
    import os

    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    figure.savefig(temporary, dpi=110, format="png")
    os.replace(temporary, path)
    return path


def profile_figure(profile, attention_only=None, *, title: str = "", attention_only_model: bool = False):
    """The figure of `plot_profile`, returned (a `matplotlib.figure.Figure`) rather than saved.

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


def plot_profile(path, profile, attention_only=None, *, title: str = "", attention_only_model: bool = False) -> Path:
    """The influence profile on linear axes; the attention-only contrast beside it on a log axis.

    Left: ``p_T(j)`` against position, the minimum marked, the first and
    last k positions and the middle between them shaded (exactly the
    first_mass, middle_mass and last_mass the summary prints; `_regions`). Right, when
    `attention_only` (the ``lambda = 1`` profile of the same kernels) is given:
    both profiles on a log axis, titled a collapse only when
    ``p[0] > COLLAPSE_THRESHOLD``; values below the `FLOOR_DECADES` floor are
    not drawn (the legend counts them). See `profile_figure`.
    """
    return _save(profile_figure(profile, attention_only, title=title,
                                attention_only_model=attention_only_model), path)


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
    """The figure of `plot_forces`, returned rather than saved."""
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


def plot_forces(path, profiles, names, *, title: str = "") -> Path:
    """The rungs of `jaxroll.theory.forces`, each labelled by the force it adds (`FORCE_LABELS`).

    `profiles` is ``(K, n)`` (causal masking alone, + residual, + ALiBi,
    + content). Left: the residual-aware rungs on linear axes (the shape each
    force gives). Right: every rung on a log axis; causal masking alone puts
    nearly all mass on token 0 (marked, its value in the legend) and leaves
    later tokens below the floor, which are not drawn.
    """
    return _save(forces_figure(profiles, names, title=title), path)


CLIP_FACTOR = 1.25
"""The fit figure's profile panel clips its y range at this times the largest
value before the last token when a last-token spike would flatten the rest."""


def fit_figure(target, initial, fitted, losses=None, *, initial_loss: float | None = None, title: str = ""):
    """The figure of `plot_fit`, returned rather than saved."""
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


def plot_fit(path, target, initial, fitted, losses=None, *, initial_loss: float | None = None,
             title: str = "") -> Path:
    """A fit: target, initial and fitted profiles on linear axes; the loss curve beside.

    The profile panel shades the regions of the printed statistics
    (`_regions`); when a spike at the last token would flatten the rest, its
    y range is clipped (`CLIP_FACTOR`) and each clipped last value is marked
    at the top edge, its value in the legend. The loss panel starts at
    `initial_loss` (the loss of the model given, the summary's "before") at
    step 0, then the loss at every iterate of `jaxroll.fit`'s returned
    restart (``FitResult.losses``; its start, the best point of the global
    design, at step 1), on a log axis with at least two labelled ticks when
    every loss is positive. See `fit_figure`.
    """
    return _save(fit_figure(target, initial, fitted, losses, initial_loss=initial_loss, title=title), path)


def plot_lambdas(path, lambdas, spread=None, *, title: str = "") -> Path:
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
    return _save(figure, path)


def plot_measured_influence(path, influence, *, title: str = "", band=None, level: float = 0.95) -> Path:
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
    return _save(figure, path)


def _band(axes, band, level: float, *, color: str = "C0", label: str = "") -> None:
    if band is not None:
        low, high = np.asarray(band, dtype=np.float64)
        axes.fill_between(np.arange(low.size), low, high, color=color, alpha=0.25, linewidth=0,
                          label=label or f"{100 * level:g}% pointwise bootstrap band over sequences")


def plot_two_profiles(path, first, second, *, labels: tuple[str, str], bands=(None, None),
                      band_labels: tuple[str, str] = ("", ""), level: float = 0.95, title: str = "") -> Path:
    """Two profiles on one linear axis (first blue, second red), each over its pointwise band where given.

    `bands`: per profile ``None`` or ``(2, N)`` lower and upper ends
    (`jaxroll.measure.uncertainty.profile_band`: the ``(1 -+ level) / 2``
    quantiles of each position's bootstrap means), drawn shaded in the
    profile's colour. The first profile is drawn as `plot_profile` draws
    one (edges and middle shaded, its minimum marked). `jaxroll compare
    --plot` and, through `plot_prediction_against_measurement`,
    `jaxroll score --plot`.
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
    return _save(figure, path)


def plot_prediction_against_measurement(path, measured, predicted, *, band=None, level: float = 0.95,
                                        title: str = "") -> Path:
    """A predicted profile over the measured one and its pointwise band (`jaxroll score --plot`)."""
    return plot_two_profiles(path, measured, predicted, bands=(band, None), level=level, title=title,
                             labels=("measured gradient influence (mean over sequences)", "prediction"))


def _numeric(ticks) -> bool:
    return all(isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, bool) for t in ticks)


def sweep_figures(statistics, axes, *, title: str = "") -> dict[str, object]:
    """The figures of `plot_sweep`, by file name, returned rather than saved.

    One axis: a line plot per statistic, ``line_<name>.png``; numeric values
    are placed by value on the x axis (uneven steps stay uneven). Two or
    more: a heatmap per statistic over the first two axes,
    ``heatmap_<name>.png``, with one panel per sequence length when the
    sweep has a ``length`` axis beyond the first two (every length drawn);
    any other axis is held at its first value, said in the title.
    """
    figures = {}
    length_facets = len(axes) > 2 and axes[-1][0] == "length"
    held_axes = axes[2:-1] if length_facets else axes[2:]
    held = ", ".join(f"{name} = {_tick(values[0])}" for name, values in held_axes)
    for name, values in statistics.items():
        values = np.asarray(values, dtype=np.float64)
        if values.ndim == 0 or len(axes) == 0:
            continue
        if values.ndim == 1:
            (axis_name, ticks), = axes[:1]
            figure, ((panel,),) = _figure(6, 4.5, layout="constrained")
            if _numeric(ticks):
                panel.plot(np.asarray(ticks, np.float64), values, "o-", color="C0")
                panel.set_xlabel(f"{axis_name} (placed by value)")
            else:
                panel.plot(np.arange(len(ticks)), values, "o-", color="C0")
                panel.set_xticks(np.arange(len(ticks)), [_tick(t) for t in ticks], rotation=45)
                panel.set_xlabel(f"{axis_name} (by index)")
            panel.set_ylabel(name)
            panel.set_title(f"{title}\n{name}", fontsize=9)
            figures[f"line_{name}.png"] = figure
            continue
        (row_name, rows), (column_name, columns) = axes[:2]
        facets = list(enumerate(axes[-1][1])) if length_facets else [(None, None)]
        figure, panels = _figure(1.0 + 5.0 * len(facets), 4.5, len(facets), layout="constrained")
        grid = values.reshape(values.shape[:2] + (-1,)) if not length_facets else None
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        for panel, (k, length) in zip(panels[0], facets):
            if length_facets:
                # Lengths last; every other extra axis held at its first value.
                cut = values[(slice(None), slice(None)) + (0,) * (values.ndim - 3) + (k,)]
            else:
                cut = grid[:, :, 0]
            image = panel.imshow(cut, origin="lower", aspect="auto", cmap="viridis", vmin=low, vmax=high)
            panel.set_yticks(np.arange(len(rows)), [_tick(t) for t in rows])
            panel.set_xticks(np.arange(len(columns)), [_tick(t) for t in columns], rotation=45)
            panel.set_ylabel(row_name)
            panel.set_xlabel(column_name)
            if length_facets:
                panel.set_title(f"N = {length}", fontsize=9)
        figure.colorbar(image, ax=panels[0].tolist(), label=name)
        figure.suptitle(f"{title}\n{name}" + (f" ({held})" if held else ""), fontsize=9)
        figures[f"heatmap_{name}.png"] = figure
    return figures


def plot_sweep(directory, statistics, axes, *, title: str = "") -> list[Path]:
    """One figure per shape statistic of a sweep: ``heatmap_<name>.png`` or ``line_<name>.png``.

    `statistics` maps a name to an array over the grid ``(len(axes[0][1]), ...)``;
    `axes` lists ``(axis name, tick values)``. See `sweep_figures` for what
    each figure draws. Each file is written to a temporary name and renamed,
    so no half-written figure is left behind.
    """
    directory = Path(directory)
    return [_save(figure, directory / name)
            for name, figure in sweep_figures(statistics, axes, title=title).items()]


def _tick(value) -> str:
    return f"{value:.3g}" if isinstance(value, (float, np.floating)) else str(value)
