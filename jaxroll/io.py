"""Files: rollout configurations (YAML) and influence profiles (CSV).

The YAML schema is the one the paper's authors published (see the README);
`load_config` also reads their files that put tab characters inside flow
lists, which strict YAML parsers reject. Profiles are CSV files with header
``token_position,probability``.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

import numpy as np
import yaml

from typing import TYPE_CHECKING

from . import _readers
from .errors import ConfigError

if TYPE_CHECKING:  # the model and the schema import JAX: loaded where a model is read or written, so that
    from .model import RolloutModel  # reading YAML and profiles (the NumPy commands) does not load it

__all__ = ["load_config", "save_config", "read_profile", "write_profile", "read_yaml", "read_text",
           "prepare_output_dir", "check_output_dir", "discard_created", "write_yaml"]

PROFILE_HEADER = ("token_position", "probability")
ROUNDING = 1e-4
"""How far from 1 the sum of a profile may be for `write_profile` to take it for a rounded distribution."""


def read_text(path, kind: str) -> str:
    """The text of an existing file; a one-line error for a directory, a missing or a binary file.

    A UTF-8 byte-order mark (as spreadsheet programs write) is accepted and dropped.
    """
    return _readers.read_text(path, f"a UTF-8 {kind} file", kind=kind)


# libyaml's C parser when PyYAML was built with it: the published files load
# about 10x faster than with the pure-Python SafeLoader; the same YAML subset.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# A number exactly as YAML 1.1 (PyYAML's resolver) reads it: a float has a
# point and a signed exponent ("1e5" and "-.5" are strings there, so they are
# not matched here), an int is decimal without a leading zero ("010" is octal).
_NUMBER = r"(?:[-+]?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?|\.[0-9]+(?:[eE][-+][0-9]+)?|[-+]?(?:0|[1-9][0-9]*))"
_FLAT = rf"\[[ \t]*{_NUMBER}(?:[ \t]*,[ \t]*{_NUMBER})*[ \t]*\]"
_LONG_LIST = re.compile(rf"(?P<key>[ ]*[A-Za-z_][A-Za-z0-9_]*:[ ]+)(?P<value>{_FLAT}|\[[ \t]*{_FLAT}"
                        rf"(?:[ \t]*,[ \t]*{_FLAT})*[ \t]*\])[ \t]*")
_LONG = 1000  # characters: only the long lists cost PyYAML time (70 x 112 numbers: 0.3 s)


def _numbers(flat: str) -> list:
    """``[1.5, 2, ...]`` (matched by `_FLAT`) as YAML reads it: floats and ints."""
    items = flat.strip(" \t")[1:-1].split(",")  # float() and int() skip the spaces and tabs around
    # Each matched float has exactly one point and an int none: all floats iff as many points as items.
    if flat.count(".") == len(items):
        return list(map(float, items))
    return [float(t) if "." in t else int(t) for t in items]


def _fast_lists(text: str):
    """`text` with each long one-line list of plain numbers replaced by a placeholder, and the lists.

    PyYAML builds every scalar in Python (resolver regexes, then float()),
    about 20 us a number; the published all-content files hold two lists of
    70 x 112 numbers. A line ``key: [[n, n, ...], [n, ...]]`` (or ``[n, ...]``)
    of plain decimal numbers only, longer than `_LONG`, is read here with the
    same result (the same ints and floats; tabs between items read as spaces,
    as `read_yaml`'s second try does). Anything else on such a line (a
    boolean, a quoted number, ``.nan``, deeper nesting, a comment) leaves it
    to PyYAML, so every error message stays PyYAML's or the schema's.
    """
    lists = {}
    if _MARKER in text:
        return text, lists
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if len(line) < _LONG:
            continue
        match = _LONG_LIST.fullmatch(line)
        if match is None:
            continue
        value = match["value"]
        inner = value[1:].lstrip(" \t")
        if inner.startswith("["):
            rows = re.findall(r"\[[^\[\]]*\]", value[1:-1])
            lists[index] = [_numbers(row) for row in rows]
        else:
            lists[index] = _numbers(value)
        lines[index] = f"{match['key']}{_placeholder(index)}"
    return ("\n".join(lines), lists) if lists else (text, lists)


_MARKER = "__jaxroll_list_"


def _placeholder(index: int) -> str:
    return f"{_MARKER}{index}__"


def _parse_yaml(text: str):
    short, lists = _fast_lists(text)
    data = yaml.load(short, Loader=_LOADER)  # noqa: S506 (a safe loader, C or Python)
    if not lists:
        return data
    placeholders = {_placeholder(index): value for index, value in lists.items()}
    found = 0
    # Each placeholder must come back as the value of a mapping (at any depth
    # of mappings), where its list was; it is unique (the text had no marker).
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and value in placeholders:
                    node[key] = placeholders[value]
                    found += 1
                elif isinstance(value, dict):
                    stack.append(value)
    if found != len(lists):
        # A placeholder inside a string or a list, or a key given twice: read it all with PyYAML.
        return yaml.load(text, Loader=_LOADER)  # noqa: S506
    return data


def read_yaml(path) -> dict:
    """Parse a YAML mapping, tolerating tabs used as spaces inside flow lists.

    Nesting deeper than Python's recursion limit allows (thousands of levels)
    is refused in one line rather than with a RecursionError.
    """
    path = Path(path)
    text = read_text(path, "YAML")
    try:
        try:
            data = _parse_yaml(text)
        except yaml.YAMLError:
            # The published configurations put tabs between list items. Tabs are
            # never meaningful in this schema (no key holds free text), so
            # reading them as spaces is safe.
            try:
                data = _parse_yaml(text.replace("\t", " "))
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                problem = getattr(error, "problem", None) or type(error).__name__
                if isinstance(error, yaml.reader.ReaderError):  # a control character such as NUL
                    where, problem = f" at character {error.position}", f"character {chr(error.character)!r} not allowed"
                raise ConfigError(f"{path}: malformed YAML{where}: {problem}; allowed: UTF-8 text") from None
    except ConfigError:
        raise
    except ValueError as error:  # an integer too long for int() (over 4300 digits)
        raise ConfigError(f"{path}: malformed YAML: {str(error).splitlines()[0][:80]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply to read; allowed: the schema's few levels "
                          "(mappings of lists of lists)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top, got {type(data).__name__}")
    return data


def load_config(path) -> RolloutModel:
    """Read a rollout configuration file into a `RolloutModel`.

    A file with a ``kernel_config`` section gives a model over that kernel; its
    ``file`` (an npz of kernel arrays) is read relative to the config's folder.

    Raises:
        ConfigError: a missing file, a directory, malformed YAML or any
            schema violation; the message names the file and the field.
    """
    from .schema import model_from_config

    data = read_yaml(path)
    try:
        return model_from_config(data, Path(path).parent)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def kernel_file_path(path) -> Path:
    """Where `save_config` puts the kernel arrays of the config at `path`: ``<stem>.kernels.npz`` beside it."""
    path = Path(path)
    return path.with_name(path.stem + ".kernels.npz")


def save_config(model: RolloutModel, path, *, overwrite: bool = False,
                schedule: dict | None = None) -> Path:
    """Write `model` in the rollout YAML schema; `load_config` reads it back exactly.

    `schedule`, a ``lambda_schedule_config`` mapping (e.g. ``{"schedule_type":
    "power_decay", "lambda_0": 0.35, "beta": 1.3}``, what `FitResult.schedule_config`
    gives), is written instead of the lambdas when it reproduces them exactly.

    Numbers are written with Python's shortest round-trip representation, so
    every float64 value survives the round trip bit for bit. A dense or table
    kernel's arrays go to `kernel_file_path(path)` (float64 npz), named in
    the config by a relative path.

    Raises:
        ConfigError: when `path` (or the kernel npz) exists and `overwrite` is
            false, or `schedule` does not give the model's lambdas.
    """
    from .schema import config_from_model, kernel_arrays

    path = Path(path)
    if schedule is not None:
        from .schema import schedule_from_config

        if not np.array_equal(np.asarray(schedule_from_config(schedule, model.num_layers)), model.lambdas):
            raise ConfigError(f"schedule: {schedule!r:.80} does not give the model's lambdas; allowed: "
                              "a schedule that reproduces them exactly")
    arrays = kernel_arrays(model)
    companion = kernel_file_path(path) if arrays else None
    for target in (path, companion):
        if target is not None and target.exists() and not overwrite:
            raise ConfigError(f"{target}: exists; pass overwrite=True to replace it")
    config = config_from_model(model, companion.name if companion else None)
    if schedule is not None:
        config["lambda_schedule_config"] = dict(schedule)
    text = _dump_yaml(config)
    if companion is not None:
        with open(companion, "wb") as handle:
            np.savez(handle, **arrays)
    path.write_text(text, encoding="utf-8")
    return path


def write_yaml(config: dict, path) -> Path:
    """Write a configuration mapping (plain Python numbers, lists, mappings) as `save_config` writes a model's
    (the same text for the same mapping); for writers that hold no `RolloutModel` (`jaxroll.numpy_rollout`)."""
    path = Path(path)
    path.write_text(_dump_yaml(config), encoding="utf-8")
    return path


_LONG_DUMP = 200  # numbers: shorter lists are left to PyYAML's emitter (and its line wrapping)


def _float_text(value: float) -> str:
    """A float as PyYAML's `represent_float` writes it (shortest round trip; ``1e-05`` as ``1.0e-05``)."""
    if value != value:
        return ".nan"
    if value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value).lower()
    return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text


