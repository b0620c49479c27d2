"""Helpers shared by the benchmark scripts: timing with compilation apart, table rows."""

import statistics
import time

import jax


def timed(function, repeats: int) -> tuple[float, float]:
    """(median seconds of `repeats` calls after the first, seconds of the first call).

    The first call includes compilation; its time is reported apart.
    """
    start = time.perf_counter()
    jax.block_until_ready(function())
    compile_seconds = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(function())
        times.append(time.perf_counter() - start)
    return statistics.median(times), compile_seconds


def fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_row(row: dict, columns) -> None:
    print(" | ".join(fmt(row.get(c, "")) for c in columns), flush=True)


def timed_together(functions: dict, repeats: int) -> dict:
    """Median seconds of each function, calls interleaved round by round after one warm-up call each.

    On a shared machine the load drifts; interleaving gives every function
    the same drift, so ratios measured together are fairer than separate runs.
    """
    for function in functions.values():
        jax.block_until_ready(function())
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            jax.block_until_ready(function())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
