"""How fine the kappa grid must be: the distance tables read between grid kappas against tables at those kappas.

    PYTHONPATH=. python3 validation/distance_grid.py --measured RUN/wave6/llama/baseline \
        --model validation/models/wave6/llama-trained [--results RUN/wave6/results.json]

The baseline's own held-out sequences (its measurement.npz's token ids) are measured again with
``attention_distances`` at a fine grid (the default's 8 kappas and 8 between them), in float64. Each change is
then predicted by the default route (`jaxroll.kernel_types.GainTableKernel` read through
`jaxroll.interventions`) twice: from the default grid's tables only (so the fine kappas are read between grid
points, as a user's kappa is) and from the fine tables (exact there). Printed: the middle-mass change of each,
their ratio, and the measured change where the run's results.json has the row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.measure import distance_rows, measure  # noqa: E402
from jaxroll.measure.effect import middle_mass  # noqa: E402
from jaxroll.measure.registry import DISTANCE_GRID  # noqa: E402

FINE = tuple(sorted(set(DISTANCE_GRID) | {-1.5, -0.75, -0.35, -0.1, 0.1, 0.35, 0.75, 1.5}))
CHANGES = ("kappa=-1.5", "kappa=-0.75", "kappa=-0.5", "kappa=-0.35", "kappa=-0.1", "kappa=0.1", "kappa=0.35",
           "kappa=0.5", "kappa=0.75", "kappa=1.5", "kappa=0.35,kappa_form=unsquash", "kappa=0.75,kappa_form=unsquash",
           "kappa=1,kappa_form=unsquash", "kappa=1.5,kappa_form=unsquash")


def middle(profile) -> float:
    return float(middle_mass(np.asarray(profile)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, required=True, help="the baseline folder (jaxroll measure --out)")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--results", type=Path, default=None, help="validation/interventions.py's results.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with np.load(args.measured / "measurement.npz", allow_pickle=False) as archive:
        token_ids = archive["token_ids"]
    distance_rows.DISTANCE_GRID = FINE  # the statistic's grid, for this run only
    result = measure(pipeline.load_float64(args.model), token_ids,
                     stats=("lambda", "attention", "attention_gains", "attention_distances", "paths"))
    fine = result.to_rollout_model()
    keep = [FINE.index(k) for k in DISTANCE_GRID]
    kernel = fine.kernel
    coarse = dataclasses.replace(fine, kernel=dataclasses.replace(
        kernel, distance_rows=kernel.distance_rows[:, :, keep], distance_grid=DISTANCE_GRID))
    measured = {}
    if args.results is not None:
        measured = {row["intervention"]: row for row in json.loads(args.results.read_text())["rows"]
                    if row["family"] == "llama" and "middle_measured" in row}
    base = middle(jaxroll.influence(fine))
    print("| change | measured | tables at the fine grid (exact here) | default grid (read between) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for spec in CHANGES:
        changes = interventions.parse(spec)
        exact = middle(jaxroll.influence(interventions.apply_all(fine, changes))) - base
        read = middle(jaxroll.influence(interventions.apply_all(coarse, changes))) - base
        row = measured.get(spec)
        shown = f"{row['middle_measured']:+.4f}" if row else "-"
        print(f"| `{spec}` | {shown} | {exact:+.4f} | {read:+.4f} | {read / exact:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
