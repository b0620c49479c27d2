"""One fit's static problem: the parametrisation, the loss, the length and the
kernel method; the objective ``L(u) = loss(p_T(theta(u)), q)`` and its checks."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array

from .. import metrics
from .._checks import check_positive_int
from ..errors import ConfigError
from ..model import RolloutModel, check_model
from ..rollout import METHODS, influence
from .losses import resolve_loss
from .parametrisation import CONTENTS, FIELDS, SCHEDULES, _check_names, _Parametrisation, model_array

__all__ = ["TARGET_SUM_TOLERANCE", "objective"]

# How far a target's sum may be from 1 before it is refused rather than
# renormalised: profiles written as CSV with 6+ significant digits sum to 1
# within ~1e-5 at N = 10^5 positions; a sum off by more is a wrong file.
TARGET_SUM_TOLERANCE = 1e-3
"""A target profile whose sum is further than this from 1 is refused rather than renormalised."""


@dataclasses.dataclass(frozen=True)
class _Problem:
    """Everything static about one fit: a jit static argument, so a second
    identical fit reuses the compiled scan."""

    parametrisation: _Parametrisation
    loss: Callable
    n: int
    method: str
    optimizer: optax.GradientTransformation


def _profile(raw, fixed: RolloutModel, problem: _Problem):
    """The influence profile of the model at the unconstrained point `raw`."""
    values = problem.parametrisation.values(raw)
    names = tuple(values)
    model = eqx.tree_at(lambda m: tuple(model_array(m, name) for name in names), fixed,
                        tuple(values[name] for name in names), is_leaf=lambda x: x is None)
    return influence(model, problem.n, method=problem.method)


def _objective(raw, fixed: RolloutModel, target, problem: _Problem):
    return problem.loss(_profile(raw, fixed, problem), target)


def check_target(target, n: int) -> np.ndarray:
    """`target` as a checked profile of length `n`.

    Finite, ``>= 0``, one dimension of length `n`, and
    ``|sum_i target_i - 1| <= TARGET_SUM_TOLERANCE``; returned normalised.
    """
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


def check_non_negative_int(field: str, value) -> int:
    """`value` as an ``int >= 0`` (a bool is refused); a ConfigError naming `field` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{field}: got {value!r}; allowed: an integer >= 0")
    return int(value)


def _as_numpy_model(model, n: int):
    """The model as NumPy float64 arrays, re-checked by `RolloutModel.create` (the kernel's own ranges)."""
    kernel = jax.tree.map(lambda x: np.asarray(x, dtype=np.float64), model.kernel)
    try:
        return RolloutModel.create(kernel=kernel, lambdas=np.asarray(model.lambdas, dtype=np.float64),
                                   sequence_length=n, composition=model.composition)
    except ConfigError as error:
        raise ConfigError(f"fit: the optimisation left the valid range ({error}); "
                          "try fewer free arrays or a smaller learning rate") from None


def _compare(p, target) -> metrics.Comparison:
    # normalize: a float32 profile may miss a sum of 1 by more than compare's 1e-6.
    return metrics.compare(np.asarray(p, dtype=np.float64), target, normalize=True)


def _setup(model, target, names, schedule, content, loss, n, method, optimizer):
    """Check the arguments; the static problem, the fixed part of the model, the target."""
    check_model(model)
    fittable = dict(type(model.kernel).fittable_fields)  # name -> its map (`AbstractKernel.fittable_fields`)
    names = _check_names(names, tuple(fittable))
    if set(names) - {"lambdas"} - set(fittable):
        # A kernel that declares no such field (dense measured attention, a table, a power kernel) is held fixed.
        allowed = ", ".join(("lambdas", *fittable)) if fittable else \
            "lambdas (the kernel is held fixed; fit it with jaxroll fit-kernel)"
        raise ConfigError(f"fit: {','.join(names)} on a model with a {type(model.kernel).__name__}; "
                          f"allowed: {allowed}")
    n_checked = model.sequence_length if n is None else n
    if isinstance(n_checked, (int, np.integer)) and n_checked >= 1:
        model.kernel.check_length(int(n_checked))
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
    target = jnp.asarray(check_target(target, n))
    heads = model.num_heads if fittable else 1  # a kernel without fittable fields: lambdas alone
    declared = tuple((name, kind, tuple(np.shape(getattr(model.kernel, name)))) for name, kind in fittable.items()
                     if name in names and name not in FIELDS)
    parametrisation = _Parametrisation(names, schedule, content, model.num_layers, heads, declared)
    problem = _Problem(parametrisation, resolve_loss(loss), n, method, optimizer)
    # The free/fixed split: the free arrays are rebuilt from the
    # unconstrained point at every evaluation, the rest travel as they are.
    spec = eqx.tree_at(lambda m: tuple(model_array(m, name) for name in names),
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
