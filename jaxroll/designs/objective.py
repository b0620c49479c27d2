"""What a design minimises: a distance to a target profile, or a shape goal under a KL budget
on every layer's attention kernel, as pure functions of the unconstrained point.

With ``p(u)`` the influence profile of the changed model, ``p^T = e_{n-1}^T R'_T ... R'_1``,
``R'_t = (1 - lambda'_t) I + lambda'_t A'_t`` (arXiv 2602.16837), the objective is one of

- a target ``q``: ``L(u) = loss(p(u), q)`` (``W1 / (n - 1)``, ``KL(q || p)`` or squared L2,
  `jaxroll.fitting.LOSSES`);
- a shape goal: ``f(u) = 1 - middle_mass(p(u))`` (raise the middle) or
  ``f(u) = u_index(p(u)) + 1`` (flatten the U), both >= 0 so that the fitting loop's loss floor
  keeps its meaning, subject to the budget ``K_t(u) <= b`` for every layer t, where

      K_t(u) = (1 / n) sum_i KL(A'_t[i, :] || A_t[i, :])
             = (1 / n) sum_i sum_j A'_t[i, j] log(A'_t[i, j] / A_t[i, j])

  is the mean over rows of the KL divergence of the changed kernel from the original, both dense
  at length n. Without the budget, "read every token alike" would be a trivial answer.

The budget enters through the augmented Lagrangian of Powell, Hestenes and Rockafellar
(Nocedal & Wright 2006, section 17.4): with ``g_t = K_t / b - 1`` (dimensionless) and
multipliers ``mu_t >= 0``,

    L_rho(u; mu) = f(u) + (rho / 2) sum_t max(0, g_t(u) + mu_t / rho)^2,

minimised in u for fixed ``mu, rho`` (the constant ``-mu_t^2 / (2 rho)`` of the textbook form is
dropped, so ``L_rho >= 0``), then ``mu_t <- max(0, mu_t + rho g_t)``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from .. import metrics
from ..interventions import apply_all, intervention_type
from ..model import RolloutModel, layer_kernels
from ..rollout import influence
from .parameters import _Parameters

__all__ = ["GOALS", "kernel_kl"]

GOALS = ("middle_mass", "u_index")
"""The shape goals of a design: raise the middle mass, or lower the U-index (`jaxroll.metrics`)."""

def kernel_parameters(names) -> frozenset:
    """The parameters among `names` whose interventions change the kernels A_t (tau, slope_scale, kappa, as
    their types declare); gamma changes lambda_t only."""
    return frozenset(name for name in names if getattr(intervention_type(name), "changes", None) == "kernel")


def _mean_row_kl(changed, log_reference):
    """``(1/n) sum_i sum_j A'[i, j] (log A'[i, j] - log A[i, j])`` per layer; ``0 log 0 = 0``.

    The double `where` keeps the gradient finite (0) where ``A' = 0`` (masked entries).
    """
    positive = changed > 0
    safe = jnp.where(positive, changed, 1.0)
    terms = jnp.where(positive, safe * (jnp.log(safe) - log_reference), 0.0)
    return jnp.mean(jnp.sum(terms, axis=-1), axis=-1)


def offset_scores(model: RolloutModel, n: int):
    """``(f, w)``: the scores ``f[t, h, k]`` of offsets k = 0..n-1 (``f[., ., 0]`` the diagonal) and the
    normalised head weights ``(T, H)`` of a causal kernel that declares them
    (`AbstractKernel.scores_by_offset`: ALiBi + content, relative kernels); None for any other.

    For ALiBi ``f_h(k) = (-m_h k + d_h [k = 0]) / tau_0`` (the base score cancels in the softmax).
    """
    kernel = model.kernel
    if kernel.mask != "causal":
        return None
    return kernel.scores_by_offset(n)


# Largest exponent max_k f_h(k) - log Z_h(i) the factorised kernel takes (below float64's overflow at
# 709 with room for the head weights); beyond it the layer kernels are formed densely instead.
_FACTOR_EXPONENT = 600.0


def _offset_kernels(scores, weights):
    """``B[t, i, k] = A_t[i, i - k]`` for k <= i (0 beyond): each row of the kernel by offset, as a matmul.

    ``A_t[i, i - k] = sum_h w_h e^{f_h(k)} / Z_h(i)`` with ``Z_h(i) = sum_{k <= i} e^{f_h(k)}`` factorises
    into ``C[i, h] = w_h e^{M_h - log Z_h(i)}`` times ``E[h, k] = e^{f_h(k) - M_h}``, ``M_h = max_k f_h(k)``:
    O(T H n) exponentials and one ``(n, H) x (H, n)`` product per layer, where the dense kernels cost
    O(T H n^2) exponentials. Also returns the largest exponent ``M_h - log Z_h(i)`` (see `_FACTOR_EXPONENT`).
    """
    peak = jnp.max(scores, axis=-1, keepdims=True)
    log_normaliser = jax.lax.cumlogsumexp(scores, axis=scores.ndim - 1)
    exponent = peak - log_normaliser
    rows = weights[..., None] * jnp.exp(jnp.minimum(exponent, _FACTOR_EXPONENT))
    kernels = jnp.einsum("thi,thk->tik", rows, jnp.exp(scores - peak))
    n = scores.shape[-1]
    return jnp.where(jnp.arange(n)[None, :] <= jnp.arange(n)[:, None], kernels, 0.0), jnp.max(exponent)


def by_offset(kernels):
    """``(T, n, n)`` kernels (``A[i, j]``) as ``B[t, i, k] = A[t, i, i - k]``, k <= i (0 beyond)."""
    n = kernels.shape[-1]
    rows, offsets = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    gathered = jnp.take_along_axis(kernels, jnp.broadcast_to(jnp.maximum(rows - offsets, 0), (n, n))[None], axis=-1)
    return jnp.where(offsets <= rows, gathered, 0.0)


def changed_kernels_by_offset(changed: RolloutModel, n: int):
    """The changed model's kernels by offset (`by_offset`): factorised (`_offset_kernels`) unless an
    exponent would overflow, then dense; the branch is taken at run time (`lax.cond`)."""
    scores, weights = offset_scores(changed, n)
    factorised, exponent = _offset_kernels(scores, weights)
    return jax.lax.cond(exponent <= _FACTOR_EXPONENT, lambda: factorised,
                        lambda: by_offset(layer_kernels(changed, n)))


def _log_kernels(kernels):
    # A kernel entry that underflowed to 0 (float32 at long distances) is read as the smallest
    # normal number: KL stays finite, and an intervention that gives it weight still pays for it.
    return jnp.log(jnp.maximum(kernels, jnp.finfo(kernels.dtype).tiny))


def kernel_kl(model: RolloutModel, changed: RolloutModel, n: int | None = None):
    """``K_t = (1/n) sum_i KL(A'_t[i, :] || A_t[i, :])`` for every layer t, ``(T,)``, in nats.

    `model` holds the original kernels ``A_t``, `changed` the changed ones ``A'_t`` (for instance
    ``interventions.apply_all(model, ...)``); both dense at length `n` (default
    ``model.sequence_length``); ``A[i, j]`` is the weight with which token i reads token j.
    Differentiable in the arrays of `changed`.
    """
    return _kernel_kl(model, changed, model.sequence_length if n is None else n)


@functools.partial(jax.jit, static_argnames=("n",))
def _kernel_kl(model, changed, n: int):
    return _mean_row_kl(layer_kernels(changed, n), _log_kernels(layer_kernels(model, n)))


@dataclasses.dataclass(frozen=True)
class _Problem:
    """Everything static about one design: a jit static, so outer iterations reuse one compiled loop."""

    parameters: _Parameters
    goal: str | None          # None: a target objective
    loss: Callable | None
    n: int
    method: str
    fraction: float
    budgeted: bool            # a shape goal whose free parameters change the kernels
    factorised: bool          # the kernels are causal offset kernels: their KL by `_offset_kernels`
    optimizer: optax.GradientTransformation


def changed_model(raw, model: RolloutModel, problem: _Problem) -> RolloutModel:
    """The model with the interventions of the unconstrained point `raw` applied."""
    parameters = problem.parameters
    return apply_all(model, parameters.interventions(parameters.values(raw)))


def profile_and_kl(raw, data: dict, problem: _Problem):
    """``(p(u), K(u))``: the changed model's profile ``(n,)`` and its layers' kernel KL ``(T,)``."""
    changed = changed_model(raw, data["model"], problem)
    profile = influence(changed, problem.n, method=problem.method)
    if not problem.budgeted:
        return profile, jnp.zeros(data["model"].num_layers, profile.dtype)
    kernels = changed_kernels_by_offset(changed, problem.n) if problem.factorised else \
        layer_kernels(changed, problem.n)
    # By offset or by column, each row holds the same entries: the row sums of the KL are the same.
    return profile, _mean_row_kl(kernels, data["log_reference"])


def goal_value(profile, data: dict, problem: _Problem):
    """The unpenalised objective: the loss to the target, ``1 - middle_mass`` or ``u_index + 1``."""
    if problem.goal is None:
        return problem.loss(profile, data["target"])
    if problem.goal == "middle_mass":
        return 1.0 - metrics.middle_mass(profile, problem.fraction)
    return metrics.u_index(profile, problem.fraction) + 1.0


def objective(raw, data: dict, problem: _Problem):
    """``L_rho(u; mu)`` (module docstring); the plain loss for a target."""
    profile, kl = profile_and_kl(raw, data, problem)
    value = goal_value(profile, data, problem)
    if not problem.budgeted:
        return value
    excess = kl / data["budget"] - 1.0
    rho = data["penalty"]
    return value + 0.5 * rho * jnp.sum(jnp.maximum(0.0, excess + data["multipliers"] / rho) ** 2)
