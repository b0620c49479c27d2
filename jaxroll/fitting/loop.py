"""The compiled loop of one start: optax updates until the stopping test passes.

Shared by the fits of `jaxroll.fitting` (`fit`, `fit_kernel`) and the designs
of `jaxroll.designs`: each start runs one `jax.lax.while_loop` whose condition
is the stopping test (`jaxroll.fitting.optimise`'s docstring states it), and
ends with one of the reason codes below, which `describe_stop` puts in words.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array

# Shared by jaxroll.fitting and jaxroll.designs, not an API of its own: PATIENCE is
# public as jaxroll.fitting.PATIENCE.
__all__: list[str] = []

# Steps in a row with a relative change below LOSS_TOLERANCE before a fit is
# stationary: one quiet step can be a short line-search step; ten in a row
# are a line search that finds no decrease (L-BFGS) or a learning rate that
# has decayed to nothing (Adam with the cosine schedule).
PATIENCE = 10
"""Quiet steps in a row (relative loss change below `LOSS_TOLERANCE`) after which a fit is stationary and stops."""

# Reason codes of the loop (`describe_stop` gives their text); SKIPPED marks a restart
# not run because an earlier one reached the loss floor.
RUNNING, GRADIENT, FLOOR, STATIONARY, LIMIT, NOT_FINITE, SKIPPED = range(7)
CONVERGED = (GRADIENT, FLOOR, STATIONARY)


@functools.lru_cache(maxsize=64)
def with_extra_args(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optax.with_extra_args_support`, cached: the wrapper is part of the jit
    static problem, so the same optimizer object must give the same wrapper
    for a second fit to reuse the compiled loop (L-BFGS compiles for ~10 s)."""
    return optax.with_extra_args_support(optimizer)


def _has_line_search_state(state) -> bool:
    """Whether the optimiser keeps the value and gradient at the accepted point
    (optax's line searches do), so the loop need not evaluate them again."""
    try:
        return optax.tree_utils.tree_get(state, "value") is not None and \
            optax.tree_utils.tree_get(state, "grad") is not None
    except (KeyError, ValueError):
        return False


def _max_abs(tree) -> Array:
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in jax.tree.leaves(tree)]))


def initial_state(raw, optimizer: optax.GradientTransformation, dtype, max_steps: int) -> dict:
    """The loop state of one start `raw` (unbatched): nothing evaluated yet."""
    inf = jnp.asarray(jnp.inf, dtype=dtype)
    zero = jnp.asarray(0, jnp.int32)
    return dict(raw=raw, opt_state=optimizer.init(raw), best_raw=raw, best_loss=inf, step=zero, previous=inf,
                quiet=zero, reason=zero, history=jnp.full((max_steps + 1,), jnp.nan, dtype=dtype),
                gradient_norm=inf, change=inf)


def minimise(objective: Callable, optimizer: optax.GradientTransformation, state: dict, tolerances, limit,
              max_steps: int) -> dict:
    """Run one start until the stopping test passes (module docstring), the step
    count reaches `limit` (traced), or `max_steps`; pure, for use under jit.

    One `lax.while_loop`; each iteration evaluates ``f_k, g_k`` once (taken
    from a line search's state when the optimiser keeps them), records
    ``f_k``, tests, and applies one optax update only if the test failed.
    """
    gradient_tolerance, loss_tolerance, floor = tolerances

    def running(state):
        return (state["reason"] == RUNNING) & (state["step"] < limit)

    def body(state):
        raw, opt_state, step = state["raw"], state["opt_state"], state["step"]
        if _has_line_search_state(opt_state):
            value, grad = optax.value_and_grad_from_state(objective)(raw, state=opt_state)
        else:
            value, grad = jax.value_and_grad(objective)(raw)
        # Keep the best point seen: the loss is not monotone under Adam.
        better = value < state["best_loss"]
        best_raw = jax.tree.map(lambda b, r: jnp.where(better, r, b), state["best_raw"], raw)
        best_loss = jnp.where(better, value, state["best_loss"])
        previous = state["previous"]
        scale = jnp.maximum(jnp.abs(previous), jnp.abs(value))
        change = jnp.where(step == 0, jnp.inf, jnp.abs(previous - value) / jnp.maximum(scale, 1e-300))
        quiet = jnp.where(change <= loss_tolerance, state["quiet"] + 1, 0).astype(jnp.int32)
        gradient_norm = _max_abs(grad)
        reason = jnp.select(
            [~jnp.isfinite(value), value <= floor,
             (gradient_norm <= gradient_tolerance) & (change <= loss_tolerance),
             quiet >= PATIENCE, step >= max_steps],
            [NOT_FINITE, FLOOR, GRADIENT, STATIONARY, LIMIT], RUNNING).astype(jnp.int32)

        def update(raw, opt_state):
            # value, grad and value_fn serve optimisers with a line search
            # (optax.lbfgs); the others ignore them.
            updates, opt_state = optimizer.update(grad, opt_state, raw, value=value, grad=grad,
                                                  value_fn=objective)
            return optax.apply_updates(raw, updates), opt_state

        raw, opt_state = jax.lax.cond(reason == RUNNING, update, lambda r, s: (r, s), raw, opt_state)
        return state | dict(
            raw=raw, opt_state=opt_state, best_raw=best_raw, best_loss=best_loss,
            step=jnp.where(reason == RUNNING, step + 1, step).astype(jnp.int32), previous=value, quiet=quiet,
            reason=reason, history=state["history"].at[step].set(value), gradient_norm=gradient_norm,
            change=change)

    return jax.lax.while_loop(running, body, state)



def checked_tolerances(gradient_tolerance, loss_tolerance, dtype) -> tuple[float, float, float]:
    """(gradient, loss change, loss floor), each at least 10 eps of `dtype`."""
    gradient_tolerance = _check_tolerance("gradient_tolerance", gradient_tolerance)
    loss_tolerance = _check_tolerance("loss_tolerance", loss_tolerance)
    eps = float(jnp.finfo(dtype).eps)
    return max(gradient_tolerance, 10 * eps), max(loss_tolerance, 10 * eps), 10 * eps



def describe_stop(code: int, step: int, gradient_norm: float, change: float, tolerances) -> str:
    """One line on how a start stopped: its reason `code`, the measured values and the tolerances they met."""
    gradient_tolerance, loss_tolerance, floor = tolerances
    measured = f"gradient norm {gradient_norm:.2g}, relative loss change {change:.2g}"
    return {
        GRADIENT: f"converged: gradient norm {gradient_norm:.2g} <= {gradient_tolerance:.2g} and relative "
                   f"loss change {change:.2g} <= {loss_tolerance:.2g} after {step} steps",
        FLOOR: f"converged: the loss reached the floor {floor:.2g} (the target is reproduced to rounding) "
                f"after {step} steps",
        STATIONARY: f"converged: the loss changed by less than {loss_tolerance:.2g} (relative) for "
                     f"{PATIENCE} steps in a row after {step} steps ({measured})",
        LIMIT: f"not converged: stopped at the step limit {step} ({measured}; tolerances "
                f"{gradient_tolerance:.2g} and {loss_tolerance:.2g})",
        NOT_FINITE: f"not converged: the loss is not finite after {step} steps",
    }.get(code, f"not converged: stopped after {step} steps")


def _check_tolerance(field: str, value) -> float:
    from ..errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not value >= 0 \
            or not math.isfinite(value):
        raise ConfigError(f"{field}: got {value!r}; allowed: a finite number >= 0")
    return float(value)


