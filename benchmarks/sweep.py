"""Sweep throughput: `jaxroll.sweep` against a Python loop of `jaxroll.influence` calls.

One run prints a table and writes it as CSV. Rows:

- ``schedules``: S power-decay schedules ``lambda_0 / (t+1)^beta`` (a
  lambda_0 x beta grid) on a preset's geometry at length N; profiles per
  second of (a) a loop of `influence` calls, one model per schedule, timed on
  the first `--loop-points` schedules after one compiling call, and (b) one
  `jaxroll.sweep` of all S (the Krylov path), timed on a second call with new
  values after a first, compiling, one. Compile time is the first call minus
  the second. Before timing, the sweep's profiles are checked against the
  loop's on the schedules the loop ran (max abs difference reported).
- ``temperatures``: S softmax temperatures (the general vmap path), same
  baseline.
- ``lengths``: lengths 256, 512, ..., 2^16 in one sweep call (one
  compilation) vs a loop of `influence` at each length (a compilation per
  length) vs a single `influence` at the largest length, each from a cold
  start (compile included) and warm.

Never run in CI. float32 (the default). JAX picks the device.

    python3 benchmarks/sweep.py --out benchmarks/sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import sys
import time
from pathlib import Path

import jax
import numpy as np

import jaxroll
from _common import print_row  # noqa: E402  (benchmarks/ is on sys.path when a script runs)

sweep_module = importlib.import_module("jaxroll.sweeps.evaluate")
COLUMNS = ["case", "model", "N", "points", "method", "seconds", "compile_seconds", "profiles_per_second",
           "ratio", "max_abs_difference", "compilations"]


def grid(points: int):
    """A lambda_0 x beta grid of `points` power-decay schedules (points a square)."""
    side = int(round(points ** 0.5))
    return np.linspace(0.1, 1.0, side), np.linspace(0.25, 2.0, points // side)


def loop_rate(model, n, schedules_or_models, count):
    """Profiles per second of a loop of influence calls (one compiling call first), and the profiles."""
    jax.block_until_ready(jaxroll.influence(schedules_or_models[0], n))
    start = time.perf_counter()
    profiles = [np.asarray(jaxroll.influence(m, n)) for m in schedules_or_models[:count]]
    seconds = time.perf_counter() - start
    return count / seconds, seconds, np.stack(profiles)


def timed_sweep(model, first_axes, second_axes, **kwargs):
    """(seconds of a warm call, compile seconds, result of the warm call)."""
    start = time.perf_counter()
    jaxroll.sweep(model, **first_axes, progress=False, **kwargs)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    result = jaxroll.sweep(model, **second_axes, progress=False, **kwargs)
    warm = time.perf_counter() - start
    return warm, max(cold - warm, 0.0), result


def schedule_case(name, n, points, loop_points):
    model = jaxroll.presets.get(name, n)
    lambda_0, beta = grid(points)
    models = [dataclasses.replace(model, lambdas=jaxroll.schedules.power_decay(a, b, model.num_layers))
              for a in lambda_0 * 0.99 for b in beta]
    rate, loop_seconds, looped = loop_rate(model, n, models, min(loop_points, len(models)))
    warm, compile_seconds, result = timed_sweep(model, {"lambda_0": list(lambda_0), "beta": list(beta)},
                                                {"lambda_0": list(lambda_0 * 0.99), "beta": list(beta)})
    swept = result.profiles.reshape(-1, n)[: len(looped)]
    difference = float(np.max(np.abs(swept - looped)))
    sweep_rate = len(models) / warm
    base = {"case": "schedules", "model": name, "N": n, "points": len(models)}
    return [
        {**base, "method": "loop of influence", "seconds": loop_seconds, "profiles_per_second": rate,
         "points": len(looped), "ratio": 1.0},
        {**base, "method": f"sweep ({result.method})", "seconds": warm, "compile_seconds": compile_seconds,
         "profiles_per_second": sweep_rate, "ratio": sweep_rate / rate, "max_abs_difference": difference},
    ]


def temperature_case(name, n, points, loop_points):
    model = jaxroll.presets.get(name, n)
    temperatures = list(np.linspace(0.5, 2.0, points))
    models = [dataclasses.replace(model, temperature=np.asarray(t)) for t in temperatures]
    rate, loop_seconds, looped = loop_rate(model, n, models, min(loop_points, points))
    warm, compile_seconds, result = timed_sweep(model, {"temperature": [t * 1.01 for t in temperatures]},
                                                {"temperature": temperatures})
    difference = float(np.max(np.abs(result.profiles[: len(looped)] - looped)))
    sweep_rate = points / warm
    base = {"case": "temperatures", "model": name, "N": n, "points": points}
    return [
        {**base, "method": "loop of influence", "seconds": loop_seconds, "profiles_per_second": rate,
         "points": len(looped), "ratio": 1.0},
        {**base, "method": f"sweep ({result.method})", "seconds": warm, "compile_seconds": compile_seconds,
         "profiles_per_second": sweep_rate, "ratio": sweep_rate / rate, "max_abs_difference": difference},
    ]


def lengths_case(name, largest):
    model = jaxroll.presets.get(name, largest)
    lengths = [2**k for k in range(8, int(np.log2(largest)) + 1)]
    rows, base = [], {"case": "lengths", "model": name, "N": f"{lengths[0]}..{largest}", "points": 1}

    jax.clear_caches()  # every "cold" row below starts without compiled code
    start = time.perf_counter()
    jax.block_until_ready(jaxroll.influence(model, largest))
    single_cold = time.perf_counter() - start
    start = time.perf_counter()
    single = np.asarray(jaxroll.influence(model, largest))
    single_warm = time.perf_counter() - start

    start = time.perf_counter()
    looped = [np.asarray(jaxroll.influence(model, n)) for n in lengths[:-1]] + [single]
    loop_cold = time.perf_counter() - start + single_cold  # each length compiles once; the largest above

    jax.clear_caches()
    functions = [sweep_module._vmapped_profiles, sweep_module._krylov, sweep_module._combine]
    before = sum(f._cache_size() for f in functions)
    start = time.perf_counter()
    result = jaxroll.sweep(model, lengths=lengths, progress=False)
    sweep_cold = time.perf_counter() - start
    compilations = sum(f._cache_size() for f in functions) - before
    start = time.perf_counter()
    jaxroll.sweep(model, lengths=lengths, progress=False)
    sweep_warm = time.perf_counter() - start
    difference = max(float(np.max(np.abs(result.profiles[k, :n] - looped[k]))) for k, n in enumerate(lengths))

    rows.append({**base, "method": f"single influence at N = {largest}", "seconds": single_warm,
                 "compile_seconds": single_cold - single_warm, "ratio": 1.0, "compilations": 1})
    rows.append({**base, "method": "loop of influence, cold (compile per length)", "seconds": loop_cold,
                 "ratio": loop_cold / single_cold, "compilations": len(lengths)})
    rows.append({**base, "method": f"sweep(lengths=...), cold ({result.method})", "seconds": sweep_cold,
                 "ratio": sweep_cold / single_cold, "max_abs_difference": difference,
                 "compilations": compilations})
    rows.append({**base, "method": "sweep(lengths=...), warm", "seconds": sweep_warm,
                 "ratio": sweep_warm / single_warm})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["mpt-7b", "bloom-176b"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 65536])
    parser.add_argument("--points", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--loop-points", type=int, default=64,
                        help="influence calls timed in the loop baseline (at N >= 2^15: a quarter)")
    parser.add_argument("--temperature-points", type=int, default=64,
                        help="points of the general-path row (N = the smallest length only)")
    parser.add_argument("--cases", nargs="+", default=["schedules", "temperatures", "lengths"],
                        choices=["schedules", "temperatures", "lengths"])
    parser.add_argument("--largest-length", type=int, default=65536)
    parser.add_argument("--out", type=Path, default=Path("sweep.csv"))
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    arguments = parser.parse_args(argv)
    if arguments.out.exists() and not arguments.force:
        print(f"sweep.py: error: {arguments.out} exists; pass --force to overwrite", file=sys.stderr)
        return 2
    print(f"devices: {jax.devices()}")
    print(" | ".join(COLUMNS))
    rows = []
    for name in arguments.presets:
        for n in arguments.lengths if "schedules" in arguments.cases else []:
            loop_points = arguments.loop_points if n < 2**15 else max(2, arguments.loop_points // 16)
            for points in arguments.points:
                for row in schedule_case(name, n, points, loop_points):
                    rows.append(row)
                    print_row(row, COLUMNS)
        temperature_rows = temperature_case(
            name, min(arguments.lengths), arguments.temperature_points,
            min(arguments.loop_points, arguments.temperature_points)) if "temperatures" in arguments.cases else []
        for row in temperature_rows:
            rows.append(row)
            print_row(row, COLUMNS)
        for row in lengths_case(name, arguments.largest_length) if "lengths" in arguments.cases else []:
            rows.append(row)
            print_row(row, COLUMNS)
    with open(arguments.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {arguments.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
