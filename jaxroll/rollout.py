"""Transitions, the rollout matrix and the influence profile: scans over layers.

Layer t's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t``; the rollout
is ``P_T = R_T ... R_1`` (layer 1 acts first) and the influence profile is its
last row, ``p_T(j) = P_T[N-1, j]``: how much input position j contributes to
the last position after T layers (arXiv 2602.16837; the ``lambda = 1`` case is
the attention rollout of Abnar & Zuidema 2020).

The profile needs one row, not the matrix: ``p^T = e_{N-1}^T R_T ... R_1`` is
T vector-times-kernel products, applied from layer T down to layer 1 in one
`jax.lax.scan`. `P_T` is never formed for it. Which product each layer uses
is the planner's choice (`jaxroll.engine.plan`); this module only runs scans.
"""

from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import memory
from .engine.plan import METHODS, Path, check_length, plan, resolve_method
from .errors import ConfigError
from .model import RolloutModel

__all__ = ["METHODS", "attention_kernel", "transition", "influence",
           "influence_with_mass", "influence_on_path", "rollout_matrix", "rollout_row"]


def attention_kernel(model: RolloutModel, layer: int, n: int | None = None) -> Float[Array, "n n"]:
    """The dense layer kernel ``A_t`` of layer `layer` (0-based), shape ``(n, n)``.

    For ALiBi + content ``A_t = sum_h w_{t,h} rowsoftmax(s_{t,h})``, with
    ``A[i, j]`` the weight with which token i reads token j; rows sum to 1.
    """
    n = check_length(model, n)
    if not 0 <= layer < model.num_layers:
        raise ConfigError(f"layer: got {layer}; allowed: 0 to {model.num_layers - 1}")
    return model.kernel.layer(layer).dense(n)


def transition(model: RolloutModel, layer: int, n: int | None = None) -> Float[Array, "n n"]:
    """``R_t = (1 - lambda_t) I + lambda_t A_t`` for layer `layer` (0-based), as the kernel steps it (with the
    probability path, ``lambda`` per row and ``A_t`` its ``K_t``: `jaxroll.engine.probability`)."""
    n = check_length(model, n)
    if not 0 <= layer < model.num_layers:
        raise ConfigError(f"layer: got {layer}; allowed: 0 to {model.num_layers - 1}")
    kernel = model.kernel.layer(layer)
    dense = kernel.dense(n)  # A @ I = A: the product on the identity is the kernel itself
    return kernel.step(jnp.eye(n, dtype=dense.dtype), model.lambdas[layer], lambda *_: dense, left=True)


def _scan_layers(model: RolloutModel, row, path: Path, product, reverse: bool = True):
    """``row^T R_T ... R_1``: one scan from layer T down (`reverse`), or from layer 1 up for a matrix.

    `product(vector, kernel)` is one layer's ``vector^T A`` (or ``A @ P`` from layer 1 up).
    """
    stacked, shared = model.kernel.scan_parts(path)

    def apply_layer(vector, layer):
        weight, part = layer
        # The kernel takes the step: one lambda per layer, or per row (the probability path).
        return eqx.combine(part, shared).step(vector, weight, product, left=not reverse), None

    # Reverse mode keeps one row per layer: products without a VJP of their own are checkpointed.
    if path.checkpoint:
        apply_layer = jax.checkpoint(apply_layer)
    return jax.lax.scan(apply_layer, row, (model.lambdas, stacked), reverse=reverse)[0]


def _row_times_kernel(path: Path):
    if path.method == "dense":
        return lambda vector, kernel: vector @ kernel.dense(vector.shape[-1])
    return lambda vector, kernel: kernel.row_times_kernel(vector, path)


def _rollout_row(model: RolloutModel, row, path: Path):
    """``row^T R_T ... R_1`` along `path`: the shared kernel, one run-time switch, or the plain scan."""
    if path.shared_kernel:
        return model.kernel.shared_rollout_row(row, model.lambdas)
    if path.settled is None:  # traced arrays: one switch around the whole rollout
        rung = model.kernel.settled_rung(row.dtype)
        return jax.lax.switch(rung, [functools.partial(_scan_layers, model, row, rung_path,
                                                       _row_times_kernel(rung_path)) for rung_path in path.rungs])
    return _scan_layers(model, row, path, _row_times_kernel(path))


