"""The free parameters of a design: which intervention, its shape, its box, and the map from
unconstrained coordinates to a valid intervention.

Every free array is the image of an unconstrained vector ``u`` under a sigmoid into its box
``[low, high]`` (model units), so every iterate of every optimiser is a valid intervention and
the bounds are built in:

==============  =====================================================  ====================
parameter       map                                                    default box
==============  =====================================================  ====================
tau             ``tau = low (high / low)^sigmoid(u)`` (log box)        ``[0.25, 4]``
slope_scale     ``s = low + (high - low) sigmoid(u)``                  ``[0, 4]``
kappa           ``kappa = low + (high - low) sigmoid(u)``              ``[-2, 2]``
gamma           ``gamma = low + (high - low) sigmoid(u)``              ``[0, 4]``
==============  =====================================================  ====================

Each default box holds the identity (tau = 1, s = 1, kappa = 0, gamma = 1), where a design
starts. Shapes: ``global`` (one number), ``per_layer`` (``(T, 1)``; gamma ``(T,)``),
``per_head`` (``(1, H)``) and ``per_layer_head`` (``(T, H)``); gamma is global or per layer
(`jaxroll.interventions.BranchScale`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ..interventions import SHAPES, designable, intervention_type

__all__ = ["PARAMETERS", "SHAPES", "BOXES", "IDENTITY", "BOUND_FRACTION"]


# Served by `__getattr__` from the intervention registry when read, so a type registered later is in them.
PARAMETERS: tuple[str, ...]
"""The intervention parameters a design can free (the types that declare a box), in the order the
interventions apply (`jaxroll.interventions.NAMES`): `Temperature`, `SlopeScale`, `DistanceBias`,
`BranchScale` and any registered later."""

BOXES: dict[str, tuple[float, float]]
"""The default box ``(low, high)`` of each parameter, in its own units (each type's `box`); each holds
the identity."""

IDENTITY: dict[str, float]
"""The value at which each intervention changes nothing (each type's `neutral`): where a design starts."""


def __getattr__(name: str):
    if name == "PARAMETERS":
        return tuple(kind.name for kind in designable())
    if name == "BOXES":
        return {kind.name: tuple(kind.box) for kind in designable()}
    if name == "IDENTITY":
        return {kind.name: kind.neutral for kind in designable()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _designable(name: str):
    """The registered type a design frees as `name`, or None."""
    kind = intervention_type(name)
    return kind if kind is not None and kind.name == name and kind.box is not None else None


BOUND_FRACTION = 1e-3
"""A parameter is *at a bound* when it lies within this fraction of its box's width of an end.
The sigmoid is flat there (``d value / du = width s (1 - s)``), so an optimum beyond the box
stops short of the end by an amount the stopping rule decides, not the data: 1e-3 of the width
is u ~ 7, which every optimum pressed against the box reaches."""

# Clip of a unit-cube point before the logit, so a corner of the box is a finite u.
_EDGE = 1e-6


@dataclasses.dataclass(frozen=True)
class _Free:
    """One free parameter: its name, shape and box (hashable: part of a jit static)."""

    name: str
    shape: str
    low: float
    high: float

    @property
    def kind(self):
        """The intervention type this parameter belongs to."""
        return intervention_type(self.name)

    def array_shape(self, num_layers: int, num_heads: int) -> tuple[int, ...]:
        if self.shape == "global":
            return ()
        if self.shape == "per_layer":  # a type without per-head shapes holds one value per layer
            return (num_layers,) if "per_head" not in self.kind.shapes else (num_layers, 1)
        return (1, num_heads) if self.shape == "per_head" else (num_layers, num_heads)

    def value(self, u):
        """The parameter in model units: the sigmoid of `u` placed in the box."""
        fraction = jax.nn.sigmoid(u)
        if self.kind.log_box:
            return self.low * (self.high / self.low) ** fraction
        return self.low + (self.high - self.low) * fraction

    def raw(self, value) -> np.ndarray:
        """The unconstrained coordinate of `value` (clipped into the open box)."""
        value = np.asarray(value, np.float64)
        if self.kind.log_box:
            fraction = np.log(value / self.low) / np.log(self.high / self.low)
        else:
            fraction = (value - self.low) / (self.high - self.low)
        fraction = np.clip(fraction, _EDGE, 1.0 - _EDGE)
        return np.log(fraction) - np.log1p(-fraction)

    def labels(self, num_layers: int, num_heads: int) -> list[str]:
        """One name per scalar: ``tau``, ``tau[3]`` (layer), ``tau[:,1]`` (head), ``tau[3,1]``."""
        if self.shape == "global":
            return [self.name]
        if self.shape == "per_layer":
            return [f"{self.name}[{t}]" for t in range(num_layers)]
        if self.shape == "per_head":
            return [f"{self.name}[:,{h}]" for h in range(num_heads)]
        return [f"{self.name}[{t},{h}]" for t in range(num_layers) for h in range(num_heads)]


@dataclasses.dataclass(frozen=True)
class _Parameters:
    """All free parameters of a design and the map ``u -> interventions`` (hashable: a jit static)."""

    free: tuple[_Free, ...]
    num_layers: int
    num_heads: int
    kappa_form: str = "log1p"
    kappa_k: float = 2.0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(item.name for item in self.free)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {item.name: item.array_shape(self.num_layers, self.num_heads) for item in self.free}

    @property
    def size(self) -> int:
        """The number of free scalars."""
        return sum(math.prod(shape) for shape in self.shapes().values())

    def labels(self) -> tuple[str, ...]:
        return tuple(label for item in self.free for label in item.labels(self.num_layers, self.num_heads))

    def values(self, raw: dict) -> dict:
        """``{name: array in model units}`` of the unconstrained point `raw`."""
        return {item.name: item.value(raw[item.name]) for item in self.free}

    def interventions(self, values: dict) -> list:
        """The interventions of `values`, in `PARAMETERS` order (as `interventions.from_mapping` builds them)."""
        mapping = {**values, "kappa_form": self.kappa_form, "kappa_k": self.kappa_k}
        return [kind.from_record(mapping, "design") for kind in designable() if kind.name in values]

    def initial(self) -> dict[str, np.ndarray]:
        """The unconstrained point of the identity (clipped into each box)."""
        shapes = self.shapes()
        return {item.name: np.full(shapes[item.name], item.raw(item.kind.neutral)) for item in self.free}

    def flatten(self, raw: dict):
        return jnp.concatenate([jnp.ravel(jnp.asarray(raw[name])) for name in self.names])

    def unflatten(self, flat) -> dict:
        raw, offset = {}, 0
        for name, shape in self.shapes().items():
            size = math.prod(shape)
            raw[name] = jnp.reshape(flat[offset:offset + size], shape)
            offset += size
        return raw

    def from_unit(self, unit) -> dict:
        """The unconstrained point of a point of the unit cube: uniform in each box (log-uniform for tau)."""
        unit = jnp.clip(unit, _EDGE, 1.0 - _EDGE)
        return self.unflatten(jnp.log(unit) - jnp.log1p(-unit))

    def at_bounds(self, values: dict) -> dict[str, str]:
        """``{label: text}`` of every scalar within `BOUND_FRACTION` of its box's width of an end."""
        found = {}
        for item in self.free:
            array = np.ravel(np.asarray(values[item.name], np.float64))
            tolerance = BOUND_FRACTION * (item.high - item.low)
            for label, value in zip(item.labels(self.num_layers, self.num_heads), array):
                if value - item.low <= tolerance:
                    found[label] = f"{label} = {value:.6g} (lower bound {item.low:g})"
                elif item.high - value <= tolerance:
                    found[label] = f"{label} = {value:.6g} (upper bound {item.high:g})"
        return found


def _split_entries(text: str, field: str) -> dict[str, str]:
    """``"a=x,b=y"`` -> ``{"a": "x", "b": "y"}``, each name once."""
    entries = {}
    for entry in filter(None, (part.strip() for part in str(text).split(","))):
        name, equals, value = entry.partition("=")
        name = name.strip()
        if not equals or not name:
            raise ConfigError(f"{field}: got {entry!r}; allowed: NAME=VALUE[,NAME=VALUE...]")
        if name in entries:
            raise ConfigError(f"{field} {name}: given twice; allowed: each name once")
        entries[name] = value.strip()
    if not entries:
        raise ConfigError(f"{field}: got {text!r}; allowed: NAME=VALUE[,NAME=VALUE...]")
    return entries


def check_free(free) -> dict[str, str]:
    """The free parameters as ``{name: shape}``: a mapping or the text ``"tau=per_layer,gamma=global"``."""
    if isinstance(free, str):
        free = _split_entries(free, "free")
    if not isinstance(free, dict) or not free:
        raise ConfigError(f"free: got {free!r:.60}; allowed: a mapping such as {{'tau': 'per_layer'}}")
    parameters = tuple(kind.name for kind in designable())
    for name, shape in free.items():
        kind = _designable(name)
        if kind is None:
            raise ConfigError(f"free {name}: unknown parameter; allowed: one of {', '.join(parameters)}")
        if shape not in SHAPES:
            raise ConfigError(f"free {name}: shape {shape!r}; allowed: one of {', '.join(SHAPES)}")
        if shape not in kind.shapes:
            raise ConfigError(f"free {name}: shape {shape!r}; allowed: {' or '.join(kind.shapes)} (the shapes "
                              f"{kind.__name__} takes)")
    return {name: free[name] for name in parameters if name in free}


def _bound_pair(name: str, value) -> tuple[float, float]:
    if isinstance(value, str):
        low, colon, high = value.partition(":")
        if not colon:
            raise ConfigError(f"bounds {name}: got {value!r}; allowed: LOW:HIGH")
        value = (low, high)
    try:
        low, high = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ConfigError(f"bounds {name}: got {value!r:.60}; allowed: two numbers LOW:HIGH") from None
    lowest, open_ = intervention_type(name).lowest
    if not (np.isfinite(low) and np.isfinite(high)) or low >= high:
        raise ConfigError(f"bounds {name}: got {low:g}:{high:g}; allowed: finite numbers with LOW < HIGH")
    if low < lowest or (open_ and low == lowest):
        raise ConfigError(f"bounds {name}: low {low:g}; allowed: {'>' if open_ else '>='} {lowest:g}")
    return low, high


def check_bounds(bounds, free: dict[str, str]) -> dict[str, tuple[float, float]]:
    """The box of every free parameter: `BOXES`, replaced where `bounds` (a mapping or the text
    ``"tau=0.5:2,gamma=0:1"``) names it."""
    given = {} if bounds is None else (_split_entries(bounds, "bounds") if isinstance(bounds, str) else bounds)
    if not isinstance(given, dict):
        raise ConfigError(f"bounds: got {given!r:.60}; allowed: a mapping such as {{'tau': (0.5, 2.0)}}")
    for name in given:
        if name not in free:
            raise ConfigError(f"bounds {name}: not a free parameter; allowed: one of {', '.join(free)}")
    return {name: _bound_pair(name, given[name]) if name in given else tuple(intervention_type(name).box)
            for name in free}
