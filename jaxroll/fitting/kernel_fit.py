"""Fitting a relative-position kernel to measured dense kernels, by gradient.

A rotary model's measured mean attention ``A_t`` (a `DenseKernel`, N x N)
exists only at the length it was measured at. A relative-position kernel
``B_t = sum_h w_h rowsoftmax(f_h(i - j))`` (`PowerKernel`: ``f_h(k) =
-m_h k^alpha_h``; ALiBi ``alpha = 1``; `TableKernel`: free ``f_h(k)``) fitted to
it extends the rollout of arXiv 2602.16837, ``R_t = (1 - lambda_t) I +
lambda_t A_t``, to other lengths (the power and ALiBi families to any N).

The loss is the mean row-wise Kullback-Leibler divergence

    L = 1 / (T (N - 1)) sum_t sum_{i >= 1} KL(A_t[i, :] || B_t[i, :])

(row 0 is ``[1]`` for every causal kernel). The layers are independent
problems, ``L = mean_t L_t``: each is minimised on its own (one after the
other under `lax.map`). A global stage comes first (power and ALiBi): the loss
at `GLOBAL_SAMPLES` starts (the standard-ALiBi start and random points of a
box over log slopes, log exponents, diagonals and head weights; one head can
settle on a local optimum that leaves another at weight 0), then the local
loop from the `GLOBAL_STARTS` best, vmapped, keeping the lowest end point. A
head fitted to a weight below `DROPPED_WEIGHT` is reported. The local loop
is that of `jaxroll.fit` (`jaxroll.fitting.optimise`, beside this module:
a compiled `lax.while_loop` that stops when the gradient norm and the
relative change of ``L_t`` fall below tolerances, ``L_t`` reaches the floor,
or `steps` is reached). The default optimiser is L-BFGS (``optax.lbfgs``)
when a layer has at most `jaxroll.fitting.LBFGS_MAX_PARAMETERS` (8) parameters
(power and ALiBi families with H <= 2 heads), else Adam with a cosine decay.
Parameters stay valid throughout: slopes and exponents as exponentials of
free values (steps are then relative changes, which suits slopes spanning
decades), head weights by softmax; content and tables are free.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._checks import check_positive_int
from ..engine.alibi import alibi_slopes
from ..errors import ConfigError
from ..kernel_types import PowerKernel, TableKernel
from ..model import RolloutModel, is_model
from .loop import CONVERGED, LIMIT, checked_tolerances, describe_stop, initial_state, minimise, with_extra_args
from .optimise import GRADIENT_TOLERANCE, LBFGS_MAX_PARAMETERS, LOSS_TOLERANCE, cosine_adam, default_lbfgs

__all__ = ["FAMILIES", "KernelFitResult", "fit_kernel", "kernel_divergence", "GLOBAL_SAMPLES", "GLOBAL_STARTS",
           "DROPPED_WEIGHT"]

FAMILIES = ("alibi", "power", "table")
"""The relative-position families `fit_kernel` fits: ALiBi (``-m k``), power (``-m k^alpha``), a free table ``f(k)``."""


class KernelFitResult(NamedTuple):
    """What `fit_kernel` returns.

    Attributes:
        model: the `RolloutModel` with the fitted relative kernel and the
            measured lambdas.
        losses: ``(steps + 1,)``, the mean over layers of the loss at each
            iterate (a layer that stopped keeps its last value).
        divergence: ``(T,)``, the fitted kernel's mean row KL per layer.
        max_abs_error: ``(T,)``, ``max_ij |A_t - B_t|`` per layer.
        converged: whether every layer passed the stopping test.
        stop_reason: one line: how the layers stopped (the first layer that
            did not converge, else the one that took the most steps).
        steps: ``(T,)``, the steps each layer took.
        optimizer: ``"lbfgs"``, ``"adam"`` or ``"custom"``.
        dropped_heads: ``(layer, head)`` pairs whose fitted weight is below
            `DROPPED_WEIGHT`: the data preferred fewer heads there (also in
            `stop_reason`).
    """

    model: RolloutModel
    losses: np.ndarray
    divergence: np.ndarray
    max_abs_error: np.ndarray
    converged: bool = True
    stop_reason: str = ""
    steps: np.ndarray = np.zeros(0, dtype=np.int64)
    optimizer: str = "custom"
    dropped_heads: list = []


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


def _layer_loss(family, raw, target):
    """``L_t``: the mean row KL of one layer's kernel ``(N, N)`` against its target."""
    n = target.shape[-1]
    fitted = _kernel(family, jax.tree.map(lambda x: x[None], raw), n)
    return kernel_divergence(target[None], jax.vmap(lambda layer: layer.dense(n))(fitted))[0]


GLOBAL_SAMPLES = 256
"""Candidate starts per layer of the global stage (power and ALiBi families): the loss of each is evaluated once."""
GLOBAL_STARTS = 4
"""The best candidates that the local optimiser runs from; the best end point is kept."""
DROPPED_WEIGHT = 1e-3
"""A fitted head weight below this is reported as dropped (`KernelFitResult.dropped_heads`)."""

