"""The bridge between the kinetic theory and the rollout, both ways.

The continuum causal-ALiBi operator ``K(x, y) = lambda e^(lambda y) /
(e^(lambda x) - 1)`` (y < x) has powers ``K^(k+1)(1, s) = [lambda e^(lambda s)
/ (e^lambda - 1)] Y(s)^k / k!``, so a kinetic mode is an off-diagonal entry
of a matrix exponential,

    g(c; s) = sum_(k >= 1) c^k K^k(1, s) / k! = [exp(c K) - I](1, s).

A rollout with one ALiBi head of slope ``m = lambda / N`` (``A[i, j] ~
e^(-m (i - j))``, j <= i), a constant schedule ``lambda_t = c / T`` and T
layers is ``P_T = ((1 - c/T) I + (c/T) A)^T = sum_k Binom(T, c/T)_k A^k``,
which tends to ``exp(c (A - I)) = e^(-c) sum_k c^k A^k / k!`` (Poisson path
lengths) as T grows; and ``N A^k[N-1, j] -> K^k(1, j/N)`` as N grows. Hence

    N e^c P_T[N-1, j]  ->  g(c; j / N)      (j < N - 1),

with errors ``O(1/T)`` (binomial against Poisson) and ``O(1/N)`` (sums
against integrals, the self term ``A[i, i] ~ lambda / N``).

==========================  ===================================  ==========================
kinetic                     rollout                              note
==========================  ===================================  ==========================
s in (0, 1)                 j / N                                query s = 1 is j = N - 1
lambda                      m N (ALiBi slope x length)           `kinetic_slope`, `rollout_slope`
c = a_n t (one mode)        total mixing ``sum_t lambda_t``      only the sum survives T -> inf
g(c; s)                     N e^c P_T[N-1, j]                    `mode_from_rollout`
S_t = sum omega_n g(a_n t)  a mixture of rollouts, one per mode  `matching_rollout`: one c
beta, M, the modes n        none                                 the particle model's
                                                                 temperature and spectrum
normalisation: S > 0 on     P_T[N-1, :] sums to 1 over N         `two_theories.to_distribution`
(0, 1), not normalised      positions
none (measure zero)         self term A[i, i], identity mass     the point mass e^(-c) at
                            e^(-c) at j = N - 1                  the query
none                        diagonal content d_h                 content acts through a_n
none                        per-layer lambda_t                   only the total
==========================  ===================================  ==========================
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ..errors import ConfigError
from ..model import RolloutModel
from . import kinetic

__all__ = [
    "rollout_slope", "kinetic_slope", "mode_rollout", "matching_rollout", "mode_from_rollout",
    "KineticCounterpart", "kinetic_counterpart", "sign_flip_mixing",
]


def rollout_slope(lam: ArrayLike, n: int) -> Array:
    """The ALiBi slope ``m = lambda / N`` of a rollout at length `n`."""
    return jnp.asarray(lam) / n


def kinetic_slope(m: ArrayLike, n: int) -> Array:
    """The kinetic ``lambda = m N`` of an ALiBi slope `m` at length `n`."""
    return jnp.asarray(m) * n


def mode_rollout(total_mixing: float, lam: float, n: int, num_layers: int) -> RolloutModel:
    """The rollout whose profile tends to the mode ``g(c; s)``, ``c = total_mixing``.

    One ALiBi head of slope ``lambda / n``, no content, T = `num_layers`
    layers of constant ``lambda_t = c / T`` (needs ``c <= T``), length `n`.
    Compare with ``mode_from_rollout(jaxroll.influence(model), c)``.

    Raises:
        ConfigError: ``c / T`` outside [0, 1], ``lambda < 0``, bad sizes.
    """
    c = float(total_mixing)
    if not (np.isfinite(c) and 0 <= c <= num_layers):
        raise ConfigError(f"total_mixing: got {c}; allowed: 0 <= c <= num_layers = {num_layers} "
                          "(each lambda_t = c / T in [0, 1])")
    if not (np.isfinite(lam) and lam >= 0):
        raise ConfigError(f"lambda: got {lam}; allowed: >= 0 (an ALiBi slope is not negative)")
    return RolloutModel.create(num_layers=num_layers, num_heads=1, lambdas=c / num_layers,
                               alibi_slopes=[float(lam) / n], sequence_length=n)


def matching_rollout(model: kinetic.KineticModel, n: int, num_layers: int) -> RolloutModel:
    """The rollout a one-head kinetic profile should be compared with.

    One ALiBi head of slope ``lambda / n`` and constant ``lambda_t = c / T``
    with ``c = a_eff t``, ``a_eff = sum_n omega_n a_n^2 / sum_n omega_n a_n``
    (`kinetic.effective_rate`). This c puts the rollout's end-slope sign
    change (at ``c = 2 (1 - e^(-lambda))``, `sign_flip_mixing`) exactly at
    the kinetic threshold ``t = t_crit``: below, at and above the threshold
    the two profiles bend the same way near the query. The rollout carries one
    rate; the kinetic profile superposes ``n_max`` of them (weights
    ``omega_n``), so away from s = 1 they differ by the spread of ``a_n``.

    Raises:
        ConfigError: more than one head (the rollout's heads average in A,
            not in the profile), or ``c > num_layers``.
    """
    if model.num_heads != 1:
        raise ConfigError(f"model: {model.num_heads} heads; allowed: 1 (a multi-head kinetic profile "
                          "is a signed sum of profiles, not one rollout)")
    c = float(kinetic.effective_rate(model.beta[0], model.M, model.n_max) * model.t)
    return mode_rollout(c, float(model.lam[0]), n, num_layers)


def mode_from_rollout(p: Float[ArrayLike, " n"], total_mixing: float
                      ) -> tuple[Float[Array, " n-1"], Float[Array, " n-1"]]:
    """``(s_j, N e^c p_j)`` for ``j = 0..N-2``: a rollout profile on the kinetic scale.

    The last position (the query, ``s = 1``) is left out: it carries the
    identity path's point mass ``e^(-c)``, which the kinetic profile does not.
    """
    p = jnp.asarray(p)
    n = p.shape[-1]
    s = jnp.arange(n - 1, dtype=p.dtype) / n
    return s, n * jnp.exp(jnp.asarray(total_mixing, p.dtype)) * p[..., :-1]


class KineticCounterpart(NamedTuple):
    """What a one-head, content-free ALiBi rollout maps to in the kinetic theory."""

    lam: float              # m N
    total_mixing: float     # c = sum_t lambda_t, the kinetic a t of a single mode
    n: int                  # N, positions s_j = j / N
    threshold: float        # 2 (1 - e^(-lambda)): the end slope changes sign at c = threshold


def kinetic_counterpart(model: RolloutModel, n: int | None = None) -> KineticCounterpart:
    """The kinetic parameters of a rollout: ``lambda = m N``, ``c = sum_t lambda_t``.

    The inverse of `mode_rollout`. Only the total mixing survives (the limit
    ``max_t lambda_t -> 0`` turns any schedule's path-length law into a
    Poisson law of mean c); beta, M and the modes have no counterpart.

    Raises:
        ConfigError: more than one head, slopes that differ between layers,
            nonzero diagonal content (it has no kinetic counterpart), or a mask
            other than causal.
    """
    n = model.sequence_length if n is None else int(n)
    slopes = np.asarray(model.alibi_slopes, dtype=np.float64)
    if model.num_heads != 1:
        raise ConfigError(f"model: {model.num_heads} heads; allowed: 1 (the kinetic mode has one slope)")
    if np.ptp(slopes) > 0:
        raise ConfigError("alibi_slopes: differ between layers; allowed: one slope for every layer")
    if np.any(np.asarray(model.diagonal_scores) != 0):
        raise ConfigError("diagonal_scores: nonzero; allowed: 0 (the kinetic theory has no diagonal content)")
    if model.mask != "causal":
        raise ConfigError(f"mask: got {model.mask!r}; allowed: 'causal'")
    lam = float(slopes[0, 0] * n)
    return KineticCounterpart(lam=lam, total_mixing=float(np.sum(np.asarray(model.lambdas))), n=n,
                              threshold=float(sign_flip_mixing(lam)))


def sign_flip_mixing(lam: ArrayLike) -> Array:
    """``c* = 2 (1 - e^(-lambda))``: a single mode's end slope ``dg/ds (s -> 1)`` changes sign at c = c*.

    `kinetic.critical_time` for one mode of rate 1. Corollary for the
    rollout: with position-only ALiBi (slope m, length N) the last row's
    slope near the query changes sign at total mixing ``~ 2 (1 - e^(-m N))``.
    """
    return 2 * (-jnp.expm1(-jnp.asarray(lam)))
