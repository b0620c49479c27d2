"""Transitions, the rollout matrix and the influence profile: scans over layers.

Layer t's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t``; the rollout
is ``P_T = R_T ... R_1`` (layer 1 acts first) and the influence profile is its
last row, ``p_T(j) = P_T[N-1, j]``: how much input position j contributes to
the last position after T layers (arXiv 2602.16837; the ``lambda = 1`` case is
the attention rollout of Abnar & Zuidema 2020).

A model with a composition exponent q (`RolloutModel.composition`) composes
path magnitudes instead: ``p(j) ∝ (e_{N-1}^T |R_T|^{∘q} ... |R_1|^{∘q})_j^{1/q}``,
each transition raised elementwise to q and the row to 1/q at the end; q = 1
is the product above. It takes the dense path (the powered transitions are
no structured kernel).

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

__all__ = ["METHODS", "attention_kernel", "transition", "influence", "model_method",
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
    return _layer_transition(model.kernel.layer(layer), model.lambdas[layer], n)


def _layer_transition(kernel, weight, n: int):
    """One layer's dense ``R_t``, ``(n, n)``, as the kernel steps it (its own `step`, lambda per layer or row)."""
    dense = kernel.dense(n)  # A @ I = A: the product on the identity is the kernel itself
    return kernel.step(jnp.eye(n, dtype=dense.dtype), weight, lambda *_: dense, left=True)


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


def _magnitude_power(x, q):
    """``|x|^q`` elementwise, 0 where x = 0 with a finite gradient there (masked entries stay masked under grad)."""
    magnitude = jnp.abs(x)
    positive = magnitude > 0
    return jnp.where(positive, jnp.exp(q * jnp.log(jnp.where(positive, magnitude, 1.0))), 0.0)


def _powered_transitions(model: RolloutModel, n: int):
    """``(stacked, layer_power)``: the per-layer leaves a scan slices, and `layer_power(part, weight)`, that
    layer's ``|R_t|^{∘q}`` dense, ``(n, n)``."""
    stacked, shared = model.kernel.scan_parts(Path(method="dense"))

    def layer_power(part, weight):
        return _magnitude_power(_layer_transition(eqx.combine(part, shared), weight, n), model.composition)

    return stacked, layer_power


def _composed_row(model: RolloutModel, row):
    """``(|row|^{∘q} |R_T|^{∘q} ... |R_1|^{∘q})^{∘1/q}`` with ``q = model.composition``: one dense scan."""
    stacked, layer_power = _powered_transitions(model, row.shape[-1])

    @jax.checkpoint  # reverse mode keeps one row per layer, not its (n, n) power
    def apply_layer(vector, layer):
        weight, part = layer
        return vector @ layer_power(part, weight), None

    powered = jax.lax.scan(apply_layer, _magnitude_power(row, model.composition), (model.lambdas, stacked),
                           reverse=True)[0]
    return _magnitude_power(powered, 1.0 / model.composition)


def _rollout_row(model: RolloutModel, row, path: Path):
    """``row^T R_T ... R_1`` along `path`: the shared kernel, one run-time switch, or the plain scan (a model
    with a composition exponent: its dense powered scan, whatever the path)."""
    if model.composition is not None:
        return _composed_row(model, row)
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


def model_method(model: RolloutModel, method: str) -> str:
    """`method` resolved for `model`: ``"dense"`` for a model with a composition exponent (refusing
    ``"structured"`` in one line), else `resolve_method`'s."""
    if model.composition is None:
        return resolve_method(method)
    if resolve_method(method) == "structured" and method != "auto":
        raise ConfigError.of("method", method, "'dense' or 'auto' for a model with a composition exponent q "
                             "(its powered transitions |R_t|^q are dense)")
    return "dense"


def influence_with_mass(
    model: RolloutModel, n: int | None = None, method: str = "auto"
) -> tuple[Float[Array, " n"], Float[Array, ""]]:
    """The influence profile and its mass before normalisation.

    Returns ``(p, mass)`` with ``mass = sum_j (e_{n-1}^T R_T ... R_1)_j`` and
    ``p`` that row divided by `mass`. Every ``R_t`` is row-stochastic, so
    `mass` is 1 up to rounding; it is reported to make rounding visible. With
    a composition exponent q the row is ``(e_{n-1}^T |R_T|^{∘q} ... |R_1|^{∘q})^{1/q}``,
    whose mass is not 1: ``p`` is still normalised to sum 1.
    """
    n, method = check_length(model, n), model_method(model, method)
    # XLA aborts the process on a failed allocation: refuse first, in one line.
    memory.check_fits(memory.model_influence_bytes(model, n, method, jnp.dtype(jnp.result_type(float)).itemsize),
                      f"influence: n = {n}", allowed="a shorter n" if model.composition is None else
                      "a shorter n, or the model without its composition exponent (q = 1, linear in memory)")
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
    path = plan(model, row.shape[-1], model_method(model, method))
    if path.settled is None:
        path = dataclasses.replace(path, settled=False, rungs=())
    return _rollout_row(model, row, path)


@functools.partial(jax.jit, static_argnames=("n",))
def _rollout_matrix(model: RolloutModel, n: int) -> Float[Array, "n n"]:
    identity = jnp.eye(n, dtype=jnp.result_type(float))
    if model.composition is not None:
        stacked, layer_power = _powered_transitions(model, n)
        powered = jax.lax.scan(lambda product, layer: (layer_power(layer[1], layer[0]) @ product, None), identity,
                               (model.lambdas, stacked))[0]
        return _magnitude_power(powered, 1.0 / model.composition)
    return _scan_layers(model, identity, Path(method="dense"), lambda product, kernel: kernel.dense(n) @ product,
                        reverse=False)


def rollout_matrix(model: RolloutModel, n: int | None = None) -> Float[Array, "n n"]:
    """The full rollout ``P_T = R_T ... R_1``, shape ``(n, n)`` (with a composition exponent q,
    ``(|R_T|^{∘q} ... |R_1|^{∘q})^{∘1/q}``, whose rows need not sum to 1).

    Under causal masking ``P_T`` is lower triangular and row-stochastic, and
    its top-left ``m x m`` block is the rollout at length m. Costs O(T n^3);
    use `influence` when the last row is all you need.
    """
    return _rollout_matrix(model, check_length(model, n))

