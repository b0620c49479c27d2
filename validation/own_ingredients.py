"""Where a size error comes from: the rollout of the intervened model's own measured ingredients (issue 53).

    PYTHONPATH=. python3 validation/own_ingredients.py RUN/wave5/llama RUN/wave6/llama > table.md

Each folder is a rotary model's folder of `validation/interventions.py`: ``baseline/`` and one folder per
intervention, each measured with the mean attention (its config.yaml a `DenseKernel`). For each change, the
middle-mass change of today's layer rolled out on

- the intervened model's own mean attention and lambdas (its config.yaml): what the layer model gives when the
  kernel and lambdas are known exactly;
- its lambdas on the baseline's kernel ("lambdas only"), and its kernel with the baseline's lambdas ("kernel
  only"),

each against the baseline's own rollout, next to the measured change. A change that comes within 1.25x with its
own ingredients needs only those ingredients predicted; one that does not is a miss of the layer model or of
how layers compose.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import jaxroll
from jaxroll.measure.effect import middle_mass

CHANGES = ("gamma0.5", "gamma2", "per-layer-gamma", "kappa-0.5", "kappa0.5", "kappa1_kappa_formunsquash", "tau0.7",
           "tau1.5", "ssmax_scale0.3")


def ingredients(folder: Path):
    """``(kernel, lambdas, measured profile)`` of a measurement folder: its mean attention as a `DenseKernel`."""
    with np.load(folder / "measurement.npz") as archive:
        rows = archive["attention_mean"]
        per_sequence = archive["influence_per_sequence"]
        lambdas = np.clip(archive["lambdas"], 0.0, 1.0)
    kernel = jaxroll.DenseKernel.create(rows / rows.sum(axis=-1, keepdims=True))
    return kernel, lambdas, per_sequence.sum(0) / per_sequence.sum()


def middle(kernel, lambdas) -> float:
    return float(middle_mass(np.asarray(jaxroll.influence(jaxroll.RolloutModel.create(kernel=kernel, lambdas=lambdas)))))


def main(argv=None) -> int:
    folders = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    print("| model | change | measured | own kernel and lambdas | lambdas only | kernel only |")
    print("|---|---|---:|---:|---:|---:|")
    for folder in folders:
        base_kernel, base_lambdas, base_profile = ingredients(folder / "baseline")
        base = middle(base_kernel, base_lambdas)
        for slug in CHANGES:
            if not (folder / slug / "measurement.npz").is_file():
                continue
            kernel, lambdas, profile = ingredients(folder / slug)
            measured = float(middle_mass(profile) - middle_mass(base_profile))
            cells = [middle(kernel, lambdas) - base, middle(base_kernel, lambdas) - base,
                     middle(kernel, base_lambdas) - base]
            shown = " | ".join(f"{c:+.4f} ({c / measured:.2f}x)" for c in cells)
            print(f"| {folder.parent.name} {folder.name} | `{slug}` | {measured:+.4f} | {shown} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
