"""Checkpoints of a sweep: every finished chunk written atomically, read back when the same sweep resumes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from .plan import _Plan

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep


def _fingerprint(plan: _Plan) -> str:
    digest = hashlib.sha256()
    # What every point is: the base arrays it may change, each axis' checked values and value
    # indices, and the table's columns (the power-decay grid's lambda_0 and beta among them).
    for field in sorted(plan.base_leaves):
        digest.update(field.encode())
        digest.update(np.ascontiguousarray(plan.base_leaves[field], np.float64).tobytes())
    for leaf, values, index in plan.picks:
        digest.update(leaf.encode())
        digest.update(np.ascontiguousarray(values, np.float64).tobytes())
        digest.update(np.ascontiguousarray(index).tobytes())
    for name in sorted(plan.columns):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(plan.columns[name], np.float64).tobytes())
    for leaf in jax.tree.leaves(plan.base.kernel):  # the fixed kernel arrays are not in the leaves
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
    if stamp.is_file() and stamp.read_text(encoding="utf-8", errors="replace").strip() != fingerprint:
        raise ConfigError(f"checkpoint {directory}: written by a different sweep (other axes, lengths, "
                          "batch size or dtype); allowed: the directory of the same sweep")
    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = stamp.with_name("fingerprint.txt.tmp")
        temporary.write_text(fingerprint + "\n")
        os.replace(temporary, stamp)
    return directory
