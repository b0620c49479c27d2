"""O(N) vector-times-kernel products for ALiBi + diagonal-content kernels.

The layer kernel of arXiv 2602.16837 is ``A = sum_h w_h A_h`` with
``A_h = rowsoftmax(s_h)`` over the allowed entries and

    s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau,

``A[i, j]`` the weight with which token i reads token j (ALiBi: Press et al.
2022). A dense ``A_h`` costs O(N^2); its structure makes ``v^T A_h`` O(N).
Write ``a = m / tau`` (the per-step log-decay, ``r = e^{-a}``), ``c = d / tau``
and, for causal rows, ``M = max(c, -a)`` (the largest score of every row
i >= 1), ``p = e^{c - M}``, ``q = e^{-a - M}`` (one of them is 1). Then

    Z_i = p + q g_i,   g_i = sum_{k=0}^{i-1} r^k = expm1(-a i) / expm1(-a)
    A_h[i, i] = p / Z_i,   A_h[i, j] = q r^{i-1-j} / Z_i   (j < i)

(row 0 is ``A_h[0, 0] = 1``) and, with ``u_i = q v_i / Z_i``,

    (v^T A_h)_j = v_j A_h[j, j] + sum_{i > j} u_i r^{i-1-j},

a discounted reverse cumulative sum ``X_j = u_j + r X_{j+1}`` shifted by one.
``b_h`` cancels in the softmax and is accepted and ignored. Every quantity
above is at most 1 and every term added is non-negative for ``v >= 0``: no
score is exponentiated raw (content of +-1000 at tau = 0.1 is ``c = +-10^4``),
and nothing is subtracted, so no cancellation either.

The recurrence is evaluated blocked (`reverse_discounted_cumsum`): blocks of
B positions are one small dense ``(B, B)`` Toeplitz matmul, and the block
carries are the same recurrence with decay ``r^B`` over N/B positions, solved
the same way, recursively. On a 2-core CPU this beat `lax.associative_scan` by
a factor of about ten (see benchmarks/README.md).

Sliding windows (``i - W < j <= i``, K = W - 1 off-diagonal entries per row)
split the index range into aligned segments of K positions: the window of j
is the rest of j's segment (a reverse sum within the segment) plus a prefix of
the next one (a forward sum within the segment, times ``r^{K-1-k}``), again
without subtracting a shifted copy. The full mask adds a forward part: row i
reads j > i with score ``+a (j - i)``, so its normaliser is dominated by the
last token; computing ``log Z_i`` relative to ``a (N-1-i)`` makes
``A_h[i, j] = e^{-a (N-1-j)} / Z'_i`` an exclusive cumulative sum.

Heads are processed in chunks (`lax.scan` over chunks of `head_chunk` heads,
each chunk under `jax.checkpoint`), so memory is O(chunk * N) in the forward
pass and in reverse mode.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .structured_adjoint import ADJOINT_ROWS, _causal_product, _prefix_length, _settled
from .structured_dense import (
    SHARED_DENSE_MAX,
    dense_causal_kernel,
    shared_kernel_rollout_row,
    shares_one_kernel,
)
from .structured_products import BLOCK, HEAD_CHUNK, _chunked_product, head_products, reverse_discounted_cumsum

__all__ = ["BLOCK", "HEAD_CHUNK", "SHARED_DENSE_MAX", "reverse_discounted_cumsum", "head_products", "row_times_kernel",
           "causal_settled", "settled_prefix", "alibi_prefix", "transient_rows", "settled_rung", "dense_causal_kernel", "shares_one_kernel", "shared_kernel_rollout_row",
           "ADJOINT_ROWS"]

def row_times_kernel(
    row: Float[Array, " n"],
    slopes: Float[Array, " heads"],
    diagonal_scores: Float[Array, " heads"],
    base_scores: Float[Array, " heads"],
    head_weights: Float[Array, " heads"],
    temperature: Float[Array, ""],
    mask: str = "causal",
    window: int | None = None,
    *,
    head_chunk: int = HEAD_CHUNK,
    block: int = BLOCK,
    transient: int | None = None,
    settled: bool = False,
) -> Float[Array, " n"]:
    """``row^T A`` for the layer kernel ``A = sum_h w_h rowsoftmax(s_h)``, in O(H n).

    ``s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau`` on the allowed
    entries of `mask` (``b_h`` cancels and is ignored); ``w`` is normalised to
    sum 1. Equal to ``row @ jaxroll.kernels.layer_kernel(...)`` without
    forming the ``(n, n)`` kernel: heads go ``head_chunk`` at a time through a
    `lax.scan` (each chunk checkpointed), so memory is O(head_chunk * n).

    Args:
        row: ``(n,)``, the vector ``v``.
        slopes: ``(H,)``.
        diagonal_scores: ``(H,)``.
        base_scores: ``(H,)``.
        head_weights: ``(H,)``.
        temperature: ``()``, ``tau > 0``.
        mask: ``"causal"``, ``"sliding"`` (with `window` W >= 1) or ``"full"``.
        settled: the caller has checked `causal_settled` for these arrays:
            a causal product then takes the stationary split without a
            run-time branch (otherwise a `lax.cond` per call decides).

    Returns:
        ``(n,)``, ``(v^T A)_j = sum_i v_i A[i, j]``.
    """
    del base_scores  # cancels in every row's softmax
    dtype = row.dtype
    weights = (head_weights / jnp.sum(head_weights)).astype(dtype)
    a = slopes.astype(dtype) / temperature
    c = diagonal_scores.astype(dtype) / temperature
    if mask == "causal":
        prefix = _prefix_length(dtype) if transient is None else transient
        return _causal_product(row, a, c, weights, prefix, head_chunk, block, settled)
    return _chunked_product(row, a, c, weights, mask, window, head_chunk, block)


def causal_settled(
    slopes: Float[Array, "*layers heads"],
    head_weights: Float[Array, "*layers heads"],
    temperature: Float[Array, ""],
    dtype,
    transient: int | None = None,
) -> Bool[Array, ""]:
    """Whether every causal row beyond the prefix P has its stationary normaliser, in every layer.

    ``e^{-a_h P} < eps`` (the dtype's machine epsilon) with ``a = m / tau``,
    for every head with ``w_h != 0``; P is `transient` or the dtype's
    `TRANSIENT`. Then the stationary split of `row_times_kernel` is exact to
    rounding beyond row P, and ``settled=True`` may skip its run-time branch.
    A rollout checks this once for all its layers (`settled_rung`), so a
    traced model (jit, grad) takes one branch around the whole scan instead
    of one in every layer's product and another in its adjoint (BLOOM-176B
    grad W1, N = 262,144, 2-core CPU: 0.877 -> 0.768 s in one same-run
    comparison, `benchmarks/gradient_ratio.py --branches`).
    """
    prefix = _prefix_length(dtype) if transient is None else transient
    a = jnp.asarray(slopes).astype(dtype) / temperature
    return _settled(a, jnp.asarray(head_weights), prefix)


def settled_prefix(slopes: ArrayLike, head_weights: ArrayLike, temperature: ArrayLike, dtype) -> int | None:
    """The shortest prefix P (a multiple of `BLOCK`) after which every weighted causal head has settled.

    ``P = ceil(-log(eps) / min_h a_h)`` over the heads with ``w_h != 0`` of
    every layer (``a = m / tau``, eps the dtype's machine epsilon), so
    ``e^{-a_h P} < eps`` for all of them (`causal_settled` at P), rounded
    up to a multiple of `BLOCK`. ``None`` when that is beyond the dtype's
    `TRANSIENT` (or a weighted slope is 0). NumPy, for concrete arrays: the
    rows below P take exact normalisers, so a model whose smallest slope is
    ALiBi's 2^-8 needs 4096 rows in float32 instead of `TRANSIENT`'s 8192.
    """
    a = np.asarray(slopes, np.float64) / float(np.asarray(temperature))
    weighted = np.asarray(head_weights) != 0
    if not weighted.any():
        return None
    smallest = float(a[weighted].min())
    if not smallest > 0:
        return None
    rows = -math.log(float(jnp.finfo(dtype).eps)) / smallest
    if rows >= _prefix_length(dtype):
        return None
    return BLOCK * math.ceil(rows / BLOCK)  # TRANSIENT is a multiple of BLOCK: at most TRANSIENT


def transient_rows(dtype) -> int:
    """The exact prefix a causal product takes per head when nothing settled earlier: the dtype's `TRANSIENT`."""
    return _prefix_length(dtype)


def alibi_prefix(dtype) -> int:
    """`settled_prefix` of standard ALiBi at tau = 1: 4096 rows in float32, 9280 in float64.

    Every ALiBi slope set of Press et al. (2022) has smallest slope 2^-8, so
    ``ceil(-log(eps) 2^8)`` rows, rounded up to a multiple of `BLOCK`.
    """
    prefix = settled_prefix(np.array([2.0 ** -8]), np.ones(1), 1.0, dtype)
    assert prefix is not None  # below TRANSIENT in both dtypes
    return prefix


def settled_rung(
    slopes: Float[Array, "*layers heads"],
    head_weights: Float[Array, "*layers heads"],
    temperature: Float[Array, ""],
    dtype,
) -> Int[Array, ""]:
    """Which prefix a traced model's causal products may split at: 0, 1 or 2.

    0: every weighted head of every layer has settled within `alibi_prefix`
    rows (`causal_settled` there); 1: within the dtype's `TRANSIENT`; 2: not
    within that (some products need their exact per-head path). A rollout
    switches on it once (`jax.lax.switch`), so standard ALiBi at tau = 1
    under `jit` or `grad` computes half the exact rows of `TRANSIENT`.
    """
    at_rung = causal_settled(slopes, head_weights, temperature, dtype, alibi_prefix(dtype))
    return jnp.where(at_rung, 0, jnp.where(causal_settled(slopes, head_weights, temperature, dtype), 1, 2))
