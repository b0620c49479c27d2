"""Shared test setup.

float64 is on for the whole suite, as in lineax and diffrax, so oracles can be
compared at 1e-12; tests of the float32 default wrap their calls in the
`float32` fixture's context.
"""

import os
import tempfile
from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)
# `jaxroll` in a subprocess keeps its compilation cache (jaxroll.cache): in a
# temporary folder, never the user's ~/.cache.
os.environ.setdefault("JAXROLL_CACHE_DIR", tempfile.mkdtemp(prefix="jaxroll-test-cache-"))

import jaxroll  # noqa: E402  (after float64 is on)

# The authors' published configurations, as shipped inside the package.
REFERENCE_CONFIGS = jaxroll.published.ROOT
ROLLOUT_CONFIGS = jaxroll.published.rollout_files()


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
