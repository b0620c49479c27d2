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
from .engine.config import check_keys, compact, nested_array
from .errors import ConfigError
from .kernel_types import KERNEL_TYPES
from .model import RolloutModel

__all__ = ["model_from_config", "config_from_model", "kernel_arrays"]

PAPER_KIND = "alibi"
"""The kernel of a configuration without ``kernel_config``: the paper's schema (ALiBi + content)."""

_MODEL_KEYS = {"sequence_length", "num_layers", "lambda_schedule_config", "save_dir"}
_OPTIONAL_KEYS = {"save_dir", "probability_shares", "logit_gains", "stream_norms", "composition"}
_SCHEDULE_KEYS = {
    "constant": {"schedule_type", "lambda_const"},
    "power_decay": {"schedule_type", "lambda_0", "beta"},
    "custom": {"schedule_type", "lambdas_custom"},
}
# Where the fields `RolloutModel.create` names live in the schema; a kernel's own fields are in its section.
_MODEL_PATHS = {"n": "sequence_length", "sequence_length": "sequence_length",
                "lambdas": "lambda_schedule_config.lambdas_custom"}


def model_from_config(config: dict[str, Any], directory=None) -> RolloutModel:
    """Build a model from a configuration in the rollout YAML schema.

    Lists of length 1 broadcast over layers (outer) or heads (inner);
    every schedule must lie in [0, 1], nothing is clipped: ``lambda_const``
    in [0, 1], ``lambda_0`` in (0, 1] with ``beta >= 0``, ``lambdas_custom``
    in [0, 1]. ``sequence_length`` is an integer >= 1 (``null`` is refused,
    not read as a default length). ``save_dir`` is accepted and ignored.
    See the README for the schema.

    The kernel's sections are read by its type's ``from_config``: the type
    registered (`jaxroll.kernel_types.KERNEL_TYPES`) under
    ``kernel_config.kernel_type``, or without ``kernel_config`` the paper's
    ``attention_config``, ``content_config`` and ``mask_config``
    (`AlibiKernel`); a ``file`` is resolved relative to `directory` (the
    config's folder). Optional ``probability_shares`` (a number or a list
    of 1 or ``num_layers`` numbers in [0, 1)) and ``logit_gains`` (nested
    lists as the per-head fields, > 0, default 1) extend every layer by the
    probability path (`jaxroll.engine.probability`); absent, the layers are
    today's. Optional ``stream_norms`` (a list of ``num_layers`` numbers >
    0): the residual stream's norm at each layer's input, which a branch
    scale reads (`jaxroll.interventions.BranchScale`). Optional
    ``composition`` (a number in [1, 2]): the exponent q with which paths
    compose (`RolloutModel.composition`; absent or null: q = 1).

    Raises:
        ConfigError: unknown keys, missing keys, wrong lengths, values out
            of range; one line naming the field.
    """
    kernel_type = _kernel_type(config)
    check_keys("", config, _MODEL_KEYS | _OPTIONAL_KEYS | {key for kind in KERNEL_TYPES.values()
                                                           for key in kind.config_keys},
               required=_MODEL_KEYS - _OPTIONAL_KEYS | ({"kernel_config"} if "kernel_config" in config else set()))
    num_layers = check_positive_int("num_layers", config["num_layers"])
    kernel = kernel_type.from_config({key: config[key] for key in kernel_type.config_keys if key in config},
                                     num_layers=num_layers, directory=directory)
    if kernel.num_layers != num_layers:
        raise ConfigError.of("num_layers", num_layers, f"the kernel's number of layers ({kernel.num_layers})")
    lambdas = schedule_from_config(config["lambda_schedule_config"], num_layers)
    if config["sequence_length"] is None:  # create() would take None for the kernel's default length, unsaid
        raise ConfigError.of("sequence_length", None, "an integer >= 1, the N the file's rollouts run at (null is "
                             "not a default: write the length, e.g. 256 as the published files do)")
    shares = _shares_from_config(config.get("probability_shares"), num_layers)
    gains = nested_array("logit_gains", config.get("logit_gains"))
    try:
        return RolloutModel.create(kernel=kernel, lambdas=lambdas, sequence_length=config["sequence_length"],
                                   probability_shares=shares, logit_gains=gains,
                                   stream_norms=config.get("stream_norms"), composition=config.get("composition"))
    except ConfigError as error:
        if error.field in _MODEL_PATHS:
            raise error.renamed(_MODEL_PATHS[error.field]) from None
        raise error.within("kernel_config") if "kernel_config" in config and error.field else error from None


