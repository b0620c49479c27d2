"""Kernel types: influence time against ALiBi structured, and accuracy against a NumPy oracle.

Speed: for a 32-layer, 32-head geometry (MPT-7B's preset: its lambdas and
ALiBi slopes), the influence profile at each N with

- ``alibi structured``: `RolloutModel`, O(T H N) closed-form products (the baseline);
- ``power fft``: `PowerKernel` with ``f_h(k) = -m_h k^alpha_h``, alpha in [0.5, 1.5];
- ``alibi as power fft``: the same ALiBi kernel through the FFT path (alpha = 1);
- ``table fft``: `TableKernel` with a free table of N - 1 offsets;
- ``dense``: `DenseKernel` (measured-attention type), only where T N^2 fits.

Seconds are the median of repeats after compilation (compile separate); the
ratio is against ``alibi structured`` at the same N, measured in the same run.

Accuracy: every kernel type at N = 256 (T = 4, H = 4, random parameters)
against a plain NumPy float64 dense rollout written here; max abs error of
the profile in float64 and float32.

Never run in CI.

    python3 benchmarks/kernels.py --out benchmarks/kernels.csv
"""

from __future__ import annotations

import argparse
import csv

import jax
import numpy as np

import jaxroll
from _common import timed  # noqa: E402  (benchmarks/ is on sys.path when a script runs)
from jaxroll import DenseKernel, KernelRolloutModel, PowerKernel, TableKernel


def speed_models(n, rng):
    base = jaxroll.presets.get("mpt-7b")
    T, H = base.num_layers, base.num_heads
    models = {"alibi structured": base}
    models["power fft"] = KernelRolloutModel.create(
        kernel=PowerKernel.create(num_layers=T, num_heads=H, slopes=base.alibi_slopes,
                                  exponents=rng.uniform(0.5, 1.5, (T, H))), lambdas=base.lambdas, sequence_length=n)
    models["alibi as power fft"] = KernelRolloutModel.create(
        kernel=PowerKernel.create(num_layers=T, num_heads=H, slopes=base.alibi_slopes), lambdas=base.lambdas,
        sequence_length=n)
    table = -np.asarray(base.alibi_slopes)[:, :, None] * np.arange(1, n)[None, None, :] ** 0.8
    models["table fft"] = KernelRolloutModel.create(
        kernel=TableKernel.create(num_layers=T, num_heads=H, offset_scores=table), lambdas=base.lambdas,
        sequence_length=n)
    if n <= 1024:
        kernels = np.stack([np.asarray(jaxroll.attention_kernel(base, t, n)) for t in range(T)])
        models["dense"] = KernelRolloutModel.create(kernel=DenseKernel.create(kernels), lambdas=base.lambdas)
    return models


def run_speed(lengths, repeats):
    rows = []
    rng = np.random.default_rng(0)
    for n in lengths:
        models = speed_models(n, rng)
        baseline = None
        for name, model in models.items():
            seconds, compile_seconds = timed(lambda: jaxroll.influence(model, n), repeats)
            baseline = baseline or seconds
            rows.append({"case": name, "N": n, "T": model.num_layers, "H": model.num_heads,
                         "seconds": seconds, "compile_seconds": compile_seconds,
                         "ratio_to_alibi_structured": seconds / baseline})
            print(f"{name:20} N={n:7d} {seconds:9.4f} s  compile {compile_seconds:6.2f} s  "
                  f"x{seconds / baseline:5.2f}", flush=True)
        del models
    return rows


