"""Benchmark of `jaxroll.fit` and `fit_kernel` defaults (issues 13 and 20).

Part "recovery" (issue 20's first target): the README's recovery case, the
MPT-7B-like geometry (T = 32, H = 32, standard ALiBi slopes, no content,
N = 256), target the NumPy profile of power_decay(0.35, 1.3), started from
constant(0.1), ``schedule="power_decay"``, float64. Rows, in one process:
the new default (`jaxroll.fit` with nothing else: design + L-BFGS from 3
points until converged) and the old default (Adam, cosine decay, 3000 steps,
tolerances 0 so it runs them all). wall_s includes compilation (the new
default runs first and so also pays the compilation of the design and the
identifiability report, which both share); the new default is called a
second time for the run alone (rerun_s).

Part "grid": the 16 power-decay truths x 2 starts of tests/test_fit_recovery.py
with the defaults; per fit: wall time (the first fit of each (N, H) block
includes its compilation), steps, converged, recovered (lambda_0, beta), W1
of the fitted profile by the NumPy rollout below. Prints the median time per
fit and every case that fails the acceptance (|error| <= 1e-2, W1 <= 1e-6).

Part "kernel": fit_kernel on the 12 power-kernel truths of the tests (one
layer each, N = 64), defaults (L-BFGS) against the old default (Adam 2000
steps, tolerances 0).

Part "speed": BLOOM-176B (published no_content, T = 70, H = 112), free
lambdas and per-layer content (140 parameters: Adam), target the
all_content profile, N = 256, structured kernels: the default fit (stops by
convergence, at most --steps) against the same fit with tolerances 0 (runs
all --steps).

Writes results/fit_<part>.csv. Usage:
python benchmarks/fit.py [--part recovery|grid|kernel|speed|all] [--steps 2000]
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import jax
import numpy as np
import optax

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


def _write(rows, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}", flush=True)


def _geometry(num_heads, n, lambdas):
    return jaxroll.RolloutModel.create(num_layers=32, num_heads=num_heads, lambdas=lambdas, sequence_length=n)


def _fit_row(label, model, target, truth, slopes, n, **arguments):
    began = time.perf_counter()
    result = jaxroll.fit(model, target, schedule="power_decay", **arguments)
    seconds = time.perf_counter() - began
    fitted = result.schedule_parameters
    profile = numpy_influence(np.asarray(result.model.lambdas), slopes, np.zeros(slopes.shape), n)
    return {"case": label, "optimizer": result.optimizer, "wall_s": seconds, "steps": result.steps,
            "max_steps": result.max_steps, "converged": result.converged,
            "lambda_0": fitted["lambda_0"], "beta": fitted["beta"],
            "lambda_0_error": abs(fitted["lambda_0"] - truth[0]), "beta_error": abs(fitted["beta"] - truth[1]),
            "w1": numpy_w1(profile, target), "stop_reason": result.stop_reason}


def _show(row) -> None:
    print(f"{row['case']:34} {row['optimizer']:6} {row['wall_s']:8.1f} s  rerun {row.get('rerun_s', float('nan')):7.1f} s"
          f"  steps {row['steps']:5d}  converged {row['converged']!s:5}  lambda_0 {row['lambda_0']:.6f}  "
          f"beta {row['beta']:.6f}  W1 {row['w1']:.2g}", flush=True)


def recovery(adam_steps: int, path: Path) -> None:
    """The README's case: new default against the old default (module docstring)."""
    n, H = 256, 32
    truth = (0.35, 1.3)
    slopes = np.asarray(_geometry(H, n, 0.5).alibi_slopes)
    target = numpy_influence(schedules.power_decay(*truth, 32), slopes, np.zeros(slopes.shape), n)
    start = _geometry(H, n, schedules.constant(0.1, 32))
    from jaxroll.fitting import default_optimizer

    old = dict(optimizer=default_optimizer(adam_steps), steps=adam_steps, restarts=1,
               gradient_tolerance=0.0, loss_tolerance=0.0)
    rows = []
    with jax.enable_x64(True):
        for label, arguments in (("new default", {}), (f"old default (Adam {adam_steps})", old)):
            row = _fit_row(label, start, target, truth, slopes, n, **arguments)
            if not arguments:  # the old default's rerun would take minutes more: the new one's only
                row["rerun_s"] = _fit_row(label, start, target, truth, slopes, n, **arguments)["wall_s"]
            rows.append(row)
            _show(row)
    print(f"ratio old / new (wall incl. compilation): {rows[1]['wall_s'] / rows[0]['wall_s']:.1f}")
    _write(rows, path)


