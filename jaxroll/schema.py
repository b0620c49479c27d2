"""The rollout YAML schema <-> `RolloutModel`: the I/O layer's mapping.

The schema is the one the paper's authors published (arXiv 2602.16837; see
the README, "Configuration schema"). `model_from_config` turns a parsed YAML
mapping into a checked `RolloutModel`, `config_from_model` writes one back as
plain Python numbers, and the round trip is exact. The core (`model.py`)
knows nothing of files or key names; `jaxroll.io` reads and writes the files.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import schedules
from ._checks import as_float_array, as_float_scalar, check_positive_int, check_range
from .errors import ConfigError
from .kernel_types import DenseKernel, PowerKernel, TableKernel
from .engine.alibi import AlibiKernel
from .model import RolloutModel

__all__ = ["model_from_config", "config_from_model", "kernel_arrays", "KERNEL_FILE_ARRAYS"]

KERNEL_FILE_ARRAYS = {"dense": "kernels", "table": "offset_scores"}
"""The array a ``kernel_config.file`` npz holds, by kernel: dense ``(T, N, N)``, table ``(T, H, K)``."""

_SCHEMA_MASKS = {"causal": "causal", "full": "full", "sliding_window": "sliding"}
_SCHEMA_KEYS = {
    "": {"sequence_length", "num_layers", "mask_config", "attention_config",
         "content_config", "lambda_schedule_config", "save_dir", "kernel_config"},
    "mask_config": {"mask_type", "window_size"},
    "attention_config": {"num_heads", "alibi_slopes", "head_weights", "softmax_temperature"},
    "content_config": {"diagonal_scores", "base_scores"},
}
_SCHEDULE_KEYS = {
    "constant": {"schedule_type", "lambda_const"},
    "power_decay": {"schedule_type", "lambda_0", "beta"},
    "custom": {"schedule_type", "lambdas_custom"},
}
# Where each keyword of `create` lives in the YAML schema, for error messages.
_SCHEMA_PATHS = {
    "lambdas": "lambda_schedule_config.lambdas_custom",
    "alibi_slopes": "attention_config.alibi_slopes",
    "diagonal_scores": "content_config.diagonal_scores",
    "base_scores": "content_config.base_scores",
    "head_weights": "attention_config.head_weights",
    "temperature": "attention_config.softmax_temperature",
    "mask": "mask_config.mask_type",
    "window": "mask_config.window_size",
}


def model_from_config(config: dict[str, Any], directory=None) -> RolloutModel:
    """Build a model from a configuration in the rollout YAML schema.

    Lists of length 1 broadcast over layers (outer) or heads (inner);
    every schedule must lie in [0, 1], nothing is clipped: ``lambda_const``
    in [0, 1], ``lambda_0`` in (0, 1] with ``beta >= 0``, ``lambdas_custom``
    in [0, 1]. ``save_dir`` is
    accepted and ignored. See the README for the schema.

    A ``kernel_config`` section (instead of ``attention_config``,
    ``content_config`` and ``mask_config``) gives a model over that kernel;
    its ``file`` is resolved relative to `directory` (the config's folder).

    Raises:
        ConfigError: unknown keys, missing keys, wrong lengths, values out
            of range; one line naming the field.
    """
    if "kernel_config" in config:
        return _kernel_model_from_config(config, directory)
    _check_keys("", config, required={"sequence_length", "num_layers",
                                      "attention_config", "lambda_schedule_config"})
    mask_config = config.get("mask_config") or {}
    attention = config["attention_config"]
    content = config.get("content_config") or {}
    _check_keys("mask_config", mask_config)
    _check_keys("attention_config", attention, required={"num_heads", "alibi_slopes"})
    _check_keys("content_config", content)

    num_layers = check_positive_int("num_layers", config["num_layers"])
    num_heads = check_positive_int("attention_config.num_heads", attention["num_heads"])
    mask_type = mask_config.get("mask_type", "causal")
    if not isinstance(mask_type, str) or mask_type not in _SCHEMA_MASKS:
        raise ConfigError(
            f"mask_config.mask_type: got {mask_type!r}; allowed: one of "
            + ", ".join(_SCHEMA_MASKS)
        )
    window = mask_config.get("window_size")
    if mask_type == "sliding_window" and window is None:
        raise ConfigError(
            "mask_config.window_size: sliding_window needs a window size; allowed: an integer >= 1"
        )
    try:
        lambdas = schedule_from_config(config["lambda_schedule_config"], num_layers)
        return RolloutModel.create(
            num_layers=num_layers,
            num_heads=num_heads,
            lambdas=lambdas,
            alibi_slopes=_nested("alibi_slopes", attention["alibi_slopes"]),
            diagonal_scores=_nested("diagonal_scores", content.get("diagonal_scores", [[0.0]])),
            base_scores=_nested("base_scores", content.get("base_scores", [[0.0]])),
            head_weights=_nested("head_weights", attention.get("head_weights")),
            temperature=attention.get("softmax_temperature", 1.0),
            mask=_SCHEMA_MASKS[mask_type],
            window=window,
            sequence_length=config["sequence_length"],
        )
    except ConfigError as error:
        field, _, rest = str(error).partition(":")
        raise ConfigError(f"{_SCHEMA_PATHS.get(field, field)}:{rest}") from None


def config_from_model(model: RolloutModel, kernel_file: str | None = None) -> dict[str, Any]:
    """`model` in the rollout YAML schema, as plain Python numbers.

    Values that are equal across layers or heads are written as 1-element
    lists; uniform head weights as ``null``; an equal lambda in every
    layer as a ``constant`` schedule, anything else as ``custom``. Reading
    the result back with `model_from_config` gives the same arrays exactly.

    A model with another kernel than ALiBi + content is written with a ``kernel_config`` section; its
    large arrays (`kernel_arrays`) go to the npz named `kernel_file`.
    """
    if not isinstance(model.kernel, AlibiKernel):
        return _kernel_config_from_model(model, kernel_file)
    schedule = _schedule_to_config(model.lambdas)
    weights = np.asarray(model.head_weights, dtype=np.float64)
    uniform = np.all(weights == weights.flat[0])
    schema_mask = {value: key for key, value in _SCHEMA_MASKS.items()}[model.mask]
    return {
        "sequence_length": int(model.sequence_length),
        "num_layers": int(model.num_layers),
        "mask_config": {"mask_type": schema_mask, "window_size": model.window},
        "attention_config": {
            "num_heads": int(model.num_heads),
            "alibi_slopes": _compact(model.alibi_slopes),
            "head_weights": None if uniform else _compact(weights),
            "softmax_temperature": float(model.temperature),
        },
        "content_config": {
            "diagonal_scores": _compact(model.diagonal_scores),
            "base_scores": _compact(model.base_scores),
        },
        "lambda_schedule_config": schedule,
    }


def _nested(name: str, value):
    """A schema list of lists as an array, rejecting ragged lists in one line."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(row, list) and row for row in value):
        raise ConfigError(f"{name}: got {value!r:.60}; allowed: a non-empty list of non-empty lists")
    lengths = {len(row) for row in value}
    if len(lengths) > 1:
        raise ConfigError(f"{name}: inner lists have lengths {sorted(lengths)}; allowed: all the same length")
    return as_float_array(name, value)


def schedule_from_config(schedule: dict, num_layers: int):
    """The ``lambda_t`` of a config's ``lambda_schedule_config`` over `num_layers` layers, checked."""
    field = "lambda_schedule_config"
    if not isinstance(schedule, dict):
        raise ConfigError(f"{field}: got {schedule!r:.60}; allowed: a mapping with schedule_type")
    kind = schedule.get("schedule_type")
    if not isinstance(kind, str) or kind not in _SCHEDULE_KEYS:
        raise ConfigError(
            f"{field}.schedule_type: got {kind!r}; allowed: one of {', '.join(_SCHEDULE_KEYS)}"
        )
    _check_keys(field, schedule, allowed=_SCHEDULE_KEYS[kind], required=_SCHEDULE_KEYS[kind])
    try:
        if kind == "constant":
            # schedules.constant clips to [0, 1]; a config's value is refused instead
            # (none of the authors' published files has one outside [0, 1]).
            check_range("lambda_const", as_float_scalar("lambda_const", schedule["lambda_const"]), 0.0, 1.0)
            return schedules.constant(schedule["lambda_const"], num_layers)
        if kind == "power_decay":  # lambda_0 <= 1 (and beta >= 0): no lambda_t is clipped
            check_range("lambda_0", as_float_scalar("lambda_0", schedule["lambda_0"]), 0.0, 1.0, low_open=True)
            return schedules.power_decay(schedule["lambda_0"], schedule["beta"], num_layers)
        values = schedules.custom(schedule["lambdas_custom"])
    except ConfigError as error:
        raise ConfigError(f"{field}.{error}") from None
    if values.shape != (num_layers,):
        raise ConfigError(
            f"{field}.lambdas_custom: got length {values.shape[0]}; "
            f"allowed: num_layers ({num_layers})"
        )
    return values


def _schedule_to_config(lambdas) -> dict[str, Any]:
    """An equal lambda in every layer as ``constant``, anything else as ``custom``."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    if np.all(lambdas == lambdas[0]):
        return {"schedule_type": "constant", "lambda_const": float(lambdas[0])}
    return {"schedule_type": "custom", "lambdas_custom": [float(x) for x in lambdas]}


def _check_keys(section: str, mapping, *, allowed=None, required=()) -> None:
    where = section or "config"
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: got {mapping!r:.60}; allowed: a mapping")
    allowed = _SCHEMA_KEYS[section] if allowed is None else allowed
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}"
        )
    missing = sorted(set(required) - set(mapping))
    if missing:
        prefix = f"{section}." if section else ""
        raise ConfigError(f"{prefix}{missing[0]}: missing; this key is required")


def _compact(array) -> list[list[float]]:
    """A (T, H) array as the schema's nested list, collapsing equal rows and columns."""
    array = np.asarray(array, dtype=np.float64)
    if np.all(array == array[:1]):
        array = array[:1]
    if np.all(array == array[:, :1]):
        array = array[:, :1]
    return [[float(x) for x in row] for row in array]


# kernel_config: any kernel type (jaxroll.kernel_types).

_KERNEL_KEYS = {
    "dense": {"kernel_type", "file"},
    "relative": {"kernel_type", "family", "num_heads", "slopes", "exponents", "offset_scores", "file",
                 "diagonal_scores", "head_weights"},
}
_FAMILIES = {"alibi": {"slopes"}, "power": {"slopes", "exponents"}, "table": set()}
_KERNEL_PATHS = {"n": "sequence_length", "lambdas": "lambda_schedule_config.lambdas_custom"}


def _kernel_model_from_config(config, directory):
    section = "kernel_config"
    _check_keys("", config, required={"sequence_length", "num_layers", "lambda_schedule_config", section})
    for other in ("attention_config", "content_config", "mask_config"):
        if other in config:
            raise ConfigError(f"{other}: not allowed with kernel_config; allowed: the kernel in kernel_config")
    kernel_config = config[section]
    if not isinstance(kernel_config, dict):
        raise ConfigError(f"{section}: got {kernel_config!r:.60}; allowed: a mapping with kernel_type")
    kind = kernel_config.get("kernel_type")
    if not isinstance(kind, str) or kind not in _KERNEL_KEYS:
        raise ConfigError(f"{section}.kernel_type: got {kind!r}; allowed: one of {', '.join(_KERNEL_KEYS)}")
    _check_keys(section, kernel_config, allowed=_KERNEL_KEYS[kind],
                required={"file"} if kind == "dense" else {"family", "num_heads"})
    num_layers = check_positive_int("num_layers", config["num_layers"])
    lambdas = schedule_from_config(config["lambda_schedule_config"], num_layers)
    if kind == "dense":
        kernels = _read_kernel_file(kernel_config["file"], "dense", directory)
        kernel = DenseKernel.create(kernels, field=f"{section}.file ({kernel_config['file']})")
    else:
        kernel = _relative_kernel(kernel_config, num_layers, directory)
    if kernel.num_layers != num_layers:
        raise ConfigError(f"{section}.file: holds {kernel.num_layers} layers; allowed: num_layers ({num_layers})")
    try:
        return RolloutModel.create(kernel=kernel, lambdas=lambdas, sequence_length=config["sequence_length"])
    except ConfigError as error:
        field, _, rest = str(error).partition(":")
        raise ConfigError(f"{_KERNEL_PATHS.get(field, section + '.' + field)}:{rest}") from None


def _relative_kernel(kernel_config, num_layers, directory):
    section = "kernel_config"
    family = kernel_config["family"]
    if not isinstance(family, str) or family not in _FAMILIES:
        raise ConfigError(f"{section}.family: got {family!r}; allowed: one of {', '.join(_FAMILIES)}")
    needed = _FAMILIES[family] | ({"offset_scores"} if family == "table" and "file" not in kernel_config else set())
    missing = sorted(needed - set(kernel_config))
    if missing:
        raise ConfigError(f"{section}.{missing[0]}: missing; the {family} family needs it")
    allowed = {"kernel_type", "family", "num_heads", "diagonal_scores", "head_weights"} | _FAMILIES[family]
    allowed |= {"offset_scores", "file"} if family == "table" else set()
    extra = sorted(set(kernel_config) - allowed)
    if extra:
        raise ConfigError(f"{section}.{extra[0]}: not used by the {family} family; allowed: {', '.join(sorted(allowed))}")
    num_heads = check_positive_int(f"{section}.num_heads", kernel_config["num_heads"])
    common = {
        "num_layers": num_layers, "num_heads": num_heads,
        "diagonal_scores": _nested("diagonal_scores", kernel_config.get("diagonal_scores", [[0.0]])),
        "head_weights": _nested("head_weights", kernel_config.get("head_weights")),
    }
    try:
        if family == "table":
            if "file" in kernel_config and "offset_scores" in kernel_config:
                raise ConfigError("file: give offset_scores inline or in a file, not both")
            table = (_read_kernel_file(kernel_config["file"], "table", directory) if "file" in kernel_config
                     else as_float_array("offset_scores", kernel_config["offset_scores"]))
            return TableKernel.create(offset_scores=table, **common)
        exponents = _nested("exponents", kernel_config["exponents"]) if family == "power" else 1.0
        return PowerKernel.create(slopes=_nested("slopes", kernel_config["slopes"]), exponents=exponents, **common)
    except ConfigError as error:
        raise ConfigError(f"{section}.{error}") from None


def _read_kernel_file(name, kind, directory):
    from pathlib import Path

    field = "kernel_config.file"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{field}: got {name!r:.60}; allowed: an .npz path relative to the config")
    path = Path(directory or ".") / name
    if not path.is_file():
        raise ConfigError(f"{field}: {path}: no such file")
    from ._readers import read_npz

    key = KERNEL_FILE_ARRAYS[kind]
    data = read_npz(path, f"an .npz with a float array {key!r} (what save_config writes)", label=f"{field}: {path}")
    if key not in data:
        raise ConfigError(f"{field}: {path} has no array {key!r}; it holds {', '.join(data) or 'nothing'}")
    try:
        return np.asarray(data[key], dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{field}: {path}: array {key!r} of dtype {data[key].dtype}; allowed: numbers") from None


def kernel_arrays(model) -> dict[str, np.ndarray]:
    """The arrays of `model` that `save_config` writes to the kernel npz (empty when none)."""
    kernel = getattr(model, "kernel", None)
    if isinstance(kernel, DenseKernel):
        return {KERNEL_FILE_ARRAYS["dense"]: np.asarray(kernel.kernels, dtype=np.float64)}
    if isinstance(kernel, TableKernel):
        return {KERNEL_FILE_ARRAYS["table"]: np.asarray(kernel.offset_scores, dtype=np.float64)}
    return {}


def _kernel_config_from_model(model: RolloutModel, kernel_file):
    schedule = _schedule_to_config(model.lambdas)
    kernel = model.kernel
    if isinstance(kernel, DenseKernel):
        section = {"kernel_type": "dense", "file": kernel_file}
    elif isinstance(kernel, (PowerKernel, TableKernel)):
        weights = np.asarray(kernel.head_weights, dtype=np.float64)
        section = {"kernel_type": "relative", "num_heads": int(kernel.num_heads)}
        if isinstance(kernel, TableKernel):
            section |= {"family": "table", "file": kernel_file}
        else:
            exponents = np.asarray(kernel.exponents, dtype=np.float64)
            section |= {"family": "alibi" if np.all(exponents == 1.0) else "power",
                        "slopes": _compact(kernel.slopes)}
            if section["family"] == "power":
                section["exponents"] = _compact(exponents)
        section |= {"diagonal_scores": _compact(kernel.diagonal_scores),
                    "head_weights": None if np.all(weights == weights.flat[0]) else _compact(weights)}
    else:
        raise ConfigError(f"kernel: {type(kernel).__name__} has no YAML form; allowed: DenseKernel, "
                          "PowerKernel, TableKernel, AlibiKernel")
    return {"sequence_length": int(model.sequence_length), "num_layers": int(model.num_layers),
            "kernel_config": section, "lambda_schedule_config": schedule}
