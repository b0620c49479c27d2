"""A depth x length grid of cases: scored in batches, resumable, data parallel.

The grid is every (task, length, depth fraction, sample) with its own
seeded case (`jaxroll.task.cases`). Rows go to ``cases.jsonl`` in the
output directory as they are scored (one JSON object per line, see
`jaxroll.task.scoring.case_row`); a case whose ``key`` is already there is
skipped, so an interrupted run continues by running it again (``--resume``),
and a grid can be extended with more lengths, depths or samples.
``task.json`` records the model, the tokenizer's size, the seed and the
interventions the model was scored under (``--intervene``, `describe`'s
record, ``{}`` for none); a resumed run must match them.

Data parallel as `jaxroll measure` (`jaxroll.measure.distributed`): under
torchrun, rank r of K scores the contiguous block r of
``numpy.array_split(pending, K)``, appends its rows to
``cases.rank{r}-of-{K}.jsonl``, and at the end `gather_to_rank0` brings the
rows to rank 0, which appends them to ``cases.jsonl`` and removes the rank
files. A later ``--resume`` first folds leftover rank files of an
interrupted run into ``cases.jsonl``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .cases import Builder, case_key
from .scoring import score_cases

__all__ = ["grid_cases", "run_grid", "read_rows", "append_rows", "CASES_FILE", "SETTINGS_FILE"]

CASES_FILE = "cases.jsonl"
"""One scored case per line (`jaxroll.task.scoring.case_row`)."""
SETTINGS_FILE = "task.json"
"""The model, tokenizer size, seed and grid of a run: a ``--resume`` must match the first three."""


def grid_cases(builder: Builder, tasks, lengths, depths, samples: int, seed: int, skip=frozenset()) -> list:
    """Every case of the grid whose key is not in `skip`, in (task, length, depth, sample) order."""
    cases = []
    for task in tasks:
        for length in lengths:
            builder.depth_range(task, length)  # a too-short length is refused before any case is built
            for fraction in depths:
                for sample in range(samples):
                    if case_key(task, length, fraction, sample) not in skip:
                        cases.append(builder.make(task, length, fraction, sample, seed))
    return cases


_ROW_FIELDS = {"task": str, "length": int, "depth": int, "answer_ids": list, "logprob": (int, float),
               "exact": (bool, int), "depth_fraction": (int, float), "record_length": int, "key": str}
"""The fields of a `case_row` that the readers of ``cases.jsonl`` use, and their JSON types."""


def read_rows(path) -> list[dict]:
    """The rows of a ``cases.jsonl`` (a torn last line from a killed run is dropped).

    Any other line that is not a JSON object with the fields of a scored case
    (`_ROW_FIELDS`) is refused in one line naming the file and the line.
    """
    from ..io import read_text

    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    allowed = "the cases.jsonl of jaxroll task"
    lines = read_text(path, "JSON lines").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if number == len(lines):
                break
            raise ConfigError(f"{path}: line {number} is not JSON; allowed: {allowed}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {number} is a JSON {type(row).__name__}, not an object; allowed: {allowed}")
        for field, kind in _ROW_FIELDS.items():
            if not isinstance(row.get(field), kind):
                raise ConfigError(f"{path}: line {number}: field {field!r} is {row.get(field)!r:.40}; allowed: "
                                  f"{allowed} (a {kind.__name__ if isinstance(kind, type) else kind[-1].__name__})")
        rows.append(row)
    return rows


def append_rows(path, rows) -> None:
    """Append scored rows to a ``cases.jsonl`` (flushed and synced: an interrupted run keeps them)."""
    _append(Path(path), rows)


def _append(path: Path, rows) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _rank_file(world) -> str:
    return f"cases.rank{world.rank}-of-{world.size}.jsonl"


def fold_rank_files(out: Path) -> None:
    """Append the rows of leftover ``cases.rank*.jsonl`` files to ``cases.jsonl`` (once each) and remove them."""
    done = {row["key"] for row in read_rows(out / CASES_FILE)}
    for part in sorted(out.glob("cases.rank*-of-*.jsonl")):
        fresh = [row for row in read_rows(part) if row["key"] not in done]
        _append(out / CASES_FILE, fresh)
        done.update(row["key"] for row in fresh)
        part.unlink()


def check_settings(out: Path, settings: dict, resume: bool) -> None:
    """Write ``task.json``, or on `resume` refuse one whose model, tokenizer, seed or interventions differ."""
    path = out / SETTINGS_FILE
    if resume and path.is_file():
        from .._readers import read_json

        old = read_json(path, "the task.json of jaxroll task")
        for name in ("model", "vocabulary", "seed", "interventions"):
            default = {} if name == "interventions" else None  # a task.json written without --intervene: none
            if old.get(name, default) != settings.get(name, default):
                raise ConfigError(f"--resume: {name} {settings.get(name, default)!r} differs from "
                                  f"{old.get(name, default)!r} in {path}; allowed: the same model, --seed and "
                                  "--intervene as the run being continued")
        settings = {**old, **settings, "lengths": sorted(set(old.get("lengths", [])) | set(settings["lengths"])),
                    "depths": sorted(set(old.get("depths", [])) | set(settings["depths"])),
                    "tasks": list(dict.fromkeys([*old.get("tasks", []), *settings["tasks"]]))}
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


class _Rows:
    """Scored rows in the shape `jaxroll.measure.distributed.gather_to_rank0` merges (state, merge)."""

    def __init__(self, rows):
        self.rows = list(rows)

    def state(self):
        return self.rows

    def merge(self, others):
        return _Rows([*self.rows, *(row for other in others for row in other)])


def run_grid(model, builder: Builder, out, *, tasks, lengths, depths, samples: int, seed: int = 0,
             batch_size: int = 8, world=None, progress=None, prefix=()) -> list[dict] | None:
    """Score the grid's pending cases and append them to ``out/cases.jsonl``.

    `prefix`: ids before every prompt (``--intervene sinks=k``: k sink ids;
    the record's depth and the answer move k positions right in the
    model's input, the rows keep the prompt's own indices).

    Returns every row of the grid (old and new) on rank 0, None on other ranks.
    `out` must exist (and hold ``task.json``); `progress(count)` is called with
    the number of cases of each finished batch.
    """
    from ..measure import distributed

    world = world or distributed.World()
    out = Path(out)
    done = {row["key"] for row in read_rows(out / CASES_FILE)}
    pending = grid_cases(builder, tasks, lengths, depths, samples, seed, skip=done)
    mine = [pending[i] for i in np.array_split(np.arange(len(pending)), world.size)[world.rank]]
    target = out / (_rank_file(world) if world.distributed else CASES_FILE)

    def keep(rows):
        _append(target, rows)
        if progress is not None:
            progress(len(rows))

    rows = score_cases(model, mine, batch_size=batch_size, on_batch=keep, prefix=prefix)
    if world.distributed:
        merged = distributed.gather_to_rank0(world, _Rows(rows))
        if merged is None:
            return None
        _append(out / CASES_FILE, [row for row in merged.rows if row["key"] not in done])
        for rank in range(world.size):
            (out / _rank_file(distributed.World(rank, world.size))).unlink(missing_ok=True)
    wanted = {case_key(t, n, f, s) for t in tasks for n in lengths for f in depths for s in range(samples)}
    return [row for row in read_rows(out / CASES_FILE) if row["key"] in wanted]
