"""The causal structured product with its hand-written adjoint (custom VJP, issue 24).

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
    _geometric_rows,
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
# benchmarks/influence.py can time both in one run (`structured._AUTODIFF_ADJOINT`).


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

