"""Parameter sweeps: many rollouts in one compiled, vmapped, sharded call.

Every point of a sweep is a `RolloutModel` that differs from a base model in a
few fields; its influence profile is ``p^T = e_{n-1}^T R_T ... R_1`` with
``R_t = (1 - lambda_t) I + lambda_t A_t`` (arXiv 2602.16837). The points'
arrays are stacked along a leading batch axis and evaluated under one
``jit(vmap(...))``, in chunks sized to a memory budget, the batch axis sharded
over a `jax.sharding.Mesh` with `NamedSharding`.

Two evaluation paths, chosen automatically:

- ``"krylov"``: when only the lambdas vary and every layer of the base model
  has the same kernel A, the ``R_t`` commute and
  ``p^T = sum_k c_k(lambda) e^T A^k`` with ``c_k`` the coefficients of
  ``prod_t ((1 - lambda_t) + lambda_t x)``. The T + 1 Krylov rows
  ``e^T A^k`` cost T structured products once; a chunk of S schedules is one
  ``(S, T+1) x (T+1, N)`` matmul. The ``c_k`` are non-negative and sum to 1
  (no cancellation); they are computed in float64 on the host.
- ``"vmap"``: anything else; each point runs its own ``lax.scan`` over layers.

Sequence lengths: under a causal or sliding mask the first n rows of ``P_T``
at length ``b >= n`` are ``P_T`` at length n (row i reads only j <= i, and its
softmax normaliser depends on i alone), so the profile at length n is the
rollout started from ``e_{n-1}`` at any ``b >= n``, zero beyond position
n - 1. All lengths are one compiled call: start rows (under `lax.map`) within
power-of-two buckets ``b``, so each length costs at most 2n positions rather
than ``N_max`` (see `_groups`). New values at the same lengths never
recompile; a new set of lengths compiles once. Under the full mask row i reads
every j < N, so P at ``b`` says nothing about length n: each distinct length
is its own body (at b = n) of the same compiled call.

Multi-host: call ``jax.distributed.initialize`` in every process first; the
default mesh spans every device of every process, each process feeds its own
shards (all processes build the same points from the same arguments), and the
profiles are gathered to every process (write files from process 0 only).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import hashlib
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from . import memory, metrics, schedules
from ._checks import check_positive_int, is_concrete
from .errors import ConfigError
from .model import KernelRolloutModel, RolloutModel
from .rollout import rollout_row

__all__ = ["AXES", "KERNEL_AXES", "STATISTICS", "MEMORY_BUDGET", "VMAP_WORKING_SET", "SweepResult", "sweep", "make_mesh",
           "polynomial_coefficients"]

AXES = ("lambdas", "lambda_0", "beta", "alibi_slopes", "slope_scale", "diagonal_scores",
        "head_weights", "temperature", "slopes", "exponents")
"""The fields a sweep axis may name. ``lambdas``: schedules (a number for a
constant, T numbers, or a ``(lambda_0, beta)`` tuple / ``{"lambda_0", "beta"}``
mapping for power decay); ``lambda_0`` and ``beta`` (together): a power-decay
grid; ``slope_scale``: a factor on the ALiBi slopes; the others: any value
`RolloutModel.create` takes for that field.

