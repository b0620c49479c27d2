"""Benchmark: fitting a free lambda schedule and per-layer content on BLOOM-176B,
and recovering a power-decay schedule from constant starts (issue 13).

Part "speed" (BLOOM-176B):
Start: the published no_content/bloom.yaml (T = 70, H = 112), read from the
package data (`jaxroll.published.load("bloom-176b")`).
Target: the profile of all_content/fineweb-edu/bloom.yaml at the same N.
Free: lambdas (free schedule, 70) and per-layer diagonal content (70), loss
the normalised W1.

Rows:
- jaxroll `fit` (Adam, one compiled scan) at N = 256 with the dense and the
  structured kernels, and at N = 16384 with the structured kernels. Each fit
  runs twice with the same arguments: the first call is compile + run, the
  second (a jit cache hit) is the run; compile = first - second.
- baseline: `scipy.optimize.minimize(method="L-BFGS-B")` with 2-point
  finite-difference gradients on the same loss, computed by a plain NumPy
  dense rollout (written here). One L-BFGS-B iteration costs at least one
  finite-difference gradient, 141 evaluations; when `--scipy-iterations` is
  0 (the default at N = 256, where a gradient takes minutes) the baseline
  times `--scipy-evaluations` evaluations and reports the cost of one
  gradient as 141 of them.

The ratio is the baseline's seconds per gradient over jaxroll's seconds per
step (one Adam step is one exact gradient). Correctness first: the NumPy
loss and jaxroll's loss agree at the start point before anything is timed.

Part "recovery" (issue 13, "Fits that find the global answer"): the
MPT-7B-like geometry (T = 32, H = 32, standard ALiBi slopes, no content,
N = 256), target the profile of power_decay(0.35, 1.3), started from
constant(0.1) and constant(0.9), schedule="power_decay", loss W1, float64.
Rows: the local fit alone (``search=0``: the spurious minimum of the issue)
and with the global stage (the default), each with Adam (the default,
`--adam-steps`) and optax.lbfgs (`--lbfgs-steps`). Reported: the fitted
(lambda_0, beta), their errors, W1 (a plain NumPy W1 of the fitted profile,
computed by the NumPy dense rollout below) and the wall time of the call
(the first call of each optimiser includes compilation; the rows after it
reuse the compiled scan). Written to results/fit_recovery.csv.

Usage: python benchmarks/fit.py [--part speed|recovery|all] [--steps 1000] [--long-steps 1000]
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import jax
import numpy as np
import optax
import scipy.optimize

import jaxroll
from jaxroll import schedules


def numpy_influence(lambdas, slopes, diagonal, n):
    """Dense NumPy rollout, float64: p^T = e_{n-1}^T R_T ... R_1, heads averaged uniformly."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    offsets = np.where(j <= i, i - j, 0).astype(np.float64)
    causal = j <= i
    row = np.zeros(n)
    row[-1] = 1.0
    for t in reversed(range(lambdas.size)):
        kernel = np.zeros((n, n))
        for h in range(slopes.shape[1]):
            scores = -slopes[t, h] * offsets + diagonal[t, h] * np.eye(n)
            scores = np.where(causal, scores, -np.inf)
            scores -= scores.max(axis=1, keepdims=True)
            weights = np.exp(scores)
            kernel += weights / weights.sum(axis=1, keepdims=True)
        kernel /= slopes.shape[1]
        row = (1 - lambdas[t]) * row + lambdas[t] * (row @ kernel)
    return row / row.sum()


def numpy_w1(p, q):
    return float(np.abs(np.cumsum(p - q)[:-1]).sum() / (p.size - 1))


def time_jaxroll(start, target, n, method, steps):
    arguments = dict(fit=("lambdas", "diagonal_scores"), content="per_layer", steps=steps, n=n,
                     method=method)
    began = time.perf_counter()
    first = jaxroll.fit(start, target, **arguments)
    first_seconds = time.perf_counter() - began
    began = time.perf_counter()
    result = jaxroll.fit(start, target, **arguments)
    run_seconds = time.perf_counter() - began
    assert np.array_equal(first.losses, result.losses)
    return {
        "tool": f"jaxroll fit ({method})", "n": n, "steps": steps,
        "compile_s": max(first_seconds - run_seconds, 0.0), "run_s": run_seconds,
        "per_step_s": run_seconds / steps, "w1_start": result.initial_loss,
        "w1_end": result.final_loss,
    }


