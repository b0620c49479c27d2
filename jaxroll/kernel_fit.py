"""Fitting a relative-position kernel to measured dense kernels, by gradient.

A rotary model's measured mean attention ``A_t`` (a `DenseKernel`, N x N)
exists only at the length it was measured at. A relative-position kernel
``B_t = sum_h w_h rowsoftmax(f_h(i - j))`` (`PowerKernel`: ``f_h(k) =
-m_h k^alpha_h``; ALiBi ``alpha = 1``; `TableKernel`: free ``f_h(k)``) fitted to
it extends the rollout of arXiv 2602.16837, ``R_t = (1 - lambda_t) I +
lambda_t A_t``, to other lengths (the power and ALiBi families to any N).

The loss is the mean row-wise Kullback-Leibler divergence

    L = 1 / (T (N - 1)) sum_t sum_{i >= 1} KL(A_t[i, :] || B_t[i, :])

(row 0 is ``[1]`` for every causal kernel), minimised with optax Adam in one
compiled `lax.scan`, as `jaxroll.fit` does for lambdas. Parameters stay valid
throughout: slopes and exponents as exponentials of free values (Adam's
steps are then relative changes, which suits slopes spanning decades), head
weights by softmax;
content and tables are free.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._checks import check_positive_int
from .errors import ConfigError
from .kernel_types import DenseKernel, PowerKernel, TableKernel
from .kernels import alibi_slopes
from .model import KernelRolloutModel

__all__ = ["FAMILIES", "KernelFitResult", "fit_kernel", "kernel_divergence"]

FAMILIES = ("alibi", "power", "table")
"""The relative-position families `fit_kernel` fits: ALiBi (``-m k``), power (``-m k^alpha``), a free table ``f(k)``."""


class KernelFitResult(NamedTuple):
    """What `fit_kernel` returns.

    Attributes:
        model: the `KernelRolloutModel` with the fitted relative kernel and the
            measured lambdas.
        losses: ``(steps,)``, the loss before each step.
        divergence: ``(T,)``, the fitted kernel's mean row KL per layer.
        max_abs_error: ``(T,)``, ``max_ij |A_t - B_t|`` per layer.
    """

    model: KernelRolloutModel
    losses: np.ndarray
    divergence: np.ndarray
    max_abs_error: np.ndarray


def kernel_divergence(target, fitted):
    """Per layer ``1/(N-1) sum_{i>=1} KL(target[i] || fitted[i])``, arrays ``(T, N, N)`` -> ``(T,)``."""
    tiny = jnp.finfo(fitted.dtype).tiny
    terms = jnp.where(target > 0, target * (jnp.log(jnp.maximum(target, tiny)) - jnp.log(jnp.maximum(fitted, tiny))),
                      0.0)
    n = target.shape[-1]
    return jnp.sum(terms[:, 1:, :], axis=(-1, -2)) / max(n - 1, 1)


def _kernel(family, raw, n):
    """The relative kernel of the unconstrained parameters `raw`."""
    weights = jax.nn.softmax(raw["head_weights"], axis=-1)
    if family == "table":
        return TableKernel(raw["offset_scores"], raw["diagonal_scores"], weights)
    exponents = jnp.exp(raw["exponents"]) if family == "power" else jnp.ones_like(raw["slopes"])
    return PowerKernel(jnp.exp(raw["slopes"]), exponents, raw["diagonal_scores"], weights)


def _initial(family, num_layers, num_heads, n):
    # Standard ALiBi slopes spread the heads apart (identical heads would get identical gradients).
    slopes = np.broadcast_to(alibi_slopes(num_heads), (num_layers, num_heads))
    raw = {"diagonal_scores": jnp.zeros((num_layers, num_heads)),
           "head_weights": jnp.zeros((num_layers, num_heads))}
    if family == "table":
        return raw | {"offset_scores": jnp.zeros((num_layers, num_heads, n - 1))}
    raw["slopes"] = jnp.asarray(np.log(slopes))
    if family == "power":
        raw["exponents"] = jnp.zeros((num_layers, num_heads))
    return raw


@functools.partial(jax.jit, static_argnames=("family", "steps", "learning_rate"))
def _run(target, raw, family, steps, learning_rate):
    n = target.shape[-1]
    optimiser = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    def loss(raw):
        kernel = _kernel(family, raw, n)
        fitted = jax.vmap(lambda layer: layer.dense(n))(kernel)
        return jnp.mean(kernel_divergence(target, fitted))

    def step(carry, _):
        raw, state = carry
        value, gradient = jax.value_and_grad(loss)(raw)
        updates, state = optimiser.update(gradient, state, raw)
        return (optax.apply_updates(raw, updates), state), value

    (raw, _), losses = jax.lax.scan(step, (raw, optimiser.init(raw)), None, length=steps)
    return raw, losses


def fit_kernel(model: KernelRolloutModel, *, family: str = "power", num_heads: int = 1, steps: int = 2000,
               learning_rate: float = 0.1) -> KernelFitResult:
    """Fit a relative-position kernel to a model's dense kernels (module docstring).

    Args:
        model: a `KernelRolloutModel` whose kernel is a `DenseKernel` (e.g. the
            ``config.yaml`` that ``jaxroll measure`` writes for a rotary model).
        family: ``"power"`` (``-m k^alpha``), ``"alibi"`` (``-m k``) or
            ``"table"`` (free ``f(k)``, k = 1..N-1).
        num_heads: heads H of the fitted mixture per layer.
        steps: Adam steps (cosine decay of the learning rate).
        learning_rate: Adam's initial learning rate.

    Returns:
        A `KernelFitResult`; its model keeps the measured lambdas and length.

    Raises:
        ConfigError: a model without dense kernels, an unknown family, a bad count.
    """
    if not isinstance(model, KernelRolloutModel) or not isinstance(model.kernel, DenseKernel):
        kind = type(getattr(model, "kernel", model)).__name__
        raise ConfigError(f"model: its kernel is {kind}; allowed: a DenseKernel (measured attention)")
    if not model.kernel.causal:
        raise ConfigError("kernel: the dense kernels are not causal; allowed: causal kernels (A[i, j] = 0 for j > i)")
    if family not in FAMILIES:
        raise ConfigError(f"family: got {family!r}; allowed: one of {', '.join(FAMILIES)}")
    num_heads = check_positive_int("num_heads", num_heads)
    steps = check_positive_int("steps", steps)
    if not (isinstance(learning_rate, (int, float)) and np.isfinite(learning_rate) and learning_rate > 0):
        raise ConfigError(f"learning_rate: got {learning_rate!r}; allowed: a number > 0")
    target = jnp.asarray(model.kernel.kernels)
    num_layers, n = target.shape[0], target.shape[-1]
    if n < 2:
        raise ConfigError(f"kernel: N = {n}; allowed: N >= 2 to fit offsets")
    raw, losses = _run(target, _initial(family, num_layers, num_heads, n), family, steps, float(learning_rate))
    kernel = _kernel(family, raw, n)
    fitted = jax.vmap(lambda layer: layer.dense(n))(kernel)
    divergence = np.asarray(kernel_divergence(target, fitted), dtype=np.float64)
    error = np.asarray(jnp.max(jnp.abs(fitted - target), axis=(-1, -2)), dtype=np.float64)
    fitted_model = KernelRolloutModel(lambdas=model.lambdas, kernel=jax.tree.map(np.asarray, kernel),
                                      sequence_length=model.sequence_length)
    return KernelFitResult(fitted_model, np.asarray(losses, dtype=np.float64), divergence, error)
