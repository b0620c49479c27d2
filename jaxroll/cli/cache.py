"""``jaxroll cache info`` and ``jaxroll cache clear``: the persistent compilation cache."""

from __future__ import annotations

from ..errors import ConfigError
from . import _common

ACTIONS = ("info", "clear")


def add_parser(commands) -> None:
    cache = commands.add_parser(
        "cache", help="show or clear the compilation cache",
        description="The persistent compilation cache keeps JAX's compiled programs between runs "
                    "(in $JAXROLL_CACHE_DIR, else $XDG_CACHE_HOME/jaxroll, else ~/.cache/jaxroll; "
                    "JAXROLL_NO_CACHE=1 turns it off). info: its folder, entries and size; "
                    "clear: delete every entry.")
    # A bare `jaxroll cache` prints this help (exit 0) rather than a usage error.
    # Checked in _run_cache rather than by argparse's choices, so that a misspelt option before a value
    # (``cache --josn 1``) is named as the misspelling, not as a bad action.
    cache.add_argument("action", nargs="?", metavar="{info,clear}", help="info or clear")
    _common.add_json_argument(cache)
    cache.set_defaults(run=_run_cache, uses_jax=False, print_help=cache.print_help)


def _size(size: float) -> str:
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def _run_cache(arguments) -> None:
    from .. import cache

    if arguments.action is None:
        arguments.print_help()
        return
    if arguments.action not in ACTIONS:
        raise ConfigError.of("cache", arguments.action, ", ".join(ACTIONS))
    if arguments.action == "clear":
        removed = cache.clear()
        folder = cache.info().folder
        if arguments.json:
            _common.print_json({"removed": removed, "folder": None if folder is None else str(folder)})
            return
        print(f"jaxroll cache: removed {removed} entries from {folder}" if folder is not None
              else f"jaxroll cache: off ({cache.ENV_OFF} is set); nothing removed")
        return
    state = cache.info()
    if arguments.json:
        _common.print_json({"enabled": state.enabled, "folder": None if state.folder is None else str(state.folder),
                            "entries": state.entries, "size_bytes": state.size_bytes,
                            "limit_bytes": cache.MAX_BYTES})
        return
    if not state.enabled:
        print(f"jaxroll cache: off ({cache.ENV_OFF} is set)")
        return
    print(f"jaxroll cache: {state.folder}")
    print(f"  {state.entries} compiled programs, {_size(state.size_bytes)} (limit {_size(cache.MAX_BYTES)})")
    print(f"  move it with {cache.ENV_DIR}=DIR, turn it off with {cache.ENV_OFF}=1")
