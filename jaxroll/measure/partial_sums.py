"""Running sums of one process's measurement: checkpoints and the merge across ranks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .registry import Shapes, registered

_PER_SEQUENCE = ("lambdas_per_sequence", "stream_squares_per_sequence", "influence_per_sequence", "target_token",
                 "target_probability")


class PartialSums:
    """Running float64 sums over the sequences one process measured; what a checkpoint saves.

    ``count`` is how many of `indices` (this process's sequences, in order)
    are done. Sums add across processes; per-sequence arrays (first axis S)
    hold NaN (or -1) in rows this process did not measure and merge by row.
    """

    def __init__(self, shape: Shapes, stats, positions, indices=None):
        num_sequences, num_layers, num_heads, length = shape.sequences, shape.layers, shape.heads, shape.length
        self.count = 0
        self.seconds = 0.0
        self.timing = None
        self.indices = np.arange(num_sequences) if indices is None else np.asarray(indices, dtype=np.int64)
        self.arrays = {}
        self.per_sequence = set(_PER_SEQUENCE)
        if "lambda" in stats:
            self.arrays["lambdas_per_sequence"] = np.full((num_sequences, num_layers), np.nan)
            self.arrays["stream_squares_per_sequence"] = np.full((num_sequences, num_layers), np.nan)
        if "influence" in stats:
            self.arrays["influence_sum"] = np.zeros(length)
            self.arrays["influence_per_sequence"] = np.full((num_sequences, length), np.nan)
            self.arrays["target_token"] = np.full(num_sequences, -1, dtype=np.int64)
            self.arrays["target_probability"] = np.full(num_sequences, np.nan)
        if "content" in stats:
            self.arrays["qk_diagonal_sum"] = np.zeros((num_layers, num_heads))
            self.arrays["qk_lower_sum"] = np.zeros((num_layers, num_heads))
        if "qk" in stats:
            n = len(range(0, length, positions))
            self.arrays["qk_sum"] = np.zeros((num_layers, num_heads, n, n))
        if "attention" in stats:
            self.arrays["attention_sum"] = np.zeros((num_layers, length, length))
        for name in stats:
            if name in registered():
                self.arrays.update(registered()[name].allocate(shape))
                self.per_sequence.update(registered()[name].per_sequence)

    def save(self, path: Path, fingerprint: str) -> None:
        # Atomic: a crash mid-write leaves the previous checkpoint intact.
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "wb") as handle:
            np.savez(handle, count=self.count, fingerprint=fingerprint, **self.arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def load(self, path: Path, fingerprint: str) -> None:
        from .._readers import read_npz

        allowed = "the checkpoint.npz in the --out of an interrupted jaxroll measure"
        data = read_npz(path, allowed, label=f"--resume {path}", what="a checkpoint of jaxroll measure")
        if "fingerprint" not in data or "count" not in data:
            raise ConfigError(f"--resume {path}: not a checkpoint of jaxroll measure (no fingerprint or count); "
                              f"allowed: {allowed}")
        if str(data["fingerprint"]) != fingerprint:
            raise ConfigError(
                f"--resume {path}: the checkpoint was written for other settings "
                "(model, sequences, stats or number of processes); allowed: the same command, "
                "or --force without --resume"
            )
        for name in self.arrays:
            if name not in data:
                raise ConfigError(f"--resume {path}: no array {name!r}; allowed: {allowed}")
            self.arrays[name] = data[name]
        self.count = int(data["count"])

    def merge(self, others) -> "PartialSums":
        """This process's sums plus `others` (each a `state()` dict of another process), in place.

        Exact: sums and counts add, per-sequence rows are copied from the
        process that measured them.
        """
        self.timing = [(self.count, self.seconds)]
        for other in others:
            rows = np.asarray(other["indices"])[: int(other["count"])]
            for name, value in other["arrays"].items():
                if name in self.per_sequence:
                    self.arrays[name][rows] = value[rows]
                else:
                    self.arrays[name] = self.arrays[name] + value
            self.count += int(other["count"])
            self.timing.append((int(other["count"]), float(other["seconds"])))
        return self

    def state(self) -> dict:
        """What another process needs to merge these sums: count, indices, arrays, loop seconds."""
        return {"count": self.count, "indices": self.indices, "arrays": self.arrays, "seconds": self.seconds}
