"""The mean of per-sequence rollouts, beside the rollout of the mean (arXiv 2602.16837).

The measured half is `jaxroll.measure.sequence_rollout` (torch): it reads
each sequence's own attention and mixing and gives this module's rows for a
Hugging Face model without holding every sequence at once.

The residual-aware rollout of arXiv 2602.16837 (Abnar & Zuidema 2020 for the
rollout) averages the ingredients over sequences first and multiplies after:

    R_t      = (1 - lambda_t) I + lambda_t A_t,   A_t = mean_s A_t^s,  lambda_t = mean_s lambda_t^s
    P_T      = R_T ... R_1                                        (the rollout of the mean)

while the measured influence is a mean over sequences of each sequence's
own influence. This module multiplies first and averages after:

    R_t^s    = I - diag(lambda_t^s) + diag(lambda_t^s) A_t^s      (N, N), row-stochastic
    rows[k]  = mean_s e_{q_k}^T R_T^s ... R_1^s                    (the mean of the rollouts)

with ``A_t^s (N, N)`` sequence s's head-averaged attention at layer t
(``A[i, j]`` = the weight with which token i reads token j),
``lambda_t^s`` its mixing (a scalar, or one value per position i), and
``q_1 < ... < q_K`` the query positions (`jaxroll.theory.rows.query_positions`).
The two agree when every sequence has the same ingredients (S = 1 included);
otherwise they differ by covariances across sequences: within a layer, of
the mixing and the kernel (``mean_s R_t^s = R_t + cov_s(lambda_t^s, A_t^s)``
for scalar mixing), and between layers, of the transitions
(``mean_s R_2^s R_1^s = (mean_s R_2^s)(mean_s R_1^s) + cov_s(R_2^s, R_1^s)``).
These covariances are one candidate for why the rows of P_T other than the
last miss the measured rows by 5-10x their noise.

Each sequence's rows are those of a one-head `RefinedRollout`
(`jaxroll.theory.refinements.refined_rows`: T vector-times-matrix products
from layer T down to layer 1 in one reverse `jax.lax.scan`, vmapped over the
K start rows), vmapped over the S sequences; no ``P_T`` is formed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Float

from ..errors import ConfigError
from .refinements import RefinedRollout, refined_rows
from .rows import query_positions

__all__ = ["ROW_TOLERANCE", "mean_of_rollouts", "rollouts_per_sequence"]

ROW_TOLERANCE = 1e-6
"""How far a kernel row's sum may be from 1 (measured softmax rows in float32 are within ~1e-7)."""


def mean_of_rollouts(lambdas: Float[np.ndarray, "sequences layers"] | Float[np.ndarray, "sequences layers n"],
                     kernels: Float[np.ndarray, "sequences layers n n"], queries) -> Float[np.ndarray, "k n"]:
    """The mean over sequences of each sequence's own rollout rows, float64 NumPy ``(K, N)``.

    ``rows[k, j] = mean_s (e_{q_k}^T R_T^s ... R_1^s)_j`` with
    ``R_t^s = I - diag(lambda_t^s) + diag(lambda_t^s) A_t^s``; each row sums
    to 1. Against `jaxroll.theory.rows.predicted_rows`, the rows of the
    rollout of the mean (``R_t`` built from ``mean_s A_t^s`` and ``mean_s
    lambda_t^s``), see the module docstring. Computed in float64 whatever the
    process's ``jax_enable_x64``.

    Args:
        lambdas: ``(S, T)`` one mixing coefficient per sequence and layer, or
            ``(S, T, N)`` one per position i (the share of row i that
            mixes), in [0, 1].
        kernels: ``(S, T, N, N)`` ``A_t^s``, non-negative, each row summing to
            1 within `ROW_TOLERANCE` (rows are then divided by their sums, so
            every ``R_t^s`` is exactly row-stochastic).
        queries: a count K or the query positions
            (`jaxroll.theory.rows.query_positions`).

    Returns:
        ``(K, N)`` float64: row k is the mean of the S rollouts' rows ``q_k``.

    Raises:
        ConfigError: a shape, a lambda outside [0, 1], a NaN, a negative
            kernel entry, or a kernel row not summing to 1.
    """
    return rollouts_per_sequence(lambdas, kernels, queries).mean(axis=0)


def rollouts_per_sequence(lambdas: Float[np.ndarray, "sequences layers"] | Float[np.ndarray, "sequences layers n"],
                          kernels: Float[np.ndarray, "sequences layers n n"], queries) -> Float[np.ndarray, "s k n"]:
    """Each sequence's own rollout rows ``e_{q_k}^T R_T^s ... R_1^s``, float64 NumPy ``(S, K, N)``.

    `jaxroll.theory.refinements.refined_rows` of the one-head `RefinedRollout`
    ``(lambda^s, A^s)``, vmapped over the S sequences. Arguments and checks
    as `mean_of_rollouts` (whose result is the mean of this over axis 0).
    """
    kernels = np.asarray(kernels, dtype=np.float64)
    if kernels.ndim != 4 or kernels.shape[-1] != kernels.shape[-2] or 0 in kernels.shape:
        raise ConfigError(f"kernels: got shape {kernels.shape}; allowed: (S, T, N, N) with S, T, N >= 1")
    sequences, layers, n, _ = kernels.shape
    if not np.all(np.isfinite(kernels)) or kernels.min() < 0:
        raise ConfigError("kernels: negative or non-finite entries; allowed: finite, >= 0")
    sums = kernels.sum(-1, keepdims=True)
    worst = np.argmax(np.abs(sums - 1.0))
    if abs(sums.flat[worst] - 1.0) > ROW_TOLERANCE:
        raise ConfigError(f"kernels: a row sums to {sums.flat[worst]:.9g}; allowed: row sums 1 within "
                          f"{ROW_TOLERANCE}")
    lambdas = np.asarray(lambdas, dtype=np.float64)
    if lambdas.shape == (sequences, layers):
        lambdas = np.repeat(lambdas[..., None], n, axis=-1)
    if lambdas.shape != (sequences, layers, n):
        raise ConfigError(f"lambdas: got shape {lambdas.shape}; allowed: ({sequences}, {layers}) or "
                          f"({sequences}, {layers}, {n})")
    if not np.all(np.isfinite(lambdas)) or lambdas.min() < 0 or lambdas.max() > 1:
        raise ConfigError("lambdas: outside [0, 1] or NaN; allowed: values in [0, 1]")
    positions = query_positions(n, queries)
    with jax.enable_x64(True):
        # One head per sequence and layer, weight 1: A_t^s itself (checked above, so not through `create`).
        models = RefinedRollout(jnp.asarray(lambdas), jnp.asarray(kernels / sums)[:, :, None],
                                jnp.ones((sequences, layers, 1), dtype=jnp.float64))
        starts = jnp.eye(n, dtype=jnp.float64)[positions]
        return np.asarray(_rows_per_sequence(models, starts), dtype=np.float64)


# jit of the vmap, once at import: a vmap built per call would be traced and compiled again at every call.
_rows_per_sequence = jax.jit(jax.vmap(refined_rows, in_axes=(0, None)))
