"""``jaxroll compare-task``: a task curve (``jaxroll task``), or an external accuracy table (``--accuracy``),
beside the influence the rollout predicts there."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    compare = commands.add_parser(
        "compare-task", help="a task curve beside the influence the rollout predicts at the same positions",
        description="Read TASK_DIR/cases.jsonl (from jaxroll task), take one task at one length, and compare its "
                    "score by depth with the predicted influence of the record: from a measurement (--measured "
                    "DIR, its config.yaml), a rollout CONFIG, --preset or --published. Prints and writes Spearman "
                    "with a bootstrap interval, a monotone (isotonic) link and the share of the depth effect it "
                    "explains, and what can and cannot be concluded; writes compare.csv, compare.json, "
                    "compare.txt and compare.png. With --accuracy FILE.csv instead of TASK_DIR: an accuracy table "
                    "from outside (columns start,end or start_fraction,end_fraction, accuracy, n_cases; optional "
                    "setting, length, floor, ceiling), the span's influence mass against accuracy through a "
                    "monotone link fitted on --fit-settings and tested on the other settings.")
    compare.add_argument("task_dir", type=Path, metavar="TASK_DIR", nargs="?", default=None,
                         help="the --out of jaxroll task (or give --accuracy)")
    compare.add_argument("--accuracy", type=Path, default=None, metavar="FILE",
                         help="an accuracy table (CSV) instead of TASK_DIR: docs/task.md, 'Your own accuracy table'")
    compare.add_argument("--fit-settings", default=None, metavar="A,B",
                         help="with --accuracy: the settings the link is fitted on (default: the table's first); "
                              "the others are held out")
    _common.add_model_arguments(compare)
    compare.add_argument("--measured", type=Path, default=None, metavar="DIR", action="append",
                         help="the --out of jaxroll measure on the same model (its config.yaml); with --accuracy "
                              "once per length of the table (each length rolls out the measurement at that length; "
                              "one --measured serves every length)")
    compare.add_argument("--per-case", type=Path, default=None, metavar="CASES",
                         help="with --accuracy and --measured: the cases whose prompts were measured (jaxroll task "
                              "--cases format, e.g. held_out.jsonl); each row's span mass is then the mean, over "
                              "the measured cases with the row's gold span, of each case's own row summed over its "
                              "record (docs/task.md, 'What the rollout predicts')")
    compare.add_argument("--per-case-rows", choices=("sequence_rollout", "influence"), default=None,
                         help="with --per-case: each case's own rollout (default; measure --stats "
                              "...,sequence_rollout) or its measured influence (the bound)")
    compare.add_argument("--task", default=None, help="which task (default: the only one in cases.jsonl)")
    compare.add_argument("--score", choices=("exact", "logprob", "correct"), default="exact",
                         help="exact match (default), gold log-probability, or fraction of answer tokens right")
    compare.add_argument("--resamples", type=_common.positive_int, default=2000, help="bootstrap resamples")
    _common.add_output_arguments(compare)
    _common.add_json_argument(compare)
    compare.set_defaults(run=_run_compare)


def _run_compare(arguments) -> None:
    import dataclasses

    import numpy as np

    from ..task import grid

    if arguments.accuracy is not None and arguments.task_dir is not None and arguments.config is None:
        # With --accuracy there is no TASK_DIR: argparse gave the one positional, CONFIG, to its first slot.
        arguments = argparse.Namespace(**{**vars(arguments), "config": arguments.task_dir, "task_dir": None})
    if (arguments.task_dir is None) == (arguments.accuracy is None):
        raise ConfigError("compare-task: give TASK_DIR or --accuracy FILE, one of them; allowed: the --out of "
                          "jaxroll task, or an accuracy table (CSV)")
    if arguments.accuracy is None and arguments.fit_settings is not None:
        raise ConfigError("--fit-settings: applies to --accuracy only")
    if arguments.per_case is not None or arguments.per_case_rows is not None:
        return _run_per_case(arguments)  # NumPy only: no JAX, no rollout
    rows = None
    if arguments.accuracy is None:
        rows = grid.read_rows(arguments.task_dir / grid.CASES_FILE)  # refused before JAX loads
        if not rows:
            raise ConfigError(f"TASK_DIR {arguments.task_dir}: no {grid.CASES_FILE} with scored cases; allowed: "
                              "the --out of jaxroll task")
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    if arguments.accuracy is not None:
        return _run_accuracy(arguments)

    from .. import io
    from ..rollout import influence
    from ..task import versus_influence

    task, length, _ = versus_influence.select_rows(rows, arguments.task, arguments.length)
    config = _config_of(arguments)
    model, source = _common.model_from_arguments(arguments, config=config, length=length)
    model = dataclasses.replace(model, sequence_length=length)
    if arguments.measured is not None:
        source = f"measured {arguments.measured[0]}"
    io.prepare_output_dir(arguments.out, force=arguments.force)
    profile = np.asarray(influence(model, length), dtype=np.float64)
    result = versus_influence.compare_task(rows, profile, task=task, length=length, score=arguments.score,
                                           resamples=arguments.resamples, source=source)
    _write_compare(result, arguments.out, arguments.json)


def _config_of(arguments, length: int | None = None):
    """CONFIG, or the config.yaml of the --measured DIR (refused with CONFIG, --preset or --published).

    One --measured serves every length; several (``--accuracy``) are one per
    length, and `length` picks the one whose config.yaml was measured at it.
    """
    if arguments.measured is None:
        return arguments.config
    if arguments.config is not None or arguments.preset is not None or arguments.published is not None:
        raise ConfigError("compare-task: give one of --measured, CONFIG, --preset, --published")
    if len(arguments.measured) > 1 and arguments.accuracy is None:
        raise ConfigError(f"--measured: given {len(arguments.measured)} times; allowed: once with TASK_DIR "
                          "(several, one per length, with --accuracy)")
    configs = {}
    for folder in arguments.measured:
        config = folder / "config.yaml"
        if not config.is_file():
            raise ConfigError(f"--measured {folder}: no config.yaml; allowed: the --out of jaxroll measure with "
                              "lambda measured")
        configs.setdefault(_measured_length(config), config)
    if len(configs) < len(arguments.measured):
        raise ConfigError(f"--measured: two folders measured at one length ({', '.join(map(str, arguments.measured))}"
                          "); allowed: one folder per length")
    if len(configs) == 1:
        return next(iter(configs.values()))
    if length not in configs:
        raise ConfigError(f"--measured: no folder measured at length {length} (measured: "
                          f"{', '.join(map(str, sorted(configs)))}); allowed: one folder per length of the table")
    return configs[length]


def _measured_length(config: Path) -> int:
    """The ``sequence_length`` a measurement's config.yaml was written at."""
    import yaml

    from .._readers import read_text

    try:
        mapping = yaml.safe_load(read_text(config, "the config.yaml of jaxroll measure"))
    except yaml.YAMLError:
        mapping = None
    length = mapping.get("sequence_length") if isinstance(mapping, dict) else None
    if not isinstance(length, int):
        raise ConfigError(f"--measured {config.parent}: config.yaml has no integer sequence_length; allowed: the "
                          "--out of jaxroll measure")
    return length


