"""What several commands share: the parser, argument types, --out/--force/--float64, the model arguments."""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path

from ..errors import ConfigError


class _Wrapper(textwrap.TextWrapper):
    """Wraps at spaces and after commas, never inside a word: ``lambdas,diagonal_scores``
    may break after its comma, never as ``diagonal_s cores``."""

    def _split(self, text):
        return re.findall(r"\s+|[^\s,]+,?|,", text)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter without broken words (see `_Wrapper`)."""

    def _wrapper(self, width, **options):
        return _Wrapper(width=max(width, 20), break_long_words=False, break_on_hyphens=False, **options)

    def _split_lines(self, text, width):
        return self._wrapper(width).wrap(self._whitespace_matcher.sub(" ", text).strip())

    def _fill_text(self, text, width, indent):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return self._wrapper(width, initial_indent=indent, subsequent_indent=indent).fill(text)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, and help never breaks a word."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        # "jaxroll: error: rollout: ...", not "jaxroll: error: jaxroll rollout: ..."
        command = self.prog.partition(" ")[2]
        if message.startswith("the following arguments are required"):
            # "--lenght 8" leaves --length missing: name the misspelt option, not the one it was meant to be.
            unknown = [item for item in getattr(self, "_given", ()) if item.startswith("--") and not any(
                option.startswith(item.partition("=")[0]) for option in self._option_string_actions)]
            if unknown:
                message = unrecognized(self, unknown)
        raise ConfigError(f"{command}: {message}" if command else message)

    def parse_known_args(self, args=None, namespace=None):
        import sys

        self._given = list(sys.argv[1:] if args is None else args)  # for error(): the options given
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        """argparse's, but an unknown option names the command it was given to and the closest option it has."""
        arguments, extras = self.parse_known_args(args, namespace)
        if extras:
            parser, command = self, self.prog.partition(" ")[2]
            for action in self._subparsers._group_actions if self._subparsers is not None else ():
                chosen = getattr(arguments, action.dest, None) if action.dest != argparse.SUPPRESS else None
                if isinstance(getattr(action, "choices", None), dict) and chosen in action.choices:
                    parser, command = action.choices[chosen], chosen
            raise ConfigError(f"{command + ': ' if command else ''}{unrecognized(parser, extras)}")
        return arguments


def unrecognized(parser: argparse.ArgumentParser, extras) -> str:
    """``unrecognized arguments: --lenght; did you mean --length?`` (difflib's closest of `parser`'s options),
    or the options allowed when none is close."""
    import difflib

    options = sorted(option for option in parser._option_string_actions if option.startswith("--"))
    hints = {}
    for extra in extras:
        name = extra.partition("=")[0]
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.6) if name.startswith("-") else []
        if close:
            hints[name] = close[0]
    message = f"unrecognized arguments: {' '.join(extras)}"
    if len(hints) == 1:
        return f"{message}; did you mean {next(iter(hints.values()))}?"
    if hints:
        return f"{message}; did you mean {', '.join(f'{close} for {name}' for name, close in hints.items())}?"
    return f"{message}; allowed: {', '.join(options)} (see --help)"


