"""The plan of a sweep: points, method, mesh and chunk size, decided and checked before any compilation."""

from __future__ import annotations

import builtins
import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh

from .. import memory
from .._checks import check_positive_int
from ..errors import ConfigError
from ..model import RolloutModel, check_model
from ..interventions import intervention_type
from .axes import (_LAMBDA_AXES, _SCALAR_AXES, _axis_values, _check_lengths, _checked_axis, _kernel_fields,
                   intervention_axes, mixing_axes, slope_field)

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep

MEMORY_BUDGET = 2**30
"""Bytes of intermediate arrays one chunk may hold per device (an estimate), when ``batch_size``
is None, on an accelerator that does not report its memory (`chunk_budget`)."""


DEVICE_FRACTION = 0.25
"""Share of an accelerator's free memory (``Device.memory_stats()``) one chunk may hold."""


def chunk_budget(method: str, mesh: Mesh) -> int:
    """Bytes of intermediates one chunk may hold on each device of `mesh`.

    On an accelerator that reports its memory (``Device.memory_stats()``:
    GPUs, TPUs), `DEVICE_FRACTION` of the free memory of its smallest
    device, on either path. On the CPU, or a device that reports nothing,
    `MEMORY_BUDGET` for the Krylov path and the cache-sized
    `VMAP_WORKING_SET` for the vmap path (the cache heuristic applies only on
    the CPU: on a 141 GiB GPU it gave chunks of 40 points).
    """
    devices = list(mesh.devices.flat)
    if devices[0].platform != "cpu":
        free = []
        for device in devices:
            try:
                stats = device.memory_stats() or {}
            except Exception:  # a platform without the query
                stats = {}
            if "bytes_limit" in stats:
                free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
        if free and len(free) == len(devices):
            return max(1, int(DEVICE_FRACTION * min(free)) * len(devices))
        return MEMORY_BUDGET * len(devices)
    return KRYLOV_WORKING_SET if method == "krylov" else VMAP_WORKING_SET


KRYLOV_WORKING_SET = 12 * 2**20
"""Bytes of intermediates per chunk on the CPU's Krylov path, when ``batch_size`` is None: the
chunk's coefficients and profiles stay in cache. On the 2-core CPU, BLOOM-176B geometry at
N = 256 (float32, 100,489 points, load ~11): 4,096 points per chunk (12 MiB) ran 54,557 points/s,
one chunk of all of them 13,435."""


VMAP_WORKING_SET = 4 * 2**20
"""Bytes of intermediates per chunk on the vmap path, when ``batch_size`` is None. Each
profile there is compute-bound and larger chunks fall out of cache: on the 2-core
CPU, MPT-7B geometry at N = 2048, 4 points per call ran 1.9x a loop of `influence`
and 32 points 0.9x. Used on the CPU only (see `chunk_budget`)."""


VMAP_DEVICE_POINTS = 4096
"""Most points per device in one vmap chunk on an accelerator. The per-point estimate misses
XLA's vmapped intermediates: on one H200 (2026-12-04 16:53 UTC, benchmarks/gpu.py) a chunk sized
from a quarter of free memory, BLOOM-176B geometry at N = 2048 (tens of thousands of points),
ran out of memory (63 GiB asked for in the chunk's statistics)."""


_BATCH = "batch"


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


