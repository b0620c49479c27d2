"""Reading the files the commands read: npz archives, JSON and text, refused in one line naming the file.

Below `io` and `schema` (both use it): NumPy and `errors` only. A file that
is corrupt, truncated or of another kind (a pickle, a bare ``.npy``, text)
is a `ConfigError` ``PATH: not a readable .npz (...); allowed: ...``, never
a traceback from ``zipfile``, ``zlib`` or NumPy's format reader.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import ConfigError

__all__ = ["read_npz", "read_json", "read_text"]

_BROKEN = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error, UnicodeDecodeError)


def _reason(error: BaseException) -> str:
    """``Type: first line of the message`` (NumPy's pickle refusal spans several lines), at most 100 characters."""
    lines = str(error).strip().splitlines()
    detail = lines[0].strip() if lines else ""
    if len(detail) > 100:
        detail = detail[:97] + "..."
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__


def _existing(path: Path, label: str) -> None:
    if path.is_dir():
        raise ConfigError(f"{label}: is a directory; allowed: a file")
    if not path.is_file():
        raise ConfigError(f"{label}: no such file")


def read_npz(path, allowed: str, *, label: str | None = None, what: str = "a readable .npz") -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` archive at `path`, read in full (so a truncated member shows here).

    `allowed` says what the file should be (``"the measurement.npz of jaxroll
    measure"``); `label` replaces the path at the start of the message (e.g.
    ``--measured DIR: measurement.npz``), `what` the words after "not" (``a
    checkpoint of jaxroll measure``). Pickled (object) arrays are refused.
    """
    path = Path(path)
    label = str(path) if label is None else label
    _existing(path, label)
    try:
        with open(path, "rb") as handle:  # ours, closed on every path (np.load leaks its own on a bad zip)
            head = handle.read(6)
            if not head.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # an archive, or an empty one
                kind = ("a single .npy array" if head == b"\x93NUMPY" else "empty" if not head
                        else "a pickle" if head[:1] == b"\x80" else f"starts with {head!r}")
                raise ConfigError(f"{label}: not {what} (not a zip archive: {kind}); allowed: {allowed}")
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as data:
                return {name: np.asarray(data[name]) for name in data.files}
    except ConfigError:
        raise
    except _BROKEN as error:
        raise ConfigError(f"{label}: not {what} ({_reason(error)}); allowed: {allowed}") from None


def read_text(path, allowed: str, *, label: str | None = None, kind: str = "text") -> str:
    """The UTF-8 text of the file at `path` (a byte-order mark dropped); a binary file refused in one line.

    `allowed` says what the file should be (``"a YAML file of
    interventions"``), `kind` what it was read as (``YAML``), `label`
    replaces the path at the start of the message.
    """
    path = Path(path)
    label = str(path) if label is None else label
    _existing(path, label)
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{label}: not a UTF-8 {kind} file (byte {error.start} cannot be decoded: a binary "
                          f"file?); allowed: {allowed}") from None
    except OSError as error:
        raise ConfigError(f"{label}: cannot be read ({error.strerror or type(error).__name__}); "
                          f"allowed: {allowed}") from None


def read_json(path, allowed: str, *, kind: type = dict, label: str | None = None):
    """The JSON value in the file at `path`, which must be a `kind` (an object unless told otherwise)."""
    path = Path(path)
    label = str(path) if label is None else label
    _existing(path, label)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{label}: not UTF-8 JSON (byte {error.start} cannot be decoded); "
                          f"allowed: {allowed}") from None
    except OSError as error:
        raise ConfigError(f"{label}: cannot be read ({error.strerror or type(error).__name__})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{label}: malformed JSON at line {error.lineno}, column {error.colno}: {error.msg}; "
                          f"allowed: {allowed}") from None
    except RecursionError:
        raise ConfigError(f"{label}: JSON nested too deeply to read; allowed: {allowed}") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{label}: a JSON {type(value).__name__}, not {_kind_name(kind)}; allowed: {allowed}")
    return value


def _kind_name(kind: type) -> str:
    return {dict: "an object", list: "a list"}.get(kind, kind.__name__)
