"""The kinetic theory of lost-in-the-middle, in closed form.

Duerinckx, Geshkovski and Rossi, *Kinetic theory for Transformers and the
lost-in-the-middle phenomenon* (arXiv 2605.09213), treat causal
self-attention as an interacting particle system: tokens are angles on a
circle, causal ALiBi weights have slope ``lambda / N``, depth is a continuous
time ``t`` and ``beta`` is the inverse temperature of the interaction. The
next-order correlation between the query (the last token) and the token at
relative position ``s in (0, 1)`` solves in closed form:

    a_n      = n^2 I_n(beta)                       (I_n: modified Bessel, integer n)
    omega_n  = exp(-pi^2 n^2 / (2 M^2))
    Y(s)     = log((e^lambda - 1) / (e^(lambda s) - 1))        (log(1/s) at lambda = 0)
    psi_c(y) = sum_k c^(k+1) y^k / (k! (k+1)!) = sqrt(c / y) I_1(2 sqrt(c y))
    g_a(t; s) = [lambda e^(lambda s) / (e^lambda - 1)] psi_(a t)(Y(s))
    S_t(s)   = sum_(n=1..n_max) omega_n g_(a_n)(t; s)

with the interior-minimum threshold (``dS_t/ds`` at ``s -> 1`` is positive
iff ``t < t_crit``, see `critical_time`):

    t_crit = 2 (1 - e^(-lambda)) sum_n omega_n a_n / sum_n omega_n a_n^2.

Every mode is a function of ``c = a_n t`` alone, ``g(c; s) = [exp(c K) -
I](1, s)`` for the continuum causal-ALiBi operator ``K(x, y) = lambda
e^(lambda y) / (e^(lambda x) - 1)`` (y < x); `jaxroll.theory.bridge` maps it
onto a rollout.

Numerics. Everything is computed in logarithms, so float32 neither
overflows nor underflows for ``lambda`` up to 1000 and ``t`` up to 50:
``log I_n(beta)`` is a log-sum-exp of its power series, ``I_1`` enters as
``log i1e(z) + z`` (`jax.scipy.special.i1e`), the prefactor and ``Y`` use
``log h(x) = log((1 - e^(-x)) / x)`` (smooth, ``h(0) = 1``) with ``expm1``.
All functions are pure ``jnp`` code: jit, vmap (over ``s``, ``t`` and the
parameters) and grad (in ``beta``, ``lambda``, ``t``, ``M`` and ``s``) apply.
``n_max`` and ``terms`` are Python integers (static).

Conventions: ``beta > 0``, ``t >= 0``, ``M > 0``; ``lambda`` may have any
sign (``lambda < 0`` is a primacy bias). ``s in (0, 1]``; ``s = 0`` is the
singular end (``Y = inf``) and returns ``inf`` for ``t > 0``.
"""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, i1e
from jaxtyping import Array, ArrayLike, Float

__all__ = [
    "N_MAX", "SERIES_TERMS",
    "log_bessel_i", "rates", "log_rates", "mode_weights", "effective_rate",
    "path_variable", "log_prefactor", "psi", "log_psi", "mode", "log_mode",
    "profile", "log_profile", "multi_head_profile", "critical_time",
    "KineticModel",
]

N_MAX = 20
"""Modes n = 1..N_MAX kept in S_t by default (the paper's reference values use 20)."""
SERIES_TERMS = 128
"""Terms of the log-space series for I_n(beta): exact to rounding for 0 < beta <= 100."""

# Below these the closed forms are 0/0 or lose digits; a series takes over
# (its first omitted term is < 1e-15 relative there).
_SMALL_X = 1e-3
_SMALL_Q = 1e-2


def _log_h(x: ArrayLike) -> Array:
    """``log h(x)``, ``h(x) = (1 - e^(-x)) / x`` (``h(0) = 1``), for every real x.

    ``h(x) = e^(max(-x, 0)) (1 - e^(-|x|)) / |x|``, so no exponential of a
    large argument is taken; near 0 the series ``-x/2 + x^2/24 - x^4/2880``.
    The two `where`s keep the gradient finite at x = 0.
    """
    x = jnp.asarray(x)
    small = jnp.abs(x) < _SMALL_X
    safe = jnp.where(small, 1.0, x)
    size = jnp.abs(safe)
    closed = jnp.maximum(-safe, 0.0) + jnp.log(-jnp.expm1(-size)) - jnp.log(size)
    series = -x / 2 + x**2 / 24 - x**4 / 2880
    return jnp.where(small, series, closed)


