"""The tables of docs/kinetic.md: the bridge's convergence, the two theories on one geometry, the fits.

    python benchmarks/kinetic.py [--quick] [--out DIR]

1. Convergence: ``max_s |N e^c P_T[N-1, j] - g(c; s_j)| / g`` over s in
   [0.05, 0.95] for the modes n = 1, 2, 3 of beta = 2, t = 1, lambda = 1
   (c = a_n t), at T = 25 ... 400 layers and N = 4 T positions, with the
   observed order ``log2(e_T / e_2T)``.
2. Disagreement on one geometry: W1/(N-1) between the kinetic distribution
   and its matching rollout (`jaxroll.theory.bridge.matching_rollout`) over a
   grid of beta, lambda and t / t_crit.
3. Fits: `jaxroll.theory.two_theories.compare_theories` on the five published
   models' profiles (`jaxroll.published.load(name)`, `jaxroll.influence`),
   with the fit times (each includes its compilation).

Writes kinetic_convergence.csv, kinetic_disagreement.csv, kinetic_fits.csv.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll.theory import bridge, kinetic, two_theories  # noqa: E402


def convergence(depths):
    rows = []
    rates = np.asarray(kinetic.rates(2.0, n_max=3))
    for mode_index, c in enumerate(rates, start=1):
        previous = None
        for layers in depths:
            n = 4 * layers
            p = jaxroll.influence(bridge.mode_rollout(float(c), 1.0, n, layers))
            s, scaled = bridge.mode_from_rollout(p, float(c))
            g = kinetic.mode(float(c), s, 1.0)
            keep = (np.asarray(s) >= 0.05) & (np.asarray(s) <= 0.95)
            error = float(np.max(np.abs(np.asarray(scaled - g))[keep] / np.asarray(g)[keep]))
            order = float(np.log2(previous / error)) if previous else float("nan")
            rows.append(dict(mode=mode_index, c=float(c), T=layers, N=n, error=error, order=order))
            previous = error
    return rows


def disagreement(n=256, layers=256):
    rows = []
    for beta, lam, ratio in itertools.product((0.1, 1.0, 3.0), (0.5, 2.0, 8.0), (0.25, 1.0, 4.0)):
        t = ratio * float(kinetic.critical_time(beta, lam, 8.0))
        model = kinetic.KineticModel.create(beta=beta, lam=lam, t=t, M=8.0)
        c = float(kinetic.effective_rate(beta, 8.0)) * t
        if c > layers:
            continue
        p_kinetic = two_theories.to_distribution(model, n)
        p_rollout = jaxroll.influence(bridge.matching_rollout(model, n, layers))
        # Off the query: the rollout's point mass e^-c at j = N-1 has no kinetic counterpart.
        off_kinetic = np.asarray(p_kinetic)[:-1] / np.sum(np.asarray(p_kinetic)[:-1])
        off_rollout = np.asarray(p_rollout)[:-1] / np.sum(np.asarray(p_rollout)[:-1])
        rows.append(dict(beta=beta, lam=lam, t_over_t_crit=ratio, t=t, c=c,
                         w1=float(jaxroll.metrics.wasserstein(p_kinetic, p_rollout)),
                         w1_off_query=float(jaxroll.metrics.wasserstein(off_kinetic, off_rollout)),
                         query_mass=float(p_rollout[-1]),
                         argmin_kinetic=int(np.argmin(off_kinetic)),
                         argmin_rollout=int(np.argmin(off_rollout))))
    return rows


def fits(names, steps):
    rows = []
    for name in names:
        model = jaxroll.published.load(name)
        q = np.asarray(jaxroll.influence(model))
        start = time.perf_counter()
        result = two_theories.compare_theories(q, model, steps=steps)
        seconds = time.perf_counter() - start
        for theory, fit in result.items():
            rows.append(dict(model=name, theory=theory, w1=fit.wasserstein, parameters=fit.num_parameters,
                             values={k: np.round(v, 4).tolist() for k, v in fit.parameters.items() if k != "raw"},
                             seconds_all_theories=round(seconds, 1)))
            print(f"  {name} {theory}: W1 {fit.wasserstein:.5f}, {fit.num_parameters} parameters "
                  f"({seconds:.0f} s for all theories)", flush=True)
    return rows


def write(rows, path):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T up to 100, two models, 100 steps")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: convergence,disagreement,fits")
    arguments = parser.parse_args()
    skip = set(filter(None, arguments.skip.split(",")))
    arguments.out.mkdir(parents=True, exist_ok=True)
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    if "convergence" not in skip:
        rows = convergence((25, 50, 100) if arguments.quick else (25, 50, 100, 200, 400))
        write(rows, arguments.out / "kinetic_convergence.csv")
        print("| mode n | c = a_n t | T | N | max rel. error | observed order |")
        for r in rows:
            print(f"| {r['mode']} | {r['c']:.4f} | {r['T']} | {r['N']} | {r['error']:.3e} | {r['order']:.2f} |")
    if "disagreement" not in skip:
        rows = disagreement()
        write(rows, arguments.out / "kinetic_disagreement.csv")
        print("| beta | lambda | t/t_crit | c | W1/(N-1) | rollout query mass | W1/(N-1) off the query "
              "| argmin kinetic | argmin rollout |")
        for r in sorted(rows, key=lambda r: -r["w1_off_query"]):
            print(f"| {r['beta']} | {r['lam']} | {r['t_over_t_crit']} | {r['c']:.4g} | {r['w1']:.4f} | "
                  f"{r['query_mass']:.4f} | {r['w1_off_query']:.4f} | "
                  f"{r['argmin_kinetic']} | {r['argmin_rollout']} |")
    if "fits" not in skip:
        names = jaxroll.published.names()[:2] if arguments.quick else jaxroll.published.names()
        rows = fits(names, 100 if arguments.quick else 300)
        write(rows, arguments.out / "kinetic_fits.csv")
        print("| model | theory | W1/(N-1) | parameters | fitted values | seconds (all theories) |")
        for r in rows:
            print(f"| {r['model']} | {r['theory']} | {r['w1']:.5f} | {r['parameters']} | {r['values']} | "
                  f"{r['seconds_all_theories']} |")


if __name__ == "__main__":
    main()
