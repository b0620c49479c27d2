"""Writing a `Measurement`: measurement.npz, metadata.json, config.yaml, CSV, figures.

``config.yaml`` is a rollout configuration (readable by ``jaxroll rollout``)
in softmax-logit units: content ``logit_scale * q.k``, slopes
``bias_scale * m``; the raw ``q.k`` means stay in ``measurement.npz``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .measure import Measurement

__all__ = ["write_measurement", "read_measurement", "OUTPUT_FILES"]

OUTPUT_FILES = ("measurement.npz", "metadata.json", "config.yaml", "influence.csv", "lambdas.png", "influence.png")


def _atomic_bytes(path: Path, write) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        write(handle)
    os.replace(temporary, path)


def write_measurement(measurement: Measurement, directory, *, overwrite: bool = False) -> list[Path]:
    """Write the outputs of one measurement into `directory` (which must exist).

    Files: ``measurement.npz`` (every measured array), ``metadata.json``,
    and, where the stats allow, ``config.yaml`` (needs lambda),
    ``influence.csv`` (``token_position,probability``), ``lambdas.png``,
    ``influence.png``.

    Raises:
        ConfigError: a file exists and `overwrite` is false.
    """
    from ..io import save_config, write_profile

    directory = Path(directory)
    if not overwrite:
        for name in OUTPUT_FILES:
            if (directory / name).exists():
                raise ConfigError(f"{directory / name}: exists; pass overwrite=True (--force) to replace it")
    written = []
    arrays = measurement.arrays()
    _atomic_bytes(directory / "measurement.npz", lambda handle: np.savez(handle, **arrays))
    written.append(directory / "measurement.npz")
    text = json.dumps(measurement.metadata, indent=2, sort_keys=False) + "\n"
    _atomic_bytes(directory / "metadata.json", lambda handle: handle.write(text.encode("utf-8")))
    written.append(directory / "metadata.json")
    if measurement.lambdas is not None:
        save_config(measurement.to_rollout_model(), directory / "config.yaml", overwrite=True)
        written.append(directory / "config.yaml")
        written.append(_plot_lambdas(directory / "lambdas.png", measurement))
    if measurement.influence is not None:
        write_profile(measurement.influence, directory / "influence.csv", overwrite=True)
        written.append(directory / "influence.csv")
        written.append(_plot_influence(directory / "influence.png", measurement))
    return written


def read_measurement(directory) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of ``measurement.npz`` and the dict of ``metadata.json``."""
    directory = Path(directory)
    with np.load(directory / "measurement.npz", allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    metadata = json.loads((directory / "metadata.json").read_text(encoding="utf-8"))
    return arrays, metadata


def _title(measurement: Measurement) -> str:
    meta = measurement.metadata
    return f"{meta['model']}: N={measurement.sequence_length}, S={meta['num_sequences']}"


def _plot_lambdas(path: Path, measurement: Measurement) -> Path:
    from ..plot import plt

    layers = np.arange(measurement.lambdas.size)
    figure, axes = plt.subplots(figsize=(7, 4), constrained_layout=True)
    axes.errorbar(layers, measurement.lambdas, yerr=measurement.lambdas_std, marker="o", capsize=3)
    axes.set_xlabel("layer t")
    axes.set_ylabel("lambda_t = ||a|| / (||x|| + ||a||)")
    axes.set_ylim(0.0, max(1e-3, float(np.max(measurement.lambdas + measurement.lambdas_std))) * 1.1)
    axes.set_title(_title(measurement))
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _plot_influence(path: Path, measurement: Measurement) -> Path:
    from ..plot import plt

    figure, axes = plt.subplots(figsize=(7, 4), constrained_layout=True)
    axes.plot(np.arange(measurement.influence.size), measurement.influence)
    if np.all(measurement.influence > 0):
        axes.set_yscale("log")
    axes.set_xlabel("input position j")
    axes.set_ylabel("normalised ||df / de_j||")
    axes.set_title(_title(measurement))
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
