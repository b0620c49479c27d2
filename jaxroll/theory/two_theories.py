"""Two theories fitted to one profile: the kinetic closed form and the rollout.

For a profile ``q`` over N positions (measured, or predicted by a model),
`compare_theories` fits

- the kinetic theory (Duerinckx, Geshkovski, Rossi, arXiv 2605.09213,
  `jaxroll.theory.kinetic`) with H heads: ``S(s) = sum_h w_h S_t(s;
  beta_h, lambda_h)`` at a common depth t and mode width M, ``w_0 = 1``
  (the scale drops out of the normalisation): ``3 H + 1`` parameters;
- the residual-aware rollout (arXiv 2602.16837) on a given geometry (its
  heads' ALiBi slopes and head weights, no content): a power-decay schedule
  ``lambda_t = lambda_0 / (t + 1)^gamma`` and a common slope scale sigma
  (``m_h -> sigma m_h``): 3 parameters,

each by minimising ``W1(p, q) / (N - 1)`` (`jaxroll.metrics.wasserstein`)
with optax's Adam from the best points of a small design, and reports the
best W1 each reaches and with how many parameters.

From ``S`` on (0, 1) to a distribution over N positions (`to_distribution`):

    p_j = max(S(s_j), 0) / sum_k max(S(s_k), 0),   s_j = (j + 1/2) / N.

Why: ``S`` is a density in s up to a constant (the kinetic theory does not
normalise it), so position j gets the mass of its cell ``[j/N, (j+1)/N]``;
the midpoint rule gives that to ``O(1/N^2)`` and never evaluates the
singular end ``s = 0`` (``S -> inf``, integrably) nor the query ``s = 1``
itself. The bridge's ``s = j/N`` (`jaxroll.theory.bridge`) is the left end
of the same cell: the two differ by ``O(1/N)``, the bridge's own error. No
point mass is put on the query: the rollout's identity mass ``e^(-c)`` at
``j = N - 1`` has no kinetic counterpart. Negative values, possible only
with negative head weights, are clipped to 0 (a distribution has none); the
sum is taken after clipping. Computed from ``log S_h`` shifted by its
maximum, so no head overflows.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float

from .. import metrics, presets
from ..bucket import pad
from ..engine.alibi import layer_kernel
from ..engine.step import layer_step
from ..engine.structured import dense_causal_kernel
from ..errors import ConfigError
from ..optimisers import cosine_adam
from ..model import RolloutModel
from . import kinetic

__all__ = ["to_distribution", "kinetic_distribution", "rollout_distribution", "TheoryFit",
           "fit_kinetic", "fit_rollout", "compare_theories", "KINETIC_HEADS"]

KINETIC_HEADS = (1, 2)
"""Head counts of the kinetic profiles `compare_theories` fits (each head adds beta, lambda and a weight)."""
_MIN_M = 0.5  # M = 0.5 + softplus(u): below, omega_n kills every mode but the first anyway


def _midpoints(n: int, dtype) -> Float[Array, " n"]:
    return (jnp.arange(n, dtype=dtype) + 0.5) / n


def kinetic_distribution(beta, lam, weights, t, M, n: int, n_max: int = kinetic.N_MAX) -> Float[Array, " n"]:
    """``p_j = max(S(s_j), 0) / sum_k max(S(s_k), 0)``, ``s_j = (j + 1/2) / n``, ``S = sum_h w_h S_t(.; beta_h, lambda_h)``.

    Arrays `beta`, `lam`, `weights` have shape ``(H,)``; `t`, `M` scalars.
    Differentiable (the clip is a.e.).
    """
    s = _midpoints(n, jnp.result_type(float))
    log_heads = kinetic.log_profile(s[:, None], t, beta, lam, M, n_max)      # (n, H)
    shifted = jnp.exp(log_heads - jax.lax.stop_gradient(jnp.max(log_heads)))
    values = jnp.maximum(shifted @ weights, 0.0)
    return values / jnp.maximum(jnp.sum(values), jnp.finfo(values.dtype).tiny)


def to_distribution(model: kinetic.KineticModel, n: int) -> Float[Array, " n"]:
    """A `kinetic.KineticModel`'s profile as a distribution over n positions (module docstring)."""
    return kinetic_distribution(model.beta, model.lam, model.weights, model.t, model.M, n, model.n_max)


def rollout_distribution(geometry: RolloutModel, lambda_0, gamma, slope_scale, n: int) -> Float[Array, " n"]:
    """The rollout profile with the geometry's first-layer heads (slopes times `slope_scale`, no content)
    and ``lambda_t = lambda_0 / (t + 1)^gamma`` over its T layers.

    Every layer has the same kernel A, so ``p^T = e_{n-1}^T prod_t ((1 - lambda_t) I + lambda_t A)``
    is T row-times-matrix products with one dense ``(n, n)`` A. Differentiable.
    """
    heads = _padded_heads(geometry, geometry.num_heads)
    return _rollout_profile(*heads, geometry.num_layers, geometry.num_layers, lambda_0, gamma, slope_scale, n,
                            geometry.mask, geometry.window)


