"""The canvas and the axes every figure of `jaxroll.plot` shares.

Figures are `matplotlib.figure.Figure` objects on an Agg canvas, without
pyplot (no figure manager, no backend selection) and with fixed margins
instead of constrained layout: the layout engine measured every tick label
of every panel several times, which took most of a small rollout's time.
Log axes label their decades as plain text (``1e-05``), not mathtext.

matplotlib is imported here (`_import_matplotlib`) with
`matplotlib.artist.kwdoc` answering an empty property table while its artist
classes load, then put back: each of them otherwise builds the docstring of
its ``set`` method, a table of all its properties, which is a third of the
CPU time of importing matplotlib's figure and Agg canvas (0.33 s -> 0.22 s of
CPU, 7 fresh processes each, load average 5, 2026-12-06, matplotlib
3.11.2), paid by every one-off ``jaxroll effect`` or ``score``. Only the
docstrings differ: where jaxroll.plot is imported before matplotlib's figure
module, ``help(Line2D.set)`` in that process lists no properties (nor do the
lists matplotlib interpolates into other docstrings, such as ``Axes.plot``'s);
everything drawn is the same pixel for pixel (tests/test_figure_latency.py).

Influence profiles are drawn on linear axes, where the U-shape of the paper
(primacy and recency, the lost middle) is visible; quantities that span many
orders of magnitude (the attention-only collapse, the causal-masking rung of
the forces ladder) get a log-scaled panel of their own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _no_properties(artist) -> str:
    """`matplotlib.artist.kwdoc`'s stand-in while matplotlib's artist classes load: no table of properties."""
    return ""


def _import_matplotlib() -> None:
    """Import matplotlib's figure and Agg canvas with `matplotlib.artist.kwdoc` answering "" (see above), then
    put `kwdoc` back; nothing happens where the figure module is loaded already."""
    import sys

    if "matplotlib.figure" in sys.modules:
        return
    import matplotlib.artist

    kwdoc = matplotlib.artist.kwdoc
    matplotlib.artist.kwdoc = _no_properties
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    finally:
        matplotlib.artist.kwdoc = kwdoc


_import_matplotlib()
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

POSITION_LABEL = "input position j (0 = first token)"
INFLUENCE_LABEL = "influence on the last position, p_T(j)"


def _figure(width: float, height: float, panels: int = 1, *, left: float = 0.75, right: float = 0.2,
            bottom: float = 0.55, top: float = 0.6, gap: float = 0.85, layout=None):
    """A `Figure` on an Agg canvas with `panels` axes side by side, margins in inches.

    `top` leaves room for a panel title and the figure's suptitle; `gap` for
    the next panel's y label. ``layout="constrained"`` (or ``"tight"``) for
    figures whose labels vary too much for fixed margins (sweep heatmaps, the
    task and kinetic figures); the margins are then ignored.
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


def edge_count(n: int, fraction: float = 0.1) -> int:
    """``k = max(1, round(fraction * n))``: `jaxroll.metrics.edge_count`, repeated here because `jaxroll.metrics`
    imports JAX and a figure of the NumPy commands (score, effect, a small rollout) must not (tests/
    test_latency.py pins the two equal)."""
    return max(1, round(fraction * n))


def _regions(axes, n: int) -> None:
    """Shade the first and last k positions and the middle between them, as the
    printed statistics define them (`jaxroll.metrics`): ``first_mass = sum p[:k]``,
    ``middle_mass = sum p[k:n-k]``, ``last_mass = sum p[n-k:]``,
    ``k = metrics.edge_count(n)`` (a tenth of n, at least 1)."""
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


FLOOR_DECADES = 3
"""Log panels draw values down to ``10^-3`` times the smallest positive value of the
residual-aware profile(s); smaller values (float underflow, or causal masking's
~1e-300 tail) are left out, not drawn at a made-up floor, and the legend says so."""


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


def _band(axes, band, level: float, *, color: str = "C0", label: str = "") -> None:
    """`band` ``(2, N)`` (lower and upper ends, or None: nothing) shaded in `color`."""
    if band is not None:
        low, high = np.asarray(band, dtype=np.float64)
        axes.fill_between(np.arange(low.size), low, high, color=color, alpha=0.25, linewidth=0,
                          label=label or f"{100 * level:g}% pointwise bootstrap band over sequences")
