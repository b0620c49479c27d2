"""Whole-process timing: what a user waits for, from `python` starting to its exit.

Every row is a fresh process, timed with ``time.perf_counter`` around
``subprocess.run``; rows alternate within each round so that a change of load
hits them alike, and the table gives the median of the rounds. Three kinds of
process:

- ``today``: the same command on the code before this change (``--today``,
  default /work/main: PYTHONPATH points there), no compilation cache;
- ``new``: this tree, ``cold`` with an empty compilation cache folder of its
  own per run (``JAXROLL_CACHE_DIR``), ``warm`` with a folder filled by one
  untimed run first;
- ``numpy``: the baseline, a plain NumPy float64 dense rollout of the same
  configuration written below (PyYAML with libyaml, one ``(H, N, N)`` kernel
  per layer, the profile and the attention-only profile as `jaxroll rollout`
  computes them, a CSV written; no figure).

Usage: ``python benchmarks/process.py [--rounds 5] [--rounds-33 1] [--numpy-33]``.
Prints a Markdown table and writes benchmarks/process.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PUBLISHED = ROOT / "jaxroll" / "data" / "published" / "rollout"
EXAMPLE = PUBLISHED / "example.yaml"
WORKER = ROOT / "tests" / "cache_worker.py"


# --- the NumPy baseline (a whole process: `python process.py --numpy CONFIG...`) --------------------


def _numpy_rollout(paths: list[str], out: str) -> None:
    import numpy as np
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for index, path in enumerate(paths):
        with open(path, encoding="utf-8") as handle:
            config = yaml.load(handle.read().replace("\t", " "), Loader=loader)
        layers = config["num_layers"]
        attention = config["attention_config"]
        heads = attention["num_heads"]
        n = config.get("sequence_length", 256)
        schedule = config["lambda_schedule_config"]
        if schedule["schedule_type"] == "constant":
            lambdas = np.full(layers, schedule["lambda_const"], dtype=np.float64)
        elif schedule["schedule_type"] == "power_decay":
            lambdas = schedule["lambda_0"] / (np.arange(layers) + 1.0) ** schedule["beta"]
        else:
            lambdas = np.asarray(schedule["lambdas_custom"], dtype=np.float64)
        lambdas = np.clip(lambdas, 0, 1)

        def per_head(value, default=0.0):
            return np.broadcast_to(np.asarray(default if value is None else value, dtype=np.float64), (layers, heads))

        slopes = per_head(attention["alibi_slopes"])
        weights = per_head(attention.get("head_weights"), 1.0)
        content = config.get("content_config") or {}
        diagonal, base = per_head(content.get("diagonal_scores")), per_head(content.get("base_scores"))
        tau = float(attention.get("softmax_temperature", 1.0))
        offsets = (np.arange(n)[:, None] - np.arange(n)[None, :]).astype(np.float64)
        causal = offsets >= 0
        rows = [np.eye(n)[-1], np.eye(n)[-1]]  # with the residual, attention-only
        for t in reversed(range(layers)):
            scores = -slopes[t, :, None, None] * offsets + base[t, :, None, None]
            scores[:, np.arange(n), np.arange(n)] += diagonal[t, :, None]
            scores = np.where(causal, scores / tau, -np.inf)
            scores -= scores.max(axis=2, keepdims=True)
            kernels = np.exp(scores)
            kernels /= kernels.sum(axis=2, keepdims=True)
            kernel = np.einsum("h,hij->ij", weights[t] / weights[t].sum(), kernels)
            rows[0] = (1 - lambdas[t]) * rows[0] + lambdas[t] * (rows[0] @ kernel)
            rows[1] = rows[1] @ kernel
        profile = rows[0] / rows[0].sum()
        target = Path(out) / f"{index}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write("token_position,probability\n")
            handle.writelines(f"{j},{value!r}\n" for j, value in enumerate(profile.tolist()))


# --- in-process pieces (a fresh process each; run with today's or this tree's PYTHONPATH) ---------------


def _load_config_times() -> None:
    """Per published file: the least of 5 `load_config` calls, in ms; JSON on stdout."""
    import glob

    import jaxroll

    files = sorted(glob.glob(str(PUBLISHED / "**" / "*.yaml"), recursive=True))
    jaxroll.load_config(files[0])  # imports done
    best = {}
    for path in files:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            jaxroll.load_config(path)
            times.append(time.perf_counter() - start)
        best[path] = 1e3 * min(times)
    content = [t for p, t in best.items() if "/all_content/" in p]
    print(json.dumps({"mean": statistics.mean(best.values()), "max": max(best.values()),
                      "all_content_mean": statistics.mean(content), "all_content_max": max(content)}))


def _figure_times(out: str) -> None:
    """``import jaxroll.plot`` and the first `plot_profile` of BLOOM-176B in a process, in s; JSON."""
    start = time.perf_counter()
    import numpy as np

    from jaxroll import plot

    imported = time.perf_counter()
    n = 256
    positions = np.arange(n)
    profile = 1.0 / (1.0 + positions) + 1.0 / (n - positions)
    attention_only = np.exp(-0.5 * positions)
    plot.plot_profile(Path(out) / "profile.png", profile / profile.sum(), attention_only / attention_only.sum(),
                      title="published bloom-176b: N=256, T=70, H=112")
    drawn = time.perf_counter()
    print(json.dumps({"import": imported - start, "draw": drawn - imported}))


def _phases(out: str) -> None:
    """The phases of ``jaxroll rollout --published bloom-176b`` in one process (cache as set), in s; JSON."""
    marks = [("start", time.perf_counter())]
    import jax

    marks.append(("import jax", time.perf_counter()))
    from jaxroll import cache, io, published
    from jaxroll.bucket import influence_with_mass

    cache.enable()
    marks.append(("import jaxroll (what a rollout needs)", time.perf_counter()))
    model = published.load("bloom-176b")
    marks.append(("load the configuration", time.perf_counter()))
    import dataclasses

    import numpy as np

    profile = np.asarray(influence_with_mass(model)[0])
    marks.append(("profile: program (trace, lower, compile or load) and run", time.perf_counter()))
    attention_only = np.asarray(influence_with_mass(dataclasses.replace(model, lambdas=np.ones_like(model.lambdas)))[0])
    marks.append(("attention-only profile (the same program)", time.perf_counter()))
    from jaxroll import plot

    marks.append(("import jaxroll.plot (matplotlib)", time.perf_counter()))
    plot.plot_profile(Path(out) / "profile.png", profile, attention_only, title="bloom-176b")
    marks.append(("draw and write the figure", time.perf_counter()))
    io.write_profile(profile, Path(out) / "profile.csv", overwrite=True)
    io.save_config(model, Path(out) / "config.yaml", overwrite=True)
    marks.append(("write profile.csv and config.yaml", time.perf_counter()))
    assert jax is not None
    print(json.dumps({name: t - marks[k][1] for k, (name, t) in enumerate(marks[1:])}))


# --- timing -------------------------------------------------------------------------------------------


def _run(command: list[str], environment: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tempfile.gettempdir())
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {result.returncode}\n{result.stderr[-2000:]}")
    return elapsed, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per row (median; default 5)")
    parser.add_argument("--rounds-33", type=int, default=1, help="timed runs of the 33-config rows (default 1)")
    parser.add_argument("--numpy-33", action="store_true", help="also the NumPy baseline over the 33 (slow)")
    parser.add_argument("--today", default="/work/main", help="the tree of the code before (default /work/main)")
    parser.add_argument("--csv", type=Path, default=HERE / "process.csv")
    parser.add_argument("--only", default=None, help="time only the rows whose command contains this text")
    parser.add_argument("--numpy", nargs="+", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--numpy-out", help=argparse.SUPPRESS)
    parser.add_argument("--piece", choices=("load-config", "figure", "phases"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.numpy:
        _numpy_rollout(arguments.numpy, arguments.numpy_out)
        return
    if arguments.piece:
        out = tempfile.mkdtemp(prefix="jaxroll-piece-")
        {"load-config": lambda: _load_config_times(), "figure": lambda: _figure_times(out),
         "phases": lambda: _phases(out)}[arguments.piece]()
        return

    scratch = Path(tempfile.mkdtemp(prefix="jaxroll-process-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAXROLL_", "JAX_", "XLA_"))}
    today = {**base, "PYTHONPATH": arguments.today, "JAXROLL_NO_CACHE": "1"}
    new = {**base, "PYTHONPATH": str(ROOT)}
    warm_folder = scratch / "warm-cache"
    counter = iter(range(10 ** 6))

    def new_cold():
        return {**new, "JAXROLL_CACHE_DIR": str(scratch / f"cold-{next(counter)}")}

    def new_warm():
        return {**new, "JAXROLL_CACHE_DIR": str(warm_folder)}

    def out():
        return str(scratch / f"out-{next(counter)}")

    python = sys.executable
    files = [str(p) for p in sorted(PUBLISHED.rglob("*.yaml"))]
    assert len(files) == 33, len(files)
    configs = {
        "BLOOM-176B (--published bloom-176b)": ["--published", "bloom-176b"],
        "MPT-7B all content (--published mpt-7b --content all)": ["--published", "mpt-7b", "--content", "all"],
        "example.yaml": [str(EXAMPLE)],
    }
    config_files = {
        "BLOOM-176B (--published bloom-176b)": [str(PUBLISHED / "alibi/no_content/bloom.yaml")],
        "MPT-7B all content (--published mpt-7b --content all)": [str(PUBLISHED / "alibi/all_content/fineweb-edu/mpt-7b.yaml")],
        "example.yaml": [str(EXAMPLE)],
    }
    loop_today = ("import sys, jax; jax.config.update('jax_enable_x64', True); import jaxroll\n"
                  "for f in sys.argv[1:]: jaxroll.influence(jaxroll.load_config(f)).block_until_ready()")
    # (row, kind, command maker, environment maker, rounds)
    rows = [
        ("python -c 'import jax'", "reference", lambda: [python, "-c", "import jax"], lambda: base, None),
        ("python -c 'import jaxroll'", "today", lambda: [python, "-c", "import jaxroll"], lambda: today, None),
        ("python -c 'import jaxroll'", "new", lambda: [python, "-c", "import jaxroll"], lambda: new, None),
        ("import jaxroll + what a rollout needs", "today",
         lambda: [python, "-c", "import jaxroll; jaxroll.influence; jaxroll.load_config; jaxroll.published"],
         lambda: today, None),
        ("import jaxroll + what a rollout needs", "new",
         lambda: [python, "-c", "import jaxroll; jaxroll.influence; jaxroll.load_config; jaxroll.published"],
         lambda: new, None),
        ("jaxroll --version", "today", lambda: [python, "-m", "jaxroll", "--version"], lambda: today, None),
        ("jaxroll --version", "new", lambda: [python, "-m", "jaxroll", "--version"], lambda: new, None),
    ]
    for name, flags in configs.items():
        command = (lambda flags=flags: [python, "-m", "jaxroll", "rollout", *flags, "--out", out()])
        rows += [(f"jaxroll rollout: {name}", "today", command, lambda: today, None),
                 (f"jaxroll rollout: {name}", "new, cold cache", command, new_cold, None),
                 (f"jaxroll rollout: {name}", "new, warm cache", command, new_warm, None),
                 (f"jaxroll rollout: {name}", "numpy",
                  lambda name=name: [python, __file__, "--numpy", *config_files[name], "--numpy-out", out()],
                  lambda: base, None)]
    rows += [
        ("33 published configs, one process, float64", "today (a loop over influence)",
         lambda: [python, "-c", loop_today, *files], lambda: today, arguments.rounds_33),
        ("33 published configs, one process, float64", "new, cold cache",
         lambda: [python, str(WORKER), "rollout", *files, "--float64", "--out", out()], new_cold, arguments.rounds_33),
        ("33 published configs, one process, float64", "new, warm cache",
         lambda: [python, str(WORKER), "rollout", *files, "--float64", "--out", out()], new_warm, arguments.rounds_33),
    ]
    rows += [
        ("jaxroll rollout: BLOOM-176B (--published bloom-176b) --no-figure", "new, warm cache",
         lambda: [python, "-m", "jaxroll", "rollout", "--published", "bloom-176b", "--no-figure", "--out", out()],
         new_warm, None),
        ("33 published configs, one process, float64, --no-figure", "new, cold cache",
         lambda: [python, str(WORKER), "rollout", *files, "--float64", "--no-figure", "--out", out()], new_cold,
         arguments.rounds_33),
        ("33 published configs, one process, float64, --no-figure", "new, warm cache",
         lambda: [python, str(WORKER), "rollout", *files, "--float64", "--no-figure", "--out", out()], new_warm,
         arguments.rounds_33),
    ]
    if arguments.numpy_33:
        rows.append(("33 published configs, one process, float64", "numpy",
                     lambda: [python, __file__, "--numpy", *files, "--numpy-out", out()], lambda: base,
                     arguments.rounds_33))

    if arguments.only:
        rows = [row for row in rows if arguments.only in row[0] or row[1] == "reference"]
    # Fill the warm folder: one untimed run of each command that uses it.
    for _, kind, command, environment, _ in rows:
        if kind.endswith("warm cache"):
            _run(command(), environment())

    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    times: dict[int, list[float]] = {i: [] for i in range(len(rows))}
    notes: dict[int, str] = {}
    for round_ in range(max(arguments.rounds, arguments.rounds_33)):
        for i, (name, kind, command, environment, rounds) in enumerate(rows):
            if round_ >= (rounds or arguments.rounds):
                continue
            elapsed, stdout = _run(command(), environment())
            times[i].append(elapsed)
            if command()[1] == str(WORKER):  # the compilation count of the batch rows
                events = json.loads(stdout.strip().splitlines()[-1])["events"]
                hits = events.get("/jax/compilation_cache/cache_hits", 0)
                # XLA reports a compile for a JAX-cache hit too; a kept executable (cache.compiled) reports none.
                notes[i] = (f"{events.get('/jax/core/compile/jaxpr_trace_duration', 0)} traced, "
                            f"{events.get('/jax/core/compile/backend_compile_duration', 0) - hits} compiled, "
                            f"{hits} from JAX's cache")
            print(f"  round {round_ + 1}: {name} [{kind}] {elapsed:.2f} s", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    medians = {i: statistics.median(t) for i, t in times.items()}
    print(f"\nWhole processes, {started}, {platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), "
          f"Python {platform.python_version()}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
          f"median of {arguments.rounds} (33-config rows: {arguments.rounds_33}); today = {arguments.today}.\n")
    print("| command | process | median s | runs | vs numpy (numpy s / this s) | note |")
    print("|---|---|---:|---:|---:|---|")
    numpy_time = {name: medians[i] for i, (name, kind, *_) in enumerate(rows) if kind == "numpy"}
    with open(arguments.csv, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["command", "process", "median_s", "runs", "numpy_over_this", "note", "started", "load_before",
                         "load_after"])
        for i, (name, kind, *_) in enumerate(rows):
            ratio = numpy_time[name] / medians[i] if name in numpy_time and kind != "numpy" else None
            ratio_text = "" if ratio is None else f"{ratio:.2f}x"
            print(f"| {name} | {kind} | {medians[i]:.2f} | {len(times[i])} | {ratio_text} | {notes.get(i, '')} |")
            writer.writerow([name, kind, f"{medians[i]:.3f}", len(times[i]), "" if ratio is None else f"{ratio:.3f}",
                             notes.get(i, ""), started, f"{load_before[0]:.2f}", f"{load_after[0]:.2f}"])
    if arguments.only:
        return
    _pieces(arguments, python, today, new, new_warm)
    imports = {kind: medians[i] for i, (name, kind, *_) in enumerate(rows) if name.startswith("import jaxroll +")}
    bare = {kind: medians[i] for i, (name, kind, *_) in enumerate(rows) if name == "python -c 'import jaxroll'"}
    jax_time = medians[0]
    print(f"\nimport jaxroll minus import jax: today {bare['today'] - jax_time:+.2f} s, new {bare['new'] - jax_time:+.2f} s; "
          f"with what a rollout needs: today {imports['today'] - jax_time:+.2f} s, new {imports['new'] - jax_time:+.2f} s")


def _pieces(arguments, python, today, new, new_warm) -> None:
    """In-process pieces, each in fresh processes, today and new alternating: median of the rounds."""
    rounds = max(arguments.rounds, 3)
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(rounds):
        for piece in ("load-config", "figure"):
            for kind, environment in (("today", today), ("new", new)):
                _, stdout = _run([python, __file__, "--piece", piece], environment)
                results.setdefault((piece, kind), []).append(json.loads(stdout.strip().splitlines()[-1]))
        _, stdout = _run([python, __file__, "--piece", "phases"], new_warm())
        results.setdefault(("phases", "new, warm cache"), []).append(json.loads(stdout.strip().splitlines()[-1]))
    print(f"\nIn-process pieces (median of {rounds} fresh processes each, alternating):\n")
    print("| piece | process | value |")
    print("|---|---|---:|")
    for (piece, kind), values in results.items():
        for key in values[0]:
            median = statistics.median(v[key] for v in values)
            unit = " ms" if piece == "load-config" else " s"
            label = {"load-config": f"load_config of a published file, {key.replace('_', ' ')} (least of 5 calls)",
                     "figure": f"profile figure: {key}"}.get(piece, f"warm BLOOM-176B rollout: {key}")
            print(f"| {label} | {kind} | {median:.{1 if unit == ' ms' else 3}f}{unit} |")


if __name__ == "__main__":
    main()