class _Plan(NamedTuple):
    """Everything a sweep computes, decided (and checked) before any compilation."""

    base: RolloutModel
    shape: tuple[int, ...]          # the points' grid, (*axes) or (K,)
    base_leaves: dict[str, np.ndarray]  # the model arrays a point may change, unbatched
    picks: tuple                    # ((leaf, checked values (V, ...), value index per point (S,)), ...)
    columns: dict[str, np.ndarray]  # per-point table columns, (S,)
    lengths: tuple[int, ...]        # lengths evaluated (at least one)
    method: str
    batch_size: int
    mesh: Mesh
    count: int                      # S, the points
    harmonic: np.ndarray | None     # sum_t (t + 1)^-beta per value of a beta axis (power-decay grids), else None

    @property
    def power_decay_grid(self) -> bool:
        """Whether the points' schedules are ``lambda_0 / (t + 1)^beta`` from lambda_0 and beta axes."""
        return "lambda_0" in self.columns and "lambda_0_index" in self.columns

    @property
    def schedules_on_device(self) -> bool:
        """Whether a Krylov chunk may form its schedules on the device from lambda_0 and beta alone
        (a power-decay grid without a gamma axis, which changes every lambda_t on the host)."""
        return self.power_decay_grid and not any(f"{name}_index" in self.columns for name in mixing_axes())

    def total_mixing(self, take: np.ndarray) -> np.ndarray:
        """``sum_t lambda_t`` of the points `take`, float64 ``(len(take),)``, without forming their schedules
        on a power-decay grid: ``lambda_0 sum_t (t + 1)^-beta``, the sum per beta value computed once (`_plan`)."""
        if self.harmonic is None:
            return self.chunk_leaves(take)["lambdas"].sum(axis=1)
        return self.columns["lambda_0"][take] * self.harmonic[self.columns["beta_index"][take]]

    def chunk_leaves(self, take: np.ndarray) -> dict[str, np.ndarray]:
        """The batched model arrays of the points `take`, float64 ``(len(take), ...)``.

        Built per chunk, so host memory is O(chunk), not O(points): the
        checked values of each axis are stored once and indexed here.
        """
        size = len(take)
        leaves = {field: np.broadcast_to(value, (size,) + np.shape(value)) for field, value in self.base_leaves.items()}
        for leaf, values, index in self.picks:
            leaves[leaf] = values[index[take]]
        if self.power_decay_grid:
            # The same float64 formula as schedules.power_decay; in [0, 1] (lambda_0 <= 1, beta >= 0, checked).
            layers = np.arange(self.base.num_layers, dtype=np.float64)
            lambda_0, beta = self.columns["lambda_0"][take, None], self.columns["beta"][take, None]
            leaves["lambdas"] = lambda_0 / (layers + 1.0) ** beta
        if "slope_scale" in self.columns:
            slopes = f"kernel.{slope_field(self.base.kernel)}"
            leaves[slopes] = leaves[slopes] * self.columns["slope_scale"][take, None, None]
        for name in mixing_axes():
            if f"intervention.{name}" in leaves:
                # A change of lambda alone (`interventions.BranchScale`: lambda' = gamma lambda / (gamma lambda +
                # rho (1 - lambda)), rho from the stream norms where the model has them), so it is applied here,
                # in float64, and the axis keeps the Krylov path of a model whose layers share one kernel.
                value = leaves.pop(f"intervention.{name}")
                leaves["lambdas"] = intervention_type(name).mixed_lambdas(value, leaves["lambdas"],
                                                                          self.base.stream_norms)
        return leaves


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
    """True when every layer has the same kernel (every per-layer array equal to layer 0's)."""
    arrays = [x for x in _kernel_fields(model.kernel).values() if x.ndim > 0]
    return all(np.all(x == x[:1]) for x in arrays)


def _per_point_bytes(method: str, base: RolloutModel, lengths, n: int) -> int:
    itemsize = jnp.dtype(jnp.result_type(float)).itemsize
    rows = len(lengths) * n * itemsize
    if method == "krylov":
        return 3 * rows  # the product, its normalised copy, and the gathered copy on the host
    # Each start row runs the kernel's own product (`AbstractKernel.row_bytes`).
    return len(lengths) * base.kernel.row_bytes(n, itemsize) + rows


