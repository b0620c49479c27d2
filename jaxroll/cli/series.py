"""``jaxroll series DIR``: redraw a series' figure; and the checkpoint loop of ``jaxroll measure`` over a series.

``jaxroll measure RUN --out OUT`` (RUN a training output folder of
``checkpoint-STEP/`` subfolders, or several model folders) measures each
checkpoint exactly as ``jaxroll measure CHECKPOINT`` would, into
``OUT/checkpoint-STEP/``, one model in memory at a time, and keeps
``OUT/series/`` up to date after each (`jaxroll.measure.series`).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from ..errors import ConfigError


def add_parser(commands) -> None:
    series = commands.add_parser(
        "series", help="redraw the figure of a series measured over training (series/series.png)",
        description="Redraw DIR/series/series.png from DIR/series/series.csv and series.npz, the summary that "
                    "jaxroll measure writes for a training run's checkpoints (or jaxroll.measure.tracking from "
                    "inside a training loop): the measured profile over steps, lambda_t per layer over steps, "
                    "and W1 / noise of the rollout's prediction over steps (docs/training.md).")
    series.add_argument("directory", type=Path, metavar="DIR", help="a series folder (the --out of jaxroll measure "
                                                                    "over checkpoints), or its series/ folder")
    series.add_argument("--title", default=None, help="the figure's title (default: DIR's name)")
    series.set_defaults(run=_run_series, uses_jax=False)


def _run_series(arguments) -> None:
    from ..measure.series import SERIES_FOLDER, read_series

    data = read_series(arguments.directory)
    folder = arguments.directory
    if not (folder.name == SERIES_FOLDER and not (folder / SERIES_FOLDER).is_dir()):
        folder = folder / SERIES_FOLDER
    path = plot_series(folder, data, title=arguments.title)
    columns = data["columns"]
    print(f"jaxroll series: {len(columns['step'])} steps ({columns['step'][0]} .. {columns['step'][-1]}); "
          f"wrote {path}")


def plot_series(folder: Path, data: dict, *, title: str | None = None) -> Path:
    """``series.png`` in `folder` from `data` (`jaxroll.measure.series.read_series`)."""
    from ..plot import plot_series as plot

    columns, arrays = data["columns"], data["arrays"]
    name = folder.parent.name if folder.name == "series" else folder.name
    return plot(folder / "series.png", arrays["steps"], arrays["measured"], arrays["lambdas"],
                columns["w1_over_noise"], title=title or f"{name}: N = {arrays['measured'].shape[1]}, "
                                                          f"S = {columns['sequences'][0]}")


def measure_series(arguments, measure_one) -> None:
    """``jaxroll measure`` over the checkpoints of `arguments.model` (`measure_one` measures one folder).

    Checks first: the checkpoints (`find_checkpoints`), one architecture
    (`check_same_architecture`), the statistics a series needs, one
    tokenizer's token ids for every checkpoint, ``--out`` (empty, or
    ``--resume``, or ``--force``): a refusal creates nothing. Then each step
    not yet finished is measured (a partial one resumed from its partial
    sums), and ``OUT/series/`` updated after each.
    """
    from .. import io
    from ..measure import inspect_model, load_tokenizer, parse_stats, read_texts, select_sequences
    from ..measure import series
    from ..measure.distributed import from_environment

    if from_environment().distributed:
        raise ConfigError("measure: a series of checkpoints under torchrun; allowed: a single process (measure a "
                          "checkpoint under torchrun by its own folder)")
    checkpoints = series.find_checkpoints(arguments.model)
    plans = {folder: inspect_model(folder) for _, folder in checkpoints}
    series.check_same_architecture(plans)
    first = next(iter(plans.values()))
    stats = parse_stats(arguments.stats) if arguments.stats is not None else first.default
    missing = [name for name in ("lambda", "influence") if name not in stats]
    if missing:
        raise ConfigError(f"--stats {arguments.stats}: no {missing[0]}; allowed: --stats including lambda and "
                          "influence for a series (its summary compares the rollout with the measured profile)")
    if arguments.samples < 2:
        raise ConfigError(f"--samples: {arguments.samples}; allowed: >= 2 for a series (its summary judges the "
                          "prediction against the noise of the mean over sequences)")
    out = arguments.out
    if arguments.resume:
        if not out.is_dir():
            raise ConfigError(f"--resume: no series in {out}; allowed: the --out of an interrupted series")
    else:
        io.check_output_dir(out, force=arguments.force)
    documents = read_texts(arguments.texts)
    reference = None
    for step, folder in checkpoints:  # the same sequences at every step
        token_ids, _ = select_sequences(documents, load_tokenizer(folder), arguments.length, arguments.samples)
        if reference is None:
            reference = (folder, token_ids)
        elif token_ids.shape != reference[1].shape or (token_ids != reference[1]).any():
            raise ConfigError(f"model {folder}: its tokenizer gives other token ids than {reference[0]}'s; allowed: "
                              "checkpoints with one tokenizer (the same sequences at every step)")
    for number, (step, folder) in enumerate(checkpoints, start=1):
        target = series.checkpoint_folder(out, step)
        if arguments.resume and series.is_finished(target):
            print(f"jaxroll measure: step {step} ({number} of {len(checkpoints)}) already in {target}; skipped")
            continue
        print(f"jaxroll measure: step {step} ({number} of {len(checkpoints)}), {folder}")
        one = copy.copy(arguments)
        one.model, one.out = folder, target
        one.resume = arguments.resume and (target / "checkpoint.npz").is_file()
        one.force = True  # --out as a whole was checked above
        try:
            measure_one(one)
        except KeyboardInterrupt:
            print(f"jaxroll measure: interrupted at step {step}; the finished steps are in {out}; rerun the same "
                  "command with --resume to continue", file=sys.stderr)
            raise
        series.update_series(out, [step])
        io.CREATED.clear()  # a later refusal keeps the finished steps
    folder = series.update_series(out)
    path = plot_series(folder, series.read_series(out))
    print(f"jaxroll measure: series of {len(checkpoints)} steps in {folder}/series.csv, series.npz; figure {path}")
