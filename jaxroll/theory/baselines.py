"""Closed-form baselines beside the rollout: the uniform-causal (Cesàro) rollout and the power law by distance.

**The Cesàro rollout** (Chowdhury, arXiv 2603.10123). Uniform causal attention
is the Cesàro matrix ``M[i, j] = 1/(i + 1)`` for ``j <= i``; with mixing
``alpha_t`` the rollout is ``P_T = prod_t ((1 - alpha_t) I + alpha_t M)``, the
rollout of an ALiBi model with slope 0 and no content. Derivation of the exact
last row (``n = N - 1``):

1. All factors are polynomials in one matrix M, so they commute and
   ``P_T = sum_s c_s M^s`` with ``c_s`` the coefficients of
   ``prod_t ((1 - alpha_t) + alpha_t x)``: ``c_s = Pr(S = s)`` for S the
   number of layers that attend (a Poisson-binomial count; Binomial(T, alpha)
   for constant mixing).
2. ``e_n^T M^s`` costs O(N) from ``e_n^T M^(s-1)``: ``(v^T M)_j =
   sum_{i >= j} v_i / (i + 1)``, a reverse cumulative sum. All terms are
   non-negative, so the O(N T) sum has no cancellation (`cesaro_profile`).
3. M is a Hausdorff matrix: ``M = delta diag(1/(k + 1)) delta`` with
   ``delta[i, k] = (-1)^k C(i, k)`` (its eigenvalues are ``1/(i + 1)``), and
   ``1/(k + 1)^s`` is the k-th moment of the product of s independent uniforms
   on (0, 1), whose density is ``(-ln t)^(s-1) / (s-1)!``. Hence

       P_T[n, j] = Pr(Binomial(n, tau) = j),   tau = U_1^B_1 ... U_T^B_T,

   U_t uniform, B_t ~ Bernoulli(alpha_t): each attending layer shrinks the
   reach by a uniform factor. (The alternating eigen-expansion is exact too
   but cancels catastrophically beyond N of a few dozen; it is not used.)

**Continuum limit** (`cesaro_density`, `cesaro_atom`): as N grows with T and
``alpha`` fixed, ``j / n`` converges in law to tau, whose law has an atom
``Pr(S = 0) = prod_t (1 - alpha_t)`` at x = 1 (the last token keeps it: the
"recency delta") and the density
``g(x) = sum_{s >= 1} Pr(S = s) (-ln x)^(s-1) / (s-1)!`` on (0, 1), with a
logarithmic divergence at x -> 0 (the "primacy tail") when ``Pr(S >= 2) > 0``
and a factorially small middle. Validity: ``(N + 1) p(j) -> g(x)`` at
``x = (j + 1)/(N + 1)`` uniformly on compact subsets of (0, 1), with error
O(1/N) (the Beta(j + 1, n - j + 1) smoothing of a smooth g); it fails at the
two ends: the last token carries the atom, and near 0 the log divergence is
smoothed over the first O(1) tokens. `cesaro_poisson_density` is the further
limit T -> infinity with ``sum_t alpha_t = c`` fixed (S -> Poisson(c), error
O(max_t alpha_t)): ``g(x) = e^(-c) sqrt(c / L) I_1(2 sqrt(c L))``,
``L = -ln x``, atom ``e^(-c)``.

**The power law by distance** (Brändel et al., arXiv 2606.29139): influence
at distance ``r = i - j`` modelled as ``gamma + beta (r + 1)^(-p)``.
`power_law` evaluates it, `fit_power_law` fits it (least squares) and gives
intervals, `by_distance` reduces rows of an influence matrix to a profile by
distance.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._checks import check_positive_int
from ..errors import ConfigError

__all__ = ["mixing_count", "cesaro_profile", "cesaro_atom", "cesaro_density", "cesaro_poisson_density",
           "power_law", "PowerLawFit", "fit_power_law", "by_distance"]


def _alphas(alpha, num_layers: int) -> np.ndarray:
    """``alpha`` as a (T,) float64 array in [0, 1]: a scalar for every layer or one value per layer."""
    check_positive_int("num_layers", num_layers)
    values = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (num_layers,)) if np.ndim(alpha) == 0 \
        else np.asarray(alpha, dtype=np.float64)
    if values.shape != (num_layers,):
        raise ConfigError(f"alpha: got shape {values.shape}; allowed: a scalar or ({num_layers},)")
    if not np.all((values >= 0) & (values <= 1)):
        raise ConfigError(f"alpha: got values in [{values.min():g}, {values.max():g}]; allowed: [0, 1]")
    return values


def mixing_count(alpha, num_layers: int) -> Float[Array, " T+1"]:
    """``Pr(S = s)``, s = 0..T, for S the number of attending layers: the coefficients of
    ``prod_t ((1 - alpha_t) + alpha_t x)``. Binomial(T, alpha) for a scalar ``alpha``.

    Args:
        alpha: scalar or (T,) mixing coefficients in [0, 1].
        num_layers: T.
    """
    alphas = _alphas(alpha, num_layers)
    coefficients = np.zeros(num_layers + 1)
    coefficients[0] = 1.0
    for a in alphas:  # multiply by ((1 - a) + a x); non-negative terms only
        coefficients[1:] = (1 - a) * coefficients[1:] + a * coefficients[:-1]
        coefficients[0] *= 1 - a
    return jnp.asarray(coefficients)


def _cesaro_krylov_step(row: Float[Array, " n"]) -> Float[Array, " n"]:
    """``row^T M`` for the Cesàro matrix: ``sum_{i >= j} row_i / (i + 1)`` (a reverse cumulative sum)."""
    scaled = row / jnp.arange(1, row.shape[0] + 1, dtype=row.dtype)
    return jnp.cumsum(scaled[::-1])[::-1]


@functools.partial(jax.jit, static_argnums=1)
def _cesaro_sum(weights: Float[Array, " T+1"], n: int) -> Float[Array, " n"]:
    """``sum_s weights[s] e_{n-1}^T M^s`` by T + 1 reverse cumulative sums (one compiled scan)."""

    def step(carry, weight):
        row, total = carry
        return (_cesaro_krylov_step(row), total + weight * row), None

    start = jnp.zeros(n, dtype=weights.dtype).at[-1].set(1.0)
    (_, profile), _ = jax.lax.scan(step, (start, jnp.zeros_like(start)), weights)
    return profile


def cesaro_profile(n: int, alpha, num_layers: int) -> Float[Array, " n"]:
    """The exact last row of ``prod_t ((1 - alpha_t) I + alpha_t M)``, M the N x N Cesàro matrix.

    ``p = sum_s Pr(S = s) e_{N-1}^T M^s`` (module docstring): T reverse
    cumulative sums, O(N T) time, O(N) memory, no cancellation. Equal to
    ``jaxroll.influence`` of a causal ALiBi model with slope 0, no content and
    schedule ``alpha`` (tests: 1e-12 in float64).

    Args:
        n: sequence length N >= 1.
        alpha: scalar or (T,) mixing coefficients in [0, 1].
        num_layers: T >= 1.

    Returns:
        (N,) probabilities over positions 0..N-1.
    """
    check_positive_int("n", n)
    return _cesaro_sum(mixing_count(alpha, num_layers), n)


def cesaro_atom(alpha, num_layers: int) -> Float[Array, ""]:
    """The continuum limit's atom at the last token, ``Pr(S = 0) = prod_t (1 - alpha_t)``."""
    return mixing_count(alpha, num_layers)[0]