A `KernelRolloutModel` sweeps the lambda axes over any kernel (a schedule
over measured `DenseKernel`s, say) and, for a `PowerKernel`, ``slopes``,
``exponents``, ``slope_scale`` (on ``slopes``), ``diagonal_scores`` and
``head_weights``; for a `TableKernel`, ``diagonal_scores`` and
``head_weights`` (see `KERNEL_AXES`)."""

KERNEL_AXES = {"PowerKernel": ("slopes", "exponents", "slope_scale", "diagonal_scores", "head_weights"),
               "TableKernel": ("diagonal_scores", "head_weights"),
               "DenseKernel": (), "AlibiKernel": ()}
"""The kernel fields a `KernelRolloutModel` sweep may vary, by kernel type (besides the lambda axes)."""

STATISTICS = metrics.Shape._fields
"""The shape statistics of every point in `SweepResult.table` (`jaxroll.metrics.Shape`)."""

MEMORY_BUDGET = 2**30
"""Bytes of intermediate arrays one chunk may hold (an estimate), when ``batch_size`` is None."""

VMAP_WORKING_SET = 4 * 2**20
"""Bytes of intermediates per chunk on the vmap path, when ``batch_size`` is None. Each
profile there is compute-bound and larger chunks fall out of cache: on the 2-core
CPU, MPT-7B geometry at N = 2048, 4 points per call ran 1.9x a loop of `influence`
and 32 points 0.9x. On an accelerator pass a larger ``batch_size``."""

_LAMBDA_AXES = {"lambdas", "lambda_0", "beta"}
_SCALAR_AXES = {  # axis -> (lower bound, open at the bound)
    "lambda_0": (0.0, True), "beta": (0.0, False), "slope_scale": (0.0, False),
    "temperature": (0.0, True)}
_BATCH = "batch"


class SweepResult(NamedTuple):
    """What `sweep` returns.

    Attributes:
        profiles: ``(*axes, N)`` (cartesian), ``(K, N)`` (zipped), with a
            lengths axis before N when `lengths` was given: ``(..., L, N_max)``,
            the profile at length n in ``[..., :n]`` and zeros beyond.
        table: one row per point (and length), as columns: ``<axis>_index``,
            the value of scalar axes, ``lambda_0``/``beta`` for power-decay
            schedules, ``total_mixing`` (``sum_t lambda_t``), ``length`` and
            the `STATISTICS`; ``pandas.DataFrame(result.table)`` loads it.
        axes: the axis values as given, by name, in order.
        lengths: the lengths swept, or None.
        method: ``"krylov"`` or ``"vmap"`` (see the module docstring).
        sharding: the `NamedSharding` of the computed chunks' batch axis.
        batch_size: points per compiled call.
    """

    profiles: np.ndarray
    table: dict[str, np.ndarray]
    axes: dict[str, list]
    lengths: tuple[int, ...] | None
    method: str
    sharding: NamedSharding
    batch_size: int

    def to_pandas(self):
        """`table` as a `pandas.DataFrame` (needs pandas)."""
        import pandas

        return pandas.DataFrame(self.table)


# ---------------------------------------------------------------- checking


def _axis_values(name: str, values) -> list:
    if name not in AXES:
        raise ConfigError(f"axis {name!r}: unknown field; allowed: one of {', '.join(AXES)}")
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise ConfigError(f"{name}: got {type(values).__name__}; allowed: a non-empty list of values")
    values = list(values)
    if not values:
        raise ConfigError(f"{name}: the axis is empty; allowed: a non-empty list of values")
    return values


def _reword(axis: str, index: int, error: ConfigError) -> ConfigError:
    """``field: rest`` of a constructor's message as ``axis[index]: rest``."""
    field, _, rest = str(error).partition(": ")
    text = rest if field in (axis, "lambdas", "lambdas_custom", "lambda_const") else str(error)
    return ConfigError(f"{axis}[{index}]: {text}")


def _scalar(axis: str, index: int, value) -> float:
    low, low_open = _SCALAR_AXES[axis]
    if isinstance(value, (bool, np.bool_, str, bytes)):  # float() would take True and "0.2"
        raise ConfigError(f"{axis}[{index}]: got {value!r:.60}; allowed: a number (not a boolean or a string)")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{axis}[{index}]: got {value!r:.60}; allowed: a number") from None
    if not np.isfinite(number) or number < low or (low_open and number == low):
        bound = f"({low:g}, inf)" if low_open else f"[{low:g}, inf)"
        raise ConfigError(f"{axis}[{index}]: value {number!r} is outside the allowed range {bound}")
    return number


