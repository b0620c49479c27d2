"""The local stage: optax updates until the fit converges, in compiled loops.

Every restart runs a `jax.lax.while_loop` whose condition is the stopping
test, so a fit stops on the device when it has converged, without a host
round trip per step; the restarts run one after the other under `lax.scan`
(each stops on its own, and the later ones are skipped once one of them has
reproduced the target to the loss floor).

Stopping (evaluated at every iterate ``u_k``, with ``f_k = L(u_k)``,
``g_k = grad L(u_k)`` in the unconstrained coordinates, where the bounds of
the model are built in, so ``g_k`` is the projected gradient of the bounded
problem):

- ``gradient``: ``max_i |g_k,i| <= gradient_tolerance`` and
  ``|f_{k-1} - f_k| <= loss_tolerance * max(|f_{k-1}|, |f_k|)``;
- ``floor``: ``f_k <= 10 eps`` of the dtype (the target is reproduced to
  rounding; W1 has a kink there, so the gradient does not vanish);
- ``stationary``: the relative change stayed below ``loss_tolerance`` for
  `PATIENCE` consecutive steps (a line search that finds no decrease: a kink
  of the W1 loss at a minimum, or a valley flatter than the dtype resolves);
- otherwise the fit stops at ``steps`` (not converged), or when the loss is
  not finite (not converged).

A stop by one of the three tests is reported as converged only when the
answer is not degenerate: a fit that ends with a loss above its start's, or
with all but one of its free lambdas within `BOUND_TOLERANCE` of 0 or 1 (a
power-decay schedule whose beta ran off to infinity: one lambda left, the
rest 0), has stopped where the loss is flat, not at a minimum inside the
model's range; `FitResult.warnings` says which, in one line.

Tolerances below the dtype's resolution are raised to ``10 eps``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array

from .. import metrics
from .._checks import check_positive_int
from ..model import RolloutModel
from ..optimisers import cosine_adam
from ..rollout import influence
from .design import GLOBAL_DIMENSIONS, GLOBAL_POINTS, _starting_points
from .identification import Identifiability, _report
from .loop import (CONVERGED, FLOOR, PATIENCE, RUNNING, SKIPPED, checked_tolerances, describe_stop, initial_state,
                   minimise, with_extra_args)
from .report import BOUND_TOLERANCE
from .parametrisation import model_array
from .problem import _as_numpy_model, check_non_negative_int, _compare, _objective, _Problem, _setup

__all__ = ["GRADIENT_TOLERANCE", "LOSS_TOLERANCE", "PATIENCE", "LBFGS_MAX_PARAMETERS", "LBFGS_RESTARTS",
           "FitResult", "fit", "cosine_adam", "default_optimizer", "default_lbfgs"]

# The stopping test (module docstring). The free coordinates are logits and
# softplus arguments, O(1) per unit of effect, and the losses are O(1e-3..1)
# at a start: a gradient of 1e-8 per coordinate changes the loss by less than
# 1e-8 per unit step, beyond what a profile measured on text determines.
GRADIENT_TOLERANCE = 1e-8
"""Default gradient tolerance: a fit has converged when the norm of the (projected) gradient, in unconstrained units, is below it."""
# Relative change of the loss from one step to the next: at 1e-10 a float64
# fit has converged to ~5 significant digits of the parameters along the
# weakest direction seen in the power-decay problems (curvature ratio ~1e-5).
LOSS_TOLERANCE = 1e-10
"""Default loss tolerance: relative change of the loss per step below which a step counts as quiet."""
# L-BFGS (optax.lbfgs, zoom line search) is the default local optimiser up
# to this many free parameters: the power-decay, constant, temperature and
# slope-scale parametrisations and their combinations, the problems the
# global design (GLOBAL_DIMENSIONS) serves. There the loss is a smooth
# narrow curved valley (curvature ratio 1e-4..1e-6) that Adam crosses in
# thousands of steps and L-BFGS in tens. Above it (free per-layer schedules
# and content: 2T parameters, many of them near-null directions, see
# Identifiability) Adam's normalised steps make steady progress where a
# quasi-Newton model of a nearly singular Hessian does not.
LBFGS_MAX_PARAMETERS = GLOBAL_DIMENSIONS
"""Up to this many free parameters the default local optimiser is L-BFGS (``optax.lbfgs``); above it, Adam with a cosine decay."""
# Starting points refined by the default L-BFGS: the best three of the design
# (and the model's own point), so one spurious basin does not decide the fit.
LBFGS_RESTARTS = 3
"""Starting points the default L-BFGS refines: the best design points (and the model's own point)."""



class FitResult(eqx.Module):
    """The outcome of `fit`.

    Attributes:
        model: the fitted `RolloutModel` (NumPy float64 arrays, checked by
            `RolloutModel.create`, ``sequence_length = n``): `save_config`
            writes it and ``jaxroll rollout`` reads it back.
        profile: ``(n,)``, the fitted model's influence profile.
        losses: ``(steps + 1,)``, the loss at every iterate ``u_0 .. u_steps``
            of the returned restart (``u_0`` its starting point).
        initial_loss: the loss of the model that was passed in.
        final_loss: the loss of `model`, the best point seen over all steps
            and restarts. It is at most `initial_loss` whenever the
            parametrisation can represent the starting model (not so for a
            power-decay fit started from a schedule of another shape, or
            per-layer content started from per-head content).
        metrics: ``metrics.compare(profile, target)``, a `metrics.Comparison`.
        steps: the optimisation steps the returned restart took (at most
            `max_steps`).
        restart_losses: ``(restarts,)``, the best loss of each restart (inf
            for a restart skipped because an earlier one reached the floor).
        schedule_parameters: the fitted ``{"lambda_0", "beta"}`` of a
            power-decay schedule, ``{"lambda_const"}`` of a constant one,
            empty otherwise.
        search_points: the number of design points of the global stage
            (0 when it did not run).
        identifiability: an `Identifiability` report at the solution, or
            None (more than `IDENTIFIABILITY_MAX_PARAMETERS` free
            parameters, or nothing was fitted).
        converged: whether the returned restart passed the stopping test
            (module docstring of `jaxroll.fitting.optimise`) before `max_steps`
            and the answer is not degenerate (`warnings` is empty).
        stop_reason: why it stopped, one line (e.g. ``converged: gradient
            norm 3e-09 <= 1e-08 and relative loss change 0 <= 1e-10``).
        max_steps: the step limit it ran under (`fit`'s ``steps``).
        optimizer: ``"lbfgs"`` or ``"adam"`` for the defaults, ``"custom"``
            for a transformation that was passed.
        restart_steps: ``(restarts,)``, the steps each restart took (0 for a
            skipped one); `steps` is that of the returned restart, and a
            progress count follows the longest, ``max(restart_steps)``.
        warnings: one line each when the answer is degenerate even though the
            stopping test passed: the fit ended worse than its start, or all
            but one of the free lambdas ended within `BOUND_TOLERANCE` of 0
            or 1. Then `converged` is False and `stop_reason` says why.
    """

    model: RolloutModel
    profile: np.ndarray
    losses: np.ndarray
    initial_loss: float
    final_loss: float
    metrics: metrics.Comparison
    steps: int
    restart_losses: np.ndarray
    schedule_parameters: dict
    search_points: int = 0
    identifiability: Identifiability | None = None
    converged: bool = True
    stop_reason: str = ""
    max_steps: int = 0
    optimizer: str = "custom"
    restart_steps: np.ndarray = eqx.field(default_factory=lambda: np.zeros(0, np.int64))
    warnings: tuple[str, ...] = ()

    @property
    def schedule_config(self) -> dict | None:
        """The ``lambda_schedule_config`` of a power-decay or constant fit (what
        ``save_config(..., schedule=)`` writes), None for a free schedule."""
        parameters = self.schedule_parameters
        if "beta" in parameters:
            return {"schedule_type": "power_decay", **parameters}
        if "lambda_const" in parameters:
            return {"schedule_type": "constant", **parameters}
        return None


@functools.lru_cache(maxsize=64)
def default_optimizer(steps: int, learning_rate: float = 0.05) -> optax.GradientTransformation:
    """`cosine_adam`: Adam with a cosine decay of the learning rate from 0.05 to 0 over `steps`.

    The default for more than `LBFGS_MAX_PARAMETERS` free parameters. The
    free vectors are logits (lambda, head weights), softplus arguments
    (slopes, temperature) or content in logit units, all O(1) per unit of
    effect, so one learning rate serves them all. Cached, so that the same
    `steps` gives the same object and a repeated fit hits the jit cache.
    """
    return cosine_adam(steps, learning_rate)


@functools.lru_cache(maxsize=1)
def default_lbfgs() -> optax.GradientTransformation:
    """``optax.lbfgs()`` (memory 10, zoom line search with the strong Wolfe
    conditions), one cached object so that fits share the compiled loop.

    The default for at most `LBFGS_MAX_PARAMETERS` free parameters."""
    return optax.lbfgs()


@functools.partial(jax.jit, static_argnames=("problem", "max_steps"))
def _run_restarts(carry, fixed, target, tolerances, limit, *, problem: _Problem, max_steps: int):
    """Advance every restart (leading axis of `carry`) with `minimise`.

    The restarts follow each other under `lax.scan` (each stops on its own,
    and no work is spent on finished ones, as it would be under vmap),
    carrying the best loss so far: a restart after one that reached the
    floor is skipped.
    """
    def objective(raw):
        return _objective(raw, fixed, target, problem)

    def one_restart(best_so_far, restart):
        skip = (best_so_far <= tolerances[2]) & (restart["reason"] == RUNNING)
        restart = restart | dict(reason=jnp.where(skip, SKIPPED, restart["reason"]).astype(jnp.int32))
        restart = minimise(objective, problem.optimizer, restart, tolerances, limit, max_steps)
        return jnp.minimum(best_so_far, restart["best_loss"]), restart

    # The best loss of earlier rounds too (`_optimise` calls this in rounds): once any restart has
    # reached the floor, the restarts still running are skipped.
    _, carry = jax.lax.scan(one_restart, jnp.min(carry["best_loss"]).astype(target.dtype), carry)
    return carry


@functools.partial(jax.jit, static_argnames=("problem", "max_steps"))
def _initial_carry(raw, target, *, problem: _Problem, max_steps: int):
    return jax.vmap(lambda r: initial_state(r, problem.optimizer, target.dtype, max_steps))(raw)


def _optimise(carry, fixed, target, tolerances, problem: _Problem, steps: int, progress):
    """All restarts in rounds of about ``steps / 50`` steps (the same compiled loop,
    bounded by a traced step limit): a restart that stalls away from the optimum
    does not run to the step limit before the next one, which may reach the
    floor in a few steps, starts. `progress` (a `jaxroll.progress.Progress` over
    `steps`, or None) counts the steps of the longest restart; `fit` closes it."""
    chunk = max(1, math.ceil(steps / 50))
    limit = 0
    while limit <= steps and np.any(np.asarray(carry["reason"]) == RUNNING):
        limit = min(limit + chunk, steps + 1)
        carry = _run_restarts(carry, fixed, target, tolerances, limit, problem=problem, max_steps=steps)
        if progress is not None:
            done = min(int(np.max(np.asarray(carry["step"]))), steps)
            progress.set_postfix(loss=f"{float(jnp.min(carry['best_loss'])):.3g}")
            progress.update(done - progress.done)
    return carry


def fit(
    model: RolloutModel,
    target,
    *,
    fit: Sequence[str] | str = ("lambdas",),
    schedule: str = "free",
    content: str = "per_layer",
    loss: str | Callable = "wasserstein",
    optimizer: optax.GradientTransformation | None = None,
    steps: int = 2000,
    restarts: int | None = None,
    search: int | None = None,
    key: Array | None = None,
    n: int | None = None,
    method: str = "auto",
    progress=False,
    gradient_tolerance: float = GRADIENT_TOLERANCE,
    loss_tolerance: float = LOSS_TOLERANCE,
) -> FitResult:
    """Fit the free arrays of `model` so that its influence profile matches `target`.

    Minimises ``L(theta) = loss(p_T(theta), q)`` where
    ``p_T(j) = (e_{n-1}^T R_T ... R_1)_j``, ``R_t = (1 - lambda_t) I + lambda_t A_t``
    (arXiv 2602.16837) and ``theta`` are the arrays named in `fit`, each
    through the parametrisation of `jaxroll.fit`'s docstring (so every iterate
    is a valid model); the other arrays keep their values in `model`. Losses:

    - ``"wasserstein"``: ``W1(p, q) / (n - 1) = sum_j |F_p(j) - F_q(j)| / (n - 1)``
      (`jaxroll.metrics.wasserstein`);
    - ``"kl"``: ``KL(q || p) = sum_j q_j log(q_j / p_j)`` (`jaxroll.metrics.kl`);
    - ``"l2"``: ``sum_j (p_j - q_j)^2``;
    - a callable ``(p, q) -> scalar``, differentiable in `p`.

    Two stages:

    1. Global: the model's own point and `search` points of a design over
       the parameter box `BOX` (Halton for up to `GLOBAL_DIMENSIONS` free
       parameters, uniform draws from `key` beyond) are scored in one
       jit-compiled call; the best `restarts` of them go on. By default
       ``search = GLOBAL_POINTS`` (128) when there are at most
       `GLOBAL_DIMENSIONS` (8) free parameters and 0 otherwise. With
       ``search = 0`` the r = `restarts` starting points are the model's
       own and r - 1 draws over the box, all refined.
    2. Local: optax updates from each starting point until the stopping test
       of `jaxroll.fitting.optimise` passes (gradient norm and relative loss
       change below `gradient_tolerance` and `loss_tolerance`, the loss at
       its floor, or a stationary loss) or `steps` is reached. The default
       optimiser is `default_lbfgs` (L-BFGS with a zoom line search, from
       `LBFGS_RESTARTS` = 3 points) for at most `LBFGS_MAX_PARAMETERS` (8)
       free parameters, else `default_optimizer(steps)` (Adam, learning rate
       0.05 with a cosine decay over `steps`, from 1 point). The best point
       seen over all steps and restarts is returned; `FitResult.converged`
       and `FitResult.stop_reason` say how its restart stopped.

    Then the profile's Jacobian at the solution gives the `Identifiability`
    report (``result.identifiability``).

    Args:
        model: the starting point and the fixed arrays.
        target: ``(n,)``, the profile to reproduce: finite, >= 0, summing to
            1 within `TARGET_SUM_TOLERANCE` (it is renormalised).
        fit: the free arrays, any of `FIELDS` (or one comma-separated string).
        schedule: how free lambdas are parametrised: ``"free"`` (one per
            layer), ``"power_decay"`` (``lambda_0 / (t + 1)^beta``) or
            ``"constant"``.
        content: ``"per_layer"`` (one diagonal score per layer, shared by its
            heads) or ``"per_head"``.
        loss: one of `LOSSES` or a callable.
        optimizer: any optax transformation (its own schedule included);
            line searches (optax.lbfgs) get ``value``, ``grad`` and
            ``value_fn``.
        steps: the most optimisation steps per restart, >= 1.
        restarts: starting points refined one after the other, >= 1 (default
            `LBFGS_RESTARTS` with the default L-BFGS, else 1).
        search: design points of the global stage, >= 0 (0 turns it off;
            default: see above).
        key: a `jax.random` key for draws over the box (default ``PRNGKey(0)``).
        n: the sequence length (default ``model.sequence_length``); under a
            causal mask a profile at length n is exact for the first n
            tokens, so long models can be fitted at a short n.
        method: passed to `jaxroll.influence`.
        progress: show progress over the steps of the longest restart
            (`jaxroll.progress`: a bar on a terminal, lines elsewhere), or a
            `jaxroll.progress.Progress` over `steps` to report to.
        gradient_tolerance: on ``max_i |dL/du_i|`` (`GRADIENT_TOLERANCE`).
        loss_tolerance: on ``|f_{k-1} - f_k| / max(|f_{k-1}|, |f_k|)``
            (`LOSS_TOLERANCE`). Both are raised to 10 eps of the dtype.

    Returns:
        A `FitResult`.

    Raises:
        ConfigError: bad target, unknown names, steps or restarts < 1,
            search < 0, a negative tolerance; one line.

    Note:
        Memory: reverse-mode through the dense path keeps each layer's
        ``(H, n, n)`` kernel; fit long or wide models at a reduced n, or with
        ``method="structured"``.
    """
    steps = check_positive_int("steps", steps)
    checked_tolerances(gradient_tolerance, loss_tolerance, float)  # checked before any work
    size = _setup(model, target, fit, schedule, content, loss, n, method, None)[0].parametrisation.size
    name, optimizer, restarts = choose_optimizer(size, optimizer, steps, restarts)
    problem, fixed, target = _setup(model, target, fit, schedule, content, loss, n, method,
                                    with_extra_args(optimizer))
    parametrisation, loss_function, n = problem.parametrisation, problem.loss, problem.n

    if search is None:
        search = GLOBAL_POINTS if size <= GLOBAL_DIMENSIONS else 0
    search = check_non_negative_int("search", search)
    raw, search_points = _starting_points(problem, fixed, target, parametrisation.initial(model),
                                          restarts, search, key)
    initial_loss = float(loss_function(influence(model, n, method=method), target))
    tolerances = checked_tolerances(gradient_tolerance, loss_tolerance, target.dtype)
    carry = _initial_carry(raw, target, problem=problem, max_steps=steps)
    bar = _progress_bar(progress, steps)
    try:
        carry = _optimise(carry, fixed, target, tuple(jnp.asarray(x, target.dtype) for x in tolerances),
                          problem, steps, bar)
    except BaseException:
        if bar is not None:
            bar.close()
        raise

    winner = int(jnp.argmin(carry["best_loss"]))
    taken = int(carry["step"][winner])
    code = int(carry["reason"][winner])
    best = {key_: np.asarray(u[winner], dtype=np.float64) for key_, u in carry["best_raw"].items()}
    fitted, schedule_parameters, lambdas_free = _fitted_model(model, best, parametrisation, n)
    profile = influence(fitted, n, method=method)
    final_loss = float(loss_function(profile, target))
    stop_reason = describe_stop(code, taken, float(carry["gradient_norm"][winner]), float(carry["change"][winner]),
                                tolerances)
    converged, stop_reason, warnings = _verdict(code, stop_reason, fitted, lambdas_free, initial_loss, final_loss)
    if bar is not None:
        # A fit that stops early ends its count at 100% of the steps it took (not frozen at
        # "2%| 44/2000"); the last field says how it stopped, as the summary does.
        bar.close(complete=True, stop="converged" if converged else "not converged")
    return FitResult(
        model=fitted,
        profile=np.asarray(profile, dtype=np.float64),
        losses=np.asarray(carry["history"][winner, :taken + 1], dtype=np.float64),
        initial_loss=initial_loss,
        final_loss=final_loss,
        metrics=_compare(profile, target),
        steps=taken,
        restart_losses=np.asarray(carry["best_loss"], dtype=np.float64),
        schedule_parameters=schedule_parameters,
        search_points=search_points,
        identifiability=_report(best, fixed, target, profile, problem),
        converged=converged,
        stop_reason=stop_reason,
        max_steps=steps,
        optimizer=name,
        restart_steps=np.asarray(carry["step"], dtype=np.int64),
        warnings=warnings,
    )


def choose_optimizer(size: int, optimizer, steps: int, restarts) -> tuple[str, optax.GradientTransformation, int]:
    """(name, optimiser, restarts) of a local stage with `size` free parameters (`fit`, `jaxroll.design`).

    By default L-BFGS (`default_lbfgs`) from `LBFGS_RESTARTS` points up to
    `LBFGS_MAX_PARAMETERS` free parameters, else Adam (`default_optimizer`)
    from one; a given optimiser is ``"custom"`` and defaults to one restart.
    """
    name = "custom"
    if optimizer is None:
        name = "lbfgs" if size <= LBFGS_MAX_PARAMETERS else "adam"
        optimizer = default_lbfgs() if name == "lbfgs" else default_optimizer(steps)
    if restarts is None:
        restarts = LBFGS_RESTARTS if name == "lbfgs" else 1
    return name, optimizer, check_positive_int("restarts", restarts)


def _progress_bar(progress, steps: int):
    """`progress` as a `jaxroll.progress.Progress` over `steps`, or None for no report."""
    if progress is True:
        from ..progress import Progress

        # delay: a line or bar only for runs that last more than a couple of seconds.
        return Progress(steps, label="jaxroll fit", unit="steps", delay=2.0)
    if progress is False or progress is None:
        return None
    return progress


def _fitted_model(model: RolloutModel, best: dict, parametrisation, n: int):
    """(the fitted model, its schedule parameters, whether its lambdas were free) from the best raw point."""
    values = parametrisation.values({key: jnp.asarray(u) for key, u in best.items()})
    schedule_parameters = parametrisation.schedule_parameters(best)
    if "beta" in schedule_parameters:
        # The schedule exactly as `jaxroll.schedules.power_decay` (and so a
        # saved power_decay config) computes it from the reported parameters.
        from ..schedules import power_decay

        values["lambdas"] = power_decay(schedule_parameters["lambda_0"], schedule_parameters["beta"],
                                        model.num_layers)
    fitted = eqx.tree_at(lambda m: tuple(model_array(m, name) for name in values), model,
                         tuple(np.asarray(v, dtype=np.float64) for v in values.values()))
    return _as_numpy_model(fitted, n), schedule_parameters, "lambdas" in values


def _verdict(code: int, stop_reason: str, fitted: RolloutModel, lambdas_free: bool, initial_loss: float,
             final_loss: float) -> tuple[bool, str, tuple[str, ...]]:
    """(converged, stop reason, warnings): a stop by a converged test on a degenerate answer is not converged."""
    # At the loss floor the target is reproduced to rounding: not degenerate, wherever the lambdas ended.
    warnings = () if code == FLOOR else _degenerate(fitted, lambdas_free, initial_loss, final_loss)
    converged = code in CONVERGED and not warnings
    if warnings and code in CONVERGED:
        stop_reason = ("not converged: " + "; ".join(w.removeprefix("warning: ").split(";")[0] for w in warnings)
                       + " (the stopping test passed: " + stop_reason.removeprefix("converged: ") + ")")
    return converged, stop_reason, warnings


def _degenerate(model: RolloutModel, lambdas_free: bool, initial_loss: float, final_loss: float) -> tuple[str, ...]:
    """The warnings of a degenerate answer (`FitResult.warnings`), one line each."""
    warnings = []
    # A relative margin of 1e-9: a fit that reproduces its start to rounding is not worse.
    if final_loss > initial_loss * (1 + 1e-9) + 1e-300:
        warnings.append(f"warning: the fit ended worse than its start (loss {final_loss:.6g} > {initial_loss:.6g}); "
                        "another start, schedule or more free arrays may fit better")
    lambdas = np.asarray(model.lambdas, dtype=np.float64).ravel()
    at_bound = (lambdas <= BOUND_TOLERANCE) | (lambdas >= 1 - BOUND_TOLERANCE)
    if lambdas_free and lambdas.size >= 2 and int(at_bound.sum()) >= lambdas.size - 1:
        shown = ", ".join(f"{x:.3g}" for x in lambdas[:8]) + (", ..." if lambdas.size > 8 else "")
        warnings.append(f"warning: the fit is degenerate: {int(at_bound.sum())} of {lambdas.size} lambdas ended "
                        f"at a bound of (0, 1) (lambdas {shown}); the loss is flat there, not at a minimum inside "
                        "the model's range")
    return tuple(warnings)
