"""Latency of one-off calls: whole processes, from ``python`` starting to its exit, as a user waits once.

Every row is a fresh process timed with ``time.perf_counter`` around
``subprocess.run``; within a round the rows run in turn (the order rotated
each round) so that a change of load hits them alike; the table gives the
median and the fastest of the rounds and the ratio of medians against the
row named in ``against``. Rows:

- ``authors``: the paper authors' own rollout of their 64-token example
  (``python -m src.rollout.main config/rollout/example.yaml``: NumPy, two
  PDF figures at 400 dpi and two CSVs), run from their repository
  (``--authors``, default /work/authors/position-bias) with the Python of
  their own environment (``--authors-python``, a venv with their
  dependencies from PyPI; nothing of theirs is in jaxroll). Their
  ``save_dir`` is pointed at a temporary folder (a copy of their file).
- ``jaxroll rollout``: ``jaxroll rollout example.yaml`` (the same
  configuration, shipped as jaxroll/data/published/rollout/example.yaml),
  which writes profile.csv, profile.png and config.yaml; its profile is
  checked against the authors' last_row_distribution.csv (1e-12).
- ``jaxroll effect``, ``jaxroll score``: on small inputs made here (two
  measurements of S = 16 sequences at N = 64, a baseline config.yaml of
  3 ALiBi layers, a predicted profile); effect rolls out the baseline's
  config.yaml (the default predicted change) and draws effect.png; score
  once with ``--out`` (score.png) and once printing the table only.
- ``--help`` of ``jaxroll design`` and a misspelt flag of ``jaxroll rollout``
  (exit status 2): the refusals.

Each jaxroll row runs twice: ``new`` (this tree) and ``before``
(``--before``, default /work/main: PYTHONPATH points there), each with a
compilation cache folder of its own filled by one untimed run first (the
second call a user makes; jaxroll's command line keeps compiled programs).
Every process keeps its bytecode (``PYTHONPYCACHEPREFIX``, a folder per tree,
filled by that untimed run; ``PYTHONDONTWRITEBYTECODE`` dropped), as an
installed package has it: without, each process compiles every module of
jaxroll it imports from source.

The table gives the median wall time and the median CPU time (user + system
of the process and its threads): on a machine shared with other jobs the
wall time grows with the load, the CPU time much less.

Usage: ``python benchmarks/latency.py [--rounds 7] [--before /work/main]``.
Prints a Markdown table (and the machine's load averages before and after).
``--phases``: instead, where the ``--before`` tree's ``jaxroll rollout
example.yaml`` spends its time (import, YAML, tracing and compiling, figure),
timed inside fresh processes. ``--figure-phases``: instead, where ``jaxroll
effect`` and ``jaxroll score --out`` (the inputs above) spend their time in
this tree and the ``--before`` tree: interpreter start, imports, compute,
drawing the figure, and savefig (Agg's render, then PNG encoding), each
command run as the command line runs it with its library calls timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "jaxroll" / "data" / "published" / "rollout" / "example.yaml"


def _inputs(folder: Path) -> dict[str, Path]:
    """Two small measurements (S = 16, N = 64; the baseline with an ALiBi config.yaml) and a predicted profile."""
    import numpy as np

    rng = np.random.default_rng(0)
    sequences, n = 16, 64
    x = np.linspace(0.0, 1.0, n)

    def u_shape(tilt: float):
        profile = np.exp(-8 * x) + (1 + tilt) * np.exp(8 * (x - 1)) + 0.05
        return profile / profile.sum()

    tokens = rng.integers(0, 50_000, size=(sequences, n))
    paths = {}
    for name, tilt, change in (("baseline", 0.0, None), ("intervened", 0.6, {"tau": 0.7})):
        directory = folder / name
        directory.mkdir(parents=True)
        rows = rng.dirichlet(u_shape(tilt) * 2 * n, size=sequences) * rng.uniform(0.5, 2, size=(sequences, 1))
        np.savez(directory / "measurement.npz", influence_per_sequence=rows, token_ids=tokens)
        (directory / "metadata.json").write_text(json.dumps({"model": "tiny", "num_layers": 3, "num_heads": 2,
                                                             "interventions": change}))
        paths[name] = directory
    (paths["baseline"] / "config.yaml").write_text(
        "sequence_length: 64\nnum_layers: 3\n"
        "attention_config: {num_heads: 2, alibi_slopes: [[0.5, 0.125]], head_weights: null, softmax_temperature: 1.0}\n"
        "content_config: {diagonal_scores: [[1.5]], base_scores: [[0.0]]}\n"
        "lambda_schedule_config: {schedule_type: custom, lambdas_custom: [0.6, 0.4, 0.7]}\n")
    paths["predicted"] = folder / "predicted.csv"
    paths["predicted"].write_text("token_position,probability\n" + "".join(
        f"{j},{float(v)!r}\n" for j, v in enumerate(u_shape(0.6))))
    return paths


def _rows(arguments, work: Path, inputs: dict[str, Path]) -> dict[str, tuple[list[str], dict, Path | None, int]]:
    """name -> (command, environment, working folder, expected exit status)."""
    authors = Path(arguments.authors)
    config = work / "authors-example.yaml"
    text = (authors / "config" / "rollout" / "example.yaml").read_text()
    config.write_text("\n".join(line if not line.startswith("save_dir:") else f"save_dir: {work / 'authors-out'}"
                                for line in text.splitlines()) + "\n")
    rows = {"authors: python -m src.rollout.main example.yaml": (
        [arguments.authors_python, "-m", "src.rollout.main", str(config)], _bytecode(dict(os.environ), work / "pyc-authors"),
        authors, 0)}
    measured = ["--measured", str(inputs["baseline"]), "--measured", str(inputs["intervened"])]
    commands = {
        "jaxroll rollout example.yaml": (["rollout", str(EXAMPLE), "--out", "{out}/rollout", "--force"], 0),
        "jaxroll effect (N = 64, S = 16)": (["effect", *measured, "--predicted", str(inputs["predicted"]),
                                             "--out", "{out}/effect", "--force"], 0),
        "jaxroll score --out (N = 64, S = 16)": (["score", str(inputs["predicted"]), "--measured",
                                                  str(inputs["intervened"]), "--out", "{out}/score", "--force"], 0),
        "jaxroll score, table only": (["score", str(inputs["predicted"]), "--measured", str(inputs["intervened"])], 0),
        "jaxroll design --help": (["design", "--help"], 0),
        "jaxroll rollout --lenght 8 (refused)": (["rollout", "--lenght", "8"], 2),
    }
    for tree_name, tree in (("new", ROOT), ("before", Path(arguments.before))):
        environment = _bytecode({**os.environ, "PYTHONPATH": str(tree), "JAXROLL_CACHE_DIR": str(work / f"cache-{tree_name}")},
                                work / f"pyc-{tree_name}")
        environment.pop("JAXROLL_NO_CACHE", None)
        out = work / f"out-{tree_name}"
        for name, (argv, status) in commands.items():
            # cwd: a folder of no checkout (``python -m`` puts the working folder first on sys.path).
            rows[f"{name} [{tree_name}]"] = ([sys.executable, "-m", "jaxroll",
                                               *(a.replace("{out}", str(out)) for a in argv)], environment, work, status)
    return rows


def _bytecode(environment: dict, folder: Path) -> dict:
    """`environment` with compiled modules kept in `folder` (``PYTHONPYCACHEPREFIX``), as an installed package has them."""
    environment = {**environment, "PYTHONPYCACHEPREFIX": str(folder)}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    return environment


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (their threads included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(command, environment, cwd, status) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process."""
    cpu, start = _cpu_seconds(), time.perf_counter()
    result = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True)
    elapsed, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    if result.returncode != status:
        raise SystemExit(f"{' '.join(command)}: exit {result.returncode}, expected {status}\n{result.stderr[-2000:]}")
    return elapsed, cpu


