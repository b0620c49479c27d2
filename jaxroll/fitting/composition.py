"""The composition exponent q of a rollout, fitted to a measured influence profile.

A measured influence is a gradient norm, ``||df / de_j||_2``, and the paths
from token j to the output add as vectors: linearly where they are aligned,
in quadrature where they are orthogonal. The rollout with exponent q
(`jaxroll.RolloutModel.composition`) composes path magnitudes between the two,

    p_q(j) ∝ ( e_{N-1}^T |R_T|^{∘q} ... |R_1|^{∘q} )_j^{1/q},     q in [1, 2],

and `fit_composition` picks the q whose profile is nearest the measured one
in W1 (`jaxroll.metrics.wasserstein`): a grid of step 0.1 over [1, 2], then
Brent's bounded search (`scipy.optimize.minimize_scalar`) on the grid cells
beside the grid's best. One number fitted on the unchanged model: a change
is then predicted with the same q (docs/design.md, "How paths compose").
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike
from scipy.optimize import minimize_scalar

from ..metrics import wasserstein
from ..model import COMPOSITION_RANGE, RolloutModel
from ..rollout import influence

__all__ = ["fit_composition"]

GRID_STEP = 0.1
"""The coarse grid's spacing over `COMPOSITION_RANGE`."""
TOLERANCE = 1e-3
"""Brent's absolute tolerance on q."""


def fit_composition(model: RolloutModel, measured: ArrayLike) -> tuple[float, float]:
    """``(q, W1)``: the exponent in [1, 2] whose rollout is nearest `measured` (shape ``(N,)``, N the model's
    ``sequence_length``), and that distance (`jaxroll.metrics.wasserstein`, positions / (N - 1)).

    The profile is ``p_q(j) ∝ (e_{N-1}^T |R_T|^{∘q} ... |R_1|^{∘q})_j^{1/q}``; every other array of `model`
    stays as it is. A q within `TOLERANCE` of 1 is returned as 1.0 exactly (the plain rollout).
    """
    target = jnp.asarray(measured, dtype=jnp.result_type(float))
    distance = jax.jit(lambda q: wasserstein(influence(dataclasses.replace(model, composition=q)), target))
    low, high = COMPOSITION_RANGE
    grid = np.linspace(low, high, round((high - low) / GRID_STEP) + 1)
    values = [float(distance(jnp.asarray(q))) for q in grid]
    best = int(np.argmin(values))
    bounds = (grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])
    result = minimize_scalar(lambda q: float(distance(jnp.asarray(q))), bounds=bounds, method="bounded",
                             options={"xatol": TOLERANCE})
    q, value = (float(result.x), float(result.fun)) if result.fun < values[best] else (float(grid[best]), values[best])
    return (1.0, values[0]) if q - low < TOLERANCE and values[0] <= value + 1e-12 else (q, value)
