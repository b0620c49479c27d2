"""Evaluating a sweep's chunks: the Krylov path (one matmul per chunk) and the vmap path (a scan per point)."""

from __future__ import annotations

import builtins
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..model import KernelRolloutModel, RolloutModel
from ..rollout import rollout_row
from .plan import _groups, _mesh_context, _Plan

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep

def _batched_model(base: RolloutModel, leaves: dict, n: int) -> RolloutModel:
    """A RolloutModel whose arrays carry a leading batch axis (vmap over it)."""
    return RolloutModel(**leaves, mask=base.mask, window=base.window, sequence_length=n)


def _point_model(base, leaves: dict, n: int):
    """One point of a kernel-model sweep: `base` (replicated) with the point's `leaves` put in."""
    fields = {name.removeprefix("kernel."): value for name, value in leaves.items() if name != "lambdas"}
    return KernelRolloutModel(lambdas=leaves["lambdas"], kernel=dataclasses.replace(base.kernel, **fields),
                              sequence_length=n)


def _row(model, row):
    """``row^T R_T ... R_1`` for either model type (`rollout_row` for a `RolloutModel`)."""
    if isinstance(model, RolloutModel):
        return rollout_row(model, row)

    def apply_layer(vector, layer):
        weight, kernel = layer
        return (1.0 - weight) * vector + weight * kernel.row_times_kernel(vector), None

    result, _ = jax.lax.scan(apply_layer, row, (model.lambdas, model.kernel), reverse=True)
    return result


def _one_hot_rows(starts, size: int, dtype):
    return jax.nn.one_hot(jnp.asarray(starts), size, dtype=dtype)


def _assemble(parts, groups, n_max: int):
    """Pad each group's ``(..., l, size)`` to ``n_max`` and put the lengths back in order."""
    order = [position for _, _, positions in groups for position in positions]
    # Row s of a causal rollout reads j <= s only: exact zeros beyond it, whatever
    # round-off a product left there (the FFT of a relative kernel leaves ~1e-17).
    parts = [jnp.where(np.arange(size)[None, :] <= np.asarray(starts)[:, None], part, 0.0)
             for part, (size, starts, _) in builtins.zip(parts, groups)]
    padded = [jnp.pad(part, [(0, 0)] * (part.ndim - 1) + [(0, n_max - size)])
              for part, (size, _, _) in builtins.zip(parts, groups)]
    inverse = np.argsort(order)
    return jnp.concatenate(padded, axis=-2)[..., inverse, :]


@functools.partial(jax.jit, static_argnames=("groups", "n_max", "sharding"))
def _vmapped_kernel_profiles(base, leaves: dict, groups, n_max: int, sharding):
    """`_vmapped_profiles` of a `KernelRolloutModel` sweep: `leaves` batched, `base` shared."""
    parts = []
    for size, starts, _ in groups:
        rows = _one_hot_rows(starts, size, leaves["lambdas"].dtype)

        def one_point(point, rows=rows):
            model = _point_model(base, point, size)
            return jax.lax.map(lambda row: _row(model, row), rows)

        parts.append(jax.vmap(one_point)(leaves))
    profiles = _assemble(parts, groups, n_max)
    profiles = profiles / jnp.sum(profiles, axis=-1, keepdims=True)
    return jax.lax.with_sharding_constraint(profiles, sharding)


@functools.partial(jax.jit, static_argnames=("groups", "n_max", "sharding"))
def _vmapped_profiles(batched: RolloutModel, groups, n_max: int, sharding):
    """``(S, L, n_max)``: every point's profile at every length, normalised, zero-padded.

    `groups` is `_groups`' static ``((size, starts, positions), ...)``: length
    ``starts[l] + 1`` is the rollout from ``e_{starts[l]}`` at ``size``.
    """
    parts = []
    for size, starts, _ in groups:
        rows = _one_hot_rows(starts, size, batched.lambdas.dtype)

        def one_point(model, rows=rows):
            # One start row at a time: a vmap over long rows falls out of cache.
            return jax.lax.map(lambda row: rollout_row(model, row), rows)

        parts.append(jax.vmap(one_point)(batched))
    profiles = _assemble(parts, groups, n_max)
    profiles = profiles / jnp.sum(profiles, axis=-1, keepdims=True)
    return jax.lax.with_sharding_constraint(profiles, sharding)


