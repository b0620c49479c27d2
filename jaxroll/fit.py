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
update inside, and ``restarts`` initialisations run side by side under
`jax.vmap`.

Two stages. A loss over a few parameters can have spurious minima that a
local optimiser started from a "generic" point never leaves (a power-decay fit
started from a constant schedule stops at ``beta -> 0`` with the same total
mixing as the truth). So `fit` first evaluates a space-filling design over the
parameter box (`BOX`; a Halton sequence for up to `GLOBAL_DIMENSIONS`
parameters, uniform draws beyond) together with the starting point, all in one
jit-compiled, vmapped call, and refines the best ``restarts`` of them with the
optimiser. After the fit, `identifiability` linearises the profile at the
solution and reports which parameter combinations it determines.
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

__all__ = ["FIELDS", "SCHEDULES", "CONTENTS", "LOSSES", "VARIANTS", "BOX", "GLOBAL_DIMENSIONS",
           "GLOBAL_POINTS", "DETERMINED_THRESHOLD", "FitResult", "Identifiability", "fit", "objective",
           "identifiability", "compare_variants", "default_optimizer"]

FIELDS = ("lambdas", "diagonal_scores", "alibi_slopes", "head_weights", "temperature")
"""The model fields `fit` can free (``fit=(...)``)."""
SCHEDULES = ("free", "power_decay", "constant")
"""How `fit` parametrises a free lambda schedule: one value per layer, ``lambda_0 / (t + 1)^beta``, or one value."""
CONTENTS = ("per_layer", "per_head")
"""How `fit` frees diagonal content: one score per layer (every head) or one per layer and head."""
LOSSES = ("wasserstein", "kl", "l2")
"""The built-in losses of `fit` (any callable ``loss(p, q)`` works too): `metrics.wasserstein`, `metrics.kl`, squared L2."""

# How far a target's sum may be from 1 before it is refused rather than
# renormalised: profiles written as CSV with 6+ significant digits sum to 1
# within ~1e-5 at N = 10^5 positions; a sum off by more is a wrong file.
TARGET_SUM_TOLERANCE = 1e-3
# Open-interval clipping before inverting sigmoid/softplus, so that a model
# with lambda = 0 or 1, or a zero slope, starts from a finite point.
_EDGE = 1e-6

# The box of the global stage, in the model's own units: a design point is
# drawn in it and mapped to the unconstrained coordinates. The ranges cover
# what measured models show (lambda_t of 0.05-0.9, ALiBi slopes 2^-8 ... 1/2,
# content of a few logits) with a margin; beta up to 4 reaches schedules that
# are all in the first few layers.
BOX = {
    "lambda": (0.01, 0.99),           # lambda_t, lambda_0, lambda_const: uniform
    "beta": (0.0, 4.0),               # power-decay exponent: uniform
    "diagonal_scores": (-6.0, 6.0),   # logits: uniform
    "alibi_slopes": (1e-3, 1.0),      # log-uniform
    "head_weights": (-3.0, 3.0),      # softmax logits: uniform
    "temperature": (0.25, 4.0),       # log-uniform
}
"""The global stage's parameter box, field -> (low, high) in the model's units (log-uniform for slopes and temperature)."""
# Up to this many free parameters the global stage runs by default, with
# GLOBAL_POINTS design points: in two dimensions 128 Halton points put a point
# within ~0.09 of every box point (box scaled to the unit square), finer than
# the basins seen in the MPT-7B power-decay problem, and at N = 256 they cost
# about as much as 20 optimisation steps. Beyond it a design samples the box
# too thinly to help, and restarts (drawn over the box) are the tool.
GLOBAL_DIMENSIONS = 8
"""Up to this many free parameters `fit` runs the global stage by default (``search=None``)."""
GLOBAL_POINTS = 128
"""Points of the global stage's Halton design when ``search`` is None and at most `GLOBAL_DIMENSIONS` parameters are free."""
# Bases of the Halton design, one per dimension.
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19)
# Peak memory of the design evaluation: points go through lax.map in batches
# of at most this many (layers x heads x positions) floats per batch.
_DESIGN_FLOATS = 2 ** 26
# Identifiability: a parameter is reported as determined when its linearised
# uncertainty is below this, in unconstrained units (see `Identifiability`).
DETERMINED_THRESHOLD = 0.1
"""A parameter is determined by the profile when its linearised uncertainty ``sigma_i`` is at most this, in unconstrained units (`Identifiability`)."""
# The smallest profile resolution the report assumes, relative to ||q||_2:
# profiles are computed in float32 and written with ~7 significant digits.
_PROFILE_PRECISION = 1e-6
# The Jacobian costs one forward-mode pass per parameter: above this many
# free parameters the report is skipped (FitResult.identifiability is None).
IDENTIFIABILITY_MAX_PARAMETERS = 512


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
        search_points: the number of design points of the global stage
            (0 when it did not run).
        identifiability: an `Identifiability` report at the solution, or
            None (more than `IDENTIFIABILITY_MAX_PARAMETERS` free
            parameters, or nothing was fitted).
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


