"""The crashed-worker rerun of conftest.py (`pytest_handlecrashitem`), in a pytest of its own.

A test that kills its xdist worker once is run again in a new worker and
passes; one that kills every worker it runs in is run twice and then
fails; a test that fails with an exception is never rerun.
"""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CASES = '''
import os, signal
from pathlib import Path

def test_crashes_once():
    flag = Path(__file__).with_name("crashed-once")
    if not flag.exists():
        flag.write_text("1")
        os.kill(os.getpid(), signal.SIGSEGV)

def test_crashes_always():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_fails():
    assert 1 == 2

def test_passes():
    pass
'''


def test_a_crash_reruns_once_and_a_failure_never(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    # conftest.py as a plugin (-p), in the controller and both workers; no ini file, so no addopts.
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                          "-n", "2", "--rootdir", str(tmp_path), "-rf", str(tmp_path / "test_cases.py")],
                         cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 1, run.stdout[-2000:]
    assert "2 failed, 2 passed, 2 rerun" in summary, run.stdout[-2000:]
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert sorted(line.split()[1].split("::")[1] for line in failed) == ["test_crashes_always", "test_fails"]
