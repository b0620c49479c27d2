"""Fitting the rollout's parameters to an influence profile, with optax.

Given a target profile ``q`` (measured on a model, say) and a starting
`RolloutModel`, `fit` minimises ``loss(p_T(theta), q)`` over the arrays named
in ``fit``, where ``p_T(theta)`` is the influence profile of the rollout
``R_t = (1 - lambda_t) I + lambda_t A_t``, ``P_T = R_T ... R_1``
(arXiv 2602.16837). The other arrays stay as they are in the model.

Every free array is the image of an unconstrained vector under a map that
keeps the model valid:

==================  =============================================  ==========
array               parametrisation                                shape
==================  =============================================  ==========
lambdas, free       ``lambda_t = sigmoid(u_t)``                    ``(T,)``
lambdas, power      ``lambda_t = lambda_0 / (t + 1)^beta``,
                    ``lambda_0 = sigmoid(u_0)``,
                    ``beta = softplus(u_1)``                       ``(2,)``
lambdas, constant   ``lambda_t = sigmoid(u)``                      ``()``
diagonal_scores     ``d = u`` (logit units), shared by the heads
                    of a layer (``content="per_layer"``) or one
                    per head (``"per_head"``)                      ``(T, 1)``
                                                                   or
                                                                   ``(T, H)``
alibi_slopes        ``m = softplus(u) >= 0``                       ``(T, H)``
head_weights        ``w_t = softmax(u_t)`` over the heads          ``(T, H)``
temperature         ``tau = softplus(u) > 0``                      ``()``
==================  =============================================  ==========

The free/fixed split is an `eqx.partition` of the model; the whole
optimisation is one jit-compiled `jax.lax.scan` over steps with the optax
update inside, and ``restarts`` random initialisations run side by side under
`jax.vmap`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float

from . import metrics
from ._checks import as_float_array, check_positive_int
from .errors import ConfigError
from .model import RolloutModel
from .rollout import METHODS, influence

__all__ = ["FIELDS", "SCHEDULES", "CONTENTS", "LOSSES", "VARIANTS", "FitResult", "fit", "objective",
           "compare_variants", "default_optimizer"]

FIELDS = ("lambdas", "diagonal_scores", "alibi_slopes", "head_weights", "temperature")
SCHEDULES = ("free", "power_decay", "constant")
CONTENTS = ("per_layer", "per_head")
LOSSES = ("wasserstein", "kl", "l2")

# How far a target's sum may be from 1 before it is refused rather than
# renormalised: profiles written as CSV with 6+ significant digits sum to 1
# within ~1e-5 at N = 10^5 positions; a sum off by more is a wrong file.
TARGET_SUM_TOLERANCE = 1e-3
# Open-interval clipping before inverting sigmoid/softplus, so that a model
# with lambda = 0 or 1, or a zero slope, starts from a finite point.
_EDGE = 1e-6


class FitResult(eqx.Module):
    """The outcome of `fit`.

    Attributes:
        model: the fitted `RolloutModel` (NumPy float64 arrays, checked by
            `RolloutModel.create`, ``sequence_length = n``): `save_config`
            writes it and ``jaxroll rollout`` reads it back.
        profile: ``(n,)``, the fitted model's influence profile.
        losses: ``(steps,)``, the loss before each optimisation step of the
            best restart.
        initial_loss: the loss of the model that was passed in.
        final_loss: the loss of `model`, the best point seen over all steps
            and restarts. It is at most `initial_loss` whenever the
            parametrisation can represent the starting model (not so for a
            power-decay fit started from a schedule of another shape, or
            per-layer content started from per-head content).
        metrics: ``metrics.compare(profile, target)``, a `metrics.Comparison`
            (Wasserstein, Spearman, KL, JS, total variation, and the shape
            statistics of both profiles).
        steps: the number of optimisation steps taken per restart.
        restart_losses: ``(restarts,)``, the best loss of each restart.
        schedule_parameters: the fitted ``{"lambda_0", "beta"}`` of a
            power-decay schedule, ``{"lambda_const"}`` of a constant one,
            empty otherwise.
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


# -- parametrisations -------------------------------------------------------


