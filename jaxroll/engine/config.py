"""What the kernel types share to read and write their sections of a rollout YAML configuration.

The schema (`jaxroll.schema`) writes lists of lists for ``(T, H)`` arrays,
collapsing rows and columns that are equal (`compact`), and reads them back
exactly (`nested_array`); large arrays go to an npz beside the file
(`read_kernel_file`). Every error is one line naming the field's path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._checks import as_float_array
from .._readers import read_npz
from ..errors import ConfigError

__all__ = ["check_keys", "compact", "nested_array", "read_kernel_arrays", "read_kernel_file"]


def check_keys(where: str, mapping, allowed, required=()) -> None:
    """`mapping` is a mapping of the `allowed` keys with the `required` ones; one line naming `where` otherwise."""
    label = where or "config"
    if not isinstance(mapping, dict):
        raise ConfigError(f"{label}: got {mapping!r:.60}; allowed: a mapping")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(f"{label}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(set(required) - set(mapping))
    if missing:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"{prefix}{missing[0]}: missing; this key is required")


def nested_array(name: str, value):
    """A schema list of lists as a float64 array (None stays None), rejecting ragged lists in one line."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(row, list) and row for row in value):
        raise ConfigError(f"{name}: got {value!r:.60}; allowed: a non-empty list of non-empty lists")
    lengths = {len(row) for row in value}
    if len(lengths) > 1:
        raise ConfigError(f"{name}: inner lists have lengths {sorted(lengths)}; allowed: all the same length")
    return as_float_array(name, value)


def compact(array) -> list[list[float]]:
    """A ``(T, H)`` array as the schema's nested list, collapsing equal rows and columns."""
    array = np.asarray(array, dtype=np.float64)
    if np.all(array == array[:1]):
        array = array[:1]
    if np.all(array == array[:, :1]):
        array = array[:, :1]
    return [[float(x) for x in row] for row in array]


def read_kernel_file(name, key: str, directory) -> np.ndarray:
    """The float64 array `key` of the npz `name` (relative to the configuration's `directory`)."""
    return read_kernel_arrays(name, directory, (key,))[key]


def read_kernel_arrays(name, directory, keys, optional=(), names=()) -> dict:
    """The float64 arrays `keys` of the npz `name` (relative to `directory`), read once, with those of `optional`
    that it holds; a key of `names` (among `optional`) is read as a tuple of strings."""
    field = "kernel_config.file"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{field}: got {name!r:.60}; allowed: an .npz path relative to the config")
    path = Path(directory or ".") / name
    if not path.is_file():
        raise ConfigError(f"{field}: {path}: no such file")
    data = read_npz(path, f"an .npz with a float array {keys[0]!r} (what save_config writes)",
                    label=f"{field}: {path}")
    arrays = {}
    for key in tuple(keys) + tuple(key for key in optional if key in data):
        if key not in data:
            raise ConfigError(f"{field}: {path} has no array {key!r}; it holds {', '.join(data) or 'nothing'}")
        if key in names:
            if data[key].dtype.kind != "U" or data[key].ndim != 1:
                raise ConfigError(f"{field}: {path}: array {key!r} of dtype {data[key].dtype}; "
                                  "allowed: a list of names")
            arrays[key] = tuple(str(value) for value in data[key])
            continue
        try:
            arrays[key] = np.asarray(data[key], dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"{field}: {path}: array {key!r} of dtype {data[key].dtype}; allowed: numbers") from None
    return arrays
