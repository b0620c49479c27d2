"""The paper authors' published configurations, shipped as package data.

The rollout configurations published with Herasimchyk, Labryga, Prusina, Laue,
*A Residual-Aware Theory of Position Bias in Transformers* (arXiv 2602.16837),
repository ml-uhh/position-bias at commit a514e09, MIT licence, copyright 2026
Machine Learning Group @ University of Hamburg (``data/published/LICENSE``).
The files are kept byte for byte as published; `load` reads them with
`jaxroll.load_config`.

For each of five models (`names`) the authors measured on real text:

- ``content=None``: the lambda schedule ``lambda_t`` (one per layer) with the
  standard ALiBi slopes, no content;
- ``content="mean"``: plus one diagonal content score per layer
  (FineWeb-Edu only);
- ``content="all"``: plus one diagonal and one base score per head and layer,
  on FineWeb-Edu, DCLM or Wikipedia; each data set has its own lambdas.

These are measured schedules, unlike `jaxroll.presets`, whose schedules are a
two-parameter power-decay fit ``lambda_0 / (t + 1)^beta`` to the FineWeb-Edu
ones. ``residual=False`` sets every ``lambda_t = 1`` (the attention-only
rollout), which is exactly what the authors' ``*-noresidual`` files do.
"""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from pathlib import Path

import numpy as np

from .errors import ConfigError
from .io import load_config
from .model import RolloutModel

__all__ = ["ROOT", "MODELS", "CONTENT", "DATASETS", "names", "path", "load", "rollout_files"]

ROOT = Path(str(files("jaxroll") / "data" / "published"))
"""Where the published configurations lie inside the installed package (``jaxroll/data/published``)."""

# Model name -> file stem in the authors' tree.
MODELS = {
    "bloom-176b": "bloom",
    "bloom-7b1": "bloom-7b1",
    "mpt-7b": "mpt-7b",
    "mpt-30b": "mpt-30b",
    "falcon-rw-7b": "falcon-rw-7b",
}
"""Published model name -> the file stem in the authors' tree."""
CONTENT = (None, "mean", "all")
"""The content variants of `load`: none, one score per layer (``mean``), per layer and head (``all``)."""
DATASETS = ("fineweb-edu", "dclm", "wikipedia")
"""The data sets the authors measured on."""


def names() -> list[str]:
    """The published models, in a stable order."""
    return list(MODELS)


def _check(model: str, content, dataset: str) -> None:
    if model not in MODELS:
        raise ConfigError(f"published model: got {model!r}; allowed: one of {', '.join(MODELS)}")
    if content not in CONTENT:
        raise ConfigError(f"content: got {content!r}; allowed: one of None, 'mean', 'all'")
    if dataset not in DATASETS:
        raise ConfigError(f"dataset: got {dataset!r}; allowed: one of {', '.join(DATASETS)}")
    if content == "mean" and dataset != "fineweb-edu":
        raise ConfigError(f"dataset: got {dataset!r} with content='mean'; allowed: 'fineweb-edu' "
                          "(the only data set with per-layer content)")


def path(model: str, content: str | None = None, dataset: str = "fineweb-edu") -> Path:
    """The published file behind ``load(model, content, dataset)``.

    ``content=None`` on a data set other than FineWeb-Edu has no file of its
    own: its lambdas are those of the ``all_content/<dataset>`` file, which is
    returned.
    """
    _check(model, content, dataset)
    stem = MODELS[model]
    alibi = ROOT / "rollout" / "alibi"
    if content is None and dataset == "fineweb-edu":
        return alibi / "no_content" / f"{stem}.yaml"
    if content == "mean":
        return alibi / "mean_content" / dataset / f"{stem}.yaml"
    return alibi / "all_content" / dataset / f"{stem}.yaml"


def load(model: str, content: str | None = None, dataset: str = "fineweb-edu", *,
         residual: bool = True) -> RolloutModel:
    """A published configuration as a `RolloutModel`.

    Args:
        model: one of `names()`, e.g. ``"bloom-176b"``.
        content: ``None`` (lambdas and slopes only), ``"mean"`` (one diagonal
            score per layer, applied to every head; see the README on the
            authors' head-0 indexing) or ``"all"`` (per head and layer).
        dataset: the text the measurement ran on, ``"fineweb-edu"``,
            ``"dclm"`` or ``"wikipedia"``. With ``content=None`` the lambdas
            of that data set are used and its content dropped.
        residual: False for the attention-only rollout (every ``lambda_t = 1``).

    Raises:
        ConfigError: an unknown model, content level or data set, one line
            naming the value and listing the allowed ones.
    """
    result = load_config(path(model, content, dataset))
    if content is None and dataset != "fineweb-edu":
        zeros = np.zeros_like(np.asarray(result.diagonal_scores))
        result = dataclasses.replace(result, diagonal_scores=zeros, base_scores=zeros)
    if not residual:
        result = dataclasses.replace(result, lambdas=np.ones_like(np.asarray(result.lambdas)))
    return result


def rollout_files() -> list[Path]:
    """Every published rollout configuration file (33), sorted."""
    return sorted((ROOT / "rollout").rglob("*.yaml"))
