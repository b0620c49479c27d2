"""Shared test setup.

float64 is on for the whole suite, as in lineax and diffrax, so oracles can be
compared at 1e-12; tests of the float32 default wrap their calls in the
`float32` fixture's context.
"""

import os
import tempfile
from pathlib import Path

# One intra-op thread for torch (read when torch is first imported, here and in
# subprocesses): with two xdist workers on two cores, torch's default of a
# thread per core oversubscribes the machine, and OpenMP's spin-waiting made a
# tiny model's `jaxroll measure` 5x slower (46 s -> 8.8 s, tests/test_crash.py's).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax
import pytest

jax.config.update("jax_enable_x64", True)
# `jaxroll` in a subprocess keeps its compilation cache (jaxroll.cache): in a
# temporary folder, never the user's ~/.cache; one folder per test run, shared
# by the xdist workers (JAX locks it), so a program is compiled once per run.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
os.environ.setdefault("JAXROLL_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"jaxroll-test-cache-{_RUN}") if _RUN
                      else tempfile.mkdtemp(prefix="jaxroll-test-cache-"))

import jaxroll  # noqa: E402  (after float64 is on)

# The authors' published configurations, as shipped inside the package.
REFERENCE_CONFIGS = jaxroll.published.ROOT
ROLLOUT_CONFIGS = jaxroll.published.rollout_files()


_crashed: set[str] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """A test whose xdist worker crashed runs once more, in a new worker; a second crash fails it.

    Twice in about twenty full runs a worker died of a fatal signal inside XLA
    or torch (each time in another test, never reproduced alone); the crash's
    traceback is still printed and the summary counts the test as a rerun. A
    test that fails (an exception) is never rerun: this hook sees crashes only.
    """
    if crashitem in _crashed:
        return
    _crashed.add(crashitem)
    try:
        sched.mark_test_pending(crashitem)
    except NotImplementedError:  # --dist loadscope and loadfile cannot reschedule one test: it fails
        return
    report.outcome = "rerun"


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})


def pytest_report_header(config):
    return f"reference configs: {REFERENCE_CONFIGS} ({len(ROLLOUT_CONFIGS)} rollout files)"


@pytest.fixture
def float32():
    """A context manager that turns float64 off: ``with float32: ...``."""
    return jax.enable_x64(False)


@pytest.fixture(scope="session")
def reference_configs() -> Path:
    if not REFERENCE_CONFIGS.is_dir():
        pytest.fail(f"the package data is missing (reinstall jaxroll): {REFERENCE_CONFIGS}")
    return REFERENCE_CONFIGS


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module of tiny-model tests: two threads only spin against
    each other on a busy 2-core machine (measured: a 4-layer training step 2.3 s with two, 0.17 s
    with one). The count is restored after the module."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
