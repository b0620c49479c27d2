"""The causal structured product with its hand-written adjoint (a custom VJP).

`_causal_product` is ``v^T A`` under the causal mask: the stationary split
(`_causal_mixture`) where it is exact to rounding, else head chunks. Its
reverse mode keeps only the inputs and runs `_causal_adjoint`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from .structured_products import (
    _CARRY_BLOCK,
    _MAX_LOG_DECAY,
    _PREFIX_BLOCK,
    TRANSIENT,
    _causal_mixture,
    _chunked_product,
    _geometric,
    _powers,
    _tables,
    reverse_discounted_cumsum,
)

__all__: list[str] = []  # the public names are re-exported by jaxroll.structured


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _causal_product(v, a, c, weights, prefix, head_chunk, block, settled=False):
    """Causal ``v^T A``: the stationary split where it is exact to rounding, else head chunks.

    `settled` (static): the caller has established `_settled` for these
    arrays (`jaxroll.structured.causal_settled`), so the split is taken
    without a run-time branch; otherwise a `lax.cond` decides. Reverse mode
    keeps only the inputs (O(n) per call) and runs the hand-written adjoint
    (`_causal_adjoint`) of the branch that ran.
    """
    if v.shape[-1] <= prefix or settled:  # _causal_mixture takes min(prefix, n) exact rows
        return _causal_mixture(v, a, c, weights, prefix, block)
    return _causal_exact_or_split(v, a, c, weights, prefix, head_chunk, block)


def _causal_product_forward(v, a, c, weights, prefix, head_chunk, block, settled=False):
    return _causal_product(v, a, c, weights, prefix, head_chunk, block, settled), (v, a, c, weights)


def _causal_product_backward(prefix, head_chunk, block, settled, inputs, cotangent):
    v, a, c, weights = inputs
    return _causal_adjoint(v, cotangent, a, c, weights, prefix, head_chunk, block, settled)


_causal_product.defvjp(_causal_product_forward, _causal_product_backward)


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
# Rows below P (`_exact_adjoint`) go in blocks of B = 16: F and dF/da inside a
# block are one (blocks, B) @ (B, 2 B H) matmul for every head, the sums
# entering each block (E_b, dE_b/da) come first from a recurrence over blocks,
# the row counts g_n and h_n = -dg/da from per-block and per-offset values (no
# transcendental per row), and each row's terms are folded into three
# (rows, H) arrays z0, z1, z2 (`_exact_rows`) reduced by vector-matrix products.
# Rows beyond the prefix P have s = kappa_h and D = D_inf,h, so their sums
# collapse to per-head bilinear forms sum_{i>=P} v_i F_{h,i} and vbar there
# is a head mixture of forward sums, as in the forward pass: one blocked
# pass (`_stationary_sums`) with the slope derivatives written out (block
# sums and their moments in the same matmuls, the recurrence over blocks
# and its derivative as two passes).


def _forward_inclusive(x, log_decay):
    """``I_b = sum_{b' <= b} x_{b'} r^{b - b'}`` along the last axis (heads first), by reversal."""
    return reverse_discounted_cumsum(x[..., ::-1], log_decay, _CARRY_BLOCK)[..., ::-1]


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
"""Rows per step of the adjoint's rows with exact normalisers (whole blocks of `_PREFIX_BLOCK`):
transient memory O(ADJOINT_ROWS * H) a step, besides the per-block sums O(P H / B). (Steps of
256 to 2048 rows measured alike on the 2-core CPU; one step of all 8192 rows, a scan that XLA
inlines, 5x slower, so there are two steps at least.)"""


def _block_carries(g_blocks, a, length: int):
    """``E_b = F_{bB}`` at every block start (shape ``(count, H)``) and ``F_length`` (shape ``(H,)``).

    ``F_i = sum_{j<i} g_j r^{i-1-j}`` (`g_blocks` is g in blocks of B, zeros
    after `length`): the block sums ``S_b = sum_k g[b, k] r^{B-1-k}`` and the
    recurrence ``E_{b+1} = r^B E_b + S_b`` over blocks, ``E_0 = 0``.
    """
    count, size = g_blocks.shape
    dtype = g_blocks.dtype
    a = jnp.minimum(a, _MAX_LOG_DECAY)
    sums = g_blocks @ _powers(a, jnp.arange(size - 1, -1, -1, dtype=dtype)).T  # (count, H)
    inclusive = _forward_inclusive(sums.T, a * size)  # (H, count): E_1 .. E_count
    starts = jnp.concatenate([jnp.zeros_like(inclusive[:, :1]), inclusive], axis=1)  # E_0 .. E_count
    block, offset = divmod(length, size)
    end = starts[:, block]
    if offset:  # F_length = r^l E_b + sum_{k<l} g[b, k] r^{l-1-k}
        tail = g_blocks[block, :offset] @ _powers(a, jnp.arange(offset - 1, -1, -1, dtype=dtype)).T
        end = jnp.exp(-a * offset) * end + tail
    return starts[:, :count].T, end


def _exact_rows(v, g, entering, d_entering, counts_start, d_counts_start, first, local):
    """The adjoint sums of one step of ``count`` blocks of B consecutive rows with exact normalisers.

    Per block b: ``v``, ``g`` (count, B), g the cotangent; ``entering`` =
    ``E_b``, F at the block's first row, and ``d_entering = dE_b/da``
    (count, H); ``counts_start`` = ``G_P`` and ``d_counts_start = dG_P/da`` at
    its first position P (count, H), ``G_n = sum_{k<n} r^k`` the row count of
    the tables; ``first``: whether its row 0 reads only itself (position 0,
    or a zero block padded in front). `local` holds what every block shares
    (see `_exact_adjoint`). At row ``n = P + l``: ``G_n = G_l + r^l G_P`` and
    ``h_n = h_l + r^l (h_P + l G_P)`` (``h = -dG/da``; non-negative terms, no
    transcendental per row), ``F = F_local + r^l E_b`` and
    ``dF/da = dF_local/da + r^l (dE_b/da - l E_b)``. Returns the sums over
    these rows of ``v z0``, ``v z1``, ``v z2`` (each (H,)) and ``vbar`` (count B,)::

        z0 = g D + s F                                 (wbar = sum v z0, vbar = z0 @ w)
        z1 = D (g s G - s F)                           (cbar = w sum v z1)
        z2 = g D s (G + h) + s F (s h - D) + s dF/da   (abar = w sum v z2)
    """
    toeplitz, powers, g_local, d_local, p, q, weights = local
    count, size = g.shape
    heads = powers.shape[-1]
    offsets = jnp.arange(size, dtype=g.dtype)[None, :, None]
    # Inside blocks: [F_local, dF_local/da] = g @ [r^{l-1-k}, -(l-1-k) r^{l-1-k}] (k < l), every head at once.
    within = (g @ toeplitz).reshape(count, 2, size, heads)
    powers = powers[None]  # r^l
    counts = g_local[None] + powers * counts_start[:, None]
    moments = -d_local[None] + powers * (offsets * counts_start[:, None] - d_counts_start[:, None])
    alone = (first[:, None] & (offsets[..., 0] == 0))[..., None]
    # A row that reads only itself: p may underflow to 0 there, so it is set apart.
    inverse = jnp.where(alone, 1.0, 1.0 / jnp.where(alone, 1.0, p + q * counts))
    diagonal = jnp.where(alone, 1.0, p * inverse)
    share = jnp.where(alone, 0.0, q * inverse)
    forward = within[:, 0] + powers * entering[:, None]
    d_forward = within[:, 1] + powers * (d_entering[:, None] - offsets * entering[:, None])
    g = g[..., None]
    shared = share * forward
    z0 = (g * diagonal + shared).reshape(-1, heads)
    z1 = (diagonal * (g * share * counts - shared)).reshape(-1, heads)
    z2 = (g * diagonal * share * (counts + moments) + shared * (share * moments - diagonal)
          + share * d_forward).reshape(-1, heads)
    # Three vector-matrix products: one of the stacked (rows, 3H) measured slower (the concatenation).
    v = v.reshape(-1)
    return (v @ z0, v @ z1, v @ z2), z0 @ weights


def _exact_adjoint(v, g, a, c, weights, block: int, rows: int | None = None):
    """The adjoint over rows ``0..P-1`` with exact normalisers (P = len(v)), `rows` rows a step.

    Rows in blocks of B = `block` (zeros padded after row P), a
    `jax.lax.scan` over steps of ceil(`rows` / B) blocks (`_exact_rows`;
    zero blocks padded in front, which add nothing). Every block's entering
    sums ``E_b``, its ``G_P`` and their slope derivatives come first
    (`_block_carries`, `_geometric`; O(P H / B) memory), so no step
    waits for the one before. Returns ``(vbar, abar, cbar, wbar)`` of these rows and
    ``(F_P, dF_P/da)``, the forward sums carried past row P.
    """
    length = v.shape[-1]
    heads = a.shape[0]
    dtype = g.dtype
    ones = jnp.ones_like(a)
    size = min(length, block)
    count = -(-length // size)
    per_step = max(1, min(-(-(ADJOINT_ROWS if rows is None else rows) // size),
                          # two steps at least: XLA inlines a scan of one step and then fuses the
                          # per-block tables into every (rows, H) product (measured 2.5x slower)
                          -(-count // 2)))
    steps = -(-count // per_step)
    front = steps * per_step - count
    v_blocks, g_blocks = (jnp.pad(x, (0, count * size - length)).reshape(count, size) for x in (v, g))
    (entering, carried), (d_entering, d_carried) = jax.jvp(
        lambda x: _block_carries(g_blocks, x, length), (a,), (ones,))
    starts = size * jnp.arange(count)
    counts_start, d_counts_start = jax.jvp(lambda x: _geometric(x, starts.astype(x.dtype)[:, None]), (a,), (ones,))

    def steps_of(x, fill=0):
        padded = jnp.pad(x, ((front, 0),) + ((0, 0),) * (x.ndim - 1), constant_values=fill)
        return padded.reshape((steps, per_step) + x.shape[1:])

    # Shared by every block: the lag matrices of all heads, r^l, g_l and dg_l/da, p and q.
    clamped = jnp.minimum(a, _MAX_LOG_DECAY)
    offsets = jnp.arange(size)
    lag = offsets[None, :] - 1 - offsets[:, None]  # [k, l] = l - 1 - k
    lags = jnp.maximum(lag, 0).astype(dtype)[..., None]
    decay = jnp.where((lag >= 0)[..., None], jnp.exp(-clamped * lags), 0.0)  # (B, B, H)
    toeplitz = jnp.stack([decay, -lags * decay], axis=1).reshape(size, 2 * size * heads)
    g_local, d_local = jax.jvp(lambda x: _geometric(x, jnp.arange(size, dtype=x.dtype)[:, None]), (a,), (ones,))
    top = jnp.maximum(c, -a)
    local = (toeplitz, _powers(clamped, offsets.astype(dtype)).T, g_local, d_local,
             jnp.exp(c - top), jnp.exp(-a - top), weights)

    def step(total, inputs):
        sums, v_bar = _exact_rows(*inputs, local)
        return tuple(x + y for x, y in zip(total, sums)), v_bar

    zero = jnp.zeros_like(a)
    # Blocks padded in front have v = g = E = 0 and read their row 0 as position 0.
    inputs = tuple(steps_of(x) for x in (v_blocks, g_blocks, entering, d_entering, counts_start, d_counts_start))
    (w_bar, c_bar, a_bar), v_bar = jax.lax.scan(
        step, (zero, zero, zero), inputs + (steps_of(starts == 0, True),))
    v_bar = v_bar.reshape(-1)[front * size:front * size + length]
    return (v_bar, weights * a_bar, weights * c_bar, w_bar), (carried, d_carried)


def _stationary_sums(v, g, a, coefficients, carried, d_carried, block: int):
    """The rows beyond P at once: ``(E, bilinear, dbilinear/da)``, shapes ``(n,)``, ``(H,)``, ``(H,)``.

    With ``F_{h,i} = sum_{j<i} g_j r_h^{i-1-j} + r_h^i carried_h``:
    ``E_i = sum_h beta_h F_{h,i}`` (beta = `coefficients`), the per-head
    bilinear forms ``sum_i v_i F_{h,i}`` and their slope derivatives
    (``d_carried = d carried / da``). Blocks of B: per block the sums
    ``G_b = sum_k g[b, k] r^{B-1-k}`` and ``V_b = sum_l v[b, l] r^l`` come
    with their moments ``G'_b = sum_k g[b, k] (B-1-k) r^{B-1-k}`` and
    ``V'_b = sum_l v[b, l] l r^l`` from two ``(n/B, B) @ (B, 2H)`` matmuls;
    the block starts ``C_0 = carried``, ``C_{b+1} = r^B C_b + G_b`` (and
    ``dC/da``, a `jax.jvp` of that recurrence with ``dG/da = -G'``); inside
    blocks ``E`` is one mixed strictly lower Toeplitz matmul plus
    ``sum_h beta_h r_h^l C_{h,b}``, and the bilinear forms are
    ``sum_{l>k} M[l, k] r^{l-1-k} + sum_b V_b C_b`` with the lag matrix
    ``M[l, k] = sum_b v[b, l] g[b, k]`` shared by every head; their derivative
    ``-sum_{l>k} M[l, k] (l-1-k) r^{l-1-k} + sum_b (V_b dC_b/da - V'_b C_b)``.
    Work O(n (2 B + 5 H)).
    """
    length = g.shape[-1]
    clamped = jnp.minimum(a, _MAX_LOG_DECAY)
    heads = a.shape[0]
    size = min(length, block)
    count = -(-length // size)
    v_blocks, g_blocks = (jnp.pad(x, (0, count * size - length)).reshape(count, size) for x in (v, g))
    offsets = jnp.arange(size)
    exponents = offsets.astype(g.dtype)
    powers = _powers(clamped, exponents)  # (H, B): r^l
    stacked = jnp.concatenate([powers, exponents * powers])  # (2H, B): r^l, l r^l
    # Heads first and blocks last to first (m = count - 1 - b): the recurrence over blocks is then a
    # reverse one and no (H, count) array is flipped or transposed.
    v_sums = stacked @ v_blocks[::-1].T  # (2H, count): V, V'
    g_sums = stacked[:, ::-1] @ g_blocks[::-1].T  # G, G'
    decay = jnp.exp(-clamped * size)[:, None]  # r^B
    starts = reverse_discounted_cumsum(jnp.concatenate([g_sums[:heads, 1:], carried[:, None]], axis=1),
                                       clamped * size, _CARRY_BLOCK)  # C_b
    # dC_{b+1}/da = r^B dC_b/da - B r^B C_b - G'_b: the same recurrence, a second pass.
    d_entering = jnp.concatenate([-g_sums[heads:, 1:] - size * decay * starts[:, 1:], d_carried[:, None]], axis=1)
    d_starts = reverse_discounted_cumsum(d_entering, clamped * size, _CARRY_BLOCK)
    lag = offsets[:, None] - 1 - offsets[None, :]  # [l, k] = l - 1 - k
    mixed = coefficients @ powers  # sum_h beta_h r_h^d
    local = g_blocks @ jnp.where(lag >= 0, mixed[jnp.maximum(lag, 0)], 0.0).T
    forward = (local + (starts.T @ (coefficients[:, None] * powers))[::-1]).reshape(-1)[:length]
    # Inside blocks, every head: [sum M r^lag, sum M lag r^lag] from the (2H, B, B) gathered powers.
    lags = jnp.where(lag >= 0, v_blocks.T @ g_blocks, 0.0).reshape(-1)
    within = stacked[:, jnp.maximum(lag, 0)].reshape(2 * heads, -1) @ lags
    bilinear = within[:heads] + jnp.sum(v_sums[:heads] * starts, axis=1)
    d_bilinear = (jnp.sum(v_sums[:heads] * d_starts, axis=1) - within[heads:]
                  - jnp.sum(v_sums[heads:] * starts, axis=1))
    return forward, bilinear, d_bilinear


def _split_adjoint(v, g, a, c, weights, prefix: int, block: int):
    """The adjoint of `_causal_mixture` (exact rows below `prefix`, stationary beyond)."""
    (v_head, a_bar, c_bar, w_bar), (carried, d_carried) = _exact_adjoint(
        v[:prefix], g[:prefix], a, c, weights, _PREFIX_BLOCK)
    _, _, diagonal_limit, kappa = _tables(a, c, jnp.zeros((1,) + a.shape, a.dtype))
    v_tail, g_tail = v[prefix:], g[prefix:]
    forward, bilinear, d_bilinear = _stationary_sums(v_tail, g_tail, a, weights * kappa, carried, d_carried, block)
    v_rest = g_tail * (weights @ diagonal_limit) + forward
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


def _causal_adjoint(v, g, a, c, weights, prefix: int, head_chunk: int, block: int, settled: bool = False):
    """``(vbar, abar, cbar, wbar)`` of the causal product for the cotangent g, the branch the forward took."""
    n = v.shape[-1]
    if n <= prefix:
        (v_bar, a_bar, c_bar, w_bar), _ = _exact_adjoint(v, g, a, c, weights, _PREFIX_BLOCK)
        return v_bar, a_bar, c_bar, w_bar
    if settled:
        return _split_adjoint(v, g, a, c, weights, prefix, block)
    return jax.lax.cond(_settled(a, weights, prefix),
                        lambda: _split_adjoint(v, g, a, c, weights, prefix, block),
                        lambda: _chunked_adjoint(v, g, a, c, weights, head_chunk, block))

