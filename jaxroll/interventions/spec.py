"""Interventions written as text: ``NAME=VALUE[,NAME=VALUE...]`` or a YAML mapping, and back.

The names are the command line's (`--intervene`) and a result's record, each declared on its
type and read from the registry (`jaxroll.interventions.registry`):

| name | intervention | value |
|---|---|---|
| ``sinks`` | `SinkTokens` | an integer >= 0: tokens prepended (the model runs at n + sinks) |
| ``rotary_ratio`` | `RotaryRescale` | > 0: a number, or per head / layer / layer and head in YAML |
| ``tau`` | `Temperature` | > 0: a number, or per head / layer / layer and head in YAML |
| ``slope_scale`` | `SlopeScale` | >= 0 |
| ``kappa`` | `DistanceBias` | any finite number; ``kappa_form`` (``log1p``, ``unsquash``) and ``kappa_k`` (> 0) set its form |
| ``ssmax_scale`` | `LengthScaledLogits` (SSMax) | > 0 |
| ``gamma`` | `BranchScale` | >= 0, a number or one per layer |

`parse` gives the interventions in the order their types declare (the sinks first, since they
set the length the kernel changes are formed at; then the rotary rescale, before anything that
changes the distance scores; the other kernel changes; the branch scale last) and `describe`
the record every output carries. ``NAMES`` is the registry's `text_names()` when read.
"""

from __future__ import annotations

from pathlib import Path

from .._readers import read_text
from ..errors import ConfigError
from ._base import AbstractIntervention, number_from_text
from .registry import intervention_type, intervention_types, text_names

__all__ = ["NAMES", "parse", "from_mapping", "describe"]

NAMES: tuple[str, ...]
"""The names `parse` knows, in the order the interventions apply (the registry's `text_names()`, read when asked)."""


def __getattr__(name: str):
    if name == "NAMES":  # read when asked, so a type registered later is in it
        return text_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse(text: str) -> list[AbstractIntervention]:
    """``"tau=0.7,gamma=0.5"`` (or the path of a YAML file holding such a mapping) -> interventions.

    Raises:
        ConfigError: one line naming the entry: an unknown name, a value that is
            not a number or out of range, a name given twice, an unreadable file.
    """
    text = str(text).strip()
    if text.endswith((".yaml", ".yml")):
        return from_mapping(_read_yaml(Path(text)), source=text)
    mapping: dict = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = entry.partition("=")
        name = name.strip()
        if not equals:
            raise ConfigError(f"--intervene: got {entry!r}; allowed: NAME=VALUE with NAME one of "
                              f"{', '.join(text_names())}")
        if name in mapping:
            raise ConfigError(f"--intervene {name}: given twice; allowed: each name once")
        owner = intervention_type(name)
        mapping[name] = (owner.text_value(name, value.strip()) if owner is not None
                         else number_from_text(name, value.strip()))
    if not mapping:
        raise ConfigError(f"--intervene: got {text!r}; allowed: NAME=VALUE[,NAME=VALUE...] or a .yaml file")
    return from_mapping(mapping)


def _read_yaml(path: Path) -> dict:
    """The mapping in the YAML file at `path`; anything else (binary, malformed, not a mapping) in one line."""
    import yaml

    allowed = "a UTF-8 YAML file of interventions, a mapping such as 'tau: 0.7'"
    text = read_text(path, allowed, label=f"--intervene {path}", kind="YAML")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(error, yaml.reader.ReaderError):  # a control character such as NUL
            where = f" (character {chr(error.character)!r} at {error.position} not allowed)"
        raise ConfigError(f"--intervene {path}: not valid YAML{where}; allowed: {allowed}") from None
    except (ValueError, RecursionError) as error:  # an int of over 4300 digits; nesting deeper than Python's stack
        raise ConfigError(f"--intervene {path}: not readable YAML ({type(error).__name__}); "
                          f"allowed: {allowed}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--intervene {path}: got a {type(loaded).__name__}; allowed: {allowed}")
    return loaded


def from_mapping(mapping: dict, source: str = "--intervene") -> list[AbstractIntervention]:
    """A mapping of `NAMES` to values (numbers, or nested lists from YAML) -> interventions, in `NAMES` order."""
    names = text_names()
    unknown = [name for name in mapping if name not in names]
    if unknown:
        raise ConfigError(f"{source} {unknown[0]}: unknown intervention; allowed: one of {', '.join(names)}")
    types = intervention_types()
    for kind in types:
        if kind.name not in mapping and any(option in mapping for option in kind.options):
            raise ConfigError(f"{source} {'/'.join(kind.options)}: {kind.options_purpose}; allowed only with "
                              f"{kind.name}")
    return [kind.from_record(mapping, source) for kind in types if kind.name in mapping]


def describe(interventions) -> dict:
    """The record of `interventions` as a plain mapping (`from_mapping` reads it back)."""
    record: dict = {}
    for intervention in interventions:
        if intervention_type(getattr(intervention, "name", None)) is not type(intervention):
            raise ConfigError(f"intervention: {type(intervention).__name__} has no text form; allowed: "
                              f"{', '.join(kind.__name__ for kind in intervention_types())}")
        record |= intervention.record()
    return record