@functools.partial(jax.jit, static_argnames=("n", "path"))
def influence_on_path(model: RolloutModel, n: int, path: Path):
    """``(p, mass)`` of :func:`influence_with_mass` along a path already planned.

    ``mass = sum_j (e_{n-1}^T R_T ... R_1)_j`` and ``p`` that row over
    ``mass``; `path` is ``engine.plan.plan(model, n, method)``, so a caller
    that plans once (a bucket of configurations, a benchmark of one rung)
    skips the planner.
    """
    last = jnp.zeros(n, dtype=jnp.result_type(float)).at[n - 1].set(1.0)
    row = _rollout_row(model, last, path)
    mass = jnp.sum(row)
    return row / mass, mass


def influence_with_mass(
    model: RolloutModel, n: int | None = None, method: str = "auto"
) -> tuple[Float[Array, " n"], Float[Array, ""]]:
    """The influence profile and its mass before normalisation.

    Returns ``(p, mass)`` with ``mass = sum_j (e_{n-1}^T R_T ... R_1)_j`` and
    ``p`` that row divided by `mass`. Every ``R_t`` is row-stochastic, so
    `mass` is 1 up to rounding; it is reported to make rounding visible.
    """
    n, method = check_length(model, n), resolve_method(method)
    # XLA aborts the process on a failed allocation: refuse first, in one line.
    memory.check_fits(memory.model_influence_bytes(model, n, method, jnp.dtype(jnp.result_type(float)).itemsize),
                      f"influence: n = {n}", allowed="a shorter n")
    return influence_on_path(model, n, plan(model, n, method))


def influence(model: RolloutModel, n: int | None = None, method: str = "auto") -> Float[Array, " n"]:
    """The influence profile ``p_T(j) = P_T[n-1, j]``, shape ``(n,)``, summing to 1.

    Computed as ``p^T = e_{n-1}^T R_T ... R_1``: T vector-times-kernel
    products in one `lax.scan` from layer T down to layer 1, with
    ``R_t = (1 - lambda_t) I + lambda_t A_t``. `P_T` is never formed.

    Args:
        model: the rollout parameters.
        n: the sequence length (default ``model.sequence_length``).
        method: ``"dense"`` forms each ``(n, n)`` kernel (O(T H n^2));
            ``"structured"`` uses the kernel type's own product (O(T H n)
            for ALiBi + content, `jaxroll.engine.structured`; O(T H n log n)
            FFTs for relative-position kernels); ``"auto"`` picks the fast one.

    Returns:
        ``p``, a probability vector over positions 0..n-1.

    Example:
        >>> import jaxroll
        >>> model = jaxroll.presets.get("mpt-7b")
        >>> p = jaxroll.influence(model, 128)
        >>> p.shape
        (128,)
    """
    return influence_with_mass(model, n, method)[0]


def rollout_row(model: RolloutModel, row: Float[Array, " n"], method: str = "auto") -> Float[Array, " n"]:
    """``row^T R_T ... R_1`` for any row vector, not normalised; n is ``row``'s length.

    With ``row = e_{n-1}`` this is the unnormalised influence profile. Under a
    causal (or sliding) mask the first n rows of ``P_T`` at length ``N >= n``
    are ``P_T`` at length n, so ``e_{n-1}^T P_T`` at length N is the profile at
    length n padded with zeros: `jaxroll.sweep` runs every sequence length of
    a sweep as a vmap over start rows at one N. The planner's path, except
    that a traced kernel keeps a branch per product instead of one switch
    around the scan (a switch on batched arrays under `vmap` would run every
    rung). Pure: jit, vmap and grad apply.
    """
    path = plan(model, row.shape[-1], method)
    if path.settled is None:
        path = dataclasses.replace(path, settled=False, rungs=())
    return _rollout_row(model, row, path)


@functools.partial(jax.jit, static_argnames=("n",))
def _rollout_matrix(model: RolloutModel, n: int) -> Float[Array, "n n"]:
    identity = jnp.eye(n, dtype=jnp.result_type(float))
    return _scan_layers(model, identity, Path(method="dense"), lambda product, kernel: kernel.dense(n) @ product,
                        reverse=False)


def rollout_matrix(model: RolloutModel, n: int | None = None) -> Float[Array, "n n"]:
    """The full rollout ``P_T = R_T ... R_1``, shape ``(n, n)``.

    Under causal masking ``P_T`` is lower triangular and row-stochastic, and
    its top-left ``m x m`` block is the rollout at length m. Costs O(T n^3);
    use `influence` when the last row is all you need.
    """
    return _rollout_matrix(model, check_length(model, n))

