"""The persistent compilation cache: compiled programs kept between processes.

JAX compiles each jitted function once per shape, which costs 0.5-1.3 s per
geometry on a CPU, longer than the rollout itself at the paper's N = 256.
JAX can keep the compiled programs on disk (its persistent compilation
cache, ``jax_compilation_cache_dir``) and load them in the next process in
milliseconds. The ``jaxroll`` command turns it on by default; library users
call `enable` themselves.

Where: ``$JAXROLL_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/jaxroll``, else
``~/.cache/jaxroll``; JAX's entries go into its ``compilation/`` folder.
``JAXROLL_NO_CACHE=1`` turns the cache off. ``jaxroll cache info`` shows the
folder, the number of entries and their size; ``jaxroll cache clear`` empties
it. Entries are keyed by the program, the JAX and jaxlib versions, the
backend and the compile options, so a stale entry is never used; the folder
is kept under ``MAX_BYTES`` by evicting the least recently used entries.

Concurrent processes: JAX writes an entry with a plain ``write_bytes``,
which a reader in another process can see half-written, unless a size limit
is set; then every read and write holds a file lock (``filelock``) on the
folder. `enable` always sets the limit, so two ``jaxroll`` processes sharing
the cache are safe (tests/test_cache.py runs them side by side). An
unreadable entry is in any case only a warning: JAX then compiles.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["ENV_DIR", "ENV_OFF", "MAX_BYTES", "CacheInfo", "directory", "enable", "info", "clear"]

ENV_DIR = "JAXROLL_CACHE_DIR"
"""Environment variable naming the compilation cache's folder (default ``$XDG_CACHE_HOME/jaxroll`` or ``~/.cache/jaxroll``)."""
ENV_OFF = "JAXROLL_NO_CACHE"
"""Environment variable that turns the command line's compilation cache off when set to 1."""
MAX_BYTES = 1 << 30  # 1 GiB; a published configuration's program is 50-300 kB
"""Size limit of the compilation cache (1 GiB); setting one makes JAX lock the folder, so concurrent processes are safe."""
_SUBFOLDER = "compilation"
_SUFFIXES = ("-cache", "-atime")  # JAX's entry and access-time files


def directory() -> Path | None:
    """The cache folder, or None when ``JAXROLL_NO_CACHE`` is set (to anything but '', '0').

    ``$JAXROLL_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxroll``, else ``~/.cache/jaxroll``.
    """
    if os.environ.get(ENV_OFF, "") not in ("", "0"):
        return None
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxroll"


def enable(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in `path` (default `directory()`).

    Every compiled program is kept (no minimum compile time or size: the
    rollout's programs compile in 0.1-1.3 s and JAX's default keeps only
    those over 1 s). Returns the folder of JAX's entries, or None when the
    cache is turned off (``JAXROLL_NO_CACHE=1`` and no `path`). Call it
    before the first compilation: JAX opens the cache once per process.
    """
    root = Path(path) if path is not None else directory()
    if root is None:
        return None
    folder = root / _SUBFOLDER
    import jax

    try:
        import filelock  # noqa: F401  (JAX locks the folder only when it can, and only with a size limit)

        limit = MAX_BYTES
    except ImportError:  # pragma: no cover - filelock comes with the install
        limit = -1
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_compilation_cache_max_size", limit)
    return folder


class CacheInfo(NamedTuple):
    """What `info` reports: the folder, whether it is on, its entries and their bytes."""

    folder: Path | None
    enabled: bool
    entries: int
    size_bytes: int


def _entries(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_file() and p.name.endswith("-cache")]


def info(path: str | os.PathLike | None = None) -> CacheInfo:
    """The cache's folder, whether it is on, its number of entries and their size in bytes."""
    root = Path(path) if path is not None else directory()
    if root is None:
        return CacheInfo(None, False, 0, 0)
    folder = root / _SUBFOLDER
    entries = _entries(folder)
    return CacheInfo(folder, True, len(entries), sum(p.stat().st_size for p in entries))


def clear(path: str | os.PathLike | None = None) -> int:
    """Delete every cached program; return how many there were.

    Removes JAX's entry files and its lock file, and the ``compilation/``
    folder when nothing else is left in it. Other files are left alone.
    """
    root = Path(path) if path is not None else directory()
    if root is None:
        return 0
    folder = root / _SUBFOLDER
    count = len(_entries(folder))
    if folder.is_dir():
        for item in folder.iterdir():
            if item.is_file() and (item.name.endswith(_SUFFIXES) or item.name == ".lockfile"):
                item.unlink(missing_ok=True)
        try:
            folder.rmdir()
        except OSError:  # something else lives there: keep it
            pass
    return count
