"""How much memory a run needs, checked before any work is done.

XLA aborts the whole process (a C++ stack dump, no Python exception) when an
allocation fails, so a length that cannot fit is refused up front, with the
estimate and what the machine has, instead of crashing midway.
"""

from __future__ import annotations

import os
import re

from .errors import ConfigError

__all__ = ["available_bytes", "resident_bytes", "influence_bytes", "model_influence_bytes", "check_fits", "parse_size",
           "format_size"]

# Working set of one structured influence pass per position, in array
# elements: a chunk of 16 heads with a few buffers each (scan carries,
# normalisers, the blocked scan's inputs and outputs) and the row itself.
# benchmarks/influence.py measures about 70 float32 elements per position
# for BLOOM-176B at N = 2^20; 128 leaves room for XLA's temporaries.
_STRUCTURED_ELEMENTS_PER_POSITION = 128
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def available_bytes() -> int:
    """Memory this process may still use: MemAvailable on Linux, else physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resident_bytes() -> int:
    """This process's resident set size now, in bytes (what a peak-RSS estimate starts from).

    psutil's ``Process().memory_info().rss`` when psutil is installed, else
    ``VmRSS`` of /proc/self/status (Linux); 0 where neither answers (the
    estimate then counts the libraries as not loaded).
    """
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def influence_bytes(n: int, num_heads: int, method: str, itemsize: int = 4) -> int:
    """Peak working memory of one `jaxroll.influence` call at length `n`, in bytes (an estimate).

    Structured: O(n) (``128 n`` elements); dense: each ``(n, n)`` head kernel
    of a layer and the layer mixture, ``(H + 2) n^2`` elements; ``"fft"``
    (the relative-position kernels, `jaxroll.relative`): per head six real
    ``(n,)`` rows (scores, weights, normaliser, the weighted row) and two
    complex spectra of ``L / 2 + 1`` entries with ``L = 2^ceil(log2(2n - 1))``,
    plus their product, ``H (6 n + 3 L)`` elements, and the structured row.
    """
    if method == "dense":
        elements = (num_heads + 2) * n * n
    elif method == "fft":
        length = 1 << max(0, (2 * n - 2).bit_length())
        elements = num_heads * (6 * n + 3 * length) + _STRUCTURED_ELEMENTS_PER_POSITION * n
    else:
        elements = _STRUCTURED_ELEMENTS_PER_POSITION * n
    return int(elements) * itemsize


def model_influence_bytes(model, n: int, method: str = "auto", itemsize: int = 4) -> int:
    """`influence_bytes` of a model: its kernel says what one pass holds (`AbstractKernel.influence_bytes`)."""
    return model.kernel.influence_bytes(n, "dense" if method == "dense" else "structured", itemsize)


def parse_size(text: str) -> int:
    """``"512M"``, ``"8G"``, ``"1.5g"``, ``"1000000"`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([bkmgt]?)i?b?\s*", str(text).lower())
    if not match:
        raise ConfigError(f"--max-memory: got {text!r}; allowed: a size such as 512M, 8G or a number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def format_size(size: float) -> str:
    """A byte count in binary units with three significant digits, e.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def check_fits(needed: int, what: str, limit: int | None = None, *,
               allowed: str = "a shorter --length (or --max-memory SIZE to override)",
               limit_source: str = "--max-memory allows") -> None:
    """Raise a one-line `ConfigError` when `needed` bytes exceed `limit` (default: available memory).

    The message names the budget as ``this machine has`` (no `limit`) or
    `limit_source` (who set the limit).
    """
    budget = available_bytes() if limit is None else limit
    if needed > budget:
        source = "this machine has" if limit is None else limit_source
        raise ConfigError(f"{what}: needs about {format_size(needed)} of memory; {source} "
                          f"{format_size(budget)}; allowed: {allowed}")
