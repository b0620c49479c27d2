"""Designing interventions: parameters of changes to a model, optimised through the rollout.

`design` chooses the parameters of interventions (`jaxroll.interventions`: a temperature
``tau``, an ALiBi slope scale, a distance bias ``kappa``, a branch scale ``gamma``) so that the
changed model's influence profile ``p_T = e_{n-1}^T R'_T ... R'_1``,
``R'_t = (1 - lambda'_t) I + lambda'_t A'_t`` (arXiv 2602.16837), matches a target profile, or
raises the middle mass (lowers the U-index) while every layer's attention kernel stays within a
KL budget of the original:

    K_t = (1/n) sum_i KL(A'_t[i, :] || A_t[i, :]) <= b.

Modules, one idea each: `parameters` (the free parameters, their boxes and the sigmoid maps),
`objective` (the losses, the shape goals, the kernel KL and the augmented Lagrangian),
`optimise` (`design`: the global stage, the local stages of `jaxroll.fitting`, the outer loop),
`result` (`DesignResult`).
"""

from .objective import GOALS as GOALS, kernel_kl as kernel_kl
from .optimise import (
    FEASIBILITY as FEASIBILITY,
    MAX_PENALTY as MAX_PENALTY,
    OUTER_ITERATIONS as OUTER_ITERATIONS,
    PENALTY as PENALTY,
    PENALTY_GROWTH as PENALTY_GROWTH,
    design as design,
)
from . import parameters as _parameters
from .parameters import BOUND_FRACTION as BOUND_FRACTION, SHAPES as SHAPES
from .result import DesignResult as DesignResult

__all__ = ["design", "DesignResult", "PARAMETERS", "SHAPES", "BOXES", "IDENTITY", "BOUND_FRACTION", "GOALS",
           "PENALTY", "PENALTY_GROWTH", "MAX_PENALTY", "OUTER_ITERATIONS", "FEASIBILITY", "kernel_kl"]

PARAMETERS: tuple[str, ...]
"""`jaxroll.designs.parameters.PARAMETERS`: the parameters a design can free, read from the registry when asked."""
BOXES: dict[str, tuple[float, float]]
"""`jaxroll.designs.parameters.BOXES`: the default box of each parameter."""
IDENTITY: dict[str, float]
"""`jaxroll.designs.parameters.IDENTITY`: the value at which each intervention changes nothing."""


def __getattr__(name: str):
    if name in ("PARAMETERS", "BOXES", "IDENTITY"):  # read from the intervention registry when asked
        return getattr(_parameters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
