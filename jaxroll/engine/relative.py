"""Relative-position (Toeplitz) kernels: ``v^T A`` in O(N log N) by FFT.

Head h of a layer scores a causal pair (i, j), j <= i, by its offset alone,

    s_h(i, j) = f_h(i - j),     f_h(0) = d_h (the diagonal content score),

so ``A_h = rowsoftmax(s_h)`` is ``A_h[i, j] = e^{f_h(i-j)} / Z_i`` with the
exact normaliser ``Z_i = sum_{k=0}^{i} e^{f_h(k)}`` (arXiv 2602.16837's
kernel with the ALiBi term ``-m k`` of Press et al. 2022 replaced by any
``f``; rotary models' mean attention is close to such a kernel). ``A[i, j]``
is the weight with which token i reads token j; the layer kernel is
``A = sum_h w_h A_h`` with ``w_h >= 0`` normalised to sum 1.

Stable normalisers, nothing exponentiated raw. With ``M' = max_{k>=1} f(k)``
(the largest off-diagonal score), ``M = max(d, M')``, ``p = e^{d - M}``,
``q = e^{M' - M}`` (one of them is 1) and ``g(k) = e^{f(k) - M'} <= 1``
for ``k >= 1`` (``g(0) = 0``):

    Z_i e^{-M} = p + q G_i,    G_i = sum_{k=1}^{i} g(k)   (a cumulative sum of
                                                          positive terms)
    A_h[i, i] = p / (p + q G_i),   A_h[i, j] = q g(i - j) / (p + q G_i),

and row 0 is ``A_h[0, 0] = 1`` exactly. Then, with ``u_i = q v_i / (p + q G_i)``
(``u_0 = 0``),

    (v^T A_h)_j = v_j A_h[j, j] + sum_{i > j} u_i g(i - j),

a correlation of u with g. Its Fourier form, ``y = irfft(rfft(u) conj(rfft(g)))``
on ``L >= 2N - 1`` points (so the circular wrap never folds a negative offset
onto a positive one), costs O(N log N); the head mixture is summed in the
frequency domain, so a layer of H heads costs 2H real FFTs and one inverse.

Rounding and non-negativity. The diagonal term is computed elementwise. The
FFT correlation's absolute error is of order ``eps log2(L) ||u||_2 ||g||_2``
(a few 1e-16 relative to the largest term in float64); values that should be
0 or tiny can come out as ``-1e-17``. They are clipped at 0: every exact term
is >= 0 for ``v >= 0``, so clipping only moves a value toward the truth, and
the error bound above still holds. When ``f`` is non-increasing for
``k >= 1`` (every parametric family here, any decaying table) ``u_i <= v_i``.

Tables that rise. A table that rises above ``f(1)`` makes the early rows'
normalisers small against ``e^{M'}``: ``u_i / v_i = q / (p + q G_i)`` reaches
``alpha = max_h q_h / (p_h + q_h g_h(1))``, up to ``e^{M' - f(1)}``, and the
FFT's absolute error grows by that factor (a rise of 20 logits: errors of
1e-8; of 40: 0.09; beyond ~700, ``G_i`` underflows). So each layer checks
``alpha``: at most `MAX_AMPLIFICATION` takes the FFT; above it the product
is computed exactly by `direct_row_times_kernel`, O(H n^2) time in blocks of
rows (O(n) memory per block), with log-normalisers by a cumulative
log-sum-exp, so every term ``v_i e^{f(i-j) - log Z_i}`` is formed without
overflow and summed without cancellation. The choice is a `lax.cond` per
layer: under `vmap` with batched scores both run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = ["MAX_AMPLIFICATION", "fft_length", "cumulative_sum", "normalised_scores", "amplification",
           "row_times_kernel", "fft_row_times_kernel", "direct_row_times_kernel", "dense_kernel"]

MAX_AMPLIFICATION = 16.0
"""Largest ``alpha = max_h u_i / v_i`` (see the module docstring) for which a layer takes the FFT:
its rounding then exceeds a decaying table's by at most 4 bits."""

DIRECT_ROWS = 256
"""Rows per block of `direct_row_times_kernel`: memory O(DIRECT_ROWS n) per head."""

BLOCK = 128
"""Block of `cumulative_sum` (128 beat 64 and 256, and `jnp.cumsum` by 2.4x, on the 2-core CPU at N = 2^16)."""


