"""``jaxroll task``: task accuracy by depth and length (``jaxroll compare-task`` sets it beside the rollout).

``task`` checks the model's config, the tokenizer and the grid (every
length long enough for every task) before the weights load and before
``--out`` is touched. Under torchrun (``WORLD_SIZE > 1``) each rank scores
its block of the pending cases and rank 0 writes (`jaxroll.task.grid`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    task = commands.add_parser(
        "task", help="task accuracy by record depth and prompt length (kv, passkey, copy), teacher-forced",
        description="Build seeded cases of kv (key-value retrieval, Liu et al. 2023's JSON format with keys from "
                    "the model's vocabulary), passkey and copy with the tokenizer in MODEL_DIR, the relevant record "
                    "at each requested depth, score them teacher-forced (gold log-probability in nats, greedy exact "
                    "match; no generation) and write cases.jsonl, summary.csv, summary.json and TASK.png into --out. "
                    "Resumable (--resume skips cases already in cases.jsonl); data parallel under torchrun. "
                    "Needs jaxroll[measure].")
    task.add_argument("model", type=Path, metavar="MODEL_DIR", help="directory written by save_pretrained")
    task.add_argument("--out", type=Path, required=True, help="output directory")
    task.add_argument("--cases", type=Path, default=None, metavar="FILE.jsonl",
                      help="score these cases instead of a built grid: JSON lines with prompt_ids, answer_ids and "
                           "the gold record's record_start, record_end (or depth, record_length); optional task, "
                           "depth_fraction, sample, seed. No tokenizer needed (jaxroll.task.given); not with the "
                           "grid's flags or --resume")
    task.add_argument("--tasks", default=None, help="comma-separated subset of kv,passkey,copy "
                                                    "(default all three)")
    task.add_argument("--lengths", default=None, help="comma-separated prompt lengths in tokens "
                                                      "(default 256,512,1024)")
    task.add_argument("--depths", default=None,
                      help="comma-separated depth fractions in [0, 1]: 0 puts the record right after the "
                           "instruction, 1 right before the question (default 0,0.1,...,1)")
    task.add_argument("--samples", type=_common.positive_int, default=None,
                      help="cases per (task, length, depth) (default 20)")
    task.add_argument("--seed", type=_common.non_negative_int, default=None, help="case seed (default 0)")
    task.add_argument("--batch-size", type=_common.positive_int, default=8, help="cases per forward pass")
    task.add_argument("--dtype", choices=("bfloat16", "float32", "float64"), default="float32")
    task.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    _common.add_intervene_argument(
        task, "score the model changed by interventions (as jaxroll measure --intervene; sinks=k go before every "
              "prompt)", "task.json records it and a --resume must give the same")
    task.add_argument("--quiet", action="store_true", help="no progress (default: a bar on a terminal, else a line at most every 5 s on stderr)")
    task.add_argument("--resume", action="store_true", help="continue in --out: skip cases already in cases.jsonl")
    task.add_argument("--force", action="store_true", help="write into a non-empty --out (cases.jsonl restarts)")
    _common.add_json_argument(task)
    task.set_defaults(run=_run_task, uses_jax=False)


def _parse_list(text: str, flag: str, kind):
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: got {text!r}; allowed: a comma-separated list of numbers") from None
    if not values:
        raise ConfigError(f"{flag}: got {text!r}; allowed: a non-empty comma-separated list")
    return list(dict.fromkeys(values))


GRID_DEFAULTS = {"tasks": "kv,passkey,copy", "lengths": "256,512,1024",
                 "depths": "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1", "samples": 20, "seed": 0}
"""The grid's flags and their defaults (None in the parser, so that --cases can refuse them when given)."""


def _grid_defaults(arguments) -> None:
    """Fill the grid's flags left out; with --cases refuse any that was given (and --resume)."""
    for name, default in GRID_DEFAULTS.items():
        if arguments.cases is not None and getattr(arguments, name) is not None:
            raise ConfigError(f"--{name}: given with --cases; allowed: --cases alone (its file holds the cases)")
        if getattr(arguments, name) is None:
            setattr(arguments, name, default)
    if arguments.cases is not None and arguments.resume:
        raise ConfigError("--resume: given with --cases; allowed: --cases alone (a given file is scored whole)")


