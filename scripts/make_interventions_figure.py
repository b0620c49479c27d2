"""docs/figures/interventions.png: the published MPT-7B configuration's predicted profile under each
rollout-side intervention of `jaxroll.interventions` (docs/interventions.md).

    python3 scripts/make_interventions_figure.py [--out docs/figures/interventions.png]
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_enable_x64", True)

import jaxroll  # noqa: E402
from jaxroll import interventions as iv  # noqa: E402
from jaxroll.plot import plot_interventions  # noqa: E402

CHANGES = {
    "temperature tau = 0.7": iv.Temperature(0.7),
    "slope scale s = 0.5": iv.SlopeScale(0.5),
    "attention branch gamma = 0.5": iv.BranchScale(0.5),
    "distance bias kappa = 0.5, ln(1 + m)": iv.DistanceBias(0.5),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/figures/interventions.png")
    arguments = parser.parse_args(argv)
    model = jaxroll.published.load("mpt-7b")
    changed = {label: jaxroll.influence(change.apply(model)) for label, change in CHANGES.items()}
    plot_interventions(arguments.out, jaxroll.influence(model), changed,
                       title=f"MPT-7B (published configuration, N = {model.sequence_length}): the rollout's "
                             "prediction under each intervention")
    print(f"wrote {arguments.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
