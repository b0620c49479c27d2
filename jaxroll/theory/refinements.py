"""Refined rollouts, the predicted half: the profile from measured mixing, per-head kernels and head weights.

The measured half is `jaxroll.measure.refinements` (torch): it measures the
ingredients this module composes into a prediction.

The residual-aware rollout (arXiv 2602.16837) uses one mixing coefficient
per layer and a head-averaged kernel. A `RefinedRollout` replaces each by a
measured quantity, one idea at a time (`jaxroll.measure.refinements` measures
them; `compose` picks which are switched on):

    A_t[i, :] = sum_h w_{t,h}(i) K_{t,h}[i, :]              (N, N), row-stochastic
    R_t       = I - diag(lambda_t) + diag(lambda_t) A_t     (per-position mixing)
    p^T       = e_{N-1}^T R_T ... R_1

with ``K_{t,h}`` row-stochastic per-head kernels (the measured attention
``alpha_h`` or the norm-weighted kernels of Kobayashi et al. 2020),
``w_{t,h}(i) >= 0`` summing to 1 over heads (uniform, proportional to each
head's measured output norm, one weight per layer, or per query position i
with ``head_positions``), ``lambda_t (N,)`` in [0, 1] (constant over
positions for the plain rollout). ``A[i, j]`` is the weight with which
token i reads token j.

The pre-attention norm's gain (``input_norm``, optional ``input_gains``
``g_t(j) = c_t(j) / cbar_t``, ``c_t(j)`` the mean over sequences of
``1 / sigma_t(j)``, ``cbar_t = mean_j c_t(j)``): the attention path reads
source j through the block's input norm ``LN_t``, whose Jacobian at j is
``1 / sigma_t(j)`` times a projection (LayerNorm: ``sigma = sqrt(var +
eps)``; RMSNorm: the RMS), a gain that neither the forward norm ratio
``lambda_t`` nor Kobayashi's forward norms see. Its rollout form scales the
attention path's weight on each source by its relative gain and adjusts the
identity share so that each row still sums to 1:

    R_t[i, :] = (1 - lambda_t(i) s_t(i)) e_i + lambda_t(i) A_t[i, :] * g_t,
    s_t(i)    = sum_j A_t[i, j] g_t(j).

Where ``lambda_t(i) s_t(i) > 1`` the identity share would be negative: the
attention part is then scaled by ``1 / (lambda_t(i) s_t(i))``, so the row is
``A_t[i, :] * g_t / s_t(i)`` and the identity share 0 (in general
``lambda_t(i)`` is replaced by ``min(lambda_t(i), 1 / s_t(i))``). With
``g_t`` constant it is the rollout above. This is the mechanism of Kim et
al. (LayerNorm-induced recency, ACL Findings 2026) in rollout form.

No switch exists for the *final* norm ``LN_f``: the influence target at
query i reads the last residual stream through ``LN_f`` at i only, whose
Jacobian is ``1 / sigma_f(i)`` times a projection: one factor per query
row, which cancels when each row is normalised (as the measured rows and
profiles are). Whether the projection matters is an empirical question; the
validation trains models without the final norm to test it (docs/rows.md).

Every ``R_t`` is row-stochastic and non-negative, so ``p`` stays a
probability vector. The profile is T vector-times-matrix products from
layer T down to layer 1 in one reverse `jax.lax.scan` (`refined_rows` runs
the same scan from any start rows ``e_i``, vmapped); ``P_T`` is never
formed.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..engine.step import layer_step
from ..errors import ConfigError

__all__ = ["RefinedRollout", "SWITCHES", "STATS_FOR", "compatible", "compose", "refined_kernels", "refined_transition",
           "refined_influence", "refined_rows"]

SWITCHES = ("position", "mlp", "norm", "heads", "gradient", "head_positions", "input_norm")
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
  forward norm ratio, so it does not combine with ``position`` or ``mlp``;
- ``head_positions``: heads mixed per query position i,
  ``w_{t,h}(i) ~ ||W_O^h context_h(i)||`` (mean over sequences), in place of
  one weight per layer: it refines ``heads`` and does not combine with it;
- ``input_norm``: the attention path's weight on source j scaled by the
  input norm's relative gain ``c_t(j) / cbar_t`` (module docstring); it
  combines with every other switch.
"""

STATS_FOR = {"position": "lambda_positions", "mlp": "lambda_mlp", "norm": "norm_kernels", "heads": "head_norms",
             "gradient": "lambda_gradient", "head_positions": "head_norms_positions",
             "input_norm": "input_norm_gains"}
"""The ``jaxroll measure --stats`` name that records each switch's ingredient."""