def _run_accuracy(arguments) -> None:
    """--accuracy FILE: the table read and checked, a model per length, then `compare_accuracy_table`."""
    import dataclasses

    import numpy as np

    from .. import io
    from ..rollout import influence
    from ..task import external

    for flag, value in (("--task", arguments.task), ("--score", None if arguments.score == "exact" else 1)):
        if value is not None:
            raise ConfigError(f"{flag}: applies to TASK_DIR only; allowed: with --accuracy, the table's accuracy")
    table = external.read_accuracy_table(arguments.accuracy, length=arguments.length)
    fit = None if arguments.fit_settings is None else arguments.fit_settings.split(",")
    external.split_settings(table, fit)
    models, source = {}, ""
    for length in dict.fromkeys(table.lengths.tolist()):
        config = _config_of(arguments, int(length))
        model, source = _common.model_from_arguments(arguments, config=config, length=int(length))
        models[int(length)] = dataclasses.replace(model, sequence_length=int(length))
    if arguments.measured is not None:
        source = "measured " + ", ".join(map(str, arguments.measured))
    io.prepare_output_dir(arguments.out, force=arguments.force)
    result = external.compare_accuracy_table(
        table, lambda length: np.asarray(influence(models[length], length), dtype=np.float64), fit_settings=fit,
        resamples=arguments.resamples, source=source)
    _report_table(result, arguments, "jaxroll compare-task --accuracy:")


