"""The persistent compilation cache (jaxroll.cache, `jaxroll cache info|clear`).

The cross-process checks run `jaxroll` in subprocesses through
tests/cache_worker.py, which counts JAX's own compilation events
(jax.monitoring): a process that finds its programs in the cache has cache
hits and no cache misses, i.e. compiles nothing. Every test uses a temporary
cache folder, never the user's ~/.cache.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxroll
from jaxroll import cache
from jaxroll.cli import main

WORKER = Path(__file__).parent / "cache_worker.py"
CONFIG = jaxroll.published.path("mpt-7b", "mean")
HITS, MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"


def start(folder, out, *extra):
    environment = {**os.environ, cache.ENV_DIR: str(folder)}
    environment.pop(cache.ENV_OFF, None)
    return subprocess.Popen([sys.executable, str(WORKER), "rollout", str(CONFIG), "--length", "64",
                             "--out", str(out), *extra], env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process) -> dict:
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    # An unreadable (half-written) entry would be a warning from JAX, then a compile.
    assert "compilation cache" not in stderr, stderr
    return json.loads(stdout.strip().splitlines()[-1])["events"]


def test_the_folder_follows_the_environment(monkeypatch, tmp_path):
    for name in (cache.ENV_DIR, cache.ENV_OFF, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.directory() == tmp_path / "home/.cache/jaxroll"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.directory() == tmp_path / "xdg/jaxroll"
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "mine"))
    assert cache.directory() == tmp_path / "mine"
    monkeypatch.setenv(cache.ENV_OFF, "0")
    assert cache.directory() == tmp_path / "mine"
    monkeypatch.setenv(cache.ENV_OFF, "1")
    assert cache.directory() is None
    assert cache.enable() is None  # off: JAX's settings untouched
    assert cache.info() == cache.CacheInfo(None, False, 0, 0)
    assert cache.clear() == 0


def test_info_and_clear_count_and_remove_only_jaxs_entries(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(cache.ENV_OFF, raising=False)
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))
    folder = tmp_path / "compilation"
    folder.mkdir()
    for key, size in (("jit_a-1", 100), ("jit_b-2", 50)):
        (folder / f"{key}-cache").write_bytes(b"x" * size)
        (folder / f"{key}-atime").write_bytes(b"t" * 8)
    (tmp_path / "notes.txt").write_text("not ours")
    assert cache.info() == cache.CacheInfo(folder, True, 2, 150)
    assert main(["cache", "info"]) == 0
    assert "2 compiled programs, 150 B" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert not folder.exists() and (tmp_path / "notes.txt").read_text() == "not ours"
    assert cache.info() == cache.CacheInfo(folder, True, 0, 0)


def test_a_second_process_compiles_nothing_and_concurrent_processes_share_safely(tmp_path):
    folder = tmp_path / "cache"
    # Two processes at once on an empty cache: both write the same entries.
    first = [start(folder, tmp_path / f"out{i}") for i in range(2)]
    events = [finish(process) for process in first]
    assert all(e.get(MISSES, 0) + e.get(HITS, 0) >= 1 for e in events)  # the cache was used
    assert cache.info(folder).entries >= 1
    # A third process afterwards finds every program: hits, and no compilation at all.
    third = finish(start(folder, tmp_path / "out2"))
    assert third.get(HITS, 0) >= 1 and third.get(MISSES, 0) == 0, third
    profiles = [jaxroll.read_profile(tmp_path / f"out{i}/profile.csv") for i in range(3)]
    for profile in profiles[1:]:
        np.testing.assert_array_equal(profile, profiles[0])  # the same program: the same bits
    # Turned off: no cache events, nothing written.
    environment = {**os.environ, cache.ENV_OFF: "1", cache.ENV_DIR: str(tmp_path / "unused")}
    result = subprocess.run([sys.executable, str(WORKER), "rollout", str(CONFIG), "--length", "64",
                             "--out", str(tmp_path / "off")], env=environment, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    off = json.loads(result.stdout.strip().splitlines()[-1])["events"]
    assert off.get(HITS, 0) == off.get(MISSES, 0) == 0 and not (tmp_path / "unused").exists()


def test_main_with_arguments_leaves_jax_settings_alone(tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    assert main(["rollout", "--preset", "mpt-7b", "--length", "8", "--out", str(tmp_path / "o")]) == 0
    assert jax.config.jax_compilation_cache_dir == before
