"""The noise ceiling of the task-U Spearman target (issue 54): how well could any prediction rank the depths?

For every accuracy table of `validation/task-u-run/loop/per-case-all/` (each model and length: 11 depths, 200
held-out cases a depth), `jaxroll.task.external.noise_ceiling`: the Spearman a predictor that knew each depth's
true accuracy would score against a table drawn like the measured one (true accuracies estimated by moments).
Beside it, the Spearman each span mass of that run reaches at that length (the link is monotone, so the held-out
Spearman at a length is the Spearman of mass and accuracy there): the rollout's mean kernel, each case's own
rollout row (the per-case rollout) and the measured influence per case.

    PYTHONPATH=. python3 validation/task_ceiling.py > validation/task-u-run/loop/per-case-all/ceiling.md
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from jaxroll.task.external import noise_ceiling, spearman

RUNS = Path(__file__).parent / "task-u-run" / "loop" / "per-case-all"
SOURCES = (("predict", "rollout, mean kernel"), ("per-case", "rollout, per case"), ("bound", "measured, per case"))


def _rows(folder: Path, source: str) -> list[dict]:
    compare = sorted(folder.glob(f"{source}-fit*/compare.csv"))[0]  # every fit holds the same masses
    with open(compare, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def main() -> None:
    print("| run | N | " + " | ".join(name for _, name in SOURCES) + " | noise ceiling [95 %] |")
    print("|---|---|" + "---|" * len(SOURCES) + "---|")
    for table in sorted(RUNS.rglob("accuracy-table.csv")):
        folder = table.parent
        rows = {source: _rows(folder, source) for source, _ in SOURCES}
        for length in sorted({int(row["length"]) for row in rows["predict"]}):
            here = {source: [row for row in found if int(row["length"]) == length] for source, found in rows.items()}
            # every source's compare.csv holds the same table rows: accuracy and cases from one of them
            accuracy = np.array([float(row["accuracy"]) for row in here["predict"]])
            n = np.array([int(row["n_cases"]) for row in here["predict"]])
            cells = [spearman([float(row["mass"]) for row in here[source]], accuracy) for source, _ in SOURCES]
            ceiling = noise_ceiling(accuracy, n, resamples=4000, rng=0)
            low, high = ceiling["spearman_ceiling_interval"]
            print(f"| {folder.relative_to(RUNS)} | {length} | " + " | ".join(f"{c:.2f}" for c in cells)
                  + f" | {ceiling['spearman_ceiling']:.2f} [{low:.2f}, {high:.2f}] |")


if __name__ == "__main__":
    main()