def _inverse_sigmoid(x):
    x = np.clip(x, _EDGE, 1.0 - _EDGE)
    return np.log(x) - np.log1p(-x)


def _inverse_softplus(x):
    x = np.maximum(x, _EDGE)
    return x + np.log(-np.expm1(-x))


@dataclasses.dataclass(frozen=True)
class _Parametrisation:
    """Maps unconstrained vectors to valid model arrays (hashable: a jit static)."""

    names: tuple[str, ...]
    schedule: str
    content: str
    num_layers: int
    num_heads: int

    def initial(self, model: RolloutModel) -> dict[str, np.ndarray]:
        """The unconstrained point that represents `model` (as nearly as it can)."""
        raw = {}
        for name in self.names:
            value = np.asarray(getattr(model, name), dtype=np.float64)
            if name == "lambdas":
                raw[name] = self._initial_schedule(value)
            elif name == "diagonal_scores":
                raw[name] = value.mean(axis=1, keepdims=True) if self.content == "per_layer" else value
            elif name in ("alibi_slopes", "temperature"):
                raw[name] = _inverse_softplus(value)
            else:  # head_weights, normalised per layer; a zero weight starts small
                weights = value / value.sum(axis=1, keepdims=True)
                raw[name] = np.log(np.maximum(weights, 1e-12))
        return raw

    def _initial_schedule(self, lambdas: np.ndarray) -> np.ndarray:
        if self.schedule == "free":
            return _inverse_sigmoid(lambdas)
        if self.schedule == "constant":
            return _inverse_sigmoid(np.asarray(lambdas.mean()))
        # power decay: lambda_0 from layer 0, beta from the least-squares
        # slope of log lambda_t against log(t + 1) over the positive entries.
        lambda_0 = float(np.clip(lambdas[0], _EDGE, 1.0 - _EDGE))
        t = np.arange(self.num_layers, dtype=np.float64)
        positive = lambdas > 0
        beta = 1.0
        if positive.sum() >= 2:
            slope = np.polyfit(np.log1p(t[positive]), np.log(lambdas[positive]), 1)[0]
            beta = float(np.clip(-slope, 1e-3, 10.0))
        return np.array([_inverse_sigmoid(lambda_0), _inverse_softplus(beta)])

    def values(self, raw: dict[str, Array]) -> dict[str, Array]:
        """The model arrays for the unconstrained point `raw`."""
        shape = (self.num_layers, self.num_heads)
        out = {}
        for name, u in raw.items():
            if name == "lambdas":
                out[name] = self.lambdas(u)
            elif name == "diagonal_scores":
                out[name] = jnp.broadcast_to(u, shape)
            elif name in ("alibi_slopes", "temperature"):
                out[name] = jax.nn.softplus(u)
            else:
                out[name] = jax.nn.softmax(u, axis=-1)
        return out

    def lambdas(self, u: Array) -> Float[Array, " layers"]:
        if self.schedule == "free":
            return jax.nn.sigmoid(u)
        if self.schedule == "constant":
            return jnp.full((self.num_layers,), jax.nn.sigmoid(u))
        t = jnp.arange(self.num_layers, dtype=u.dtype)
        return jax.nn.sigmoid(u[0]) / (t + 1.0) ** jax.nn.softplus(u[1])

    def schedule_parameters(self, raw: dict[str, np.ndarray]) -> dict[str, float]:
        if "lambdas" not in raw or self.schedule == "free":
            return {}
        u = np.asarray(raw["lambdas"], dtype=np.float64)
        if self.schedule == "constant":
            return {"lambda_const": float(1.0 / (1.0 + np.exp(-u)))}
        return {"lambda_0": float(1.0 / (1.0 + np.exp(-u[0]))), "beta": float(np.logaddexp(0.0, u[1]))}


# -- losses -----------------------------------------------------------------


def _l2(p, target):
    """``sum_j (p_j - q_j)^2``."""
    return jnp.sum((p - target) ** 2)


def _kl(p, target):
    """``KL(q || p)``: the target is the data, the rollout the model."""
    return metrics.kl(target, p)


_LOSS_FUNCTIONS = {"wasserstein": metrics.wasserstein, "kl": _kl, "l2": _l2}


