"""The tables of docs/baselines.md: the Cesàro rollout's closed forms, and Brändel's power law on rollout rows.

1. Cesàro (uniform causal attention, constant mixing alpha, T layers): the
   exact profile (`theory.cesaro_profile`) against `jaxroll.influence` of the
   uniform-causal model (slope 0, no content) where it fits, the continuum
   error ``max |(N + 1) p(j) - g(x_j)| / max g`` over x in [0.1, 0.9], the
   last token against the atom, and the seconds of each (after compilation).
2. The power law by distance: for each published model (N = 256, no content
   and all content on FineWeb-Edu) the rows i = 16, 24, ..., 255 of its
   rollout matrix, reduced to the mean and median influence by distance
   (`theory.by_distance`, distances 0..127 where at least 15 rows reach) and
   fitted by ``gamma + beta (r + 1)^-p`` (`theory.fit_power_law`, 95 %
   intervals).

    python3 benchmarks/baselines.py [--out-prefix benchmarks/baselines]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import published, theory  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_row, timed  # noqa: E402


def cesaro_rows(alpha=0.15, layers=32):
    rows = []
    for n in (256, 2048, 16384):
        p = np.asarray(theory.cesaro_profile(n, alpha, layers))
        seconds, _ = timed(lambda: theory.cesaro_profile(n, alpha, layers), 5)
        model = jaxroll.RolloutModel.create(num_layers=layers, num_heads=1, lambdas=np.full(layers, alpha),
                                            alibi_slopes=[[0.0]], diagonal_scores=[[0.0]], sequence_length=n)
        rollout_seconds, _ = timed(lambda: jaxroll.influence(model), 5)
        error = float(np.max(np.abs(p - np.asarray(jaxroll.influence(model)))))
        x = np.arange(1, n + 1) / (n + 1)
        inside = (x > 0.1) & (x < 0.9)
        g = np.asarray(theory.cesaro_density(x, alpha, layers))
        continuum = float(np.max(np.abs((n + 1) * p - g)[inside]) / np.max(g[inside]))
        rows.append(dict(N=n, T=layers, alpha=alpha, error_vs_influence=error, continuum_error=continuum,
                         p_last=float(p[-1]), atom=float(theory.cesaro_atom(alpha, layers)), p0=float(p[0]),
                         seconds_cesaro=seconds, seconds_influence=rollout_seconds))
    return rows


def power_law_rows():
    rows = []
    queries = np.arange(16, 256, 8)
    for name in published.names():
        for content in (None, "all"):
            matrix = np.asarray(jaxroll.rollout_matrix(published.load(name, content)))
            for statistic in ("mean", "median"):
                r, value = theory.by_distance(matrix[queries], queries, statistic)
                keep = r <= 127  # at least 15 query rows reach every distance kept
                fit = theory.fit_power_law(r[keep], value[keep])
                rows.append(dict(model=name, content=content or "none", statistic=statistic,
                                 gamma=fit.gamma, beta=fit.beta, p=fit.p,
                                 p_low=fit.interval[2, 0], p_high=fit.interval[2, 1],
                                 rms_over_mean=fit.rms / float(np.mean(value[keep])), at_bound=fit.at_bound))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-prefix", type=Path, default=None, help="write PREFIX_cesaro.csv, PREFIX_power.csv")
    arguments = parser.parse_args()
    for label, rows in (("cesaro", cesaro_rows()), ("power", power_law_rows())):
        columns = list(rows[0])
        print(" | ".join(columns))
        for row in rows:
            print_row(row, columns)
        if arguments.out_prefix is not None:
            with open(f"{arguments.out_prefix}_{label}.csv", "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
        print()


if __name__ == "__main__":
    start = time.time()
    main()
    print(f"{time.time() - start:.0f} s")
