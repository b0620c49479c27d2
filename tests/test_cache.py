"""The persistent compilation cache (jaxroll.cache, `jaxroll cache info|clear`).

The cross-process checks run `jaxroll` in subprocesses through
tests/cache_worker.py, which counts JAX's own compilation events
(jax.monitoring): a process that finds its rollout's executable in the cache
(`cache.compiled`) traces and compiles nothing; one that finds a program in
JAX's own cache has cache hits and no cache misses. Every test uses a temporary
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


def start(folder, out, *configs):
    """``jaxroll rollout CONFIG... --length 64 --no-figure`` with the cache in `folder` (default: CONFIG)."""
    environment = {**os.environ, cache.ENV_DIR: str(folder)}
    environment.pop(cache.ENV_OFF, None)
    return subprocess.Popen([sys.executable, str(WORKER), "rollout", *map(str, configs or (CONFIG,)),
                             "--length", "64", "--out", str(out), "--no-figure"], env=environment, text=True,
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


COMPILES, TRACES = "/jax/core/compile/backend_compile_duration", "/jax/core/compile/jaxpr_trace_duration"
KERNEL_CONFIG = """sequence_length: 16
num_layers: 2
kernel_config: {kernel_type: relative, family: power, num_heads: 1, slopes: [[0.02], [0.03]], exponents: [[0.8]]}
lambda_schedule_config: {schedule_type: custom, lambdas_custom: [0.16, 0.19]}
"""  # --length 64 applies to it too


def test_a_second_process_compiles_nothing_and_concurrent_processes_share_safely(tmp_path):
    folder = tmp_path / "cache"
    # CONFIG (ALiBi: cache.compiled's executable) and a relative-position kernel (JAX's own cache).
    kernel = tmp_path / "kernel.yaml"
    kernel.write_text(KERNEL_CONFIG)
    # Two processes at once on an empty cache. Each asks JAX's cache once, for the kernel's program: a
    # miss (compiled) or, if it starts late enough to find the other's entry, a hit. Each also compiles
    # the ALiBi executable or loads the other's from cache.compiled. JAX records a compile event for a
    # hit too, so a process's compiles are its misses + hits + (1 if it compiled ALiBi itself). CI
    # on a loaded machine saw both late cases: an executable loaded, and a hit beside an ALiBi compile.
    first = [start(folder, tmp_path / f"out{i}", CONFIG, kernel) for i in range(2)]
    events = [finish(process) for process in first]
    alibi_compiled = [e.get(COMPILES, 0) - e.get(MISSES, 0) - e.get(HITS, 0) for e in events]
    assert all(e.get(MISSES, 0) + e.get(HITS, 0) == 1 for e in events), events
    assert all(n in (0, 1) for n in alibi_compiled), events
    # Someone compiled each program: the cache started empty.
    assert sum(e.get(MISSES, 0) for e in events) >= 1 and sum(alibi_compiled) >= 1, events
    assert cache.info(folder).entries >= 2
    assert list((folder / "compilation" / "executables").glob(".tmp-*")) == []  # renamed, none left half-written
    # A third process afterwards: the ALiBi executable loaded untraced, the kernel's program a cache
    # hit (traced, so the cache key is known): no compilation at all.
    third = finish(start(folder, tmp_path / "out2", CONFIG, kernel))
    assert third.get(MISSES, 0) == 0 and third.get(HITS, 0) == third.get(COMPILES, 0) == 1, third
    assert third.get(TRACES, 0) == 1, third
    for name in (CONFIG.stem, kernel.stem):
        profiles = [jaxroll.read_profile(next((tmp_path / f"out{i}").glob(f"*{name}*")) / "profile.csv")
                    for i in range(3)]
        for profile in profiles[1:]:
            np.testing.assert_array_equal(profile, profiles[0])  # the same program: the same bits
    # Turned off: no cache events, nothing written.
    environment = {**os.environ, cache.ENV_OFF: "1", cache.ENV_DIR: str(tmp_path / "unused")}
    result = subprocess.run([sys.executable, str(WORKER), "rollout", str(CONFIG), "--length", "64",
                             "--out", str(tmp_path / "off"), "--no-figure"], env=environment,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    off = json.loads(result.stdout.strip().splitlines()[-1])["events"]
    assert off.get(HITS, 0) == off.get(MISSES, 0) == 0 and not (tmp_path / "unused").exists()


@pytest.fixture
def executables(monkeypatch, tmp_path):
    """`cache.compiled` keeping executables in a temporary folder (JAX's own settings untouched)."""
    monkeypatch.setattr(cache, "_executables", tmp_path / "executables")
    monkeypatch.setattr(cache, "_loaded", {})
    return tmp_path / "executables"


def test_compiled_loads_a_kept_executable_without_tracing_and_recompiles_a_broken_one(executables):
    import jax.numpy as jnp

    traced = []

    def new_function():  # a new function object each time: jax.jit's in-memory cache cannot answer
        def function(x, y):
            traced.append(1)  # runs once per trace
            return jnp.cumsum(x * y), jnp.sum(x)
        return function

    x, y = np.linspace(0.0, 1.0, 7), np.arange(7.0)
    expected = (np.cumsum(x * y), np.sum(x))  # NumPy oracle (float64 in the suite); sums of 7 terms: 1e-12

    def check(program, size=7):
        outputs = program(x[:size], y[:size])
        np.testing.assert_allclose(outputs[0], np.cumsum(x[:size] * y[:size]), rtol=1e-12)
        np.testing.assert_allclose(outputs[1], np.sum(x[:size]), rtol=1e-12)

    check(cache.compiled("f", new_function(), (x, y), static="s"))
    assert len(traced) == 1
    (entry,) = executables.glob("*.executable")
    cache._loaded.clear()  # as a new process: only the file is left
    check(cache.compiled("f", new_function(), (x, y), static="s"))
    assert len(traced) == 1  # loaded, not traced
    # Another static value or another shape is another program.
    check(cache.compiled("f", new_function(), (x, y), static="other"))
    check(cache.compiled("f", new_function(), (x[:5], y[:5]), static="s"), size=5)
    assert len(traced) == 3 and len(list(executables.glob("*.executable"))) == 3
    # A truncated entry, and one that loads but whose code is garbage: compiled again.
    for broken in (entry.read_bytes()[:100], entry.read_bytes()[:4] + b"\x80\x04garbage"):
        entry.write_bytes(broken)
        cache._loaded.clear()
        check(cache.compiled("f", new_function(), (x, y), static="s"))
    assert len(traced) == 5
    cache._loaded.clear()
    check(cache.compiled("f", new_function(), (x, y), static="s"))  # rewritten whole: loads again
    assert len(traced) == 5


def test_a_kept_executable_that_fails_to_run_is_compiled_again(executables, monkeypatch):
    """As an XLA:CPU executable without its code (loaded, then "Function ... not found" when run)."""
    import jax.numpy as jnp
    from jax.experimental import serialize_executable

    x = np.arange(5.0)
    cache.compiled("g", lambda v: (jnp.cumsum(v),), (x,))(x)

    def broken(*_):
        raise RuntimeError("NOT_FOUND: Function fusion not found")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *a, **k: broken)
    cache._loaded.clear()
    (result,) = cache.compiled("g", lambda v: (jnp.cumsum(v),), (x,))(x)
    np.testing.assert_array_equal(result, np.cumsum(x))  # integers in float64: exact



