"""The engine rows of issue 33 on one accelerator, inside a time budget, with PyTorch baselines in the same process.

Rows (each timed after a compiling call; "warm" is the median of a few calls):

- ``forward``: `jaxroll.influence` of BLOOM-176B (T = 70, H = 112) at
  N = 256 .. 2^20, float32 and float64.
- ``grad/forward``: ``jax.grad`` of the Wasserstein-1 distance of the
  profile to the uniform one, over the model, divided by the forward pass, at
  N = 65,536 and 2^20 (float32).
- ``published``: the 33 published rollout configurations (package data),
  the sum of their warm `influence` times, float64.
- ``krylov sweep``: a lambda_0 x beta grid (the Krylov path) of 10^5 and 10^6
  points at N = 256 and 2048, float32: points per second of a second call
  with new values (compiled by the first).
- ``vmap sweep``: a temperature axis (the general path), N = 256 and 2048:
  the points are what fits the section's share of the budget (measured rate
  of a calibration call), at most 10^6.
- ``torch last row``: a PyTorch rollout of the last row with one shared
  kernel (the head-mixed causal softmax kernel built once, then T
  vector-matrix products), N = 256, 2048, 8192.
- ``torch full P_T``: the authors' algorithm: the full ``P_T = R_T ... R_1``
  by T dense (N, N) matrix products, the kernel built per layer, N = 256,
  2048, 8192.

Every case estimates its cost from the one before it (the same case at a
smaller size) and is skipped, with the reason in its ``note``, when it would
not fit what is left of the budget; each section gets a share of the budget
(unused time carries over). `engine_rows(budget_s)` returns the rows;
run alone it prints them as a table::

    python3 benchmarks/gpu_engine.py --budget 200          # on the GPU
    python3 benchmarks/gpu_engine.py --quick --budget 60    # small sizes, any machine
    python3 benchmarks/gpu_engine.py --cpu-targets          # issue 33's CPU target rows (minutes)
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout's jaxroll, run from anywhere
    sys.path.insert(0, str(ROOT))

import jaxroll  # noqa: E402

COLUMNS = ["section", "case", "N", "dtype", "points", "seconds", "compile_seconds", "rate", "ratio", "note"]
SHARES = {"forward": 0.15, "published": 0.15, "grad/forward": 0.17, "krylov sweep": 0.18, "torch": 0.2,
          "vmap sweep": 0.15}
"""Each section's share of the budget, in the order they run."""


class Budget:
    """A wall-clock budget split into section shares; time a section leaves unused goes to the next ones."""

    def __init__(self, seconds: float):
        self.deadline = time.perf_counter() + seconds
        self.section_deadline = self.deadline
        self.shares_left = sum(SHARES.values())

    def left(self) -> float:
        return max(0.0, self.section_deadline - time.perf_counter())

    def start(self, section: str) -> None:
        total_left = max(0.0, self.deadline - time.perf_counter())
        share = SHARES[section] / self.shares_left
        self.shares_left -= SHARES[section]
        self.section_deadline = time.perf_counter() + share * total_left

    def fits(self, estimate: float) -> bool:
        return estimate <= self.left()


def _block(value):
    return jax.block_until_ready(value)


def timed(function, *, repeats: int = 5, most: float = 2.0, reduce=statistics.median) -> tuple[float, float]:
    """(`reduce` (median) of the warm seconds, first-call seconds); stops repeating after `most` seconds."""
    start = time.perf_counter()
    _block(function())
    first = time.perf_counter() - start
    times = []
    repeats = 1 if first > most else repeats  # a slow case: one warm call
    while len(times) < repeats and sum(times) < most:
        start = time.perf_counter()
        _block(function())
        times.append(time.perf_counter() - start)
    return reduce(times), first


def interleaved(functions: dict, rounds: int) -> dict:
    """Least seconds of each function over `rounds` rounds, called in turn (after a warm-up call each):
    on a shared machine the load drifts, and interleaving gives each function the same drift."""
    for function in functions.values():
        _block(function())
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            start = time.perf_counter()
            _block(function())
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def skipped(row: dict, estimate: float, budget: Budget) -> dict:
    return {**row, "note": f"skipped: estimated {estimate:.1f} s, {budget.left():.1f} s left in this section"}


def _x64(flag: bool) -> None:
    jax.config.update("jax_enable_x64", flag)


