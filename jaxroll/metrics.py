"""Distances and shape statistics of influence profiles.

Profiles are probability vectors over positions 0..N-1, shape ``(N,)`` or
batched ``(..., N)`` (arXiv 2602.16837 compares predicted and measured
profiles with these). The metric functions are pure `jax.numpy`: they work
under `jax.jit`, `jax.vmap` and, where the maths is differentiable, `jax.grad`,
and they do not check their input. `compare` is the checked entry point: it
validates both profiles (outside jit) and returns every statistic at once.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .errors import ConfigError

__all__ = [
    "edge_count", "center_of_mass", "edge_mass", "middle_mass", "u_index", "argmin",
    "wasserstein", "spearman", "kl", "js", "total_variation",
    "Shape", "Comparison", "shape_statistics", "compare", "check_profile",
]

# Tolerance on |sum(p) - 1| for a profile to count as normalised: float32
# rollouts of a few hundred layers sum to 1 within ~1e-6; CSV files written by
# jaxroll carry 17 significant digits.
SUM_TOLERANCE = 1e-6


def edge_count(n: int, fraction: float = 0.1) -> int:
    """``k = max(1, round(fraction * n))``: how many positions an edge holds."""
    return max(1, round(fraction * n))


def center_of_mass(p: Float[Array, "... n"]) -> Float[Array, "..."]:
    """``sum_j j p_j / (N - 1)``: 0 for all mass on the first token, 1 on the last.

    For ``N = 1`` the single position counts as 0.
    """
    n = p.shape[-1]
    positions = jnp.arange(n, dtype=p.dtype)
    return jnp.sum(positions * p, axis=-1) / max(n - 1, 1)


def edge_mass(p: Float[Array, "... n"], fraction: float = 0.1) -> Float[Array, "... 2"]:
    """The mass of the first and of the last k positions, ``[sum p[:k], sum p[-k:]]``.

    ``k = max(1, round(fraction * N))``.
    """
    k = edge_count(p.shape[-1], fraction)
    return jnp.stack([jnp.sum(p[..., :k], axis=-1), jnp.sum(p[..., -k:], axis=-1)], axis=-1)


def middle_mass(p: Float[Array, "... n"], fraction: float = 0.1) -> Float[Array, "..."]:
    """The mass between the two edges, ``sum p[k:N-k]`` (0 when the edges cover all)."""
    k = edge_count(p.shape[-1], fraction)
    return jnp.sum(p[..., k : max(k, p.shape[-1] - k)], axis=-1)


def u_index(p: Float[Array, "... n"], fraction: float = 0.1) -> Float[Array, "..."]:
    """How U-shaped a profile is: ``min(mean p[:k], mean p[-k:]) / mean p[k:N-k] - 1``.

    ``k = max(1, round(fraction * N))``. Positive exactly when both edge
    fractions carry more mass per position than the middle (the "lost in the
    middle" shape); 0 for a flat profile; negative when an edge is below the
    middle. Infinite when the middle carries no mass.

    Raises:
        ValueError: when ``N <= 2 k`` (no middle); the shape is static, so
            this is raised at trace time, never inside a computation.
    """
    n = p.shape[-1]
    k = edge_count(n, fraction)
    if n <= 2 * k:
        raise ConfigError(f"p: length {n} leaves no middle for fraction {fraction}; "
                          f"allowed: length > 2 * {k}")
    first = jnp.mean(p[..., :k], axis=-1)
    last = jnp.mean(p[..., -k:], axis=-1)
    middle = jnp.mean(p[..., k : n - k], axis=-1)
    return jnp.minimum(first, last) / middle - 1.0


def argmin(p: Float[Array, "... n"]) -> Int[Array, "..."]:
    """The position of the least influential token, ``argmin_j p_j`` (first on ties)."""
    return jnp.argmin(p, axis=-1)


def wasserstein(p: Float[Array, "... n"], q: Float[Array, "... n"]) -> Float[Array, "..."]:
    """W1 between p and q on positions 0..N-1, divided by N - 1, in [0, 1].

    ``W1 = sum_{j < N-1} |F_p(j) - F_q(j)|`` with ``F`` the cumulative sums;
    dividing by ``N - 1`` makes profiles of different lengths comparable (0 for
    ``N = 1``). Differentiable.
    """
    n = p.shape[-1]
    gap = jnp.cumsum(p - q, axis=-1)[..., :-1]
    return jnp.sum(jnp.abs(gap), axis=-1) / max(n - 1, 1)


def _ranks(x: Float[Array, " n"]) -> Float[Array, " n"]:
    # Average ranks (1-based), ties averaged as in scipy.stats.rankdata: the
    # tied block of value v occupies ranks left+1 .. right, whose mean is
    # (left + right + 1) / 2. O(N log N), no (N, N) comparison matrix.
    ordered = jnp.sort(x)
    left = jnp.searchsorted(ordered, x, side="left")
    right = jnp.searchsorted(ordered, x, side="right")
    return (left + right + 1).astype(x.dtype) / 2


def spearman(p: Float[Array, "... n"], q: Float[Array, "... n"]) -> Float[Array, "..."]:
    """Spearman's rank correlation: the Pearson correlation of the ranks of p and q.

    ``rho = cov(r_p, r_q) / (std(r_p) std(r_q))`` with ``r`` the ranks, ties
    given their average rank (as `scipy.stats.spearmanr`). In [-1, 1]. When
    either profile is constant its ranks have no spread and rho is undefined;
    it is reported as 0 (no monotone relation) so results stay finite.
    Piecewise constant in p and q, so its gradient is 0.
    """
    p, q = jnp.broadcast_arrays(p, q)
    ranks = jnp.vectorize(_ranks, signature="(n)->(n)")
    rp = ranks(p)
    rq = ranks(q)
    rp = rp - jnp.mean(rp, axis=-1, keepdims=True)
    rq = rq - jnp.mean(rq, axis=-1, keepdims=True)
    spread = jnp.sqrt(jnp.sum(rp**2, axis=-1) * jnp.sum(rq**2, axis=-1))
    safe = jnp.where(spread > 0, spread, 1.0)
    return jnp.where(spread > 0, jnp.sum(rp * rq, axis=-1) / safe, 0.0)


def _relative_entropy(p, q):
    # p log(p / q) with 0 log(0 / q) = 0; +inf where q = 0 < p. The double
    # `where` keeps the gradient finite (0) at p = 0 instead of NaN.
    positive = p > 0
    safe_p = jnp.where(positive, p, 1.0)
    return jnp.where(positive, safe_p * (jnp.log(safe_p) - jnp.log(q)), 0.0)


def kl(p: Float[Array, "... n"], q: Float[Array, "... n"]) -> Float[Array, "..."]:
    """Kullback-Leibler divergence ``KL(p || q) = sum_j p_j log(p_j / q_j)``, in nats.

    Terms with ``p_j = 0`` count 0; a position with ``q_j = 0 < p_j`` makes it
    ``+inf`` (p is not absolutely continuous with respect to q). p and q are
    used as given, not renormalised (`scipy.stats.entropy(p, q)` renormalises).
    """
    return jnp.sum(_relative_entropy(p, q), axis=-1)


def js(p: Float[Array, "... n"], q: Float[Array, "... n"]) -> Float[Array, "..."]:
    """Jensen-Shannon divergence ``(KL(p || m) + KL(q || m)) / 2``, ``m = (p + q) / 2``.

    In nats, in [0, log 2], always finite, symmetric. It is the square of
    `scipy.spatial.distance.jensenshannon` (which returns the distance).
    """
    m = (p + q) / 2
    return (kl(p, m) + kl(q, m)) / 2


def total_variation(p: Float[Array, "... n"], q: Float[Array, "... n"]) -> Float[Array, "..."]:
    """Total variation distance ``sum_j |p_j - q_j| / 2``, in [0, 1]."""
    return jnp.sum(jnp.abs(p - q), axis=-1) / 2


class Shape(NamedTuple):
    """Shape statistics of one profile (see `shape_statistics`)."""

    first: float            # p[0]
    last: float             # p[-1]
    argmin: int             # argmin_j p_j
    center_of_mass: float   # sum_j j p_j / (N - 1)
    first_mass: float       # sum p[:k]
    middle_mass: float      # sum p[k:N-k]
    last_mass: float        # sum p[-k:]
    u_index: float          # min(mean p[:k], mean p[-k:]) / mean p[k:N-k] - 1


class Comparison(NamedTuple):
    """Distances between two profiles p and q, and the shape of each (`compare`)."""

    wasserstein: float      # W1 / (N - 1)
    spearman: float         # rank correlation
    kl: float               # KL(p || q), nats
    js: float               # Jensen-Shannon divergence, nats
    total_variation: float  # sum |p - q| / 2
    p: Shape
    q: Shape


def check_profile(name: str, p, *, normalize: bool = False) -> np.ndarray:
    """Validate a profile outside jit and return it as float64 NumPy, shape ``(..., N)``.

    Rejects, with a one-line `ConfigError` (a `ValueError`) naming `name`:
    non-numeric input, no positions, NaN or infinite entries, negative
    entries, zero total mass, and (unless `normalize`) a sum that differs from
    1 by more than 1e-6. With ``normalize=True`` the profile is divided by its
    sum.
    """
    try:
        array = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected numbers, got {type(p).__name__}") from None
    if array.ndim == 0 or array.shape[-1] == 0:
        raise ConfigError(f"{name}: got shape {array.shape}; allowed: (..., N) with N >= 1")
    bad = ~np.isfinite(array)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ConfigError(f"{name}: value {float(array[index])} at index {_show(index)} is not finite; "
                          "allowed: finite numbers >= 0")
    if (array < 0).any():
        index = tuple(int(i) for i in np.argwhere(array < 0)[0])
        raise ConfigError(f"{name}: value {float(array[index])!r} at index {_show(index)} is negative; "
                          "allowed: numbers >= 0")
    total = array.sum(axis=-1, keepdims=True)
    if (total <= 0).any():
        raise ConfigError(f"{name}: total mass is 0; allowed: a positive sum")
    if normalize:
        return array / total
    off = np.abs(total - 1.0)
    if (off > SUM_TOLERANCE).any():
        worst = float(total.flat[int(np.argmax(off))])
        raise ConfigError(f"{name}: sums to {worst!r}, not 1 (tolerance {SUM_TOLERANCE:g}); "
                          "pass normalize=True (--normalize) to rescale it")
    return array


def _show(index):
    return index[0] if len(index) == 1 else list(index)


def _as_python(value):
    value = np.asarray(value)
    if value.ndim:
        return value
    return int(value) if np.issubdtype(value.dtype, np.integer) else float(value)


def shape_statistics(p, fraction: float = 0.1) -> Shape:
    """`Shape` of a profile: ``p[0]``, ``p[-1]``, `argmin`, `center_of_mass`,
    `edge_mass` (first and last k = max(1, round(fraction N)) positions),
    `middle_mass` and `u_index`. Pure jnp; values are arrays of shape ``...``.
    """
    p = jnp.asarray(p)
    edges = edge_mass(p, fraction)
    n = p.shape[-1]
    has_middle = n > 2 * edge_count(n, fraction)
    return Shape(
        first=p[..., 0],
        last=p[..., -1],
        argmin=argmin(p),
        center_of_mass=center_of_mass(p),
        first_mass=edges[..., 0],
        middle_mass=middle_mass(p, fraction),
        last_mass=edges[..., 1],
        u_index=u_index(p, fraction) if has_middle else jnp.full(p.shape[:-1], jnp.nan),
    )


def compare(p, q, *, normalize: bool = False, fraction: float = 0.1) -> Comparison:
    """Every distance between profiles p and q, and the shape statistics of both.

    The checked entry point (runs outside jit): both profiles are validated
    with `check_profile` (and must have the same length), then `wasserstein`,
    `spearman`, ``kl(p, q)``, `js`, `total_variation` and `shape_statistics`
    are computed in float64 whatever the JAX default, so the numbers of two
    CSV files do not depend on ``jax_enable_x64``. For ``(N,)`` profiles the
    fields are Python numbers; batched ``(..., N)`` inputs give arrays.

    Raises:
        ConfigError: (a ValueError) bad values, zero mass, a sum other than 1
            without `normalize`, or mismatched lengths; the message names p or q.
    """
    p = check_profile("p", p, normalize=normalize)
    q = check_profile("q", q, normalize=normalize)
    if p.shape[-1] != q.shape[-1]:
        raise ConfigError(f"q: length {q.shape[-1]} differs from p's length {p.shape[-1]}; "
                          "allowed: the same number of positions")
    if not 0 < fraction < 0.5:
        raise ConfigError(f"fraction: got {fraction!r}; allowed: 0 < fraction < 0.5")
    with jax.enable_x64(True):
        jp, jq = jnp.asarray(p), jnp.asarray(q)
        values = (wasserstein(jp, jq), spearman(jp, jq), kl(jp, jq), js(jp, jq),
                  total_variation(jp, jq))
        shapes = (shape_statistics(jp, fraction), shape_statistics(jq, fraction))
        values = [_as_python(v) for v in values]
        shapes = [Shape(*(_as_python(v) for v in s)) for s in shapes]
    return Comparison(*values, p=shapes[0], q=shapes[1])