@functools.partial(jax.jit, static_argnames=("terms",))
def log_bessel_i(order: ArrayLike, beta: ArrayLike, terms: int = SERIES_TERMS) -> Array:
    """``log I_n(beta)`` for integer order ``n >= 0`` and ``beta > 0``, broadcast.

        I_n(beta) = sum_(k >= 0) (beta / 2)^(2k + n) / (k! (k + n)!)

    summed as a log-sum-exp of the first `terms` logarithms of its terms, so
    it neither overflows nor underflows in float32 (``log I_n(beta)`` is
    about ``beta``, not ``e^beta``). The terms peak at ``k ~ beta / 2``; the
    default 128 terms are exact to rounding for ``beta <= 100`` (checked
    against `scipy.special.iv`). Differentiable in ``beta``.
    """
    order = jnp.asarray(order)
    beta = jnp.asarray(beta)
    dtype = jnp.result_type(beta, float)
    k = jnp.arange(terms, dtype=dtype)
    order_f = order.astype(dtype)[..., None]
    log_half = jnp.log(beta / 2)[..., None]
    log_terms = (2 * k + order_f) * log_half - gammaln(k + 1) - gammaln(k + order_f + 1)
    return jax.nn.logsumexp(log_terms, axis=-1)


@functools.partial(jax.jit, static_argnames=("n_max",))
def log_rates(beta: ArrayLike, n_max: int = N_MAX) -> Float[Array, "... n_max"]:
    """``log a_n = 2 log n + log I_n(beta)`` for ``n = 1..n_max`` (last axis)."""
    beta = jnp.asarray(beta)
    n = jnp.arange(1, n_max + 1)
    return 2 * jnp.log(n.astype(jnp.result_type(beta, float))) + log_bessel_i(n, beta[..., None])


def rates(beta: ArrayLike, n_max: int = N_MAX) -> Float[Array, "... n_max"]:
    """The mode rates ``a_n = n^2 I_n(beta)``, ``n = 1..n_max`` (last axis)."""
    return jnp.exp(log_rates(beta, n_max))


def mode_weights(M: ArrayLike, n_max: int = N_MAX) -> Float[Array, "... n_max"]:
    """The mode weights ``omega_n = exp(-pi^2 n^2 / (2 M^2))``, ``n = 1..n_max``."""
    M = jnp.asarray(M)
    n = jnp.arange(1, n_max + 1, dtype=jnp.result_type(M, float))
    return jnp.exp(-(math.pi**2) * n**2 / (2 * M[..., None] ** 2))


@functools.partial(jax.jit, static_argnames=("n_max",))
def effective_rate(beta: ArrayLike, M: ArrayLike, n_max: int = N_MAX) -> Array:
    """``a_eff = sum_n omega_n a_n^2 / sum_n omega_n a_n``: one rate with the profile's threshold.

    ``t_crit = 2 (1 - e^(-lambda)) / a_eff``, so a single mode at ``c = a_eff t``
    (the rollout of `jaxroll.theory.bridge.matching_rollout`) changes its
    end slope at the same depth as the whole profile.
    """
    M = jnp.asarray(M)
    log_a = log_rates(beta, n_max)
    log_omega = -(math.pi**2) * jnp.arange(1, n_max + 1, dtype=log_a.dtype) ** 2 / (2 * M[..., None] ** 2)
    return jnp.exp(jax.nn.logsumexp(log_omega + 2 * log_a, axis=-1)
                   - jax.nn.logsumexp(log_omega + log_a, axis=-1))


@jax.jit
def path_variable(s: ArrayLike, lam: ArrayLike) -> Array:
    """``Y(s) = log((e^lambda - 1) / (e^(lambda s) - 1))``, ``log(1/s)`` at lambda = 0.

    The continuum ALiBi operator's powers are ``K^(k+1)(1, s) = [lambda
    e^(lambda s) / (e^lambda - 1)] Y(s)^k / k!``: Y is how many attention
    steps, in the Poisson sense, separate s from the query. Computed as

        Y(s) = -log s + lambda (1 - s) + log h(lambda) - log h(lambda s),

    ``h(x) = (1 - e^(-x)) / x``, valid for every real lambda. ``Y(1) = 0``.
    """
    s = jnp.asarray(s)
    lam = jnp.asarray(lam)
    return -jnp.log(s) + lam * (1 - s) + _log_h(lam) - _log_h(lam * s)


@jax.jit
def log_prefactor(s: ArrayLike, lam: ArrayLike) -> Array:
    """``log [lambda e^(lambda s) / (e^lambda - 1)] = lambda (s - 1) - log h(lambda)`` (0 at lambda = 0)."""
    s = jnp.asarray(s)
    lam = jnp.asarray(lam)
    return lam * (s - 1) - _log_h(lam)