def _base_fields(model: RolloutModel) -> dict[str, Any]:
    return {"num_layers": model.num_layers, "num_heads": model.num_heads,
            "lambdas": np.asarray(model.lambdas, np.float64),
            "alibi_slopes": np.asarray(model.alibi_slopes, np.float64),
            "diagonal_scores": np.asarray(model.diagonal_scores, np.float64),
            "base_scores": np.asarray(model.base_scores, np.float64),
            "head_weights": np.asarray(model.head_weights, np.float64),
            "temperature": float(model.temperature), "mask": model.mask, "window": model.window,
            "sequence_length": model.sequence_length}


def _schedule(model: RolloutModel, value) -> np.ndarray:
    """One value of a ``lambdas`` axis as ``(T,)`` lambdas."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"lambda_0", "beta"})
        if unknown or len(value) != 2:
            raise ConfigError(f"got keys {sorted(value)}; allowed: a mapping with lambda_0 and beta")
        value = (value["lambda_0"], value["beta"])
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ConfigError(f"got a tuple of {len(value)}; allowed: (lambda_0, beta)")
        return schedules.power_decay(value[0], value[1], model.num_layers)
    if np.ndim(value) == 0:
        return schedules.constant(value, model.num_layers)
    return np.asarray(value)


def _kernel_fields(kernel) -> dict[str, np.ndarray]:
    """A kernel's array fields (the PyTree leaves), as float64 NumPy."""
    return {field.name: np.asarray(getattr(kernel, field.name), np.float64) for field in dataclasses.fields(kernel)
            if not field.metadata.get("static", False)}


def _checked_kernel_axis(model: KernelRolloutModel, name: str, values: list) -> np.ndarray:
    """A kernel axis' values, each checked by the kernel type's own `create`."""
    kernel = model.kernel
    allowed = KERNEL_AXES.get(type(kernel).__name__, ())
    if name not in allowed and name not in _LAMBDA_AXES:
        raise ConfigError(f"axis {name!r}: not a field of a {type(kernel).__name__} model; allowed: "
                          + ", ".join(("lambdas", "lambda_0", "beta") + allowed))
    if name in _SCALAR_AXES:
        return np.array([_scalar(name, k, value) for k, value in enumerate(values)])
    if name == "lambdas":
        stacked = []
        for k, value in enumerate(values):
            try:
                if not is_concrete(value):
                    raise ConfigError(f"got {type(value).__name__}; allowed: concrete numbers")
                stacked.append(np.asarray(KernelRolloutModel.create(
                    kernel=kernel, lambdas=_schedule(model, value),
                    sequence_length=model.sequence_length).lambdas, np.float64))
            except ConfigError as error:
                raise _reword(name, k, error) from None
        return np.stack(stacked)
    base = _kernel_fields(kernel)
    stacked = []
    for k, value in enumerate(values):
        try:
            if not is_concrete(value):
                raise ConfigError(f"got {type(value).__name__}; allowed: concrete numbers")
            checked = type(kernel).create(num_layers=kernel.num_layers, num_heads=kernel.num_heads,
                                          **{**base, name: value})
        except ConfigError as error:
            raise _reword(name, k, error) from None
        stacked.append(np.asarray(getattr(checked, name), np.float64))
    return np.stack(stacked)


def _checked_axis(model: RolloutModel, name: str, values: list) -> np.ndarray:
    """The axis' values as stacked arrays, each checked as `RolloutModel.create` checks it."""
    if isinstance(model, KernelRolloutModel):
        return _checked_kernel_axis(model, name, values)
    if name in ("slopes", "exponents"):
        raise ConfigError(f"axis {name!r}: a PowerKernel field; allowed for a RolloutModel: "
                          + ", ".join(a for a in AXES if a not in ("slopes", "exponents")))
    if name in _SCALAR_AXES:
        return np.array([_scalar(name, k, value) for k, value in enumerate(values)])
    base = _base_fields(model)
    field = name
    stacked = []
    for k, value in enumerate(values):
        try:
            if not is_concrete(value):
                raise ConfigError(f"got {type(value).__name__}; allowed: concrete numbers")
            if name == "lambdas":
                value = _schedule(model, value)
            checked = RolloutModel.create(**{**base, field: value})
        except ConfigError as error:
            raise _reword(name, k, error) from None
        stacked.append(np.asarray(getattr(checked, field), np.float64))
    return np.stack(stacked)


