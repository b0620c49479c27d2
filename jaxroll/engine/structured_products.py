"""The O(N) per-head recurrences behind `jaxroll.structured`: tables, blocked sums, forward products.

The mathematics (normaliser tables, the discounted reverse cumulative sum,
sliding and full masks, the stationary split) is in `jaxroll.structured`'s
module docstring. This module holds the forward products; the hand-written
adjoint is `jaxroll.structured_adjoint`, the dense shared kernel
`jaxroll.structured_dense`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__: list[str] = []  # the public names are re-exported by jaxroll.structured

BLOCK = 64
"""Block size of `reverse_discounted_cumsum` (fastest of 16, 32, 64, 128 measured on the 2-core CPU)."""

HEAD_CHUNK = 16
"""Heads per chunk of the per-head path (sliding and full masks); memory O(HEAD_CHUNK * N)."""

TRANSIENT = {False: 8192, True: 16384}
"""Rows with exact normalisers before the stationary split, by ``float64``: ``e^{-a P}``
is below epsilon for slopes down to 2^-7 (float32) and 2^-8.8 (float64) at tau = 1."""

_PREFIX_BLOCK = 16  # block of the per-head prefix: its work is O(P H B)
_SHORT_PREFIX_BLOCK, _SHORT_PREFIX = 8, 2048
"""Prefixes of at most `_SHORT_PREFIX` rows take blocks of 8 in the forward pass: on the 2-core CPU
(2026-12-04 18:55 UTC, load ~3.5, float64, least of 10-30, two interleaved rounds) all-content
BLOOM-176B ran 4.4 / 12.7 / 21.0 / 38.3 ms at N = 256 / 512 / 1024 / 2048 with blocks of 8
against 5.1 / 14.4 / 24.1 / 40.7 ms with 16; at N = 4096 and 65,536 (float32) 16 was ahead."""
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
    """``g = sum_{k=0}^{count-1} r^k = expm1(-a count) / expm1(-a)``, `log_decay` and `count` broadcast.

    ``expm1`` has no ``1 - r^count`` cancellation. Below ``1e4 sqrt(tiny)``
    (1e-150 in float64) the series' first two terms ``count - a count
    (count - 1) / 2`` are used: exact to rounding there, with the right
    derivative at ``a = 0``, while the closed form's derivative divides by
    ``expm1(-a)^2`` (``a^2`` must not underflow). Its derivative in ``a``
    loses about ``log10(1 / (a count))`` digits for ``0 < a count << 1``:
    slopes between 0 and ~1e-6 get less accurate gradients than the product
    itself.
    """
    tiny = 1e4 * math.sqrt(jnp.finfo(log_decay.dtype).tiny)
    positive = log_decay > tiny
    safe = jnp.where(positive, log_decay, 1.0)
    closed = jnp.expm1(-safe * count) / jnp.expm1(-safe)
    series = count - log_decay * count * (count - 1) / 2
    return jnp.where(positive, closed, series)


def _geometric_table(log_decay, n: int, block: int):
    """``g_i = sum_{k<i} r^k`` for i = 0..n-1, shape ``log_decay.shape + (n,)`` (heads first), one FMA per entry.

    With ``i = C B + k``: ``g_i = g_k + r^k g_{CB}``, a sum of non-negative
    terms (no ``1 - r^i`` cancellation), so the transcendental functions run
    on B + n / B values per head instead of n. `_geometric_rows` builds the
    same table rows first.
    """
    size = min(n, block)
    offsets = jnp.arange(size, dtype=log_decay.dtype)
    a = log_decay[..., None]
    within = _geometric(a, offsets)  # g_k
    starts = _geometric(a, size * jnp.arange(-(-n // size), dtype=log_decay.dtype))  # g_{CB}
    table = within[..., None, :] + _powers(log_decay, offsets)[..., None, :] * starts[..., :, None]
    return table.reshape(log_decay.shape + (-1,))[..., :n]


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
    backward_count = _geometric(a_, positions)
    forward_count = _geometric(a_, remaining)
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


_COUNT_BLOCK = 64
"""Rows per block of `_geometric_rows` (64 and 16 alike at 8192 rows, 64 ahead at 2048, 2-core CPU)."""


def _geometric_rows(log_decay, n: int):
    """`_geometric_table` rows first, shape ``(n, heads)``, built in that layout.

    The tables' matmuls contract over heads, so they read ``(n, heads)``.
    BLOOM-176B's tables of 8192 rows, float32, 2-core CPU (2026-12-04
    23:10-23:20 UTC, least of 30): the heads-first table transposed
    1.4-1.6 ms, its pieces transposed 0.95-1.09 ms, built rows first
    0.28-0.36 ms; one ``expm1`` per entry was 1.01 ms (21:30 UTC). Entries
    within 3.6e-7 of the ``expm1`` form (3 ulp).
    """
    size = min(n, _COUNT_BLOCK)
    offsets = jnp.arange(size, dtype=log_decay.dtype)[:, None]
    within = _geometric(log_decay, offsets)  # (K, H): g_l
    starts = _geometric(log_decay, size * jnp.arange(-(-n // size), dtype=log_decay.dtype)[:, None])  # g_{bK}
    powers = jnp.exp(-jnp.minimum(log_decay, _MAX_LOG_DECAY) * offsets)  # (K, H): r^l
    table = within[None] + powers[None] * starts[:, None, :]
    return table.reshape(-1, log_decay.shape[-1])[:n]


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
    block_rows = _SHORT_PREFIX_BLOCK if prefix <= _SHORT_PREFIX else _PREFIX_BLOCK
    head = _prefix_mixture(v[:prefix], a, weights, share, tail, block_rows)
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