def cesaro_density(x: ArrayLike, alpha, num_layers: int) -> Float[Array, "..."]:
    """The continuum density of the Cesàro rollout on (0, 1): ``sum_{s>=1} Pr(S=s) (-ln x)^(s-1)/(s-1)!``.

    ``(N + 1) p(j)`` tends to it at ``x = (j + 1)/(N + 1)`` (validity in the
    module docstring); with `cesaro_atom` it integrates to 1.

    Args:
        x: positions in (0, 1], any shape (the density diverges at 0).
        alpha: scalar or (T,) mixing coefficients in [0, 1].
        num_layers: T.
    """
    return _log_power_series(jnp.asarray(x, dtype=jnp.result_type(float)), mixing_count(alpha, num_layers)[1:])


@jax.jit
def _log_power_series(x: Float[Array, "..."], weights: Float[Array, " T"]) -> Float[Array, "..."]:
    """``sum_k weights[k] (-ln x)^k / k!``, through logs so large T neither overflows nor loses small terms."""
    log_x = -jnp.log(x)
    k = jnp.arange(weights.shape[0], dtype=weights.dtype)
    safe = jnp.where(log_x > 0, log_x, 1.0)[..., None]
    terms = jnp.where(log_x[..., None] > 0, jnp.exp(k * jnp.log(safe) - jax.scipy.special.gammaln(k + 1)),
                      (k == 0).astype(weights.dtype))
    return jnp.sum(weights * terms, axis=-1)