def make_mesh(mesh=None) -> Mesh:
    """The mesh of a sweep, its axes `Auto`: the batch axis is sharded over all of them.

    `mesh` is None (the mesh set with `jax.set_mesh` / `jax.sharding.use_mesh`
    when there is one, else every device of every process), an int k (the
    first k devices), or a `jax.sharding.Mesh` built any way, e.g.
    ``jax.make_mesh((4,), ("batch",))``, whose axes are `Explicit` on current
    JAX. A sweep needs only the mesh's devices and axis names: it returns a
    mesh of the same devices and names with every axis type `Auto`, so
    sharding constraints inside its compiled calls are legal whatever types
    the user's mesh has (a profile's layout is not part of its value).
    """
    if mesh is None:
        ambient = _ambient_mesh()
        if ambient is not None:
            return _auto(ambient)
    if isinstance(mesh, Mesh):
        return _auto(mesh)
    if isinstance(mesh, jax.sharding.AbstractMesh):
        raise ConfigError("mesh: got an AbstractMesh; allowed: a jax.sharding.Mesh (with devices), "
                          "a device count or None")
    devices = jax.devices()
    if mesh is None:
        return Mesh(np.array(devices), (_BATCH,), axis_types=(AxisType.Auto,))
    if isinstance(mesh, bool) or not isinstance(mesh, (int, np.integer)) or not 1 <= mesh <= len(devices):
        raise ConfigError(f"mesh: got {mesh!r}; allowed: 1 to {len(devices)} devices (the devices JAX sees) "
                          "or a jax.sharding.Mesh")
    return Mesh(np.array(devices[: int(mesh)]), (_BATCH,), axis_types=(AxisType.Auto,))


def _auto(mesh: Mesh) -> Mesh:
    """`mesh`'s devices and axis names, every axis `Auto`."""
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _mesh_context(mesh: Mesh):
    """Compute under the sweep's own (Auto) mesh, whatever mesh the caller has set:
    an ambient Explicit mesh (``jax.set_mesh``) would otherwise have to match
    every array's mesh."""
    setter = getattr(jax, "set_mesh", None)
    return setter(mesh) if setter is not None else contextlib.nullcontext()


def _ambient_mesh() -> Mesh | None:
    """The concrete mesh set by `jax.set_mesh` / `use_mesh`, or None."""
    getter = getattr(jax.sharding, "get_mesh", None)
    try:
        ambient = getter() if getter is not None else None
    except Exception:  # no mesh set (older JAX raise, newer return an empty mesh)
        return None
    if isinstance(ambient, Mesh) and not ambient.empty and ambient.devices.size:
        return ambient
    return None


def _check_lengths(lengths) -> tuple[int, ...] | None:
    if lengths is None:
        return None
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__len__") or not len(lengths):
        raise ConfigError(f"lengths: got {lengths!r:.60}; allowed: a non-empty list of integers >= 1")
    return tuple(check_positive_int(f"lengths[{k}]", n) for k, n in enumerate(lengths))


# ---------------------------------------------------------------- planning


class _Plan(NamedTuple):
    """Everything a sweep computes, decided (and checked) before any compilation."""

    base: RolloutModel
    shape: tuple[int, ...]          # the points' grid, (*axes) or (K,)
    leaves: dict[str, np.ndarray]   # batched model arrays, (S, ...)
    columns: dict[str, np.ndarray]  # per-point table columns, (S,)
    lengths: tuple[int, ...]        # lengths evaluated (at least one)
    method: str
    batch_size: int
    mesh: Mesh


def _points(sizes: list[int], names: list[str], zipped: bool) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """The grid's shape and each axis' value index at every point (C order)."""
    if not sizes:
        return (), []
    if zipped:
        if len(set(sizes)) > 1:
            detail = ", ".join(f"{n} {s}" for n, s in builtins.zip(names, sizes))
            raise ConfigError(f"zip: axes have lengths {detail}; allowed: all the same length")
        return (sizes[0],), [np.arange(sizes[0])] * len(sizes)
    grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
    return tuple(sizes), [grid.ravel() for grid in grids]