def _loss_function(loss) -> Callable:
    if callable(loss):
        return loss
    if loss not in _LOSS_FUNCTIONS:
        raise ConfigError(f"loss: got {loss!r}; allowed: one of {', '.join(LOSSES)} or a callable (p, target) -> scalar")
    return _LOSS_FUNCTIONS[loss]


# -- the optimisation -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Problem:
    """Everything static about one fit: a jit static argument, so a second
    identical fit reuses the compiled scan."""

    parametrisation: _Parametrisation
    loss: Callable
    n: int
    method: str
    optimizer: optax.GradientTransformation


def _objective(raw, fixed: RolloutModel, target, problem: _Problem):
    values = problem.parametrisation.values(raw)
    names = tuple(values)
    model = eqx.tree_at(lambda m: tuple(getattr(m, name) for name in names), fixed,
                        tuple(values[name] for name in names), is_leaf=lambda x: x is None)
    p = influence(model, problem.n, method=problem.method)
    return problem.loss(p, target)


@functools.partial(jax.jit, static_argnames=("problem", "length"))
def _run_chunk(carry, fixed, target, *, problem: _Problem, length: int):
    """`length` optimisation steps for every restart at once: vmap over a scan."""

    def one_restart(carry):
        def step(carry, _):
            raw, state, best_raw, best_loss = carry
            value, grad = jax.value_and_grad(_objective)(raw, fixed, target, problem)
            # Keep the best point seen: the loss is not monotone under Adam.
            better = value < best_loss
            best_raw = jax.tree.map(lambda b, r: jnp.where(better, r, b), best_raw, raw)
            best_loss = jnp.where(better, value, best_loss)
            # value and value_fn serve optimisers with a line search
            # (optax.lbfgs); the others ignore them.
            updates, state = problem.optimizer.update(
                grad, state, raw, value=value, grad=grad,
                value_fn=lambda r: _objective(r, fixed, target, problem))
            return (optax.apply_updates(raw, updates), state, best_raw, best_loss), value

        return jax.lax.scan(step, carry, None, length=length)

    return jax.vmap(one_restart)(carry)


@functools.partial(jax.jit, static_argnames=("problem",))
def _losses_of(raw, fixed, target, *, problem: _Problem):
    return jax.vmap(_objective, in_axes=(0, None, None, None))(raw, fixed, target, problem)


@functools.partial(jax.jit, static_argnames=("problem",))
def _init_states(raw, *, problem: _Problem):
    return jax.vmap(problem.optimizer.init)(raw)


@functools.lru_cache(maxsize=64)
def default_optimizer(steps: int, learning_rate: float = 0.05) -> optax.GradientTransformation:
    """``optax.adam`` with a cosine decay of the learning rate from 0.05 to 0 over `steps`.

    The free vectors are logits (lambda, head weights), softplus arguments
    (slopes, temperature) or content in logit units, all O(1) per unit of
    effect, so one learning rate serves them all. Cached, so that the same
    `steps` gives the same object and a repeated fit hits the jit cache.
    """
    return optax.adam(optax.cosine_decay_schedule(learning_rate, steps))


def _check_target(target, n: int) -> np.ndarray:
    values = metrics.check_profile("target", target, normalize=True)  # finite, >= 0, mass > 0
    if values.ndim != 1:
        raise ConfigError(f"target: got shape {values.shape}; allowed: one dimension (n,)")
    if values.size != n:
        raise ConfigError(f"target: length {values.size} differs from n = {n}; "
                          "allowed: length n (pass n= or --length)")
    total = float(np.sum(np.asarray(target, dtype=np.float64)))
    if abs(total - 1.0) > TARGET_SUM_TOLERANCE:
        raise ConfigError(f"target: sums to {total:.6g}; allowed: a probability vector summing to 1 "
                          f"within {TARGET_SUM_TOLERANCE:g}")
    return values