# The box the global stage samples (heads are exchangeable: each head draws its own point).
_LOG_SLOPE_BOX = (np.log(1e-3), np.log(10.0))
_LOG_EXPONENT_BOX = (np.log(0.2), np.log(3.0))
_DIAGONAL_BOX = (-4.0, 4.0)


def _candidates(family, num_layers, num_heads, n, samples, seed=0):
    """Starts ``(layers, S, ...)``: the deterministic `_initial` first, then `samples - 1` random box points.

    The table family (hundreds of free values) gets its one deterministic start.
    """
    start = _initial(family, num_layers, num_heads, n)
    if family == "table" or samples <= 1:
        return jax.tree.map(lambda x: x[:, None], start)
    rng = np.random.default_rng(seed)
    shape = (num_layers, samples - 1, num_heads)
    drawn = {"slopes": rng.uniform(*_LOG_SLOPE_BOX, shape), "diagonal_scores": rng.uniform(*_DIAGONAL_BOX, shape),
             "head_weights": rng.normal(0.0, 1.0, shape)}
    if family == "power":
        drawn["exponents"] = rng.uniform(*_LOG_EXPONENT_BOX, shape)
    return {key: jnp.concatenate([start[key][:, None], jnp.asarray(drawn[key], start[key].dtype)], axis=1)
            for key in start}


@functools.partial(jax.jit, static_argnames=("family", "optimizer", "max_steps", "starts"))
def _run(target, candidates, tolerances, *, family, optimizer, max_steps, starts):
    """Per layer (one after the other): the loss at every candidate, then the local optimiser from the
    `starts` best (vmapped), keeping the end point of lowest loss."""
    def one_layer(arguments):
        layer_target, layer_candidates = arguments
        losses = jax.vmap(lambda raw: _layer_loss(family, raw, layer_target))(layer_candidates)
        losses = jnp.where(jnp.isfinite(losses), losses, jnp.inf)
        chosen = jax.tree.map(lambda x: x[jnp.argsort(losses)[:starts]], layer_candidates)

        def local(raw):
            state = initial_state(raw, optimizer, target.dtype, max_steps)
            return minimise(lambda r: _layer_loss(family, r, layer_target), optimizer, state, tolerances,
                             max_steps + 1, max_steps)

        states = jax.vmap(local)(chosen)
        best = jnp.argmin(jnp.where(jnp.isfinite(states["best_loss"]), states["best_loss"], jnp.inf))
        return jax.tree.map(lambda x: x[best], states)

    return jax.lax.map(one_layer, (target, candidates))


@functools.lru_cache(maxsize=64)
def _adam(steps: int, learning_rate: float) -> optax.GradientTransformation:
    """`cosine_adam` (to 0 over `steps`) with extra-args support, cached: one object per (steps, rate)."""
    return with_extra_args(cosine_adam(steps, learning_rate))


