"""``jaxroll series --measured DIR``: redraw a series' figure from its summary.

``jaxroll measure RUN --out OUT`` (RUN a training output folder of
``checkpoint-STEP/`` subfolders, or several model folders) measures each
checkpoint into ``OUT/checkpoint-STEP/`` and keeps ``OUT/series/`` up to
date (`jaxroll.measure.series`); this command redraws ``series.png`` from
that summary (`jaxroll.measure.series.plot_series`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    series = commands.add_parser(
        "series", help="redraw the figure of a series measured over training (series/series.png)",
        description="Redraw series.png from DIR/series/series.csv and series.npz, the summary that "
                    "jaxroll measure writes for a training run's checkpoints (or jaxroll.measure.tracking from "
                    "inside a training loop): the measured profile over steps, lambda_t per layer over steps, "
                    "and W1 / noise of the rollout's prediction over steps (docs/training.md).")
    series.add_argument("--measured", type=Path, default=None, metavar="DIR",
                        help="a series folder (the --out of jaxroll measure over checkpoints), or its series/ folder")
    series.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where series.png goes (default: the series/ folder of --measured; created)")
    series.add_argument("--force", action="store_true", help="replace an existing series.png")
    series.add_argument("--title", default=None, help="the figure's title (default: DIR's name)")
    _common.add_json_argument(series)
    series.add_argument("retired_directory", nargs="*", metavar="", help=argparse.SUPPRESS)
    series.set_defaults(run=_run_series, uses_jax=False)


def _run_series(arguments) -> None:
    from ..measure.series import SERIES_FOLDER, plot_series, read_series

    if arguments.retired_directory:
        raise ConfigError(f"{' '.join(arguments.retired_directory)}: a positional series folder is retired; use "
                          "--measured DIR (docs/changelog.md lists the renames)", field="DIR",
                          value=arguments.retired_directory, allowed="--measured DIR")
    if arguments.measured is None:
        raise ConfigError("--measured: missing; allowed: --measured DIR, a series folder (the --out of jaxroll "
                          "measure over checkpoints)", field="--measured", allowed="a series folder")
    data = read_series(arguments.measured)
    folder = arguments.measured
    if not (folder.name == SERIES_FOLDER and not (folder / SERIES_FOLDER).is_dir()):
        folder = folder / SERIES_FOLDER
    out = arguments.out or folder
    _common.free_output_path(out / "series.png", arguments.force)
    out.mkdir(parents=True, exist_ok=True)
    name = folder.parent.name if folder.name == SERIES_FOLDER else folder.name
    path = plot_series(out, data, title=arguments.title or _default_title(name, data))
    columns = data["columns"]
    if arguments.json:
        _common.print_json({"steps": [int(step) for step in columns["step"]],
                            "w1_over_noise": [_finite(value) for value in columns["w1_over_noise"]], "figure": path})
        return
    print(f"jaxroll series: {len(columns['step'])} steps ({columns['step'][0]} .. {columns['step'][-1]}); "
          f"wrote {path}")


def _default_title(name: str, data: dict) -> str:
    """The title `plot_series` gives the series' own folder, whatever folder the figure goes to."""
    arrays, columns = data["arrays"], data["columns"]
    return f"{name}: N = {arrays['measured'].shape[1]}, S = {columns['sequences'][0]}"


def _finite(value) -> float | None:
    """A float for JSON; None for NaN (a step without a prediction to judge)."""
    value = float(value)
    return value if value == value else None