def _check_names(names) -> tuple[str, ...]:
    if isinstance(names, str):
        names = tuple(part.strip() for part in names.split(","))
    names = tuple(names)
    if not names:
        raise ConfigError(f"fit: got an empty list; allowed: one or more of {', '.join(FIELDS)}")
    for name in names:
        if name not in FIELDS:
            raise ConfigError(f"fit: unknown array {name!r}; allowed: any of {', '.join(FIELDS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"fit: {','.join(names)!r} names an array twice; allowed: each at most once")
    # A fixed order, so that equal requests give equal (cached) problems.
    return tuple(name for name in FIELDS if name in names)


def _as_numpy_model(model: RolloutModel, n: int) -> RolloutModel:
    """The model re-checked by `RolloutModel.create`, with NumPy float64 arrays."""
    arrays = {name: np.asarray(getattr(model, name), dtype=np.float64)
              for name in ("lambdas", "alibi_slopes", "diagonal_scores", "base_scores", "head_weights")}
    try:
        return RolloutModel.create(
            num_layers=model.num_layers, num_heads=model.num_heads,
            temperature=np.asarray(model.temperature, dtype=np.float64),
            mask=model.mask, window=model.window, sequence_length=n, **arrays)
    except ConfigError as error:
        raise ConfigError(f"fit: the optimisation left the valid range ({error}); "
                          "try fewer free arrays or a smaller learning rate") from None


def _compare(p, target) -> metrics.Comparison:
    # normalize: a float32 profile may miss a sum of 1 by more than compare's 1e-6.
    return metrics.compare(np.asarray(p, dtype=np.float64), target, normalize=True)


def _setup(model, target, names, schedule, content, loss, n, method, optimizer):
    """Check the arguments; the static problem, the fixed part of the model, the target."""
    if not isinstance(model, RolloutModel):
        raise ConfigError(f"model: got {type(model).__name__}; allowed: a jaxroll.RolloutModel")
    names = _check_names(names)
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule: got {schedule!r}; allowed: one of {', '.join(SCHEDULES)}")
    if schedule != "free" and "lambdas" not in names:
        raise ConfigError(f"schedule: {schedule!r} parametrises lambdas, which are not in fit; "
                          "allowed: 'free', or add 'lambdas' to fit")
    if content not in CONTENTS:
        raise ConfigError(f"content: got {content!r}; allowed: one of {', '.join(CONTENTS)}")
    if method not in METHODS:
        raise ConfigError(f"method: got {method!r}; allowed: one of {', '.join(METHODS)}")
    n = model.sequence_length if n is None else check_positive_int("n", n)
    target = jnp.asarray(_check_target(target, n))
    parametrisation = _Parametrisation(names, schedule, content, model.num_layers, model.num_heads)
    problem = _Problem(parametrisation, _loss_function(loss), n, method, optimizer)
    # The free/fixed split: the free arrays are rebuilt from the
    # unconstrained point at every evaluation, the rest travel as they are.
    spec = eqx.tree_at(lambda m: tuple(getattr(m, name) for name in names),
                       jax.tree.map(lambda _: False, model), (True,) * len(names))
    _, fixed = eqx.partition(model, spec)
    return problem, fixed, target


def objective(
    model: RolloutModel,
    target,
    *,
    fit: Sequence[str] | str = ("lambdas",),
    schedule: str = "free",
    content: str = "per_layer",
    loss: str | Callable = "wasserstein",
    n: int | None = None,
    method: str = "auto",
) -> tuple[Callable[[dict[str, Array]], Array], dict[str, np.ndarray]]:
    """The function `fit` minimises, for use with any optimiser.

    Returns ``(f, u0)``: ``f(u) = loss(p_T(theta(u)), q)``, a pure function of
    the unconstrained point ``u`` (a dict from array name to its free vector,
    see the module docstring) that `jax.grad` and `jax.jit` accept, and
    ``u0``, the point that represents `model`. Arguments as in `fit`.
    """
    problem, fixed, target = _setup(model, target, fit, schedule, content, loss, n, method, None)
    function = functools.partial(_objective_of_point, fixed=fixed, target=target, problem=problem)
    return function, problem.parametrisation.initial(model)


def _objective_of_point(raw, *, fixed, target, problem):
    return _objective(raw, fixed, target, problem)


def _starting_points(initial: dict[str, np.ndarray], restarts: int, key) -> dict[str, Array]:
    """``restarts`` unconstrained points: the model's own, then it plus N(0, 1) noise."""
    key = jax.random.PRNGKey(0) if key is None else key
    points = {}
    for index, (name, u) in enumerate(initial.items()):
        u = jnp.asarray(u, dtype=jnp.result_type(float))
        noise = jax.random.normal(jax.random.fold_in(key, index), (restarts - 1,) + u.shape, u.dtype)
        points[name] = jnp.concatenate([u[None], u[None] + noise])
    return points


def _optimise(carry, fixed, target, problem: _Problem, steps: int, progress: bool):
    """All `steps` in one compiled scan, or in about 50 chunks under a progress bar."""
    if not progress:
        carry, history = _run_chunk(carry, fixed, target, problem=problem, length=steps)
        return carry, np.asarray(history)
    from tqdm.auto import tqdm

    chunk = max(1, math.ceil(steps / 50))
    pieces = []
    # delay: a bar only for runs that last more than a couple of seconds.
    with tqdm(total=steps, desc="fit", unit="step", delay=2.0) as bar:
        done = 0
        while done < steps:
            length = min(chunk, steps - done)
            carry, history = _run_chunk(carry, fixed, target, problem=problem, length=length)
            pieces.append(np.asarray(history))
            done += length
            bar.set_postfix(loss=f"{float(jnp.min(carry[3])):.3g}", refresh=False)
            bar.update(length)
    return carry, np.concatenate(pieces, axis=1)


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
    restarts: int = 1,
    key: Array | None = None,
    n: int | None = None,
    method: str = "auto",
    progress: bool = False,
) -> FitResult:
    """Fit the free arrays of `model` so that its influence profile matches `target`.

    Minimises ``L(theta) = loss(p_T(theta), q)`` where
    ``p_T(j) = (e_{n-1}^T R_T ... R_1)_j``, ``R_t = (1 - lambda_t) I + lambda_t A_t``
    and ``theta`` are the arrays named in `fit`, each through the
    parametrisation of the module docstring (so every iterate is a valid
    model); the other arrays keep their values in `model`. Losses:

    - ``"wasserstein"``: ``W1(p, q) / (n - 1) = sum_j |F_p(j) - F_q(j)| / (n - 1)``
      (`jaxroll.metrics.wasserstein`);
    - ``"kl"``: ``KL(q || p) = sum_j q_j log(q_j / p_j)`` (`jaxroll.metrics.kl`);
    - ``"l2"``: ``sum_j (p_j - q_j)^2``;
    - a callable ``(p, q) -> scalar``, differentiable in `p`.

    The optimisation is `steps` optax updates (default
    `default_optimizer(steps)`: Adam, learning rate 0.05 with a cosine
    decay) in one jit-compiled `lax.scan`; with ``restarts = r > 1``, r
    starting points run under `jax.vmap`: the model's own point and r - 1
    points drawn around it (unconstrained coordinates plus standard normal
    noise from `key`). The best point seen over all steps and restarts is
    returned.

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
        optimizer: any optax transformation (its own schedule included).
        steps: optimisation steps per restart, >= 1.
        restarts: random initialisations, >= 1.
        key: a `jax.random` key for the restarts (default ``PRNGKey(0)``).
        n: the sequence length (default ``model.sequence_length``); under a
            causal mask a profile at length n is exact for the first n
            tokens, so long models can be fitted at a short n.
        method: passed to `jaxroll.influence`.
        progress: show a progress bar over steps (runs in chunks of steps,
            each chunk one compiled scan, so jit is kept).

    Returns:
        A `FitResult`.

    Raises:
        ConfigError: bad target, unknown names, steps or restarts < 1; one line.

    Note:
        Memory: reverse-mode through the dense path keeps each layer's
        ``(H, n, n)`` kernel, times `restarts`; fit long or wide models at a
        reduced n, or with ``method="structured"``.
    """
    steps = check_positive_int("steps", steps)
    restarts = check_positive_int("restarts", restarts)
    if optimizer is None:
        optimizer = default_optimizer(steps)
    problem, fixed, target = _setup(model, target, fit, schedule, content, loss, n, method,
                                    optax.with_extra_args_support(optimizer))
    parametrisation, loss_function, n = problem.parametrisation, problem.loss, problem.n

    raw = _starting_points(parametrisation.initial(model), restarts, key)
    initial_loss = float(loss_function(influence(model, n, method=method), target))
    carry = (raw, _init_states(raw, problem=problem), raw,
             jnp.full((restarts,), jnp.inf, dtype=target.dtype))
    carry, history = _optimise(carry, fixed, target, problem, steps, progress)
    raw, _, best_raw, best_loss = carry
    # The point after the last update has not been scored by the scan.
    last_loss = _losses_of(raw, fixed, target, problem=problem)
    better = last_loss < best_loss
    best_raw = jax.tree.map(lambda b, r: jnp.where(better.reshape((-1,) + (1,) * (r.ndim - 1)), r, b),
                            best_raw, raw)
    best_loss = jnp.where(better, last_loss, best_loss)

    winner = int(jnp.argmin(best_loss))
    best = {name: np.asarray(u[winner], dtype=np.float64) for name, u in best_raw.items()}
    values = parametrisation.values({name: jnp.asarray(u) for name, u in best.items()})
    fitted = eqx.tree_at(lambda m: tuple(getattr(m, name) for name in values), model,
                         tuple(np.asarray(v, dtype=np.float64) for v in values.values()))
    fitted = _as_numpy_model(fitted, n)
    profile = influence(fitted, n, method=method)
    final_loss = float(loss_function(profile, target))
    return FitResult(
        model=fitted,
        profile=np.asarray(profile, dtype=np.float64),
        losses=np.asarray(history[winner], dtype=np.float64),
        initial_loss=initial_loss,
        final_loss=final_loss,
        metrics=_compare(profile, target),
        steps=steps,
        restart_losses=np.asarray(best_loss, dtype=np.float64),
        schedule_parameters=parametrisation.schedule_parameters(best),
    )