def _long_numbers(value) -> bool:
    rows = value if value and isinstance(value, list) and all(isinstance(r, list) for r in value) else [value]
    return (isinstance(value, list) and sum(len(r) for r in rows if isinstance(r, list)) >= _LONG_DUMP
            and all(isinstance(r, list) and all(type(x) is float for x in r) for r in rows))


def _dump_yaml(config: dict) -> str:
    """``yaml.safe_dump`` of a config, with long lists of floats written on one line by hand.

    PyYAML's Python emitter takes about 40 us a number (0.5 s for an
    all-content BLOOM-176B config). A list (or list of lists) of at least
    `_LONG_DUMP` floats is written as one flow line ``[[a, b, ...], [...]]``
    with PyYAML's own float text, which `_parse_yaml` reads back fast; the
    rest of the file is PyYAML's.
    """
    lists: dict[str, str] = {}

    def flow(row) -> str:
        text = ", ".join(map(repr, row))
        # repr is PyYAML's float text unless an exponent lacks its point or the value is inf or nan.
        return "[" + (", ".join(map(_float_text, row)) if "e" in text or "n" in text else text) + "]"

    def swap(mapping: dict) -> dict:
        result = {}
        for key, value in mapping.items():
            if isinstance(value, dict):
                value = swap(value)
            elif _long_numbers(value):
                marker = _placeholder(len(lists))
                rows = value if isinstance(value[0], list) else None
                lists[marker] = "[" + ", ".join(map(flow, rows)) + "]" if rows is not None else flow(value)
                value = [marker]  # a list, so that its mapping is written in block style, one key a line
            result[key] = value
        return result

    text = yaml.safe_dump(swap(config), sort_keys=False, default_flow_style=None, width=100)
    for marker, flow in lists.items():
        if text.count(f": [{marker}]\n") != 1:  # not where a value goes: let PyYAML write it all
            return yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=100)
        text = text.replace(f": [{marker}]\n", f": {flow}\n")
    return text