def numpy_relative_kernel(scores, weights):
    n = scores.shape[-1]
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    kernel = np.zeros((n, n))
    for h in range(scores.shape[0]):
        s = np.where(offsets >= 0, scores[h][np.clip(offsets, 0, n - 1)], -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        kernel += weights[h] / weights.sum() * e / e.sum(axis=1, keepdims=True)
    return kernel


def numpy_profile(lambdas, kernels):
    row = np.zeros(kernels[0].shape[0])
    row[-1] = 1.0
    for lam, kernel in reversed(list(zip(lambdas, kernels))):
        row = (1 - lam) * row + lam * (row @ kernel)
    return row / row.sum()


def accuracy_cases(n=256, T=4, H=4):
    rng = np.random.default_rng(1)
    lambdas = rng.uniform(0.2, 0.9, T)
    slopes, exponents = rng.uniform(0, 1, (T, H)), rng.uniform(0.5, 1.5, (T, H))
    diagonal, weights = rng.uniform(-5, 5, (T, H)), rng.uniform(0.1, 1, (T, H))
    k = np.arange(n, dtype=np.float64)
    cases = {}
    power_scores = [np.where(k == 0, diagonal[t][:, None], -slopes[t][:, None] * k ** exponents[t][:, None])
                    for t in range(T)]
    cases["PowerKernel"] = (PowerKernel.create(num_layers=T, num_heads=H, slopes=slopes, exponents=exponents,
                                               diagonal_scores=diagonal, head_weights=weights),
                            [numpy_relative_kernel(power_scores[t], weights[t]) for t in range(T)])
    table = rng.uniform(-3, 3, (T, H, n - 1))
    table_scores = [np.concatenate([diagonal[t][:, None], table[t]], axis=1) for t in range(T)]
    cases["TableKernel"] = (TableKernel.create(num_layers=T, num_heads=H, offset_scores=table,
                                               diagonal_scores=diagonal, head_weights=weights),
                            [numpy_relative_kernel(table_scores[t], weights[t]) for t in range(T)])
    alibi = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=lambdas, alibi_slopes=slopes,
                                        diagonal_scores=diagonal, head_weights=weights, sequence_length=n)
    alibi_scores = [np.where(k == 0, diagonal[t][:, None], -slopes[t][:, None] * k) for t in range(T)]
    cases["AlibiKernel"] = (alibi.kernel,
                            [numpy_relative_kernel(alibi_scores[t], weights[t]) for t in range(T)])
    rising = table.copy()
    rising[:, :, n // 2:] += 30.0  # rises 30 logits above f(1): the exact direct product (issue 19)
    rising_scores = [np.concatenate([diagonal[t][:, None], rising[t]], axis=1) for t in range(T)]
    cases["TableKernel rising 30"] = (TableKernel.create(num_layers=T, num_heads=H, offset_scores=rising,
                                                         diagonal_scores=diagonal, head_weights=weights),
                                      [numpy_relative_kernel(rising_scores[t], weights[t]) for t in range(T)])
    raw = rng.exponential(size=(T, n, n)) * np.tril(np.ones((n, n)))
    dense = raw / raw.sum(-1, keepdims=True)
    cases["DenseKernel"] = (DenseKernel.create(dense), list(dense))
    return lambdas, cases


def run_accuracy():
    lambdas, cases = accuracy_cases()
    rows = []
    for name, (kernel, kernels) in cases.items():
        expected = numpy_profile(lambdas, kernels)
        errors = {}
        for label, x64 in (("float64", True), ("float32", False)):
            with jax.enable_x64(x64):
                model = KernelRolloutModel(lambdas=np.asarray(lambdas, np.float64 if x64 else np.float32),
                                           kernel=jax.tree.map(lambda a: np.asarray(a, np.float64 if x64 else np.float32), kernel),
                                           sequence_length=256)
                errors[label] = float(np.max(np.abs(np.asarray(jaxroll.influence(model), np.float64) - expected)))
        rows.append({"kernel": name, "N": 256, "max_abs_error_float64": errors["float64"],
                     "max_abs_error_float32": errors["float32"]})
        print(f"{name:22} float64 {errors['float64']:.2e}  float32 {errors['float32']:.2e}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,16384,65536", help="comma-separated N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/kernels.csv")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    arguments = parser.parse_args()
    accuracy = [] if arguments.skip_accuracy else run_accuracy()
    speed = [] if arguments.skip_speed else run_speed([int(x) for x in arguments.lengths.split(",")],
                                                      arguments.repeats)
    with open(arguments.out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["section", "case", "N", "T", "H", "seconds", "compile_seconds", "ratio_to_alibi_structured",
                         "max_abs_error_float64", "max_abs_error_float32"])
        for row in speed:
            writer.writerow(["speed", row["case"], row["N"], row["T"], row["H"], f"{row['seconds']:.6g}",
                             f"{row['compile_seconds']:.4g}", f"{row['ratio_to_alibi_structured']:.4g}", "", ""])
        for row in accuracy:
            writer.writerow(["accuracy", row["kernel"], row["N"], 4, 4, "", "", "",
                             f"{row['max_abs_error_float64']:.3g}", f"{row['max_abs_error_float32']:.3g}"])
    print(f"wrote {arguments.out}")


if __name__ == "__main__":
    main()