VARIANTS = ("attention_only", "no_content", "content")


def compare_variants(
    model: RolloutModel,
    target,
    *,
    steps: int = 500,
    schedule: str = "free",
    content: str = "per_layer",
    loss: str | Callable = "wasserstein",
    restarts: int = 1,
    key: Array | None = None,
    n: int | None = None,
    method: str = "auto",
) -> dict[str, FitResult]:
    """The paper's comparison: three rollout variants fitted to one target.

    The rows of the paper's Wasserstein/Spearman tables (arXiv 2602.16837),
    each a `FitResult` with its best loss and ``metrics.compare`` of its
    profile against `target`:

    - ``"attention_only"``: ``lambda_t = 1`` (``R_t = A_t``, the rollout of
      Abnar & Zuidema 2020 / Wu et al. 2025) with the model's kernels. Its
      one parameter is pinned by definition, so it is evaluated, not fitted
      (``steps = 0``, empty `losses`).
    - ``"no_content"``: residual-aware, diagonal content set to 0, lambdas
      fitted (`schedule`).
    - ``"content"``: residual-aware, lambdas and diagonal content fitted
      (`content`), starting from the model's content.

    Every variant keeps the model's ALiBi slopes, head weights and
    temperature. The other arguments are those of `fit`.

    Returns:
        ``{variant: FitResult}`` in the order of `VARIANTS`.
    """
    n = model.sequence_length if n is None else check_positive_int("n", n)
    checked = _check_target(target, n)
    loss_function = _loss_function(loss)
    common = dict(loss=loss, restarts=restarts, key=key, n=n, method=method, steps=steps)

    attention_only = _as_numpy_model(dataclasses.replace(model, lambdas=np.ones(model.num_layers)), n)
    profile = influence(attention_only, n, method=method)
    value = float(loss_function(profile, jnp.asarray(checked)))
    results = {"attention_only": FitResult(
        model=attention_only, profile=np.asarray(profile, dtype=np.float64),
        losses=np.zeros(0), initial_loss=value, final_loss=value,
        metrics=_compare(profile, jnp.asarray(checked)), steps=0,
        restart_losses=np.array([value]), schedule_parameters={})}
    no_content = dataclasses.replace(model, diagonal_scores=np.zeros((model.num_layers, model.num_heads)))
    results["no_content"] = fit(no_content, checked, fit=("lambdas",), schedule=schedule, **common)
    results["content"] = fit(model, checked, fit=("lambdas", "diagonal_scores"), schedule=schedule,
                             content=content, **common)
    return results
