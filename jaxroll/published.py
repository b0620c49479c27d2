"""The paper authors' published configurations, shipped as package data.

The rollout configurations published with Herasimchyk, Labryga, Prusina, Laue,
*A Structural Theory of Position Bias in Transformers* (arXiv 2602.16837v2; v1
was titled *A Residual-Aware Theory of Position Bias in Transformers*),
repository ml-uhh/position-bias, MIT licence, copyright 2026 Machine Learning
Group @ University of Hamburg (``data/published/LICENSE``): the 33 files at
``sequence_length: 256`` from commit a514e09 and the 20 at 2048 from commit
37cffcfd. The files are kept byte for byte as published; `load` reads them
with `jaxroll.load_config`.

For each of five models (`names`) the authors measured on real text, at each
length in `LENGTHS` (``length=256`` or ``length=2048``):

- ``content=None``: the lambda schedule ``lambda_t`` (one per layer) with the
  standard ALiBi slopes, no content;
- ``content="mean"``: plus one diagonal content score per layer
  (FineWeb-Edu, 256 only);
- ``content="all"``: plus one diagonal and one base score per head and layer,
  on FineWeb-Edu, DCLM or Wikipedia; each data set has its own lambdas.

These are measured schedules, unlike `jaxroll.presets`, whose schedules are a
two-parameter power-decay fit ``lambda_0 / (t + 1)^beta`` to the FineWeb-Edu
ones. ``residual=False`` sets every ``lambda_t = 1`` (the attention-only
rollout), which is exactly what the authors' ``*-noresidual`` files do.

The 2048 files carry the same lambda schedules as the 256 ones (equal to the
last bit) with the content re-measured on 2048-token sequences (except DCLM's
MPT-7B and MPT-30B files, whose content equals the 256 ones).
"""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from pathlib import Path

import numpy as np

from .errors import ConfigError
from .io import load_config
from .model import RolloutModel

__all__ = ["ROOT", "MODELS", "CONTENT", "DATASETS", "LENGTHS", "names", "catalogue", "path", "load",
           "rollout_files", "length_for"]

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
LENGTHS = (256, 2048)
"""The sequence lengths the authors published configurations at (``length`` of `load`)."""
# Length -> the suffix of its folders in the authors' tree (no_content<suffix>, all_content<suffix>).
_SUFFIX = {256: "", 2048: "_2048"}


def names() -> list[str]:
    """The published models, in a stable order; each has configurations at every length in `LENGTHS`.

    `catalogue` lists every (model, content, dataset, length) that has a file.
    """
    return list(MODELS)


def catalogue() -> list[tuple[str, str | None, str, int]]:
    """Every ``(model, content, dataset, length)`` that `load` reads from a file of its own, sorted by length.

    53 rollout files ship (`rollout_files`): per model, at 256 one ``None``
    (FineWeb-Edu), one ``"mean"`` and three ``"all"`` (25), at 2048 one
    ``None`` and three ``"all"`` (20); besides these, seven ``*-noresidual``
    files at 256 (``residual=False`` here) and ``rollout/example.yaml``.
    """
    entries = []
    for length in LENGTHS:
        for model in MODELS:
            entries.append((model, None, "fineweb-edu", length))
            if length == 256:
                entries.append((model, "mean", "fineweb-edu", length))
            entries.extend((model, "all", dataset, length) for dataset in DATASETS)
    return entries


def length_for(n: int, content: str | None = None) -> int:
    """The published length to evaluate at ``n`` positions: the shortest in `LENGTHS` that is ``>= n``.

    Under causal masking the first ``n`` rows of the rollout at length ``L``
    are the rollout at ``n``, so the file measured at ``L >= n`` evaluated at
    ``n`` is that measurement cut to its first ``n`` positions (the CLI's
    ``--published NAME --length N``).

    Raises:
        ConfigError: ``n`` longer than every published length (or than 256
            with ``content="mean"``).
    """
    usable = (256,) if content == "mean" else LENGTHS
    for length in usable:
        if n <= length:
            return length
    with_content = " with content 'mean'" if content == "mean" else ""
    raise ConfigError(f"--length {n}: no published configuration{with_content} that long; allowed: "
                      f"1 to {usable[-1]} (the authors measured at {', '.join(map(str, usable))})")