def _equal_layers(model: RolloutModel) -> bool:
    """True when every layer has the same kernel (slopes, content, weights)."""
    if isinstance(model, KernelRolloutModel):
        arrays = tuple(_kernel_fields(model.kernel).values())
    else:
        arrays = (model.alibi_slopes, model.diagonal_scores, model.base_scores, model.head_weights)
    return all(np.all(np.asarray(x) == np.asarray(x)[:1]) for x in arrays)


def _per_point_bytes(method: str, base: RolloutModel, lengths, n: int) -> int:
    itemsize = jnp.dtype(jnp.result_type(float)).itemsize
    rows = len(lengths) * n * itemsize
    if method == "krylov":
        return 3 * rows  # the product, its normalised copy, and the gathered copy on the host
    if isinstance(base, KernelRolloutModel):
        # Each start row runs the kernel's own product: the FFT path for relative kernels.
        per_row = memory.model_influence_bytes(base, n, "auto", itemsize)
        if type(base.kernel).__name__ == "DenseKernel":  # the shared (T, N, N) array is not per point
            per_row = 3 * n * itemsize
        return len(lengths) * per_row + rows
    # A vmapped layer step holds a few (head chunk, n) arrays per row (see jaxroll.structured).
    return rows * (6 * min(base.num_heads, 16) + 4)