@jax.jit
def log_psi(log_c: ArrayLike, y: ArrayLike) -> Array:
    """``log psi_c(y)`` from ``log c``, with ``psi_c(y) = sqrt(c / y) I_1(2 sqrt(c y)) = c F(c y)``.

    ``psi_c(y) = sum_k c^(k+1) y^k / (k! (k+1)!)`` tends to ``c`` as
    ``y -> 0``; ``psi_c(0) = c``. Takes ``log c`` because ``c = a_n t``
    reaches ``e^beta``. ``y >= 0``.

    ``log F(q) = log i1e(z) + z - log(q) / 2`` with ``q = c y``, ``z = 2 sqrt q``
    (i1e is ``e^(-z) I_1(z)``: no overflow); for small q the series
    ``F(q) = sum_k q^k / (k! (k+1)!)`` gives ``log F = q/2 - q^2/24 + q^3/144``.
    """
    log_c = jnp.asarray(log_c)
    y = jnp.asarray(y)
    positive = y > 0
    log_q = log_c + jnp.log(jnp.where(positive, y, 1.0))
    small = ~positive | (log_q < math.log(_SMALL_Q))
    # q = c y, written so that dq/dy = c also at y = 0 (the end slope at s = 1)
    # and so that a huge c never meets y = 0 as inf * 0.
    q = jnp.where(positive, jnp.exp(jnp.where(small, log_q, 0.0)),
                  y * jnp.exp(jnp.minimum(log_c, 60.0)))
    q = jnp.where(small, q, 0.0)
    series = q / 2 - q**2 / 24 + q**3 / 144
    safe_log_q = jnp.where(small, 0.0, log_q)
    z = 2 * jnp.exp(safe_log_q / 2)
    closed = jnp.log(i1e(z)) + z - safe_log_q / 2
    return log_c + jnp.where(small, series, closed)


@jax.jit
def psi(c: ArrayLike, y: ArrayLike) -> Array:
    """``psi_c(y) = sqrt(c / y) I_1(2 sqrt(c y)) = sum_k c^(k+1) y^k / (k! (k+1)!)``, ``c > 0``, ``y >= 0``."""
    return jnp.exp(log_psi(jnp.log(jnp.asarray(c)), y))


@jax.jit
def log_mode(log_c: ArrayLike, s: ArrayLike, lam: ArrayLike) -> Array:
    """``log g(c; s)`` from ``log c``: ``g = [lambda e^(lambda s) / (e^lambda - 1)] psi_c(Y(s))``.

    One mode of the profile with ``c = a t``; equal to ``[exp(c K) - I](1, s)``.
    """
    return log_prefactor(s, lam) + log_psi(log_c, path_variable(s, lam))


@jax.jit
def mode(c: ArrayLike, s: ArrayLike, lam: ArrayLike) -> Array:
    """One mode ``g(c; s) = [lambda e^(lambda s) / (e^lambda - 1)] psi_c(Y(s))``, ``c = a t > 0``.

    The limit of ``N e^c P_T[N-1, j]`` at ``s = j / N`` for a rollout with one
    ALiBi head of slope ``lambda / N`` and total mixing c
    (`jaxroll.theory.bridge`).
    """
    return jnp.exp(log_mode(jnp.log(jnp.asarray(c)), s, lam))


@functools.partial(jax.jit, static_argnames=("n_max",))
def log_profile(s: ArrayLike, t: ArrayLike, beta: ArrayLike, lam: ArrayLike, M: ArrayLike,
                n_max: int = N_MAX) -> Array:
    """``log S_t(s)``, ``S_t(s) = sum_(n=1..n_max) omega_n g(a_n t; s)``, broadcast over the arguments.

    A log-sum-exp over modes of ``log omega_n + log g(log a_n + log t; s)``.
    ``t = 0`` gives ``-inf`` (no correlation yet).
    """
    s, t, beta, lam, M = (jnp.asarray(x) for x in (s, t, beta, lam, M))
    log_a = log_rates(beta, n_max)                                   # (..., n)
    n = jnp.arange(1, n_max + 1, dtype=log_a.dtype)
    log_omega = -(math.pi**2) * n**2 / (2 * M[..., None] ** 2)
    log_c = log_a + jnp.log(t)[..., None]
    terms = log_omega + log_mode(log_c, s[..., None], lam[..., None])
    return jax.nn.logsumexp(terms, axis=-1)