@functools.partial(jax.jit, static_argnames=("groups", "n_max", "depth"))
def _krylov(layer: RolloutModel, groups, n_max: int, depth: int):
    """``(L, depth+1, n_max)``: ``e_s^T A^k`` for k = 0..depth at every length (see `_groups`).

    `layer` is one layer with ``lambda = 1``, so one `rollout_row` of it is one
    structured product ``v^T A``.
    """

    def powers(row):
        def step(vector, _):
            following = _row(layer, vector)
            return following, following

        _, later = jax.lax.scan(step, row, None, length=depth)
        return jnp.concatenate([row[None], later])

    parts = [jax.lax.map(powers, _one_hot_rows(starts, size, layer.lambdas.dtype))
             for size, starts, _ in groups]
    return jnp.swapaxes(_assemble([jnp.swapaxes(p, 0, 1) for p in parts], groups, n_max), 0, 1)


@functools.partial(jax.jit, static_argnames=("sharding",))
def _combine(coefficients, rows, sharding):
    """``(S, L, n)``: ``sum_k c[s, k] rows[l, k]``, normalised: one matmul per chunk."""
    profiles = jnp.einsum("sk,lkn->sln", coefficients, rows)
    profiles = profiles / jnp.sum(profiles, axis=-1, keepdims=True)
    return jax.lax.with_sharding_constraint(profiles, sharding)


def polynomial_coefficients(lambdas) -> np.ndarray:
    """``c[s, k]``, the coefficients of ``prod_t ((1 - lambda_t) + lambda_t x)``, float64.

    ``(S, T) -> (S, T+1)``; every ``c`` is non-negative and each row sums to
    1. With one kernel A in every layer, ``e^T R_T ... R_1 = sum_k c_k e^T A^k``.
    """
    lambdas = np.asarray(lambdas, np.float64)
    count, depth = lambdas.shape
    coefficients = np.zeros((count, depth + 1))
    coefficients[:, 0] = 1.0
    for t in range(depth):  # host NumPy, O(S T^2): no compilation, exact float64
        weight = lambdas[:, t : t + 1]
        shifted = np.concatenate([np.zeros((count, 1)), coefficients[:, :-1]], axis=1)
        coefficients = (1.0 - weight) * coefficients + weight * shifted
    return coefficients


def _global(host: np.ndarray, sharding: NamedSharding):
    """A global array from a host array every process holds in full."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _gather(array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(array)


class _Evaluator:
    """Evaluates chunks of a plan; the Krylov rows are computed once."""

    def __init__(self, plan: _Plan):
        self.plan = plan
        self.dtype = jnp.result_type(float)
        self.batch = NamedSharding(plan.mesh, PartitionSpec(plan.mesh.axis_names))
        self.replicated = NamedSharding(plan.mesh, PartitionSpec())
        self.n_max = max(plan.lengths)
        self.groups = _groups(plan.lengths, plan.base.mask)
        if plan.method == "krylov":
            with _mesh_context(plan.mesh):
                self.rows = self._krylov_rows()
            self.coefficients = polynomial_coefficients(plan.leaves["lambdas"])

    def _krylov_rows(self):
        base = self.plan.base
        layer = jax.tree.map(lambda x: np.asarray(x[:1], self.dtype) if np.ndim(x) else np.asarray(x, self.dtype),
                             base)
        layer = dataclasses.replace(layer, lambdas=np.ones(1, self.dtype), sequence_length=self.n_max)
        # Computed on this process' first device, then replicated over the mesh.
        with jax.default_device(jax.local_devices()[0]):
            rows = np.asarray(_krylov(layer, self.groups, self.n_max, base.num_layers))
        return _global(rows, self.replicated)

    def chunk(self, k: int):
        """Profiles of chunk k, ``(batch_size, L, N_max)``, a sharded array."""
        plan = self.plan
        count = next(iter(plan.leaves.values())).shape[0]
        size = plan.batch_size
        # The last chunk repeats its last point to the full size: one compiled shape.
        take = np.minimum(np.arange(k * size, (k + 1) * size), count - 1)
        if plan.method == "krylov":
            coefficients = _global(self.coefficients[take].astype(self.dtype), self.batch)
            return _combine(coefficients, self.rows, self.batch)
        leaves = {field: _global(value[take].astype(self.dtype), self.batch)
                  for field, value in plan.leaves.items()}
        if isinstance(plan.base, KernelRolloutModel):
            base = jax.tree.map(lambda x: _global(np.asarray(x, self.dtype), self.replicated), plan.base)
            return _vmapped_kernel_profiles(base, leaves, self.groups, self.n_max, self.batch)
        batched = _batched_model(plan.base, leaves, self.n_max)
        return _vmapped_profiles(batched, self.groups, self.n_max, self.batch)

    def host_chunk(self, k: int) -> tuple[np.ndarray, NamedSharding]:
        """Chunk k gathered to the host: ``(batch_size, L, N_max)``, and its sharding."""
        with _mesh_context(self.plan.mesh):
            profiles = self.chunk(k)
        return _gather(profiles), profiles.sharding
