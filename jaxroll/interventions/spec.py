"""Interventions written as text: ``NAME=VALUE[,NAME=VALUE...]`` or a YAML mapping, and back.

The names are the command line's (`--intervene`) and a result's record:

| name | intervention | value |
|---|---|---|
| ``sinks`` | `SinkTokens` | an integer >= 0: tokens prepended (the model runs at n + sinks) |
| ``rotary_ratio`` | `RotaryRescale` | > 0: a number, or per head / layer / layer and head in YAML |
| ``tau`` | `Temperature` | > 0: a number, or per head / layer / layer and head in YAML |
| ``slope_scale`` | `SlopeScale` | >= 0 |
| ``ssmax_scale`` | `LengthScaledLogits` (SSMax) | > 0 |
| ``gamma`` | `BranchScale` | >= 0, a number or one per layer |
| ``kappa`` | `DistanceBias` | any finite number; ``kappa_form`` (``log1p``, ``unsquash``) and ``kappa_k`` (> 0) set its form |

`parse` gives the interventions in a fixed order (the sinks first, since they
set the length the kernel changes are formed at; then the rotary rescale,
before anything that changes the distance scores; the other kernel changes;
the branch scale last) and `describe` the record every output carries.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ._base import AbstractIntervention
from .kernels import DistanceBias, LengthScaledLogits, SlopeScale, Temperature
from .mixing import BranchScale
from .positions import RotaryRescale, SinkTokens

__all__ = ["NAMES", "parse", "from_mapping", "describe"]

NAMES = ("sinks", "rotary_ratio", "tau", "slope_scale", "kappa", "kappa_form", "kappa_k", "ssmax_scale", "gamma")
"""The names `parse` knows, in the order the interventions apply."""


def _number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--intervene {name}: got {text!r}; allowed: a number") from None
    if not np.isfinite(value):
        raise ConfigError(f"--intervene {name}: got {text!r}; allowed: a finite number")
    return value


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
            raise ConfigError(f"--intervene: got {entry!r}; allowed: NAME=VALUE with NAME one of {', '.join(NAMES)}")
        if name in mapping:
            raise ConfigError(f"--intervene {name}: given twice; allowed: each name once")
        mapping[name] = value.strip() if name == "kappa_form" else _number(name, value.strip())
    if not mapping:
        raise ConfigError(f"--intervene: got {text!r}; allowed: NAME=VALUE[,NAME=VALUE...] or a .yaml file")
    return from_mapping(mapping)


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read ({error.strerror or type(error).__name__}); allowed: a YAML "
                          "file of interventions") from None
    except yaml.YAMLError:
        raise ConfigError(f"{path}: not valid YAML; allowed: a mapping such as 'tau: 0.7'") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: got a {type(loaded).__name__}; allowed: a mapping such as 'tau: 0.7'")
    return loaded


def from_mapping(mapping: dict, source: str = "--intervene") -> list[AbstractIntervention]:
    """A mapping of `NAMES` to values (numbers, or nested lists from YAML) -> interventions, in `NAMES` order."""
    unknown = [name for name in mapping if name not in NAMES]
    if unknown:
        raise ConfigError(f"{source} {unknown[0]}: unknown intervention; allowed: one of {', '.join(NAMES)}")
    if ("kappa_form" in mapping or "kappa_k" in mapping) and "kappa" not in mapping:
        raise ConfigError(f"{source} kappa_form/kappa_k: set the distance bias' form; allowed only with kappa")
    interventions: list[AbstractIntervention] = []
    if "sinks" in mapping:
        interventions.append(SinkTokens(mapping["sinks"]))
    if "rotary_ratio" in mapping:
        interventions.append(RotaryRescale(mapping["rotary_ratio"]))
    if "tau" in mapping:
        interventions.append(Temperature(mapping["tau"]))
    if "slope_scale" in mapping:
        interventions.append(SlopeScale(mapping["slope_scale"]))
    if "kappa" in mapping:
        form, k = mapping.get("kappa_form", "log1p"), mapping.get("kappa_k", 2.0)
        if not isinstance(form, str):
            raise ConfigError(f"{source} kappa_form: got {form!r:.60}; allowed: log1p or unsquash")
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ConfigError(f"{source} kappa_k: got {k!r:.60}; allowed: a number > 0")
        interventions.append(DistanceBias(mapping["kappa"], form, k=float(k)))
    if "ssmax_scale" in mapping:
        interventions.append(LengthScaledLogits(mapping["ssmax_scale"]))
    if "gamma" in mapping:
        interventions.append(BranchScale(mapping["gamma"]))
    return interventions


def _plain(value):
    array = np.asarray(value, dtype=np.float64)
    return float(array) if array.ndim == 0 else array.tolist()


def describe(interventions) -> dict:
    """The record of `interventions` as a plain mapping (`from_mapping` reads it back)."""
    record: dict = {}
    for intervention in interventions:
        if isinstance(intervention, SinkTokens):
            record["sinks"] = intervention.num_sinks
        elif isinstance(intervention, RotaryRescale):
            record["rotary_ratio"] = _plain(intervention.ratio)
        elif isinstance(intervention, Temperature):
            record["tau"] = _plain(intervention.tau)
        elif isinstance(intervention, SlopeScale):
            record["slope_scale"] = _plain(intervention.scale)
        elif isinstance(intervention, DistanceBias):
            record |= {"kappa": _plain(intervention.kappa), "kappa_form": intervention.form,
                       "kappa_k": intervention.k}
        elif isinstance(intervention, LengthScaledLogits):
            record["ssmax_scale"] = _plain(intervention.scale)
        elif isinstance(intervention, BranchScale):
            record["gamma"] = _plain(intervention.gamma)
        else:
            raise ConfigError(f"intervention: {type(intervention).__name__} has no text form; allowed: "
                              "SinkTokens, RotaryRescale, Temperature, SlopeScale, DistanceBias, LengthScaledLogits, "
                              "BranchScale")
    return record
