"""A measurement over training: checkpoints in step order, each measured alike, and the ``series/`` summary.

Chowdhury (arXiv 2603.10123) finds the U of position bias in untrained
models; Brändel et al. (arXiv 2606.29139) find the power law by distance
only after training. The residual-aware theory (arXiv 2602.16837) says the
U is structural, shaped by ``lambda_t``, the slopes and the content, all of
which move as a model trains. A series measures every checkpoint of one run
on the same token ids (the same texts, the same positions) and scores the
rollout's prediction at each.

Layout of a series folder OUT (``jaxroll measure RUN --out OUT``, or
`jaxroll.measure.tracking` from inside a training loop)::

    OUT/checkpoint-STEP/   one measurement per step, exactly what
                           ``jaxroll measure CHECKPOINT --out ...`` writes
    OUT/series/series.csv  one row per step, the scalars of `SCALARS`
    OUT/series/series.npz  steps (C,), lambdas (C, L), measured (C, N),
                           predicted (C, N), float64
    OUT/series/series.png  the figure (`jaxroll.plot.series`)

For each step, from ``OUT/checkpoint-STEP/``:

- ``measured``: the measured influence profile m (``influence``);
- ``predicted``: the residual-aware rollout of the measured configuration,
  ``jaxroll.influence(jaxroll.load_config(config.yaml))`` in float64 (the
  measured lambdas with the measured slopes and content for an ALiBi
  model; with the measured mean attention as kernels when it was measured
  for a rotary one, else the structural causal kernel of zero slopes);
- ``w1``, ``noise``, ``w1_over_noise``, ``p_value``: `jaxroll.measure.uncertainty.score`
  of the prediction against the per-sequence gradient norms (``w1_over_noise``
  about 1 for a perfect prediction);
- ``middle_mass``, ``u_index``, ``argmin`` (`jaxroll.metrics`) of the measured
  and of the predicted profile;
- with measured rows (``--queries``): ``distance_exponent_measured`` and
  ``distance_exponent_predicted``, the exponent p of
  ``gamma + beta (r + 1)^-p`` fitted (`jaxroll.theory.baselines.fit_power_law`)
  to the median by distance (`jaxroll.theory.baselines.by_distance`) of the
  measured rows and of the predicted rows at the same query positions.

Pure NumPy and JAX: no torch.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["checkpoint_step", "find_checkpoints", "check_same_architecture", "checkpoint_folder", "is_finished",
           "finished_steps", "step_summary", "update_series", "read_series", "SCALARS", "ROW_SCALARS",
           "SERIES_FOLDER", "plot_series"]

SERIES_FOLDER = "series"
"""The summary's folder inside a series folder."""

SCALARS = ("step", "checkpoint", "sequences", "length", "lambda_mean", "w1", "noise", "w1_over_noise", "p_value",
           "middle_mass_measured", "middle_mass_predicted", "u_index_measured", "u_index_predicted",
           "argmin_measured", "argmin_predicted", "seconds")
"""The columns of ``series.csv``, in order (module docstring); `ROW_SCALARS` follow when rows were measured."""

ROW_SCALARS = ("distance_exponent_measured", "distance_exponent_predicted")
"""The columns ``series.csv`` adds when every step measured rows (``--queries``)."""

_NAME = re.compile(r"^(?:checkpoint-)?(\d+)$")
_ALLOWED = ("a folder written by save_pretrained, several of them named checkpoint-STEP or STEP, or a training "
            "output folder of checkpoint-STEP/ subfolders")


def checkpoint_step(path) -> int | None:
    """The training step in a folder's name: ``checkpoint-STEP`` (the Hugging Face Trainer's) or ``STEP``; else None."""
    match = _NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def _is_model(path: Path) -> bool:
    return (path / "config.json").is_file()


