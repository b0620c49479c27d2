"""Interventions on the mixing coefficients: the attention branch's strength."""

from __future__ import annotations

import dataclasses

from jaxtyping import Array, Float

from .._checks import per_layer
from ..model import RolloutModel, check_model
from ._base import AbstractIntervention, checked_parameter
from .registry import register_intervention

__all__ = ["BranchScale"]


@register_intervention
class BranchScale(AbstractIntervention):
    """The attention branch's output multiplied by ``gamma_t >= 0`` in layer t.

    The mixing coefficient is measured per token as the branch's share of the
    residual update, ``lambda = ||a|| / (||x|| + ||a||)``. Scaling ``a`` by
    gamma with ``x`` held fixed gives

        lambda' = gamma lambda / (gamma lambda + 1 - lambda),

    exact per token at the first layer and a first-order prediction
    downstream, where the norms of ``x`` change too (arXiv 2602.16837's
    ``R_t = (1 - lambda_t) I + lambda_t A_t`` with ``lambda_t`` so replaced).
    ``gamma = 1`` is the identity, ``gamma = 0`` removes layer t's attention.
    `gamma` is a number or one per layer.
    """

    name, parameter, neutral, order, changes = "gamma", "gamma", 1.0, 60, "mixing"
    box, lowest, shapes = (0.0, 4.0), (0.0, False), ("global", "per_layer")
    sweep_axis, torch_change = True, "branch"

    @classmethod
    def mixed_lambdas(cls, value, lambdas):
        """``gamma lambda / (gamma lambda + 1 - lambda)``, a removed branch (lambda = 1, gamma = 0) mixing nothing."""
        moved = value * lambdas
        denominator = moved + 1.0 - lambdas
        return moved / (denominator + (denominator == 0))

    gamma: Float[Array, "..."]

    def __init__(self, gamma):
        self.gamma = checked_parameter("gamma", gamma, 0.0)

    def apply(self, model: RolloutModel) -> RolloutModel:
        model = check_model(model)
        gamma = per_layer("gamma", self.gamma, model.num_layers)
        moved = gamma * model.lambdas
        # lambda = 1 and gamma = 0 is 0 / 0: a removed branch mixes nothing.
        denominator = moved + 1.0 - model.lambdas
        lambdas = moved / (denominator + (denominator == 0))
        return dataclasses.replace(model, lambdas=lambdas)