def _check_same_profile(work: Path) -> float:
    """max |jaxroll's profile - the authors' last row| / max of the authors' row (both of the 64-token example)."""
    import numpy as np

    theirs = np.loadtxt(work / "authors-out" / "last_row_distribution.csv", delimiter=",", skiprows=1)[:, 1]
    ours = np.loadtxt(work / "out-new" / "rollout" / "profile.csv", delimiter=",", skiprows=1)[:, 1]
    return float(np.max(np.abs(ours - theirs)) / np.max(theirs))


_PHASES = r"""
import json, sys, time
start = time.perf_counter()
marks = {}
def mark(name):
    global start
    now = time.perf_counter(); marks[name] = round(now - start, 3); start = now
from pathlib import Path
import numpy, yaml
mark("numpy, yaml")
from jaxroll.cli import _build_parser
_build_parser()
mark("the parser")
import jax
from jaxroll import cache
cache.enable(sys.argv[2])
mark("import jax")
import dataclasses
from jaxroll import io
from jaxroll.bucket import influence_with_mass
model = io.load_config(sys.argv[1])
mark("read the YAML (load_config)")
profile = influence_with_mass(model)[0]
influence_with_mass(dataclasses.replace(model, lambdas=numpy.ones_like(model.lambdas)))
jax.block_until_ready(profile)
mark("trace, compile or load, run (2 profiles)")
from jaxroll import plot
mark("import matplotlib (jaxroll.plot)")
plot.plot_profile(Path(sys.argv[2]) / "p.png", numpy.asarray(profile, dtype=float), title="x")
mark("draw and save profile.png")
print(json.dumps(marks))
"""


