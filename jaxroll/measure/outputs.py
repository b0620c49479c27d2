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
from .result import Measurement

__all__ = ["write_measurement", "read_measurement", "OUTPUT_FILES"]

OUTPUT_FILES = ("measurement.npz", "metadata.json", "config.yaml", "config.kernels.npz", "influence.csv",
                "lambdas.png", "influence.png")
"""The files `write_measurement` may write into the output directory."""


def _atomic_bytes(path: Path, write) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        write(handle)
    os.replace(temporary, path)


def write_measurement(measurement: Measurement, directory, *, overwrite: bool = False) -> list[Path]:
    """Write the outputs of one measurement into `directory` (which must exist).

    Files: ``measurement.npz`` (every measured array), ``metadata.json``,
    and, where the stats allow, ``config.yaml`` (needs lambda; its first line
    a comment naming the interventions, when it was measured under some; for a model
    without ALiBi measured with attention, a dense-kernel config with its
    kernels in ``config.kernels.npz``),
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
        from ..io import kernel_file_path
        from ..schema import kernel_arrays

        model = measurement.to_rollout_model()
        save_config(model, directory / "config.yaml", overwrite=True)
        _note_interventions(directory / "config.yaml", measurement.metadata.get("interventions"))
        written.append(directory / "config.yaml")
        if kernel_arrays(model):
            written.append(kernel_file_path(directory / "config.yaml"))
        written.append(_plot_lambdas(directory / "lambdas.png", measurement))
    if measurement.influence is not None:
        write_profile(measurement.influence, directory / "influence.csv", overwrite=True)
        written.append(directory / "influence.csv")
        written.append(_plot_influence(directory / "influence.png", measurement))
    return written


def _note_interventions(path: Path, record) -> None:
    """A first comment line in config.yaml naming the interventions the model was measured under (YAML ignores it)."""
    if record:
        note = f"# measured under the interventions {json.dumps(record)} (metadata.json, docs/interventions.md)\n"
        path.write_text(note + path.read_text(encoding="utf-8"), encoding="utf-8")


def read_measurement(directory) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of ``measurement.npz`` and the dict of ``metadata.json``."""
    from .._readers import read_json, read_npz

    directory = Path(directory)
    arrays = read_npz(directory / "measurement.npz", "the measurement.npz that jaxroll measure writes")
    metadata = read_json(directory / "metadata.json", "the metadata.json that jaxroll measure writes")
    return arrays, metadata


def _title(measurement: Measurement) -> str:
    meta = measurement.metadata
    return f"{meta['model']}: N={measurement.sequence_length}, S={meta['num_sequences']}"


def _plot_lambdas(path: Path, measurement: Measurement) -> Path:
    from ..plot import plot_lambdas

    return plot_lambdas(path, measurement.lambdas, measurement.lambdas_std, title=_title(measurement))


def _plot_influence(path: Path, measurement: Measurement) -> Path:
    from ..plot import plot_measured_influence
    from .uncertainty import profile_band

    rows = measurement.influence_per_sequence
    band = profile_band(rows) if rows is not None and rows.shape[0] >= 2 else None
    return plot_measured_influence(path, measurement.influence, title=_title(measurement), band=band)