def cesaro_poisson_density(x: ArrayLike, total_mixing: float) -> Float[Array, "..."]:
    """The deep limit of `cesaro_density`: T -> infinity with ``sum_t alpha_t = c`` fixed.

    ``g(x) = e^(-c) sqrt(c / L) I_1(2 sqrt(c L))``, ``L = -ln x`` (S ->
    Poisson(c)); the atom at the last token is ``e^(-c)``; at x = 1 the
    density is ``c e^(-c)``. Error O(max_t alpha_t) against finite T.
    """
    c = float(total_mixing)
    if not (math.isfinite(c) and c >= 0):
        raise ConfigError(f"total_mixing: got {total_mixing!r}; allowed: a finite number >= 0")
    log_x = -jnp.log(jnp.asarray(x, dtype=jnp.result_type(float)))
    z = 2.0 * jnp.sqrt(c * log_x)
    # I_1(z) = i1e(z) e^z; sqrt(c / L) I_1(2 sqrt(c L)) -> c as L -> 0.
    ratio = jnp.where(log_x > 0, jnp.sqrt(c / jnp.where(log_x > 0, log_x, 1.0)), 0.0)
    value = jnp.exp(z - c) * ratio * jax.scipy.special.i1e(z)
    return jnp.where(log_x > 0, value, c * math.exp(-c))


def power_law(r: ArrayLike, gamma: float, beta: float, p: float) -> Float[Array, "..."]:
    """Influence by distance in Brändel et al.'s form, ``gamma + beta (r + 1)^(-p)``, r >= 0."""
    return gamma + beta * (jnp.asarray(r, dtype=jnp.result_type(float)) + 1.0) ** (-p)


class PowerLawFit(NamedTuple):
    """A least-squares fit of ``gamma + beta (r + 1)^(-p)``.

    ``parameters`` = (gamma, beta, p); ``interval`` (3, 2) the lower and upper
    bounds at ``level`` (Student t with ``n - 3`` degrees of freedom on the
    linearised covariance ``covariance``, scaled by the residual variance
    unless ``sigma`` was absolute); ``rms`` the weighted root mean square
    residual; ``at_bound`` True when p ended on an end of the searched range
    (then the data do not pin p down and the intervals mean little: a
    profile that is not a power law, e.g. one with a primacy bump).
    """

    parameters: np.ndarray
    interval: np.ndarray
    covariance: np.ndarray
    rms: float
    level: float
    at_bound: bool

    @property
    def gamma(self) -> float:
        """The floor ``gamma``: influence at infinite distance."""
        return float(self.parameters[0])

    @property
    def beta(self) -> float:
        """The amplitude ``beta``: influence above the floor at distance 0."""
        return float(self.parameters[1])

    @property
    def p(self) -> float:
        """The exponent ``p`` of the decay ``(r + 1)^(-p)``."""
        return float(self.parameters[2])


def _profiled_start(r1: np.ndarray, y: np.ndarray, w: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """(gamma, beta, p) with p the grid point whose weighted least-squares (gamma, beta) fit best.

    Variable projection: at fixed p the model is linear in (gamma, beta); the
    2 x 2 normal equations are solved for every grid point at once.
    """
    x = r1[None, :] ** (-grid[:, None])                              # (G, n)
    w2 = w ** 2
    a, b, c = w2.sum(), x @ w2, (x ** 2) @ w2
    d1, d2 = w2 @ y, x @ (w2 * y)
    det = a * c - b ** 2
    gamma, beta = (c * d1 - b * d2) / det, (a * d2 - b * d1) / det
    rss = ((y[None, :] - gamma[:, None] - beta[:, None] * x) ** 2) @ w2
    best = int(np.nanargmin(np.where(det > 0, rss, np.nan)))
    return np.array([gamma[best], beta[best], grid[best]])


def fit_power_law(r: ArrayLike, y: ArrayLike, sigma: ArrayLike | None = None, *,
                  absolute_sigma: bool = False, level: float = 0.95,
                  p_bounds: tuple[float, float] = (1e-3, 10.0)) -> PowerLawFit:
    """Fit ``y ~ gamma + beta (r + 1)^(-p)`` by least squares, with intervals.

    The start is the best p on a grid with (gamma, beta) solved linearly at
    each (variable projection, so no start is asked of the caller); then
    `scipy.optimize.least_squares` refines all three. Intervals come from the
    linearised covariance ``s^2 (J^T J)^-1`` and the Student t quantile with
    ``n - 3`` degrees of freedom.

    Args:
        r: (n,) distances >= 0.
        y: (n,) influence at those distances (a mean or median over query
            positions, `by_distance`).
        sigma: optional (n,) standard errors of y (weights ``1/sigma``).
        absolute_sigma: take ``sigma`` as absolute (no rescaling by the
            residual variance), as in `scipy.optimize.curve_fit`.
        level: the intervals' coverage.
        p_bounds: the range searched for p.

    Raises:
        ConfigError: fewer than 4 points, mismatched shapes, negative r or
            non-finite values, one line each.
    """
    import scipy.optimize
    import scipy.stats

    r = np.asarray(r, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if r.ndim != 1 or r.shape != y.shape:
        raise ConfigError(f"r, y: got shapes {r.shape} and {y.shape}; allowed: two (n,) arrays")
    if r.size < 4:
        raise ConfigError(f"r: got {r.size} points; allowed: at least 4 (3 parameters and a residual)")
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(y)) and np.all(r >= 0)):
        raise ConfigError("r, y: got non-finite values or r < 0; allowed: finite y and distances r >= 0")
    w = np.ones_like(y) if sigma is None else 1.0 / np.asarray(sigma, dtype=np.float64)
    if w.shape != y.shape or not np.all(np.isfinite(w) & (w > 0)):
        raise ConfigError(f"sigma: got shape {w.shape} or values <= 0; allowed: (n,) positive values")
    r1 = r + 1.0
    start = _profiled_start(r1, y, w, np.geomspace(*p_bounds, 200))

    def residual(theta):
        return (theta[0] + theta[1] * r1 ** (-theta[2]) - y) * w

    def jacobian(theta):
        power = r1 ** (-theta[2])
        return np.stack([np.ones_like(r1), power, -theta[1] * power * np.log(r1)], axis=1) * w[:, None]

    result = scipy.optimize.least_squares(residual, start, jac=jacobian, method="trf", x_scale="jac",
                                          bounds=([-np.inf, -np.inf, p_bounds[0]], [np.inf, np.inf, p_bounds[1]]),
                                          xtol=1e-15, ftol=1e-15, gtol=1e-15)
    theta = result.x
    dof = r.size - 3
    rss = float(np.sum(result.fun ** 2))
    J = jacobian(theta)
    covariance = np.linalg.pinv(J.T @ J)
    if not absolute_sigma:
        covariance = covariance * (rss / dof if dof > 0 else np.inf)
    half = scipy.stats.t.ppf(0.5 + level / 2, dof) * np.sqrt(np.diag(covariance))
    interval = np.stack([theta - half, theta + half], axis=1)
    at_bound = bool(np.isclose(theta[2], p_bounds[0], rtol=1e-6) or np.isclose(theta[2], p_bounds[1], rtol=1e-6))
    return PowerLawFit(theta, interval, covariance, math.sqrt(rss / r.size), level, at_bound)


