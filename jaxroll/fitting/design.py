"""The global stage: a space-filling design over the parameter box, scored in
one compiled call; its best points (with the model's own) start the local stage.

A loss over a few parameters can have spurious minima that a local optimiser
started from a "generic" point never leaves (a power-decay fit started from a
constant schedule stops at ``beta -> 0`` with the same total mixing as the
truth). The design (a Halton sequence for up to `GLOBAL_DIMENSIONS`
parameters, uniform draws beyond) over `BOX` finds the basin of the answer.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..errors import ConfigError
from .parametrisation import _Parametrisation
from .problem import _objective, _Problem

__all__ = ["GLOBAL_DIMENSIONS", "GLOBAL_POINTS", "halton"]

# Up to this many free parameters the global stage runs by default, with
# GLOBAL_POINTS design points: in two dimensions 128 Halton points put a point
# within ~0.09 of every box point (box scaled to the unit square), finer than
# the basins seen in the MPT-7B power-decay problem, and at N = 256 they cost
# about as much as 20 optimisation steps. Beyond it a design samples the box
# too thinly to help, and restarts (drawn over the box) are the tool.
GLOBAL_DIMENSIONS = 8
"""Up to this many free parameters `fit` runs the global stage by default (``search=None``)."""
GLOBAL_POINTS = 128
"""Points of the global stage's Halton design when ``search`` is None and at most `GLOBAL_DIMENSIONS` parameters are free."""
# Bases of the Halton design, one per dimension.
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19)
# Peak memory of the design evaluation: points go through lax.map in batches
# of at most this many (layers x heads x positions) floats per batch.
DESIGN_FLOATS = 2 ** 26
"""Floats (layers x heads x positions) per batch of a global design's evaluation, the bound on its peak memory."""


def halton(count: int, dimension: int) -> Float[Array, "count dimension"]:
    """Points 1 .. `count` of the Halton sequence in ``(0, 1)^dimension``.

    Coordinate k of point i is the radical inverse of i in the k-th prime
    base, ``sum_r digit_r(i) base^-(r+1)``: a deterministic low-discrepancy
    design (Halton 1960) for up to ``len(_PRIMES)`` dimensions. Point 0 (the
    origin) is skipped.
    """
    if not 1 <= dimension <= len(_PRIMES):
        raise ConfigError(f"halton: dimension {dimension}; allowed: 1 to {len(_PRIMES)}")
    index = jnp.arange(1, count + 1)
    columns = []
    for base in _PRIMES[:dimension]:  # a handful of bases and digits, run once outside jit
        value = jnp.zeros(count, dtype=jnp.result_type(float))
        rest, scale = index, 1.0 / base
        for _ in range(math.ceil(math.log(count + 1, base)) + 1):
            value = value + (rest % base) * scale
            rest, scale = rest // base, scale / base
        columns.append(value)
    return jnp.stack(columns, axis=1)


def _design(parametrisation: _Parametrisation, points: int, key) -> Float[Array, "points size"]:
    """`points` points of the unit cube: Halton up to GLOBAL_DIMENSIONS, uniform draws beyond."""
    size = parametrisation.size
    if size <= GLOBAL_DIMENSIONS:
        return halton(points, size)
    return jax.random.uniform(key, (points, size), dtype=jnp.result_type(float))


@functools.partial(jax.jit, static_argnames=("problem", "batch_size"))
def _design_losses(raw, fixed, target, *, problem: _Problem, batch_size: int):
    """The loss at every point of `raw` (leading axis), one compiled call.

    `lax.map` with a batch size is a vmap over batches, run one batch after
    the other, so the memory stays bounded for long sequences and many points.
    """
    return jax.lax.map(lambda point: _objective(point, fixed, target, problem), raw,
                       batch_size=batch_size)


def _starting_points(problem: _Problem, fixed, target, initial: dict[str, np.ndarray], restarts: int,
                     search: int, key) -> tuple[dict[str, Array], int]:
    """The `restarts` best of the model's own point and ``max(search, restarts - 1)``
    design points over the box, and the number of design points evaluated.

    With ``search = 0`` there is nothing to choose from: the model's point and
    ``restarts - 1`` draws over the box are all refined (restarts that spread,
    not noise around the start).
    """
    parametrisation = problem.parametrisation
    start = {name: jnp.asarray(u, dtype=jnp.result_type(float))[None] for name, u in initial.items()}
    points = max(search, restarts - 1)
    if points == 0:
        return start, 0
    key = jax.random.PRNGKey(0) if key is None else key
    design = jax.vmap(parametrisation.from_unit)(_design(parametrisation, points, key))
    candidates = {name: jnp.concatenate([start[name], design[name]]) for name in start}
    if search == 0:
        return candidates, points
    per_point = parametrisation.num_layers * parametrisation.num_heads * problem.n
    batch_size = max(1, min(points + 1, DESIGN_FLOATS // per_point))
    losses = np.asarray(_design_losses(candidates, fixed, target, problem=problem, batch_size=batch_size))
    # A non-finite loss (an extreme corner of the box) is never chosen; a
    # stable sort keeps the model's own point first among equals.
    order = np.argsort(np.where(np.isfinite(losses), losses, np.inf), kind="stable")[:restarts]
    return {name: u[order] for name, u in candidates.items()}, points
