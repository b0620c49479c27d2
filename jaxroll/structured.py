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

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

__all__ = ["BLOCK", "HEAD_CHUNK", "SHARED_DENSE_MAX", "reverse_discounted_cumsum", "head_products", "row_times_kernel",
           "dense_causal_kernel", "shares_one_kernel", "shared_kernel_rollout_row",
           "ADJOINT_ROWS"]

BLOCK = 64
"""Block size of `reverse_discounted_cumsum` (fastest of 16, 32, 64, 128 measured on the 2-core CPU)."""

HEAD_CHUNK = 16
"""Heads per chunk of the per-head path (sliding and full masks); memory O(HEAD_CHUNK * N)."""

TRANSIENT = {False: 8192, True: 16384}
"""Rows with exact normalisers before the stationary split, by ``float64``: ``e^{-a P}``
is below epsilon for slopes down to 2^-7 (float32) and 2^-8.8 (float64) at tau = 1."""

_PREFIX_BLOCK = 16  # block of the per-head prefix: its work is O(P H B)
_CARRY_BLOCK = 16  # block of the recurrences over block starts

# exp(-_MAX_LOG_DECAY) is 0 in float64; clamping keeps a * B^level finite
# (a * 0 is then never inf * 0) without changing any product.
_MAX_LOG_DECAY = 1e4


def _powers(log_decay, exponents):
    """``r^k = exp(-a k)`` for ``k >= 0``, shape ``(..., len(k))``."""
    return jnp.exp(-log_decay[..., None] * exponents)


def _toeplitz(log_decay, block: int):
    """``T[l, k] = r^{l-k}`` for ``l >= k`` else 0, shape ``(..., B, B)``."""
    offsets = jnp.arange(block)[:, None] - jnp.arange(block)[None, :]
    # exp of max(offset, 0): the masked half is never a huge exp (its gradient would be inf * 0).
    values = jnp.exp(-log_decay[..., None, None] * jnp.maximum(offsets, 0))
    return jnp.where(offsets >= 0, values, 0.0)


