"""Small N, one kernel in every layer: the dense kernel formed once from the closed-form tables."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .step import layer_step
from .structured_products import _MAX_LOG_DECAY, _geometric_table, _powers

__all__: list[str] = []  # the public names are re-exported by jaxroll.structured


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


def _row_tables(a, c, n: int, block: int):
    """``A_h[i, i]`` and ``s_h[i] = q / Z_i`` for rows i < n (n a multiple of B), shapes ``(..., n)``; row 0 exact."""
    top = jnp.maximum(c, -a)
    p = jnp.exp(c - top)[..., None]
    q = jnp.exp(-a - top)[..., None]
    first = jnp.arange(n) == 0
    counts = _geometric_table(a, n, block)
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
    ``sum_k c_k row^T A^k`` (docs/design.md, "Sweeps: Krylov rows and vmap"),
    evaluated by Horner's rule.
    Plain JAX: `jit`, `vmap`, `grad` and `jvp` apply.
    """
    dtype = row.dtype
    weights = (head_weights / jnp.sum(head_weights)).astype(dtype)
    kernel = dense_causal_kernel(slopes.astype(dtype) / temperature, diagonal_scores.astype(dtype) / temperature,
                                 weights, row.shape[-1])

    def step(vector, weight):
        return layer_step(vector, weight, vector @ kernel), None

    return jax.lax.scan(step, row, lambdas.astype(dtype), reverse=True)[0]

