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

Usage: ``python benchmarks/latency.py [--rounds 7] [--before /work/main]``.
Prints a Markdown table (and the machine's load before and after).
``--phases``: instead, where the ``--before`` tree's ``jaxroll rollout
example.yaml`` spends its time (import, YAML, tracing and compiling, figure),
timed inside fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
        [arguments.authors_python, "-m", "src.rollout.main", str(config)], dict(os.environ), authors, 0)}
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
        environment = {**os.environ, "PYTHONPATH": str(tree), "JAXROLL_CACHE_DIR": str(work / f"cache-{tree_name}")}
        environment.pop("JAXROLL_NO_CACHE", None)
        out = work / f"out-{tree_name}"
        for name, (argv, status) in commands.items():
            # cwd: a folder of no checkout (``python -m`` puts the working folder first on sys.path).
            rows[f"{name} [{tree_name}]"] = ([sys.executable, "-m", "jaxroll",
                                               *(a.replace("{out}", str(out)) for a in argv)], environment, work, status)
    return rows


def _time(command, environment, cwd, status) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != status:
        raise SystemExit(f"{' '.join(command)}: exit {result.returncode}, expected {status}\n{result.stderr[-2000:]}")
    return elapsed


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


def _against(name: str) -> str | None:
    """The row a row's ratio is taken against: the authors for jaxroll's rollout, else the same call before."""
    if name.endswith("[before]") or name.startswith("authors"):
        return None
    return name.replace("[new]", "[before]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", default="/work/main", help="the checkout to compare with (PYTHONPATH)")
    parser.add_argument("--authors", default="/work/authors/position-bias", help="the authors' repository")
    parser.add_argument("--authors-python", default="/work/authors-venv/bin/python",
                        help="the Python of the authors' environment (their dependencies installed from PyPI)")
    parser.add_argument("--phases", action="store_true",
                        help="instead: where the --before tree's rollout of the example spends its time")
    arguments = parser.parse_args()
    if arguments.phases:
        return phases(arguments)
    with tempfile.TemporaryDirectory(prefix="jaxroll-latency-") as folder:
        work = Path(folder)
        inputs = _inputs(work / "inputs")
        rows = _rows(arguments, work, inputs)
        load_before = os.getloadavg()
        for name, (command, environment, cwd, status) in rows.items():  # untimed: fills each compilation cache
            _time(command, environment, cwd, status)
        times = {name: [] for name in rows}
        names = list(rows)
        for round_ in range(arguments.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                times[name].append(_time(*rows[name]))
        load_after = os.getloadavg()
        difference = _check_same_profile(work)
        shutil.rmtree(work / "authors-out", ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    authors = next(name for name in rows if name.startswith("authors"))
    print(f"{arguments.rounds} interleaved rounds; {platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores, Python {platform.python_version()}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; jaxroll's example profile vs the authors': max difference "
          f"{difference:.1e} of the largest entry\n")
    print("| process | median s | fastest s | ratio of medians |")
    print("| --- | ---: | ---: | --- |")
    for name in rows:
        reference = _against(name)
        ratio = ""
        if reference in medians:
            ratio = f"{medians[name] / medians[reference]:.2f}x {reference.rsplit(' ', 1)[-1]}"
        if name.startswith("jaxroll rollout example.yaml"):
            ratio = (ratio + "; " if ratio else "") + f"{medians[name] / medians[authors]:.2f}x authors"
        print(f"| {name} | {medians[name]:.2f} | {min(times[name]):.2f} | {ratio} |")


if __name__ == "__main__":
    main()
