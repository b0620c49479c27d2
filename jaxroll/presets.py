"""Built-in model geometries: the default of ``jaxroll rollout``.

Each preset is a real model's geometry (layers, heads, the standard ALiBi
slopes of `jaxroll.alibi_slopes`, sequence length 256, causal mask, no
content) with a two-parameter power-decay schedule
``lambda_t = lambda_0 / (t + 1)^beta``. ``lambda_0`` and ``beta`` are the
least-squares fit (t from 0) to the lambda schedule the paper's authors
measured on FineWeb-Edu, in the model's
``reference-configs/rollout/alibi/no_content/`` file, constrained to keep its
total mixing ``sum_t lambda_t``; ``scripts/derive_presets.py`` recomputes them
from those files.
"""

from __future__ import annotations

from typing import NamedTuple

from . import schedules
from .errors import ConfigError
from .model import RolloutModel

__all__ = ["Geometry", "GEOMETRIES", "names", "get"]


class Geometry(NamedTuple):
    """A model's shape and fitted power-decay schedule."""

    model_id: str
    num_layers: int
    num_heads: int
    lambda_0: float
    beta: float
    reference_file: str  # under reference-configs/rollout/alibi/no_content/


GEOMETRIES: dict[str, Geometry] = {
    "bloom-176b": Geometry("bigscience/bloom", 70, 112, 0.4517, 0.7244, "bloom.yaml"),
    "bloom-7b1": Geometry("bigscience/bloom-7b1", 30, 32, 0.2259, 0.2624, "bloom-7b1.yaml"),
    "mpt-7b": Geometry("mosaicml/mpt-7b", 32, 32, 0.5823, 0.6568, "mpt-7b.yaml"),
    "mpt-30b": Geometry("mosaicml/mpt-30b", 48, 64, 0.5545, 0.6124, "mpt-30b.yaml"),
    "falcon-rw-7b": Geometry("tiiuae/falcon-rw-7b", 36, 64, 0.7033, 0.6877, "falcon-rw-7b.yaml"),
}
"""Preset name -> `Geometry`: each model's shape and power-decay schedule fitted to its measured lambdas."""

DEFAULT = "bloom-176b"


def names() -> list[str]:
    """The preset names, in a stable order."""
    return list(GEOMETRIES)


def get(name: str, sequence_length: int = 256) -> RolloutModel:
    """The preset `name` as a `RolloutModel` (see `names()`)."""
    if name not in GEOMETRIES:
        raise ConfigError(f"preset: got {name!r}; allowed: one of {', '.join(GEOMETRIES)}")
    geometry = GEOMETRIES[name]
    return RolloutModel.create(
        num_layers=geometry.num_layers,
        num_heads=geometry.num_heads,
        lambdas=schedules.power_decay(geometry.lambda_0, geometry.beta, geometry.num_layers),
        sequence_length=sequence_length,
    )