def _model(n: int):
    return jaxroll.presets.get("bloom-176b", n)


# ------------------------------------------------------------------ jaxroll


def forward_rows(sizes, budget: Budget, forward_times: dict) -> list[dict]:
    rows = []
    for dtype in ("float32", "float64"):
        _x64(dtype == "float64")
        estimate = 5.0
        for n in sizes:
            row = {"section": "forward", "case": "bloom-176b influence", "N": n, "dtype": dtype}
            if not budget.fits(estimate):
                rows.append(skipped(row, estimate, budget))
                continue
            model = _model(n)
            start = time.perf_counter()
            warm, first = timed(lambda: jaxroll.influence(model, n))
            elapsed = time.perf_counter() - start
            forward_times[(n, dtype)] = warm
            rows.append({**row, "seconds": warm, "compile_seconds": first - warm, "note": ""})
            estimate = elapsed + 8 * warm * 4  # the next size: at most 4x the work, and a compilation
    _x64(False)
    return rows


def grad_rows(sizes, budget: Budget) -> list[dict]:
    rows = []
    estimate = 15.0
    for n in sizes:
        row = {"section": "grad/forward", "case": "bloom-176b grad W1 / forward", "N": n, "dtype": "float32"}
        if not budget.fits(estimate):
            rows.append(skipped(row, estimate, budget))
            continue
        model = _model(n)
        target = jax.numpy.full(n, 1.0 / n)
        forward = jax.jit(lambda m: jaxroll.influence(m, n))
        loss = lambda m: jaxroll.metrics.wasserstein(jaxroll.influence(m, n), target)  # noqa: E731
        gradient = jax.jit(jax.grad(loss))
        start = time.perf_counter()
        forward_s, _ = timed(lambda: forward(model), repeats=3)
        grad_s, first = timed(lambda: gradient(model), repeats=3)
        # Where a gradient's time goes: the backward pass alone (the pullback of a linearisation
        # made beforehand), so forward-under-grad = grad - backward.
        pullback = jax.jit(jax.vjp(loss, model)[1])
        backward_s, _ = timed(lambda: pullback(jax.numpy.ones((), target.dtype)), repeats=3)
        elapsed = time.perf_counter() - start
        rows.append({**row, "seconds": grad_s, "compile_seconds": first - grad_s, "ratio": grad_s / forward_s,
                     "note": f"forward {forward_s * 1e3:.3g} ms; backward pass alone {backward_s * 1e3:.3g} ms"})
        # The next size: 16x the positions, three warm calls, and a compilation like this one.
        estimate = 3 * 16 * grad_s + 2 * (first - grad_s)
    return rows


def published_rows(budget: Budget) -> list[dict]:
    _x64(True)
    files = sorted((ROOT / "jaxroll" / "data" / "published" / "rollout").rglob("*.yaml"))
    row = {"section": "published", "case": f"{len(files)} published configs, warm sum", "dtype": "float64"}
    total, content, short, done, short_files = 0.0, 0.0, 0.0, 0, 0
    for path in files:
        if budget.left() < 3.0:
            break
        model = jaxroll.load_config(path)
        warm, _ = timed(lambda: jaxroll.influence(model), repeats=7, most=0.5, reduce=min)
        total += warm
        content += warm if "all_content" in str(path) else 0.0
        if "_2048" not in str(path):  # the paper's N = 256 set (issue 33's "33 published configurations")
            short += warm
            short_files += 1
        done += 1
    _x64(False)
    note = f"all-content files {content * 1e3:.3g} ms of it; the {short_files} files outside *_2048: {short * 1e3:.3g} ms"
    if done < len(files):
        note += f"; only {done} of {len(files)} fitted the budget"
    return [{**row, "N": "each file's", "points": done, "seconds": total, "note": note}]


def _grid(points: int, scale: float = 1.0):
    side = max(1, int(round(math.sqrt(points))))
    return list(np.linspace(0.1, 1.0, side) * scale), list(np.linspace(0.25, 2.0, side))


