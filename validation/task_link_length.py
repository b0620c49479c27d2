"""Does the link carry across lengths if the span mass is taken relative to a uniform profile's? (issue 54)

    PYTHONPATH=. python3 validation/task_link_length.py validation/task-u-run/loop/per-case > link-length.md

For every compare-task folder under the run (its compare.csv: each row's span mass, accuracy, cases, role), the
link is fitted on the `fit` rows and scored on the held-out length twice: on the span mass x (compare-task's),
and on x L / (e - s), the mass over a uniform profile's mass on the same span, which removes the 1 / L that
spreading influence over more positions puts into x. The error is compare-task's, in accuracy units,
sqrt(sum n (y - y_hat)^2 / sum n), beside a constant's (the fit rows' mean accuracy). Spearman is unchanged:
within one length the two masses differ by a constant factor per span length, and every span is 5 tokens.
"""
import csv
import sys
from pathlib import Path

import numpy as np

from jaxroll.task.external import fit_link


def error(y, n, predicted):
    return float(np.sqrt(np.sum(n * (y - predicted) ** 2) / np.sum(n)))


def errors(path: Path) -> tuple[float, float, float]:
    rows = list(csv.DictReader(path.open()))
    column = lambda key: np.array([float(row[key]) for row in rows])  # noqa: E731
    length, start, end = column("length"), column("start"), column("end")
    mass, y, n = column("mass"), column("accuracy"), column("n_cases")
    fit = np.array([row["role"] == "fit" for row in rows])
    held = ~fit
    scores = []
    for x in (mass, mass * length / (end - start)):
        link = fit_link(x[fit], y[fit], n[fit])
        scores.append(error(y[held], n[held], link(x[held])))
    constant = np.sum(n[fit] * y[fit]) / np.sum(n[fit])
    return scores[0], scores[1], error(y[held], n[held], constant)


def main(root: Path) -> None:
    print(f"# The link across lengths: span mass against mass relative to uniform ({root})\n")
    print("| compare-task folder | held-out error: mass | mass relative to uniform | constant |")
    print("|---|---:|---:|---:|")
    for path in sorted(root.rglob("compare.csv")):
        raw, relative, constant = errors(path)
        print(f"| {path.parent.relative_to(root)} | {raw:.3f} | {relative:.3f} | {constant:.3f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