class Identifiability(eqx.Module):
    """Which combinations of the free parameters the profile determines, at the fit.

    Linearise the influence profile at the solution ``u*`` (the unconstrained
    coordinates of the module docstring, flattened in the order of `names`):

        p(u* + delta) ~ p(u*) + J delta,   J = dp/du  (n, k),   J = U S V^T.

    A step of length 1 along the right singular vector ``v_k`` (a row of
    `directions`) moves the profile by ``s_k`` in L2. If the profile is known
    only to within ``rho`` (L2), the parameters consistent with it form the
    ellipsoid ``||S V^T delta||_2 <= rho``: it extends ``rho / s_k`` along
    ``v_k`` (`direction_uncertainty`) and

        sigma_i = rho * sqrt(sum_k V_ik^2 / s_k^2)

    along parameter i (`parameter_uncertainty`). ``rho = max(||p(u*) - q||_2,
    1e-6 ||q||_2)``: the fit's own residual (the data cannot tell apart
    parameters whose profiles differ by less than what the fit leaves
    unexplained), floored at the precision of a float32 profile written with
    7 digits. A parameter is `determined` when ``sigma_i <= threshold``
    (`DETERMINED_THRESHOLD` = 0.1 unconstrained units: 0.1 of a logit or a
    softplus argument is a ~10% relative change of a small lambda, slope,
    temperature or head weight, and 0.1 logit of content).

    Head weights enter through a softmax, which a common shift of a layer's
    logits leaves unchanged (an exact null direction, not a property of the
    data): the report uses the log-ratios ``log(w_th / w_t0)``, h >= 1, so
    head 0's logit is not a parameter here.

    Attributes:
        names: ``(k,)`` the parameters (``lambda_0``, ``beta``,
            ``lambdas[3]``, ``diagonal_scores[5]``, ...).
        jacobian: ``(n, k)``, ``dp/du`` at the solution.
        singular_values: ``(k,)``, descending.
        directions: ``(k, k)``, row k the right singular vector of ``s_k``.
        resolution: ``rho``.
        direction_uncertainty: ``(k,)``, ``rho / s_k``.
        parameter_uncertainty: ``(k,)``, ``sigma_i``.
        threshold: the `determined` threshold.
        determined: ``(k,)`` bool.
    """

    names: tuple[str, ...] = eqx.field(static=True)
    jacobian: np.ndarray
    singular_values: np.ndarray
    directions: np.ndarray
    resolution: float
    direction_uncertainty: np.ndarray
    parameter_uncertainty: np.ndarray
    threshold: float
    determined: np.ndarray

    @property
    def undetermined(self) -> tuple[str, ...]:
        """The names of the parameters the profile does not determine."""
        return tuple(name for name, ok in zip(self.names, self.determined) if not ok)

    def direction(self, k: int, terms: int = 3) -> str:
        """Direction k as its largest loadings, e.g. ``+0.93 lambda_0 -0.36 beta``."""
        vector = self.directions[k]
        largest = np.argsort(-np.abs(vector), kind="stable")[:terms]
        return " ".join(f"{vector[i]:+.2f} {self.names[i]}" for i in largest)

    def summary(self) -> list[str]:
        """Lines for a terminal: singular values, directions, and a warning line
        naming the parameters that are not determined (if any)."""
        k = len(self.names)
        values = self.singular_values
        shown = " ".join(f"{s:.3g}" for s in values) if k <= 8 else \
            " ".join(f"{s:.3g}" for s in values[:4]) + " ... " + " ".join(f"{s:.3g}" for s in values[-4:])
        lines = [f"identifiability: Jacobian dp/du of {k} parameter(s), resolution rho = {self.resolution:.3g}",
                 f"  singular values: {shown}"]
        for index in (range(k) if k <= 4 else (0, 1, k - 2, k - 1)):
            lines.append(f"  s = {values[index]:.3g} (+-{self.direction_uncertainty[index]:.2g}): "
                         f"{self.direction(index)}")
        good = [f"{name} +-{sigma:.2g}" for name, sigma, ok in
                zip(self.names, self.parameter_uncertainty, self.determined) if ok]
        if good:
            lines.append(f"  determined (to +-{self.threshold:g}): " + (", ".join(good) if len(good) <= 6
                         else f"{len(good)} of {k}, e.g. " + ", ".join(good[:3])))
        bad = self.undetermined
        if bad:
            listed = ", ".join(bad) if len(bad) <= 6 else _grouped(bad, self.names)
            lines.append(f"warning: not determined by the profile (uncertainty > {self.threshold:g} in "
                         f"unconstrained units at rho = {self.resolution:.2g}): {listed}")
        return lines


