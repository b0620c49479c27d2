"""The branch scale's lambdas: measured under the change, the plain formula, and the stream rule (issue 53).

    PYTHONPATH=. python3 validation/stream_rule.py RUN/wave5/bloom RUN/wave6/llama ... > table.md

Each folder is a model's folder of `validation/interventions.py` (``baseline/`` measured with lambda, so its
measurement.npz has ``stream_norms``; ``gamma0.5/``, ``gamma2/``, ``per-layer-gamma/`` measured under the patch).
Prints a Markdown table: per layer, lambda measured under the change, the plain formula
``gamma lambda / (gamma lambda + 1 - lambda)`` and `BranchScale` with the measured stream norms, and each rule's
largest error over the layers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

from jaxroll.interventions import BranchScale

CHANGES = {"gamma0.5": 0.5, "gamma2": 2.0, "per-layer-gamma": None}


def rows(folder: Path):
    base = np.load(folder / "baseline" / "measurement.npz")
    lambdas, norms = base["lambdas"], base["stream_norms"]
    for slug, gamma in CHANGES.items():
        if not (folder / slug / "measurement.npz").is_file():
            continue
        if gamma is None:
            gamma = np.asarray(yaml.safe_load((folder / f"{slug}.yaml").read_text())["gamma"], dtype=np.float64)
        measured = np.load(folder / slug / "measurement.npz")["lambdas"]
        plain = BranchScale.mixed_lambdas(np.broadcast_to(gamma, lambdas.shape), lambdas)
        stream = BranchScale.mixed_lambdas(np.broadcast_to(gamma, lambdas.shape), lambdas, norms)
        yield slug, measured, plain, stream


def main(argv=None) -> int:
    folders = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    print("| model | change | lambda measured under the change | plain formula | stream rule | largest error: "
          "plain / stream |")
    print("|---|---|---|---|---|---:|")
    for folder in folders:
        for slug, measured, plain, stream in rows(folder):
            show = lambda v: " ".join(f"{x:.3f}" for x in v)  # noqa: E731
            print(f"| {folder.parent.name} {folder.name} | {slug} | {show(measured)} | {show(plain)} | {show(stream)} | "
                  f"{np.max(np.abs(plain - measured)):.3f} / {np.max(np.abs(stream - measured)):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
