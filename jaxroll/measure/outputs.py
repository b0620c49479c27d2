"""Writing a `Measurement`: measurement.npz, metadata.json, config.yaml, CSV, figures.

``config.yaml`` is a rollout configuration (readable by ``jaxroll rollout``)
in softmax-logit units: content ``logit_scale * q.k``, slopes
``bias_scale * m``; the raw ``q.k`` means stay in ``measurement.npz``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError
from .result import Measurement

__all__ = ["write_measurement", "read_measurement", "SavedMeasurement", "OUTPUT_FILES"]

OUTPUT_FILES = ("measurement.npz", "metadata.json", "config.yaml", "config.kernels.npz", "influence.csv",
                "lambdas.png", "influence.png", "refined.csv")
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
    kernels in ``config.kernels.npz``; measured with attention_offsets and
    without attention, the offset kernel's table-kernel config, its table in
    ``config.kernels.npz``: `Measurement.to_rollout_model`),
    ``influence.csv`` (``token_position,probability``), ``lambdas.png``,
    ``influence.png``; ``refined.csv``, the refined rollout's profile, when
    it was measured with ``refine`` (``measurement.refined_profile``).

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
    if measurement.refined_profile is not None:
        written.append(write_profile(measurement.refined_profile, directory / "refined.csv", overwrite=True))
    return written


def _note_interventions(path: Path, record) -> None:
    """A first comment line in config.yaml naming the interventions the model was measured under (YAML ignores it)."""
    if record:
        note = f"# measured under the interventions {json.dumps(record)} (metadata.json, docs/interventions.md)\n"
        path.write_text(note + path.read_text(encoding="utf-8"), encoding="utf-8")


class SavedMeasurement(NamedTuple):
    """What `read_measurement` returns: the arrays of ``measurement.npz`` and the dict of ``metadata.json``.

    A tuple, so ``arrays, metadata = read_measurement(directory)`` reads it.
    `metadata` is None when it was read with ``need_metadata=False`` and the
    folder has no ``metadata.json``. The checks below take `label`, the
    folder as the user named it (``--measured DIR``), for their refusals.
    """

    arrays: dict[str, np.ndarray]
    metadata: dict | None

    def influence_rows(self, label: str, size: int | None = None, profile_path=None) -> np.ndarray:
        """``influence_per_sequence (S, N)``, checked (`jaxroll.measure.uncertainty.check_rows`).

        S >= 2 finite non-negative rows (at least 2 with gradient mass) and,
        with `size`, N = `size` (the length of the profile in `profile_path`).
        """
        from .uncertainty import check_rows

        if "influence_per_sequence" not in self.arrays:
            raise ConfigError(f"{label}: no influence_per_sequence in measurement.npz; "
                              "allowed: a measurement with --stats ...,influence by this version")
        try:
            rows = check_rows(self.arrays["influence_per_sequence"])
        except ConfigError as error:
            raise ConfigError(f"{label}: influence_per_sequence {error.detail}", field=label,
                              allowed=error.allowed) from None
        if size is not None and rows.shape[1] != size:
            raise ConfigError(f"{label}: N = {rows.shape[1]} positions per sequence; allowed: N = {size}, "
                              f"the length of {profile_path}")
        return rows

    def query_rows(self, label: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(influence_rows_per_sequence (S, K, N), query_positions (K,), refined_rows (K, N) or None)``.

        The rows of ``jaxroll measure --queries K`` (``refined_rows`` with
        ``--refine``), their shapes checked (``refined_rows`` where it is used).
        """
        data = self.arrays
        if "influence_rows_per_sequence" not in data or "query_positions" not in data:
            raise ConfigError(f"{label}: no influence_rows_per_sequence and query_positions in "
                              "measurement.npz; allowed: a measurement made with jaxroll measure --queries K")
        rows, queries = data["influence_rows_per_sequence"], data["query_positions"]
        if rows.ndim != 3 or queries.shape != (rows.shape[1],) or not np.issubdtype(queries.dtype, np.integer):
            raise ConfigError(f"{label}: influence_rows_per_sequence {rows.shape} and query_positions "
                              f"{queries.shape}; allowed: (S, K, N) and (K,) integer positions")
        return rows, queries, data.get("refined_rows")


def read_measurement(directory, *, flag: str | None = None, need_metadata: bool = True) -> SavedMeasurement:
    """The one reader of a measurement folder (the ``--out`` of ``jaxroll measure``): a `SavedMeasurement`.

    `flag` (``--measured``) names the folder in every refusal, as the user
    typed it; without ``need_metadata`` a folder without ``metadata.json``
    reads with ``metadata=None``. Pure NumPy (no torch, no JAX).
    """
    from .._readers import read_json, read_npz

    directory = Path(directory)
    label = str(directory) if flag is None else f"{flag} {directory}"
    path = directory / "measurement.npz"
    if flag is not None and not path.is_file():
        raise ConfigError(f"{label}: no measurement.npz; allowed: the --out of jaxroll measure",
                          field=flag, value=str(directory), allowed="the --out of jaxroll measure")
    if flag is None:
        arrays = read_npz(path, "the measurement.npz that jaxroll measure writes")
    else:
        arrays = read_npz(path, "the measurement.npz that jaxroll measure writes into its --out",
                          label=f"{label}: measurement.npz")
    metadata = None
    if need_metadata or (directory / "metadata.json").is_file():
        metadata = read_json(directory / "metadata.json", "the metadata.json that jaxroll measure writes",
                             label=None if flag is None else f"{label}: metadata.json")
    return SavedMeasurement(arrays, metadata)


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
