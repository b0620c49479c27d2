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

Loading a program from JAX's cache still traces and lowers the Python
function first: the cache key is a hash of the lowered program. For a
rollout at the paper's N = 256 that tracing and lowering (0.5-0.6 s on a
2-core CPU) costs more than the run. `compiled` therefore keeps a second
kind of entry in ``executables/``: the compiled executable itself
(`jax.experimental.serialize_executable`), keyed without tracing by what
determines the program: a name, the static arguments, the argument shapes
and dtypes, a hash of jaxroll's source files, the JAX and jaxlib versions,
the backend and device, ``jax_enable_x64`` and ``XLA_FLAGS``. A second
process loads it and calls it directly. Entries are written to a temporary
name and renamed (a reader never sees half a file); an entry that cannot be
loaded is compiled again and rewritten. At most `MAX_EXECUTABLES` are kept
(the least recently used go first). They are executables loaded with
pickle, so the folder must be as private as the rest of your home folder.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = ["ENV_DIR", "ENV_OFF", "MAX_BYTES", "MAX_EXECUTABLES", "CacheInfo", "directory", "enable", "info",
           "clear", "compiled", "enabled"]

ENV_DIR = "JAXROLL_CACHE_DIR"
"""Environment variable naming the compilation cache's folder (default ``$XDG_CACHE_HOME/jaxroll`` or ``~/.cache/jaxroll``)."""
ENV_OFF = "JAXROLL_NO_CACHE"
"""Environment variable that turns the command line's compilation cache off when set to 1."""
MAX_BYTES = 1 << 30  # 1 GiB; a published configuration's program is 50-300 kB
"""Size limit of the compilation cache (1 GiB); setting one makes JAX lock the folder, so concurrent processes are safe."""
MAX_EXECUTABLES = 256  # a padded rollout's executable is about 200 kB
"""Most executables `compiled` keeps in ``compilation/executables/`` (the least recently used go first)."""
_SUBFOLDER = "compilation"
_EXECUTABLES = "executables"
_SUFFIXES = ("-cache", "-atime")  # JAX's entry and access-time files
_EXECUTABLE_SUFFIX = ".executable"

_executables: Path | None = None  # set by enable(): where compiled() keeps executables
_loaded: dict[str, object] = {}  # this process's executables, by key


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
    Called before JAX is imported, it imports nothing: the settings go into
    JAX's environment variables (``JAX_COMPILATION_CACHE_DIR``, ...), which
    JAX reads when it loads (and which processes started from this one inherit).
    """
    root = Path(path) if path is not None else directory()
    if root is None:
        return None
    folder = root / _SUBFOLDER
    try:
        import filelock  # noqa: F401  (JAX locks the folder only when it can, and only with a size limit)

        limit = MAX_BYTES
    except ImportError:  # pragma: no cover - filelock comes with the install
        limit = -1
    settings = {"jax_compilation_cache_dir": str(folder), "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": -1, "jax_compilation_cache_max_size": limit}
    jax = sys.modules.get("jax")
    if jax is not None:
        for name, value in settings.items():
            jax.config.update(name, value)
    else:
        # JAX not loaded yet (a command that may answer in NumPy alone, `jaxroll.numpy_rollout`): JAX reads
        # each setting from its upper-case environment variable when it loads, so the cache costs no import.
        for name, value in settings.items():
            os.environ[name.upper()] = str(value)
    global _executables
    _executables = folder / _EXECUTABLES
    return folder


def enabled() -> bool:
    """True after `enable` turned the cache on in this process (`compiled` then keeps executables)."""
    return _executables is not None


@functools.lru_cache(maxsize=1)
def _source_hash() -> str:
    """A hash of every ``.py`` file of the jaxroll package: a code change is a new key (read once a process)."""
    digest = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _device():
    """The device a program compiled now runs on: ``jax_default_device`` (``jax.default_device``) when set,
    else the default backend's first device."""
    import jax

    chosen = jax.config.jax_default_device
    if chosen is None:
        return jax.devices()[0]
    return jax.devices(chosen)[0] if isinstance(chosen, str) else chosen


