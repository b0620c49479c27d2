"""The per-sequence-rows route with the composition exponent, on every intervention of the validation table (issue 53).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/rows_composition.py --out RUN

`jaxroll predict-rows` now composes every profile it writes with the q that `jaxroll measure` fitted and wrote to the
baseline's config.yaml (`jaxroll.measure.row_prediction.measured_composition`). This run asks what that does to the
rows route, beside the default route of `validation/composition_fit.py` (its committed
``composition-fit-run/composition-fit.json``, the same models, texts, lengths and measurements). For each model
(wave 5 at N = 64, S = 64; wave 6 at N = 128, S = 48) the baseline is measured with the default route's statistics
(`validation/interventions.py`'s ``BASE_STATS``); every intervention the rows route maps (sink tokens lengthen the
sequence and are refused) is predicted by `predict_from_measurement` (the command's own function: q from
config.yaml, the closed ratio with the measured shares) and, from the same rows, with q = 1 (`rolled_out`,
`path_rolled_out` without the exponent); the intervention is applied and measured (``jaxroll measure --intervene``,
the table's command) and scored as the table scores it (`jaxroll.measure.effect.effect`, paired, 1000 resamples).
Writes ``RUN/rows-composition.md`` and ``.json``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import composition_fit as fit  # noqa: E402
import interventions as runs  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll.measure import torch_plan  # noqa: E402
from jaxroll.measure.effect import effect  # noqa: E402
from jaxroll.measure.row_prediction import path_rolled_out, predict_from_measurement, rolled_out  # noqa: E402
from jaxroll.measure.uncertainty import score  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_ROUTE = HERE / "composition-fit-run" / "composition-fit.json"


def model_rows(wave: str, family: str, out: Path, default: dict, log) -> list[dict]:
    n, samples = fit.MODELS[wave, family]
    runs.LENGTH = n
    models_dir = HERE / "models" / wave
    model_dir, texts, folder = models_dir / f"{family}-trained", models_dir / "held_out.jsonl", out / wave / family
    baseline = runs.measure(model_dir, texts, folder / "baseline", runs.BASE_STATS[family], samples)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    layers, heads = hf_config.num_hidden_layers, hf_config.num_attention_heads
    rows = []
    for entry in runs.INTERVENTIONS[family]:
        if entry.startswith("sinks"):
            continue
        mapping = runs.yaml_interventions(entry, layers, heads)
        slug = entry.replace("=", "").replace(",", "_").replace(" ", "-")
        spec = entry
        if mapping is not None:
            spec = str(folder / f"{slug}.yaml")
            Path(spec).write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in mapping.items()))
        try:
            torch_plan.parse_for(spec, hf_config)
            prediction, record = predict_from_measurement(folder / "baseline", spec, batch_size=8)
        except jaxroll.ConfigError as error:
            log(f"  {entry}: not predicted: {error}")
            continue
        q = record["composition"]
        # q = 1 from the same mean rows, path weights and gains: only the exponent differs.
        unit_profile = (rolled_out(prediction.lambdas, prediction.kernels) if prediction.weights is None else
                        path_rolled_out(prediction.lambdas, prediction.kernels, prediction.baseline_kernels,
                                        prediction.weights, prediction.changed_weights,
                                        record["probability_shares"], prediction.gains))
        predictions = {"q=1": (rolled_out(record["lambdas"], prediction.baseline_kernels), unit_profile),
                       "fitted": (prediction.baseline, prediction.profile)}
        intervened = runs.measure(model_dir, texts, folder / slug, runs.STATS[family], samples, n, spec)
        row = {"model": f"{wave} {family}", "intervention": entry, "q": 1.0 if q is None else q}
        for key, (p_base, p_changed) in predictions.items():
            result = effect(baseline["influence_per_sequence"], intervened["influence_per_sequence"], p_changed,
                            predicted_baseline=p_base, paired=True, B=1000, seed=0)
            middle = result.changes["middle_mass"]
            row["effect_ratio"], row["middle_measured"] = result.effect_ratio, middle.measured
            row["middle_interval"] = list(middle.measured_interval)
            row[key] = {"naive": result.prediction.ratio, "anchored": result.anchored.ratio,
                        "unchanged": score(p_base, intervened["influence_per_sequence"], B=1000, seed=0).ratio,
                        "baseline": score(p_base, baseline["influence_per_sequence"], B=1000, seed=0).ratio,
                        "middle": middle.predicted}
        same = default.get((row["model"], entry))
        row["default"] = None if same is None else same["fitted"]
        rows.append(row)
        log(f"  {entry:28s} effect {row['effect_ratio']:5.1f}x  rows naive {row['q=1']['naive']:5.1f}x -> "
            f"{row['fitted']['naive']:5.1f}x  anchored {row['q=1']['anchored']:5.1f}x -> "
            f"{row['fitted']['anchored']:5.1f}x  middle {row['middle_measured']:+.4f}: {row['q=1']['middle']:+.4f} -> "
            f"{row['fitted']['middle']:+.4f}")
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| model | intervention | effect / noise | rows, naive W1 / noise: q = 1 / fitted (default route) | "
             "anchored: q = 1 / fitted (default) | middle mass: measured [95 %] | rows: q = 1 / fitted (default) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, b, d = r["q=1"], r["fitted"], r["default"] or {"naive": np.nan, "anchored": np.nan, "middle": np.nan}
        low, high = r["middle_interval"]
        lines.append(f"| {r['model']} (q = {r['q']:.4g}) | `{r['intervention']}` | {r['effect_ratio']:.1f}x | "
                     f"{a['naive']:.1f}x / {b['naive']:.1f}x ({d['naive']:.1f}x) | "
                     f"{a['anchored']:.1f}x / {b['anchored']:.1f}x ({d['anchored']:.1f}x) | "
                     f"{r['middle_measured']:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{a['middle']:+.3f} / {b['middle']:+.3f} ({d['middle']:+.3f}) |")
    lines += ["", "| model | (a) naive met: rows q = 1 / rows fitted / default route | (a) anchored met: same | "
              "(b, c) middle mass met: same |", "|---|---:|---:|---:|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        cells = []
        for test in (lambda r, k: fit.target_a(r, k, "naive"), lambda r, k: fit.target_a(r, k, "anchored"),
                     fit.target_middle):
            counted = [tuple(test(r, k) for k in ("q=1", "fitted", "default")) for r in mine
                       if r["default"] is not None and test(r, "q=1") is not None]
            cells.append(" / ".join(str(sum(bool(c[i]) for c in counted)) for i in range(3)) + f" of {len(counted)}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    out = runs.start_run(__doc__, argv)
    log = functools.partial(print, flush=True)
    default = {(r["model"], r["intervention"]): r for r in json.loads(DEFAULT_ROUTE.read_text())}
    rows = []
    for wave, family in fit.MODELS:
        log(f"{wave} {family}")
        rows += model_rows(wave, family, out, default, log)
    (out / "rows-composition.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows)
    (out / "rows-composition.md").write_text(table)
    log(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
