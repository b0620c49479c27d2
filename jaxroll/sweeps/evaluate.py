"""Evaluating a sweep's chunks: the Krylov path (one matmul per chunk) and the vmap path (a scan per point)."""

from __future__ import annotations

import builtins
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..interventions import apply_all, intervention_types
from ..model import RolloutModel
from ..rollout import rollout_row
from .axes import with_fields
from .plan import _groups, _mesh_context, _Plan
from .statistics import shape_statistics

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep

def _point_model(base, leaves: dict, n: int):
    """One point of a sweep: `base` (replicated) with the point's `leaves` put in (``lambdas`` and
    ``kernel.<field>`` for the kernel fields an axis varies), then the point's interventions
    (``intervention.tau``, ``intervention.kappa``: `Temperature`, then `DistanceBias`, in the order
    of `jaxroll.interventions.from_mapping`; a mixing axis such as gamma is applied to ``lambdas``
    by `Plan.chunk_leaves`), traced, so the vmap runs through them."""
    fields = {name.removeprefix("kernel."): value for name, value in leaves.items() if name.startswith("kernel.")}
    model = RolloutModel(lambdas=leaves["lambdas"], kernel=with_fields(base.kernel, fields),
                         sequence_length=n, composition=base.composition)
    changes = [kind.from_record({kind.name: leaves[f"intervention.{kind.name}"]}, "axis")
               for kind in intervention_types() if f"intervention.{kind.name}" in leaves]
    return apply_all(model, changes) if changes else model


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
def _vmapped_profiles(base, leaves: dict, groups, n_max: int, sharding):
    """``(S, L, n_max)``: every point's profile at every length, normalised, zero-padded.

    `leaves` carry the points' arrays on a leading batch axis, `base` is the
    shared (replicated) model (`_point_model`). `groups` is `_groups`' static
    ``((size, starts, positions), ...)``: length ``starts[l] + 1`` is the
    rollout from ``e_{starts[l]}`` at ``size``.
    """
    parts = []
    for size, starts, _ in groups:
        rows = _one_hot_rows(starts, size, leaves["lambdas"].dtype)

        def one_point(point, rows=rows):
            model = _point_model(base, point, size)
            # One start row at a time: a vmap over long rows falls out of cache.
            return jax.lax.map(lambda row: rollout_row(model, row), rows)

        parts.append(jax.vmap(one_point)(leaves))
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
            following = rollout_row(layer, vector)
            return following, following

        _, later = jax.lax.scan(step, row, None, length=depth)
        return jnp.concatenate([row[None], later])

    parts = [jax.lax.map(powers, _one_hot_rows(starts, size, layer.lambdas.dtype))
             for size, starts, _ in groups]
    return jnp.swapaxes(_assemble([jnp.swapaxes(p, 0, 1) for p in parts], groups, n_max), 0, 1)


def _coefficients(lambdas):
    """``c[s, k]`` of ``prod_t ((1 - lambda_t) + lambda_t x)``, ``(S, T) -> (S, T+1)``, traced (on the device).

    One multiplication by ``(1 - lambda_t) + lambda_t x`` per layer: a scan
    over T of ``c <- (1 - lambda_t) c + lambda_t shift(c)``, O(S T^2) work,
    each step a convex combination of non-negative numbers (no cancellation).
    """
    count, depth = lambdas.shape
    start = jnp.zeros((count, depth + 1), lambdas.dtype).at[:, 0].set(1.0)

    def step(coefficients, weight):
        shifted = jnp.pad(coefficients[:, :-1], ((0, 0), (1, 0)))
        return (1.0 - weight)[:, None] * coefficients + weight[:, None] * shifted, None

    return jax.lax.scan(step, start, lambdas.T)[0]


device_coefficients = jax.jit(_coefficients)
"""`polynomial_coefficients` under `jit`, on the device where `lambdas` live (the dtype of `lambdas`)."""


@functools.partial(jax.jit, static_argnames=("depth",))
def _power_decay(lambda_0, beta, depth: int):
    """``lambda_t = lambda_0 / (t + 1)^beta`` for t = 0..depth-1, ``(S,) x (S,) -> (S, depth)`` (as
    `jaxroll.schedules.power_decay`), traced, in the dtype of `lambda_0`."""
    return lambda_0[:, None] / (jnp.arange(depth, dtype=lambda_0.dtype) + 1.0) ** beta[:, None]


@functools.partial(jax.jit, static_argnames=("sharding",))
def _combine(lambdas, rows, sharding):
    """``(S, L, n)``: ``sum_k c[s, k] rows[l, k]``, normalised: one matmul per chunk, c computed here."""
    profiles = jnp.einsum("sk,lkn->sln", _coefficients(lambdas), rows)
    profiles = profiles / jnp.sum(profiles, axis=-1, keepdims=True)
    return jax.lax.with_sharding_constraint(profiles, sharding)