def _grid(arguments):
    from ..task.cases import TASKS

    tasks = _parse_list(arguments.tasks, "--tasks", str)
    unknown = [item for item in tasks if item not in TASKS]
    if unknown:
        raise ConfigError(f"--tasks: got {unknown[0]!r}; allowed: a comma-separated subset of {','.join(TASKS)}")
    lengths = _parse_list(arguments.lengths, "--lengths", int)
    if min(lengths) < 1:
        raise ConfigError(f"--lengths: got {min(lengths)}; allowed: positive integers")
    depths = _parse_list(arguments.depths, "--depths", float)
    bad = [value for value in depths if not 0.0 <= value <= 1.0]
    if bad:
        raise ConfigError(f"--depths: got {bad[0]}; allowed: fractions in [0, 1]")
    return tasks, sorted(lengths), sorted(depths)


def _refuse_early(arguments) -> None:
    """The refusals that the flags and config.json decide, made before torch and transformers import.

    The grid's flags, --resume without a grid, and --intervene, the sinks and
    MPT's ``max_seq_len`` against config.json read with `json`
    (`torch_plan.config_json`; a folder it cannot read alone is left to the
    transformers config, which `_run_task` checks again).
    """
    _common.check_model_folder(arguments.model)
    from ..task import grid

    lengths = _grid(arguments)[1]
    if arguments.resume and not (arguments.out / grid.CASES_FILE).is_file():
        raise ConfigError(f"--resume: no {grid.CASES_FILE} in {arguments.out}; allowed: the --out of an earlier "
                          "jaxroll task run")
    from ..measure.additions import sink_count
    from ..measure.torch_plan import config_json, parse_for, position_limit

    config = config_json(arguments.model)
    if config is not None:
        limit, field = position_limit(config)
        _check_lengths(config, limit if field == "max_seq_len" else None, lengths,
                       sink_count(parse_for(arguments.intervene, config)))


def _run_task(arguments) -> None:
    _grid_defaults(arguments)
    if arguments.cases is not None:
        return _run_cases(arguments)
    _refuse_early(arguments)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("task: needs torch and transformers; install jaxroll[measure]") from None
    from ..measure import distributed, loading, texts
    from ..task import grid, summary
    from ..task.cases import Builder

    world = distributed.from_environment()
    tasks, lengths, depths = _grid(arguments)
    plan = loading.inspect_model(arguments.model)
    changes, record = _interventions(arguments.intervene, plan.config)
    from ..measure.additions import sink_count

    sinks = sink_count(changes)
    _check_lengths(plan.config, plan.max_length, lengths, sinks)
    try:
        tokenizer = texts.load_tokenizer(arguments.model)
    except ConfigError as refused:  # a synthetic vocabulary has no tokenizer: its cases come as token ids
        raise ConfigError(f"{refused}; or score cases given as token ids with --cases FILE.jsonl") from None
    builder = Builder(tokenizer)
    prefix, sink_tokens = (), None
    if sinks:  # SinkTokens: k ids before every prompt (the tokenizer's BOS, else EOS, else 0)
        from ..measure.torch_plan import sink_token

        sink_id, origin = sink_token(builder.tokenizer, plan.config)
        prefix, sink_tokens = (sink_id,) * sinks, {"count": sinks, "token_id": sink_id, "token": origin}
    for task in tasks:  # every refusal the grid can cause, before the weights load
        for length in lengths:
            builder.depth_range(task, length)
        if task == "passkey":
            builder.make(task, lengths[0], 0.0, 0, arguments.seed)
    device = loading.resolve_device(arguments.device)
    if world.distributed and device == "cuda":
        device = f"cuda:{world.local_rank}"
    settings = {"model": str(arguments.model.resolve()), "model_type": plan.config.model_type,
                "vocabulary": len(builder.tokenizer), "seed": arguments.seed, "tasks": tasks, "lengths": lengths,
                "depths": depths, "samples": arguments.samples, "dtype": arguments.dtype,
                "threshold": summary.THRESHOLD, "interventions": record, "sink_tokens": sink_tokens}
    distributed.init(world, device)
    try:
        _prepare_out(arguments, world, settings)
        # The architecture's default attention (sdpa where it has one): the path a user's generation takes;
        # eager Falcon would add its ALiBi twice (jaxroll.measure's falcon_alibi).
        model = loading.load_model(arguments.model, dtype=arguments.dtype, device=device, attn_implementation=None)
        progress = _progress(arguments, world, tasks, lengths, depths)
        try:
            with _patched(model, changes):
                rows = grid.run_grid(model, builder, arguments.out, tasks=tasks, lengths=lengths, depths=depths,
                                     samples=arguments.samples, seed=arguments.seed,
                                     batch_size=arguments.batch_size, world=world, prefix=prefix,
                                     progress=None if progress is None else progress.update)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"the scored cases are in {arguments.out}/{grid.CASES_FILE}; rerun with "
                                    "--resume to continue") from None
        finally:
            if progress is not None:
                # A resumed grid scores fewer cases than the whole grid: the count ends at what was done.
                progress.close(complete=True)
        if rows is not None:
            _write_summary(rows, arguments.out, tasks, arguments.json)
    finally:
        distributed.finalize(world)


