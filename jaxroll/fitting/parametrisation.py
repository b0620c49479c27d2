"""Parametrisations: unconstrained vectors -> valid model arrays.

Every free array of a fit is the image of an unconstrained vector under a map
that keeps the model valid (the table of `jaxroll.fit`'s docstring): lambdas
by a sigmoid (free, constant) or ``sigmoid(u_0) / (t + 1)^softplus(u_1)``
(power decay), slopes and temperature by softplus, head weights by softmax,
content as it is. Bounds are thereby built into the coordinates, so every
local optimiser (Adam, L-BFGS) runs unconstrained and its gradient is the
projected gradient of the bounded problem.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..errors import ConfigError
from ..model import RolloutModel

__all__ = ["FIELDS", "SCHEDULES", "CONTENTS", "BOX", "model_array"]

FIELDS = ("lambdas", "diagonal_scores", "alibi_slopes", "head_weights", "temperature")
"""The model fields `fit` can free (``fit=(...)``)."""
SCHEDULES = ("free", "power_decay", "constant")
"""How `fit` parametrises a free lambda schedule: one value per layer, ``lambda_0 / (t + 1)^beta``, or one value."""
CONTENTS = ("per_layer", "per_head")
"""How `fit` frees diagonal content: one score per layer (every head) or one per layer and head."""

# Open-interval clipping before inverting sigmoid/softplus, so that a model
# with lambda = 0 or 1, or a zero slope, starts from a finite point.
_EDGE = 1e-6

# The box of the global stage, in the model's own units: a design point is
# drawn in it and mapped to the unconstrained coordinates. The ranges cover
# what measured models show (lambda_t of 0.05-0.9, ALiBi slopes 2^-8 ... 1/2,
# content of a few logits) with a margin; beta up to 4 reaches schedules that
# are all in the first few layers.
BOX = {
    "lambda": (0.01, 0.99),           # lambda_t, lambda_0, lambda_const: uniform
    "beta": (0.0, 4.0),               # power-decay exponent: uniform
    "diagonal_scores": (-6.0, 6.0),   # logits: uniform
    "alibi_slopes": (1e-3, 1.0),      # log-uniform
    "head_weights": (-3.0, 3.0),      # softmax logits: uniform
    "temperature": (0.25, 4.0),       # log-uniform
}
"""The global stage's parameter box, field -> (low, high) in the model's units (log-uniform for slopes and temperature)."""

# A kernel's other fittable fields (`AbstractKernel.fittable_fields`): the map from the unconstrained
# coordinates by the declared kind, and the box of the global stage in the model's units.
_DECLARED_BOX = {"real": (-6.0, 6.0), "positive": (1e-3, 1.0), "unit": (0.01, 0.99), "simplex": (-3.0, 3.0)}


def model_array(model, name: str):
    """The array `name` of `model`: ``lambdas``, or a field of its kernel."""
    return model.lambdas if name == "lambdas" else getattr(model.kernel, name)


def _inverse_sigmoid(x):
    x = np.clip(x, _EDGE, 1.0 - _EDGE)
    return np.log(x) - np.log1p(-x)


def _inverse_softplus(x):
    x = np.maximum(x, _EDGE)
    return x + np.log(-np.expm1(-x))


@dataclasses.dataclass(frozen=True)
class _Parametrisation:
    """Maps unconstrained vectors to valid model arrays (hashable: a jit static)."""

    names: tuple[str, ...]
    schedule: str
    content: str
    num_layers: int
    num_heads: int
    declared: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    """``(name, kind, shape)`` of each free field beyond `FIELDS`, as the kernel declares it."""

    def _declared(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {name: (kind, shape) for name, kind, shape in self.declared}

    def initial(self, model: RolloutModel) -> dict[str, np.ndarray]:
        """The unconstrained point that represents `model` (as nearly as it can)."""
        raw = {}
        for name in self.names:
            value = np.asarray(model_array(model, name), dtype=np.float64)
            kind = self._declared().get(name, (None,))[0]
            if kind is not None:
                raw[name] = {"real": lambda x: x, "positive": _inverse_softplus, "unit": _inverse_sigmoid,
                             "simplex": lambda x: np.log(np.maximum(x / x.sum(axis=-1, keepdims=True), 1e-12))}[kind](value)
            elif name == "lambdas":
                raw[name] = self._initial_schedule(value)
            elif name == "diagonal_scores":
                raw[name] = value.mean(axis=1, keepdims=True) if self.content == "per_layer" else value
            elif name in ("alibi_slopes", "temperature"):
                raw[name] = _inverse_softplus(value)
            else:  # head_weights, normalised per layer; a zero weight starts small
                weights = value / value.sum(axis=1, keepdims=True)
                raw[name] = np.log(np.maximum(weights, 1e-12))
        return raw

    def _initial_schedule(self, lambdas: np.ndarray) -> np.ndarray:
        if self.schedule == "free":
            return _inverse_sigmoid(lambdas)
        if self.schedule == "constant":
            return _inverse_sigmoid(np.asarray(lambdas.mean()))
        # power decay: lambda_0 from layer 0, beta from the least-squares
        # slope of log lambda_t against log(t + 1) over the positive entries.
        lambda_0 = float(np.clip(lambdas[0], _EDGE, 1.0 - _EDGE))
        t = np.arange(self.num_layers, dtype=np.float64)
        positive = lambdas > 0
        beta = 1.0
        if positive.sum() >= 2:
            slope = np.polyfit(np.log1p(t[positive]), np.log(lambdas[positive]), 1)[0]
            beta = float(np.clip(-slope, 1e-3, 10.0))
        return np.array([_inverse_sigmoid(lambda_0), np.sqrt(beta)])

    def values(self, raw: dict[str, Array]) -> dict[str, Array]:
        """The model arrays for the unconstrained point `raw`."""
        shape = (self.num_layers, self.num_heads)
        out = {}
        declared = self._declared()
        for name, u in raw.items():
            if name in declared:
                out[name] = {"real": lambda x: x, "positive": jax.nn.softplus, "unit": jax.nn.sigmoid,
                             "simplex": lambda x: jax.nn.softmax(x, axis=-1)}[declared[name][0]](u)
            elif name == "lambdas":
                out[name] = self.lambdas(u)
            elif name == "diagonal_scores":
                out[name] = jnp.broadcast_to(u, shape)
            elif name in ("alibi_slopes", "temperature"):
                out[name] = jax.nn.softplus(u)
            else:
                out[name] = jax.nn.softmax(u, axis=-1)
        return out

    def lambdas(self, u: Array) -> Float[Array, " layers"]:
        if self.schedule == "free":
            return jax.nn.sigmoid(u)
        if self.schedule == "constant":
            return jnp.full((self.num_layers,), jax.nn.sigmoid(u))
        t = jnp.arange(self.num_layers, dtype=u.dtype)
        # beta = u_1^2: beta = 0 (a constant schedule, an edge of the box) is
        # reached at the finite point u_1 = 0, where the loss is smooth in u_1
        # (a softplus would put it at u_1 -> -inf, which a fit chases for
        # thousands of steps without converging).
        return jax.nn.sigmoid(u[0]) / (t + 1.0) ** (u[1] ** 2)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each free vector (the table of the module docstring)."""
        T, H = self.num_layers, self.num_heads
        shapes = {"lambdas": {"free": (T,), "power_decay": (2,), "constant": ()}[self.schedule],
                  "diagonal_scores": (T, 1) if self.content == "per_layer" else (T, H),
                  "alibi_slopes": (T, H), "head_weights": (T, H), "temperature": ()}
        shapes |= {name: shape for name, (_, shape) in self._declared().items()}
        return {name: shapes[name] for name in self.names}

    @property
    def size(self) -> int:
        """The number of free scalars."""
        return sum(math.prod(shape) for shape in self.shapes().values())

    def labels(self) -> tuple[str, ...]:
        """One name per free scalar, in the order of `flatten`."""
        labels = []
        for name, shape in self.shapes().items():
            if name == "lambdas" and self.schedule == "power_decay":
                labels += ["lambda_0", "beta"]
            elif name == "lambdas" and self.schedule == "constant":
                labels.append("lambda_const")
            elif name == "diagonal_scores" and self.content == "per_layer":
                labels += [f"diagonal_scores[{t}]" for t in range(shape[0])]
            elif not shape:
                labels.append(name)
            else:
                labels += [f"{name}[{','.join(map(str, index))}]" for index in np.ndindex(shape)]
        return tuple(labels)

    def flatten(self, raw: dict[str, Array]) -> Array:
        """The free vectors as one ``(size,)`` vector, in `names` order."""
        return jnp.concatenate([jnp.ravel(jnp.asarray(raw[name])) for name in self.names])

    def unflatten(self, flat: Array) -> dict[str, Array]:
        raw, offset = {}, 0
        for name, shape in self.shapes().items():
            size = math.prod(shape)
            raw[name] = flat[offset:offset + size].reshape(shape)
            offset += size
        return raw

    def from_unit(self, unit: Float[Array, " size"]) -> dict[str, Array]:
        """The unconstrained point of a point of the unit cube, through `BOX`.

        Each coordinate is placed in its array's box in the model's own units
        (uniform, or log-uniform for the positive scales) and then inverted
        through the array's parametrisation, so a design that fills the cube
        fills the box of valid models.
        """
        raw = self.unflatten(jnp.clip(unit, _EDGE, 1.0 - _EDGE))

        def uniform(w, box):
            return box[0] + (box[1] - box[0]) * w

        def log_uniform(w, box):
            return jnp.exp(uniform(w, (math.log(box[0]), math.log(box[1]))))

        def logit(x):
            return jnp.log(x) - jnp.log1p(-x)

        def inverse_softplus(x):
            x = jnp.maximum(x, _EDGE)
            return x + jnp.log(-jnp.expm1(-x))

        out = {}
        declared = self._declared()
        for name, w in raw.items():
            if name in declared:
                kind = declared[name][0]
                box = _DECLARED_BOX[kind]
                out[name] = {"real": lambda: uniform(w, box), "simplex": lambda: uniform(w, box),
                             "unit": lambda: logit(uniform(w, box)),
                             "positive": lambda: inverse_softplus(log_uniform(w, box))}[kind]()
            elif name == "lambdas" and self.schedule == "power_decay":
                out[name] = jnp.stack([logit(uniform(w[0], BOX["lambda"])),
                                       jnp.sqrt(uniform(w[1], BOX["beta"]))])
            elif name == "lambdas":
                out[name] = logit(uniform(w, BOX["lambda"]))
            elif name == "diagonal_scores" or name == "head_weights":
                out[name] = uniform(w, BOX[name])
            else:  # alibi_slopes, temperature
                out[name] = inverse_softplus(log_uniform(w, BOX[name]))
        return out

    def schedule_parameters(self, raw: dict[str, np.ndarray]) -> dict[str, float]:
        if "lambdas" not in raw or self.schedule == "free":
            return {}
        u = np.asarray(raw["lambdas"], dtype=np.float64)
        if self.schedule == "constant":
            return {"lambda_const": float(1.0 / (1.0 + np.exp(-u)))}
        return {"lambda_0": float(1.0 / (1.0 + np.exp(-u[0]))), "beta": float(u[1] ** 2)}


def _check_names(names, declared=()) -> tuple[str, ...]:
    """`names` checked against `FIELDS` and the kernel's `declared` fields, in that fixed order."""
    if isinstance(names, str):
        names = tuple(part.strip() for part in names.split(","))
    names = tuple(names)
    if not names:
        raise ConfigError(f"fit: got an empty list; allowed: one or more of {', '.join(FIELDS)}")
    known = FIELDS + tuple(name for name in declared if name not in FIELDS)
    for name in names:
        if name not in known:
            raise ConfigError(f"fit: unknown array {name!r}; allowed: any of {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"fit: {','.join(names)!r} names an array twice; allowed: each at most once")
    # A fixed order, so that equal requests give equal (cached) problems.
    return tuple(name for name in known if name in names)
