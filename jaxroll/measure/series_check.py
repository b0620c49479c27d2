"""What a series already holds, compared with what a run would add to it: one line for the first difference.

A series (`jaxroll.measure.series`) compares its steps with one another, so
every step must be measured alike: the same token ids (the same texts,
tokenizer, N and S), the same statistics, the same dtype, one architecture,
and steps that grow. ``jaxroll measure RUN --out OUT --resume`` and
`jaxroll.track` call `check_extends` before they measure or write anything;
the first difference is refused in one line naming the option, the value
this run would use and the value the series recorded.

What the series recorded is read from its first finished step
(``OUT/checkpoint-STEP/metadata.json`` and the ``token_ids`` of its
``measurement.npz``); the last recorded step is the largest finished one.

Pure NumPy: no torch, no JAX.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["check_extends", "check_step", "recorded", "fingerprint", "architecture_of", "LIBRARY_FIELDS",
           "COMMAND_FIELDS"]

LIBRARY_FIELDS = {"length": "token_ids", "samples": "token_ids", "token_ids": "token_ids", "stats": "stats",
                  "dtype": "model", "architecture": "model", "step": "step"}
"""The name each kind of difference is refused under in `jaxroll.track` (its arguments)."""

COMMAND_FIELDS = {"length": "--length", "samples": "--samples", "token_ids": "--texts", "stats": "--stats",
                  "dtype": "--dtype", "architecture": "model", "step": "model"}
"""The same for ``jaxroll measure RUN --resume`` (the flags the user typed)."""


def fingerprint(token_ids) -> str:
    """The first 12 hex digits of the SHA-256 of the token ids as int64, with their shape: equal ids, equal text."""
    ids = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64))
    digest = hashlib.sha256(repr(ids.shape).encode("ascii") + ids.tobytes())
    return digest.hexdigest()[:12]


def architecture_of(layer_map: str, num_layers: int, num_heads: int) -> str:
    """The words a refusal shows for an architecture (`ModelPlan`'s or metadata.json's fields)."""
    return f"{layer_map}, {int(num_layers)} layers, {int(num_heads)} heads"


def recorded(out) -> dict | None:
    """What the series in `out` recorded, or None when it holds no finished step.

    Returns ``{"step", "last", "length", "samples", "token_ids", "stats",
    "dtype", "architecture"}``: the first finished step (the reference), the
    last one, N and S, the token ids ``(S, N)``, the statistics (a tuple),
    the model dtype and `architecture_of` the model, from the reference.
    """
    from .series import checkpoint_folder, finished_steps

    steps = finished_steps(out)
    if not steps:
        return None
    folder = checkpoint_folder(out, steps[0])
    try:
        metadata = json.loads((folder / "metadata.json").read_text(encoding="utf-8"))
        with np.load(folder / "measurement.npz") as data:
            token_ids = np.asarray(data["token_ids"], dtype=np.int64)
        architecture = architecture_of(metadata["layer_map"], metadata["num_layers"], metadata["num_heads"])
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(f"{folder}: not a measurement of a series ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); allowed: a folder that jaxroll "
                          "measure or jaxroll.track wrote") from None
    return {"step": steps[0], "last": steps[-1], "length": int(token_ids.shape[1]), "samples": int(token_ids.shape[0]),
            "token_ids": token_ids, "stats": tuple(metadata.get("stats", ())), "dtype": str(metadata.get("dtype")),
            "architecture": architecture}


def check_step(step) -> int:
    """`step` as an int, refused unless an integer >= 0 (a training step; the folder is ``checkpoint-STEP``)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ConfigError.of("step", step, "an integer >= 0 (the optimiser step just completed)")
    return int(step)


def check_extends(out, *, token_ids, stats, dtype: str, architecture: str, steps=(), fields=None) -> None:
    """Refuse, in one line, a run that would not measure the series in `out` alike; nothing is read but `out`.

    Compared with `recorded` (in this order, the first difference refused):
    N and S of `token_ids`, the token ids themselves (`fingerprint`), the
    statistics (as sets), the model dtype, the architecture
    (`architecture_of`), and each of the new `steps` (those not yet
    finished in `out`), which must come after the last recorded step. A
    series with no finished step accepts anything.

    Args:
        out: the series folder.
        token_ids: ``(S, N)`` the run would measure.
        stats: the statistics it would measure.
        dtype: the model's dtype name (``"float32"``...).
        architecture: `architecture_of` the model.
        steps: the steps it would add.
        fields: the name to refuse each kind under (`LIBRARY_FIELDS`, the
            default, or `COMMAND_FIELDS`).

    Raises:
        ConfigError: the first difference, naming the field, this run's value
            and the series'.
    """
    fields = fields or LIBRARY_FIELDS
    series = recorded(out)
    if series is None:
        return
    where = f"the series in {out} (from its step {series['step']})"
    ids = np.asarray(token_ids, dtype=np.int64)
    differences = (
        ("length", f"N = {ids.shape[1]}", f"N = {series['length']}", ids.shape[1] != series["length"]),
        ("samples", f"S = {ids.shape[0]}", f"S = {series['samples']}", ids.shape[0] != series["samples"]),
        ("token_ids", f"token ids {fingerprint(ids)}", f"token ids {fingerprint(series['token_ids'])}",
         ids.shape == series["token_ids"].shape and not np.array_equal(ids, series["token_ids"])),
        ("stats", ",".join(stats), ",".join(series["stats"]), set(stats) != set(series["stats"])),
        ("dtype", f"dtype {dtype}", f"dtype {series['dtype']}", str(dtype) != series["dtype"]),
        ("architecture", architecture, series["architecture"], architecture != series["architecture"]),
    )
    for kind, this, theirs, differs in differences:
        if differs:
            raise _refusal(fields[kind], this, f"{theirs}, as {where}; measure other options into another "
                                               "series folder")
    for step in sorted(int(step) for step in steps):
        if step < series["last"]:
            raise _refusal(fields["step"], f"step {step}", f"steps after {series['last']}, the last step of "
                                                           f"the series in {out} (a series grows in step order)")


def _refusal(field: str, value: str, allowed: str) -> ConfigError:
    return ConfigError(f"{field}: {value}; allowed: {allowed}", field=field, value=value, allowed=allowed)
