"""The ``jaxroll`` command: one module per command, `_common` for what they share.

Every command has ``--help``; every bad input ends with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version

from ..errors import ConfigError
from . import _common, _threads

# Before the command modules below load NumPy: the NumPy-only commands run on one BLAS thread (see _threads).
_threads.one_blas_thread(sys.argv[1:])
from . import (cache, compare, compare_task, design, effect, fit, fit_kernel, forces, kinetic, measure, predict_rows,
               presets, rollout, score, series, sweep, task)

__all__ = ["main"]


def _build_parser():
    parser = _common.Parser(prog="jaxroll", description=(
        "Residual-aware attention rollouts: predicted position bias of causal "
        "transformers (arXiv 2602.16837)."))
    parser.add_argument("--version", action="version", version=f"jaxroll {version('jaxroll')}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_common.Parser)
    for command in (rollout, presets, measure, compare, forces, fit, fit_kernel, design, sweep, kinetic, score, effect,
                    cache, task, compare_task, series, predict_rows):
        command.add_parser(commands)
    return parser


def main(argv=None) -> int:
    """Run ``jaxroll ARGV``; return the exit status.

    0 on success; 2 after a one-line ``jaxroll: error: ...`` (bad input,
    nothing created); 130 after Ctrl-C (SIGINT), with one line saying what
    was kept (a command may raise ``KeyboardInterrupt(message)`` to name
    ``--resume``); 1, silently, when the reader of stdout went away
    (``jaxroll compare A B | head -3``), as Python's documentation on
    SIGPIPE recommends.

    From the command line (`argv` None) the persistent compilation cache is
    on (`jaxroll.cache`); a caller's ``main([...])`` leaves JAX's settings alone.
    """
    parser = _build_parser()
    if "jaxroll.io" in sys.modules:  # directories of an earlier main([...]) in this process are kept
        sys.modules["jaxroll.io"].CREATED.clear()
    try:
        # command_line: a fresh process, where a command may set JAX's platforms (set before parsing:
        # the parsed arguments are read, never changed).
        arguments = parser.parse_args(argv, namespace=argparse.Namespace(command_line=argv is None))
        _common.check_input_files(arguments)  # a mistyped path is refused before JAX or torch loads
        if argv is None and getattr(arguments, "uses_jax", True):  # the command line, not a caller's main([...])
            from .. import cache as compilation_cache

            compilation_cache.enable()  # $JAXROLL_CACHE_DIR or the XDG cache; JAXROLL_NO_CACHE=1: off
        arguments.run(arguments)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
    except ConfigError as error:
        if "jaxroll.io" in sys.modules:  # a refusal after --out was made leaves nothing behind
            sys.modules["jaxroll.io"].discard_created()
        print(f"jaxroll: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        detail = str(interrupt)
        print(f"jaxroll: interrupted{': ' + detail if detail else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except RecursionError:
        if "jaxroll.io" in sys.modules:
            sys.modules["jaxroll.io"].discard_created()
        print("jaxroll: error: input nested too deeply to read", file=sys.stderr)
        return 2
    return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises nothing more
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (captured)
        pass