def time_scipy(start, target, n, evaluations, iterations):
    slopes = np.asarray(start.alibi_slopes)
    T, H = slopes.shape
    lambdas0 = np.asarray(start.lambdas)
    content0 = np.asarray(start.diagonal_scores).mean(axis=1)

    def loss(x):
        diagonal = np.repeat(x[T:, None], H, axis=1)
        return numpy_w1(numpy_influence(x[:T], slopes, diagonal, n), target)

    x0 = np.concatenate([lambdas0, content0])
    bounds = [(0.0, 1.0)] * T + [(None, None)] * T
    began = time.perf_counter()
    value = loss(x0)
    for _ in range(evaluations - 1):
        loss(x0)
    per_evaluation = (time.perf_counter() - began) / evaluations
    per_gradient = per_evaluation * (x0.size + 1)
    row = {"tool": "scipy L-BFGS-B + FD (NumPy dense)", "n": n, "steps": iterations,
           "compile_s": 0.0, "w1_start": value, "w1_end": float("nan"),
           "per_evaluation_s": per_evaluation}
    if iterations:
        began = time.perf_counter()
        result = scipy.optimize.minimize(loss, x0, method="L-BFGS-B", bounds=bounds,
                                         options={"maxiter": iterations})
        row["run_s"] = time.perf_counter() - began
        row["per_step_s"] = row["run_s"] / max(result.nit, 1)
        row["w1_end"] = float(result.fun)
    else:
        row["run_s"] = float("nan")
        row["per_step_s"] = per_gradient  # one FD gradient: 141 evaluations
    return row