def fft_length(n: int) -> int:
    """The power of two ``L >= 2n - 1`` on which a linear correlation of length n is circular-safe."""
    return 1 << max(0, (2 * n - 2).bit_length())


def normalised_scores(scores: Float[Array, "heads n"]):
    """``(p, q, g)`` of one layer's scores ``f_h(k)``, k = 0..n-1 (module docstring).

    Returns ``p, q`` of shape ``(H,)`` and ``g (H, n)`` with ``g[:, 0] = 0``,
    every value in [0, 1].
    """
    diagonal = scores[:, 0]
    n = scores.shape[-1]
    if n == 1:
        ones = jnp.ones_like(diagonal)
        return ones, jnp.zeros_like(diagonal), jnp.zeros_like(scores)
    off = scores[:, 1:]
    off_max = jnp.max(off, axis=-1)
    top = jnp.maximum(diagonal, off_max)
    p = jnp.exp(diagonal - top)
    q = jnp.exp(off_max - top)
    g = jnp.exp(off - off_max[:, None])
    return p, q, jnp.concatenate([jnp.zeros_like(diagonal)[:, None], g], axis=-1)


def cumulative_sum(x: Float[Array, "heads n"], block: int = BLOCK) -> Float[Array, "heads n"]:
    """``cumsum(x, axis=-1)`` blocked: one ``(B, B)`` triangular matmul per block, then the block offsets.

    XLA's CPU cumulative sum is a log-depth scan over the whole row; this
    touches each element twice. Only additions of the inputs (no
    subtraction), so non-negative inputs give sums with relative error
    O(eps log n), as a plain cumulative sum does.
    """
    heads, n = x.shape
    padded = -(-n // block) * block
    blocks = jnp.pad(x, ((0, 0), (0, padded - n))).reshape(heads, padded // block, block)
    lower = jnp.tril(jnp.ones((block, block), x.dtype))
    within = jnp.einsum("hnk,lk->hnl", blocks, lower)
    totals = jnp.cumsum(within[..., -1], axis=-1)
    before = jnp.concatenate([jnp.zeros_like(totals[:, :1]), totals[:, :-1]], axis=-1)
    return (within + before[..., None]).reshape(heads, padded)[:, :n]


def _row_weights(p, q, g):
    """Per row i: the diagonal weight ``A[i, i]`` and ``q / (p + q G_i)``, row 0 exact."""
    n = g.shape[-1]
    first = jnp.arange(n) == 0
    denominator = p[:, None] + q[:, None] * cumulative_sum(g)
    # Row 0 reads only itself; a safe denominator keeps 0/0 out of gradients too.
    safe = jnp.where(first, 1.0, denominator)
    diagonal = jnp.where(first, 1.0, p[:, None] / safe)
    off = jnp.where(first, 0.0, q[:, None] / safe)
    return diagonal, off


def amplification(scores: Float[Array, "heads n"]) -> Float[Array, ""]:
    """``alpha = max_h q_h / (p_h + q_h g_h(1))``: the largest ``u_i / v_i`` of the FFT product (module docstring).

    At most 1 when every ``f_h`` is non-increasing for k >= 1; 0 at n = 1.
    """
    if scores.shape[-1] == 1:
        return jnp.zeros((), scores.dtype)
    p, q, g = normalised_scores(scores)
    return jnp.max(q / (p + q * g[:, 1]))


def row_times_kernel(
    v: Float[Array, " n"], scores: Float[Array, "heads n"], head_weights: Float[Array, " heads"]
) -> Float[Array, " n"]:
    """``v^T A`` for the Toeplitz layer kernel ``A = sum_h w_h rowsoftmax(f_h(i - j))``.

    By FFT (`fft_row_times_kernel`, O(H n log n)) when the scores'
    `amplification` is at most `MAX_AMPLIFICATION`, else exactly
    (`direct_row_times_kernel`, O(H n^2)): never a product that lost its
    digits to a rising table.

    Args:
        v: the row vector, shape ``(n,)``.
        scores: ``f_h(k)`` for offsets k = 0..n-1 (``f_h(0)`` the diagonal
            score), shape ``(H, n)``.
        head_weights: ``w_h >= 0``, shape ``(H,)``; normalised here.

    Returns:
        ``(v^T A)_j = sum_i v_i A[i, j]``, shape ``(n,)``, non-negative for
        ``v >= 0`` (see the module docstring).
    """
    if v.shape[-1] == 1:
        return fft_row_times_kernel(v, scores, head_weights)
    return jax.lax.cond(amplification(scores) <= MAX_AMPLIFICATION,
                        lambda: fft_row_times_kernel(v, scores, head_weights),
                        lambda: direct_row_times_kernel(v, scores, head_weights))


def fft_row_times_kernel(
    v: Float[Array, " n"], scores: Float[Array, "heads n"], head_weights: Float[Array, " heads"]
) -> Float[Array, " n"]:
    """``v^T A`` by FFT, O(H n log n): exact to rounding for non-increasing ``f_h`` (module docstring).

    Args:
        v: the row vector, shape ``(n,)``.
        scores: ``f_h(k)`` for offsets k = 0..n-1 (``f_h(0)`` the diagonal
            score), shape ``(H, n)``.
        head_weights: ``w_h >= 0``, shape ``(H,)``; normalised here.

    Returns:
        ``(v^T A)_j = sum_i v_i A[i, j]``, shape ``(n,)``; O(H n log n),
        non-negative for ``v >= 0`` (see the module docstring).
    """
    n = v.shape[-1]
    weights = head_weights / jnp.sum(head_weights)
    p, q, g = normalised_scores(scores)
    diagonal, off = _row_weights(p, q, g)
    own = v * jnp.sum(weights[:, None] * diagonal, axis=0)
    if n == 1:
        return own
    length = fft_length(n)
    u = v[None, :] * off
    spectrum = jnp.sum(
        weights[:, None] * jnp.fft.rfft(u, n=length) * jnp.conj(jnp.fft.rfft(g, n=length)), axis=0
    )
    correlation = jnp.fft.irfft(spectrum, n=length)[:n]
    return own + jnp.maximum(correlation, 0.0)


def direct_row_times_kernel(
    v: Float[Array, " n"], scores: Float[Array, "heads n"], head_weights: Float[Array, " heads"]
) -> Float[Array, " n"]:
    """``v^T A`` term by term: ``sum_h w_h sum_{i >= j} v_i e^{f_h(i-j) - log Z_{h,i}}``, O(H n^2).

    ``log Z_{h,i} = logsumexp_{k <= i} f_h(k)`` by `jax.lax.cumlogsumexp`, so
    every exponent is <= 0 and every term non-negative: exact to rounding
    for any finite table. Rows go `DIRECT_ROWS` at a time (a `lax.scan`),
    heads one at a time, so memory is O(DIRECT_ROWS n).
    """
    n = v.shape[-1]
    weights = head_weights / jnp.sum(head_weights)
    log_normalisers = jax.lax.cumlogsumexp(scores, axis=1)  # (H, n)
    rows = min(DIRECT_ROWS, n)
    count = -(-n // rows)
    pad = count * rows - n
    columns = jnp.arange(n)

    def one_head(head):
        f, log_z, weight = head
        f = jnp.pad(f, (0, pad + n))  # offsets beyond n - 1 are never read (masked)

        def block(total, chunk):
            index, values, logs = chunk
            offsets = index[:, None] - columns[None, :]
            terms = jnp.exp(jnp.where(offsets >= 0, f[jnp.maximum(offsets, 0)] - logs[:, None], -jnp.inf))
            return total + values @ terms, None

        chunks = (jnp.arange(count * rows).reshape(count, rows),
                  jnp.pad(v, (0, pad)).reshape(count, rows),
                  jnp.pad(log_z, (0, pad)).reshape(count, rows))
        return weight * jax.lax.scan(block, jnp.zeros_like(v), chunks)[0]

    return jnp.sum(jax.lax.map(one_head, (scores, log_normalisers, weights)), axis=0)


def dense_kernel(scores: Float[Array, "heads n"], head_weights: Float[Array, " heads"]) -> Float[Array, "n n"]:
    """The dense causal layer kernel ``A[i, j] = sum_h w_h softmax_j(f_h(i - j))``, j <= i."""
    n = scores.shape[-1]
    offsets = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]
    table = scores[:, jnp.clip(offsets, 0, n - 1)]
    per_head = jax.nn.softmax(jnp.where(offsets >= 0, table, -jnp.inf), axis=-1)
    weights = head_weights / jnp.sum(head_weights)
    return jnp.einsum("h,hij->ij", weights, per_head)