def _run_cases(arguments) -> None:
    """``--cases FILE``: the given cases scored as the grid's (no tokenizer), into ``--out``.

    Checked before the weights load and before ``--out`` is touched: the
    file (`jaxroll.task.given.read_cases`, ids below ``vocab_size``), the
    interventions, and the longest prompt + answer + sinks within the
    model's positions. Sinks take the config's BOS (else EOS, else 0).
    """
    from .. import io
    from ..measure.additions import sink_count
    from ..measure.torch_plan import config_json, parse_for, position_limit, sink_token
    from ..task import given, grid

    _common.check_model_folder(arguments.model)
    config = config_json(arguments.model)
    vocabulary = getattr(config, "vocab_size", None)
    cases = given.read_cases(arguments.cases, vocabulary if isinstance(vocabulary, int) else None)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("task: needs torch and transformers; install jaxroll[measure]") from None
    from ..measure import loading

    plan = loading.inspect_model(arguments.model)
    changes, record = _interventions(arguments.intervene, plan.config)
    sinks = sink_count(changes)
    limit, field = position_limit(plan.config)
    longest = max(len(case.prompt_ids) + len(case.answer_ids) - 1 for case in cases) + sinks
    if limit is not None and longest > limit:
        raise ConfigError(f"--cases: the longest prompt and answer{f' with sinks={sinks}' if sinks else ''} run "
                          f"{longest} positions; allowed: at most the model's {field} ({limit})")
    prefix, sink_tokens = (), None
    if sinks:
        sink_id, origin = sink_token(None, plan.config)
        prefix, sink_tokens = (sink_id,) * sinks, {"count": sinks, "token_id": sink_id, "token": origin}
    tasks = list(dict.fromkeys(case.task for case in cases))
    settings = {"model": str(arguments.model.resolve()), "model_type": plan.config.model_type,
                "cases_file": str(arguments.cases.resolve()), "cases": len(cases), "tasks": tasks,
                "lengths": sorted({case.length for case in cases}), "dtype": arguments.dtype,
                "threshold": _threshold(), "interventions": record, "sink_tokens": sink_tokens}
    io.prepare_output_dir(arguments.out, force=arguments.force)
    (arguments.out / grid.CASES_FILE).unlink(missing_ok=True)  # --force restarts the scores
    grid.check_settings(arguments.out, settings, resume=False)
    model = loading.load_model(arguments.model, dtype=arguments.dtype, device=loading.resolve_device(arguments.device),
                               attn_implementation=None)
    from ..task.scoring import score_cases

    with _patched(model, changes):
        rows = score_cases(model, cases, batch_size=arguments.batch_size, prefix=prefix,
                           on_batch=lambda done: grid.append_rows(arguments.out / grid.CASES_FILE, done))
    _write_summary(rows, arguments.out, tasks, arguments.json)


