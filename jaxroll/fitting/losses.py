"""Losses between a rollout profile ``p`` and a target ``q``."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from .. import metrics
from ..errors import ConfigError

__all__ = ["LOSSES"]

LOSSES = ("wasserstein", "kl", "l2")
"""The built-in losses of `fit` (any callable ``loss(p, q)`` works too): `metrics.wasserstein`, `metrics.kl`, squared L2."""


def _l2(p, target):
    """``sum_j (p_j - q_j)^2``."""
    return jnp.sum((p - target) ** 2)


def _kl(p, target):
    """``KL(q || p)``: the target is the data, the rollout the model."""
    return metrics.kl(target, p)


_LOSS_FUNCTIONS = {"wasserstein": metrics.wasserstein, "kl": _kl, "l2": _l2}


def resolve_loss(loss) -> Callable:
    """The loss ``L(p, target)`` a fit minimises: a callable as given, or the named one of `LOSSES`."""
    if callable(loss):
        return loss
    if loss not in _LOSS_FUNCTIONS:
        raise ConfigError(f"loss: got {loss!r}; allowed: one of {', '.join(LOSSES)} or a callable (p, target) -> scalar")
    return _LOSS_FUNCTIONS[loss]