def _run_per_case(arguments) -> None:
    """--per-case CASES: each measured case's own row over its gold span (`jaxroll.task.per_case.compare_per_case`)."""
    from .. import io
    from ..task import external, per_case

    flag = "--per-case" if arguments.per_case is not None else "--per-case-rows"
    if arguments.per_case is None:
        raise ConfigError("--per-case-rows: given without --per-case; allowed: --per-case CASES --per-case-rows ROWS")
    if arguments.accuracy is None or not arguments.measured:
        raise ConfigError(f"{flag}: needs --accuracy FILE and --measured DIR (one per length); allowed: "
                          "compare-task --accuracy FILE --measured DIR ... --per-case CASES")
    given = [name for name, value in (("CONFIG", arguments.config), ("--preset", arguments.preset),
                                      ("--published", arguments.published), ("--task", arguments.task))
             if value is not None] + (["--score"] if arguments.score != "exact" else [])
    if given:
        raise ConfigError(f"{flag}: given with {given[0]}; allowed: --accuracy, --measured, --fit-settings, "
                          "--resamples, --out, --force, --json (the rows come from the measurements)")
    table = external.read_accuracy_table(arguments.accuracy, length=arguments.length)
    fit = None if arguments.fit_settings is None else arguments.fit_settings.split(",")
    result = per_case.compare_per_case(table, arguments.measured, arguments.per_case,
                                       rows=arguments.per_case_rows or "sequence_rollout", fit_settings=fit,
                                       resamples=arguments.resamples)
    io.prepare_output_dir(arguments.out, force=arguments.force)
    _report_table(result, arguments, "jaxroll compare-task --accuracy --per-case:")


def _report_table(result, arguments, title: str) -> None:
    """A `TableComparison` written into --out, then printed (--json: its summary)."""
    from ..task import external

    external.write_table_comparison(result, arguments.out)
    if arguments.json:
        _common.print_json(_finite(external.summary_of(result)))
        return
    print(title)
    for line in result.statement():
        print(f"  {line}")
    print(f"  wrote {arguments.out}/compare.csv, compare.json, compare.txt, compare.png")
    sys.stdout.flush()


def _write_compare(result, out: Path, as_json: bool = False) -> None:
    import csv

    from ..task import versus_influence

    table = result.table()
    with open(out / "compare.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    summary = {"task": result.task, "length": result.length, "score": result.score, "source": result.source,
               "spearman": result.spearman, "spearman_interval": [result.spearman_low, result.spearman_high],
               "explained_in_sample": result.explained, "explained_leave_one_depth_out": result.explained_out_of_sample,
               "depth_effect_to_noise": result.depth_effect_to_noise, "cells": table}
    (out / "compare.json").write_text(json.dumps(summary, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    lines = result.statement()
    (out / "compare.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    versus_influence.plot_comparison(result, out / "compare.png")
    if as_json:
        _common.print_json(_finite(summary))
        return
    print("jaxroll compare-task:")
    for line in lines:
        print(f"  {line}")
    print(f"  wrote {out}/compare.csv, compare.json, compare.txt, compare.png")
    sys.stdout.flush()


def _finite(value):
    """`value` with every non-finite float as None: JSON has no NaN."""
    import math

    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