def _grouped(chosen: Sequence[str], names: Sequence[str]) -> str:
    """``alibi_slopes (6 of 6), temperature``: entries of an array counted, scalars named."""
    def array(name):
        return name.split("[", 1)[0]

    parts = []
    for group in dict.fromkeys(array(name) for name in chosen):
        count = sum(array(name) == group for name in chosen)
        total = sum(array(name) == group for name in names)
        parts.append(group if total == 1 and group in chosen else f"{group} ({count} of {total})")
    return ", ".join(parts)


def _identifiability(jacobian: np.ndarray, names: Sequence[str], residual: float, scale: float,
                     threshold: float = DETERMINED_THRESHOLD) -> Identifiability:
    """The report of `Identifiability` from the Jacobian and the fit's residual."""
    jacobian = np.asarray(jacobian, dtype=np.float64)
    n, k = jacobian.shape
    # With fewer positions than parameters (n < k) the k - n missing right
    # singular vectors are exact null directions: take the full V (U is then
    # only n x n) and give them singular value 0.
    _, singular, directions = np.linalg.svd(jacobian, full_matrices=n < k)
    singular = np.concatenate([singular, np.zeros(k - singular.size)])
    resolution = max(float(residual), _PROFILE_PRECISION * float(scale))
    with np.errstate(divide="ignore"):
        inverse = np.where(singular > 0, 1.0 / singular, np.inf)
    direction_uncertainty = resolution * inverse
    with np.errstate(invalid="ignore"):
        variance = np.where(directions ** 2 > 0, directions ** 2 * inverse[:, None] ** 2, 0.0)
    parameter_uncertainty = resolution * np.sqrt(variance.sum(axis=0))
    return Identifiability(
        names=tuple(names), jacobian=jacobian, singular_values=singular, directions=directions,
        resolution=resolution, direction_uncertainty=direction_uncertainty,
        parameter_uncertainty=parameter_uncertainty, threshold=float(threshold),
        determined=parameter_uncertainty <= threshold)


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

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each free vector (the table of the module docstring)."""
        T, H = self.num_layers, self.num_heads
        shapes = {"lambdas": {"free": (T,), "power_decay": (2,), "constant": ()}[self.schedule],
                  "diagonal_scores": (T, 1) if self.content == "per_layer" else (T, H),
                  "alibi_slopes": (T, H), "head_weights": (T, H), "temperature": ()}
        return {name: shapes[name] for name in self.names}

    @property
    def size(self) -> int:
        """The number of free scalars."""
        return sum(math.prod(shape) for shape in self.shapes().values())

    def labels(self) -> tuple[str, ...]:
        """One name per free scalar, in the order of `flatten`."""
        labels = []
        for name, shape in self.shapes().items():
            if name == "lambdas" and self.schedule == "power_decay":
                labels += ["lambda_0", "beta"]
            elif name == "lambdas" and self.schedule == "constant":
                labels.append("lambda_const")
            elif name == "diagonal_scores" and self.content == "per_layer":
                labels += [f"diagonal_scores[{t}]" for t in range(shape[0])]
            elif not shape:
                labels.append(name)
            else:
                labels += [f"{name}[{','.join(map(str, index))}]" for index in np.ndindex(shape)]
        return tuple(labels)

    def flatten(self, raw: dict[str, Array]) -> Array:
        """The free vectors as one ``(size,)`` vector, in `names` order."""
        return jnp.concatenate([jnp.ravel(jnp.asarray(raw[name])) for name in self.names])

    def unflatten(self, flat: Array) -> dict[str, Array]:
        raw, offset = {}, 0
        for name, shape in self.shapes().items():
            size = math.prod(shape)
            raw[name] = flat[offset:offset + size].reshape(shape)
            offset += size
        return raw

    def from_unit(self, unit: Float[Array, " size"]) -> dict[str, Array]:
        """The unconstrained point of a point of the unit cube, through `BOX`.

        Each coordinate is placed in its array's box in the model's own units
        (uniform, or log-uniform for the positive scales) and then inverted
        through the array's parametrisation, so a design that fills the cube
        fills the box of valid models.
        """
        raw = self.unflatten(jnp.clip(unit, _EDGE, 1.0 - _EDGE))

        def uniform(w, box):
            return box[0] + (box[1] - box[0]) * w

        def log_uniform(w, box):
            return jnp.exp(uniform(w, (math.log(box[0]), math.log(box[1]))))

        def logit(x):
            return jnp.log(x) - jnp.log1p(-x)

        def inverse_softplus(x):
            x = jnp.maximum(x, _EDGE)
            return x + jnp.log(-jnp.expm1(-x))

        out = {}
        for name, w in raw.items():
            if name == "lambdas" and self.schedule == "power_decay":
                out[name] = jnp.stack([logit(uniform(w[0], BOX["lambda"])),
                                       inverse_softplus(uniform(w[1], BOX["beta"]))])
            elif name == "lambdas":
                out[name] = logit(uniform(w, BOX["lambda"]))
            elif name == "diagonal_scores" or name == "head_weights":
                out[name] = uniform(w, BOX[name])
            else:  # alibi_slopes, temperature
                out[name] = inverse_softplus(log_uniform(w, BOX[name]))
        return out

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


def _profile(raw, fixed: RolloutModel, problem: _Problem):
    """The influence profile of the model at the unconstrained point `raw`."""
    values = problem.parametrisation.values(raw)
    names = tuple(values)
    model = eqx.tree_at(lambda m: tuple(getattr(m, name) for name in names), fixed,
                        tuple(values[name] for name in names), is_leaf=lambda x: x is None)
    return influence(model, problem.n, method=problem.method)


def _objective(raw, fixed: RolloutModel, target, problem: _Problem):
    return problem.loss(_profile(raw, fixed, problem), target)


@functools.partial(jax.jit, static_argnames=("problem", "batch_size", "forward"))
def _profile_jacobian(flat, fixed, *, problem: _Problem, batch_size: int, forward: bool):
    """``dp/du`` (n, k) at the flat point `flat`: k Jacobian-vector products
    (forward mode, k << n for the fits this serves), batched by `lax.map`; or
    n vector-Jacobian products where forward mode is unavailable (a
    `jax.custom_vjp` inside the influence)."""
    unflatten = problem.parametrisation.unflatten

    def profile(x):
        return _profile(unflatten(x), fixed, problem)

    if forward:
        basis = jnp.eye(flat.size, dtype=flat.dtype)
        return jax.lax.map(lambda e: jax.jvp(profile, (flat,), (e,))[1], basis, batch_size=batch_size).T
    _, pullback = jax.vjp(profile, flat)
    basis = jnp.eye(problem.n, dtype=flat.dtype)
    return jax.lax.map(lambda e: pullback(e)[0], basis, batch_size=batch_size)


def _report(raw: dict[str, np.ndarray], fixed, target, profile, problem: _Problem) -> Identifiability | None:
    """`Identifiability` at the solution, or None above IDENTIFIABILITY_MAX_PARAMETERS."""
    parametrisation = problem.parametrisation
    if parametrisation.size > IDENTIFIABILITY_MAX_PARAMETERS:
        return None
    flat = parametrisation.flatten({name: jnp.asarray(u) for name, u in raw.items()})
    per_column = parametrisation.num_layers * parametrisation.num_heads * problem.n
    batch_size = max(1, min(parametrisation.size, _DESIGN_FLOATS // per_column))
    try:
        jacobian = _profile_jacobian(flat, fixed, problem=problem, batch_size=batch_size, forward=True)
    except TypeError:  # "can't apply forward-mode autodiff (jvp) to a custom_vjp function"
        jacobian = _profile_jacobian(flat, fixed, problem=problem, batch_size=batch_size, forward=False)
    labels = parametrisation.labels()
    # The softmax gauge of head weights: drop head 0's logit in every layer,
    # so the others are log-ratios log(w_th / w_t0) (see Identifiability).
    keep = [not label.startswith("head_weights[") or not label.endswith(",0]") for label in labels]
    names = [label.replace("head_weights[", "log_weight_ratio[") for label, kept in zip(labels, keep) if kept]
    residual = float(np.linalg.norm(np.asarray(profile, dtype=np.float64) - np.asarray(target)))
    return _identifiability(np.asarray(jacobian)[:, keep], names, residual, float(np.linalg.norm(target)))


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


@functools.lru_cache(maxsize=64)
def _with_extra_args(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optax.with_extra_args_support`, cached: the wrapper is part of the jit
    static problem, so the same optimizer object must give the same wrapper
    for a second fit to reuse the compiled scan (L-BFGS compiles for ~10 s)."""
    return optax.with_extra_args_support(optimizer)


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


