"""One BLAS thread for the NumPy-only commands, set before NumPy loads.

`jaxroll effect` and `jaxroll score` multiply small matrices: the bootstrap's
``(B, S) x (S, N)`` counts times rows (B = 1000, S = 16, N = 64: 1M
multiply-adds). OpenBLAS, as NumPy's wheels bundle it, splits such a
product over a thread per core; waking and joining them cost more than the
product itself: 3.0 ms a product against 0.08 ms on one thread (2 cores,
load average about 2, 2026-12-06), and starting the pool adds about 45 ms
to ``import numpy`` (docs/performance.md, "effect and score with their
figures"). The threads split the rows and columns of the result, not
the sums, so every number is the same bit for bit (tests/
test_figure_latency.py compares ``--json`` with two threads and with one).

The variables are read once, when NumPy loads its BLAS, so `one_blas_thread`
runs when `jaxroll.cli` is imported, before any command module imports
NumPy; a value the user set is kept, and other commands (JAX, torch, large
NumPy products) are left alone.
"""

from __future__ import annotations

import os

NUMPY_COMMANDS = frozenset({"effect", "score"})
"""The commands whose work is small NumPy products (no JAX, no torch)."""

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Read by OpenBLAS (NumPy's PyPI wheels) and MKL (conda's NumPy) when they load."""


def one_blas_thread(argv) -> bool:
    """Set each of `BLAS_THREAD_VARIABLES` the user left unset to 1 when ``argv[0]`` is in `NUMPY_COMMANDS`.

    `argv`: the command line after the program name (``sys.argv[1:]``).
    Returns whether the command is one of them. Has no effect once NumPy is
    loaded (a caller's process that imported it before `jaxroll.cli`).
    """
    if not argv or argv[0] not in NUMPY_COMMANDS:
        return False
    for name in BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
    return True
