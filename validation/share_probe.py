"""How the default route's temperature and SSMax predictions depend on the probability path's share.

    PYTHONPATH=. python3 validation/share_probe.py RUN/wave5 RUN/wave6 > share-probe.md

Each RUN/waveN is a folder of validation/interventions.py (its ``llama/baseline/config.yaml`` and results.json).
The baseline's config (a `GainTableKernel` with the measured shares rho_t) is rolled out under each change with
every rho_t multiplied by f = 0 (today's layer: the value path alone) .. 2 (capped at 0.95), and the predicted
middle-mass change printed beside the measured one.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

import jaxroll
from jaxroll import interventions
from jaxroll.measure.effect import middle_mass

FACTORS = (0.0, 0.5, 1.0, 1.25, 1.5, 2.0)


def main(argv=None) -> int:
    runs = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    print("| model | change | measured | " + " | ".join(f"rho x {f:g}" for f in FACTORS) + " |")
    print("|---|---|---:|" + "---:|" * len(FACTORS))
    for run in runs:
        model = jaxroll.load_config(run / "llama" / "baseline" / "config.yaml")
        rho = np.asarray(model.kernel.probability_shares)
        measured = {row["intervention"]: row["middle_measured"]
                    for row in json.loads((run / "results.json").read_text())["rows"] if "middle_measured" in row}
        for spec in ("tau=0.7", "tau=1.5", "ssmax_scale=0.3"):
            cells = []
            for factor in FACTORS:
                scaled = dataclasses.replace(model, kernel=dataclasses.replace(
                    model.kernel, probability_shares=np.minimum(rho * factor, 0.95)))
                before = float(middle_mass(np.asarray(jaxroll.influence(scaled))))
                changed = interventions.apply_all(scaled, interventions.parse(spec))
                cells.append(f"{float(middle_mass(np.asarray(jaxroll.influence(changed)))) - before:+.4f}")
            print(f"| {run.name} llama | `{spec}` | {measured[spec]:+.4f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
