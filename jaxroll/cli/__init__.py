"""The ``jaxroll`` command: one module per command, `_common` for what they share.

Every command has ``--help``; every bad input ends with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import sys
from importlib.metadata import version

from ..errors import ConfigError
from . import _common
from . import fit, kinetic, measure, rollout, sweep, theory

__all__ = ["main"]


def _build_parser():
    parser = _common.Parser(prog="jaxroll", description=(
        "Residual-aware attention rollouts: predicted position bias of causal "
        "transformers (arXiv 2602.16837)."))
    parser.add_argument("--version", action="version", version=f"jaxroll {version('jaxroll')}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_common.Parser)
    for command in (rollout, measure, theory, fit, sweep, kinetic):
        command.add_parser(commands)
    return parser


def main(argv=None) -> int:
    """Run ``jaxroll ARGV``; return the exit status (0, or 2 after a one-line error on stderr)."""
    parser = _build_parser()
    try:
        arguments = parser.parse_args(argv)
        arguments.run(arguments)
    except ConfigError as error:
        print(f"jaxroll: error: {error}", file=sys.stderr)
        return 2
    return 0