def phases(arguments) -> None:
    """Where a whole `jaxroll rollout example.yaml` of the `--before` tree spends its time, phase by phase
    (one fresh process per round, the compilation cache cold in the first round and warm after)."""
    with tempfile.TemporaryDirectory(prefix="jaxroll-phases-") as folder:
        environment = {**os.environ, "PYTHONPATH": str(arguments.before), "JAXROLL_CACHE_DIR": folder}
        runs = []
        for _ in range(arguments.rounds):
            result = subprocess.run([sys.executable, "-c", _PHASES, str(EXAMPLE), folder], env=environment,
                                    capture_output=True, text=True, check=True, cwd=folder)
            runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    print(f"phases of jaxroll rollout example.yaml at {arguments.before} (s; cold cache, then the median of "
          f"{len(runs) - 1} warm):\n")
    print("| phase | cold | warm |")
    print("| --- | ---: | ---: |")
    for name in runs[0]:
        warm = statistics.median(run[name] for run in runs[1:]) if len(runs) > 1 else float("nan")
        print(f"| {name} | {runs[0][name]:.2f} | {warm:.2f} |")


_FIGURE_PHASES = r"""
import sys, time
started = time.time()
# phase -> [wall s, CPU s of this process]; the interpreter's start: since the parent's clock read, its CPU so far
marks, last = {"interpreter start": [started - float(sys.argv[1]), time.process_time()]}, None
def mark(name):
    global last
    now = (time.perf_counter(), time.process_time())
    if last is not None:
        wall, cpu = marks.setdefault(name, [0.0, 0.0])
        marks[name] = [wall + now[0] - last[0], cpu + now[1] - last[1]]
    last = now
mark("")
sys.argv[1:] = sys.argv[2:]  # the command line as jaxroll's sees it (jaxroll.cli reads its command on import)
import argparse
from jaxroll.cli import _build_parser
arguments = _build_parser().parse_args(sys.argv[1:], namespace=argparse.Namespace(command_line=True))
mark("import jaxroll.cli (NumPy included), parse")
import jaxroll.io, jaxroll.measure.effect, jaxroll.measure.outputs, jaxroll.measure.uncertainty
mark("import the command's NumPy modules")
import jaxroll.plot as plot
from matplotlib.backends.backend_agg import FigureCanvasAgg
mark("import matplotlib (jaxroll.plot)")
save, render = plot._save, FigureCanvasAgg.draw
def timed_render(canvas, *args, **kwargs):
    mark("savefig: PNG encode, write"); result = render(canvas, *args, **kwargs); mark("savefig: Agg render")
    return result
def timed_save(figure, path):
    mark("compute"); result = save(figure, path); mark("savefig: PNG encode, write"); return result
def timed_figure(name):
    inner = getattr(plot, name)
    def figure(*args, **kwargs):
        mark("compute"); result = inner(*args, **kwargs); mark("draw the figure (its artists)"); return result
    setattr(plot, name, figure)
for name in ("effect_figure", "two_profiles_figure"):
    timed_figure(name)
FigureCanvasAgg.draw, plot._save = timed_render, timed_save
arguments.run(arguments)
mark("compute")
import json
print(json.dumps(marks), file=sys.stderr)
"""