def fit_kernel(model: RolloutModel, *, family: str = "power", num_heads: int = 1, steps: int = 2000,
               learning_rate: float = 0.1, optimizer: optax.GradientTransformation | None = None,
               gradient_tolerance: float = GRADIENT_TOLERANCE,
               loss_tolerance: float = LOSS_TOLERANCE, samples: int = GLOBAL_SAMPLES, starts: int = GLOBAL_STARTS,
               seed: int = 0, progress: bool = False) -> KernelFitResult:
    """Fit a relative-position kernel to a model's dense kernels (module docstring).

    Args:
        model: a `RolloutModel` whose kernel is a `DenseKernel` (e.g. the
            ``config.yaml`` that ``jaxroll measure`` writes for a rotary model).
        family: ``"power"`` (``-m k^alpha``), ``"alibi"`` (``-m k``) or
            ``"table"`` (free ``f(k)``, k = 1..N-1).
        num_heads: heads H of the fitted mixture per layer.
        steps: the most optimisation steps per layer.
        learning_rate: of the default Adam (cosine decay over `steps`).
        optimizer: any optax transformation (default: module docstring).
        gradient_tolerance: of the stopping test (as in `jaxroll.fitting.fit`).
        loss_tolerance: of the stopping test (as in `jaxroll.fitting.fit`).
        samples: candidate starts per layer in the global stage (power and
            ALiBi; 1: the deterministic start alone, the pre-global behaviour).
        starts: how many of the best candidates the local optimiser runs from.
        seed: of the candidates.
        progress: report the layers as they finish on stderr (`jaxroll.progress`:
            a bar on a terminal, lines elsewhere); the layers then run one
            compiled call each (the same loop and results).

    Returns:
        A `KernelFitResult`; its model keeps the measured lambdas and length.

    Raises:
        ConfigError: a model without dense kernels, an unknown family, a bad count.
    """
    if not is_model(model) or not model.kernel.stores_dense:
        kind = type(getattr(model, "kernel", model)).__name__
        raise ConfigError(f"model: its kernel is {kind}; allowed: a DenseKernel (measured attention)")
    if not model.kernel.causal:
        raise ConfigError("kernel: the dense kernels are not causal; allowed: causal kernels (A[i, j] = 0 for j > i)")
    if family not in FAMILIES:
        raise ConfigError(f"family: got {family!r}; allowed: one of {', '.join(FAMILIES)}")
    num_heads = check_positive_int("num_heads", num_heads)
    steps = check_positive_int("steps", steps)
    samples = check_positive_int("samples", samples)
    starts = check_positive_int("starts", starts)
    if not (isinstance(learning_rate, (int, float)) and np.isfinite(learning_rate) and learning_rate > 0):
        raise ConfigError(f"learning_rate: got {learning_rate!r}; allowed: a number > 0")
    target = jnp.asarray(model.kernel.kernels)
    num_layers, n = target.shape[0], target.shape[-1]
    if n < 2:
        raise ConfigError(f"kernel: N = {n}; allowed: N >= 2 to fit offsets")
    if family == "table" or samples == 1:
        starts = 1
    starts = min(starts, samples)
    candidates = _candidates(family, num_layers, num_heads, n, samples, seed)
    per_layer = sum(int(np.prod(u.shape[2:])) for u in candidates.values())
    name = "custom"
    if optimizer is None:
        name = "lbfgs" if per_layer <= LBFGS_MAX_PARAMETERS else "adam"
        optimizer = default_lbfgs() if name == "lbfgs" else None
    # Cached objects: a repeated fit reuses the compiled loop.
    optimizer = _adam(steps, float(learning_rate)) if optimizer is None else with_extra_args(optimizer)
    tolerances = checked_tolerances(gradient_tolerance, loss_tolerance, target.dtype)
    candidates = jax.tree.map(lambda x: jnp.asarray(x, target.dtype), candidates)
    run = functools.partial(_run, tolerances=tuple(jnp.asarray(x, target.dtype) for x in tolerances), family=family,
                            optimizer=optimizer, max_steps=steps, starts=starts)
    if not progress:
        state = run(target, candidates)
    else:
        from ..progress import Progress

        layers = []
        with Progress(num_layers, label="jaxroll fit-kernel", unit="layers", delay=2.0) as bar:
            for t in range(num_layers):
                layers.append(run(target[t:t + 1], jax.tree.map(lambda x: x[t:t + 1], candidates)))
                bar.update(1)
        state = jax.tree.map(lambda *x: jnp.concatenate(x), *layers)
    raw = state["best_raw"]
    taken = np.asarray(state["step"])
    history = np.asarray(state["history"], dtype=np.float64)[:, :int(taken.max()) + 1]
    # A layer that stopped keeps its last loss, so the mean is over all layers.
    history = np.where(np.isnan(history), np.take_along_axis(history, taken[:, None], axis=1), history)
    codes = np.asarray(state["reason"]).copy()
    # A layer still running at the cap is the step limit's stop, even where the test passed on that very
    # step: under Adam the cosine schedule has decayed the rate to zero there, so a quiet loss says the
    # schedule ended, not that the fit settled; "converged ... after 2000 steps" hid a capped fit.
    capped = (taken >= steps) & np.isin(codes, CONVERGED)
    codes[capped] = LIMIT
    failed = [t for t in range(num_layers) if codes[t] not in CONVERGED]
    shown = failed[0] if failed else int(np.argmax(taken))
    reason = describe_stop(int(codes[shown]), int(taken[shown]), float(state["gradient_norm"][shown]),
                          float(state["change"][shown]), tolerances)
    if capped[shown]:
        reason += "; its stopping test passed only on that last step"
    reason = f"layer {shown}: {reason}" + (f" ({len(failed)} of {num_layers} layers not converged)"
                                           if failed else f" (all {num_layers} layers converged)")
    kernel = _kernel(family, raw, n)
    fitted = jax.vmap(lambda layer: layer.dense(n))(kernel)
    divergence = np.asarray(kernel_divergence(target, fitted), dtype=np.float64)
    error = np.asarray(jnp.max(jnp.abs(fitted - target), axis=(-1, -2)), dtype=np.float64)
    fitted_model = RolloutModel(lambdas=model.lambdas, kernel=jax.tree.map(np.asarray, kernel),
                                sequence_length=model.sequence_length, composition=model.composition)
    weights = np.asarray(kernel.head_weights, dtype=np.float64)
    dropped = [(int(t), int(h)) for t, h in zip(*np.nonzero(weights < DROPPED_WEIGHT))] if num_heads > 1 else []
    if dropped:  # the data preferred fewer heads: said, not hidden
        reason += (f"; {len(dropped)} head(s) fitted to weight < {DROPPED_WEIGHT:g} (layer, head): "
                   + ", ".join(f"({t}, {h})" for t, h in dropped[:8]) + (" ..." if len(dropped) > 8 else ""))
    return KernelFitResult(fitted_model, history.mean(axis=0), divergence, error, converged=not failed,
                           stop_reason=reason, steps=taken.astype(np.int64), optimizer=name, dropped_heads=dropped)
