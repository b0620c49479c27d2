"""matplotlib loaded for a command's figure without the docstrings nobody reads in a one-off process.

While matplotlib's artist classes are defined, each generates the docstring
of its ``set`` method: a table of every property of the class
(`matplotlib.artist.kwdoc`, an introspection of all its setters), and
``matplotlib.text``, ``lines``, ``patches`` and ``collections`` interpolate
more of them into their docstrings. That is about a third of the CPU time of
importing ``matplotlib.figure`` and the Agg canvas (0.33 s -> 0.22 s of CPU,
7 fresh processes each, load average 5, 2026-12-06; matplotlib 3.11.2).
`load_matplotlib` imports the two modules `jaxroll.plot` draws with while
`kwdoc` answers an empty table, then puts `kwdoc` back: in that process
``help(Line2D.set)`` lists no properties; everything drawn is the same pixel
for pixel (tests/test_figure_latency.py).
"""

from __future__ import annotations

import sys


def load_matplotlib(command_line: bool) -> None:
    """Import ``matplotlib.figure`` and ``matplotlib.backends.backend_agg`` with `kwdoc` answering "".

    Only in a command-line process (`command_line`: ``arguments.command_line``),
    whose docstrings nobody reads; a caller's ``main([...])`` (a notebook, a
    test) keeps matplotlib's own. Does nothing when matplotlib's figure module
    is loaded already.
    """
    if not command_line or "matplotlib.figure" in sys.modules:
        return
    import matplotlib.artist

    kwdoc = matplotlib.artist.kwdoc
    matplotlib.artist.kwdoc = _no_properties
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    finally:
        matplotlib.artist.kwdoc = kwdoc


def _no_properties(artist) -> str:
    """`matplotlib.artist.kwdoc`'s stand-in while the artist classes load: no table of properties."""
    return ""