def _plan(model, axes: dict, lengths, zipped: bool, batch_size, mesh) -> _Plan:
    if not isinstance(model, (RolloutModel, KernelRolloutModel)):
        raise ConfigError(f"model: got {type(model).__name__}; allowed: a jaxroll.RolloutModel or "
                          "jaxroll.KernelRolloutModel")
    names = list(axes)
    values = {name: _axis_values(name, axes[name]) for name in names}
    if "lambdas" in values and values.keys() & {"lambda_0", "beta"}:
        raise ConfigError("lambdas: give a lambdas axis or lambda_0 and beta axes, not both")
    for one, other in (("lambda_0", "beta"), ("beta", "lambda_0")):
        if one in values and other not in values:
            raise ConfigError(f"{other}: the {one} axis needs a {other} axis (a power-decay grid); "
                              "give a one-value list to hold it fixed")
    checked = {name: _checked_axis(model, name, values[name]) for name in names}
    lengths = _check_lengths(lengths)
    if isinstance(model, KernelRolloutModel):
        for n in lengths or (model.sequence_length,):
            try:
                model.kernel.check_length(n)
            except ConfigError as error:
                raise ConfigError(f"lengths: {n}: {str(error).partition(': ')[2]}") from None
    mesh = make_mesh(mesh)
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)

    shape, indices = _points([len(values[n]) for n in names], names, zipped)
    count = int(np.prod(shape)) if shape else 1
    index = dict(builtins.zip(names, indices)) if names else {}
    if isinstance(model, KernelRolloutModel):
        # Only what varies is batched: a measured kernel (T, N, N) is not copied per point.
        varied = {name for name in names if name not in _LAMBDA_AXES}
        varied |= {"slopes"} if "slope_scale" in names else set()
        base_leaves = {"lambdas": np.asarray(model.lambdas, np.float64)}
        base_leaves |= {f"kernel.{field}": value for field, value in _kernel_fields(model.kernel).items()
                        if field in varied}
    else:
        base_leaves = {field: value for field, value in _base_fields(model).items()
                       if field in ("lambdas", "alibi_slopes", "diagonal_scores", "base_scores",
                                    "head_weights", "temperature")}
    leaves = {field: np.broadcast_to(value, (count,) + np.shape(value)).copy()
              for field, value in base_leaves.items()}
    columns = {f"{name}_index": index[name] for name in names}
    for name in names:
        picked = checked[name][index[name]]
        if isinstance(model, KernelRolloutModel):
            if name in ("slopes", "exponents", "diagonal_scores", "head_weights"):
                leaves[f"kernel.{name}"] = picked
            elif name == "lambdas":
                leaves[name] = picked
        elif name in ("lambdas", "alibi_slopes", "diagonal_scores", "head_weights", "temperature"):
            leaves[name] = picked
        if name in _SCALAR_AXES:
            columns[name] = picked
        elif all(np.ndim(v) == 0 for v in values[name]):
            columns[name] = np.asarray(values[name], np.float64)[index[name]]
        elif name == "lambdas" and all(isinstance(v, (tuple, dict)) for v in values[name]):
            pairs = np.asarray([(v["lambda_0"], v["beta"]) if isinstance(v, dict) else v
                                for v in values[name]], np.float64)
            columns["lambda_0"], columns["beta"] = pairs[index[name], 0], pairs[index[name], 1]
    if "lambda_0" in names:
        # The same float64 formula as schedules.power_decay, for every point at once.
        layers = np.arange(model.num_layers, dtype=np.float64)
        lambda_0, beta = columns["lambda_0"][:, None], columns["beta"][:, None]
        leaves["lambdas"] = np.clip(lambda_0 / (layers + 1.0) ** beta, 0.0, 1.0)
    if "slope_scale" in names:
        slopes = "kernel.slopes" if isinstance(model, KernelRolloutModel) else "alibi_slopes"
        leaves[slopes] = leaves[slopes] * columns["slope_scale"][:, None, None]
    columns["total_mixing"] = leaves["lambdas"].sum(axis=1)

    # One point gains nothing from T + 1 Krylov rows over its own T products.
    method = "krylov" if count > 1 and set(names) <= _LAMBDA_AXES and _equal_layers(model) else "vmap"
    evaluated = lengths if lengths is not None else (model.sequence_length,)
    devices = mesh.devices.size
    if batch_size is None:
        per_point = _per_point_bytes(method, model, evaluated, max(evaluated))
        budget = MEMORY_BUDGET if method == "krylov" else VMAP_WORKING_SET
        batch_size = max(1, budget // per_point)
    # The gathered profiles live on the host (and a float64 copy per length for the table).
    itemsize = jnp.dtype(jnp.result_type(float)).itemsize
    needed = count * len(evaluated) * max(evaluated) * (2 * itemsize + 8)
    memory.check_fits(needed, f"sweep: {count} points x {len(evaluated)} lengths x N = {max(evaluated)}",
                      allowed="fewer points or shorter lengths")
    # Whole multiples of the mesh, and never (much) more than the sweep needs.
    batch_size = min(batch_size, -(-count // devices) * devices)
    batch_size = max(devices, batch_size // devices * devices)
    return _Plan(model, shape, leaves, columns, evaluated, method, batch_size, mesh)


# ---------------------------------------------------------------- compiled work


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


def _groups(lengths: tuple[int, ...], mask: str) -> tuple:
    """The static plan of one compiled call: ``((size, starts, positions), ...)``.

    Causal and sliding masks: the first n rows of ``P_T`` at length ``b >= n``
    are ``P_T`` at length n, so length n is the rollout from ``e_{n-1}`` at
    any ``b >= n``. Lengths share start rows within power-of-two buckets
    ``b = min(N_max, 2^ceil(log2 n))``: at most ``log2(N_max) + 1`` bodies in
    the one compiled program, and every length costs at most 2n positions
    (a vmap over start rows at ``N_max`` alone would cost L * N_max: measured
    9.7x a single call for 2^8..2^16, against 2.0x with buckets). Full mask:
    row i reads every j < N, so each distinct length is its own body at b = n.
    """
    n_max = max(lengths)
    buckets: dict[int, list[int]] = {}
    for position, n in enumerate(lengths):
        size = n if mask == "full" else min(n_max, 1 << (n - 1).bit_length())
        buckets.setdefault(size, []).append(position)
    return tuple((size, tuple(lengths[p] - 1 for p in positions), tuple(positions))
                 for size, positions in sorted(buckets.items()))


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


# ---------------------------------------------------------------- checkpoints


def _fingerprint(plan: _Plan) -> str:
    digest = hashlib.sha256()
    for field in sorted(plan.leaves):
        digest.update(field.encode())
        digest.update(np.ascontiguousarray(plan.leaves[field]).tobytes())
    if isinstance(plan.base, KernelRolloutModel):  # the fixed kernel arrays are not in the leaves
        for leaf in jax.tree.leaves(plan.base.kernel):
            digest.update(np.ascontiguousarray(np.asarray(leaf, np.float64)).tobytes())
    digest.update(repr((plan.lengths, plan.method, plan.batch_size, plan.base.mask, getattr(plan.base, "window", None),
                        str(jnp.result_type(float)))).encode())
    return digest.hexdigest()


def _atomic_save(path: Path, array: np.ndarray) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        np.save(handle, array)
    os.replace(temporary, path)


def _load_chunk(path: Path, k: int) -> np.ndarray:
    """A finished chunk; a one-line error for a file that is not one (chunks are written atomically)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise ConfigError(f"checkpoint {path}: chunk {k} is not a readable .npy ({type(error).__name__}); "
                          "allowed: the chunks this sweep wrote (delete the file to recompute it)") from None


def _open_checkpoint(directory, plan: _Plan) -> Path:
    directory = Path(directory)
    fingerprint = _fingerprint(plan)
    stamp = directory / "fingerprint.txt"
    if stamp.is_file() and stamp.read_text().strip() != fingerprint:
        raise ConfigError(f"checkpoint {directory}: written by a different sweep (other axes, lengths, "
                          "batch size or dtype); allowed: the directory of the same sweep")
    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = stamp.with_name("fingerprint.txt.tmp")
        temporary.write_text(fingerprint + "\n")
        os.replace(temporary, stamp)
    return directory


# ---------------------------------------------------------------- the sweep


def _shape_statistics(p: np.ndarray, fraction: float) -> dict[str, np.ndarray]:
    """`jaxroll.metrics.shape_statistics` of profiles ``(S, n)``, in host NumPy float64.

    The same definitions (``k = max(1, round(fraction n))`` edge positions),
    computed here without JAX: eager jnp would compile every operation anew
    for every length of a sweep.
    """
    n = p.shape[-1]
    k = metrics.edge_count(n, fraction)
    first_mass, last_mass = p[:, :k].sum(axis=1), p[:, n - k:].sum(axis=1)
    middle = p[:, k: max(k, n - k)].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        u_index = (np.minimum(first_mass, last_mass) / k) / (middle / (n - 2 * k)) - 1.0 \
            if n > 2 * k else np.full(p.shape[0], np.nan)
    return {"first": p[:, 0], "last": p[:, -1], "argmin": np.argmin(p, axis=1),
            "center_of_mass": p @ np.arange(n, dtype=np.float64) / max(n - 1, 1),
            "first_mass": first_mass, "middle_mass": middle, "last_mass": last_mass, "u_index": u_index}


def _table(plan: _Plan, profiles: np.ndarray, fraction: float) -> dict[str, np.ndarray]:
    """One row per (point, length): the point's columns, the length, the shape statistics."""
    count, lengths = profiles.shape[0], len(plan.lengths)
    table = {name: np.repeat(column, lengths) for name, column in plan.columns.items()}
    table["length"] = np.tile(np.asarray(plan.lengths), count)
    statistics = {name: np.zeros(count * lengths, np.int64 if name == "argmin" else np.float64)
                  for name in STATISTICS}
    for position, n in enumerate(plan.lengths):
        values = _shape_statistics(np.asarray(profiles[:, position, :n], np.float64), fraction)
        for name in STATISTICS:
            statistics[name][position::lengths] = values[name]
    table.update(statistics)
    return table


def sweep(
    model: RolloutModel,
    *,
    lengths=None,
    zip: bool = False,  # noqa: A002  (the issue's name: zip axes instead of a product)
    batch_size: int | None = None,
    mesh=None,
    progress: bool = True,
    checkpoint=None,
    fraction: float = 0.1,
    **axes,
) -> SweepResult:
    """Influence profiles of many variants of `model` in one compiled, sharded call.

    Each keyword in `axes` names a field and lists its values; the points are
    their cartesian product (or, with ``zip=True``, the values taken side by
    side). Point s is the model with those fields replaced; its profile is
    ``p_s^T = e_{n-1}^T R_T ... R_1`` with ``R_t = (1 - lambda_t) I + lambda_t A_t``
    and ``A[i, j]`` the weight with which token i reads token j
    (arXiv 2602.16837).

    Args:
        model: the base `RolloutModel`, or a `KernelRolloutModel` (lambda
            axes over any kernel; kernel fields by `KERNEL_AXES`).
        lengths: sequence lengths to evaluate at every point (default: the
            model's ``sequence_length`` only), all in one compiled call:
            start rows ``e_{n-1}`` in power-of-two buckets (causal, sliding),
            one body per length (full mask).
        zip: take the axes side by side (all the same length) instead of
            their cartesian product.
        batch_size: points per compiled call (default: what fits
            `MEMORY_BUDGET`); rounded to a multiple of the mesh's devices.
        mesh: None (the mesh of ``jax.set_mesh`` if one is set, else every
            device), a device count, or a `jax.sharding.Mesh` built any way
            (``jax.make_mesh((k,), ("batch",))``, whose axes are `Explicit`
            on current JAX; `Auto` axes; several axes); the batch axis is
            sharded over all of its axes (see `make_mesh`).
        progress: a tqdm bar over chunks (process 0 only).
        checkpoint: a directory; every finished chunk is written there
            atomically and chunks already there (of the same sweep) are read
            back instead of recomputed, so an interrupted sweep resumes.
        fraction: edge fraction of the shape statistics (`jaxroll.metrics`).
        **axes: ``lambdas``, ``lambda_0`` and ``beta``, ``alibi_slopes``,
            ``slope_scale``, ``diagonal_scores``, ``head_weights``,
            ``temperature`` (see `AXES`).

    Returns:
        A `SweepResult`: profiles ``(*axes, [L,] N)`` and the tidy table.

    Raises:
        ConfigError: one line: an empty axis, an unknown field, a value out of
            range (naming the axis and the index of the value), axes of different
            lengths under `zip`, a mesh larger than the devices.

    Example:
        >>> import jaxroll
        >>> result = jaxroll.sweep(jaxroll.presets.get("mpt-7b", 128),
        ...                        lambda_0=[0.3, 0.6], beta=[0.5, 1.0, 2.0], progress=False)
        >>> result.profiles.shape, result.method
        ((2, 3, 128), 'krylov')
    """
    if not 0 < fraction < 0.5:
        raise ConfigError(f"fraction: got {fraction!r}; allowed: 0 < fraction < 0.5")
    plan = _plan(model, axes, lengths, bool(zip), batch_size, mesh)
    directory = _open_checkpoint(checkpoint, plan) if checkpoint is not None else None
    evaluator = _Evaluator(plan)
    count = plan.columns["total_mixing"].shape[0]
    chunks = -(-count // plan.batch_size)
    pieces, sharding = [], evaluator.batch

    from tqdm.auto import tqdm

    with tqdm(total=chunks, desc="sweep", unit="chunk", delay=2.0,
              disable=not progress or jax.process_index() != 0) as bar:
        for k in range(chunks):
            path = directory / f"chunk_{k:06d}.npy" if directory is not None else None
            if path is not None and path.is_file():
                piece = _load_chunk(path, k)
            else:
                piece, sharding = evaluator.host_chunk(k)
                if path is not None and jax.process_index() == 0:
                    _atomic_save(path, piece)
            pieces.append(piece)
            bar.update(1)
    flat = np.concatenate(pieces)[:count]
    table = _table(plan, flat, fraction)
    profiles = flat if lengths is not None else flat[:, 0, :]
    profiles = profiles.reshape(plan.shape + profiles.shape[1:])
    return SweepResult(profiles, table, {name: list(axes[name]) for name in axes},
                       plan.lengths if lengths is not None else None, plan.method, sharding,
                       plan.batch_size)