@functools.partial(jax.jit, static_argnames=("n_max",))
def profile(s: ArrayLike, t: ArrayLike, beta: ArrayLike, lam: ArrayLike, M: ArrayLike,
            n_max: int = N_MAX) -> Array:
    """The kinetic profile ``S_t(s) = sum_(n=1..n_max) omega_n g_(a_n)(t; s)``, broadcast.

    Args:
        s: relative source positions in (0, 1] (the query is at s = 1).
        t: depth (continuous time), >= 0.
        beta: inverse temperature, > 0.
        lam: ALiBi slope times the length (``lambda = m N``).
        M: the mode width in ``omega_n = exp(-pi^2 n^2 / (2 M^2))``.
        n_max: modes kept (static).

    Returns:
        ``S_t(s)``, unnormalised and positive (``jaxroll.theory.two_theories`` turns it
        into a distribution over N positions).

    Example:
        >>> from jaxroll.theory import kinetic
        >>> float(kinetic.profile(0.5, 1.0, 1.0, 1.0, 8.0))  # doctest: +ELLIPSIS
        1.2655...
    """
    return jnp.exp(log_profile(s, t, beta, lam, M, n_max))


@functools.partial(jax.jit, static_argnames=("n_max",))
def multi_head_profile(s: ArrayLike, t: ArrayLike, beta: Float[Array, " heads"],
                       lam: Float[Array, " heads"], weights: Float[Array, " heads"], M: ArrayLike,
                       n_max: int = N_MAX) -> Array:
    """``sum_h w_h S_t(s; beta_h, lambda_h)`` at a common t and M; weights may be negative.

    `s` broadcasts against ``t``; the head axis is the last one of `beta`,
    `lam` and `weights` (shape ``(H,)``). Summed by a signed log-sum-exp, so
    heads whose ``S`` alone would overflow float32 cancel or add correctly.
    """
    s, t = jnp.asarray(s), jnp.asarray(t)
    log_heads = log_profile(s[..., None], t[..., None], jnp.asarray(beta), jnp.asarray(lam), M, n_max)
    value, sign = jax.nn.logsumexp(log_heads, axis=-1, b=jnp.asarray(weights), return_sign=True)
    return sign * jnp.exp(value)


@functools.partial(jax.jit, static_argnames=("n_max",))
def critical_time(beta: ArrayLike, lam: ArrayLike, M: ArrayLike, n_max: int = N_MAX) -> Array:
    """The interior-minimum threshold ``t_crit = 2 (1 - e^(-lambda)) sum_n omega_n a_n / sum_n omega_n a_n^2``.

    Near the query, with ``u = 1 - s`` and ``kappa = lambda / (1 - e^(-lambda))``,
    ``Y ~ kappa u`` and ``g(c; s) ~ kappa c (1 - lambda u + kappa c u / 2)``, so

        dS_t/ds (s -> 1) = kappa t sum_n omega_n a_n (lambda - kappa a_n t / 2),

    positive (the profile rises into the query: an interior minimum, since
    S blows up at s -> 0) iff ``t < t_crit``. For ``lambda <= 0`` the
    formula is ``<= 0``: the end slope is negative at every t > 0.
    """
    lam = jnp.asarray(lam)
    return 2 * (-jnp.expm1(-lam)) / effective_rate(beta, M, n_max)


class KineticModel(eqx.Module):
    """The parameters of a kinetic profile with H heads (a PyTree, for fits).

    ``S(s) = sum_h w_h S_t(s; beta_h, lambda_h)`` at a common depth t and mode
    width M (`multi_head_profile`).
    """

    beta: Float[Array, " heads"]       # inverse temperature beta_h > 0
    lam: Float[Array, " heads"]        # ALiBi slope times length, lambda_h = m_h N
    weights: Float[Array, " heads"]    # w_h (any sign)
    t: Float[Array, ""]                # depth (continuous time) >= 0
    M: Float[Array, ""]                # mode width in omega_n
    n_max: int = eqx.field(static=True, default=N_MAX)

    @classmethod
    def create(cls, *, beta, lam, t, M, weights=None, n_max: int = N_MAX) -> "KineticModel":
        """Broadcast `beta`, `lam`, `weights` (default ones) to one shape ``(H,)``."""
        beta, lam = jnp.atleast_1d(jnp.asarray(beta, float)), jnp.atleast_1d(jnp.asarray(lam, float))
        weights = jnp.ones_like(beta) if weights is None else jnp.atleast_1d(jnp.asarray(weights, float))
        beta, lam, weights = jnp.broadcast_arrays(beta, lam, weights)
        return cls(beta=beta, lam=lam, weights=weights, t=jnp.asarray(t, float), M=jnp.asarray(M, float),
                   n_max=n_max)

    @property
    def num_heads(self) -> int:
        return self.beta.shape[-1]

    def __call__(self, s: ArrayLike) -> Array:
        """``S(s)`` at the positions `s` (any shape)."""
        return multi_head_profile(s, self.t, self.beta, self.lam, self.weights, self.M, self.n_max)

    def critical_time(self) -> Float[Array, " heads"]:
        """``t_crit`` of each head alone."""
        return critical_time(self.beta, self.lam, self.M, self.n_max)
