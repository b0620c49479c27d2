"""Input checks shared by the constructors: one-line errors, never deep in JAX.

Checks run on concrete (NumPy) values only, at construction time; traced values
inside `jit` or `grad` are never inspected, so transformations stay pure.
"""

from __future__ import annotations

import sys

import numpy as np

from .errors import ConfigError


def is_concrete(value) -> bool:
    """True when `value` holds numbers rather than JAX tracers (nested lists looked into).

    A process that has not imported JAX holds no tracer: the answer is then
    True without importing it, so that the checks serve JAX-free callers
    (`jaxroll.numpy_rollout`, the NumPy commands) at no import cost.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return True
    tracer = jax.core.Tracer
    if isinstance(value, tracer):
        return False
    if isinstance(value, (list, tuple)):
        return not any(isinstance(leaf, tracer) for leaf in _leaves(value))
    return True


def _leaves(value):
    """The non-list entries of nested lists and tuples, without recursion (any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            yield item


_NUMBER_TYPES = {float, int, np.float64, np.float32}


def _not_a_number(value) -> str | None:
    """Why `value` (a number, an array or nested lists) is not numbers, or None.

    Booleans and strings are refused: NumPy would read ``true`` as 1.0 and
    ``"0.2"`` as 0.2, but in a configuration a user typed they are mistakes
    (a quoted number is a string in YAML). Ragged lists are named as such.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "b":
            return "booleans"
        if value.dtype.kind in "US":
            return "strings"
        if value.dtype.kind != "O":
            return None
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        # One set of types per list (C speed): a published file holds ~10^5 numbers.
        stack = [value]
        while stack:
            items = stack.pop()
            kinds = set(map(type, items))
            if kinds <= _NUMBER_TYPES:
                continue
            for item in items:
                if isinstance(item, (list, tuple)):
                    stack.append(item)
                elif type(item) not in _NUMBER_TYPES:
                    reason = _not_a_number(item)
                    if reason:
                        return reason
        return _ragged(value)
    if isinstance(value, (bool, np.bool_)):
        return f"a boolean ({value!r})"
    if isinstance(value, (str, bytes)):
        try:
            float(value)
        except ValueError:
            return f"a string ({_short(value)})"
        return f"a quoted number ({_short(value)}, a string in YAML; write it without quotes)"
    return None


def _ragged(value) -> str | None:
    """``"ragged lists (...)"`` when nested lists do not form a rectangular array."""
    level = [value]
    depth = 0
    while level:
        kinds = set(map(type, level))
        if not kinds & {list, tuple}:
            return None
        if not kinds <= {list, tuple}:
            return f"ragged lists (numbers and lists mixed at depth {depth})"
        lengths = sorted(set(map(len, level)))
        if len(lengths) > 1:
            return f"ragged lists (lists of lengths {lengths} at depth {depth})"
        level = [entry for item in level for entry in item]
        depth += 1
    return None


def as_float_array(field: str, value) -> np.ndarray:
    """`value` as a float64 array; a one-line ConfigError when it is not numeric.

    Booleans, strings (quoted numbers included) and ragged lists are refused,
    naming `field`.
    """
    reason = _not_a_number(value)
    if reason is not None:
        raise ConfigError(f"{field}: got {reason}; allowed: numbers")
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{field}: expected numbers, got {_short(value)}") from None
    return array


def as_float_scalar(field: str, value) -> np.ndarray:
    """`value` as a float64 0-d array; a one-line ConfigError for lists and non-numbers."""
    array = as_float_array(field, value)
    if array.shape != ():
        raise ConfigError(f"{field}: got {_short(value)}; allowed: one number")
    return array


def check_finite(field: str, array: np.ndarray) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        raise ConfigError(
            f"{field}: value {_number(array[bad].flat[0])}{_where(bad)} is not finite; "
            "allowed: finite numbers"
        )


def check_range(field: str, array: np.ndarray, low=None, high=None, *, low_open=False) -> None:
    """Raise unless every entry lies in [low, high] (or (low, high] with `low_open`)."""
    check_finite(field, array)
    bad = np.zeros(array.shape, dtype=bool)
    if low is not None:
        bad |= (array <= low) if low_open else (array < low)
    if high is not None:
        bad |= array > high
    if bad.any():
        left = "(" if low_open else "["
        low_text = "-inf" if low is None else f"{low:g}"
        high_text = "inf)" if high is None else f"{high:g}]"
        raise ConfigError(
            f"{field}: value {_number(array[bad].flat[0])}{_where(bad)} is outside "
            f"the allowed range {left}{low_text}, {high_text}"
        )


def check_positive_int(field: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{field}: got {value!r}; allowed: an integer >= {minimum}")
    return int(value)


def _number(value) -> str:
    """A plain Python number as text: ``0.0``, not ``np.float64(0.0)``."""
    return repr(float(value))


def _where(mask: np.ndarray) -> str:
    """`` at index i`` (or ``[i, j]``) of the first bad entry; nothing for a scalar."""
    if mask.ndim == 0:
        return ""
    position = [int(k) for k in np.argwhere(mask)[0]]
    return f" at index {position[0] if len(position) == 1 else position}"


def per_layer(name: str, value, num_layers: int):
    if not is_concrete(value):
        import jax.numpy as jnp  # a traced value: JAX is loaded already

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


def per_layer_and_head(name: str, value, num_layers: int, num_heads: int):
    if not is_concrete(value):
        import jax.numpy as jnp  # a traced value: JAX is loaded already

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


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
