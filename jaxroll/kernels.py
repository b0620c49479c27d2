"""Masks, ALiBi slopes, scores and the dense attention kernels of the theory.

Convention (arXiv 2602.16837): ``A[i, j]`` is the weight with which token i
reads token j (an edge j -> i); rows sum to 1. Head h of a layer scores

    s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau

on the allowed entries (``m_h >= 0`` the ALiBi slope of Press et al. 2022,
``d_h`` the diagonal content score, ``b_h`` the content background, ``tau`` the
softmax temperature), ``A_h = rowsoftmax(s_h)``, and the layer kernel is the
head average ``A = sum_h w_h A_h`` with ``w_h >= 0`` normalised to sum 1.

These are the dense O(N^2) kernels, for inspection and as the reference for
the structured O(N) products in `jaxroll.structured`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from ._checks import check_positive_int

__all__ = ["MASKS", "alibi_slopes", "allowed", "head_scores", "layer_kernel"]

MASKS = ("causal", "sliding", "full")
"""Attention masks: ``causal`` (j <= i), ``sliding`` (i - W < j <= i), ``full`` (every j)."""


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The standard ALiBi slopes of Press et al. (2022), shape ``(H,)``.

    For H a power of two, ``m_h = 2^(-8 (h + 1) / H)``, h = 0..H-1. Otherwise,
    with ``n = 2^floor(log2 H)``, the first n slopes are those of n heads and
    the remaining ``H - n`` are every other slope of 2n heads,
    ``2^(-4 (2k + 1) / n)``, k = 0..H-n-1: the rule of BLOOM's
    ``build_alibi_tensor`` (BLOOM-176B has 112 heads) and of the ALiBi
    reference code.
    """
    num_heads = check_positive_int("num_heads", num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = 2.0 ** (-8.0 * np.arange(1, closest + 1) / closest)
    extra = 2.0 ** (-4.0 * np.arange(1, 2 * (num_heads - closest), 2) / closest)
    return np.concatenate([slopes, extra])


def allowed(n: int, mask: str, window: int | None = None) -> Bool[Array, "n n"]:
    """Which entries a row may read: ``allowed[i, j]``.

    ``causal``: j <= i. ``sliding``: i - W < j <= i (W = `window`). ``full``:
    every j.
    """
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    if mask == "full":
        return jnp.ones((n, n), dtype=bool)
    if mask == "causal":
        return j <= i
    if mask == "sliding":
        return (j <= i) & (j > i - window)
    raise ValueError(f"mask: got {mask!r}; allowed: one of {', '.join(MASKS)}")


def head_scores(
    slope: Float[Array, ""],
    diagonal_score: Float[Array, ""],
    base_score: Float[Array, ""],
    temperature: Float[Array, ""],
    n: int,
) -> Float[Array, "n n"]:
    """``s(i, j) = (-m (i - j) + d [i == j] + b) / tau`` for every (i, j).

    The background `base_score` adds the same value to every allowed entry of
    a row, so it cancels in the row softmax: it is kept for completeness (the
    measured configurations carry it) and changes no kernel.
    """
    offsets = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]
    scores = -slope * offsets + diagonal_score * jnp.eye(n) + base_score
    return scores / temperature


def layer_kernel(
    slopes: Float[Array, " heads"],
    diagonal_scores: Float[Array, " heads"],
    base_scores: Float[Array, " heads"],
    head_weights: Float[Array, " heads"],
    temperature: Float[Array, ""],
    n: int,
    mask: str = "causal",
    window: int | None = None,
) -> Float[Array, "n n"]:
    """The dense layer kernel ``A = sum_h w_h rowsoftmax(s_h)``, shape ``(n, n)``.

    The softmax subtracts each row's largest allowed score before
    exponentiating, so scores of any magnitude (content of +-1000, slopes of
    10) neither overflow nor underflow to an empty row.
    """
    keep = allowed(n, mask, window)
    scores = jax.vmap(head_scores, in_axes=(0, 0, 0, None, None))(
        slopes, diagonal_scores, base_scores, temperature, n
    )
    per_head = jax.nn.softmax(jnp.where(keep, scores, -jnp.inf), axis=-1)
    weights = head_weights / jnp.sum(head_weights)
    return jnp.einsum("h,hij->ij", weights, per_head)