def reverse_discounted_cumsum(
    u: Float[Array, "heads *batch n"], log_decay: Float[Array, " heads"], block: int = BLOCK
) -> Float[Array, "heads *batch n"]:
    """``X_j = sum_{i >= j} u_i r^{i - j}`` with ``r = exp(-log_decay)``, along the last axis.

    The linear recurrence ``X_j = u_j + r X_{j+1}``, ``X_n = 0``, blocked: the
    positions are cut into blocks of `block`; inside a block ``X`` is the
    Toeplitz product ``U T`` (``T[l, k] = r^{l-k}``, l >= k), and the values at
    the block starts satisfy the same recurrence with decay ``r^B``, solved
    recursively (O(n B) work, depth ``log_B n``). ``log_decay[h] >= 0`` is the
    decay of ``u[h]``.
    """
    heads, n = u.shape[0], u.shape[-1]
    log_decay = jnp.minimum(log_decay, _MAX_LOG_DECAY)
    size = min(n, block)
    count = -(-n // size)
    padded = jnp.pad(u, [(0, 0)] * (u.ndim - 1) + [(0, count * size - n)])
    # One (rows, B) @ (B, B) matmul per head: the Toeplitz matrix is never broadcast.
    local = jnp.matmul(padded.reshape(heads, -1, size), _toeplitz(log_decay, size))
    local = local.reshape(u.shape[:-1] + (count, size))
    if count == 1:
        return local[..., 0, :n]
    starts = reverse_discounted_cumsum(local[..., 0], log_decay * size, block)
    following = jnp.concatenate([starts[..., 1:], jnp.zeros_like(starts[..., :1])], axis=-1)
    carry = _powers(log_decay, size - jnp.arange(size, dtype=u.dtype))  # r^{B - k}
    carry = carry.reshape((heads,) + (1,) * (u.ndim - 1) + (size,))
    result = local + carry * following[..., None]
    return result.reshape(u.shape[:-1] + (count * size,))[..., :n]


def _geometric(log_decay, count):
    """``g = sum_{k=0}^{count-1} r^k = expm1(-a count) / expm1(-a)``, stable at a -> 0.

    For ``a`` below float's smallest normal number the series' first two
    terms ``count - a count (count - 1) / 2`` are exact to rounding and give
    the right derivative at ``a = 0``.
    """
    a = log_decay[..., None]
    tiny = 1e4 * jnp.finfo(count.dtype).tiny
    positive = a > tiny
    safe = jnp.where(positive, a, 1.0)
    closed = jnp.expm1(-safe * count) / jnp.expm1(-safe)
    series = count - a * count * (count - 1) / 2
    return jnp.where(positive, closed, series)


def _geometric_table(log_decay, n: int, block: int):
    """``g_i = sum_{k<i} r^k`` for i = 0..n-1, shape ``(heads, n)``, one FMA per entry.

    With ``i = C B + k``: ``g_i = g_k + r^k g_{CB}``, a sum of non-negative
    terms (no ``1 - r^i`` cancellation), so the transcendental functions run
    on B + n / B values per head instead of n.
    """
    size = min(n, block)
    count = -(-n // size)
    offsets = jnp.arange(size, dtype=log_decay.dtype)
    within = _geometric(log_decay, offsets)  # g_k
    starts = _geometric(log_decay, size * jnp.arange(count, dtype=log_decay.dtype))  # g_{CB}
    table = within[:, None, :] + _powers(log_decay, offsets)[:, None, :] * starts[:, :, None]
    return table.reshape(-1, count * size)[:, :n]


def _shift_left(x):
    """``y_j = x_{j+1}``, ``y_{n-1} = 0``."""
    return jnp.concatenate([x[..., 1:], jnp.zeros_like(x[..., :1])], axis=-1)


def _causal_products(v, a, c, window, block):
    """Per-head ``v^T A_h`` for causal (window None) and sliding masks, shape (heads, n)."""
    n = v.shape[-1]
    positions = jnp.arange(n)
    span = window - 1 if window is not None and window - 1 < n - 1 else None  # K, or no limit
    if span == 0:  # a window of 1: every row reads only itself, A_h = I
        return jnp.broadcast_to(v, a.shape + v.shape)
    top = jnp.maximum(c, -a)  # the largest score of every row that has an off-diagonal entry
    p = jnp.exp(c - top)[:, None]
    q = jnp.exp(-a - top)[:, None]
    counts = _geometric_table(a, n, block)
    if span is not None:
        counts = jnp.where(positions < span, counts, counts[:, span:span + 1])  # g_{min(i, K)}
    first = positions == 0
    # Row 0 reads only itself; p may underflow to 0 there, so it is set apart.
    inverse = jnp.where(first, 1.0, 1.0 / jnp.where(first, 1.0, p + q * counts))
    diagonal = jnp.where(first, 1.0, p * inverse)
    u = jnp.where(first, 0.0, (q * inverse) * v)  # u_0 is read by no j
    if span is None:
        later = _shift_left(reverse_discounted_cumsum(u, a, block))
    else:
        later = _window_sum(u, a, span, block)
    return v * diagonal + later


def _window_sum(u, a, span, block):
    """``S_j = sum_{i=j+1}^{j+K} u_i r^{i-1-j}`` (K = `span`), with no subtraction.

    Aligned segments of K positions: for j at offset k of segment b,
    ``S_j = X_b[k+1] + r^{K-1-k} F_{b+1}[k]`` with ``X_b`` the reverse
    discounted sum within segment b and ``F_b[k] = sum_{l <= k} u_{bK+l} r^l``.
    Both factors of every term are at least the term, so nothing underflows
    that the exact product would not.
    """
    heads, n = u.shape
    count = -(-n // span) + 1  # one empty segment after the last
    padded = jnp.pad(u, [(0, 0), (0, count * span - n)]).reshape(heads, count, span)
    within = reverse_discounted_cumsum(padded, a, block)
    rest = jnp.concatenate([within[..., 1:], jnp.zeros_like(within[..., :1])], axis=-1)
    offsets = jnp.arange(span, dtype=u.dtype)
    forward = jnp.cumsum(padded * _powers(a, offsets)[:, None, :], axis=-1)
    following = jnp.concatenate([forward[:, 1:], jnp.zeros_like(forward[:, :1])], axis=1)
    tail = _powers(a, span - 1 - offsets)[:, None, :]
    return (rest + tail * following).reshape(heads, count * span)[:, :n]


def _full_products(v, a, c, block):
    """Per-head ``v^T A_h`` for the full mask, shape (heads, n).

    With ``f_i = N-1-i`` and ``o_i = a f_i`` the log of row i's largest
    forward weight, ``Z'_i = Z_i e^{-o_i}`` has the three parts
    ``e^{c - o_i}``, ``e^{-a - o_i} g_i`` (backward) and ``g_{f_i}`` (forward),
    and ``A_h[i, j] = e^{-a (N-1-j)} / Z'_i`` for j > i.
    """
    n = v.shape[-1]
    dtype = v.dtype
    positions = jnp.arange(n, dtype=dtype)
    remaining = (n - 1) - positions
    a_ = a[:, None]
    offset = a_ * remaining
    backward_count = _geometric(a, positions)
    forward_count = _geometric(a, remaining)
    log_backward = jnp.where(positions > 0, jnp.log(jnp.where(positions > 0, backward_count, 1.0)), -jnp.inf)
    log_forward = jnp.where(remaining > 0, jnp.log(jnp.where(remaining > 0, forward_count, 1.0)), -jnp.inf)
    parts = jnp.stack(jnp.broadcast_arrays(c[:, None] - offset, -a_ - offset + log_backward, log_forward))
    log_normaliser = jax.nn.logsumexp(parts, axis=0)
    diagonal = jnp.exp(c[:, None] - offset - log_normaliser)
    u = v * jnp.exp(-a_ - offset - log_normaliser)
    earlier = _shift_left(reverse_discounted_cumsum(u, a, block))
    reads = v * jnp.exp(-log_normaliser)
    # Exclusive sum by shifting, not by subtracting `reads` (no cancellation).
    before = jnp.concatenate([jnp.zeros_like(reads[:, :1]), jnp.cumsum(reads, axis=-1)[:, :-1]], axis=-1)
    later = jnp.exp(-a_ * remaining) * before
    return v * diagonal + earlier + later


def _geometric_rows(log_decay, n: int, positions=None):
    """``g_i = expm1(-a i) / expm1(-a)`` for i = 0..n-1 (or `positions`), shape ``(n, heads)``.

    One vectorised ``expm1`` per entry: on the 2-core CPU this measured 2.7x
    faster than the FMA table of `_geometric_table` in this position-major
    layout. ``expm1`` has no ``1 - r^i`` cancellation; below ``1e4 sqrt(tiny)``
    (1e-150 in float64) the series ``i - a i (i - 1) / 2`` is used. Its
    derivative in ``a`` (reverse mode) loses about ``log10(1 / (a i))``
    digits for ``0 < a i << 1``: slopes between 0 and ~1e-6 get less
    accurate gradients than the product itself.
    """
    count = (jnp.arange(n) if positions is None else positions).astype(log_decay.dtype)[:, None]
    # The derivative of the closed form divides by expm1(-a)^2: a^2 must not underflow.
    tiny = 1e4 * math.sqrt(jnp.finfo(log_decay.dtype).tiny)
    positive = log_decay > tiny
    safe = jnp.where(positive, log_decay, 1.0)
    return jnp.where(positive, jnp.expm1(-safe * count) / jnp.expm1(-safe),
                     count - log_decay * count * (count - 1) / 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _causal_tables(a, c, length: int, block: int):
    """Row ``i < length`` of every causal head: ``D_h[i] = A_h[i, i]`` and ``s_h[i] = q / Z_i``.

    Also the stationary limits ``D_inf = p (1 - r) / (p (1 - r) + q)`` and
    ``kappa = q (1 - r) / (p (1 - r) + q)`` (``Z_inf = p + q / (1 - r)``),
    written with ``1 - r = -expm1(-a)`` so nothing is subtracted. Shapes
    ``(length, heads)`` (position-major: the matmuls that read them contract
    over heads) and ``(heads,)``.
    """
    return _tables(a, c, _geometric_rows(a, length))


def _tables(a, c, counts, first=None):
    top = jnp.maximum(c, -a)
    p, q = jax.lax.optimization_barrier((jnp.exp(c - top), jnp.exp(-a - top)))  # once per head
    first = (jnp.arange(counts.shape[0]) == 0)[:, None] if first is None else first[:, None]
    # Row 0 reads only itself; p may underflow to 0 there, so it is set apart.
    inverse = jnp.where(first, 1.0, 1.0 / jnp.where(first, 1.0, p + q * counts))
    diagonal = jnp.where(first, 1.0, p * inverse)
    share = jnp.where(first, 0.0, q * inverse)
    gap = -jnp.expm1(-a)
    denominator = p * gap + q
    denominator = jnp.where(denominator > 0, denominator, 1.0)  # only when a = 0 and q underflows
    return diagonal, share, p * gap / denominator, q * gap / denominator


def _tables_forward(a, c, length, block):
    return _tables(a, c, _geometric_rows(a, length)), (a, c)


def _tables_backward(length, block, residuals, cotangents):
    """Closed forms: with ``D = 1 / (1 + e^{-a-c} g)`` and ``s = 1 / (e^{a+c} + g)``,
    ``dD/dc = D s g``, ``ds/dc = -s D``, ``dD/da = D s (g + h)``,
    ``ds/da = s^2 h - s D`` where ``h = -dg/da = sum_{k<i} k r^k``; the limits
    use ``g_inf = 1 / (1 - r)`` and ``h_inf = r / (1 - r)^2``."""
    a, c = residuals
    d_diagonal, d_share, d_diagonal_limit, d_kappa = cotangents
    counts, slope = jax.jvp(lambda x: _geometric_rows(x, length), (a,), (jnp.ones_like(a),))
    diagonal, share, diagonal_limit, kappa = _tables(a, c, counts)
    moments = -slope  # h_i, column h depends on a_h only
    gap = -jnp.expm1(-a)
    settled = gap > 0
    safe = jnp.where(settled, gap, 1.0)
    count_limit = jnp.where(settled, 1.0 / safe, 0.0)
    moment_limit = jnp.where(settled, jnp.exp(-a) / (safe * safe), 0.0)
    diagonal, share, counts, moments = jax.lax.optimization_barrier((diagonal, share, counts, moments))

    def pull(d_d, d_s, d, s, g, h):
        d_c = d_d * d * s * g - d_s * s * d
        d_a = d_d * d * s * (g + h) + d_s * (s * s * h - s * d)
        return d_a, d_c

    rows_a, rows_c = pull(d_diagonal, d_share, diagonal, share, counts, moments)
    limit_a, limit_c = pull(d_diagonal_limit, d_kappa, diagonal_limit, kappa, count_limit, moment_limit)
    return jnp.sum(rows_a, axis=0) + limit_a, jnp.sum(rows_c, axis=0) + limit_c


_causal_tables.defvjp(_tables_forward, _tables_backward)


def _mixture_reverse_cumsum(x, log_decays, coefficients, block: int):
    """``Y_j = sum_h beta_h X_{h,j}`` with ``X_{h,j} = sum_{i >= j} x_i r_h^{i-j}``.

    The head mixture of discounted reverse sums of one shared vector ``x``
    (``beta`` = `coefficients`). Blocks of B positions: inside a block every
    head at once is one ``(n/B, B) @ (B, B)`` matmul with the mixed Toeplitz
    matrix ``W[l, k] = sum_h beta_h r_h^{l-k}``; the per-head values at the
    block starts, ``C_{h,b} = sum_l x_{bB+l} r_h^l + r_h^B C_{h,b+1}``, are an
    ``(n/B, B) @ (B, H)`` matmul and a recurrence over n/B blocks, and they
    enter block b as ``sum_h beta_h r_h^{B-k} C_{h,b+1}``, an
    ``(n/B, H) @ (H, B)`` matmul. Work O(n (B + 3 H)) instead of O(n B H),
    all terms non-negative. Returns ``(Y, X_{., 0})``, shapes ``(n,)`` and ``(H,)``.
    """
    n = x.shape[-1]
    size = min(n, block)
    count = -(-n // size)
    blocks = jnp.pad(x, (0, count * size - n)).reshape(count, size)
    log_decays = jnp.minimum(log_decays, _MAX_LOG_DECAY)
    offsets = jnp.arange(size, dtype=x.dtype)
    powers = _powers(log_decays, offsets)  # (H, B): r^d
    local = blocks @ _toeplitz_from(coefficients @ powers, size)
    sums = blocks @ powers.T  # (count, H): sum_l x_{bB+l} r^l
    starts = reverse_discounted_cumsum(sums.T, log_decays * size, _CARRY_BLOCK)  # (H, count)
    entering = coefficients[:, None] * _powers(log_decays, size - offsets)  # beta r^{B-k}
    result = local + _shift_left(starts).T @ entering
    return result.reshape(-1)[:n], starts[:, 0]


def _toeplitz_from(values, block: int):
    """``T[l, k] = values[l - k]`` for ``l >= k`` else 0, shape ``(B, B)``."""
    offsets = jnp.arange(block)[:, None] - jnp.arange(block)[None, :]
    return jnp.where(offsets >= 0, values[jnp.maximum(offsets, 0)], 0.0)


def _prefix_mixture(v, a, weights, share, tail, block: int):
    """``sum_h w_h X_{h,j}``, ``X_{h,j} = sum_{j <= i < P} s_h[i] v_i r_h^{i-j} + r_h^{P-j} tail_h``.

    The per-head part (each head scales ``v`` by its own ``s_h[i] = q / Z_i``
    first). Inside a block, ``sum_h w_h s_h[l] r_h^{l-k}`` is one
    ``(P, H) @ (H, B)`` matmul ``Q[l, d] = sum_h w_h s_h[l] r_h^d`` (no
    per-head batched matmul), read at ``d = l - k``; the block starts are per
    head as in `_mixture_reverse_cumsum`. Work O(P H (B + 2)).
    """
    n = v.shape[-1]
    size = min(n, block)
    count = -(-n // size)
    pad = count * size - n
    heads = a.shape[0]
    blocks = jnp.pad(v, (pad, 0)).reshape(count, size)
    share = jnp.pad(share, ((pad, 0), (0, 0)))  # (count B, H)
    offsets = jnp.arange(size, dtype=v.dtype)
    powers = _powers(a, offsets)  # (H, B)
    mixed = (share @ (weights[:, None] * powers)).reshape(count, size, size)  # [b, l, d]
    # local[b, k] = sum_{d} v[b, k+d] Q[b, k+d, d]; B static shifts, fused by XLA.
    terms = blocks[:, :, None] * mixed
    local = terms[:, :, 0]
    for d in range(1, size):
        local = local + jnp.pad(terms[:, d:, d], ((0, 0), (0, d)))
    scaled = share.reshape(count, size, heads) * powers.T  # s_h[bB+l] r^l
    sums = jnp.einsum("bl,blh->hb", blocks, scaled)
    starts = reverse_discounted_cumsum(jnp.concatenate([sums, tail[:, None]], axis=1),
                                       a * size, _CARRY_BLOCK)
    entering = weights[:, None] * _powers(a, size - offsets)
    result = local + starts[:, 1:].T @ entering
    return result.reshape(-1)[pad:]


def _causal_mixture(v, a, c, weights, prefix: int, block: int):
    """``v^T A`` for the causal layer kernel ``A = sum_h w_h A_h``, shape ``(n,)``.

    Rows ``i < P`` (P = `prefix`) use their exact normalisers; rows beyond
    use the stationary one, ``Z_inf = p + q / (1 - r)``. The relative error of
    that is ``r^P (q / (1 - r)) / Z_inf <= e^{-a P}`` per term, and the caller
    only takes this path when that is below the dtype's epsilon for every
    head (or when ``P = n``, which is exact). Beyond P every head scales
    ``v`` by the same constant ``kappa_h``, so the head mixture is one
    convolution with the sum of exponentials ``sum_h w_h kappa_h r_h^d``.
    """
    n = v.shape[-1]
    prefix = min(prefix, n)
    diagonal, share, diagonal_limit, kappa = _causal_tables(a, c, prefix, block)
    if prefix < n:
        suffix, tail = _mixture_reverse_cumsum(v[prefix:], a, weights * kappa, block)
        tail = kappa * tail
        steady = jnp.broadcast_to(weights @ diagonal_limit, (n - prefix,))
    else:
        suffix, tail, steady = v[:0], jnp.zeros_like(a), v[:0]
    head = _prefix_mixture(v[:prefix], a, weights, share, tail, _PREFIX_BLOCK)
    later = _shift_left(jnp.concatenate([head, suffix]))
    return v * jnp.concatenate([diagonal @ weights, steady]) + later


def head_products(
    v: Float[Array, " n"],
    log_decays: Float[Array, " heads"],
    diagonal_logits: Float[Array, " heads"],
    mask: str = "causal",
    window: int | None = None,
    block: int = BLOCK,
) -> Float[Array, "heads n"]:
    """``v^T A_h`` for every head, shape ``(heads, n)``.

    `log_decays` are ``a_h = m_h / tau`` and `diagonal_logits` ``c_h = d_h / tau``.
    """
    if mask == "full":
        return _full_products(v, log_decays, diagonal_logits, block)
    if mask == "causal":
        window = None
    elif mask != "sliding":
        raise ValueError(f"mask: got {mask!r}; allowed: one of causal, sliding, full")
    return _causal_products(v, log_decays, diagonal_logits, window, block)


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
        product = _causal_product_autodiff if _AUTODIFF_ADJOINT else _causal_product
        return product(row, a, c, weights, prefix, head_chunk, block)
    return _chunked_product(row, a, c, weights, mask, window, head_chunk, block)


def _prefix_length(dtype) -> int:
    return TRANSIENT[jnp.dtype(dtype).itemsize > 4]


def _settled(a, weights, prefix: int):
    """Whether ``e^{-a_h P}`` is below epsilon for every head that carries weight."""
    return jnp.all((a * prefix >= -math.log(jnp.finfo(a.dtype).eps)) | (weights == 0))


def _causal_exact_or_split(v, a, c, weights, prefix, head_chunk, block):
    # Beyond row P the normaliser is Z_inf to a relative e^{-a P} (see _causal_mixture):
    # below epsilon for every head that carries weight, the split is exact to rounding.
    return jax.lax.cond(
        _settled(a, weights, prefix),
        lambda: _causal_mixture(v, a, c, weights, prefix, block),
        lambda: _chunked_product(v, a, c, weights, "causal", None, head_chunk, block),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _causal_product(v, a, c, weights, prefix, head_chunk, block):
    """Causal ``v^T A``: the stationary split where it is exact to rounding, else head chunks.

    Reverse mode keeps only the inputs (O(n) per call) and runs the
    hand-written adjoint (`_causal_adjoint`) of the branch that ran.
    """
    if v.shape[-1] <= prefix:
        return _causal_mixture(v, a, c, weights, v.shape[-1], block)
    return _causal_exact_or_split(v, a, c, weights, prefix, head_chunk, block)


def _causal_product_forward(v, a, c, weights, prefix, head_chunk, block):
    return _causal_product(v, a, c, weights, prefix, head_chunk, block), (v, a, c, weights)


def _causal_product_backward(prefix, head_chunk, block, inputs, cotangent):
    v, a, c, weights = inputs
    return _causal_adjoint(v, cotangent, a, c, weights, prefix, head_chunk, block)


_causal_product.defvjp(_causal_product_forward, _causal_product_backward)


# The VJP before issue 24 (re-run the branch under autodiff), kept so that
# benchmarks/influence.py can time both in one run: `_product_for_benchmarks`
# picks it when `_AUTODIFF_ADJOINT` is set (read at trace time; clear JAX's
# caches after changing it).
_AUTODIFF_ADJOINT = False


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _causal_product_autodiff(v, a, c, weights, prefix, head_chunk, block):
    return _causal_product(v, a, c, weights, prefix, head_chunk, block)


def _autodiff_backward(prefix, head_chunk, block, inputs, cotangent):
    v, a, c, weights = inputs
    n = v.shape[-1]

    def pull(function):
        return lambda: jax.vjp(function, *inputs)[1](cotangent)

    split = pull(lambda *x: _causal_mixture(*x, min(prefix, n), block))
    if n <= prefix:
        return split()
    exact = pull(lambda *x: _chunked_product(*x, "causal", None, head_chunk, block))
    return jax.lax.cond(_settled(a, weights, prefix), split, exact)


_causal_product_autodiff.defvjp(_causal_product_forward, _autodiff_backward)


# The adjoint of the causal product, written out.
#
# With F_{h,i} = sum_{j<i} g_j r_h^{i-1-j} (g the cotangent of y = v^T A; a
# discounted cumulative sum in the forward direction, the transpose of the
# forward pass's reverse one) and D_h[i], s_h[i] the tables of
# `_causal_tables`:
#
#   vbar_i = g_i sum_h w_h D_h[i] + sum_h w_h s_h[i] F_{h,i}        (= A g)
#   wbar_h = sum_i v_i (g_i D_h[i] + s_h[i] F_{h,i})                 (= v^T A_h g)
#   Dbar_h[i] = w_h v_i g_i,  sbar_h[i] = w_h v_i F_{h,i}            (then the tables' closed forms)
#   abar_h += w_h sum_i v_i s_h[i] dF_{h,i}/da_h,   dF/da = -sum_{j<i} g_j (i-1-j) r^{i-1-j}
#
# Rows beyond the prefix P have s = kappa_h and D = D_inf,h, so their sums
# collapse to per-head bilinear forms sum_{i>=P} v_i F_{h,i} (blocked: one
# (B, B) lag matrix for every head, block sums, a recurrence over blocks),
# and vbar there is a head mixture of forward sums, as in the forward pass.
# dF/da comes from a `jax.jvp` of these small sums (each head's outputs
# depend on its own a_h only, so a tangent of ones gives every derivative).


def _forward_inclusive(x, log_decay):
    """``I_b = sum_{b' <= b} x_{b'} r^{b - b'}`` along the last axis (heads first), by reversal."""
    return reverse_discounted_cumsum(x[..., ::-1], log_decay, _CARRY_BLOCK)[..., ::-1]


def _head_forward_sums(g, a, block: int):
    """``F[i, h] = sum_{j<i} g_j r_h^{i-1-j}`` (shape ``(P, H)``) and ``F_P[h] = sum_{j<P} g_j r_h^{P-1-j}``.

    Blocks of B positions (zeros padded in front, which change nothing):
    inside a block one ``(P/B, B) @ (B, B H)`` matmul with every head's
    strictly lower Toeplitz matrix, plus ``r^l C_b`` with ``C_b`` the sum
    carried into block b (a recurrence over blocks with decay ``r^B``).
    """
    length = g.shape[-1]
    heads = a.shape[0]
    a = jnp.minimum(a, _MAX_LOG_DECAY)
    size = min(length, block)
    count = -(-length // size)
    pad = count * size - length
    blocks = jnp.pad(g, (pad, 0)).reshape(count, size)
    offsets = jnp.arange(size)
    lag = offsets[None, :] - 1 - offsets[:, None]  # [k, l] = l - 1 - k
    toeplitz = jnp.where((lag >= 0)[..., None], jnp.exp(-a * jnp.maximum(lag, 0)[..., None].astype(g.dtype)), 0.0)
    local = (blocks @ toeplitz.reshape(size, size * heads)).reshape(count, size, heads)
    powers = _powers(a, offsets.astype(g.dtype))  # (H, B): r^d
    sums = blocks @ powers[:, ::-1].T  # (count, H): sum_k g[b, k] r^{B-1-k}
    inclusive = _forward_inclusive(sums.T, a * size)  # (H, count): C_{b+1}
    carry = jnp.concatenate([jnp.zeros((1, heads), g.dtype), inclusive.T[:-1]])
    table = local + carry[:, None, :] * powers.T[None]
    return table.reshape(count * size, heads)[pad:], inclusive[:, -1]


def _pull_tables(d_diagonal, d_share, diagonal, share, counts, moments):
    """``(abar, cbar)`` from the cotangents of ``D`` and ``s`` (closed forms of `_tables_backward`)."""
    d_c = d_diagonal * diagonal * share * counts - d_share * share * diagonal
    d_a = d_diagonal * diagonal * share * (counts + moments) + d_share * (share * share * moments - share * diagonal)
    return d_a, d_c


def _limit_counts(a):
    """``g_inf = 1 / (1 - r)`` and ``h_inf = r / (1 - r)^2`` (0 where ``r = 1``)."""
    gap = -jnp.expm1(-a)
    settled = gap > 0
    safe = jnp.where(settled, gap, 1.0)
    return jnp.where(settled, 1.0 / safe, 0.0), jnp.where(settled, jnp.exp(-a) / (safe * safe), 0.0)


ADJOINT_ROWS = 1024
"""Rows per step of the adjoint's rows with exact normalisers: its transient memory is O(ADJOINT_ROWS * H).
(Steps of 256 to 2048 rows and one step of all 8192 measured alike on the 2-core CPU, within its noise.)"""


def _exact_rows(v, g, a, c, weights, positions, entering, d_entering, block: int):
    """The adjoint terms of the rows at `positions` (consecutive) with exact normalisers.

    ``entering`` is ``F`` at the first of them (``sum_{j<start} g_j r^{start-1-j}``)
    and ``d_entering`` its derivative in ``a``. Returns ``(vbar, abar, cbar,
    wbar)`` of these rows and ``(F, dF/da)`` at the row after them.
    """
    length = v.shape[-1]
    ones = jnp.ones_like(a)
    counts, slope = jax.jvp(lambda x: _geometric_rows(x, length, positions), (a,), (ones,))
    diagonal, share, _, _ = _tables(a, c, counts, positions == 0)

    def sums(x, before):
        table, carried = _head_forward_sums(g, x, block)
        # Sums from rows before `start` enter row start + l as r^l F_start.
        offsets = jnp.arange(length, dtype=g.dtype)
        return table + _powers(jnp.minimum(x, _MAX_LOG_DECAY), offsets).T * before, \
            carried + jnp.exp(-jnp.minimum(x, _MAX_LOG_DECAY) * length) * before

    (forward, carried), (d_forward, d_carried) = jax.jvp(sums, (a, entering), (ones, d_entering))
    # Materialised once: else XLA recomputes the tables inside every product below.
    diagonal, share, counts, slope, forward, d_forward = jax.lax.optimization_barrier(
        (diagonal, share, counts, slope, forward, d_forward))
    vg = v * g
    # Sums over rows as vector-matrix products, (rows,) @ (rows, H).
    ds = diagonal * share
    fs = forward * share
    v_bar = g * (diagonal @ weights) + fs @ weights
    w_bar = vg @ diagonal + v @ fs
    c_bar = weights * (vg @ (ds * counts) - v @ (fs * diagonal))
    a_bar = weights * (vg @ (ds * (counts - slope)) + v @ (fs * (share * -slope - diagonal) + share * d_forward))
    return (v_bar, a_bar, c_bar, w_bar), (carried, d_carried)


def _exact_adjoint(v, g, a, c, weights, block: int, rows: int | None = None):
    """The adjoint over rows ``0..P-1`` with exact normalisers (P = len(v)), `rows` rows a step.

    Returns ``(vbar, abar, cbar, wbar)`` of these rows and ``(F_P, dF_P/da)``,
    the forward sums carried past row P. Zeros padded in front (``v = g = 0``)
    add nothing.
    """
    length = v.shape[-1]
    rows = ADJOINT_ROWS if rows is None else rows
    zero = jnp.zeros_like(a)
    if length <= rows:
        return _exact_rows(v, g, a, c, weights, jnp.arange(length), zero, zero, block)
    steps = -(-length // rows)
    pad = steps * rows - length
    v_steps, g_steps = (jnp.pad(x, (pad, 0)).reshape(steps, rows) for x in (v, g))

    def step(carry, inputs):
        entering, d_entering, a_sum, c_sum, w_sum = carry
        index, v_rows, g_rows = inputs
        # Padded rows sit at negative positions: read as row 0 (their v = g = 0 add nothing).
        positions = jnp.maximum(index * rows - pad + jnp.arange(rows), 0)
        (v_bar, a_bar, c_bar, w_bar), (carried, d_carried) = _exact_rows(
            v_rows, g_rows, a, c, weights, positions, entering, d_entering, block)
        return (carried, d_carried, a_sum + a_bar, c_sum + c_bar, w_sum + w_bar), v_bar

    (carried, d_carried, a_bar, c_bar, w_bar), v_bar = jax.lax.scan(
        step, (zero, zero, zero, zero, zero), (jnp.arange(steps), v_steps, g_steps))
    return (v_bar.reshape(-1)[pad:], a_bar, c_bar, w_bar), (carried, d_carried)


def _stationary_bilinear(v, g, a, carried, block: int):
    """``sum_i v_i F_{h,i}`` per head, ``F_{h,i} = sum_{j<i} g_j r_h^{i-1-j} + r_h^i carried_h``, shape ``(H,)``.

    Inside blocks the lag matrix ``M[l, k] = sum_b v[b, l] g[b, k]`` is shared
    by every head (``sum_{l>k} M[l, k] r^{l-1-k}``); across blocks the block
    sums ``sum_l v[b, l] r^l`` and ``sum_k g[b, k] r^{B-1-k}`` meet through a
    recurrence over blocks. O(n (B + 2 H)) work.
    """
    length = v.shape[-1]
    a = jnp.minimum(a, _MAX_LOG_DECAY)
    size = min(length, block)
    count = -(-length // size)
    pad = count * size - length
    v_blocks = jnp.pad(v, (0, pad)).reshape(count, size)
    g_blocks = jnp.pad(g, (0, pad)).reshape(count, size)
    lags = v_blocks.T @ g_blocks  # [l, k]
    offsets = jnp.arange(size)
    lag = offsets[:, None] - 1 - offsets[None, :]  # [l, k] = l - 1 - k
    local_values = _powers(a, offsets.astype(v.dtype))  # (H, B)
    within = jnp.sum(jnp.where(lag >= 0, lags, 0.0)[None] * local_values[:, jnp.maximum(lag, 0)], axis=(1, 2))
    v_sums = v_blocks @ local_values.T  # (count, H)
    g_sums = g_blocks @ local_values[:, ::-1].T  # (count, H)
    later = reverse_discounted_cumsum(v_sums.T, a * size, _CARRY_BLOCK)  # (H, count)
    across = jnp.sum(g_sums.T[:, :-1] * later[:, 1:], axis=1)
    return within + across + carried * later[:, 0]


def _mixture_forward_sums(g, a, coefficients, carried, block: int):
    """``E_i = sum_h beta_h (sum_{j<i} g_j r_h^{i-1-j} + r_h^i carried_h)``, shape ``(n,)``.

    The mirror of `_mixture_reverse_cumsum`: one mixed strictly lower
    Toeplitz matmul inside blocks, per-head carries between blocks.
    """
    length = g.shape[-1]
    a = jnp.minimum(a, _MAX_LOG_DECAY)
    size = min(length, block)
    count = -(-length // size)
    blocks = jnp.pad(g, (0, count * size - length)).reshape(count, size)
    offsets = jnp.arange(size)
    powers = _powers(a, offsets.astype(g.dtype))  # (H, B)
    mixed = coefficients @ powers  # W[d]
    lag = offsets[None, :] - 1 - offsets[:, None]  # [k, l]
    local = blocks @ jnp.where(lag >= 0, mixed[jnp.maximum(lag, 0)], 0.0)
    sums = blocks @ powers[:, ::-1].T  # (count, H)
    entering = jnp.concatenate([carried[None], sums[:-1]])  # C_0 = carried, C_{b+1} = r^B C_b + sums_b
    starts = _forward_inclusive(entering.T, a * size).T  # (count, H)
    result = local + starts @ (coefficients[:, None] * powers)
    return result.reshape(-1)[:length]


def _split_adjoint(v, g, a, c, weights, prefix: int, block: int):
    """The adjoint of `_causal_mixture` (exact rows below `prefix`, stationary beyond)."""
    (v_head, a_bar, c_bar, w_bar), (carried, d_carried) = _exact_adjoint(
        v[:prefix], g[:prefix], a, c, weights, _PREFIX_BLOCK)
    _, _, diagonal_limit, kappa = _tables(a, c, jnp.zeros((1,) + a.shape, a.dtype))
    v_tail, g_tail = v[prefix:], g[prefix:]
    ones = jnp.ones_like(a)
    v_rest = g_tail * (weights @ diagonal_limit) + _mixture_forward_sums(g_tail, a, weights * kappa, carried, block)
    bilinear, d_bilinear = jax.jvp(lambda x, f: _stationary_bilinear(v_tail, g_tail, x, f, block),
                                   (a, carried), (ones, d_carried))
    vg = jnp.sum(v_tail * g_tail)
    counts_limit, moments_limit = _limit_counts(a)
    limit_a, limit_c = _pull_tables(vg, bilinear, diagonal_limit, kappa, counts_limit, moments_limit)
    a_bar = a_bar + weights * (limit_a + kappa * d_bilinear)
    c_bar = c_bar + weights * limit_c
    w_bar = w_bar + diagonal_limit * vg + kappa * bilinear
    return jnp.concatenate([v_head, v_rest]), a_bar, c_bar, w_bar


def _chunked_adjoint(v, g, a, c, weights, head_chunk: int, block: int):
    """`_exact_adjoint` over all n rows, heads `head_chunk` at a time (memory O(chunk n))."""
    heads = a.shape[0]
    chunk = max(1, min(head_chunk, heads))
    count = -(-heads // chunk)
    pad = count * chunk - heads
    chunks = tuple(jnp.pad(x, (0, pad)).reshape(count, chunk) for x in (a, c, weights))

    def step(v_bar, arrays):
        chunk_a, chunk_c, chunk_w = arrays
        (v_part, *rest), _ = _exact_adjoint(v, g, chunk_a, chunk_c, chunk_w, _PREFIX_BLOCK)
        return v_bar + v_part, tuple(rest)

    v_bar, (a_bar, c_bar, w_bar) = jax.lax.scan(step, jnp.zeros_like(v), chunks)
    return (v_bar,) + tuple(x.reshape(-1)[:heads] for x in (a_bar, c_bar, w_bar))


def _causal_adjoint(v, g, a, c, weights, prefix: int, head_chunk: int, block: int):
    """``(vbar, abar, cbar, wbar)`` of the causal product for the cotangent g, the branch the forward took."""
    n = v.shape[-1]
    if n <= prefix:
        (v_bar, a_bar, c_bar, w_bar), _ = _exact_adjoint(v, g, a, c, weights, _PREFIX_BLOCK)
        return v_bar, a_bar, c_bar, w_bar
    return jax.lax.cond(_settled(a, weights, prefix),
                        lambda: _split_adjoint(v, g, a, c, weights, prefix, block),
                        lambda: _chunked_adjoint(v, g, a, c, weights, head_chunk, block))


def _chunked_product(row, a, c, weights, mask, window, head_chunk, block):
    """``sum_h w_h v^T A_h`` with heads `head_chunk` at a time, each chunk checkpointed."""
    heads = a.shape[0]
    chunk = max(1, min(head_chunk, heads))
    count = -(-heads // chunk)
    pad = count * chunk - heads
    # Padded heads have weight 0 (and harmless a = c = 0): they add nothing.
    a, c, weights = (jnp.pad(x, (0, pad)).reshape(count, chunk) for x in (a, c, weights))

    @jax.checkpoint
    def chunk_product(total, chunk_arrays):
        chunk_a, chunk_c, chunk_w = chunk_arrays
        products = head_products(row, chunk_a, chunk_c, mask, window, block)
        return total + chunk_w @ products, None

    if count == 1:
        return chunk_product(jnp.zeros_like(row), (a[0], c[0], weights[0]))[0]
    total, _ = jax.lax.scan(chunk_product, jnp.zeros_like(row), (a, c, weights))
    return total


# Small N, one kernel in every layer: form it once.
#
# At a few hundred positions the O(H N) products are all per-op overhead:
# tens of small XLA operations per layer. When every layer has the same
# kernel (the no-content configurations, every preset) the layers share its
# work: the dense kernel is formed once from the closed-form tables (one
# ``(n, H) @ (H, n)`` matmul) and each layer is one vector-matrix product.

SHARED_DENSE_MAX = 1024
"""Largest N at which `influence` forms a kernel shared by every layer densely
(`shared_kernel_rollout_row`); above it the O(T H N) products win on the
2-core CPU (docs/fast-kernels.md, measured crossover)."""


def _geometric_counts(a, n: int, block: int):
    """``g_i = sum_{k<i} r^k``, i = 0..n-1, for every entry of `a` (shape ``(..., n)``), n a multiple of B.

    With ``i = C B + k``, ``g_i = g_k + r^k g_{CB}``: a sum of non-negative
    terms (no ``1 - r^i`` cancellation) and one FMA per entry; the
    transcendental functions run on ``B + n / B`` values per head.
    """
    starts = _geometric(a, block * jnp.arange(n // block, dtype=a.dtype))  # g_{CB}
    offsets = jnp.arange(block, dtype=a.dtype)
    within = _geometric(a, offsets)  # g_k
    table = within[..., None, :] + _powers(a, offsets)[..., None, :] * starts[..., :, None]
    return table.reshape(a.shape + (n,))


def _row_tables(a, c, n: int, block: int):
    """``A_h[i, i]`` and ``s_h[i] = q / Z_i`` for rows i < n (n a multiple of B), shapes ``(..., n)``; row 0 exact."""
    top = jnp.maximum(c, -a)
    p = jnp.exp(c - top)[..., None]
    q = jnp.exp(-a - top)[..., None]
    first = jnp.arange(n) == 0
    counts = _geometric_counts(a, n, block)
    inverse = jnp.where(first, 1.0, 1.0 / jnp.where(first, 1.0, p + q * counts))
    return jnp.where(first, 1.0, p * inverse), jnp.where(first, 0.0, q * inverse)


def _skew(mixed):
    """``Y[..., i, j] = X[..., i, i - 1 - j]`` for j < i, else 0 (X = `mixed`, square in its last two axes).

    By reshaping, not gathering: reversed along its last axis and padded to
    width n + 1, X's rows laid end to end put ``X[i, i-1-j]`` at flat
    position ``(i + 1) n + j``.
    """
    n = mixed.shape[-1]
    flipped = jnp.pad(mixed[..., ::-1], [(0, 0)] * (mixed.ndim - 1) + [(0, 1)])
    flat = flipped.reshape(mixed.shape[:-2] + (n * (n + 1),))[..., n:]
    skewed = flat.reshape(mixed.shape)
    below = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
    return jnp.where(below, skewed, 0.0)


def dense_causal_kernel(
    log_decays: Float[Array, " heads"], diagonal_logits: Float[Array, " heads"],
    weights: Float[Array, " heads"], n: int,
) -> Float[Array, "n n"]:
    """The dense causal layer kernel ``A = sum_h w_h A_h`` from the closed-form tables, ``(n, n)``.

    ``A[i, j] = sum_h w_h s_h[i] r_h^{i-1-j}`` for j < i (``s_h[i] = q_h / Z_{h,i}``,
    module docstring): one ``(n, H) @ (H, n)`` matmul read along its
    anti-diagonals; ``A[i, i] = sum_h w_h A_h[i, i]``. `weights` sum to 1;
    ``a = m / tau``, ``c = d / tau``. Every entry a sum of non-negative
    terms; O(H n^2) work and no per-entry exponential (the softmax of
    `jaxroll.kernels.layer_kernel` takes H n^2 of them).
    """
    a = jnp.minimum(log_decays, _MAX_LOG_DECAY)
    block = 16
    padded = -(-n // block) * block
    diagonal, share = _row_tables(a, diagonal_logits, padded, block)  # (H, padded)
    mixed = (weights[:, None] * share[:, :n]).T @ _powers(a, jnp.arange(n, dtype=a.dtype))  # [i, d]
    return _skew(mixed) + jnp.diag(weights @ diagonal[:, :n])


def shares_one_kernel(slopes, diagonal_scores, head_weights) -> bool:
    """Whether every layer (axis 0) has the same slopes, content and normalised head weights.

    Concrete arrays only (NumPy, no JAX dispatch): `jaxroll.influence` asks it
    before compilation to choose `shared_kernel_rollout_row`.
    """
    slopes, diagonal_scores, head_weights = (np.asarray(x) for x in (slopes, diagonal_scores, head_weights))
    weights = head_weights / head_weights.sum(axis=-1, keepdims=True)
    return bool((slopes == slopes[:1]).all() and (diagonal_scores == diagonal_scores[:1]).all()
                and (weights == weights[:1]).all())


def shared_kernel_rollout_row(
    row: Float[Array, " n"],
    lambdas: Float[Array, " layers"],
    slopes: Float[Array, " heads"],
    diagonal_scores: Float[Array, " heads"],
    head_weights: Float[Array, " heads"],
    temperature: Float[Array, ""],
) -> Float[Array, " n"]:
    """``row^T R_T ... R_1`` when every layer has the same causal kernel ``A``.

    ``R_t = (1 - lambda_t) I + lambda_t A``: ``A`` is formed once
    (`dense_causal_kernel`, O(H n^2)), then T vector-matrix products,
    O(T n^2). The R_t commute, so this is also the Krylov form
    ``sum_k c_k row^T A^k`` of design.md, evaluated by Horner's rule.
    Plain JAX: `jit`, `vmap`, `grad` and `jvp` apply.
    """
    dtype = row.dtype
    weights = (head_weights / jnp.sum(head_weights)).astype(dtype)
    kernel = dense_causal_kernel(slopes.astype(dtype) / temperature, diagonal_scores.astype(dtype) / temperature,
                                 weights, row.shape[-1])

    def step(vector, weight):
        return (1.0 - weight) * vector + weight * (vector @ kernel), None

    return jax.lax.scan(step, row, lambdas.astype(dtype), reverse=True)[0]

