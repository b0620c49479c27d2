"""The parameter PyTree of a rollout: `RolloutModel`, and its constructors.

A model of T layers and H heads holds, per layer t and head h, the ALiBi slope
``m_{t,h}``, the diagonal content score ``d_{t,h}``, the content background
``b_{t,h}`` and the head weight ``w_{t,h}``; per layer the mixing coefficient
``lambda_t``; one softmax temperature ``tau``; and, as static metadata, the
mask, its window and the default sequence length. Layer t's transition is
``R_t = (1 - lambda_t) I + lambda_t A_t`` (arXiv 2602.16837).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import memory, schedules
from ._checks import as_float_array, check_positive_int, check_range, is_concrete
from .errors import ConfigError
from .kernels import MASKS, alibi_slopes as standard_alibi_slopes

__all__ = ["RolloutModel"]

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


class RolloutModel(eqx.Module):
    """Parameters of a residual-aware attention rollout (a PyTree).

    Each layer's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t`` with
    ``A_t = sum_h w_{t,h} rowsoftmax(s_{t,h})`` and
    ``s_{t,h}(i, j) = (-m_{t,h} (i - j) + d_{t,h} [i == j] + b_{t,h}) / tau``.
    ``A[i, j]`` is the weight with which token i reads token j.

    Attributes:
        lambdas: ``(T,)``, the mixing coefficients ``lambda_t`` in [0, 1].
        alibi_slopes: ``(T, H)``, ALiBi slopes ``m >= 0`` (Press et al. 2022).
        diagonal_scores: ``(T, H)``, diagonal content scores ``d`` in logit units.
        base_scores: ``(T, H)``, content background ``b``; it adds the same
            value to every score of a row and so cancels in the softmax: kept
            because measured configurations carry it, it changes no profile.
        head_weights: ``(T, H)``, ``w >= 0``; each layer's row is normalised
            to sum 1 where the kernel is formed.
        temperature: ``()``, the softmax temperature ``tau > 0``.
        mask: ``"causal"`` (j <= i), ``"sliding"`` (i - W < j <= i) or
            ``"full"`` (every j). Static.
        window: the sliding window W, or None. Static.
        sequence_length: the default N of `influence` and friends. Static.

    Build one with `RolloutModel.create` (keywords, broadcasting, checks) or
    `RolloutModel.from_config` (the YAML schema); direct construction skips
    the checks and is meant for transformations such as `jax.grad`.
    """

    lambdas: Float[Array, " layers"]
    alibi_slopes: Float[Array, "layers heads"]
    diagonal_scores: Float[Array, "layers heads"]
    base_scores: Float[Array, "layers heads"]
    head_weights: Float[Array, "layers heads"]
    temperature: Float[Array, ""]
    mask: str = eqx.field(static=True, default="causal")
    window: int | None = eqx.field(static=True, default=None)
    sequence_length: int = eqx.field(static=True, default=256)

    @property
    def num_layers(self) -> int:
        return self.lambdas.shape[-1]

    @property
    def num_heads(self) -> int:
        return self.alibi_slopes.shape[-1]

    @classmethod
    def create(
        cls,
        *,
        num_layers: int,
        num_heads: int,
        lambdas,
        alibi_slopes=None,
        diagonal_scores=0.0,
        base_scores=0.0,
        head_weights=None,
        temperature=1.0,
        mask: str = "causal",
        window: int | None = None,
        sequence_length: int = 256,
    ) -> "RolloutModel":
        """Build a checked model, broadcasting per-layer and per-head values.

        `lambdas` is a number or a ``(T,)`` array (each in [0, 1]). The
        per-head fields take a number, an ``(H,)`` array (the same heads in
        every layer), or a ``(T or 1, H or 1)`` array, as the YAML schema's
        nested lists do. `alibi_slopes` defaults to the standard slopes of
        `jaxroll.alibi_slopes(num_heads)`; `head_weights` to uniform.

        Raises:
            ConfigError: a one-line message naming the field, the value and
            what is allowed.
        """
        num_layers = check_positive_int("num_layers", num_layers)
        num_heads = check_positive_int("num_heads", num_heads)
        sequence_length = check_positive_int("sequence_length", sequence_length)
        # Five (T, H) float64 arrays: refuse sizes that cannot be allocated.
        memory.check_fits(5 * 8 * num_layers * num_heads, f"num_layers x num_heads = {num_layers} x {num_heads}",
                          allowed="fewer layers or heads")
        if mask not in MASKS:
            raise ConfigError(f"mask: got {mask!r}; allowed: one of {', '.join(MASKS)}")
        if mask == "sliding":
            if window is None:
                raise ConfigError("window: a sliding mask needs a window size; allowed: an integer >= 1")
            window = check_positive_int("window", window)
        if alibi_slopes is None:
            alibi_slopes = standard_alibi_slopes(num_heads)
        if head_weights is None:
            head_weights = np.full(num_heads, 1.0 / num_heads)

        per_head = {
            "alibi_slopes": alibi_slopes,
            "diagonal_scores": diagonal_scores,
            "base_scores": base_scores,
            "head_weights": head_weights,
        }
        arrays = {
            name: _per_layer_and_head(name, value, num_layers, num_heads)
            for name, value in per_head.items()
        }
        lambdas = _per_layer("lambdas", lambdas, num_layers)
        temperature = as_float_array("temperature", temperature)
        if temperature.shape != ():
            raise ConfigError(f"temperature: got shape {temperature.shape}; allowed: one number")
        check_range("temperature", temperature, 0.0, None, low_open=True)
        check_range("lambdas", lambdas, 0.0, 1.0)
        check_range("alibi_slopes", arrays["alibi_slopes"], 0.0, None)
        check_range("diagonal_scores", arrays["diagonal_scores"])
        check_range("base_scores", arrays["base_scores"])
        check_range("head_weights", arrays["head_weights"], 0.0, None)
        empty = ~(arrays["head_weights"].sum(axis=1) > 0)
        if empty.any():
            layer = int(np.argmax(empty))
            raise ConfigError(
                f"head_weights: layer {layer} has all-zero weights; allowed: >= 0 with a positive sum"
            )
        return cls(
            lambdas=lambdas,
            temperature=temperature,
            mask=mask,
            window=window if mask == "sliding" else None,
            sequence_length=sequence_length,
            **arrays,
        )

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "RolloutModel":
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
            lambdas = _schedule_from_config(config["lambda_schedule_config"], num_layers)
            return cls.create(
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

    def to_config(self) -> dict[str, Any]:
        """This model in the rollout YAML schema, as plain Python numbers.

        Values that are equal across layers or heads are written as 1-element
        lists; uniform head weights as ``null``; an equal lambda in every
        layer as a ``constant`` schedule, anything else as ``custom``. Reading
        the result back with `from_config` gives the same arrays exactly.
        """
        lambdas = np.asarray(self.lambdas, dtype=np.float64)
        if np.all(lambdas == lambdas[0]):
            schedule = {"schedule_type": "constant", "lambda_const": float(lambdas[0])}
        else:
            schedule = {"schedule_type": "custom", "lambdas_custom": [float(x) for x in lambdas]}
        weights = np.asarray(self.head_weights, dtype=np.float64)
        uniform = np.all(weights == weights.flat[0])
        schema_mask = {value: key for key, value in _SCHEMA_MASKS.items()}[self.mask]
        return {
            "sequence_length": int(self.sequence_length),
            "num_layers": int(self.num_layers),
            "mask_config": {"mask_type": schema_mask, "window_size": self.window},
            "attention_config": {
                "num_heads": int(self.num_heads),
                "alibi_slopes": _compact(self.alibi_slopes),
                "head_weights": None if uniform else _compact(weights),
                "softmax_temperature": float(self.temperature),
            },
            "content_config": {
                "diagonal_scores": _compact(self.diagonal_scores),
                "base_scores": _compact(self.base_scores),
            },
            "lambda_schedule_config": schedule,
        }


def _per_layer(name: str, value, num_layers: int):
    if not is_concrete(value):
        return jnp.broadcast_to(value, (num_layers,))
    array = as_float_array(name, value)
    if array.ndim == 0:
        return np.full(num_layers, float(array))
    if array.shape != (num_layers,):
        raise ConfigError(
            f"{name}: got length {array.shape[0] if array.ndim == 1 else array.shape}; "
            f"allowed: one value per layer (num_layers = {num_layers})"
        )
    return array.copy()


def _per_layer_and_head(name: str, value, num_layers: int, num_heads: int):
    if not is_concrete(value):
        return jnp.broadcast_to(value, (num_layers, num_heads))
    array = as_float_array(name, value)
    if array.ndim > 2:
        raise ConfigError(f"{name}: got {array.ndim} dimensions; allowed: at most 2 (layers, heads)")
    array = array.reshape((1,) * (2 - array.ndim) + array.shape)
    outer, inner = array.shape
    if outer not in (1, num_layers):
        raise ConfigError(
            f"{name}: outer list length {outer}; allowed: 1 or num_layers ({num_layers})"
        )
    if inner not in (1, num_heads):
        raise ConfigError(
            f"{name}: inner list length {inner}; allowed: 1 or num_heads ({num_heads})"
        )
    return np.array(np.broadcast_to(array, (num_layers, num_heads)))


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
    if not isinstance(kind, str) or kind not in _SCHEDULE_KEYS:
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