def polynomial_coefficients(lambdas) -> np.ndarray:
    """``c[s, k]``, the coefficients of ``prod_t ((1 - lambda_t) + lambda_t x)``, float64 NumPy.

    ``(S, T) -> (S, T+1)``; every ``c`` is non-negative and each row sums to
    1. With one kernel A in every layer, ``e^T R_T ... R_1 = sum_k c_k e^T A^k``.
    The same scan as `device_coefficients`, in float64 whatever the JAX default.
    """
    with jax.enable_x64(True):
        return np.asarray(device_coefficients(np.asarray(lambdas, np.float64)), dtype=np.float64)


def _global(host: np.ndarray, sharding: NamedSharding):
    """A global array from a host array every process holds in full."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _gather(array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(array)


class _Evaluator:
    """Evaluates chunks of a plan: profiles and their shape statistics, on the device; the Krylov rows once."""

    def __init__(self, plan: _Plan, fraction: float):
        self.plan = plan
        self.fraction = fraction
        self.dtype = jnp.result_type(float)
        self.batch = NamedSharding(plan.mesh, PartitionSpec(plan.mesh.axis_names))
        self.replicated = NamedSharding(plan.mesh, PartitionSpec())
        self.n_max = max(plan.lengths)
        self.groups = _groups(plan.lengths, plan.base.mask)
        if plan.method == "krylov":
            with _mesh_context(plan.mesh):
                self.rows = self._krylov_rows()
        else:
            self.base = jax.tree.map(lambda x: _global(np.asarray(x, self.dtype), self.replicated), plan.base)

    def _krylov_rows(self):
        base = self.plan.base
        layer = jax.tree.map(lambda x: np.asarray(x[:1], self.dtype) if np.ndim(x) else np.asarray(x, self.dtype),
                             base)
        layer = dataclasses.replace(layer, lambdas=np.ones(1, self.dtype), sequence_length=self.n_max)
        # Computed on this process' first device, then replicated over the mesh.
        with jax.default_device(jax.local_devices()[0]):
            rows = np.asarray(_krylov(layer, self.groups, self.n_max, base.num_layers))
        return _global(rows, self.replicated)

    def take(self, k: int) -> np.ndarray:
        """The points of chunk k; the last chunk repeats its last point to the full size (one compiled shape)."""
        size = self.plan.batch_size
        return np.minimum(np.arange(k * size, (k + 1) * size), self.plan.count - 1)

    def chunk(self, k: int):
        """Profiles of chunk k, ``(batch_size, L, N_max)``, a sharded array."""
        plan = self.plan
        take = self.take(k)
        if plan.method == "krylov" and plan.schedules_on_device:
            # The schedules are formed on the device: on the host they cost more than the whole chunk's
            # matmul (an S x T power in float64).
            decay = [_global(plan.columns[name][take].astype(self.dtype), self.batch) for name in ("lambda_0", "beta")]
            return _combine(_power_decay(*decay, depth=plan.base.num_layers), self.rows, self.batch)
        leaves = plan.chunk_leaves(take)
        if plan.method == "krylov":
            return _combine(_global(leaves["lambdas"].astype(self.dtype), self.batch), self.rows, self.batch)
        batched = {field: _global(value.astype(self.dtype), self.batch) for field, value in leaves.items()}
        return _vmapped_profiles(self.base, batched, self.groups, self.n_max, self.batch)

    def host_chunk(self, k: int) -> tuple:
        """Chunk k on the host: profiles ``(batch_size, L, N_max)``, their sharding, the statistics
        ``(batch_size, L)`` (computed on the device before the gather) and ``sum_t lambda_t``."""
        with _mesh_context(self.plan.mesh):
            profiles = self.chunk(k)
            values = shape_statistics(profiles, self.plan.lengths, self.fraction)
            statistics = {name: _gather(value) for name, value in values.items()}
        return _gather(profiles), profiles.sharding, statistics, self.plan.total_mixing(self.take(k))

    def loaded_chunk(self, k: int, profiles: np.ndarray) -> tuple:
        """`host_chunk` of a chunk read back from a checkpoint."""
        return profiles, self.batch, self.statistics(profiles), self.plan.total_mixing(self.take(k))

    def statistics(self, profiles) -> dict[str, np.ndarray]:
        """The shape statistics of a chunk's profiles (device or host array), ``(batch_size, L)`` each, on the host."""
        with _mesh_context(self.plan.mesh):
            if isinstance(profiles, np.ndarray):
                profiles = _global(profiles.astype(self.dtype), self.batch)
            values = shape_statistics(profiles, self.plan.lengths, self.fraction)
        return {name: _gather(value) for name, value in values.items()}