def _key(name: str, arguments, static) -> str:
    import jax
    import jaxlib

    device = _device()
    parts = [name, repr(static), _source_hash(), jax.__version__, jaxlib.__version__, device.platform,
             getattr(device, "device_kind", ""), str(len(device.client.devices())), str(jax.config.jax_enable_x64),
             os.environ.get("XLA_FLAGS", ""), *(str(jax.typeof(a)) for a in arguments)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


def compiled(name: str, function, arguments, static=()):
    """``jax.jit(function)`` compiled for `arguments`, its executable kept between processes.

    Args:
        name: what `function` computes (part of the key).
        function: a function of the flat `arguments` (arrays) only, returning
            a tuple of arrays; everything else it depends on must be in
            `static` (or be jaxroll's source code, which is hashed).
        arguments: a sequence of arrays (their shapes and dtypes are keyed).
        static: a value whose ``repr`` names everything else the program
            depends on (static arguments, a pytree's structure).

    Returns:
        A callable ``(*arguments) -> outputs``. Without `enable` (or with the
        cache off) it is ``jax.jit(function)``. With it, the executable is
        loaded from ``executables/`` when there, with no tracing or
        lowering; otherwise compiled (through JAX's cache) and written there.
    """
    import jax

    if _executables is None:
        return jax.jit(function)
    key = _key(name, arguments, static)
    if key in _loaded:
        return _loaded[key]
    from jax.experimental import serialize_executable

    path = _executables / f"{name}-{key}{_EXECUTABLE_SUFFIX}"

    def compile_and_keep():
        lowered = jax.jit(function).lower(*arguments)
        with _without_jax_cache() as bypassed:
            program = lowered.compile()
        if bypassed:  # else it may have come from JAX's cache: not kept (see _without_jax_cache)
            blob, _, out_tree = serialize_executable.serialize(program)
            if out_tree != jax.tree_util.tree_structure((0,) * out_tree.num_leaves):
                raise ValueError(f"compiled: {name} must return a flat tuple of arrays; got {out_tree}")
            _write(path, f"{out_tree.num_leaves:4d}".encode() + blob)
        _loaded[key] = program
        return program

    try:
        blob = path.read_bytes()  # 4 bytes: the number of outputs; then the executable
        out_tree = jax.tree_util.tree_structure((0,) * int(blob[:4]))
        in_tree = jax.tree_util.tree_structure((tuple(arguments), {}))
        loaded = serialize_executable.deserialize_and_load(blob[4:], in_tree, out_tree, backend=_device().client)
        os.utime(path)  # recently used
    except Exception:  # absent, or unreadable (another version, a truncated file): compile it
        return compile_and_keep()

    def first_call(*values):
        # A loaded executable that cannot run (its code missing) fails here,
        # once: then it is compiled again and rewritten.
        try:
            outputs = jax.block_until_ready(loaded(*values))
        except Exception:  # noqa: BLE001 - any failure of a cached program means: compile it
            path.unlink(missing_ok=True)
            return compile_and_keep()(*values)
        _loaded[key] = loaded
        return outputs

    _loaded[key] = first_call
    return first_call


@contextlib.contextmanager
def _without_jax_cache():
    """Compile without JAX's persistent cache; yields whether that could be arranged.

    An XLA:CPU executable that JAX loaded from its own cache serialises
    without its code (jaxlib 0.10: the next process fails with "Function
    ... not found"), so `compiled` keeps only executables it compiled
    itself. JAX decides once per process whether its cache is used
    (``jax._src.compilation_cache._cache_used``, not a public setting;
    ``jax_enable_compilation_cache`` is read only once), so that decision
    is set aside for this one compilation and restored after it. Without
    that internal name (another JAX), nothing is bypassed and nothing kept.
    """
    try:
        from jax._src import compilation_cache as internal

        state = internal._cache_checked, internal._cache_used
    except (ImportError, AttributeError):
        yield False
        return
    internal._cache_checked, internal._cache_used = True, False
    try:
        yield True
    finally:
        internal._cache_checked, internal._cache_used = state


def _write(path: Path, blob: bytes) -> None:
    """Write `blob` to `path` through a temporary file and a rename; keep at most `MAX_EXECUTABLES`."""
    import tempfile

    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(handle, "wb") as file:
            file.write(blob)
        os.replace(temporary, path)
        temporary = None
        entries = sorted(_executable_entries(path.parent), key=lambda p: p.stat().st_mtime)
        for old in entries[:max(0, len(entries) - MAX_EXECUTABLES)]:
            old.unlink(missing_ok=True)
    except OSError:  # a read-only or full disk: run without keeping it
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _executable_entries(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_file() and p.name.endswith(_EXECUTABLE_SUFFIX)]


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
    """The cache's folder, whether it is on, its number of entries and their size in bytes.

    Entries are JAX's compiled programs and `compiled`'s executables.
    """
    root = Path(path) if path is not None else directory()
    if root is None:
        return CacheInfo(None, False, 0, 0)
    folder = root / _SUBFOLDER
    entries = _entries(folder) + _executable_entries(folder / _EXECUTABLES)
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
    executables = folder / _EXECUTABLES
    count = len(_entries(folder)) + len(_executable_entries(executables))
    _loaded.clear()
    if executables.is_dir():
        for item in executables.iterdir():
            if item.is_file() and (item.name.endswith(_EXECUTABLE_SUFFIX) or item.name.startswith(".tmp-")):
                item.unlink(missing_ok=True)
        try:
            executables.rmdir()
        except OSError:  # something else lives there: keep it
            pass
    if folder.is_dir():
        for item in folder.iterdir():
            if item.is_file() and (item.name.endswith(_SUFFIXES) or item.name == ".lockfile"):
                item.unlink(missing_ok=True)
        try:
            folder.rmdir()
        except OSError:  # something else lives there: keep it
            pass
    return count
