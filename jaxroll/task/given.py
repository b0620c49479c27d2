"""Cases given as token ids in a file (``jaxroll task --cases FILE.jsonl``): no tokenizer, no builder.

A model trained on a synthetic vocabulary (validation/models/task-u) has
no tokenizer, so `jaxroll.task.cases.Builder` cannot write its prompts;
its held-out cases are token ids already. Each line of the file is one
JSON object with

- ``prompt_ids``, ``answer_ids``: lists of token ids (integers >= 0, the
  answer at least one token);
- the gold record's span, ``record_start`` and ``record_end`` (end
  excluded, as validation/train_task.py writes them) or ``depth`` and
  ``record_length`` (as ``jaxroll task``'s ``cases.jsonl`` does), within
  the prompt;
- optional ``task`` (default ``"kv"``), ``depth_fraction`` (default
  ``depth / (length - 1)``), ``sample`` (default: the line's index among the
  lines of its task, length and depth fraction) and ``seed`` (default 0).

The cases are scored as the grid's are (`jaxroll.task.scoring`) and the rows
have the same fields, so `jaxroll.task.summary` and ``compare-task`` read
them unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .cases import Case

__all__ = ["read_cases"]

_ALLOWED = ("JSON lines with prompt_ids, answer_ids and record_start, record_end (or depth, record_length); "
            "optional task, depth_fraction, sample, seed")


def _ids(record, field, where, minimum):
    ids = record.get(field)
    if (not isinstance(ids, list) or len(ids) < minimum
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise ConfigError(f"{where}: field {field!r} is {ids!r:.40}; allowed: a list of at least {minimum} "
                          "integer token ids >= 0")
    return tuple(ids)


def _integer(record, field, where):
    value = record.get(field)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}: field {field!r} is {value!r:.40}; allowed: an integer ({_ALLOWED})")
    return value


def _span(record, length, where) -> tuple[int, int]:
    """``(depth, record_length)`` from record_start/record_end or depth/record_length, inside the prompt."""
    if "record_start" in record:
        start, end = _integer(record, "record_start", where), _integer(record, "record_end", where)
    else:
        start = _integer(record, "depth", where)
        end = start + _integer(record, "record_length", where)
    if not 0 <= start < end <= length:
        raise ConfigError(f"{where}: record span [{start}, {end}); allowed: 0 <= start < end <= the prompt's "
                          f"length {length}")
    return start, end - start


def _case(record, where, counts) -> Case:
    prompt, answer = _ids(record, "prompt_ids", where, 2), _ids(record, "answer_ids", where, 1)
    depth, record_length = _span(record, len(prompt), where)
    task = record.get("task", "kv")
    fraction = record.get("depth_fraction", depth / (len(prompt) - 1))
    if not isinstance(task, str) or not task:
        raise ConfigError(f"{where}: field 'task' is {task!r:.40}; allowed: a non-empty string")
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"{where}: field 'depth_fraction' is {fraction!r:.40}; allowed: a number in [0, 1]")
    cell = (task, len(prompt), float(fraction))
    sample = record.get("sample", counts.get(cell, 0))
    counts[cell] = counts.get(cell, 0) + 1
    seed = record.get("seed", 0)
    for field, value in (("sample", sample), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}: field {field!r} is {value!r:.40}; allowed: an integer >= 0")
    return Case(task, len(prompt), depth, float(fraction), sample, seed, record_length, prompt, answer)


def read_cases(path, vocabulary: int | None = None) -> list:
    """The `Case` of every line of `path`, in order, checked before any model loads.

    `vocabulary`: the model's ``vocab_size``; an id at or above it is refused.

    Raises:
        ConfigError: in one line naming the file and line: a line that is not a JSON object, a missing or
            malformed field, a span outside the prompt, an id outside the vocabulary, two lines with one
            (task, length, depth fraction, sample), or an empty file.
    """
    from ..io import read_text

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--cases {path}: no such file; allowed: {_ALLOWED}")
    cases, counts, seen = [], {}, {}
    for number, line in enumerate(read_text(path, "JSON lines").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"--cases {path}: line {number}"
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise ConfigError(f"{where} is not JSON; allowed: {_ALLOWED}") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{where} is a JSON {type(record).__name__}, not an object; allowed: {_ALLOWED}")
        case = _case(record, where, counts)
        top = max(case.prompt_ids + case.answer_ids)
        if vocabulary is not None and top >= vocabulary:
            raise ConfigError(f"{where}: token id {top}; allowed: ids below the model's vocab_size ({vocabulary})")
        if case.key in seen:
            raise ConfigError(f"{where}: case {case.key} is also line {seen[case.key]}; allowed: one line per "
                              "(task, length, depth_fraction, sample)")
        seen[case.key] = number
        cases.append(case)
    if not cases:
        raise ConfigError(f"--cases {path}: no cases (the file is empty); allowed: {_ALLOWED}")
    return cases