def krylov_rows(sizes, counts, budget: Budget) -> list[dict]:
    rows = []
    rate = None  # points per second at `measured_n`, from the last case
    measured_n = sizes[0]
    for n in sizes:
        for points in counts:
            row = {"section": "krylov sweep", "case": "bloom-176b lambda_0 x beta", "N": n, "dtype": "float32",
                   "points": points}
            estimate = 10.0 if rate is None else 2.2 * points / rate * (n / measured_n) + 5.0  # two calls
            if not budget.fits(estimate):
                rows.append(skipped(row, estimate, budget))
                continue
            model = _model(n)
            stream = points * n * 4 > 4 * 2**30  # beyond 4 GiB of profiles, to disk per chunk
            with tempfile.TemporaryDirectory() as directory:
                def run(scale, name):
                    lambda_0, beta = _grid(points, scale)
                    target = os.path.join(directory, name) if stream else None
                    return jaxroll.sweep(model, lambda_0=lambda_0, beta=beta, progress=False, stream_to=target)

                start = time.perf_counter()
                run(1.0, "first.npy")
                first = time.perf_counter() - start
                start = time.perf_counter()
                result = run(0.99, "second.npy")
                warm = time.perf_counter() - start
            count = result.table["total_mixing"].shape[0]
            rows.append({**row, "points": count, "seconds": warm, "compile_seconds": first - warm,
                         "rate": count / warm, "note": f"batch {result.batch_size}" + (", streamed" if stream else "")})
            rate, measured_n = count / warm, n
    return rows


