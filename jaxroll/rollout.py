"""Transitions, the rollout matrix and the influence profile.

Layer t's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t``; the rollout
is ``P_T = R_T ... R_1`` (layer 1 acts first) and the influence profile is its
last row, ``p_T(j) = P_T[N-1, j]``: how much input position j contributes to
the last position after T layers (arXiv 2602.16837; the ``lambda = 1`` case is
the attention rollout of Abnar & Zuidema 2020).

The profile needs one row, not the matrix: ``p^T = e_{N-1}^T R_T ... R_1`` is
T vector-times-matrix products, applied from layer T down to layer 1 in one
`jax.lax.scan`. `P_T` is never formed for it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import memory, structured
from ._checks import check_positive_int
from .errors import ConfigError
from .kernels import layer_kernel
from .model import KernelRolloutModel, RolloutModel

__all__ = ["METHODS", "attention_kernel", "transition", "influence",
           "influence_with_mass", "rollout_matrix", "rollout_row"]

METHODS = ("auto", "dense", "structured")
"""How `influence` multiplies by a kernel: ``structured`` (O(H N) per layer, never forming A), ``dense`` (the (N, N) kernel, for checking), ``auto`` (structured where it applies)."""


def _length(model: RolloutModel | KernelRolloutModel, n: int | None) -> int:
    n = model.sequence_length if n is None else check_positive_int("n", n)
    if isinstance(model, KernelRolloutModel):
        model.kernel.check_length(n)
    return n


def _layers(model: RolloutModel):
    """The per-layer arrays, stacked along axis 0, as `lax.scan` consumes them."""
    return (model.lambdas, model.alibi_slopes, model.diagonal_scores,
            model.base_scores, model.head_weights)


def _dense_kernel(model: RolloutModel, layer, n: int) -> Float[Array, "n n"]:
    _, slopes, diagonal, base, weights = layer
    return layer_kernel(slopes, diagonal, base, weights, model.temperature, n,
                        model.mask, model.window)


def attention_kernel(model: RolloutModel | KernelRolloutModel, layer: int, n: int | None = None) -> Float[Array, "n n"]:
    """The dense layer kernel ``A_t`` of layer `layer` (0-based), shape ``(n, n)``.

    ``A_t = sum_h w_{t,h} rowsoftmax(s_{t,h})`` with ``A[i, j]`` the weight with
    which token i reads token j; rows sum to 1.
    """
    n = _length(model, n)
    if not 0 <= layer < model.num_layers:
        raise ConfigError(f"layer: got {layer}; allowed: 0 to {model.num_layers - 1}")
    if isinstance(model, KernelRolloutModel):
        return model.kernel.layer(layer).dense(n)
    return _dense_kernel(model, jax.tree.map(lambda x: x[layer], _layers(model)), n)


def transition(model: RolloutModel | KernelRolloutModel, layer: int, n: int | None = None) -> Float[Array, "n n"]:
    """``R_t = (1 - lambda_t) I + lambda_t A_t`` for layer `layer` (0-based)."""
    n = _length(model, n)
    kernel = attention_kernel(model, layer, n)
    weight = model.lambdas[layer]
    return (1.0 - weight) * jnp.eye(n, dtype=kernel.dtype) + weight * kernel


@functools.partial(jax.jit, static_argnames=("n",))
def _rollout_matrix(model: RolloutModel, n: int) -> Float[Array, "n n"]:
    def apply_layer(product, layer):
        weight = layer[0]
        kernel = _dense_kernel(model, layer, n)
        return (1.0 - weight) * product + weight * (kernel @ product), None

    identity = jnp.eye(n, dtype=jnp.result_type(float))
    product, _ = jax.lax.scan(apply_layer, identity, _layers(model))
    return product


def rollout_matrix(model: RolloutModel | KernelRolloutModel, n: int | None = None) -> Float[Array, "n n"]:
    """The full rollout ``P_T = R_T ... R_1``, shape ``(n, n)``.

    Under causal masking ``P_T`` is lower triangular and row-stochastic, and
    its top-left ``m x m`` block is the rollout at length m. Costs O(T n^3);
    use `influence` when the last row is all you need.
    """
    if isinstance(model, KernelRolloutModel):
        return _kernel_rollout_matrix(model, _length(model, n))
    return _rollout_matrix(model, _length(model, n))


def _row_times_kernel(model: RolloutModel, method: str, n: int, shared_slopes: bool = False, settled: bool = False,
                      transient: int | None = None):
    """``(v, layer) -> v^T A_t`` by the chosen method.

    `shared_slopes`: every layer has the slopes of layer 0, which the product
    then reads from outside the scan over layers: its normaliser tables'
    geometric counts (one ``expm1`` per row and head) become loop-invariant,
    and XLA computes them once instead of once per layer (BLOOM-176B with
    per-head content, N = 256, float64: 32 -> 8 ms in one interleaved run).
    `settled`: every layer passed `structured.causal_settled` at the prefix
    `transient` (default: the dtype's), so no run-time branch per product.
    """
    if method == "dense":
        return lambda row, layer: row @ _dense_kernel(model, layer, n)

    def product(row, layer):
        _, slopes, diagonal, base, weights = layer
        if shared_slopes:
            slopes = model.alibi_slopes[0]
        return structured.row_times_kernel(
            row, slopes, diagonal, base, weights, model.temperature, model.mask, model.window,
            transient=transient, settled=settled,
        )

    return product


@functools.partial(jax.jit, static_argnames=("n", "method", "shared", "shared_slopes", "settled", "transient"))
def _influence_with_mass(model: RolloutModel, n: int, method: str, shared: bool = False,
                         shared_slopes: bool = False, settled: bool | None = False, transient: int | None = None):
    def rollout(settled: bool, transient: int | None = transient):
        row_times_kernel = _row_times_kernel(model, method, n, shared_slopes, settled, transient)

        def apply_layer(row, layer):
            weight = layer[0]
            return (1.0 - weight) * row + weight * row_times_kernel(row, layer), None

        # Reverse mode keeps one row per layer, not O(H n): the structured product's
        # own VJP keeps only its inputs; the dense one is checkpointed.
        if method == "dense":
            apply_layer = jax.checkpoint(apply_layer)
        return jax.lax.scan(apply_layer, last, _layers(model), reverse=True)[0]

    last = jnp.zeros(n, dtype=jnp.result_type(float)).at[n - 1].set(1.0)
    if shared:
        row = _shared_row(_layers(model), model.temperature, last)
    elif settled is None:  # traced arrays (`_settles`): one switch for the whole rollout
        rung = structured.settled_rung(model.alibi_slopes, model.head_weights, model.temperature, last.dtype)
        row = jax.lax.switch(rung, [lambda: rollout(True, structured.alibi_prefix(last.dtype)),
                                    lambda: rollout(True), lambda: rollout(False)])
    else:
        row = rollout(settled)
    mass = jnp.sum(row)
    return row / mass, mass


def _settles(model: RolloutModel, n: int, method: str) -> tuple[bool | None, int | None]:
    """``(settled, transient)``: whether every layer's causal product may skip its run-time branch, and where.

    Concrete arrays decide before compilation (`structured.settled_prefix`):
    ``(True, P)`` with the shortest prefix P every weighted head settles
    within, when ``n > P``; ``(False, None)`` otherwise (exact rows up to
    n, or a per-product branch at the dtype's prefix). Traced arrays give
    ``(None, None)`` beyond the dtype's prefix: one `lax.switch` around the
    whole rollout (`structured.settled_rung`: split at `alibi_prefix`, at
    the dtype's prefix, or per-product branches). Other masks and methods
    have no branch: ``(False, None)``.
    """
    dtype = jnp.result_type(float)
    if method != "structured" or model.mask != "causal":
        return False, None
    arrays = (model.alibi_slopes, model.head_weights, model.temperature)
    if any(isinstance(array, jax.core.Tracer) for array in arrays):
        return (None if n > structured._prefix_length(dtype) else False), None
    prefix = structured.settled_prefix(*arrays, dtype)
    if prefix is None or n <= prefix:
        return False, None
    return True, prefix


def _takes_shared_path(model: RolloutModel, n: int, method: str) -> bool:
    """Whether `influence` forms one dense kernel for every layer (a static choice).

    Only for concrete arrays (not under jit, grad or vmap of the model) that
    provably share one causal kernel, at N <= `structured.SHARED_DENSE_MAX`:
    deciding here, in NumPy (`structured.shares_one_kernel`), keeps both the run-time test and the second
    branch out of every compiled program (a `lax.cond` compiled both and
    slowed per-layer models by 1.6x at N = 256). A traced kernel array takes
    the per-layer products, whose gradient is every layer's own (the shared
    form reads layer 0 only, so differentiating it wrt the kernel's arrays
    would send every layer's gradient there).
    """
    if method != "structured" or model.mask != "causal" or n > structured.SHARED_DENSE_MAX:
        return False
    arrays = (model.alibi_slopes, model.diagonal_scores, model.head_weights)
    if any(isinstance(array, jax.core.Tracer) for array in arrays):
        return False
    return structured.shares_one_kernel(*arrays)


def _shares_slopes(model: RolloutModel, method: str) -> bool:
    """Whether every layer has the same slopes, decided in NumPy before compilation (concrete arrays only).

    A traced model keeps every layer's own slopes: reading layer 0's in every
    layer would send every layer's slope gradient to layer 0.
    """
    if method != "structured" or isinstance(model.alibi_slopes, jax.core.Tracer):
        return False
    slopes = np.asarray(model.alibi_slopes)
    return bool((slopes == slopes[:1]).all())


def _shared_row(layers, temperature, last):
    """``last^T R_T ... R_1`` when every layer has the same causal kernel (`_takes_shared_path`).

    The kernel is formed once densely (`structured.shared_kernel_rollout_row`).
    Plain JAX, differentiated by autodiff: the kernel's arrays are concrete
    here (constants), so only lambdas and the temperature can carry a
    gradient, and both enter the shared form exactly as the per-layer one.
    """
    lambdas, slopes, diagonal, _, weights = layers
    return structured.shared_kernel_rollout_row(last, lambdas, slopes[0], diagonal[0], weights[0], temperature)


def _resolve(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"method: got {method!r}; allowed: one of {', '.join(METHODS)}")
    # Every kernel has a fast product (RolloutModel's ALiBi + content: structured;
    # a KernelRolloutModel's: its kernel type's own), so auto is never dense.
    return "structured" if method == "auto" else method


def influence_with_mass(
    model: RolloutModel | KernelRolloutModel, n: int | None = None, method: str = "auto"
) -> tuple[Float[Array, " n"], Float[Array, ""]]:
    """The influence profile and its mass before normalisation.

    Returns ``(p, mass)`` with ``mass = sum_j (e_{n-1}^T R_T ... R_1)_j`` and
    ``p`` that row divided by `mass`. Every ``R_t`` is row-stochastic, so
    `mass` is 1 up to rounding; it is reported to make rounding visible.
    """
    n, method = _length(model, n), _resolve(method)
    # XLA aborts the process on a failed allocation: refuse first, in one line.
    memory.check_fits(memory.influence_bytes(n, model.num_heads, method, jnp.dtype(jnp.result_type(float)).itemsize),
                      f"influence: n = {n}", allowed="a shorter n")
    if isinstance(model, KernelRolloutModel):
        return _kernel_influence_with_mass(model, n, method)
    shared = _takes_shared_path(model, n, method)
    return _influence_with_mass(model, n, method, shared, not shared and _shares_slopes(model, method),
                                *_settles(model, n, method))


def influence(model: RolloutModel | KernelRolloutModel, n: int | None = None, method: str = "auto") -> Float[Array, " n"]:
    """The influence profile ``p_T(j) = P_T[n-1, j]``, shape ``(n,)``, summing to 1.

    Computed as ``p^T = e_{n-1}^T R_T ... R_1``: T vector-times-kernel
    products in one `lax.scan` from layer T down to layer 1, with
    ``R_t = (1 - lambda_t) I + lambda_t A_t``. `P_T` is never formed.

    Args:
        model: the rollout parameters.
        n: the sequence length (default ``model.sequence_length``).
        method: ``"dense"`` forms each ``(n, n)`` kernel (O(T H n^2));
            ``"structured"`` uses the O(T H n) products of
            `jaxroll.structured` (for a `KernelRolloutModel`: its kernel
            type's own ``row_times_kernel``, e.g. O(T H n log n) FFTs for
            relative-position kernels); ``"auto"`` picks the fast one.

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


def rollout_row(model: RolloutModel | KernelRolloutModel, row: Float[Array, " n"],
                method: str = "auto") -> Float[Array, " n"]:
    """``row^T R_T ... R_1`` for any row vector, not normalised; n is ``row``'s length.

    With ``row = e_{n-1}`` this is the unnormalised influence profile. Under a
    causal (or sliding) mask the first n rows of ``P_T`` at length ``N >= n``
    are ``P_T`` at length n, so ``e_{n-1}^T P_T`` at length N is the profile at
    length n padded with zeros: `jaxroll.sweep` runs every sequence length of
    a sweep as a vmap over start rows at one N. A `KernelRolloutModel` uses its
    kernel type's own ``row_times_kernel`` (`method` applies to a
    `RolloutModel`). Pure: jit, vmap and grad apply.
    """
    if isinstance(model, KernelRolloutModel):
        layers, row_times_kernel = (model.lambdas, model.kernel), lambda vector, layer: layer[1].row_times_kernel(vector)
    else:
        n, method = row.shape[-1], _resolve(method)
        # Concrete kernel arrays settle statically (`_settles`); traced ones keep a branch per product.
        settled, transient = _settles(model, n, method)
        row_times_kernel = _row_times_kernel(model, method, n, settled=bool(settled), transient=transient)
        layers = _layers(model)

    def apply_layer(vector, layer):
        weight = layer[0]
        return (1.0 - weight) * vector + weight * row_times_kernel(vector, layer), None

    result, _ = jax.lax.scan(apply_layer, row, layers, reverse=True)
    return result


# Any kernel type (KernelRolloutModel): the same scans, the kernel's own products.


@functools.partial(jax.jit, static_argnames=("n",))
def _kernel_rollout_matrix(model: KernelRolloutModel, n: int):
    def apply_layer(product, layer):
        weight, kernel = layer
        return (1.0 - weight) * product + weight * (kernel.dense(n) @ product), None

    identity = jnp.eye(n, dtype=jnp.result_type(float))
    product, _ = jax.lax.scan(apply_layer, identity, (model.lambdas, model.kernel))
    return product


@functools.partial(jax.jit, static_argnames=("n", "method"))
def _kernel_influence_with_mass(model: KernelRolloutModel, n: int, method: str):
    # Checkpointed so reverse mode keeps one row per layer, not the kernel's intermediates.
    @jax.checkpoint
    def apply_layer(row, layer):
        weight, kernel = layer
        product = row @ kernel.dense(n) if method == "dense" else kernel.row_times_kernel(row)
        return (1.0 - weight) * row + weight * product, None

    last = jnp.zeros(n, dtype=jnp.result_type(float)).at[n - 1].set(1.0)
    row, _ = jax.lax.scan(apply_layer, last, (model.lambdas, model.kernel), reverse=True)
    mass = jnp.sum(row)
    return row / mass, mass
