"""The composition exponent on the task models (issue 54 with issue 53's q).

    PYTHONPATH=. python3 validation/task-u-run/loop-composition/exponent.py /tmp/tlq

For each ``measure-N`` folder that validation/task_loop.py wrote into its ``--work`` (the three runs of this
folder's README, under ROOT): W1 of the rollout of its config.yaml to its measured influence at q = 1, 1.1, 1.2,
1.5, 2, and the q that `jaxroll.fitting.fit_composition` returns (what `jaxroll measure` writes). Prints the
README's table.
"""

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np

import jaxroll
from jaxroll.fitting import fit_composition
from jaxroll.metrics import wasserstein
from jaxroll.model import checked_composition

RUNS = {"llama-step2500": ("work", (64, 128)), "bloom-a5-step9000": ("work-bloom-a5-step9000", (128, 160)),
        "bloom-step9000": ("work-bloom-step9000", (128, 160))}
EXPONENTS = (1.0, 1.1, 1.2, 1.5, 2.0)


def main(root: Path) -> None:
    jax.config.update("jax_enable_x64", True)
    print("| model | N | fitted q | W1 at q = " + " / ".join(f"{q:g}" for q in EXPONENTS) + " |\n|---|---:|---:|---|")
    for name, (work, lengths) in RUNS.items():
        for n in lengths:
            folder = root / work / f"measure-{n}"
            base = jaxroll.load_config(folder / "config.yaml")
            measured = np.load(folder / "measurement.npz")["influence"]
            fitted, _ = fit_composition(base, measured)
            scores = [float(wasserstein(np.asarray(jaxroll.influence(
                dataclasses.replace(base, composition=checked_composition(q)))), measured)) for q in EXPONENTS]
            print(f"| {name} | {n} | {fitted:g} | " + " / ".join(f"{w:.4f}" for w in scores) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