def figure_phases(arguments) -> None:
    """Where `jaxroll effect` and `jaxroll score --out` (N = 64, S = 16) spend their time, this tree and `--before`:
    one fresh process per round and tree (interleaved), the library calls of the command timed inside it."""
    with tempfile.TemporaryDirectory(prefix="jaxroll-figure-phases-") as folder:
        work = Path(folder)
        inputs = _inputs(work / "inputs")
        commands = {
            "effect": ["effect", "--measured", str(inputs["baseline"]), "--measured", str(inputs["intervened"]),
                       "--predicted", str(inputs["predicted"]), "--out", str(work / "effect"), "--force"],
            "score --out": ["score", str(inputs["predicted"]), "--measured", str(inputs["intervened"]), "--out",
                            str(work / "score"), "--force"]}
        trees = {"new": ROOT, "before": Path(arguments.before)}
        runs = {(command, tree): [] for command in commands for tree in trees}
        load_before = _load()
        for round_ in range(arguments.rounds + 1):  # round 0 untimed: writes each tree's bytecode
            for (command, tree), marks in runs.items():
                environment = _bytecode({**os.environ, "PYTHONPATH": str(trees[tree])}, work / f"pyc-{tree}")
                result = subprocess.run([sys.executable, "-c", _FIGURE_PHASES, repr(time.time()), *commands[command]],
                                        env=environment, cwd=work, capture_output=True, text=True, check=True)
                if round_:
                    marks.append(json.loads(result.stderr.strip().splitlines()[-1]))
        load_after = _load()
    print(f"phases of jaxroll effect and jaxroll score --out (N = 64, S = 16): wall s / CPU s, medians of "
          f"{arguments.rounds} interleaved rounds; load averages (1/5/15 min) {load_before} before, {load_after} "
          "after\n")
    columns = list(runs)
    print("| phase | " + " | ".join(f"{command} [{tree}]" for command, tree in columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    names = list(dict.fromkeys(name for marks in runs.values() for name in marks[0]))
    for name in names + ["sum"]:
        cells = [[statistics.median(sum(m[key][i] for key in m) if name == "sum" else m.get(name, [0.0, 0.0])[i]
                                    for m in runs[column]) for i in (0, 1)] for column in columns]
        print(f"| {name} | " + " | ".join(f"{wall:.3f} / {cpu:.3f}" for wall, cpu in cells) + " |")


def _against(name: str) -> str | None:
    """The row a row's ratio is taken against: the authors for jaxroll's rollout, else the same call before."""
    if name.endswith("[before]") or name.startswith("authors"):
        return None
    return name.replace("[new]", "[before]")


def _interleaved(rows: dict, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Every row once untimed (fills its compilation cache and bytecode), then `rounds` rounds of all rows, the
    order rotated each round; name -> [(wall s, CPU s)] per round."""
    for command, environment, cwd, status in rows.values():
        _time(command, environment, cwd, status)
    times = {name: [] for name in rows}
    names = list(rows)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            times[name].append(_time(*rows[name]))
    return times


def _load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", default="/work/main", help="the checkout to compare with (PYTHONPATH)")
    parser.add_argument("--authors", default="/work/authors/position-bias", help="the authors' repository")
    parser.add_argument("--authors-python", default="/work/authors-venv/bin/python",
                        help="the Python of the authors' environment (their dependencies installed from PyPI)")
    parser.add_argument("--only", default="", help="comma-separated words: only the rows whose name holds one "
                                                   "(e.g. effect,score; the authors' row and the profile check "
                                                   "need 'rollout')")
    parser.add_argument("--phases", action="store_true",
                        help="instead: where the --before tree's rollout of the example spends its time")
    parser.add_argument("--figure-phases", action="store_true",
                        help="instead: where effect and score --out spend their time, this tree and --before")
    arguments = parser.parse_args()
    if arguments.phases:
        return phases(arguments)
    if arguments.figure_phases:
        return figure_phases(arguments)
    with tempfile.TemporaryDirectory(prefix="jaxroll-latency-") as folder:
        work = Path(folder)
        rows = _rows(arguments, work, _inputs(work / "inputs"))
        words = [word for word in arguments.only.split(",") if word]
        rows = {name: row for name, row in rows.items() if not words or any(word in name for word in words)}
        load_before = _load()
        times = _interleaved(rows, arguments.rounds)
        load_after = _load()
        checked = (work / "authors-out").is_dir() and (work / "out-new" / "rollout").is_dir()
        difference = f"{_check_same_profile(work):.1e}" if checked else "not run"
        shutil.rmtree(work / "authors-out", ignore_errors=True)
    print(f"{arguments.rounds} interleaved rounds; {platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores, Python {platform.python_version()}; load averages (1/5/15 min) {load_before} before, "
          f"{load_after} after; jaxroll's example profile vs the authors': max difference {difference} of the "
          "largest entry\n")
    _print_table(times)


def _print_table(times: dict[str, list[tuple[float, float]]]) -> None:
    """Median and fastest wall time, median CPU time, and the ratios of the medians (wall) against `_against`."""
    medians = {name: statistics.median(wall for wall, _ in values) for name, values in times.items()}
    authors = next((name for name in times if name.startswith("authors")), None)
    print("| process | median s | fastest s | median CPU s | ratio of medians |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, values in times.items():
        reference = _against(name)
        ratio = ""
        if reference in medians:
            ratio = f"{medians[name] / medians[reference]:.2f}x {reference.rsplit(' ', 1)[-1]}"
        if name.startswith("jaxroll rollout example.yaml") and authors:
            ratio = (ratio + "; " if ratio else "") + f"{medians[name] / medians[authors]:.2f}x authors"
        cpu = statistics.median(cpu for _, cpu in values)
        print(f"| {name} | {medians[name]:.2f} | {min(wall for wall, _ in values):.2f} | {cpu:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
