"""Distances and shape statistics of influence profiles.

Profiles are probability vectors over positions 0..N-1, shape ``(N,)`` or
batched ``(..., N)``. Everything here is pure `jax.numpy`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = ["edge_count", "center_of_mass", "edge_mass", "middle_mass", "wasserstein"]


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


def wasserstein(p: Float[Array, "... n"], q: Float[Array, "... n"]) -> Float[Array, "..."]:
    """W1 between p and q on positions 0..N-1, divided by N - 1, in [0, 1].

    ``W1 = sum_{j < N-1} |F_p(j) - F_q(j)|`` with ``F`` the cumulative sums;
    dividing by ``N - 1`` makes profiles of different lengths comparable (0 for
    ``N = 1``). Differentiable.
    """
    n = p.shape[-1]
    gap = jnp.cumsum(p - q, axis=-1)[..., :-1]
    return jnp.sum(jnp.abs(gap), axis=-1) / max(n - 1, 1)