def vmap_rows(sizes, most_points: int, budget: Budget) -> list[dict]:
    """Points per second of the general path at the device's own chunk size, as many points as fit.

    A calibration at 64 points per chunk gives the time per point (an upper
    bound: larger chunks use the device better); the timed sweep uses the
    chunk size `jaxroll.sweep` picks for the device (`chunk_budget`), cut to
    what fits, compiled by a first one-chunk call.
    """
    from jaxroll.sweeps.plan import _plan

    rows = []
    for position, n in enumerate(sizes):
        row = {"section": "vmap sweep", "case": "bloom-176b temperature", "N": n, "dtype": "float32"}
        share = budget.left() / (len(sizes) - position)
        if share < 10.0:
            rows.append(skipped(row, 10.0, budget))
            continue
        started = time.perf_counter()
        model = _model(n)
        values = lambda count, low=0.5: list(np.linspace(low, 2.0, count))  # noqa: E731
        natural = _plan(model, {"temperature": values(most_points)}, None, False, None, None).batch_size
        small = min(natural, 64)
        jaxroll.sweep(model, temperature=values(small), batch_size=small, progress=False)
        start = time.perf_counter()
        jaxroll.sweep(model, temperature=values(small, 0.4), batch_size=small, progress=False)
        per_point = (time.perf_counter() - start) / small
        spend = share - (time.perf_counter() - started)
        fit = int(0.4 * spend / per_point)  # a compiling call of one chunk, then the timed one
        batch = max(small, min(natural, fit))
        points = min(most_points, max(batch, fit // batch * batch))
        if spend < 4 * small * per_point:
            rows.append(skipped(row, 4 * small * per_point, budget))
            continue
        jaxroll.sweep(model, temperature=values(batch), batch_size=batch, progress=False)
        start = time.perf_counter()
        result = jaxroll.sweep(model, temperature=values(points, 0.4), batch_size=batch, progress=False)
        warm = time.perf_counter() - start
        rows.append({**row, "points": points, "seconds": warm, "rate": points / warm,
                     "note": f"batch {result.batch_size} (device-sized: {natural}); points sized to the budget "
                             "(target 10^5-10^6)"})
    return rows


# ------------------------------------------------------------------ PyTorch baselines


def _torch_parts(model, n: int, torch, device, dtype):
    """BLOOM-176B's arrays on `device` and the head-mixed causal kernel of layer t (heads in chunks)."""
    slopes = torch.tensor(np.asarray(model.alibi_slopes), dtype=dtype, device=device)
    content = torch.tensor(np.asarray(model.diagonal_scores), dtype=dtype, device=device)
    weights = torch.tensor(np.asarray(model.head_weights), dtype=dtype, device=device)
    weights = weights / weights.sum(-1, keepdim=True)
    lambdas = torch.tensor(np.asarray(model.lambdas), dtype=dtype, device=device)
    tau = float(model.temperature)
    positions = torch.arange(n, device=device)
    offsets = (positions[:, None] - positions[None, :]).to(dtype)
    eye = torch.eye(n, dtype=dtype, device=device)
    future = offsets < 0
    chunk = max(1, min(slopes.shape[1], (2**28) // (n * n)))  # (chunk, n, n) scores at most 1 GiB in float32

    def kernel(t):
        mixed = torch.zeros((n, n), dtype=dtype, device=device)
        for h in range(0, slopes.shape[1], chunk):
            scores = (-slopes[t, h:h + chunk, None, None] * offsets + content[t, h:h + chunk, None, None] * eye) / tau
            scores = scores.masked_fill(future, float("-inf"))
            mixed += torch.einsum("h,hij->ij", weights[t, h:h + chunk], torch.softmax(scores, dim=-1))
        return mixed

    return lambdas, kernel, eye


def torch_rows(sizes, budget: Budget, forward_times: dict) -> list[dict]:
    try:
        import torch
    except ImportError:
        return [{"section": "torch", "case": "PyTorch baselines", "note": "skipped: torch is not installed"}]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for case in ("last row, one shared kernel", "authors' full P_T"):
        estimate = 5.0
        for n in sizes:
            row = {"section": "torch", "case": f"torch {case} ({device})", "N": n, "dtype": "float32"}
            if not budget.fits(estimate):
                rows.append(skipped(row, estimate, budget))
                continue
            model = _model(n)
            lambdas, kernel, eye = _torch_parts(model, n, torch, device, torch.float32)

            def last_row():
                with torch.no_grad():
                    shared = kernel(0)  # one kernel in every layer (the preset)
                    row_vector = torch.zeros(n, dtype=torch.float32, device=device)
                    row_vector[-1] = 1.0
                    for t in reversed(range(len(lambdas))):
                        row_vector = (1 - lambdas[t]) * row_vector + lambdas[t] * (row_vector @ shared)
                    sync()
                    return row_vector / row_vector.sum()

            def full():
                with torch.no_grad():
                    product = eye.clone()
                    for t in range(len(lambdas)):  # P_t = R_t P_{t-1}, R_t = (1 - lambda_t) I + lambda_t A_t
                        product = (1 - lambdas[t]) * product + lambdas[t] * (kernel(t) @ product)
                    sync()
                    return product[-1] / product[-1].sum()

            function = last_row if case.startswith("last") else full
            start = time.perf_counter()
            warm, first = timed(function, repeats=3, most=5.0)
            elapsed = time.perf_counter() - start
            ours = forward_times.get((n, "float32"))
            rows.append({**row, "seconds": warm,
                         "ratio": warm / ours if ours else "",
                         "note": "ratio: torch / jaxroll forward at this N" if ours else ""})
            # The next N (x8, then x4): the kernels are O(H N^2) (the matmuls of the full P_T grow as
            # N^3, but below N ~ 8192 the kernels and the launches dominate on a GPU).
            estimate = elapsed * (8 if n < 2048 else 4) ** 2
    return rows


# ------------------------------------------------------------------ the CPU targets of issue 33

_SWEEP_CHILD = """
import resource, sys, time
import numpy as np
sys.path.insert(0, {root!r})
import jaxroll
model = jaxroll.presets.get("bloom-176b", 256)
side = {side}
def run(scale):
    start = time.perf_counter()
    jaxroll.sweep(model, lambda_0=list(np.linspace(0.1, 1.0, side) * scale),
                  beta=list(np.linspace(0.25, 2.0, side)), progress=False)
    return time.perf_counter() - start
first = run(1.0)
warm = min(run(0.99), run(0.98))
print(side * side, first, warm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def cpu_target_rows() -> list[dict]:
    """The CPU rows of issue 33's target table, float64 where the issue says so, in this one process
    (the sweep in a child process of its own, so that its peak resident memory is its own).

    Small-N times are the least of their repeats (the machine is shared); the
    gradient and its forward pass are timed in turn, round by round, least of 5.
    """
    import subprocess

    rows = []
    side = 317  # 100,489 points
    output = subprocess.run([sys.executable, "-c", _SWEEP_CHILD.format(root=str(ROOT), side=side)],
                            capture_output=True, text=True, check=True).stdout.split()
    points, first, warm, rss = int(output[0]), float(output[1]), float(output[2]), int(output[3])
    rows.append({"section": "krylov sweep", "case": "bloom-176b lambda_0 x beta, own process", "N": 256,
                 "dtype": "float32", "points": points, "seconds": warm, "compile_seconds": first - warm,
                 "rate": points / warm, "note": f"peak RSS {rss / 2**30:.2f} GiB (target >= 50,000/s, <= 4 GiB)"})
    _x64(True)
    model = jaxroll.published.load("bloom-176b", content="all")
    warm, first = timed(lambda: jaxroll.influence(model, 256), repeats=20, most=3.0, reduce=min)
    rows.append({"section": "content", "case": "bloom-176b all-content influence", "N": 256, "dtype": "float64",
                 "seconds": warm, "compile_seconds": first - warm, "note": "target <= 5 ms"})
    budget = Budget(1e9)
    budget.start("published")
    rows += [{**row, "note": row["note"] + "; target <= 60 ms"} for row in published_rows(budget)]
    _x64(False)
    for name in ("bloom-176b", "mpt-7b"):
        for n in (4096, 65536):
            model = jaxroll.presets.get(name, n)
            target = jax.numpy.full(n, 1.0 / n)
            forward = jax.jit(lambda m, n=n: jaxroll.influence(m, n))
            gradient = jax.jit(jax.grad(lambda m, n=n, target=target:
                                        jaxroll.metrics.wasserstein(jaxroll.influence(m, n), target)))
            times = interleaved({"forward": lambda: forward(model), "grad": lambda: gradient(model)}, 5)
            forward_s, grad_s = times["forward"], times["grad"]
            rows.append({"section": "grad/forward", "case": f"{name} grad W1 / forward", "N": n,
                         "dtype": "float32", "seconds": grad_s, "ratio": grad_s / forward_s,
                         "note": f"forward {forward_s * 1e3:.3g} ms; target <= 3x"})
    return rows


# ------------------------------------------------------------------ the table


def engine_rows(budget_s: float, quick: bool = False) -> list[dict]:
    """The engine rows of issue 33, every case skipped (and said so) that would not fit `budget_s` seconds.

    `quick`: small sizes (any machine, a minute). Float32 and float64 are
    switched with ``jax_enable_x64`` between sections; the process is left
    with float64 off.
    """
    budget = Budget(budget_s)
    if quick:
        forward_sizes, grad_sizes = [256, 1024], [1024]
        sweep_sizes, counts, vmap_most, torch_sizes = [256], [1000, 10000], 2000, [256, 512]
    else:
        forward_sizes = [256, 2048, 8192, 65536, 2**18, 2**20]
        grad_sizes = [65536, 2**20]
        sweep_sizes, counts, vmap_most, torch_sizes = [256, 2048], [10**5, 10**6], 10**6, [256, 2048, 8192]
    forward_times: dict = {}
    rows = []
    sections = (("forward", lambda: forward_rows(forward_sizes, budget, forward_times)),
                ("published", lambda: published_rows(budget)),
                ("grad/forward", lambda: grad_rows(grad_sizes, budget)),
                ("krylov sweep", lambda: krylov_rows(sweep_sizes, counts, budget)),
                ("torch", lambda: torch_rows(torch_sizes, budget, forward_times)),
                ("vmap sweep", lambda: vmap_rows(sweep_sizes, vmap_most, budget)))
    for name, section in sections:
        budget.start(name)
        try:
            new = section()
        except Exception as error:  # one failed section (e.g. out of memory) keeps the others' rows
            message = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
            new = [{"section": name, "note": f"failed: {type(error).__name__}: {message}"}]
        for row in new:  # printed as it comes, so a later crash keeps the earlier rows
            print("  " + ", ".join(f"{key} {_format(value)}" for key, value in row.items()), flush=True)
        rows += new
    device = jax.devices()[0]
    for row in rows:
        row.setdefault("device", f"{device.platform}:{device.device_kind}")
    return rows


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for every row together")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a CPU")
    parser.add_argument("--cpu-targets", action="store_true",
                        help="instead: the CPU rows of issue 33's target table (no budget; minutes)")
    arguments = parser.parse_args(argv)
    start = time.perf_counter()
    rows = cpu_target_rows() if arguments.cpu_targets else engine_rows(arguments.budget, arguments.quick)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, jax {jax.__version__}, "
          f"{jax.devices()[0].device_kind}, budget {arguments.budget:g} s, "
          f"took {time.perf_counter() - start:.1f} s, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(" | ".join(COLUMNS))
    for row in rows:
        print(" | ".join(_format(row.get(column, "")) for column in COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