GRID = {
    (128, 8): [(0.2, 1.0), (0.6, 0.4), (0.9, 2.0), (0.35, 1.3)],
    (128, 32): [(0.9, 0.0), (0.1, 0.0), (0.5, 2.0), (0.75, 0.6)],
    (256, 8): [(0.3, 0.0), (0.9, 1.0), (0.1, 2.0), (0.6, 1.5)],
    (256, 32): [(0.6, 0.0), (0.35, 1.3), (0.1, 0.5), (0.8, 1.8)],
}


def grid(path: Path, blocks) -> None:
    """The grid of tests/test_fit_recovery.py with the defaults (module docstring)."""
    rows = []
    with jax.enable_x64(True):
        for (n, H), truths in GRID.items():
            if blocks and f"{n}x{H}" not in blocks:
                continue
            slopes = np.asarray(_geometry(H, n, 0.5).alibi_slopes)
            for truth in truths:
                target = numpy_influence(schedules.power_decay(*truth, 32), slopes, np.zeros(slopes.shape), n)
                for start in (0.05, 0.9):
                    row = _fit_row(f"N={n} H={H} {truth} from {start}", _geometry(H, n, start), target, truth,
                                   slopes, n)
                    row["first_of_block"] = not any(r["case"].startswith(f"N={n} H={H} ") for r in rows)
                    rows.append(row)
                    _show(row)
    times = [r["wall_s"] for r in rows]
    warm = [r["wall_s"] for r in rows if not r["first_of_block"]]
    print(f"grid: {len(rows)} fits, median {np.median(times):.1f} s per fit (incl. the first of each block, "
          f"which compiles), median {np.median(warm):.1f} s without those")
    failed = [r for r in rows if not (r["converged"] and r["lambda_0_error"] <= 1e-2
                                      and r["beta_error"] <= 1e-2 and r["w1"] <= 1e-6)]
    print(f"cases outside the acceptance with the defaults: {len(failed)}")
    for r in failed:
        print(f"  {r['case']}: {r['stop_reason']}; errors {r['lambda_0_error']:.2g}, {r['beta_error']:.2g}, "
              f"W1 {r['w1']:.2g}")
    _write(rows, path)