def _padded_heads(geometry: RolloutModel, heads: int):
    """First-layer slopes and normalised head weights of `jaxroll.bucket.pad` to `heads` (weight-0
    heads drop out of ``A = sum_h w_h A_h``), so geometries of different widths share one compiled fit."""
    dtype = jnp.result_type(float)
    padded = pad(geometry, geometry.num_layers, heads)
    weights = np.asarray(padded.head_weights, dtype=np.float64)[0]
    return (jnp.asarray(np.asarray(padded.alibi_slopes, dtype=np.float64)[0], dtype),
            jnp.asarray(weights / weights.sum(), dtype), jnp.asarray(geometry.temperature, dtype))


def _rollout_profile(slopes, weights, temperature, layers, max_layers: int, lambda_0, gamma, slope_scale, n: int,
                     mask: str, window):
    dtype = jnp.result_type(float)
    zeros = jnp.zeros_like(slopes)
    if mask == "causal":
        # The closed-form tables and one matmul: no (H, n, n) softmax to build and
        # differentiate at every Adam step (200x faster for BLOOM-176B's 112 heads).
        kernel = dense_causal_kernel(slopes * slope_scale / temperature, zeros, weights, n)
    else:
        kernel = layer_kernel(slopes * slope_scale, zeros, zeros, weights, temperature, n, mask, window)
    depth = jnp.arange(max_layers, dtype=dtype)
    # Layers at or beyond the geometry's depth have lambda = 0: exactly the identity.
    lambdas = jnp.where(depth < layers, jnp.clip(lambda_0 / (depth + 1) ** gamma, 0.0, 1.0), 0.0)

    def layer(row, weight):
        return layer_step(row, weight, row @ kernel), None

    row, _ = jax.lax.scan(layer, jnp.zeros(n, dtype).at[n - 1].set(1.0), lambdas)
    return row / jnp.sum(row)


class TheoryFit(NamedTuple):
    """One theory's best fit to a profile (`compare_theories`)."""

    theory: str                 # "kinetic, H heads" or "rollout"
    wasserstein: float          # W1(p, q) / (N - 1) at the best point
    num_parameters: int
    profile: np.ndarray         # (N,) the fitted distribution
    parameters: dict            # the fitted values by name
    losses: np.ndarray          # (steps,) the best run's loss per Adam step


def _adam(loss, start, steps: int, learning_rate: float):
    """``steps`` Adam updates (`jaxroll.fitting.cosine_adam`, to 2% of the rate) from `start`; returns (best x, best loss, history).

    Adam rather than L-BFGS: the problems have 3 to 10 parameters and a loss
    (W1) with kinks, and optax's L-BFGS line search took ~90 s to compile
    here against a few seconds for this scan.
    """
    optimiser = cosine_adam(steps, learning_rate, final_fraction=0.02)
    value_and_grad = jax.value_and_grad(loss)

    def step(carry, _):
        x, state, best_x, best = carry
        value, grad = value_and_grad(x)
        # Keep the best point seen; a NaN gradient (a degenerate point) stops nothing.
        improved = jnp.isfinite(value) & (value < best)
        best_x = jnp.where(improved, x, best_x)
        best = jnp.where(improved, value, best)
        grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
        updates, state = optimiser.update(grad, state, x)
        return (optax.apply_updates(x, updates), state, best_x, best), value

    carry = (start, optimiser.init(start), start, jnp.asarray(jnp.inf, start.dtype))
    (x, _, best_x, best), history = jax.lax.scan(step, carry, None, length=steps)
    last = loss(x)
    better = jnp.isfinite(last) & (last < best)
    return jnp.where(better, x, best_x), jnp.where(better, last, best), history


def _check_target(target) -> np.ndarray:
    q = metrics.check_profile("profile", target, normalize=True)
    if q.ndim != 1 or q.size < 2:
        raise ConfigError(f"profile: got shape {q.shape}; allowed: (N,) with N >= 2")
    return q


def _kinetic_values(x, heads: int):
    """Unconstrained ``x`` (3 H + 1) -> (beta, lambda, weights, t, M)."""
    beta = jax.nn.softplus(x[:heads]) + 1e-3
    lam = x[heads:2 * heads]
    weights = jnp.concatenate([jnp.ones(1, x.dtype), x[2 * heads:3 * heads - 1]])
    t = jax.nn.softplus(x[3 * heads - 1])
    M = _MIN_M + jax.nn.softplus(x[3 * heads])
    return beta, lam, weights, t, M