def _check_non_negative_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{field}: got {value!r}; allowed: an integer >= 0")
    return int(value)


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


def identifiability(
    model: RolloutModel,
    target,
    *,
    fit: Sequence[str] | str = ("lambdas",),
    schedule: str = "free",
    content: str = "per_layer",
    n: int | None = None,
    method: str = "auto",
) -> Identifiability | None:
    """The `Identifiability` report at `model`'s own point, without fitting.

    What `fit` reports at its solution, here at the parameters of `model`
    (represented in the parametrisation of `fit`, `schedule`, `content`): use
    it to ask which parameters a profile could determine before a fit, or at
    a model fitted elsewhere. None above `IDENTIFIABILITY_MAX_PARAMETERS`
    free parameters. Arguments as in `fit`.
    """
    problem, fixed, target = _setup(model, target, fit, schedule, content, "wasserstein", n, method, None)
    raw = problem.parametrisation.initial(model)
    profile = _profile({name: jnp.asarray(u) for name, u in raw.items()}, fixed, problem)
    return _report(raw, fixed, target, profile, problem)


def _objective_of_point(raw, *, fixed, target, problem):
    return _objective(raw, fixed, target, problem)


def halton(count: int, dimension: int) -> Float[Array, "count dimension"]:
    """Points 1 .. `count` of the Halton sequence in ``(0, 1)^dimension``.

    Coordinate k of point i is the radical inverse of i in the k-th prime
    base, ``sum_r digit_r(i) base^-(r+1)``: a deterministic low-discrepancy
    design (Halton 1960) for up to ``len(_PRIMES)`` dimensions. Point 0 (the
    origin) is skipped.
    """
    if not 1 <= dimension <= len(_PRIMES):
        raise ConfigError(f"halton: dimension {dimension}; allowed: 1 to {len(_PRIMES)}")
    index = jnp.arange(1, count + 1)
    columns = []
    for base in _PRIMES[:dimension]:  # a handful of bases and digits, run once outside jit
        value = jnp.zeros(count, dtype=jnp.result_type(float))
        rest, scale = index, 1.0 / base
        for _ in range(math.ceil(math.log(count + 1, base)) + 1):
            value = value + (rest % base) * scale
            rest, scale = rest // base, scale / base
        columns.append(value)
    return jnp.stack(columns, axis=1)


