"""`design`: interventions optimised through the rollout, with the fitting package's global stage,
optimisers and stopping rule; an augmented-Lagrangian outer loop for a KL budget."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import memory, metrics
from .._checks import check_positive_int
from ..errors import ConfigError
from ..fitting.design import GLOBAL_DIMENSIONS, GLOBAL_POINTS, DESIGN_FLOATS, halton
from ..fitting.identification import IDENTIFIABILITY_MAX_PARAMETERS, identifiability_from_jacobian
from ..fitting.losses import resolve_loss
from ..fitting.loop import (CONVERGED, SKIPPED, checked_tolerances, describe_stop, initial_state, minimise,
                            with_extra_args)
from ..fitting.optimise import GRADIENT_TOLERANCE, LOSS_TOLERANCE, choose_optimizer
from ..fitting.problem import check_non_negative_int, check_target
from ..interventions import apply_all, describe
from ..model import RolloutModel, check_model, layer_kernels
from ..rollout import METHODS, influence
from .objective import (GOALS, _log_kernels, _Problem, by_offset, goal_value, kernel_kl, kernel_parameters,
                        objective, offset_scores, profile_and_kl)
from .parameters import _Free, _Parameters, check_bounds, check_free
from .progress import DesignProgress, restart_ended
from .result import DesignResult

__all__ = ["design", "PENALTY", "PENALTY_GROWTH", "MAX_PENALTY", "OUTER_ITERATIONS", "FEASIBILITY"]

PENALTY = 1e3
"""The augmented Lagrangian's first ``rho``. The constraint is ``g_t = K_t / b - 1``
(dimensionless) and a goal changes by at most 1, so a violation costs ``(rho / 2) g_t^2`` and the
first local stage stays within a few percent of the budget. A weak first penalty lets it wander:
on MPT-7B (tau, kappa, gamma free) rho = 10 led to tau at its lower bound, far outside the budget,
and the multipliers then walked it back to a constrained optimum worse than the identity."""
PENALTY_GROWTH = 10.0
"""``rho`` is multiplied by this after an outer iteration that did not cut the largest
violation ``max_t g_t`` by at least 4 (Nocedal & Wright 2006, Algorithm 17.4's rule)."""
MAX_PENALTY = 1e8
"""The largest ``rho``: beyond it the local problem's curvature outgrows float64 line searches."""
OUTER_ITERATIONS = 30
"""The most augmented-Lagrangian iterations (local stages) of a budgeted design."""
FEASIBILITY = 1e-6
"""The outer loop may stop once ``max_t (K_t / b - 1) <= FEASIBILITY`` and the goal changed by
less than `LOSS_TOLERANCE` (relative) from the last iteration; what excess is left is then
removed exactly by a bisection back towards the start (the budget then holds to rounding)."""

_BISECTIONS = 48  # 2^-48 of the step from the start to the design: below float64's resolution of it


@functools.partial(jax.jit, static_argnames=("problem", "max_steps"))
def _run_starts(raw, multipliers, penalty, data, tolerances, *, problem: _Problem, max_steps: int):
    """Every start (leading axis of `raw`, with its own multipliers ``(S, T)`` and penalty ``(S,)``)
    through the fitting package's compiled loop (`jaxroll.fitting.loop.minimise`), one after the
    other under `lax.scan`; a start after one that reached the loss floor is skipped. Each start's end
    is reported to the host (`jaxroll.designs.progress.restart_ended`), which counts it when a
    design reports progress and does nothing otherwise."""
    dtype = jnp.result_type(float)

    def one_start(best_so_far, inputs):
        start, start_multipliers, start_penalty = inputs
        local = data | {"multipliers": start_multipliers, "penalty": start_penalty}
        state = initial_state(start, problem.optimizer, dtype, max_steps)
        skip = best_so_far <= tolerances[2]
        state = state | dict(reason=jnp.where(skip, SKIPPED, state["reason"]).astype(jnp.int32))
        state = minimise(lambda u: objective(u, local, problem), problem.optimizer, state, tolerances,
                          max_steps + 1, max_steps)
        jax.debug.callback(restart_ended, state["best_loss"])
        return jnp.minimum(best_so_far, state["best_loss"]), state

    return jax.lax.scan(one_start, jnp.asarray(jnp.inf, dtype), (raw, multipliers, penalty))[1]


@functools.partial(jax.jit, static_argnames=("problem", "batch_size"))
def _scores(raw, data, *, problem: _Problem, batch_size: int):
    """The objective at every point of `raw` (leading axis), batched by `lax.map`."""
    return jax.lax.map(lambda u: objective(u, data, problem), raw, batch_size=batch_size)


@functools.partial(jax.jit, static_argnames=("problem",))
def _evaluate(raw, data, *, problem: _Problem):
    """``(profile, K, goal)`` at one point."""
    profile, kl = profile_and_kl(raw, data, problem)
    return profile, kl, goal_value(profile, data, problem)


def _starting_points(problem: _Problem, data, restarts: int, search: int, key):
    """The `restarts` best of the identity and `search` design points over the boxes (Halton up to
    `GLOBAL_DIMENSIONS` parameters, uniform draws beyond), as `jaxroll.fit`'s global stage chooses."""
    parameters = problem.parameters
    dtype = jnp.result_type(float)
    start = {name: jnp.asarray(u, dtype)[None] for name, u in parameters.initial().items()}
    points = max(search, restarts - 1)
    if points == 0:
        return start, 0
    size = parameters.size
    unit = halton(points, size) if size <= GLOBAL_DIMENSIONS else \
        jax.random.uniform(jax.random.PRNGKey(0) if key is None else key, (points, size), dtype=dtype)
    design_points = jax.vmap(parameters.from_unit)(unit)
    candidates = {name: jnp.concatenate([start[name], design_points[name].astype(dtype)]) for name in start}
    if search == 0:
        return candidates, points
    model = data["model"]
    batch_size = max(1, min(points + 1, DESIGN_FLOATS // (model.num_layers * model.num_heads * problem.n)))
    scores = np.asarray(_scores(candidates, data, problem=problem, batch_size=batch_size))
    # A stable sort keeps the identity first among equals; a non-finite score is never chosen.
    order = np.argsort(np.where(np.isfinite(scores), scores, np.inf), kind="stable")[:restarts]
    if problem.goal is not None and 0 not in order:
        order[-1] = 0  # a goal always refines the identity too: feasible, and the change a reader compares with
    return {name: u[order] for name, u in candidates.items()}, points


def _restore_budget(start: dict, point: dict, data, problem: _Problem, budget: float):
    """The point on the segment from `start` to `point` (unconstrained coordinates) furthest along
    it whose kernels all keep ``K_t <= b``, by bisection; `point` itself when it does already.
    Returns the point and the fraction of the segment kept (None when even `start` breaks the budget)."""
    def worst(fraction):
        middle = {name: start[name] + fraction * (point[name] - start[name]) for name in point}
        return float(jnp.max(_evaluate(middle, data, problem=problem)[1])), middle

    if worst(1.0)[0] <= budget:
        return point, 1.0
    if worst(0.0)[0] > budget:
        return point, None
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if worst(middle)[0] <= budget else (low, middle)
    return worst(low)[1], low


@functools.partial(jax.jit, static_argnames=("problem",))
def _profile_jacobian(flat, data, *, problem: _Problem):
    """``dp/du`` ``(n, k)`` at the flat point `flat`, in reverse mode: the structured ALiBi
    product's adjoint is a `jax.custom_vjp`, which has no forward rule."""
    return jax.jacrev(lambda x: profile_and_kl(problem.parameters.unflatten(x), data, problem)[0])(flat)


def _identifiability_report(point: dict, data, problem: _Problem, profile, target):
    """The `Identifiability` of the profile at the design (a target design), or None above
    `IDENTIFIABILITY_MAX_PARAMETERS` free scalars."""
    parameters = problem.parameters
    if parameters.size > IDENTIFIABILITY_MAX_PARAMETERS:
        return None
    jacobian = _profile_jacobian(parameters.flatten(point), data, problem=problem)
    residual = float(np.linalg.norm(np.asarray(profile, np.float64) - target))
    return identifiability_from_jacobian(np.asarray(jacobian), parameters.labels(), residual,
                                         float(np.linalg.norm(target)))


@functools.partial(jax.jit, static_argnames=("n", "factorised"))
def _reference(model, n: int, factorised: bool):
    """``log A_t`` of the original kernels, formed densely once (by offset when `factorised`)."""
    kernels = layer_kernels(model, n)
    return _log_kernels(by_offset(kernels) if factorised else kernels)


def _check_budget(kl_budget) -> float:
    if isinstance(kl_budget, bool) or not isinstance(kl_budget, (int, float, np.floating, np.integer)) \
            or not math.isfinite(kl_budget) or kl_budget <= 0:
        raise ConfigError(f"kl_budget: got {kl_budget!r}; allowed: a finite number > 0 (nats)")
    return float(kl_budget)


def _setup(model, free, target, goal, loss, kl_budget, bounds, kappa_form, kappa_k, fraction, n, method):
    """Every argument checked (one line each) before any compilation; the parameters, the target,
    the budget and whether it binds."""
    check_model(model)
    n = model.sequence_length if n is None else check_positive_int("n", n)
    model.kernel.check_length(n)
    if method not in METHODS:
        raise ConfigError(f"method: got {method!r}; allowed: one of {', '.join(METHODS)}")
    free = check_free(free)
    boxes = check_bounds(bounds, free)
    if (target is None) == (goal is None):
        raise ConfigError(f"design: got {'both a target and a goal' if goal is not None else 'no objective'}; "
                          f"allowed: a target profile (or 'flat') or a goal ({', '.join(GOALS)})")
    if not 0 < fraction < 0.5:
        raise ConfigError(f"fraction: got {fraction!r}; allowed: 0 < fraction < 0.5")
    budgeted = goal is not None and bool(kernel_parameters(free))
    if goal is not None:
        if goal not in GOALS:
            raise ConfigError(f"goal: got {goal!r}; allowed: one of {', '.join(GOALS)}")
        if goal == "u_index":
            metrics.u_index(np.full(n, 1.0 / n), fraction)  # refuses a length without a middle
        if kl_budget is None and budgeted:
            raise ConfigError("kl_budget: missing; a goal with free kernel parameters (tau, slope_scale, kappa) "
                              "needs one; allowed: a number > 0 (nats)")
        kl_budget = None if kl_budget is None else _check_budget(kl_budget)
    elif kl_budget is not None:
        _check_budget(kl_budget)
        raise ConfigError("kl_budget: applies to a goal; allowed: a target profile without a budget, "
                          "or a goal with one")
    if isinstance(target, str):
        if target != "flat":
            raise ConfigError(f"target: got {target!r:.60}; allowed: 'flat' or a profile (n,)")
        target = np.full(n, 1.0 / n)
    target = None if target is None else check_target(target, n)
    loss_function = resolve_loss(loss) if goal is None else None
    if not isinstance(kappa_form, str):
        raise ConfigError(f"kappa_form: got {kappa_form!r:.60}; allowed: log1p or unsquash")
    parameters = _Parameters(tuple(_Free(name, shape, *boxes[name]) for name, shape in free.items()),
                             model.num_layers, model.num_heads, kappa_form, float(kappa_k))
    # The identity applied once, concretely: a kernel that cannot take an intervention (slopes on a
    # table kernel, a distance bias on a full mask) is refused here, in one line.
    apply_all(model, parameters.interventions(parameters.values(parameters.initial())))
    if budgeted:
        itemsize = jnp.dtype(jnp.result_type(float)).itemsize
        memory.check_fits(4 * model.num_layers * n * n * itemsize, f"design: the kernels at n = {n}",
                          allowed="a shorter --length")
    return parameters, n, target, loss_function, kl_budget, budgeted


def _objective_words(goal, loss, target_name, kl_budget) -> str:
    if goal is None:
        short = {"wasserstein": "W1", "kl": "KL", "l2": "L2"}.get(loss, "loss") if isinstance(loss, str) else "loss"
        return f"{short} to {target_name}"
    verb = "raise middle_mass" if goal == "middle_mass" else "lower u_index"
    return verb + ("" if kl_budget is None else f" within a kernel KL budget of {kl_budget:g} per layer")


def design(
    model: RolloutModel,
    free: Mapping[str, str] | str,
    *,
    target=None,
    goal: str | None = None,
    loss: str | Callable = "wasserstein",
    kl_budget: float | None = None,
    bounds: Mapping | str | None = None,
    kappa_form: str = "log1p",
    kappa_k: float = 2.0,
    fraction: float = 0.1,
    n: int | None = None,
    method: str = "auto",
    optimizer: optax.GradientTransformation | None = None,
    steps: int = 2000,
    restarts: int | None = None,
    search: int | None = None,
    key=None,
    gradient_tolerance: float = GRADIENT_TOLERANCE,
    loss_tolerance: float = LOSS_TOLERANCE,
    target_name: str = "the target",
    progress: bool = False,
) -> DesignResult:
    """Interventions, optimised through the rollout, that give `model` a chosen position bias.

    The changed model is ``M(theta) = apply_all(model, interventions(theta))``; its profile
    ``p_T(theta)`` is the last row of ``R'_T ... R'_1``, ``R'_t = (1 - lambda'_t) I + lambda'_t A'_t``
    (arXiv 2602.16837; ``A[i, j]`` the weight with which token i reads token j). ``theta`` are the
    parameters named in `free`, each the sigmoid image of an unconstrained ``u`` in its box
    (`jaxroll.designs.parameters`), and `jax.grad` of the objective runs through the
    interventions and the rollout. The objective is one of:

    - ``target``: ``loss(p_T(theta), q)`` with ``q`` a profile ``(n,)`` or ``"flat"``
      (``q_j = 1/n``); ``loss`` is ``"wasserstein"`` (``W1 / (n - 1)``), ``"kl"``
      (``KL(q || p)``), ``"l2"`` or a callable;
    - ``goal``: ``"middle_mass"`` (maximise ``sum p[k:n-k]``) or ``"u_index"`` (minimise it),
      subject to ``K_t(theta) = (1/n) sum_i KL(A'_t[i, :] || A_t[i, :]) <= kl_budget`` in every
      layer t (dense kernels at length n), by an augmented Lagrangian
      (`jaxroll.designs.objective`) run from every start on its own (the problem is not convex;
      the identity is always a start) and a final bisection towards the identity that removes
      any excess left, so the budget holds at the returned design, the best of the starts.
      ``gamma`` changes ``lambda_t`` but not ``A_t``: only its box bounds it.

    Each local stage is `jaxroll.fit`'s: the identity and a global design over the boxes (Halton,
    `GLOBAL_POINTS` points for up to `GLOBAL_DIMENSIONS` free scalars), scored in one compiled
    call; the best `restarts` refined by L-BFGS (up to `LBFGS_MAX_PARAMETERS` free scalars) or
    Adam with a cosine decay, each until the stopping rule of `jaxroll.fitting.optimise` passes
    or `steps` is reached.

    Args:
        model: the model to change (any kernel the interventions take).
        free: ``{name: shape}`` or ``"tau=per_layer,gamma=global"``: names from `PARAMETERS`,
            shapes from `SHAPES`.
        target: a profile ``(n,)`` (finite, >= 0, summing to 1 within 1e-3) or ``"flat"``.
        goal: one of `GOALS`; exactly one of `target` and `goal`.
        loss: for a target: one of `jaxroll.fitting.LOSSES` or a callable ``(p, q) -> scalar``.
        kl_budget: ``b > 0`` in nats; required with a goal whose free parameters change the
            kernels (tau, slope_scale, kappa); refused with a target.
        bounds: boxes replacing `BOXES`: ``{name: (low, high)}`` or ``"tau=0.5:2,gamma=0:1"``.
        kappa_form: the `DistanceBias` form of a free kappa.
        kappa_k: the `DistanceBias` k of a free kappa (the ``"unsquash"`` form).
        fraction: the edge fraction of the middle mass and U-index.
        n: the length (default ``model.sequence_length``).
        method: passed to `jaxroll.influence`.
        optimizer: an optax transformation (default: L-BFGS or Adam, as `jaxroll.fit`).
        steps: the most steps of each local stage, >= 1.
        restarts: as in `jaxroll.fit`.
        search: as in `jaxroll.fit`.
        key: as in `jaxroll.fit`.
        gradient_tolerance: the stopping rule's (`jaxroll.fit`).
        loss_tolerance: the stopping rule's (`jaxroll.fit`).
        target_name: how the summary names the target.
        progress: True: report on stderr what the design is doing, from its start: a line
            before each stage (compiling, the global stage, outer iteration k of at most
            `OUTER_ITERATIONS`, the bisection back within the budget, the final profiles) and
            the restarts of each outer iteration as they end, counted in the package's one
            convention (`jaxroll.progress`: a bar on a terminal, lines in a log) with an ETA
            estimated from the restarts after the first (whose time is mostly compilation);
            a closing line with the outer iterations and ``stop=``. False (default): nothing.

    Returns:
        A `DesignResult`.

    Raises:
        ConfigError: one line: an unknown parameter or shape, a bad box, a budget <= 0, a bad
            target, both or neither of target and goal, an intervention the kernel cannot take.

    Example:
        >>> import jaxroll
        >>> model = jaxroll.presets.get("mpt-7b", 64)
        >>> result = jaxroll.design(model, "gamma=global", goal="middle_mass")
        >>> result.at_bounds  # doctest: +SKIP
    """
    steps = check_positive_int("steps", steps)
    checked_tolerances(gradient_tolerance, loss_tolerance, float)
    parameters, n, target, loss_function, kl_budget, budgeted = _setup(
        model, free, target, goal, loss, kl_budget, bounds, kappa_form, kappa_k, fraction, n, method)
    name, optimizer, restarts = choose_optimizer(parameters.size, optimizer, steps, restarts)
    search = check_non_negative_int("search", (GLOBAL_POINTS if parameters.size <= GLOBAL_DIMENSIONS else 0)
                                     if search is None else search)
    dtype = jnp.result_type(float)
    jax_model = jax.tree.map(lambda x: jnp.asarray(x, dtype) if isinstance(x, np.ndarray) else x, model)
    factorised = budgeted and offset_scores(jax_model, n) is not None
    problem = _Problem(parameters, goal, loss_function, n, method, float(fraction), budgeted, factorised,
                       with_extra_args(optimizer))
    with DesignProgress(progress) as report:
        report.stage(f"n = {n}, {parameters.size} free scalar{'s' if parameters.size != 1 else ''}, {restarts} "
                     f"restart{'s' if restarts != 1 else ''} of {name}; compiling "
                     + ("the original kernels and " if budgeted else "")
                     + (f"the global stage ({max(search, restarts - 1)} points)" if search else "the start"))
        states, run, starts, data, tolerances, search_points, initial_value, start = _run(
            problem, parameters, jax_model, target, kl_budget, restarts, search, key, gradient_tolerance,
            loss_tolerance, steps, report)
        points = [{name_: u[r] for name_, u in states["best_raw"].items()} for r in range(run.count)]
        warnings = []
        if budgeted:
            report.stage(f"moving {run.count} design{'s' if run.count != 1 else ''} back within the budget "
                         "(bisection towards the start)")
            winner, point, stop_reason, warnings = _budgeted_winner(start, points, data, problem, kl_budget, run)
        else:
            winner = int(jnp.argmin(states["best_loss"]))
            point, stop_reason = points[winner], run.reasons[winner]
        feasible = bool(run.feasible[winner])
        report.stage("the profiles before and after" + (", the identifiability" if target is not None else ""))
        result = _result(model, point, data, problem, target, kl_budget, initial_value, stop_reason,
                         int(run.codes[winner]) in CONVERGED and feasible, int(run.steps_taken[winner]), steps,
                         name, search_points, run.outer, warnings, _objective_words(goal, loss, target_name, kl_budget))
        report.close(run.outer, "converged" if result.converged else "not converged")
    return result


def _run(problem, parameters, jax_model, target, kl_budget, restarts, search, key, gradient_tolerance,
         loss_tolerance, steps, report):
    """The data of the objective, the starting points (the global stage) and the outer loop."""
    dtype = jnp.result_type(float)
    data = {"model": jax_model, "target": None if target is None else jnp.asarray(target, dtype),
            "log_reference": _reference(jax_model, problem.n, problem.factorised) if problem.budgeted else None,
            "budget": jnp.asarray(1.0 if kl_budget is None else kl_budget, dtype),
            "multipliers": jnp.zeros(jax_model.num_layers, dtype), "penalty": jnp.asarray(PENALTY, dtype)}
    tolerances = checked_tolerances(gradient_tolerance, loss_tolerance, dtype)
    starts, search_points = _starting_points(problem, data, restarts, search, key)
    start = {name_: jnp.asarray(u, dtype) for name_, u in parameters.initial().items()}
    initial_value = float(_evaluate(start, data, problem=problem)[2])
    states, run = _augmented_lagrangian(starts, data, problem, tolerances, steps, kl_budget, loss_tolerance, report)
    return states, run, starts, data, tolerances, search_points, initial_value, start


class _Run:
    """Per-start records of the outer loop (one entry per start)."""

    def __init__(self, count: int, num_layers: int, budgeted: bool):
        self.count, self.outer = count, 0
        self.multipliers, self.penalty = np.zeros((count, num_layers)), np.full(count, PENALTY)
        self.previous_goal, self.previous_violation = np.full(count, np.inf), np.full(count, np.inf)
        self.done, self.feasible = np.zeros(count, bool), np.full(count, not budgeted)
        self.steps_taken, self.reasons = np.zeros(count, np.int64), [""] * count
        self.codes = np.zeros(count, np.int64)


def _augmented_lagrangian(starts, data, problem: _Problem, tolerances, steps: int, kl_budget, loss_tolerance,
                          report: DesignProgress):
    """Run every start's local stages until each is feasible and settled, or `OUTER_ITERATIONS`.

    Without a budget one local stage. With one, after each stage the
    multipliers rise by ``rho g_t`` (``g_t = K_t / b - 1``) and ``rho`` grows by
    `PENALTY_GROWTH` (up to `MAX_PENALTY`) where the violation fell by less
    than a factor 4. Returns the last stage's states and the `_Run` records;
    `report` hears of each iteration and (from the compiled loop) each restart.
    """
    dtype = jnp.result_type(float)
    traced_tolerances = tuple(jnp.asarray(x, dtype) for x in tolerances)
    count = next(iter(starts.values())).shape[0]
    run = _Run(count, data["multipliers"].shape[0], problem.budgeted)
    # Each start runs its own augmented-Lagrangian loop: the goal under a budget is not convex (on MPT-7B a
    # sharper softmax with gamma ~ 1 and a stronger branch with tau at the budget are two basins), so the
    # starts are compared only once each is feasible.
    while True:
        run.outer += 1
        report.begin_outer(run.outer, count, OUTER_ITERATIONS if problem.budgeted else None, run.outer == 1)
        states = _run_starts(starts, jnp.asarray(run.multipliers, dtype), jnp.asarray(run.penalty, dtype), data,
                             traced_tolerances, problem=problem, max_steps=steps)
        _record_stops(run, states, tolerances)
        if not problem.budgeted:
            report.end_outer(None, None)
            break
        _update_multipliers(run, states, data, problem, kl_budget, loss_tolerance)
        report.end_outer(int(run.feasible.sum()), int(run.done.sum()))
        if run.done.all() or run.outer >= OUTER_ITERATIONS:
            break
        starts = states["best_raw"]  # each start warm-starts from its own last design
    return states, run


def _record_stops(run: _Run, states, tolerances) -> None:
    """Add each running start's steps to its count and keep how its last stage stopped."""
    for r in range(run.count):
        if run.done[r]:
            continue
        taken, run.codes[r] = int(states["step"][r]), int(states["reason"][r])
        run.steps_taken[r] += taken
        run.reasons[r] = describe_stop(int(run.codes[r]), taken, float(states["gradient_norm"][r]),
                                       float(states["change"][r]), tolerances)


def _update_multipliers(run: _Run, states, data, problem: _Problem, kl_budget, loss_tolerance) -> None:
    """One outer step of each running start: ``mu_t <- max(0, mu_t + rho g_t)``, ``g_t = K_t / b - 1``.

    A start is feasible when ``max_t g_t <= FEASIBILITY`` and done when it is
    feasible and its goal moved by at most `loss_tolerance` (relative); ``rho``
    grows by `PENALTY_GROWTH` (to `MAX_PENALTY`) when the violation fell by
    less than a factor 4.
    """
    for r in range(run.count):
        if run.done[r]:
            continue
        point_r = {name_: u[r] for name_, u in states["best_raw"].items()}
        _, kl, value = (np.asarray(x, np.float64) for x in _evaluate(point_r, data, problem=problem))
        excess = kl / kl_budget - 1.0
        violation = max(0.0, float(np.max(excess)))
        settled = abs(float(value) - run.previous_goal[r]) <= loss_tolerance * max(abs(float(value)), 1e-300)
        run.feasible[r] = violation <= FEASIBILITY
        run.done[r] = run.feasible[r] and settled
        run.multipliers[r] = np.maximum(0.0, run.multipliers[r] + run.penalty[r] * excess)
        if violation > 0.25 * run.previous_violation[r]:
            run.penalty[r] = min(run.penalty[r] * PENALTY_GROWTH, MAX_PENALTY)
        run.previous_goal[r], run.previous_violation[r] = float(value), violation


def _budgeted_winner(start, points, data, problem: _Problem, kl_budget, run: _Run):
    """(winner, its point moved back within the budget, stop reason, warnings): the best goal among the starts."""
    warnings = []
    restored = [_restore_budget(start, point_r, data, problem, kl_budget) for point_r in points]
    values = [float(_evaluate(point_r, data, problem=problem)[2]) if kept is not None else math.inf
              for point_r, kept in restored]
    winner = int(np.argmin(values))
    point, kept = restored[winner]
    if kept is None:
        warnings.append(f"warning: the budget KL <= {kl_budget:g} is not met even at the start of the "
                        "boxes; widen --bounds to hold the identity")
    stop_reason = run.reasons[winner]
    if not run.feasible[winner]:
        stop_reason = (f"not converged: {OUTER_ITERATIONS} outer iterations left the budget exceeded "
                       "(the design was moved back within it)")
    return winner, point, stop_reason, warnings


def _result(model, point, data, problem: _Problem, target, kl_budget, initial_value, stop_reason, converged,
            steps_taken, max_steps, name, search_points, outer, warnings, words) -> DesignResult:
    parameters, n = problem.parameters, problem.n
    values = {key: np.asarray(value, np.float64) for key, value in parameters.values(point).items()}
    changes = parameters.interventions(values)
    changed = apply_all(model, changes)
    before = np.asarray(influence(model, n, method=problem.method), np.float64)
    after = np.asarray(influence(changed, n, method=problem.method), np.float64)
    kernels_changed = bool(kernel_parameters(values))
    kl = np.asarray(_evaluate(point, data, problem=problem)[1], np.float64) if problem.budgeted else \
        np.asarray(kernel_kl(model, changed, n), np.float64) if kernels_changed else np.zeros(model.num_layers)
    final_value = float(goal_value(jnp.asarray(after), data, problem))
    bounds = parameters.at_bounds(values)
    warnings = list(warnings)
    if bounds:
        warnings.append("warning: the design ended at a bound: " + "; ".join(bounds.values())
                        + "; the best design lies at or beyond the edge of its box (widen --bounds, or free "
                        "other parameters)")
    if final_value > initial_value * (1 + 1e-9) + 1e-300:
        warnings.append(f"warning: the design ended worse than the identity (objective {final_value:.6g} > "
                        f"{initial_value:.6g})")
    if not converged and "step limit" in stop_reason:
        warnings.append(f"warning: not converged in {max_steps} steps ({stop_reason}); raise --steps")
    report = None if target is None else _identifiability_report(point, data, problem, after, target)

    def statistic(function):
        return tuple(float(function(p, problem.fraction)) for p in (before, after))

    return DesignResult(
        interventions=tuple(changes), record=describe(changes), values=values, model=changed, before=before,
        after=after, target=None if target is None else np.asarray(target, np.float64), objective=words,
        initial_value=initial_value, final_value=final_value, kl=kl, kl_budget=kl_budget,
        middle_mass=statistic(metrics.middle_mass), u_index=statistic(metrics.u_index) if n > 2 * metrics.edge_count(
            n, problem.fraction) else (math.nan, math.nan),
        argmin=(int(np.argmin(before)), int(np.argmin(after))), at_bounds=bounds, converged=bool(converged),
        stop_reason=stop_reason, steps=steps_taken, max_steps=max_steps, optimizer=name,
        search_points=search_points, outer_iterations=outer, identifiability=report, warnings=tuple(warnings))