def _integer_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`, or a one-line error naming the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}; allowed: an integer >= {minimum}")
        return value

    return parse


positive_int = _integer_at_least(1)
non_negative_int = _integer_at_least(0)


def add_output_arguments(parser) -> None:
    """``--out DIR`` (default ``results/<command>``), ``--force`` and ``--float64``.

    A folder per command, so that ``jaxroll rollout`` then ``jaxroll forces``
    never meet in one directory (nor mix their files under ``--force``).
    """
    command = parser.prog.partition(" ")[2] or parser.prog
    default = Path("results") / command
    parser.add_argument("--out", type=Path, default=default, help=f"output directory (default {default})")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    parser.add_argument("--float64", action="store_true", help="compute in float64")


def add_json_argument(parser) -> None:
    """``--json``: the command's results as one JSON object on stdout instead of its table (`print_json`)."""
    parser.add_argument("--json", action="store_true",
                        help="print the results as one JSON object on stdout instead of the table")


def plain_json(value):
    """``json.dumps``' `default`: NumPy arrays as lists, NumPy scalars as numbers, paths as text."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def print_json(results) -> None:
    """`results` (a mapping of plain values, NumPy scalars and arrays) as one line of JSON on stdout."""
    import json

    print(json.dumps(results, default=plain_json, allow_nan=False))


class _Retired(argparse.Action):
    """An old spelling: refused in one line that names the new one (no silent alias)."""

    def __init__(self, option_strings, dest, replacement: str = "", **kwargs):
        self.replacement = replacement
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        raise ConfigError(f"{option_string}: retired; use {self.replacement} (docs/changelog.md lists the renames)",
                          field=option_string, value=values, allowed=self.replacement)


def add_retired_argument(parser, old: str, replacement: str, *, takes_value: bool = True) -> None:
    """Refuse `old` (an option of an earlier release) in one line naming `replacement`."""
    parser.add_argument(old, action=_Retired, replacement=replacement, nargs=None if takes_value else 0,
                        dest=f"retired_{old.lstrip('-').replace('-', '_')}")


class RegisteredText:
    """Text from the intervention registry, formed only when argparse expands ``%(...)s`` in a help: set it as
    an attribute of the action the help names.

    The registry imports JAX; a process that has not loaded it (``jaxroll design --help``) reads the
    built-in types from `_names` instead (the same names: tests/test_latency.py), so a help answers without
    JAX. Once loaded, the registry is read: it may hold types registered in this process.
    """

    def __init__(self, form, kinds: str = "intervention_types"):
        self.form, self.kinds = form, kinds

    def __str__(self) -> str:
        import sys

        if "jaxroll.interventions" in sys.modules:
            return self.form(getattr(sys.modules["jaxroll.interventions"], self.kinds)())
        import types

        from ._names import DESIGNABLE, INTERVENTIONS

        built_in = ([types.SimpleNamespace(name=name, options=(), box=box) for name, box in DESIGNABLE]
                    if self.kinds == "designable" else
                    [types.SimpleNamespace(name=name, options=options) for name, options in INTERVENTIONS])
        return self.form(built_in)


INTERVENTION_NAMES = RegisteredText(lambda kinds: ", ".join(
    kind.name + (f" ({', '.join(kind.options)})" if kind.options else "") for kind in kinds))
"""The registered interventions' names (and their options), in the order they apply, for ``--intervene`` helps."""


class GivenOnce(argparse.Action):
    """An option that may be given once: a second ``--intervene`` is refused in one line, not taken
    in place of the first (argparse keeps the last silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            raise ConfigError(f"{option_string}: given twice; allowed: once (join the values: NAME=VALUE,NAME=VALUE, "
                              "or one YAML file)", field=option_string, value=values, allowed="once")
        setattr(namespace, self.dest, values)


def add_intervene_argument(parser, purpose: str, record: str) -> None:
    """``--intervene NAME=VALUE[,...]`` (given once), its help listing the registered interventions:
    `purpose` says what the command does with them, `record` where the run records them."""
    intervene = parser.add_argument(
        "--intervene", metavar="NAME=VALUE[,...]", action=GivenOnce,
        help=f"{purpose}, NAME one of %(names)s, e.g. tau=0.7,gamma=0.5, or a YAML file of them; {record} "
             "(docs/interventions.md)")
    intervene.names = INTERVENTION_NAMES


def add_model_arguments(parser) -> None:
    """``[CONFIG] [--preset NAME | --published NAME [--content ...] [--dataset ...]] [--length N]``."""
    from ._names import DATASETS, DEFAULT_PRESET, PRESETS, PUBLISHED  # not presets/published: no JAX for --help

    parser.add_argument("config", nargs="?", type=Path, help="rollout YAML file (default: a preset)")
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help=f"built-in geometry with a power-decay schedule (default {DEFAULT_PRESET} "
                             "without CONFIG or --published)")
    parser.add_argument("--published", choices=PUBLISHED, default=None,
                        help="the paper authors' measured configuration of this model")
    parser.add_argument("--content", choices=("none", "mean", "all"), default="none",
                        help="with --published: no content, one score per layer, or per head (default none)")
    parser.add_argument("--dataset", choices=DATASETS, default="fineweb-edu",
                        help="with --published: the text it was measured on (default fineweb-edu)")
    parser.add_argument("--no-residual", action="store_true",
                        help="with --published: lambda = 1 in every layer (attention-only)")
    parser.add_argument("--length", type=positive_int, default=None,
                        help="sequence length N (default: the configuration's); with --published also which "
                             "measurement: the authors' file at 256 for N <= 256, at 2048 for N <= 2048")
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="refuse runs whose estimated memory exceeds SIZE (e.g. 8G; "
                             "default: the memory available on this machine)")


INPUT_FILES = ("config", "more_configs", "spec", "first", "second", "profile")
"""The parsed arguments that name files a command reads whole (CONFIG, SPEC.yaml, A.csv B.csv, PROFILE.csv):
`check_input_files` refuses a missing one before the command imports JAX or torch."""


def check_input_files(arguments) -> None:
    """Refuse, in one line, an input file of `INPUT_FILES` that is missing or a folder, before any heavy import.

    The message is the one the command would give on reading it (`jaxroll._readers.read_text`:
    ``PATH: no such file``, ``PATH: is a directory; allowed: a file``), only sooner: a user who
    mistypes a path waits for no JAX (0.7-1 s) to learn it.
    """
    from .._readers import read_text

    for name in INPUT_FILES:
        if name == "config" and (getattr(arguments, "preset", None) or getattr(arguments, "published", None)):
            continue  # CONFIG with --preset or --published: `model_from_arguments` refuses the pair first
        value = getattr(arguments, name, None)
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, Path) and not path.is_file():
                read_text(path, "a file")  # raises: no such file, or a directory


def model_from_arguments(arguments, *, config=None, length=None):
    """The model of ``[CONFIG] [--preset NAME] [--length N]`` and a name for it.

    `config` and `length`, when given, stand for CONFIG and ``--length`` (a
    command that derives them, as compare-task from ``--measured``, passes
    them here instead of changing the parsed arguments).
    """
    config = arguments.config if config is None else config
    length = arguments.length if length is None else length
    import dataclasses

    from .. import io, presets, published

    given = [flag for flag, value in (("CONFIG", config), ("--preset", arguments.preset),
                                      ("--published", arguments.published)) if value is not None]
    if len(given) > 1:
        raise ConfigError(f"{arguments.command}: give one of CONFIG, --preset, --published; got {' and '.join(given)}")
    published_only = [flag for flag, used in (("--content", arguments.content != "none"),
                                              ("--dataset", arguments.dataset != "fineweb-edu"),
                                              ("--no-residual", arguments.no_residual)) if used]
    if published_only and arguments.published is None:
        raise ConfigError(f"{published_only[0]}: applies to --published only")
    if config is not None:
        model, source = io.load_config(config), str(config)
    elif arguments.published is not None:
        content = None if arguments.content == "none" else arguments.content
        measured = 256 if length is None else published.length_for(length, content)
        model = published.load(arguments.published, content, arguments.dataset, measured,
                               residual=not arguments.no_residual)
        source = (f"published {arguments.published} ({_content_words(arguments.content)}, {arguments.dataset}"
                  f"{', no residual' if arguments.no_residual else ''}) measured at N = {measured}")
    else:
        name = arguments.preset or presets.DEFAULT
        model, source = presets.get(name), f"preset {name}"
    if length is not None:
        model = dataclasses.replace(model, sequence_length=length)
    check_kernel_length(model)
    check_memory(model, arguments)
    return model, source


def _content_words(content: str) -> str:
    """``no content``, ``mean content``, ``all content``: how a header names --content."""
    return "no content" if content == "none" else f"{content} content"


def check_memory(model, arguments) -> None:
    """Refuse, before anything is written, a run that cannot fit in memory."""
    from .. import memory

    limit = None if arguments.max_memory is None else memory.parse_size(arguments.max_memory)
    method = getattr(arguments, "method", "auto")
    itemsize = 8 if arguments.float64 else 4
    needed = memory.model_influence_bytes(model, model.sequence_length, method, itemsize)
    memory.check_fits(needed, f"{arguments.command}: N = {model.sequence_length}", limit)


def check_kernel_length(model) -> None:
    """A kernel model's length, checked before anything is written (dense N, table offsets)."""
    try:
        model.kernel.check_length(model.sequence_length)
    except ConfigError as error:
        raise ConfigError(f"--length {model.sequence_length}: {error.detail}", field="--length",
                          value=model.sequence_length, allowed=error.allowed) from None


def alibi_model(model, command: str):
    """`model` over the paper's ALiBi + content kernel, which `command` reads: its kernel's analytic kernel (a
    measured ALiBi config's anchor, `AbstractKernel.analytic_kernel`); else a one-line refusal."""
    import dataclasses

    model = dataclasses.replace(model, kernel=model.kernel.analytic_kernel())
    if type(model.kernel).config_kind != "alibi":  # the commands over the paper's ALiBi + content sections
        raise ConfigError(f"{command}: CONFIG has a kernel_config ({type(model.kernel).__name__}); allowed: an "
                          "ALiBi configuration (attention_config)" + (
                              "; fit a kernel with jaxroll fit-kernel" if command == "fit" else ""))
    return model


def free_output_path(path: Path, force: bool) -> Path:
    """`path`, refused before any work when it exists and `force` (``--force``) is not given."""
    if path.exists() and not force:
        raise ConfigError(f"--out {path.parent}: {path.name} exists; pass --force to replace it",
                          field="--out", value=str(path.parent), allowed="a folder without it, or --force")
    if path.parent.exists() and not path.parent.is_dir():
        raise ConfigError(f"--out {path.parent}: not a folder", field="--out", value=str(path.parent),
                          allowed="a folder (created when missing)")
    return path


def add_rows_arguments(parser, measured: str) -> None:
    """``--rows-config CONFIG.yaml``, ``--buffer B``, ``--statistic``: every measured row scored."""
    parser.add_argument("--rows-config", type=Path, metavar="CONFIG.yaml",
                        help=f"score every row of the measurement in {measured} (made with jaxroll measure "
                             "--queries K: influence_rows_per_sequence, query_positions) against the rows "
                             "P_T[q_k, :] that this rollout configuration predicts (e.g. the config.yaml that "
                             "jaxroll measure wrote), or, with the word 'refined', against the refined rollout's rows "
                             "that jaxroll measure --refine SWITCHES --queries K wrote beside them (refined_rows): "
                             "per-row W1/noise, p-values with Holm's correction, the "
                             "power law by distance with a bootstrap interval over sequences; writes rows.json and "
                             "rows.png into --out (docs/rows.md)")
    parser.add_argument("--buffer", type=non_negative_int, default=0,
                        help="with --rows-config: leave source positions j < BUFFER out of the curve by "
                             "distance (Brändel et al.'s --source-min-index; default 0)")
    parser.add_argument("--statistic", choices=("median", "mean"), default="median",
                        help="with --rows-config: the statistic over query positions by distance (default median)")


def check_rows_arguments(arguments, folder: Path) -> tuple | None:
    """The paths rows.json and rows.png in `folder`, refused before any work when they exist without
    --force (None without --rows-config); the row options without --rows-config are refused."""
    from ..measure.row_scores import REFINED

    if arguments.rows_config is None:
        used = [flag for flag, value, default in (("--buffer", arguments.buffer, 0),
                                                  ("--statistic", arguments.statistic, "median")) if value != default]
        if used:
            raise ConfigError(f"{used[0]}: applies to --rows-config only")
        return None
    if not (arguments.rows_config.is_file() or str(arguments.rows_config) == REFINED):
        raise ConfigError(f"--rows-config {arguments.rows_config}: no such file; allowed: a rollout YAML file or "
                          f"'{REFINED}' (the measurement's refined_rows)")
    return tuple(free_output_path(folder / name, arguments.force) for name in ("rows.json", "rows.png"))


DEVICES = ("auto", "cpu", "gpu", "tpu")
"""The choices of ``--device``: JAX's default backend, or a platform by name."""


def add_device_argument(parser) -> None:
    """``--device {auto,cpu,gpu,tpu}`` (default auto: JAX's default backend)."""
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where to compute (default auto: JAX's default backend, an accelerator when there "
                             "is one). At small N the CPU is faster than a GPU (BLOOM-176B at N = 256: about "
                             "1 ms against about 2 ms warm, docs/performance.md): --device cpu, which from the "
                             "command line never starts the accelerator")


def device_context(name: str, *, command_line: bool):
    """The context to compute in for ``--device NAME``; a platform not present is a one-line ConfigError.

    ``auto``: nothing changes. ``cpu`` from the command line (`command_line`,
    a fresh process whose JAX backends are not yet started): JAX is limited
    to the CPU (``jax_platforms = "cpu"``), so no accelerator is started and
    none of its memory taken. Otherwise (a caller's ``main([...])`` leaves
    JAX's settings alone; an accelerator): ``jax.default_device`` of the
    platform's first device, under which arrays are placed and programs
    compiled and run (`jaxroll.cache` keys its executables by that device).
    """
    import contextlib

    import jax

    if name == "auto":
        return contextlib.nullcontext()
    if name == "cpu" and command_line and not _backends_started():
        jax.config.update("jax_platforms", "cpu")
        return contextlib.nullcontext()
    try:
        device = jax.devices(name)[0]
    except RuntimeError:
        present = [platform for platform in DEVICES[1:] if _present(platform)]
        raise ConfigError(f"--device {name}: no {name} device here (platforms present: {', '.join(present)}); "
                          f"allowed: auto, {', '.join(present)}") from None
    return jax.default_device(device)


def _present(platform: str) -> bool:
    import jax

    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def _backends_started() -> bool:
    """Whether JAX has started its backends (then ``jax_platforms`` no longer applies); True when unknown."""
    try:
        from jax._src.xla_bridge import backends_are_initialized  # no public name in jax 0.10
    except ImportError:
        return True
    return backends_are_initialized()


def check_model_folder(path) -> None:
    """Refuse a MODEL_DIR that is missing or not a folder, in the loader's words (`jaxroll.measure.loading`),
    before torch and transformers import."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"model {path}: no such directory (models load from local files only)")
    if not path.is_dir():
        raise ConfigError(f"model {path}: not a directory; allowed: a directory written by save_pretrained")