_INGREDIENT = {"position": "lambda_positions", "mlp": "lambda_mlp_positions", "norm": "norm_kernels",
               "heads": "head_norms", "gradient": "lambda_gradient", "head_positions": "head_norms_positions",
               "input_norm": "input_norm_gains"}


def compatible(switches) -> bool:
    """Whether `switches` can be on together.

    ``gradient`` replaces what ``position`` and ``mlp`` refine (lambda_t);
    ``head_positions`` replaces ``heads``' one weight per layer.
    """
    switches = set(switches)
    replaced_lambda = "gradient" in switches and {"position", "mlp"} & switches
    return not replaced_lambda and not {"heads", "head_positions"} <= switches

ROW_TOLERANCE = 1e-6  # measured softmax rows (float32 inside BLOOM/Llama) sum to 1 within ~1e-7


class RefinedRollout(eqx.Module):
    """A rollout with per-position mixing and per-head kernels mixed by head weights.

    Attributes:
        lambdas: ``(T, N)`` in [0, 1]: ``lambda_t(i)``, the mixing of position i at layer t.
        head_kernels: ``(T, H, N, N)`` non-negative, rows summing to 1: ``K_{t,h}``.
        head_weights: ``(T, H)`` (one weight per layer) or ``(T, H, N)`` (per query position i),
            non-negative, summing to 1 over heads: ``w_{t,h}`` or ``w_{t,h}(i)``.
        input_gains: None, or ``(T, N)`` positive with mean 1 over positions: ``g_t(j) = c_t(j) / cbar_t``,
            the input norm's relative gain (module docstring).
    """

    lambdas: Float[Array, "layers n"]
    head_kernels: Float[Array, "layers heads n n"]
    head_weights: Float[Array, "layers heads *positions"]
    input_gains: Float[Array, "layers n"] | None = None

    @classmethod
    def create(cls, lambdas, head_kernels, head_weights=None, input_gains=None) -> "RefinedRollout":
        """Check and build. `lambdas` ``(T,)`` is broadcast over positions; `head_weights` ``(T, H)`` or
        ``(T, H, N)`` default uniform and are normalised over heads; `input_gains` ``(T, N)`` (default none:
        the plain rollout) are divided by their mean over positions. Kernel rows must sum to 1 within
        `ROW_TOLERANCE` (they are then divided by their sums, so the transition is exactly row-stochastic)."""
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
        if weights.shape not in ((layers, heads), (layers, heads, n)) or not np.all(np.isfinite(weights)) \
                or weights.min() < 0 or not np.all(weights.sum(1) > 0):
            raise ConfigError(f"head_weights: got shape {weights.shape}; allowed: ({layers}, {heads}) or ({layers}, "
                              f"{heads}, {n}), >= 0, a positive sum over heads")
        gains = None
        if input_gains is not None:
            gains = np.asarray(input_gains, dtype=np.float64)
            if gains.shape != (layers, n) or not np.all(np.isfinite(gains)) or gains.min() <= 0:
                raise ConfigError(f"input_gains: got shape {gains.shape}; allowed: ({layers}, {n}), finite, > 0")
            gains = jnp.asarray(gains / gains.mean(-1, keepdims=True))
        return cls(jnp.asarray(lambdas), jnp.asarray(kernels / sums),
                   jnp.asarray(weights / weights.sum(1, keepdims=True)), gains)


def _mixture(weights, kernels):
    # A[i, :] = sum_h w_h(i) K_h[i, :]; weights (H,) or (H, N).
    return jnp.einsum("h,hij->ij" if weights.ndim == 1 else "hi,hij->ij", weights, kernels)


def refined_kernels(model: RefinedRollout) -> Float[Array, "layers n n"]:
    """``A_t[i, :] = sum_h w_{t,h}(i) K_{t,h}[i, :]``, shape ``(T, N, N)`` (before any input-norm gain)."""
    return jax.vmap(_mixture)(model.head_weights, model.head_kernels)


def refined_transition(model: RefinedRollout, layer: int) -> Float[Array, "n n"]:
    """``R_t`` of layer `layer` (0-based), ``(N, N)``: ``I - diag(lambda_t) + diag(lambda_t) A_t``, or with
    input gains ``diag(1 - gamma_t s_t) + diag(gamma_t) A_t diag(g_t)``, ``gamma_t = min(lambda_t, 1 / s_t)``."""
    kernel = _mixture(model.head_weights[layer], model.head_kernels[layer])
    weight = model.lambdas[layer]
    if model.input_gains is None:
        return layer_step(jnp.eye(kernel.shape[-1], dtype=kernel.dtype), weight[:, None], kernel)
    gains = model.input_gains[layer]
    reach = kernel @ gains  # s(i) = sum_j A[i, j] g(j)
    gamma = jnp.minimum(weight, 1.0 / reach)  # the cap: the identity share 1 - gamma s stays >= 0
    return jnp.diag(1.0 - gamma * reach) + gamma[:, None] * kernel * gains[None, :]