def find_checkpoints(paths) -> list[tuple[int, Path]]:
    """``[(step, folder), ...]`` in increasing step of the model folders in `paths`.

    One path: a training output folder whose subfolders ``checkpoint-STEP``
    (or ``STEP``) hold a ``config.json`` each (other subfolders, e.g.
    ``runs/``, are ignored). Several paths: each a model folder named
    ``checkpoint-STEP`` or ``STEP``.

    Raises:
        ConfigError: no checkpoints, a folder without a step in its name or
            without a model, two folders of one step; one line.
    """
    paths = [Path(path) for path in paths]
    if len(paths) == 1:
        (folder,) = paths
        if not folder.is_dir():
            raise ConfigError(f"model {folder}: no such directory; allowed: {_ALLOWED}")
        found = [(checkpoint_step(child), child) for child in sorted(folder.iterdir())
                 if child.is_dir() and checkpoint_step(child) is not None and _is_model(child)]
        if not found:
            raise ConfigError(f"model {folder}: no config.json and no checkpoint-STEP/ subfolder with one; "
                              f"allowed: {_ALLOWED}")
    else:
        found = []
        for folder in paths:
            if not folder.is_dir() or not _is_model(folder):
                raise ConfigError(f"model {folder}: no model (no config.json) in a series of several; "
                                  f"allowed: {_ALLOWED}")
            step = checkpoint_step(folder)
            if step is None:
                raise ConfigError(f"model {folder}: no step in its name {folder.name!r}; allowed: folders named "
                                  "checkpoint-STEP or STEP in a series of several")
            found.append((step, folder))
    steps = [step for step, _ in found]
    repeated = sorted({step for step in steps if steps.count(step) > 1})
    if repeated:
        folders = [str(folder) for step, folder in found if step == repeated[0]]
        raise ConfigError(f"model: step {repeated[0]} twice ({' and '.join(folders)}); allowed: one folder per step")
    return sorted(found, key=lambda item: item[0])


def check_same_architecture(plans: dict) -> None:
    """Refuse checkpoints of different architectures, in one line naming the first that differs.

    `plans` maps a folder to its `jaxroll.measure.ModelPlan` (from
    ``config.json``): model type, layers, heads and hidden size must agree,
    as every step of one training run does.
    """
    def shape(plan):
        return (plan.layer_map, plan.num_layers, plan.num_heads, plan.hidden_size)

    items = list(plans.items())
    first_folder, first = items[0]
    for folder, plan in items[1:]:
        if shape(plan) != shape(first):
            raise ConfigError(
                f"model {folder}: {_words(plan)}, unlike {first_folder} ({_words(first)}); allowed: checkpoints of "
                "one architecture (one training run)")


def _words(plan) -> str:
    return f"{plan.layer_map}, {plan.num_layers} layers, {plan.num_heads} heads, hidden size {plan.hidden_size}"


def checkpoint_folder(out, step: int) -> Path:
    """``OUT/checkpoint-STEP``: where a series keeps the measurement of `step`."""
    return Path(out) / f"checkpoint-{int(step)}"


def is_finished(folder) -> bool:
    """Whether `folder` holds a finished measurement: metadata.json written and no partial sums left.

    ``jaxroll measure`` removes its ``checkpoint*.npz`` of partial sums only
    after every output is written, so a folder that still has one was
    interrupted and is resumed, not skipped.
    """
    folder = Path(folder)
    return (folder / "metadata.json").is_file() and (folder / "measurement.npz").is_file() and not any(
        folder.glob("checkpoint*.npz"))