def _threshold() -> float:
    from ..task import summary

    return summary.THRESHOLD


def _check_lengths(config, max_length: int | None, lengths, sinks: int) -> None:
    """The longest prompt, its 8 answer tokens and the sinks within the model's positions."""
    if sinks:
        from ..measure.torch_plan import position_limit

        limit, field = position_limit(config)
        if limit is not None and max(lengths) + 8 + sinks > limit:
            raise ConfigError(f"--lengths: {max(lengths)} with sinks={sinks} and 8 answer tokens runs "
                              f"{max(lengths) + 8 + sinks} positions; allowed: at most the model's {field} ({limit})")
    if max_length is not None and max(lengths) + 8 > max_length:
        raise ConfigError(f"--lengths: {max(lengths)}; allowed: at most the model's max_seq_len ({max_length}) "
                          "minus 8 answer tokens")


def _prepare_out(arguments, world, settings) -> None:
    """--out on rank 0: prepared (--force restarts the grid) or its rank files folded (--resume), its settings
    checked; a refusal reaches every rank (the broadcast is also a barrier)."""
    from .. import io
    from ..measure import distributed
    from ..task import grid

    error = None
    if world.is_main:
        try:
            if not arguments.resume:
                io.prepare_output_dir(arguments.out, force=arguments.force)
                for name in (grid.CASES_FILE, *(p.name for p in arguments.out.glob("cases.rank*.jsonl"))):
                    (arguments.out / name).unlink(missing_ok=True)  # --force restarts the grid
            else:
                grid.fold_rank_files(arguments.out)
            grid.check_settings(arguments.out, settings, arguments.resume)
        except ConfigError as refused:
            error = str(refused)
    error = distributed.broadcast_error(world, error)  # also a barrier: rank 0 has folded and written
    if error is not None:
        raise ConfigError(error)


def _interventions(text, config):
    """``--intervene``: the interventions, checked against the model's config, and their record (none: ``[], {}``).

    JAX (the interventions' arrays) loads only when there are some.
    """
    if text is None:
        return [], {}
    from ..interventions import describe
    from ..measure.torch_plan import parse_for

    changes = parse_for(text, config)
    return changes, describe(changes)


def _patched(model, changes):
    import contextlib

    if not changes:
        return contextlib.nullcontext()
    from ..measure.patching import patch

    return patch(model, changes)


def _progress(arguments, world, tasks, lengths, depths):
    """Cases scored by this rank on stderr (`jaxroll.progress`: a bar on a terminal, lines
    elsewhere; rank 0 only; none with --quiet)."""
    from ..progress import Progress

    if arguments.quiet or not world.is_main:
        return None
    total = len(tasks) * len(lengths) * len(depths) * arguments.samples // world.size
    return Progress(total, label="jaxroll task", unit="cases", delay=2.0)


def _write_summary(rows, out: Path, tasks, as_json: bool = False) -> None:
    from ..task import summary

    table = summary.cells(rows)
    summary.write_summary(table, out / "summary.csv")
    report = {"threshold": summary.THRESHOLD, "tasks": {}}
    lines = [f"jaxroll task: {len(rows)} cases in {out}/cases.jsonl"]
    for task in tasks:
        averages = summary.depth_average(table, task)
        effective = summary.effective_length(table, task)
        report["tasks"][task] = {"depth_averaged_exact": {str(k): v for k, v in averages.items()},
                                 "effective_length": effective}
        summary.plot_task(table, task, out / f"{task}.png", title=f"jaxroll task {task}: exact match by depth")
        shown = ", ".join(f"L={length}: {value:.2f}" for length, value in averages.items())
        lines.append(f"  {task}: depth-averaged exact match {shown}; effective length "
                     f"{effective if effective is not None else 'none'} (>= {summary.THRESHOLD})")
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    lines.append(f"  wrote {out}/summary.csv, summary.json, " + ", ".join(f"{task}.png" for task in tasks))
    if as_json:
        _common.print_json({"cases": len(rows), "out": out, **report})
    else:
        print("\n".join(lines))