def recovery(adam_steps: int, lbfgs_steps: int, path: Path) -> None:
    """Issue 13's recovery table (see the module docstring)."""
    T, H, n = 32, 32, 256

    def model(lambdas):
        return jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=lambdas, sequence_length=n)

    truth = model(schedules.power_decay(0.35, 1.3, T))
    slopes = np.asarray(truth.alibi_slopes)
    zeros = np.zeros((T, H))
    target = numpy_influence(np.asarray(truth.lambdas), slopes, zeros, n)
    lbfgs = optax.lbfgs()  # one object: the rows that use it share one compiled scan
    runs = [("adam", None, adam_steps, 0.1, 0), ("adam", None, adam_steps, 0.1, None),
            ("adam", None, adam_steps, 0.9, None), ("lbfgs", lbfgs, lbfgs_steps, 0.1, 0),
            ("lbfgs", lbfgs, lbfgs_steps, 0.1, None), ("lbfgs", lbfgs, lbfgs_steps, 0.9, 0),
            ("lbfgs", lbfgs, lbfgs_steps, 0.9, None)]
    rows = []
    with jax.enable_x64(True):
        for name, optimizer, steps, start, search in runs:
            began = time.perf_counter()
            result = jaxroll.fit(model(schedules.constant(start, T)), target, schedule="power_decay",
                                 steps=steps, search=search, optimizer=optimizer, method="structured")
            seconds = time.perf_counter() - began
            fitted = result.schedule_parameters
            profile = numpy_influence(np.asarray(result.model.lambdas), slopes, zeros, n)
            report = result.identifiability
            rows.append({
                "start": f"constant({start})", "stage": "local only" if search == 0 else "global + local",
                "optimizer": name, "steps": steps, "design_points": result.search_points,
                "lambda_0": fitted["lambda_0"], "beta": fitted["beta"],
                "lambda_0_error": abs(fitted["lambda_0"] - 0.35), "beta_error": abs(fitted["beta"] - 1.3),
                "w1": numpy_w1(profile, target), "wall_s": seconds,
                "singular_values": " ".join(f"{s:.3g}" for s in report.singular_values),
                "undetermined": " ".join(report.undetermined) or "-",
            })
            row = rows[-1]
            print(f"{row['start']:14} {row['stage']:15} {name:6} {steps:5d} steps  "
                  f"lambda_0 {row['lambda_0']:.4f} beta {row['beta']:.4f}  W1 {row['w1']:.3g}  "
                  f"{seconds:7.1f} s  s = {row['singular_values']}  undetermined: {row['undetermined']}",
                  flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="jaxroll steps at N = 256")
    parser.add_argument("--long-steps", type=int, default=1000, help="jaxroll steps at N = 16384")
    parser.add_argument("--long-n", type=int, default=16384)
    parser.add_argument("--scipy-evaluations", type=int, default=3)
    parser.add_argument("--scipy-iterations", type=int, default=0,
                        help="run L-BFGS-B for real for this many iterations (0: estimate from evaluations)")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--part", choices=("speed", "recovery", "all"), default="all")
    parser.add_argument("--adam-steps", type=int, default=3000, help="recovery: Adam steps (the issue's call)")
    parser.add_argument("--lbfgs-steps", type=int, default=60, help="recovery: L-BFGS steps")
    parser.add_argument("--csv", type=Path, default=Path(__file__).parent / "results" / "fit.csv")
    arguments = parser.parse_args()

    if arguments.part in ("recovery", "all"):
        recovery(arguments.adam_steps, arguments.lbfgs_steps, arguments.csv.with_name("fit_recovery.csv"))
    if arguments.part == "recovery":
        return
    start = jaxroll.published.load("bloom-176b")
    content = jaxroll.published.load("bloom-176b", content="all")
    rows = []
    n = 256
    with jax.enable_x64(True):
        target = np.asarray(jaxroll.influence(content, n), dtype=np.float64)
        # Correctness before timing: the baseline's loss is jaxroll's loss.
        jax_start = float(jaxroll.metrics.wasserstein(jaxroll.influence(start, n), target))
    numpy_start = numpy_w1(numpy_influence(np.asarray(start.lambdas), np.asarray(start.alibi_slopes),
                                           np.asarray(start.diagonal_scores), n), target)
    assert abs(jax_start - numpy_start) < 1e-10, (jax_start, numpy_start)

    rows.append(time_scipy(start, target, n, arguments.scipy_evaluations, arguments.scipy_iterations))
    if not arguments.skip_dense:
        rows.append(time_jaxroll(start, target, n, "dense", arguments.steps))
    rows.append(time_jaxroll(start, target, n, "structured", arguments.steps))
    long_target = np.asarray(jaxroll.influence(content, arguments.long_n, method="structured"),
                             dtype=np.float64)
    long_target /= long_target.sum()
    rows.append(time_jaxroll(start, long_target, arguments.long_n, "structured", arguments.long_steps))

    baseline = rows[0]["per_step_s"]
    for row in rows:
        row["ratio_vs_scipy"] = baseline / row["per_step_s"] if row["n"] == n else float("nan")
    columns = ["tool", "n", "steps", "compile_s", "run_s", "per_step_s", "ratio_vs_scipy",
               "w1_start", "w1_end"]
    print(f"BLOOM-176B (T=70, H=112), free lambdas + per-layer content, loss W1/(N-1); "
          f"JAX {jax.__version__}, {jax.devices()[0].platform}, float32 for jaxroll")
    print(" | ".join(f"{c:>12}" if c != "tool" else f"{c:34}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, float("nan"))
            cells.append(f"{v:34}" if c == "tool" else f"{v:12d}" if isinstance(v, int) else f"{v:12.4g}")
        print(" | ".join(cells))
    print("scipy per_step_s is one finite-difference gradient (141 NumPy evaluations at "
          f"{rows[0]['per_evaluation_s']:.3g} s each) unless --scipy-iterations ran it.")
    arguments.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(arguments.csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns + ["per_evaluation_s"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {arguments.csv}")


if __name__ == "__main__":
    main()
