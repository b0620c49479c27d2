"""Every early refusal ends with exit status 2, never a signal: real ``python -m jaxroll`` processes, many times.

`jaxroll rollout` once imported matplotlib in a daemon thread started before the
configuration was checked; when the check failed, interpreter shutdown could
stop that thread inside matplotlib's native import and the process died with
"terminate called without an active exception" (SIGABRT) after printing its
error. The race shows only in some runs, so each command's early-error path is
run as a real process over and over (two at a time, as a loaded machine
would), and every run must exit 2 with one line on stderr. In-process, a
refusal must leave no thread behind, which catches any such thread every time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jaxroll.cli import main

ROOT = Path(__file__).resolve().parents[1]

NAN_CONFIG = ("sequence_length: 8\nnum_layers: 1\nattention_config: {num_heads: 1, alibi_slopes: [[0.5]]}\n"
              "lambda_schedule_config: {schedule_type: constant, lambda_const: 0.5}\n"
              "content_config: {diagonal_scores: [[.nan]]}\n")

# (argv, runs in the default test): every command that refuses early. rollout (which had the thread) imports
# JAX before it refuses (about 2 s a run); forces, compare, fit, fit-kernel, sweep and task import JAX or torch
# first (2-4 s), so they run only in the 200-run test (marked slow) and in-process below, to keep the default
# test under a minute on two shared cores.
CASES = (
    (["rollout", "{scalar}", "--out", "{out}"], 4),
    (["rollout", "{nan}", "--out", "{out}"], 2),
    (["rollout", "--lenght", "8"], 3),
    (["forces", "{scalar}", "--out", "{out}"], 0),
    (["kinetic", "{scalar}", "--out", "{out}"], 5),
    (["fit", "{bad_csv}", "--out", "{out}"], 0),
    (["fit-kernel", "{scalar}", "--out", "{out}"], 0),
    (["sweep", "{scalar}", "--out", "{out}"], 0),
    (["compare", "{bad_csv}", "{bad_csv}"], 0),
    (["score", "{bad_csv}"], 5),
    (["measure", "{missing}", "--out", "{out}"], 5),
    (["task", "{missing}", "--out", "{out}"], 0),
    (["compare-task", "{missing}"], 5),
    (["cache", "nope"], 5),
    (["presets", "--bad"], 6),
)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "scalar.yaml").write_text("5\n")
    (tmp_path / "nan.yaml").write_text(NAN_CONFIG)
    (tmp_path / "bad.csv").write_text("x,y\n1,2\n")
    return {"scalar": tmp_path / "scalar.yaml", "nan": tmp_path / "nan.yaml", "bad_csv": tmp_path / "bad.csv",
            "missing": tmp_path / "no_such_model"}


def _argv(argv, files, out):
    return [item.format(out=out, **files) for item in argv]


def _run(argv):
    environment = dict(os.environ, PYTHONPATH=str(ROOT), JAXROLL_NO_CACHE="1")
    process = subprocess.run([sys.executable, "-m", "jaxroll", *argv], capture_output=True, text=True,
                             env=environment, cwd=ROOT, timeout=120)
    return argv, process.returncode, process.stderr


def _run_all(runs, files, tmp_path):
    argvs = [_argv(argv, files, tmp_path / f"out{index}") for index, argv in enumerate(runs)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_run, argvs))
    assert len(results) == len(runs)
    for argv, code, err in results:
        # A negative return code is a signal (-6: the abort); anything but 2 fails.
        assert code == 2, (argv, code, err[-400:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jaxroll: error:"), (argv, err[-400:])
    for index in range(len(runs)):
        assert not (tmp_path / f"out{index}").exists()


def test_early_refusals_exit_2_every_time(files, tmp_path):
    runs = [argv for argv, weight in CASES for _ in range(weight)]
    assert len(runs) >= 40
    _run_all(runs, files, tmp_path)


@pytest.mark.slow
def test_early_refusals_exit_2_every_time_200_runs(files, tmp_path):
    runs = [argv for argv, weight in CASES for _ in range(max(weight, 2))]
    runs = (runs * (200 // len(runs) + 1))[:200]
    _run_all(runs, files, tmp_path)


@pytest.mark.parametrize("argv", [argv for argv, _ in CASES], ids=lambda argv: " ".join(argv[:2]))
def test_a_refusal_leaves_no_thread_running(argv, files, tmp_path, capsys):
    before = set(threading.enumerate())
    assert main(_argv(argv, files, tmp_path / "out")) == 2
    assert capsys.readouterr().err.startswith("jaxroll: error:")
    assert set(threading.enumerate()) - before == set()