def _inverse_softplus(y):
    return np.log(np.expm1(y))


@functools.partial(jax.jit, static_argnames=("heads", "n", "steps", "keep"))
def _fit_kinetic(target, design, heads: int, n: int, steps: int, keep: int, learning_rate=0.05):
    def loss(x):
        return metrics.wasserstein(kinetic_distribution(*_kinetic_values(x, heads), n), target)

    scores = jax.vmap(loss)(design)
    scores = jnp.where(jnp.isfinite(scores), scores, jnp.inf)
    starts = design[jnp.argsort(scores)[:keep]]
    xs, values, histories = jax.vmap(lambda x: _adam(loss, x, steps, learning_rate))(starts)
    return xs, values, histories


def _kinetic_design(heads: int, previous: np.ndarray | None) -> np.ndarray:
    """Starting points: a grid over (beta, lambda, t, M) for one head; for more heads, the best
    fit with one head fewer plus a new head at a grid of (beta, lambda) and weights +-0.3."""
    if previous is None:
        grid = np.array(np.meshgrid([0.3, 1.0, 3.0], [-2.0, 0.5, 2.0, 8.0], [0.2, 1.0, 4.0], [3.0, 12.0],
                                    indexing="ij")).reshape(4, -1).T
        return np.column_stack([_inverse_softplus(grid[:, 0] - 1e-3), grid[:, 1], _inverse_softplus(grid[:, 2]),
                                _inverse_softplus(grid[:, 3] - _MIN_M)])
    h = heads - 1
    rows = []
    for beta in (0.5, 2.0):
        for lam in (-2.0, 1.0, 8.0, 30.0):
            for weight in (-0.3, 0.3):
                rows.append(np.concatenate([previous[:h], [_inverse_softplus(beta - 1e-3)], previous[h:2 * h], [lam],
                                            previous[2 * h:3 * h - 1], [weight], previous[3 * h - 1:]]))
    return np.array(rows)


def fit_kinetic(target, heads: int = 1, *, steps: int = 300, keep: int = 3, _previous=None) -> TheoryFit:
    """Fit ``S = sum_h w_h S_t(.; beta_h, lambda_h)`` (``w_0 = 1``, common t, M) to a profile.

    ``3 H + 1`` parameters through ``beta = softplus(u) + 1e-3``, ``lambda = u``
    (any sign), ``w_h = u`` (h >= 1), ``t = softplus(u)``, ``M = 0.5 +
    softplus(u)``; loss ``W1 / (N - 1)`` of `kinetic_distribution`. A design
    of starting points (a 72-point grid for one head; for H heads the best
    (H-1)-head fit plus 16 choices of the new head) is scored in one vmapped
    call and the best `keep` are refined by `steps` Adam updates.
    """
    q = _check_target(target)
    if heads < 1:
        raise ConfigError(f"heads: got {heads}; allowed: an integer >= 1")
    if heads > 1 and _previous is None:
        _previous = _raw_kinetic(fit_kinetic(q, heads - 1, steps=steps, keep=keep), heads - 1)
    design = jnp.asarray(_kinetic_design(heads, _previous), dtype=jnp.result_type(float))
    xs, values, histories = _fit_kinetic(jnp.asarray(q, design.dtype), design, heads, q.size, steps,
                                         min(keep, design.shape[0]))
    winner = int(jnp.argmin(jnp.where(jnp.isfinite(values), values, jnp.inf)))
    x = xs[winner]
    beta, lam, weights, t, M = _kinetic_values(x, heads)
    p = np.asarray(kinetic_distribution(beta, lam, weights, t, M, q.size), dtype=np.float64)
    return TheoryFit(
        theory=f"kinetic, {heads} head{'s' if heads > 1 else ''}",
        wasserstein=float(metrics.wasserstein(jnp.asarray(p), jnp.asarray(q))),
        num_parameters=3 * heads + 1, profile=p,
        parameters=dict(beta=np.asarray(beta), lam=np.asarray(lam), weights=np.asarray(weights),
                        t=float(t), M=float(M), raw=np.asarray(x)),
        losses=np.asarray(histories[winner]))


def _raw_kinetic(result: TheoryFit, heads: int) -> np.ndarray:
    return np.asarray(result.parameters["raw"])


_WIDTHS = (16, 128)   # head and layer counts are padded up to one of these: fewer compilations


def _bucket(size: int) -> int:
    return next((w for w in _WIDTHS if size <= w), size)