def _check(model: str, content, dataset: str, length: int = 256) -> None:
    if model not in MODELS:
        raise ConfigError(f"published model: got {model!r}; allowed: one of {', '.join(MODELS)}")
    if content not in CONTENT:
        raise ConfigError(f"content: got {content!r}; allowed: one of None, 'mean', 'all'")
    if dataset not in DATASETS:
        raise ConfigError(f"dataset: got {dataset!r}; allowed: one of {', '.join(DATASETS)}")
    if content == "mean" and dataset != "fineweb-edu":
        raise ConfigError(f"dataset: got {dataset!r} with content='mean'; allowed: 'fineweb-edu' "
                          "(the only data set with per-layer content)")
    if length not in LENGTHS:
        raise ConfigError(f"length: got {length!r}; allowed: one of {', '.join(map(str, LENGTHS))} "
                          "(the lengths the authors published configurations at)")
    if content == "mean" and length != 256:
        raise ConfigError(f"length: got {length} with content='mean'; allowed: 256 "
                          "(the only length with per-layer content)")


def path(model: str, content: str | None = None, dataset: str = "fineweb-edu", length: int = 256) -> Path:
    """The published file behind ``load(model, content, dataset, length)``.

    ``content=None`` on a data set other than FineWeb-Edu has no file of its
    own: its lambdas are those of the ``all_content/<dataset>`` file (at
    2048: ``all_content_2048/<dataset>``), which is returned.
    """
    _check(model, content, dataset, length)
    stem = MODELS[model]
    alibi = ROOT / "rollout" / "alibi"
    suffix = _SUFFIX[length]
    if content is None and dataset == "fineweb-edu":
        return alibi / f"no_content{suffix}" / f"{stem}.yaml"
    if content == "mean":
        return alibi / "mean_content" / dataset / f"{stem}.yaml"
    return alibi / f"all_content{suffix}" / dataset / f"{stem}.yaml"


def load(model: str, content: str | None = None, dataset: str = "fineweb-edu", length: int = 256, *,
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
        length: the sequence length the authors measured at and wrote into
            the file, one of `LENGTHS` (256 or 2048); the model's
            ``sequence_length``. ``content="mean"`` exists at 256 only.
        residual: False for the attention-only rollout (every ``lambda_t = 1``).

    Raises:
        ConfigError: an unknown model, content level, data set or length,
            one line naming the value and listing the allowed ones.
    """
    result = load_config(path(model, content, dataset, length))
    if content is None and dataset != "fineweb-edu":
        zeros = np.zeros_like(np.asarray(result.diagonal_scores))
        result = dataclasses.replace(result, diagonal_scores=zeros, base_scores=zeros)
    if not residual:
        result = dataclasses.replace(result, lambdas=np.ones_like(np.asarray(result.lambdas)))
    return result


def rollout_files(length: int | None = 256) -> list[Path]:
    """The published rollout configuration files of one release, sorted.

    ``length=256``: the 33 of the first release (the five models at N = 256,
    their ``-noresidual`` twins, and ``example.yaml`` at N = 64); ``2048``:
    the 20 at N = 2048 (the ``*_2048`` folders); ``None``: all 53.
    """
    if length is not None and length not in LENGTHS:
        raise ConfigError(f"length: got {length!r}; allowed: None or one of {', '.join(map(str, LENGTHS))}")
    files = sorted((ROOT / "rollout").rglob("*.yaml"))
    if length is None:
        return files
    return [p for p in files if any(part.endswith("_2048") for part in p.parts) == (length == 2048)]
