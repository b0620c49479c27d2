"""The interface every intervention implements, and what they share."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp

from .._checks import as_float_array, check_range, is_concrete, per_layer_and_head
from ..errors import ConfigError
from ..model import RolloutModel, check_model

__all__ = ["AbstractIntervention", "apply_all"]


class AbstractIntervention(eqx.Module):
    """A change to a model (abstract): ``apply(model)`` is the rollout's prediction of it.

    Subclasses hold their parameters as arrays (leaves), so `jax.grad` of a
    statistic of ``influence(intervention.apply(model))`` is the gradient
    with respect to the intervention.
    """

    @abc.abstractmethod
    def apply(self, model: RolloutModel) -> RolloutModel:
        """The model with the intervention applied (pure; differentiable in the parameters)."""


def apply_all(model: RolloutModel, interventions: Sequence[AbstractIntervention]) -> RolloutModel:
    """``interventions[-1].apply(... interventions[0].apply(model))``: several changes, in order."""
    model = check_model(model)
    for intervention in interventions:
        model = intervention.apply(model)
    return model


def checked_parameter(field: str, value, low=None, *, low_open: bool = False):
    """A parameter as a float array (range-checked when concrete), one line naming `field` otherwise."""
    if not is_concrete(value):
        return jnp.asarray(value)
    array = as_float_array(field, value)
    if array.ndim > 2:
        raise ConfigError(f"{field}: got shape {array.shape}; allowed: a number, (layers,), (heads,) or (layers, heads)")
    check_range(field, array, low, None, low_open=low_open)
    return array




def per_layer_head(field: str, value, model: RolloutModel):
    """`value` broadcast to ``(T, H)`` of `model`: a number, ``(H,)``, ``(T, 1)`` or ``(T, H)``.

    A ``(T,)`` value is one per layer (read as ``(T, 1)``), unless T == H, where
    ``(T,)`` would be ambiguous and ``(T, 1)`` or ``(1, H)`` must be given.
    """
    return layer_head_values(field, value, model.num_layers, model.num_heads)


def layer_head_values(field: str, value, num_layers: int, num_heads: int):
    """`per_layer_head` for a model of `num_layers` layers and `num_heads` heads (the torch patches' shapes)."""
    T, H = num_layers, num_heads
    shape = jnp.shape(value)
    if len(shape) == 1 and shape[0] == T and T != H:
        value = jnp.reshape(value, (T, 1)) if not is_concrete(value) else as_float_array(field, value)[:, None]
    return per_layer_and_head(field, value, T, H)
