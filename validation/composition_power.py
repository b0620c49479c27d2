"""Do path magnitudes compose in quadrature? The single-layer branch scales of `validation/layer-run` (issue 53).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/composition_power.py --out RUN

The measured influence is a gradient norm, ``||df / de_j||_2``: the paths from token j to the output add as
vectors, and paths of unrelated directions add in quadrature, not linearly as the rollout's product adds
them. If that were the whole story, halving a branch would lower the middle less than the linear rollout
says, and doubling it would raise the middle by about as much (``sqrt(1 + 4) - sqrt(2)`` against
``sqrt(2) - sqrt(1 + 1/4)``): the asymmetry `layer_sensitivity.py` found on both BLOOMs. This probe rolls
out each layer's transition raised elementwise to a power q and takes the q-th root of the last row,

    p_q(j) ∝ ( e_{N-1}^T |R_T|^{∘q} ... |R_1|^{∘q} )_j^{1/q}        (q = 1: today's rollout)

with every ``R_t`` the default route's (the baseline's config.yaml, the branch scale applied by
`jaxroll.interventions`), and sets the middle-mass change beside the measured one of each row of
``validation/layer-run/*.json``. The baselines are measured again into ``RUN`` (the same command and texts
as layer-run's, so the same arrays). The column ``fitted`` takes, per model, the q of the grid 1, 1.025, ..., 2
that brings the unchanged rollout closest to the baseline's measured influence (W1): a fit on the unchanged
model only, as the issue's targets allow. Writes ``RUN/composition-power.md`` and ``.json``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interventions as runs  # noqa: E402  (validation/interventions.py)

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.measure import torch_plan  # noqa: E402
from jaxroll.measure.effect import middle_mass  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = {"wave6-bloom": ("wave6", "bloom", 128, 48), "wave5-bloom": ("wave5", "bloom", 64, 64),
        "wave6-llama": ("wave6", "llama", 128, 48)}
POWERS = (1.0, 1.25, 1.5, 2.0)


def transitions(model, n: int) -> np.ndarray:
    """The dense ``R_t``, shape ``(T, n, n)``, float64."""
    return np.stack([np.asarray(jaxroll.rollout.transition(model, t, n), dtype=np.float64)
                     for t in range(model.lambdas.shape[0])])


def power_profile(R: np.ndarray, q: float) -> np.ndarray:
    """``p_q``: the last row of the product of ``|R_t|^{∘q}``, its q-th root, normalised to sum 1."""
    row = np.zeros(R.shape[-1])
    row[-1] = 1.0
    for layer in R[::-1]:
        row = row @ np.abs(layer) ** q
    p = row ** (1.0 / q)
    return p / p.sum()


def wasserstein(p: np.ndarray, q: np.ndarray) -> float:
    """W1 between two profiles over positions 0..N-1, in positions: ``sum_j |CDF_p(j) - CDF_q(j)|``."""
    return float(np.abs(np.cumsum(p / p.sum()) - np.cumsum(q / q.sum())).sum())


def rows_of(name: str, out: Path) -> list[dict]:
    wave, family, n, samples = RUNS[name]
    runs.LENGTH = n
    models = HERE / "models" / wave
    model_dir = models / f"{family}-trained"
    runs.measure(model_dir, models / "held_out.jsonl", out / name / "baseline", runs.BASE_STATS[family], samples)
    base = dataclasses.replace(jaxroll.load_config(out / name / "baseline" / "config.yaml"), sequence_length=n)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    before = transitions(base, n)
    # q = 1 is the default route's own rollout: the probe's product against the library's.
    assert np.allclose(power_profile(before, 1.0), np.asarray(jaxroll.influence(base)), atol=1e-10)
    measured = np.asarray(runs.measure(model_dir, models / "held_out.jsonl", out / name / "baseline",
                                       runs.BASE_STATS[family], samples)["influence"], dtype=np.float64)
    grid = np.linspace(1.0, 2.0, 41)
    fitted = float(grid[np.argmin([wasserstein(power_profile(before, q), measured) for q in grid])])
    powers = {**{f"q={q:g}": q for q in POWERS}, "fitted": fitted}
    rows = [{"model": name, "label": "unchanged", "fitted": fitted,
             "w1": {key: wasserstein(power_profile(before, q), measured) for key, q in powers.items()}}]
    print(name, "unchanged W1", rows[0]["w1"], flush=True)
    for gamma in (0.5, 2.0):
        for row in json.loads((HERE / "layer-run" / f"{name}-{gamma:g}.json").read_text())["rows"]:
            if row["interval"] is None:  # the sum of the layers' changes: no scale of its own
                continue
            spec = out / name / f"gamma-{'-'.join(f'{g:g}' for g in row['gamma'])}.yaml"
            spec.write_text(f"gamma: {json.dumps(row['gamma'])}\n")
            after = transitions(interventions.apply_all(base, torch_plan.parse_for(str(spec), hf_config)), n)
            low, high = row["interval"]
            rows.append({"model": name, "gamma": gamma, "label": row["label"], "measured": row["measured"],
                         "significant": bool(low > 0 or high < 0),
                         **{key: float(middle_mass(power_profile(after, q)) - middle_mass(power_profile(before, q)))
                            for key, q in powers.items()}})
            print(name, gamma, row["label"], {k: round(rows[-1][k], 4) for k in powers}, flush=True)
    return rows


def markdown(all_rows: list[dict]) -> str:
    keys = [f"q={q:g}" for q in POWERS] + ["fitted"]
    rows = [row for row in all_rows if "w1" not in row]
    lines = ["| model | gamma | on | measured | " + " | ".join(keys) + " |", "|---|---:|---|---:|" + "---:|" * len(keys)]
    for row in rows:
        cells = [f"{row[k]:+.4f}" + (f" ({row[k] / row['measured']:.2f}x)" if row["significant"] else "") for k in keys]
        lines.append(f"| {row['model']} | {row['gamma']:g} | {row['label']} | {row['measured']:+.4f}"
                     f"{'' if row['significant'] else ' (n.s.)'} | " + " | ".join(cells) + " |")
    lines += ["", "The unchanged model: W1 (positions) of p_q to the measured influence:", ""]
    lines += [f"- {row['model']} (fitted q = {row['fitted']:g}): " + ", ".join(f"{k} {row['w1'][k]:.2f}" for k in keys) for row in all_rows if "w1" in row]
    lines += ["", "Significant rows within 1.25x (ratio in [0.8, 1.25]):", ""]
    for key in keys:
        counts = {name: [0, 0] for name in RUNS}
        for row in rows:
            if row["significant"]:
                counts[row["model"]][1] += 1
                counts[row["model"]][0] += 0.8 <= row[key] / row["measured"] <= 1.25
        total = [sum(c[i] for c in counts.values()) for i in (0, 1)]
        lines.append(f"- {key}: {total[0]} of {total[1]} (" + ", ".join(f"{n} {a} of {b}" for n, (a, b) in counts.items())
                     + ")")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    out = runs.start_run(__doc__, argv)
    rows = [row for name in RUNS for row in rows_of(name, out)]
    (out / "composition-power.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows)
    (out / "composition-power.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
