"""Parameter sweeps: many rollouts in one compiled, vmapped, sharded call.

Every point of a sweep is a `RolloutModel` that differs from a base model in a
few fields; its influence profile is ``p^T = e_{n-1}^T R_T ... R_1`` with
``R_t = (1 - lambda_t) I + lambda_t A_t`` (arXiv 2602.16837). The points'
arrays are stacked along a leading batch axis and evaluated under one
``jit(vmap(...))``, in chunks sized to the device (`chunk_budget`: its free
memory on an accelerator, a cache-sized working set on the CPU), the batch
axis sharded over a `jax.sharding.Mesh` with `NamedSharding`. A chunk's
arrays are built from the checked axis values when it runs, and its shape
statistics are computed on the device: host memory is O(chunk) plus the
table, and O(points x N) only for the returned profiles, which
``stream_to=FILE`` writes to disk chunk by chunk instead.

Two evaluation paths, chosen automatically:

- ``"krylov"``: when only the lambdas vary and every layer of the base model
  has the same kernel A, the ``R_t`` commute and
  ``p^T = sum_k c_k(lambda) e^T A^k`` with ``c_k`` the coefficients of
  ``prod_t ((1 - lambda_t) + lambda_t x)``. The T + 1 Krylov rows
  ``e^T A^k`` cost T structured products once; a chunk of S schedules is one
  ``(S, T+1) x (T+1, N)`` matmul. The ``c_k`` are non-negative and sum to 1
  (no cancellation); they are computed per chunk under `jit` on the device
  (`device_coefficients`, a scan over T), in the compute dtype.
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

from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding

from ..errors import ConfigError
from ..model import RolloutModel
from . import axes as _axes
from .axes import KERNEL_AXES
from .checkpoint import _atomic_save, _load_chunk, _open_checkpoint
from .evaluate import _Evaluator, device_coefficients, polynomial_coefficients
from .files import write_tables
from .plan import DEVICE_FRACTION, KRYLOV_WORKING_SET, MEMORY_BUDGET, VMAP_WORKING_SET, _plan, chunk_budget, make_mesh
from .statistics import STATISTICS, _table

__all__ = ["AXES", "KERNEL_AXES", "STATISTICS", "MEMORY_BUDGET", "VMAP_WORKING_SET", "KRYLOV_WORKING_SET",
           "DEVICE_FRACTION", "SweepResult", "sweep", "plan_sweep", "write_tables", "make_mesh", "chunk_budget",
           "device_coefficients", "polynomial_coefficients"]


def plan_sweep(model: RolloutModel, *, lengths=None, zip: bool = False, batch_size: int | None = None,
               mesh=None, **axes):
    """The checked plan of ``sweep(model, **axes, ...)``: every point decided before any compilation.

    The same checks as `sweep` (one-line `ConfigError`), so a caller can refuse
    bad input before it writes anything. The plan has ``shape`` (the points'
    grid), ``count`` (S points), ``mesh`` and ``chunk_leaves(indices)``, the
    model arrays of those points (``lambdas (S, T)`` among them).
    """
    return _plan(model, axes, lengths, bool(zip), batch_size, mesh)

AXES: tuple[str, ...]
"""The fields a sweep axis may name, then the registered intervention axes (``tau``, ``kappa``, ``gamma``,
and any registered later), read when asked; see `jaxroll.sweeps.axes`."""


def __getattr__(name: str):
    if name == "AXES":  # the field axes and the registered intervention axes, read when asked
        return _axes.AXES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def sweep(
    model: RolloutModel,
    *,
    lengths=None,
    zip: bool = False,  # noqa: A002  (zip the axes instead of taking their product)
    batch_size: int | None = None,
    mesh=None,
    progress: bool = True,
    checkpoint=None,
    stream_to=None,
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
        model: the base `RolloutModel`, over any kernel (lambda
            axes over any kernel; kernel fields by `KERNEL_AXES`).
        lengths: sequence lengths to evaluate at every point (default: the
            model's ``sequence_length`` only), all in one compiled call:
            start rows ``e_{n-1}`` in power-of-two buckets (causal, sliding),
            one body per length (full mask).
        zip: take the axes side by side (all the same length) instead of
            their cartesian product.
        batch_size: points per compiled call (default: what fits
            `chunk_budget`: the device's memory, a cache-sized working set on
            the CPU); rounded to a multiple of the mesh's devices.
        mesh: None (the mesh of ``jax.set_mesh`` if one is set, else every
            device), a device count, or a `jax.sharding.Mesh` built any way
            (``jax.make_mesh((k,), ("batch",))``, whose axes are `Explicit`
            on current JAX; `Auto` axes; several axes); the batch axis is
            sharded over all of its axes (see `make_mesh`).
        progress: progress over chunks on stderr (process 0 only; `jaxroll.progress`: a bar
            on a terminal, lines elsewhere).
        checkpoint: a directory; every finished chunk is written there
            atomically and chunks already there (of the same sweep) are read
            back instead of recomputed, so an interrupted sweep resumes.
        stream_to: a new ``.npy`` file: each chunk's profiles ``(S, L, N_max)``
            are written into it (a memory map) as the chunk finishes, so host
            memory is O(chunk) however many points; `SweepResult.profiles` is
            then that file opened read-only (``np.load(..., mmap_mode="r")``),
            with the usual shape. Process 0 writes it; other processes get
            ``profiles=None``. The table is computed per chunk on the device
            either way (O(points) numbers, not profiles).
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
    plan = _plan(model, axes, lengths, bool(zip), batch_size, mesh, stream=stream_to is not None)
    stream = _open_stream(stream_to, plan) if stream_to is not None else None
    directory = _open_checkpoint(checkpoint, plan) if checkpoint is not None else None
    evaluator = _Evaluator(plan, fraction)
    count = plan.count
    chunks = -(-count // plan.batch_size)
    pieces, statistics, mixing, sharding = [], [], [], evaluator.batch

    from ..progress import Progress

    # jaxroll.progress: a bar on a terminal, lines elsewhere (process 0 only).
    with Progress(chunks, label="jaxroll sweep", unit="chunks", delay=2.0,
                  stream=None if progress and jax.process_index() == 0 else _Silent()) as bar:
        for k in range(chunks):
            path = directory / f"chunk_{k:06d}.npy" if directory is not None else None
            if path is not None and path.is_file():
                piece, _, values, total = evaluator.loaded_chunk(k, _load_chunk(path, k))
            else:
                piece, sharding, values, total = evaluator.host_chunk(k)
                if path is not None and jax.process_index() == 0:
                    _atomic_save(path, piece)
            end = min(count, (k + 1) * plan.batch_size) - k * plan.batch_size
            if stream_to is not None:  # only this chunk is held: O(chunk) host memory
                if stream is not None:
                    stream.write(k * plan.batch_size, piece[:end])
            else:
                pieces.append(piece[:end])
            statistics.append({name: value[:end] for name, value in values.items()})
            mixing.append(total[:end])
            bar.update(1)
    table = _table(plan, np.concatenate(mixing),
                   {name: np.concatenate([values[name] for values in statistics]) for name in STATISTICS})
    if stream_to is not None:
        if stream is not None:
            stream.close()
        flat = np.load(stream_to, mmap_mode="r") if jax.process_index() == 0 else None
    else:
        flat = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)  # one chunk: no second copy
    profiles = None
    if flat is not None:
        profiles = flat if lengths is not None else flat[:, 0, :]
        profiles = profiles.reshape(plan.shape + profiles.shape[1:])
    return SweepResult(profiles, table, {name: list(axes[name]) for name in axes},
                       plan.lengths if lengths is not None else None, plan.method, sharding,
                       plan.batch_size)


def _open_stream(path, plan):
    """The ``.npy`` file the profiles stream into, ``(S, L, N_max)`` in the compute dtype; refused if it exists."""
    path = Path(path)
    if path.exists():
        raise ConfigError(f"stream_to: {path} exists; allowed: a new .npy file (nothing is overwritten)")
    if not path.parent.is_dir():
        raise ConfigError(f"stream_to: {path.parent} is not a directory; allowed: a new file in an existing one")
    if jax.process_index() != 0:
        return None
    return _Stream(path, (plan.count, len(plan.lengths), max(plan.lengths)), np.dtype(jax.numpy.result_type(float)))


class _Stream:
    """A new ``.npy`` file of `shape` filled by plain writes at row offsets.

    Not a writable memory map: the pages of a map count in the process'
    resident memory until it is closed (a 10^7-point sweep's 2.6 GB of
    profiles did), written blocks do not.
    """

    def __init__(self, path: Path, shape: tuple, dtype: np.dtype):
        self.row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
        self.dtype = dtype
        self.handle = open(path, "xb")  # a new file, never one that appeared since the check
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self.handle, header)
        self.offset = self.handle.tell()
        self.handle.truncate(self.offset + shape[0] * self.row_bytes)  # full size, sparse until written

    def write(self, first: int, rows: np.ndarray) -> None:
        self.handle.seek(self.offset + first * self.row_bytes)
        self.handle.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())

    def close(self) -> None:
        self.handle.close()


class _Silent:
    """A stream that drops what is written (progress turned off)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False