def test_kept_executables_follow_the_default_device(executables):
    """Under ``jax.default_device`` (``jaxroll rollout --device``) the key and the loaded program are that device's."""
    import jax
    import jax.numpy as jnp

    cpu = jax.devices("cpu")[0]
    x = np.arange(6.0)
    traced = []

    def function(v):
        traced.append(1)
        return (jnp.cumsum(v),)

    for chosen in (cpu, "cpu"):
        with jax.default_device(chosen):
            assert cache._device() == cpu
            (first,) = cache.compiled("h", function, (x,))(x)
            cache._loaded.clear()
            (second,) = cache.compiled("h", function, (x,))(x)  # from the file, onto the CPU's client
        for result in (first, second):
            np.testing.assert_array_equal(result, np.cumsum(x))  # integers in float64: exact
            assert result.devices() == {cpu}
    assert len(traced) == 1  # one key for the device and for its platform's name

def test_clear_removes_kept_executables(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.ENV_OFF, raising=False)
    kept = tmp_path / "compilation" / "executables"
    kept.mkdir(parents=True)
    (kept / "influence_with_mass-abc.executable").write_bytes(b"x" * 30)
    assert cache.info(tmp_path) == cache.CacheInfo(tmp_path / "compilation", True, 1, 30)
    assert cache.clear(tmp_path) == 1
    assert not (tmp_path / "compilation").exists()


def test_main_with_arguments_leaves_jax_settings_alone(tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    assert main(["rollout", "--preset", "mpt-7b", "--length", "8", "--out", str(tmp_path / "o")]) == 0
    assert jax.config.jax_compilation_cache_dir == before