def finished_steps(out) -> list[int]:
    """The steps of the finished measurements ``OUT/checkpoint-STEP/``, increasing."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted(step for step, child in ((checkpoint_step(child), child) for child in out.iterdir())
                  if step is not None and child.name.startswith("checkpoint-") and is_finished(child))


def _exponent(rows, queries) -> float:
    from ..theory.baselines import by_distance, fit_power_law

    distances, values = by_distance(rows, queries, "median")
    try:
        return float(fit_power_law(distances, values).p)
    except ConfigError:  # fewer than 4 distances: no exponent
        return math.nan


def step_summary(folder, *, resamples: int = 1000, seed: int = 0) -> dict:
    """The scalars (`SCALARS`, `ROW_SCALARS` with rows) and arrays of one finished measurement folder.

    Returns a dict with the scalars by column name (``step`` from the
    folder's name) and the arrays ``lambdas (L,)``, ``measured (N,)``,
    ``predicted (N,)``, float64 (module docstring).

    Raises:
        ConfigError: the folder lacks lambdas or influence (a series needs
            ``--stats`` with both), one line.
    """
    import jax

    from .. import io as jaxroll_io
    from .. import metrics
    from ..rollout import influence
    from .outputs import read_measurement
    from .uncertainty import score

    folder = Path(folder)
    arrays, metadata = read_measurement(folder)
    missing = [name for name in ("lambdas", "influence", "influence_per_sequence") if name not in arrays]
    if missing or not (folder / "config.yaml").is_file():
        raise ConfigError(f"{folder}: no {missing[0] if missing else 'config.yaml'}; allowed: a measurement with "
                          "--stats including lambda and influence (a series needs both)")
    measured = np.asarray(arrays["influence"], dtype=np.float64)
    with jax.enable_x64(True):
        model = jaxroll_io.load_config(folder / "config.yaml")
        predicted = np.asarray(influence(model, measured.size), dtype=np.float64)
        shapes = [metrics.shape_statistics(jax.numpy.asarray(p)) for p in (measured, predicted)]
        rows = None
        if "influence_rows" in arrays and "query_positions" in arrays:
            from ..theory.rows import predicted_rows

            queries = arrays["query_positions"]
            rows = (arrays["influence_rows"], predicted_rows(model, queries, measured.size), queries)
    agreement = score(predicted, arrays["influence_per_sequence"], B=resamples, seed=seed)
    lambdas = np.asarray(arrays["lambdas"], dtype=np.float64)
    timing = metadata.get("timing", {}).get("loop_seconds_per_process", [math.nan])
    summary = {
        "step": checkpoint_step(folder), "checkpoint": folder.name,
        "sequences": int(arrays["influence_per_sequence"].shape[0]), "length": int(measured.size),
        "lambda_mean": float(lambdas.mean()), "w1": agreement.w1, "noise": agreement.noise,
        "w1_over_noise": agreement.ratio, "p_value": agreement.p_value,
        "middle_mass_measured": float(shapes[0].middle_mass), "middle_mass_predicted": float(shapes[1].middle_mass),
        "u_index_measured": float(shapes[0].u_index), "u_index_predicted": float(shapes[1].u_index),
        "argmin_measured": int(shapes[0].argmin), "argmin_predicted": int(shapes[1].argmin),
        "seconds": float(max(timing)),
        "lambdas": lambdas, "measured": measured, "predicted": predicted,
    }
    if rows is not None:
        summary["distance_exponent_measured"] = _exponent(rows[0], rows[2])
        summary["distance_exponent_predicted"] = _exponent(rows[1], rows[2])
    return summary


def read_series(out) -> dict:
    """The series of `out` (a series folder, or its ``series/``): ``{"columns": {name: list}, "arrays": {...}}``.

    ``columns`` holds the CSV's columns (numbers as floats, ``step`` and
    ``argmin_*`` as ints, ``checkpoint`` as str); ``arrays`` the npz's
    ``steps, lambdas, measured, predicted``.

    Raises:
        ConfigError: no series there, or files that do not agree; one line.
    """
    from .._readers import read_npz

    folder = _series_folder(out)
    allowed = "the series/ folder that jaxroll measure or jaxroll.measure.tracking writes"
    table = folder / "series.csv"
    if not table.is_file():
        raise ConfigError(f"{out}: no {SERIES_FOLDER}/series.csv; allowed: {allowed}")
    arrays = read_npz(folder / "series.npz", allowed)
    with open(table, encoding="utf-8", newline="") as handle:
        records = list(csv.DictReader(handle))
    if not records or records[0].keys() < set(SCALARS) or "steps" not in arrays:
        raise ConfigError(f"{table}: not a series (columns {', '.join(SCALARS)}); allowed: {allowed}")
    columns = {name: [_parse(name, record[name]) for record in records] for name in records[0]}
    if columns["step"] != [int(step) for step in arrays["steps"]]:
        raise ConfigError(f"{table}: its steps differ from series.npz's; allowed: {allowed}")
    return {"columns": columns, "arrays": arrays}


def _series_folder(out) -> Path:
    out = Path(out)
    return out if out.name == SERIES_FOLDER and not (out / SERIES_FOLDER).is_dir() else out / SERIES_FOLDER


def _parse(name: str, text: str):
    if name == "checkpoint":
        return text
    if name in ("step", "sequences", "length") or name.startswith("argmin"):
        return int(text)
    return float(text)


def update_series(out, steps=(), *, resamples: int = 1000, seed: int = 0) -> Path:
    """Bring ``OUT/series/`` up to date with the finished measurements in `out`; returns the folder.

    Rows are computed (`step_summary`) for the `steps` given (measured again)
    and for every finished step the series lacks; the rest are kept as
    written. ``series.csv`` and ``series.npz`` are rewritten whole (both to
    temporary names, then renamed: a failure leaves both as they were).
    Steps whose folder is not finished are left out.

    Raises:
        ConfigError: steps of different N or layers (measured unlike), one
            line, before any file is written.
    """
    out = Path(out)
    folder = out / SERIES_FOLDER
    kept = {}
    if (folder / "series.csv").is_file() and (folder / "series.npz").is_file():
        previous = read_series(out)
        columns, arrays = previous["columns"], previous["arrays"]
        for index, step in enumerate(columns["step"]):
            kept[step] = {name: values[index] for name, values in columns.items()} | {
                name: arrays[key][index] for name, key in (("lambdas", "lambdas"), ("measured", "measured"),
                                                            ("predicted", "predicted"))}
    finished = finished_steps(out)
    again = {int(step) for step in steps}
    for step in finished:
        if step in again or step not in kept:
            kept[step] = step_summary(checkpoint_folder(out, step), resamples=resamples, seed=seed)
    summaries = [kept[step] for step in finished]
    if not summaries:
        return folder
    shapes = {name: np.shape(summaries[0][name]) for name in ("lambdas", "measured")}
    for summary in summaries[1:]:  # np.stack would fail after series.csv was written: refuse first
        for name, shape in shapes.items():
            if np.shape(summary[name]) != shape:
                raise ConfigError(f"{checkpoint_folder(out, summary['step'])}: {name} of shape "
                                  f"{np.shape(summary[name])}; allowed: {shape}, as step {summaries[0]['step']} "
                                  "(a series measures every step alike)")
    names = list(SCALARS) + (list(ROW_SCALARS) if all(ROW_SCALARS[0] in s for s in summaries) else [])
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(names)
    for summary in summaries:
        writer.writerow([_format(summary[name]) for name in names])
    arrays = {"steps": np.asarray([s["step"] for s in summaries], dtype=np.int64)}
    for name in ("lambdas", "measured", "predicted"):
        arrays[name] = np.stack([np.asarray(s[name], dtype=np.float64) for s in summaries])
    folder.mkdir(parents=True, exist_ok=True)
    _replace_together({folder / "series.npz": lambda handle: np.savez(handle, **arrays),
                       folder / "series.csv": lambda handle: handle.write(text.getvalue().encode("utf-8"))})
    return folder


def _format(value) -> str:
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def _replace_together(writers: dict) -> None:
    """Write every file to a temporary name in its folder, then rename each over its file.

    A writer that fails leaves every file as it was (its temporaries
    removed): the renames come only after every file is written whole, so
    ``series.csv`` and ``series.npz`` never disagree because one write failed.
    """
    temporaries = {}
    try:
        for path, write in writers.items():
            temporary = path.with_name(path.name + ".tmp")
            temporaries[path] = temporary
            with open(temporary, "wb") as handle:
                write(handle)
    except BaseException:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)
        raise
    for path, temporary in temporaries.items():
        os.replace(temporary, path)


def plot_series(folder, data: dict, *, title: str | None = None) -> Path:
    """``series.png`` in `folder` from `data` (`read_series`): the measured profile, lambda_t per layer and
    W1 / noise of the rollout's prediction over the steps (`jaxroll.plot.plot_series`)."""
    from ..plot import plot_series as plot

    folder = Path(folder)
    columns, arrays = data["columns"], data["arrays"]
    name = folder.parent.name if folder.name == "series" else folder.name
    return plot(folder / "series.png", arrays["steps"], arrays["measured"], arrays["lambdas"],
                columns["w1_over_noise"], title=title or f"{name}: N = {arrays['measured'].shape[1]}, "
                                                          f"S = {columns['sequences'][0]}")
