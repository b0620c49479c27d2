"""Which combinations of the free parameters a profile determines: the SVD of
the profile's Jacobian in the unconstrained coordinates."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..model import RolloutModel
from .design import DESIGN_FLOATS
from .problem import _profile, _Problem, _setup

__all__ = ["DETERMINED_THRESHOLD", "IDENTIFIABILITY_MAX_PARAMETERS", "Identifiability", "identifiability"]

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
"""Above this many free parameters the identifiability report is skipped (one forward-mode pass per parameter)."""


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
        """Lines for a terminal: singular values, the combinations of parameters
        (directions) each labelled determined or not, the parameters that are
        determined, and a warning line naming those that are not (if any).

        A combination can be determined while a parameter in it is not (the
        parameter also moves along an undetermined combination); the labels
        say "combination", and the warning line says so when it happens.
        """
        k = len(self.names)
        values = self.singular_values
        shown = " ".join(f"{s:.3g}" for s in values) if k <= 8 else \
            " ".join(f"{s:.3g}" for s in values[:4]) + " ... " + " ".join(f"{s:.3g}" for s in values[-4:])
        lines = [f"identifiability: Jacobian dp/du of {k} parameter(s), resolution rho = {self.resolution:.3g}",
                 f"  singular values: {shown}"]
        combination_determined = self.direction_uncertainty <= self.threshold
        for index in (range(k) if k <= 4 else (0, 1, k - 2, k - 1)):
            state = (f"determined to +-{self.direction_uncertainty[index]:.2g}" if combination_determined[index]
                     else f"not determined (+-{self.direction_uncertainty[index]:.2g})")
            lines.append(f"  combination {index + 1} (s = {values[index]:.3g}): {state}: {self.direction(index)}")
        good = [f"{name} +-{sigma:.2g}" for name, sigma, ok in
                zip(self.names, self.parameter_uncertainty, self.determined) if ok]
        if good:
            lines.append(f"  determined parameters (to +-{self.threshold:g}): " + (
                ", ".join(good) if len(good) <= 6 else f"{len(good)} of {k}, e.g. " + ", ".join(good[:3])))
        bad = self.undetermined
        if bad:
            listed = ", ".join(bad) if len(bad) <= 6 else _grouped(bad, self.names)
            # A parameter that loads on a determined combination, yet is not determined itself.
            loaded = np.abs(self.directions[combination_determined]) >= 0.005
            mixed = any(loaded[:, self.names.index(name)].any() for name in bad)
            lines.append(f"warning: not determined by the profile (uncertainty > {self.threshold:g} in "
                         f"unconstrained units at rho = {self.resolution:.2g}): {listed}"
                         + ("; each also moves along a combination that is not determined, so a determined "
                            "combination above fixes only the combination" if mixed else ""))
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


def identifiability_from_jacobian(jacobian: np.ndarray, names: Sequence[str], residual: float, scale: float,
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
    batch_size = max(1, min(parametrisation.size, DESIGN_FLOATS // per_column))
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
    return identifiability_from_jacobian(np.asarray(jacobian)[:, keep], names, residual, float(np.linalg.norm(target)))


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
