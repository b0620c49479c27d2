"""Sweeps: a line per statistic over one axis, a heatmap per statistic over two (`jaxroll sweep`)."""

from __future__ import annotations

import numpy as np

from ._canvas import _figure


def _numeric(ticks) -> bool:
    """Whether every tick is a number (placed by value on the x axis) rather than a name."""
    return all(isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, bool) for t in ticks)


def sweep_figures(statistics, axes, *, title: str = "", sequence_length: int | None = None,
                  base: dict | None = None) -> dict[str, object]:
    """One figure per shape statistic of a sweep, by file name.

    `statistics` maps a name to an array over the grid ``(len(axes[0][1]), ...)``;
    `axes` lists ``(axis name, tick values)``. One axis: a line plot per
    statistic, ``line_<name>.png``; numeric values are placed by value on the
    x axis (uneven steps stay uneven). Two or more: a heatmap per statistic over the first two axes,
    ``heatmap_<name>.png``, with one panel per sequence length when the
    sweep has a ``length`` axis beyond the first two (every length drawn);
    any other axis is held at its first value, said in the title.

    `sequence_length`: N of a sweep without a ``length`` axis, said in every
    title. `base`: ``{axis name: value}`` of the base (e.g. fitted) model the
    sweep varies; where it names a plotted axis and its value lies inside that
    axis's range, the point is marked (a white star on heatmaps, a dashed
    line on line plots) and its values are in the legend.
    """
    figures = {}
    length_facets = len(axes) > 2 and axes[-1][0] == "length"
    held_axes = axes[2:-1] if length_facets else axes[2:]
    held = ", ".join(f"{name} = {_tick(values[0])}" for name, values in held_axes)
    if sequence_length is not None and not any(name == "length" for name, _ in axes):
        title = f"{title}, N = {sequence_length}" if title else f"N = {sequence_length}"
    base = base or {}
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
            where = _position(ticks, base.get(axis_name))
            if where is not None:
                x = float(base[axis_name]) if _numeric(ticks) else where
                panel.axvline(x, color="k", linestyle="--", linewidth=1,
                              label=f"base point: {axis_name} = {_tick(float(base[axis_name]))}")
                panel.legend(fontsize=8)
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
            column, row = _position(columns, base.get(column_name)), _position(rows, base.get(row_name))
            if column is not None and row is not None:
                panel.plot([column], [row], marker="*", markersize=16, color="white", markeredgecolor="k",
                           linestyle="none", label=f"base point: {row_name} = {_tick(float(base[row_name]))}, "
                                                   f"{column_name} = {_tick(float(base[column_name]))}")
                panel.legend(fontsize=7, loc="upper right")
        figure.colorbar(image, ax=panels[0].tolist(), label=name)
        figure.suptitle(f"{title}\n{name}" + (f" ({held})" if held else ""), fontsize=9)
        figures[f"heatmap_{name}.png"] = figure
    return figures


def _position(ticks, value) -> float | None:
    """Where `value` falls on an axis drawn by tick index (interpolated between numeric
    ticks in order), or None: no value, names, or outside the ticks' range."""
    if value is None or not _numeric(ticks) or len(ticks) == 0:
        return None
    ticks = np.asarray(ticks, np.float64)
    order = np.argsort(ticks)
    if not ticks[order[0]] <= float(value) <= ticks[order[-1]]:
        return None
    return float(np.interp(float(value), ticks[order], order.astype(np.float64)))


def _tick(value) -> str:
    """A tick's label: three significant digits for a float, the value itself otherwise."""
    return f"{value:.3g}" if isinstance(value, (float, np.floating)) else str(value)