@functools.partial(jax.jit, static_argnames=("max_layers", "n", "steps", "keep", "mask", "window"))
def _fit_rollout(heads, layers, target, design, max_layers: int, n: int, steps: int, keep: int, mask: str, window,
                 learning_rate=0.05):
    def loss(x):
        lambda_0 = jax.nn.sigmoid(x[0])
        gamma = jax.nn.softplus(x[1])
        p = _rollout_profile(*heads, layers, max_layers, lambda_0, gamma, jnp.exp(x[2]), n, mask, window)
        return metrics.wasserstein(p, target)

    scores = jax.vmap(loss)(design)
    scores = jnp.where(jnp.isfinite(scores), scores, jnp.inf)
    starts = design[jnp.argsort(scores)[:keep]]
    return jax.vmap(lambda x: _adam(loss, x, steps, learning_rate))(starts)


def fit_rollout(target, geometry: RolloutModel | None = None, *, steps: int = 300, keep: int = 2) -> TheoryFit:
    """Fit the rollout on `geometry` (3 parameters) to a profile.

    ``lambda_t = lambda_0 / (t + 1)^gamma`` over the geometry's T layers
    (``lambda_0 = sigmoid(u)``, ``gamma = softplus(u)``) and the slopes of its
    first layer times ``sigma = e^u``, head weights as given, no content.
    `geometry` defaults to the preset `jaxroll.presets.DEFAULT` at the
    profile's length (a measured profile without an architecture).
    """
    q = _check_target(target)
    n = q.size
    if geometry is None:
        geometry = presets.get(presets.DEFAULT, n)
    if geometry.mask == "full":
        raise ConfigError("geometry: mask 'full'; allowed: 'causal' or 'sliding'")
    grid = np.array(np.meshgrid([0.1, 0.4, 0.8], [0.3, 1.0, 2.0], [0.3, 1.0, 3.0], indexing="ij")).reshape(3, -1).T
    design = np.column_stack([np.log(grid[:, 0] / (1 - grid[:, 0])), _inverse_softplus(grid[:, 1]), np.log(grid[:, 2])])
    dtype = jnp.result_type(float)
    heads = _padded_heads(geometry, _bucket(geometry.num_heads))
    xs, values, histories = _fit_rollout(heads, geometry.num_layers, jnp.asarray(q, dtype), jnp.asarray(design, dtype),
                                         _bucket(geometry.num_layers), n, steps, keep, geometry.mask, geometry.window)
    winner = int(jnp.argmin(jnp.where(jnp.isfinite(values), values, jnp.inf)))
    x = np.asarray(xs[winner], dtype=np.float64)
    lambda_0, gamma, sigma = 1 / (1 + np.exp(-x[0])), float(np.log1p(np.exp(x[1]))), float(np.exp(x[2]))
    p = np.asarray(rollout_distribution(geometry, lambda_0, gamma, sigma, n), dtype=np.float64)
    return TheoryFit(theory="rollout", wasserstein=float(metrics.wasserstein(jnp.asarray(p), jnp.asarray(q))),
                     num_parameters=3, profile=p,
                     parameters=dict(lambda_0=float(lambda_0), gamma=gamma, slope_scale=sigma),
                     losses=np.asarray(histories[winner]))


def compare_theories(profile, geometry: RolloutModel | None = None, *, heads=KINETIC_HEADS,
                     steps: int = 300) -> dict[str, TheoryFit]:
    """Fit both theories to one profile; ``{theory: TheoryFit}`` with the best W1 and parameter count of each.

    Args:
        profile: ``(N,)``, >= 0, renormalised to sum 1.
        geometry: the rollout's heads and depth (e.g. the model the profile
            was measured on); default the preset `jaxroll.presets.DEFAULT`.
        heads: the kinetic head counts to fit, each starting from the one
            before (``3 H + 1`` parameters each).
        steps: Adam updates per refined start.

    Returns:
        ``{"kinetic, 1 head": ..., "kinetic, 2 heads": ..., "rollout": ...}``;
        each `TheoryFit` has ``wasserstein`` (W1/(N-1)) and ``num_parameters``.

    Example:
        >>> import jaxroll
        >>> from jaxroll.theory.two_theories import compare_theories
        >>> q = jaxroll.influence(jaxroll.presets.get("mpt-7b", 64))
        >>> fits = compare_theories(q, jaxroll.presets.get("mpt-7b", 64), heads=(1,), steps=10)
        >>> sorted(fits)
        ['kinetic, 1 head', 'rollout']
    """
    q = _check_target(profile)
    results = {}
    previous = None
    for h in sorted(heads):
        if previous is not None and previous[0] != h - 1:
            previous = None
        fit = fit_kinetic(q, h, steps=steps, _previous=None if previous is None else previous[1])
        previous = (h, _raw_kinetic(fit, h))
        results[fit.theory] = fit
    results["rollout"] = fit_rollout(q, geometry, steps=steps)
    return results
