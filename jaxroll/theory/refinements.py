"""Refined rollouts, the predicted half: the profile from measured mixing, per-head kernels and head weights.

The measured half is `jaxroll.measure.refinements` (torch): it measures the
ingredients this module composes into a prediction.

The residual-aware rollout (arXiv 2602.16837) uses one mixing coefficient
per layer and a head-averaged kernel. A `RefinedRollout` replaces each by a
measured quantity, one idea at a time (`jaxroll.measure.refinements` measures
them; `compose` picks which are switched on):

    A_t      = sum_h w_{t,h} K_{t,h}                       (N, N), row-stochastic
    R_t      = I - diag(lambda_t) + diag(lambda_t) A_t     (per-position mixing)
    p^T      = e_{N-1}^T R_T ... R_1

with ``K_{t,h}`` row-stochastic per-head kernels (the measured attention
``alpha_h`` or the norm-weighted kernels of Kobayashi et al. 2020),
``w_{t,h} >= 0`` summing to 1 over heads (uniform, or proportional to each
head's measured output norm), ``lambda_t (N,)`` in [0, 1] (constant over
positions for the plain rollout). Every ``R_t`` is row-stochastic and
non-negative, so ``p`` stays a probability vector. ``A[i, j]`` is the weight
with which token i reads token j.

The profile is T vector-times-matrix products from layer T down to layer 1,
``p <- p - (p * lambda_t) + (p * lambda_t) A_t``, in one `jax.lax.scan`;
``P_T`` is never formed.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..engine.step import layer_step
from ..errors import ConfigError

__all__ = ["RefinedRollout", "SWITCHES", "STATS_FOR", "compatible", "compose", "refined_kernels", "refined_transition", "refined_influence"]

SWITCHES = ("position", "mlp", "norm", "heads", "gradient")
"""The refinements `compose` can switch on, one idea each:

- ``position``: per-position mixing ``lambda_t(i)`` instead of its mean over i;
- ``mlp``: the MLP's update counted with the identity path,
  ``lambda = ||a|| / (||x|| + ||a|| + ||m||)``;
- ``norm``: per-head norm-weighted kernels ``K_h[i, j] ~ alpha_h[i, j] ||W_O^h v_h(j)||``;
- ``heads``: heads mixed by their measured output norm instead of uniformly;
- ``gradient``: ``lambda_t`` from the backward pass,
  ``1 - sum_j ||df/da(j)|| / sum_j ||df/dx(j)||``: the share of the gradient
  norm at block t's input that the residual path does not carry
  (``lambda_gradient``, `jaxroll.measure.refinements`); it replaces the
  forward norm ratio, so it does not combine with ``position`` or ``mlp``.
"""

STATS_FOR = {"position": "lambda_positions", "mlp": "lambda_mlp", "norm": "norm_kernels", "heads": "head_norms",
             "gradient": "lambda_gradient"}
"""The ``jaxroll measure --stats`` name that records each switch's ingredient."""

_INGREDIENT = {"position": "lambda_positions", "mlp": "lambda_mlp_positions", "norm": "norm_kernels",
               "heads": "head_norms", "gradient": "lambda_gradient"}


def compatible(switches) -> bool:
    """Whether `switches` can be on together (``gradient`` replaces what ``position`` and ``mlp`` refine)."""
    return not ("gradient" in switches and {"position", "mlp"} & set(switches))

ROW_TOLERANCE = 1e-6  # measured softmax rows (float32 inside BLOOM/Llama) sum to 1 within ~1e-7


class RefinedRollout(eqx.Module):
    """A rollout with per-position mixing and per-head kernels mixed by head weights.

    Attributes:
        lambdas: ``(T, N)`` in [0, 1]: ``lambda_t(i)``, the mixing of position i at layer t.
        head_kernels: ``(T, H, N, N)`` non-negative, rows summing to 1: ``K_{t,h}``.
        head_weights: ``(T, H)`` non-negative, each row summing to 1: ``w_{t,h}``.
    """

    lambdas: Float[Array, "layers n"]
    head_kernels: Float[Array, "layers heads n n"]
    head_weights: Float[Array, "layers heads"]

    @classmethod
    def create(cls, lambdas, head_kernels, head_weights=None) -> "RefinedRollout":
        """Check and build. `lambdas` ``(T,)`` is broadcast over positions; `head_weights` default uniform and
        are normalised per layer. Kernel rows must sum to 1 within `ROW_TOLERANCE` (they are then divided by
        their sums, so the transition is exactly row-stochastic)."""
        kernels = np.asarray(head_kernels, dtype=np.float64)
        if kernels.ndim != 4 or kernels.shape[-1] != kernels.shape[-2]:
            raise ConfigError(f"head_kernels: got shape {kernels.shape}; allowed: (T, H, N, N)")
        layers, heads, n, _ = kernels.shape
        if not np.all(np.isfinite(kernels)) or kernels.min() < 0:
            raise ConfigError("head_kernels: negative or non-finite entries; allowed: finite, >= 0")
        sums = kernels.sum(-1, keepdims=True)
        if np.max(np.abs(sums - 1.0)) > ROW_TOLERANCE:
            raise ConfigError(f"head_kernels: a row sums to {sums.flat[np.argmax(np.abs(sums - 1))]:.9g}; "
                              f"allowed: row sums 1 within {ROW_TOLERANCE}")
        lambdas = np.asarray(lambdas, dtype=np.float64)
        if lambdas.ndim == 1:
            lambdas = np.repeat(lambdas[:, None], n, axis=1)
        if lambdas.shape != (layers, n):
            raise ConfigError(f"lambdas: got shape {lambdas.shape}; allowed: ({layers},) or ({layers}, {n})")
        if not np.all(np.isfinite(lambdas)) or lambdas.min() < 0 or lambdas.max() > 1:
            raise ConfigError("lambdas: outside [0, 1]; allowed: values in [0, 1]")
        weights = np.full((layers, heads), 1.0 / heads) if head_weights is None \
            else np.asarray(head_weights, dtype=np.float64)
        if weights.shape != (layers, heads) or weights.min() < 0 or not np.all(weights.sum(1) > 0):
            raise ConfigError(f"head_weights: got shape {weights.shape}; allowed: ({layers}, {heads}), >= 0, "
                              "each layer with a positive sum")
        return cls(jnp.asarray(lambdas), jnp.asarray(kernels / sums),
                   jnp.asarray(weights / weights.sum(1, keepdims=True)))


