"""Interventions on the mixing coefficients: the attention branch's strength."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import per_layer
from ..model import RolloutModel, check_model
from ._base import AbstractIntervention, checked_parameter
from .registry import register_intervention

__all__ = ["BranchScale", "stream_growth"]


STREAM_FLOOR = 1e-6
"""The least ``(X'_t / X_t)^2`` the stream rule takes: measured norms that are not a sum of orthogonal updates
could otherwise drive it to 0 or below when branches are removed (gamma -> 0)."""


def stream_growth(gamma, lambdas, stream_norms) -> Float[Array, " layers"]:
    """``rho_t = X'_t / X_t``, the residual stream's norm at layer t's input after the branches are scaled.

    The attention branch of layer s adds ``a_s`` with ``||a_s|| = r_s X_s``, ``r_s = lambda_s / (1 - lambda_s)``
    (the measured ratio ``lambda = ||a|| / (||x|| + ||a||)`` read at the stream's norm ``X_s``). Treating the
    updates as orthogonal to the stream, scaling them by ``gamma_s`` adds ``(gamma_s^2 - 1) r_s^2 X_s^2`` to
    every later ``X_t^2``:

        rho_t^2 = 1 + sum_{s < t} (gamma_s^2 - 1) r_s^2 X_s^2 / X_t^2,

    floored at `STREAM_FLOOR`. ``rho_0 = 1``; ``gamma = 1`` gives 1 everywhere. A layer with ``lambda = 1``
    (no stream to be a share of) adds nothing. Traceable (jit, grad, vmap).

    Args:
        gamma: a number or ``(..., T)``, the branch scales.
        lambdas: ``(..., T)``, the measured mixing coefficients.
        stream_norms: ``(..., T)``, ``X_t > 0`` (`RolloutModel.stream_norms`).

    Returns:
        ``(..., T)``, ``rho_t``: NumPy for NumPy inputs, else a JAX array.
    """
    # NumPy in, NumPy out (float64, as the sweeps' host-side leaves); anything else (traced) through jnp.
    xp = np if all(isinstance(v, (np.ndarray, np.generic, float, int)) for v in (gamma, lambdas, stream_norms)) else jnp
    lambdas = xp.asarray(lambdas)
    gamma = xp.broadcast_to(xp.asarray(gamma, dtype=lambdas.dtype), lambdas.shape)
    norms = xp.asarray(stream_norms, dtype=lambdas.dtype)
    below = lambdas < 1.0
    ratio = xp.where(below, lambdas, 0.0) / xp.where(below, 1.0 - lambdas, 1.0)
    added = (gamma**2 - 1.0) * (ratio * norms) ** 2
    before = xp.cumsum(added, axis=-1) - added  # sum over s < t
    return xp.sqrt(xp.maximum(1.0 + before / norms**2, STREAM_FLOOR))


@register_intervention
class BranchScale(AbstractIntervention):
    """The attention branch's output multiplied by ``gamma_t >= 0`` in layer t.

    The mixing coefficient is measured per token as the branch's share of the
    residual update, ``lambda = ||a|| / (||x|| + ||a||)``. Scaling ``a`` by
    gamma with ``x`` held fixed gives

        lambda' = gamma lambda / (gamma lambda + 1 - lambda),

    exact per token at the first layer. Downstream the stream ``x`` has grown
    (or shrunk) by the scaled branches before it: with the model's measured
    `stream_norms`, its norm is ``rho_t X_t`` (`stream_growth`) and

        lambda'_t = gamma_t lambda_t / (gamma_t lambda_t + rho_t (1 - lambda_t)),

    and the model's stream norms become ``rho_t X_t`` (so that two scales
    compose as their product); without them ``rho_t = 1``, the formula above
    (arXiv 2602.16837's ``R_t = (1 - lambda_t) I + lambda_t A_t`` with
    ``lambda_t`` so replaced). ``gamma = 1`` is the identity, ``gamma = 0``
    removes layer t's attention. `gamma` is a number or one per layer.
    """

    name, parameter, neutral, order, changes = "gamma", "gamma", 1.0, 60, "mixing"
    box, lowest, shapes = (0.0, 4.0), (0.0, False), ("global", "per_layer")
    sweep_axis, torch_change = True, "branch"

    @classmethod
    def mixed_lambdas(cls, value, lambdas, stream_norms=None):
        """``gamma lambda / (gamma lambda + rho (1 - lambda))`` (``rho = 1`` without `stream_norms`), a removed
        branch (lambda = 1, gamma = 0) mixing nothing."""
        return _shares(value, lambdas, 1.0 if stream_norms is None else stream_growth(value, lambdas, stream_norms))

    gamma: Float[Array, "..."]

    def __init__(self, gamma):
        self.gamma = checked_parameter("gamma", gamma, 0.0)

    def apply(self, model: RolloutModel) -> RolloutModel:
        model = check_model(model)
        gamma = per_layer("gamma", self.gamma, model.num_layers)
        if model.stream_norms is None:
            return dataclasses.replace(model, lambdas=_shares(gamma, model.lambdas, 1.0))
        growth = stream_growth(gamma, model.lambdas, model.stream_norms)
        return dataclasses.replace(model, lambdas=_shares(gamma, model.lambdas, growth),
                                   stream_norms=growth * model.stream_norms)


def _shares(gamma, lambdas, growth):
    """``gamma lambda / (gamma lambda + rho (1 - lambda))``; lambda = 1 with gamma = 0 is 0 / 0: a removed branch
    mixes nothing."""
    moved = gamma * lambdas
    denominator = moved + growth * (1.0 - lambdas)
    return moved / (denominator + (denominator == 0))