def by_distance(rows: ArrayLike, queries: ArrayLike, statistic: str = "mean", *,
                buffer: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Influence as a function of distance ``r = i - j`` over query positions i.

    ``value(r) = stat_{k : q_k - r >= buffer} rows[k, q_k - r]`` for
    ``r = 0 .. max_k q_k - buffer``: the statistic over the queries that reach
    distance r with a source position ``j = q_k - r`` at or after `buffer`.

    Args:
        rows: (K, N) influence rows: row k is the influence of every position j
            on query position ``queries[k]`` (zero for j > i under causal
            masking; rows of P_T or measured ones).
        queries: (K,) the query positions i, each in [0, N).
        statistic: ``"mean"`` or ``"median"`` over the queries that reach
            distance r (those with ``i - r >= buffer``).
        buffer: the left-edge buffer, Brändel et al.'s ``--source-min-index``
            (arXiv 2606.29139): source positions ``j < buffer`` are left out,
            so that the attention sink at position 0 (and the first few
            tokens, with a larger buffer) does not enter the curve. The rows
            are not renormalised after leaving them out: each value stays
            on the scale of its whole row. 0 (the default) keeps every
            position.

    Returns:
        ``(r, value)``: distances ``0 .. max(queries) - buffer`` and the
        statistic at each.
    """
    rows = np.asarray(rows, dtype=np.float64)
    queries = np.asarray(queries)
    if rows.ndim != 2 or rows.shape[0] == 0 or queries.shape != (rows.shape[0],):
        raise ConfigError(f"rows, queries: got shapes {rows.shape} and {queries.shape}; "
                          "allowed: (K, N) and (K,), K >= 1")
    if np.any((queries < 0) | (queries >= rows.shape[1])):
        raise ConfigError(f"queries: got values outside [0, {rows.shape[1]}); allowed: positions of the rows")
    reduce = {"mean": np.mean, "median": np.median}.get(statistic)
    if reduce is None:
        raise ConfigError(f"statistic: got {statistic!r}; allowed: 'mean' or 'median'")
    if isinstance(buffer, bool) or not isinstance(buffer, (int, np.integer)) or not 0 <= buffer <= queries.max():
        raise ConfigError(f"buffer: got {buffer!r}; allowed: an integer in [0, {int(queries.max())}] "
                          "(the largest query position)")
    distances = np.arange(int(queries.max()) - int(buffer) + 1)
    values = np.array([reduce([row[i - d] for row, i in zip(rows, queries) if i - d >= buffer])
                       for d in distances])
    return distances, values
