"""A sweep's tables on disk: sweep.csv, sweep.parquet (with pyarrow) and profiles.npz, each written atomically."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

__all__ = ["write_tables"]


def write_tables(result, plan, directory) -> list[str]:
    """`result` (a `jaxroll.sweeps.SweepResult`) of `plan` (`jaxroll.sweeps.plan_sweep`) into `directory`.

    ``sweep.csv`` (one row per point and length: the table, floats as
    ``repr``), ``sweep.parquet`` when pyarrow is installed, and
    ``profiles.npz``: ``profiles``, ``axis_names``, each point's ``lambdas``
    ``(*grid, T)``, ``lengths`` and the numeric axes as ``axis_<name>``.
    Returns the names written.
    """
    directory = Path(directory)
    written = ["sweep.csv"]
    _write_csv(result.table, directory / "sweep.csv")
    if _write_parquet(result.table, directory / "sweep.parquet"):
        written.append("sweep.parquet")
    layers = plan.base.num_layers
    lambdas = plan.chunk_leaves(np.arange(plan.count))["lambdas"].reshape(plan.shape + (layers,))
    _write_npz(result, lambdas, directory / "profiles.npz")
    written.append("profiles.npz")
    return written


def _atomic(path: Path):
    return path.with_name(path.name + ".tmp")


def _write_csv(table: dict, path: Path) -> None:
    temporary = _atomic(path)
    names = list(table)
    with open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        for row in zip(*(table[name] for name in names)):
            writer.writerow([repr(float(x)) if isinstance(x, (float, np.floating)) else int(x) for x in row])
    os.replace(temporary, path)


def _write_parquet(table: dict, path: Path) -> bool:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        return False
    temporary = _atomic(path)
    pyarrow.parquet.write_table(pyarrow.Table.from_pydict({k: np.asarray(v) for k, v in table.items()}),
                                temporary)
    os.replace(temporary, path)
    return True


def _write_npz(result, lambdas: np.ndarray, path: Path) -> None:
    arrays = {"profiles": result.profiles, "axis_names": np.asarray(list(result.axes), dtype=str),
              "lambdas": lambdas}
    if result.lengths is not None:
        arrays["lengths"] = np.asarray(result.lengths)
    for name, values in result.axes.items():
        try:
            arrays[f"axis_{name}"] = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):  # mixed schedules: the per-point lambdas say it all
            pass
    temporary = _atomic(path)
    with open(temporary, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(temporary, path)