def _shares_from_config(value, num_layers: int):
    """``probability_shares``: absent or null (none), a number, or a list of 1 or T numbers in [0, 1)."""
    if value is None:
        return None
    field = "probability_shares"
    if isinstance(value, bool) or not isinstance(value, (int, float, list)):
        raise ConfigError.of(field, value, "a number or a list of 1 or num_layers numbers, each in [0, 1)")
    shares = as_float_array(field, value).reshape(-1)
    if shares.shape[0] not in (1, num_layers):
        raise ConfigError.of(field, value, f"a list of 1 or num_layers ({num_layers}) numbers, each in [0, 1)")
    return np.broadcast_to(shares, (num_layers,)).copy()


def _kernel_type(config) -> type:
    """The registered kernel type whose sections `config` holds (`PAPER_KIND` without ``kernel_config``)."""
    if not isinstance(config, dict) or "kernel_config" not in config:
        return KERNEL_TYPES[PAPER_KIND]
    section = "kernel_config"
    kernel_config = config[section]
    if not isinstance(kernel_config, dict):
        raise ConfigError(f"{section}: got {kernel_config!r:.60}; allowed: a mapping with kernel_type")
    kinds = sorted(name for name, kind in KERNEL_TYPES.items() if section in kind.config_keys)
    kind = kernel_config.get("kernel_type")
    if not isinstance(kind, str) or kind not in kinds:
        raise ConfigError(f"{section}.kernel_type: got {kind!r}; allowed: one of {', '.join(kinds)}")
    others = {key for name in KERNEL_TYPES.values() for key in name.config_keys} - KERNEL_TYPES[kind].config_keys
    for other in sorted(others):
        if other in config:
            raise ConfigError(f"{other}: not allowed with kernel_config; allowed: the kernel in kernel_config")
    return KERNEL_TYPES[kind]


def config_from_model(model: RolloutModel, kernel_file: str | None = None) -> dict[str, Any]:
    """`model` in the rollout YAML schema, as plain Python numbers.

    Values that are equal across layers or heads are written as 1-element
    lists; uniform head weights as ``null``; an equal lambda in every
    layer as a ``constant`` schedule, anything else as ``custom``. Reading
    the result back with `model_from_config` gives the same arrays exactly.

    The kernel writes its own sections (``to_config``: the paper's sections
    for ALiBi + content, a ``kernel_config`` for the others); its large
    arrays (`kernel_arrays`) go to the npz named `kernel_file`.
    """
    config = {"sequence_length": int(model.sequence_length), "num_layers": int(model.num_layers),
              **model.kernel.to_config(kernel_file), "lambda_schedule_config": _schedule_to_config(model.lambdas)}
    if model.kernel.mixes_rows:  # the probability path (absent: none); logit gains of 1 are not written
        shares = np.asarray(model.probability_shares, dtype=np.float64)
        same = np.all(shares == shares[0])
        config["probability_shares"] = [float(shares[0])] if same else [float(x) for x in shares]
        gains = np.asarray(model.logit_gains, dtype=np.float64)
        if np.any(gains != 1.0):
            config["logit_gains"] = compact(gains)
    if model.stream_norms is not None:
        config["stream_norms"] = [float(x) for x in np.asarray(model.stream_norms, dtype=np.float64)]
    if model.composition is not None:
        config["composition"] = float(model.composition)
    return config


def kernel_arrays(model) -> dict[str, np.ndarray]:
    """The arrays of `model` that `save_config` writes to the kernel npz (empty when none)."""
    kernel = getattr(model, "kernel", None)
    return dict(kernel.file_arrays()) if kernel is not None else {}


def schedule_from_config(schedule: dict, num_layers: int):
    """The lambdas of a ``lambda_schedule_config`` mapping (constant, power_decay or explicit) for `num_layers` layers."""
    field = "lambda_schedule_config"
    if not isinstance(schedule, dict):
        raise ConfigError(f"{field}: got {schedule!r:.60}; allowed: a mapping with schedule_type")
    kind = schedule.get("schedule_type")
    if not isinstance(kind, str) or kind not in _SCHEDULE_KEYS:
        raise ConfigError(
            f"{field}.schedule_type: got {kind!r}; allowed: one of {', '.join(_SCHEDULE_KEYS)}"
        )
    check_keys(field, schedule, _SCHEDULE_KEYS[kind], required=_SCHEDULE_KEYS[kind])
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