def _design(parametrisation: _Parametrisation, points: int, key) -> Float[Array, "points size"]:
    """`points` points of the unit cube: Halton up to GLOBAL_DIMENSIONS, uniform draws beyond."""
    size = parametrisation.size
    if size <= GLOBAL_DIMENSIONS:
        return halton(points, size)
    return jax.random.uniform(key, (points, size), dtype=jnp.result_type(float))


@functools.partial(jax.jit, static_argnames=("problem", "batch_size"))
def _design_losses(raw, fixed, target, *, problem: _Problem, batch_size: int):
    """The loss at every point of `raw` (leading axis), one compiled call.

    `lax.map` with a batch size is a vmap over batches, run one batch after
    the other, so the memory stays bounded for long sequences and many points.
    """
    return jax.lax.map(lambda point: _objective(point, fixed, target, problem), raw,
                       batch_size=batch_size)


def _starting_points(problem: _Problem, fixed, target, initial: dict[str, np.ndarray], restarts: int,
                     search: int, key) -> tuple[dict[str, Array], int]:
    """The `restarts` best of the model's own point and ``max(search, restarts - 1)``
    design points over the box, and the number of design points evaluated.

    With ``search = 0`` there is nothing to choose from: the model's point and
    ``restarts - 1`` draws over the box are all refined (restarts that spread,
    not noise around the start).
    """
    parametrisation = problem.parametrisation
    start = {name: jnp.asarray(u, dtype=jnp.result_type(float))[None] for name, u in initial.items()}
    points = max(search, restarts - 1)
    if points == 0:
        return start, 0
    key = jax.random.PRNGKey(0) if key is None else key
    design = jax.vmap(parametrisation.from_unit)(_design(parametrisation, points, key))
    candidates = {name: jnp.concatenate([start[name], design[name]]) for name in start}
    if search == 0:
        return candidates, points
    per_point = parametrisation.num_layers * parametrisation.num_heads * problem.n
    batch_size = max(1, min(points + 1, _DESIGN_FLOATS // per_point))
    losses = np.asarray(_design_losses(candidates, fixed, target, problem=problem, batch_size=batch_size))
    # A non-finite loss (an extreme corner of the box) is never chosen; a
    # stable sort keeps the model's own point first among equals.
    order = np.argsort(np.where(np.isfinite(losses), losses, np.inf), kind="stable")[:restarts]
    return {name: u[order] for name, u in candidates.items()}, points


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
    search: int | None = None,
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

    Two stages:

    1. Global: the model's own point and `search` points of a design over
       the parameter box `BOX` (Halton for up to `GLOBAL_DIMENSIONS` free
       parameters, uniform draws from `key` beyond) are scored in one
       jit-compiled, vmapped call; the best `restarts` of them go on. By
       default ``search = GLOBAL_POINTS`` (128) when there are at most
       `GLOBAL_DIMENSIONS` (8) free parameters (a power-decay or constant
       schedule, a temperature, a few of them together) and 0 otherwise.
       With ``search = 0`` the r = `restarts` starting points are the model's
       own and r - 1 draws over the box, all refined.
    2. Local: `steps` optax updates from each starting point (default
       `default_optimizer(steps)`: Adam, learning rate 0.05 with a cosine
       decay) in one jit-compiled `lax.scan`, the starting points side by
       side under `jax.vmap`. The best point seen over all steps and
       restarts is returned.

    Then the profile's Jacobian at the solution gives the `Identifiability`
    report (``result.identifiability``; one forward-mode pass per free
    parameter, so it costs about what ``k / 3`` optimisation steps cost).

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
        restarts: starting points refined side by side, >= 1.
        search: design points of the global stage, >= 0 (0 turns it off;
            default: see above).
        key: a `jax.random` key for draws over the box (default ``PRNGKey(0)``).
        n: the sequence length (default ``model.sequence_length``); under a
            causal mask a profile at length n is exact for the first n
            tokens, so long models can be fitted at a short n.
        method: passed to `jaxroll.influence`.
        progress: show a progress bar over steps (runs in chunks of steps,
            each chunk one compiled scan, so jit is kept).

    Returns:
        A `FitResult`.

    Raises:
        ConfigError: bad target, unknown names, steps or restarts < 1,
            search < 0; one line.

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
                                    _with_extra_args(optimizer))
    parametrisation, loss_function, n = problem.parametrisation, problem.loss, problem.n

    size = parametrisation.size
    if search is None:
        search = GLOBAL_POINTS if size <= GLOBAL_DIMENSIONS else 0
    search = _check_non_negative_int("search", search)
    raw, search_points = _starting_points(problem, fixed, target, parametrisation.initial(model),
                                          restarts, search, key)
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
        search_points=search_points,
        identifiability=_report(best, fixed, target, profile, problem),
    )


VARIANTS = ("attention_only", "no_content", "content")
"""The rows of `compare_variants`: lambda = 1, the model without content, the model as given."""


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