def kernel(path: Path) -> None:
    """fit_kernel on the power family, new default against Adam 2000 steps."""
    from jaxroll.fitting.kernel_fit import fit_kernel
    from jaxroll.kernel_types import DenseKernel

    truths = [(0.05, 0.5, 0.0), (0.9, 1.3, 0.0), (1.5, 0.8, 0.0), (2.0, 2.0, 0.0), (0.05, 2.0, 0.0),
              (0.3, 1.0, 0.0), (0.05, 0.5, 1.5), (0.9, 1.3, -1.0), (1.5, 0.8, 2.0), (2.0, 0.5, 2.0),
              (0.2, 2.0, -2.0), (0.6, 1.6, 1.0)]
    n = 64
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    offsets = np.where(j <= i, i - j, 0).astype(np.float64)

    def dense(m, alpha, d):
        scores = np.where(j <= i, -m * offsets ** alpha + d * (i == j), -np.inf)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        return weights / weights.sum(axis=1, keepdims=True)

    truth = np.array(truths)
    model = jaxroll.KernelRolloutModel.create(kernel=DenseKernel.create(np.stack([dense(*t) for t in truths])),
                                              lambdas=np.full(len(truths), 0.5))
    rows = []
    with jax.enable_x64(True):
        for label, arguments in (("new default", {}), ("old default (Adam 2000)", dict(
                optimizer=optax.adam(optax.cosine_decay_schedule(0.1, 2000)), gradient_tolerance=0.0,
                loss_tolerance=0.0))):
            timings = []
            for _ in range(2):
                began = time.perf_counter()
                result = fit_kernel(model, **arguments)
                timings.append(time.perf_counter() - began)
            fitted = result.model.kernel
            error = np.maximum(np.abs(np.asarray(fitted.slopes)[:, 0] / truth[:, 0] - 1),
                               np.abs(np.asarray(fitted.exponents)[:, 0] / truth[:, 1] - 1))
            rows.append({"case": label, "wall_s": timings[0], "rerun_s": timings[1],
                         "steps_max": int(result.steps.max()), "steps_median": float(np.median(result.steps)),
                         "converged": result.converged, "worst_relative_error": float(error.max()),
                         "worst_truth": str(truths[int(error.argmax())])})
            print(rows[-1], flush=True)
    _write(rows, path)


def speed(steps: int, path: Path) -> None:
    """BLOOM-176B free lambdas + per-layer content: converged vs all steps."""
    start = jaxroll.published.load("bloom-176b")
    content = jaxroll.published.load("bloom-176b", content="all")
    n = 256
    rows = []
    with jax.enable_x64(True):
        target = np.asarray(jaxroll.influence(content, n), dtype=np.float64)
        # Correctness before timing: the NumPy loss is jaxroll's loss at the start.
        jax_start = float(jaxroll.metrics.wasserstein(jaxroll.influence(start, n), target))
        numpy_start = numpy_w1(numpy_influence(np.asarray(start.lambdas), np.asarray(start.alibi_slopes),
                                               np.asarray(start.diagonal_scores), n), target)
        assert abs(jax_start - numpy_start) < 1e-10, (jax_start, numpy_start)
        arguments = dict(fit=("lambdas", "diagonal_scores"), steps=steps, n=n, method="structured")
        for label, extra in (("default (stops when converged)", {}),
                             (f"all {steps} steps (tolerances 0)", dict(gradient_tolerance=0.0, loss_tolerance=0.0))):
            began = time.perf_counter()
            result = jaxroll.fit(start, target, **arguments, **extra)
            seconds = time.perf_counter() - began
            rows.append({"case": label, "optimizer": result.optimizer, "wall_s": seconds, "steps": result.steps,
                         "converged": result.converged, "w1_start": result.initial_loss,
                         "w1_end": result.final_loss, "stop_reason": result.stop_reason})
            print(rows[-1], flush=True)
    _write(rows, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("recovery", "grid", "kernel", "speed", "all"), default="all")
    parser.add_argument("--adam-steps", type=int, default=3000, help="recovery: the old default's Adam steps")
    parser.add_argument("--steps", type=int, default=2000, help="speed: the step limit")
    parser.add_argument("--blocks", nargs="*", default=[], help="grid: only these blocks, e.g. 128x8 256x32")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    arguments = parser.parse_args()
    print(f"JAX {jax.__version__}, {jax.devices()[0].platform}, float64", flush=True)
    if arguments.part in ("recovery", "all"):
        recovery(arguments.adam_steps, arguments.results / "fit_recovery.csv")
    if arguments.part in ("grid", "all"):
        grid(arguments.results / "fit_grid.csv", arguments.blocks)
    if arguments.part in ("kernel", "all"):
        kernel(arguments.results / "fit_kernel.csv")
    if arguments.part in ("speed", "all"):
        speed(arguments.steps, arguments.results / "fit_speed.csv")


if __name__ == "__main__":
    main()