def write_profile(profile, path, *, overwrite: bool = False) -> Path:
    """Write a profile as CSV, header ``token_position,probability``.

    The values are taken to float64; a distribution whose float64 sum is
    off 1 by rounding (more than 1e-13, at most `ROUNDING`) is divided by
    it, so the file sums to 1 within 1e-12 whatever precision the profile
    was computed in (a float32 profile sums to 1 only within about 1e-7).
    They are written with Python's shortest round-trip text, so a float64
    distribution reads back bit for bit. Any other profile (one that is no
    distribution, which the commands that need one refuse) is written as it is.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: exists; pass overwrite=True to replace it")
    values = np.asarray(profile, dtype=np.float64)
    if values.ndim != 1:
        raise ConfigError(f"profile: got shape {values.shape}; allowed: one dimension (n,)")
    total = float(np.sum(values))
    if 1e-13 < abs(total - 1) <= ROUNDING:  # a distribution off 1 by rounding; float64 ones are kept bit for bit
        values = values / total
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(PROFILE_HEADER)
        for position, value in enumerate(values):
            writer.writerow((position, repr(float(value))))
    return path


def read_profile(path) -> np.ndarray:
    """Read a ``token_position,probability`` CSV into a float64 array ``(n,)``.

    Positions must be 0, 1, ..., n-1 in order; probabilities finite and >= 0,
    not all 0. The sum is not checked otherwise (callers that need a
    distribution do).
    """
    path = Path(path)
    try:
        rows = list(csv.reader(io.StringIO(read_text(path, "CSV"), newline="")))
    except csv.Error as error:  # a field over the csv module's limit (131072 characters)
        raise ConfigError(f"{path}: not a profile CSV ({error}); allowed: lines 'position,probability'") from None
    if not rows or tuple(cell.strip() for cell in rows[0]) != PROFILE_HEADER:
        found = ",".join(rows[0]) if rows else "an empty file"
        raise ConfigError(f"{path}: header {found!r}; allowed: 'token_position,probability'")
    values = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            position, value = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise ConfigError(f"{path}: line {line}: {','.join(row)!r:.80} is not 'position,probability'; "
                              "allowed: an integer position, a comma and a number") from None
        if position != len(values):
            raise ConfigError(f"{path}: line {line}: position {position}; allowed: {len(values)} (positions 0, 1, ... "
                              "in order)")
        if not np.isfinite(value) or value < 0:
            raise ConfigError(f"{path}: line {line}: probability {value}; allowed: finite and >= 0")
        values.append(value)
    if not values:
        raise ConfigError(f"{path}: no profile rows; allowed: a header and one line per position")
    if not any(values):  # here, where the file is known, not as an anonymous "total mass is 0" later
        raise ConfigError(f"{path}: total mass is 0 (every probability is 0); allowed: a positive sum")
    return np.asarray(values, dtype=np.float64)


def prepare_output_dir(directory, *, force: bool) -> Path:
    """Create `directory`; refuse one that holds files unless `force`.

    Every file-system refusal is one line naming ``--out`` (`check_output_dir`).
    """
    directory = Path(directory)
    check_output_dir(directory, force=force)
    new = None  # the topmost directory this call creates
    for ancestor in (directory.absolute(), *directory.absolute().parents):
        if ancestor.exists():
            break
        new = ancestor
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--out {directory}: cannot create it ({error.strerror or type(error).__name__})") from None
    if new is not None:
        CREATED.append(new)
    return directory


CREATED: list[Path] = []
"""Directories `prepare_output_dir` created in this process (the topmost new one of each call), so that a
command refused after creating its ``--out`` can remove them again (`discard_created`)."""


def discard_created() -> None:
    """Remove every directory in `CREATED` (with what this process wrote into it) and forget them.

    The command line calls it when a command is refused: nothing is left
    behind by a refusal, even one that comes after ``--out`` was made.
    """
    import shutil

    while CREATED:
        shutil.rmtree(CREATED.pop(), ignore_errors=True)


def check_output_dir(directory, *, force: bool) -> None:
    """What `prepare_output_dir` refuses, checked without creating anything.

    A file in the way (``--out some_file.csv/sub``), a non-empty directory
    without `force`, the nearest existing ancestor not writable
    (``/proc/nope``, a read-only directory): one-line `ConfigError`s.
    """
    directory = Path(directory)
    try:
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"--out {directory}: exists and is not a directory")
        if directory.is_dir() and any(directory.iterdir()) and not force:
            raise ConfigError(f"--out {directory}: directory is not empty; pass --force to overwrite")
        existing = directory.absolute()
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise ConfigError(f"--out {directory}: {existing} is a file, not a directory")
        if not os.access(existing, os.W_OK | os.X_OK) or _pseudo_file_system(existing):
            raise ConfigError(f"--out {directory}: cannot create it ({existing} is not writable)")
    except OSError as error:
        raise ConfigError(f"--out {directory}: {error.strerror or type(error).__name__}") from None


def _pseudo_file_system(path: Path) -> bool:
    """/proc and /sys refuse new directories even to root, whom os.access always answers yes."""
    parts = path.parts
    return len(parts) > 1 and parts[0] == "/" and parts[1] in ("proc", "sys")
