"""The published configurations at both lengths: accuracy against the oracle, the profiles' shape, timings.

For every published (model, content, dataset) at N = 256 and N = 2048
(`jaxroll.published.catalogue`; 45 files), one row: the profile's p[0],
p[-1], argmin (and argmin / (N - 1)), its minimum, middle mass and u_index
(`jaxroll.metrics`), and for the 2048 files W1 / (N - 1) between the 2048
file's profile and the 256 file's (same model, content and data set)
evaluated at N = 2048: how much the re-measured content moves the
prediction. For the 2048 files also the maximum absolute error of
jaxroll (float64 and float32, structured path) against
``tests/oracle.py``'s correlation oracle (float64), and the seconds of each
(jaxroll after compilation, the oracle once) measured in the same run. This
covers the slow-marked cases of tests/test_published_2048.py (BLOOM-176B,
MPT-30B, Falcon-RW-7B). Never run in CI.

    python3 benchmarks/published.py --out benchmarks/published.csv [--quick]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import metrics, published  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import oracle  # noqa: E402

from _common import print_row  # noqa: E402

COLUMNS = ("model", "content", "dataset", "N", "p0", "p_last", "argmin", "argmin_x", "min", "middle_mass",
           "u_index", "w1_vs_256_file", "error_float64", "error_float32", "seconds_jaxroll", "seconds_oracle")


def _shape(p: np.ndarray) -> dict:
    n = p.size
    j = int(np.argmin(p))
    return dict(p0=float(p[0]), p_last=float(p[-1]), argmin=j, argmin_x=j / (n - 1), min=float(p[j]),
                middle_mass=float(metrics.middle_mass(jnp.asarray(p))), u_index=float(metrics.u_index(jnp.asarray(p))))


def row(model: str, content, dataset: str, length: int) -> dict:
    config = published.load(model, content, dataset, length)
    start = time.perf_counter()
    profile = np.asarray(jax.block_until_ready(jaxroll.influence(config)))  # compiles
    profile = np.asarray(jax.block_until_ready(jaxroll.influence(config)))
    seconds = time.perf_counter() - start
    result = dict(model=model, content=content or "none", dataset=dataset, N=length, **_shape(profile))
    if length == 2048:
        start = time.perf_counter()
        expected = oracle.influence_by_correlation(
            oracle.config_arrays(oracle.read_config(published.path(model, content, dataset, length))), length)
        result["seconds_oracle"] = time.perf_counter() - start
        start = time.perf_counter()
        jax.block_until_ready(jaxroll.influence(config))
        result["seconds_jaxroll"] = time.perf_counter() - start
        result["error_float64"] = float(np.max(np.abs(profile - expected)))
        with jax.enable_x64(False):
            result["error_float32"] = float(np.max(np.abs(np.asarray(jaxroll.influence(config)) - expected)))
        short = published.load(model, content, dataset, 256)
        import dataclasses

        at_2048 = jaxroll.influence(dataclasses.replace(short, sequence_length=length))
        result["w1_vs_256_file"] = float(metrics.wasserstein(jnp.asarray(profile), at_2048))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="CSV file to write")
    parser.add_argument("--quick", action="store_true", help="MPT-7B and BLOOM-7B1 only")
    arguments = parser.parse_args()
    entries = [e for e in published.catalogue() if not arguments.quick or e[0] in ("mpt-7b", "bloom-7b1")]
    print(" | ".join(COLUMNS), flush=True)
    rows = []
    for entry in entries:
        rows.append(row(*entry))
        print_row(rows[-1], COLUMNS)
    if arguments.out is not None:
        with open(arguments.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {arguments.out}")


if __name__ == "__main__":
    main()