def refined_kernels(model: RefinedRollout) -> Float[Array, "layers n n"]:
    """``A_t = sum_h w_{t,h} K_{t,h}``, shape ``(T, N, N)``."""
    return jnp.einsum("th,thij->tij", model.head_weights, model.head_kernels)


def refined_transition(model: RefinedRollout, layer: int) -> Float[Array, "n n"]:
    """``R_t = I - diag(lambda_t) + diag(lambda_t) A_t`` of layer `layer` (0-based), ``(N, N)``."""
    kernel = jnp.einsum("h,hij->ij", model.head_weights[layer], model.head_kernels[layer])
    weight = model.lambdas[layer][:, None]
    return layer_step(jnp.eye(kernel.shape[-1], dtype=kernel.dtype), weight, kernel)


@jax.jit
def refined_influence(model: RefinedRollout) -> Float[Array, " n"]:
    """``p_T(j) = (e_{N-1}^T R_T ... R_1)_j``: one row-times-matrix product per layer, layer T first."""
    n = model.lambdas.shape[-1]
    start = jnp.zeros(n, dtype=model.head_kernels.dtype).at[-1].set(1.0)

    def apply_layer(p, layer):
        weight, kernels, heads = layer
        moved = p * weight  # the share of each row that mixes
        # moved^T A = sum_h w_h moved^T K_h: no (N, N) mixture is formed.
        return p - moved + jnp.einsum("h,i,hij->j", heads, moved, kernels), None

    p, _ = jax.lax.scan(apply_layer, start, (model.lambdas, model.head_kernels, model.head_weights), reverse=True)
    return p


def compose(ingredients: dict, switches=()) -> RefinedRollout:
    """The `RefinedRollout` of measured `ingredients` with the refinements in `switches` on.

    `ingredients` (means, e.g. `RefinementIngredients.mean`): ``attention_heads
    (T, H, N, N)`` and ``lambdas (T,)`` always; ``lambda_positions`` or
    ``lambda_mlp_positions (T, N)``, ``norm_kernels (T, H, N, N)`` and
    ``head_norms (T, H)``, ``lambda_gradient (T,)`` for the switches that need
    them (`ConfigError` names the one missing). With no switch it
    is the residual-aware rollout on the measured head-averaged attention
    (uniform heads). ``mlp`` without ``position`` uses the mean over
    positions of ``lambda_mlp_positions``; ``position`` without ``mlp`` uses
    ``lambda_positions`` (with both: ``lambda_mlp_positions`` as measured).
    """
    switches = tuple(switches)
    unknown = [item for item in switches if item not in SWITCHES]
    if unknown:
        raise ConfigError(f"switches: got {unknown[0]!r}; allowed: a subset of {', '.join(SWITCHES)}")
    if not compatible(switches):
        raise ConfigError("switches: gradient with position or mlp; allowed: gradient replaces lambda_t, "
                          "so it combines with norm and heads only")
    lambda_key = ("lambda_gradient" if "gradient" in switches else "lambda_mlp_positions" if "mlp" in switches
                  else "lambda_positions" if "position" in switches else "lambdas")
    needed = [lambda_key, "norm_kernels" if "norm" in switches else "attention_heads"]
    needed += ["head_norms"] if "heads" in switches else []
    missing = [name for name in needed if name not in ingredients]
    if missing:
        stat = {"lambdas": "lambda", "attention_heads": "attention_heads (or attention without heads)"}.get(
            missing[0]) or STATS_FOR[next(k for k, v in _INGREDIENT.items() if v == missing[0])]
        raise ConfigError(f"ingredients: no {missing[0]}; allowed: a measurement with --stats including {stat}")
    key = "lambda_mlp_positions" if "mlp" in switches else "lambda_positions"
    if "gradient" in switches:
        lambdas = np.asarray(ingredients["lambda_gradient"])
    elif "mlp" in switches or "position" in switches:
        lambdas = np.asarray(ingredients[key])
        if "position" not in switches:
            lambdas = lambdas.mean(axis=-1)
    else:
        lambdas = np.asarray(ingredients["lambdas"])
    kernels = ingredients["norm_kernels"] if "norm" in switches else ingredients["attention_heads"]
    weights = ingredients["head_norms"] if "heads" in switches else None
    kernels = np.asarray(kernels)
    return RefinedRollout.create(np.clip(lambdas, 0.0, 1.0), kernels / kernels.sum(-1, keepdims=True), weights)
