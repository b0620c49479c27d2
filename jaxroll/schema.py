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
from ._checks import as_float_array, check_positive_int
from .errors import ConfigError
from .model import RolloutModel

__all__ = ["model_from_config", "config_from_model"]

_SCHEMA_MASKS = {"causal": "causal", "full": "full", "sliding_window": "sliding"}
_SCHEMA_KEYS = {
    "": {"sequence_length", "num_layers", "mask_config", "attention_config",
         "content_config", "lambda_schedule_config", "save_dir"},
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


def model_from_config(config: dict[str, Any]) -> RolloutModel:
    """Build a model from a configuration in the rollout YAML schema.

    Lists of length 1 broadcast over layers (outer) or heads (inner);
    computed schedules (``constant``, ``power_decay``) are clipped to
    [0, 1], a ``custom`` schedule must lie in [0, 1]. ``save_dir`` is
    accepted and ignored. See the README for the schema.

    Raises:
        ConfigError: unknown keys, missing keys, wrong lengths, values out
        of range; one line naming the field.
    """
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
    if mask_type not in _SCHEMA_MASKS:
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
        lambdas = _schedule_from_config(config["lambda_schedule_config"], num_layers)
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


def config_from_model(model: RolloutModel) -> dict[str, Any]:
    """`model` in the rollout YAML schema, as plain Python numbers.

    Values that are equal across layers or heads are written as 1-element
    lists; uniform head weights as ``null``; an equal lambda in every
    layer as a ``constant`` schedule, anything else as ``custom``. Reading
    the result back with `model_from_config` gives the same arrays exactly.
    """
    lambdas = np.asarray(model.lambdas, dtype=np.float64)
    if np.all(lambdas == lambdas[0]):
        schedule = {"schedule_type": "constant", "lambda_const": float(lambdas[0])}
    else:
        schedule = {"schedule_type": "custom", "lambdas_custom": [float(x) for x in lambdas]}
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


def _schedule_from_config(schedule: dict, num_layers: int):
    field = "lambda_schedule_config"
    if not isinstance(schedule, dict):
        raise ConfigError(f"{field}: got {schedule!r:.60}; allowed: a mapping with schedule_type")
    kind = schedule.get("schedule_type")
    if kind not in _SCHEDULE_KEYS:
        raise ConfigError(
            f"{field}.schedule_type: got {kind!r}; allowed: one of {', '.join(_SCHEDULE_KEYS)}"
        )
    _check_keys(field, schedule, allowed=_SCHEDULE_KEYS[kind], required=_SCHEDULE_KEYS[kind])
    try:
        if kind == "constant":
            return schedules.constant(schedule["lambda_const"], num_layers)
        if kind == "power_decay":
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