def _mixing(model: RefinedRollout):
    """Per layer and row, ``(gamma_t (T, N), s_t (T, N))``: the attention coefficient and the gained reach
    ``s_t(i) = sum_j A_t[i, j] g_t(j)``, ``gamma_t = min(lambda_t, 1 / s_t)``; ``(lambda_t, None)`` without gains."""
    if model.input_gains is None:
        return model.lambdas, None
    spec = "thi,thij,tj->ti" if model.head_weights.ndim == 3 else "th,thij,tj->ti"
    reach = jnp.einsum(spec, model.head_weights, model.head_kernels, model.input_gains)
    return jnp.minimum(model.lambdas, 1.0 / reach), reach  # the cap: the identity share 1 - gamma s stays >= 0


def _propagate(model: RefinedRollout, mixing, start):
    """``start^T R_T ... R_1``: one row-times-matrix product per layer, layer T first (`_mixing` gives `mixing`)."""
    spec = "hi,i,hij->j" if model.head_weights.ndim == 3 else "h,i,hij->j"

    def apply_layer(p, layer):
        weight, reach, kernels, heads, gains = layer
        moved = p * weight  # the share of each row that mixes (gamma(i) p(i) with gains)
        # moved^T A = sum_h w_h moved^T K_h: no (N, N) mixture is formed.
        mixed = jnp.einsum(spec, heads, moved, kernels)
        if gains is None:
            return p - moved + mixed, None
        return p - moved * reach + gains * mixed, None

    weight, reach = mixing
    layers = (weight, reach, model.head_kernels, model.head_weights, model.input_gains)
    p, _ = jax.lax.scan(apply_layer, start, layers, reverse=True)
    return p


@jax.jit
def refined_influence(model: RefinedRollout) -> Float[Array, " n"]:
    """``p_T(j) = (e_{N-1}^T R_T ... R_1)_j``: one row-times-matrix product per layer, layer T first."""
    n = model.lambdas.shape[-1]
    return _propagate(model, _mixing(model), jnp.zeros(n, dtype=model.head_kernels.dtype).at[-1].set(1.0))


@jax.jit
def refined_rows(model: RefinedRollout, starts: Float[Array, "k n"]) -> Float[Array, "k n"]:
    """Rows ``starts[k]^T R_T ... R_1``, ``(K, N)``: with ``starts = e_{q_k}``, rows ``q_k`` of ``P_T``.

    The reverse scan of `refined_influence`, vmapped over the K start rows:
    O(K T H N^2), ``P_T`` is never formed. Each row sums to the sum of its start row.
    """
    mixing = _mixing(model)  # once, not per start row
    return jax.vmap(lambda start: _propagate(model, mixing, start))(starts.astype(model.head_kernels.dtype))


def compose(ingredients: dict, switches=()) -> RefinedRollout:
    """The `RefinedRollout` of measured `ingredients` with the refinements in `switches` on.

    `ingredients` (means, e.g. `RefinementIngredients.mean`): ``attention_heads
    (T, H, N, N)`` and ``lambdas (T,)`` always; ``lambda_positions`` or
    ``lambda_mlp_positions (T, N)``, ``norm_kernels (T, H, N, N)``,
    ``head_norms (T, H)``, ``lambda_gradient (T,)``, ``head_norms_positions
    (T, H, N)`` and ``input_norm_gains (T, N)`` for the switches that need
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
        raise ConfigError("switches: gradient with position or mlp, or heads with head_positions; allowed: "
                          "gradient replaces lambda_t (it combines with norm, heads, head_positions, input_norm), "
                          "head_positions replaces heads")
    lambda_key = ("lambda_gradient" if "gradient" in switches else "lambda_mlp_positions" if "mlp" in switches
                  else "lambda_positions" if "position" in switches else "lambdas")
    needed = [lambda_key, "norm_kernels" if "norm" in switches else "attention_heads"]
    needed += [_INGREDIENT[switch] for switch in ("heads", "head_positions", "input_norm") if switch in switches]
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
    weights = (ingredients["head_norms"] if "heads" in switches else ingredients["head_norms_positions"]
               if "head_positions" in switches else None)
    gains = ingredients["input_norm_gains"] if "input_norm" in switches else None
    kernels = np.asarray(kernels)
    return RefinedRollout.create(np.clip(lambdas, 0.0, 1.0), kernels / kernels.sum(-1, keepdims=True), weights,
                                 gains)