def _plan(model, axes: dict, lengths, zipped: bool, batch_size, mesh, stream: bool = False) -> _Plan:
    check_model(model)
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
    for n in lengths or (model.sequence_length,):
        try:
            model.kernel.check_length(n)
        except ConfigError as error:
            raise ConfigError(f"lengths: {n}: {error.detail}", field="lengths", value=n,
                              allowed=error.allowed) from None
    mesh = make_mesh(mesh)
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)

    shape, indices = _points([len(values[n]) for n in names], names, zipped)
    count = int(np.prod(shape)) if shape else 1
    index = dict(builtins.zip(names, indices)) if names else {}
    # Only what varies is batched: a measured kernel (T, N, N) is not copied per point.
    varied = {name for name in names if name not in _LAMBDA_AXES and name not in intervention_axes()}
    varied |= {slope_field(model.kernel)} if "slope_scale" in names else set()
    base_leaves = {"lambdas": np.asarray(model.lambdas, np.float64)}
    base_leaves |= {f"kernel.{field}": value for field, value in _kernel_fields(model.kernel).items()
                    if field in varied}
    if "lambda_0" in names:
        base_leaves.pop("lambdas")  # every point's own schedule (Plan.chunk_leaves)
    picks = []
    columns = {f"{name}_index": index[name] for name in names}
    for name in names:
        if name == "lambdas":
            picks.append((name, checked[name], index[name]))
        elif name in intervention_axes():  # applied to each point by `evaluate._point_model` (gamma: `chunk_leaves`)
            picks.append((f"intervention.{name}", checked[name], index[name]))
        elif name not in _LAMBDA_AXES and name != "slope_scale":
            picks.append((f"kernel.{name}", checked[name], index[name]))
        if name in _SCALAR_AXES:
            columns[name] = checked[name][index[name]]
        elif all(np.ndim(v) == 0 and not isinstance(v, dict) for v in values[name]):  # np.ndim(dict) is 0
            columns[name] = np.asarray(values[name], np.float64)[index[name]]
        elif name == "lambdas" and all(isinstance(v, (tuple, dict)) for v in values[name]):
            pairs = np.asarray([(v["lambda_0"], v["beta"]) if isinstance(v, dict) else v
                                for v in values[name]], np.float64)
            columns["lambda_0"], columns["beta"] = pairs[index[name], 0], pairs[index[name], 1]

    # One point gains nothing from T + 1 Krylov rows over its own T products.
    # gamma changes lambda_t alone (`Plan.chunk_leaves`): the layers still share one kernel.
    mixing = set(mixing_axes())
    # A kernel that mixes each row with its own weight (the probability path) is no polynomial in A.
    method = ("krylov" if count > 1 and set(names) <= _LAMBDA_AXES | mixing and _equal_layers(model)
              and not model.kernel.mixes_rows and model.composition is None else "vmap")
    evaluated = lengths if lengths is not None else (model.sequence_length,)
    devices = mesh.devices.size
    if batch_size is None:
        per_point = _per_point_bytes(method, model, evaluated, max(evaluated))
        batch_size = max(1, chunk_budget(method, mesh) // per_point)
        if method == "vmap" and mesh.devices.flat[0].platform != "cpu":
            batch_size = min(batch_size, VMAP_DEVICE_POINTS * mesh.devices.size)
    if not stream:  # the gathered profiles live on the host; streamed, only one chunk at a time
        itemsize = jnp.dtype(jnp.result_type(float)).itemsize
        needed = count * len(evaluated) * max(evaluated) * itemsize
        memory.check_fits(needed, f"sweep: {count} points x {len(evaluated)} lengths x N = {max(evaluated)}",
                          allowed="fewer points, shorter lengths or stream_to=FILE")
    # Whole multiples of the mesh, and never (much) more than the sweep needs.
    batch_size = min(batch_size, -(-count // devices) * devices)
    batch_size = max(devices, batch_size // devices * devices)
    harmonic = None
    if "lambda_0" in names and not mixing & set(names):  # gamma changes each lambda_t: no closed-form sum
        layers = np.arange(1.0, model.num_layers + 1.0)
        harmonic = (layers[None, :] ** -np.asarray(checked["beta"], np.float64)[:, None]).sum(axis=1)
    return _Plan(model, shape, base_leaves, tuple(picks), columns, evaluated, method, batch_size, mesh, count,
                 harmonic)


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
