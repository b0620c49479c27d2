"""The composition exponent q fitted on the unchanged model, on every intervention of the validation table (issue 53).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/composition_fit.py --out RUN

`validation/composition_power.py` found that rolling out ``|R_t|^{∘q}`` and taking the q-th root of the last
row (``q = 1``: today's rollout) brings the unchanged prediction 6-13x closer to the measured influence at
``q`` = 1.15-1.2, fitted on the unchanged model alone. This run asks what that does to the predicted changes
of `validation/interventions.py`'s table: for each model (wave 5 at N = 64, S = 64; wave 6 at N = 128, S = 48),
q is the exponent `jaxroll measure` fitted to the baseline's measured influence and wrote to its config.yaml
(`jaxroll.fitting.fit_composition`: the default route; the log also prints the best point of the grid 1,
1.025, ..., 2, the first run's choice); every intervention is then predicted with q = 1 and with that q, applied,
measured (``jaxroll measure --intervene``, the table's command) and scored as the table scores it
(`jaxroll.measure.effect.effect`, paired, 1000 resamples): the naive W1 / noise, the anchored one, the unchanged
prediction's, and the middle-mass change. Writes ``RUN/composition-fit.md`` and ``.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path

import jax
import numpy as np
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import composition_power as power  # noqa: E402
import interventions as runs  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.measure import torch_plan  # noqa: E402
from jaxroll.measure.effect import effect  # noqa: E402
from jaxroll.measure.uncertainty import score  # noqa: E402

HERE = Path(__file__).resolve().parent
MODELS = {("wave5", "bloom"): (64, 64), ("wave5", "llama"): (64, 64), ("wave6", "bloom"): (128, 48),
          ("wave6", "llama"): (128, 48)}


def predict(models: dict, changes, length: int, q: float):
    """`interventions.predict` with the power rollout: ``(p_B, p_I)`` of the first model the changes apply to."""
    sinks = next((c for c in changes if isinstance(c, interventions.SinkTokens)), interventions.SinkTokens(0))
    last = None
    for model in models.values():
        base = dataclasses.replace(model, sequence_length=length)
        try:
            changed = interventions.apply_all(base, changes)
        except jaxroll.ConfigError as error:
            last = error
            continue
        p_base = power.power_profile(power.transitions(base, length), q)
        p_changed = power.power_profile(power.transitions(changed, changed.sequence_length), q)
        return p_base, np.asarray(sinks.split(jax.numpy.asarray(p_changed))[1], dtype=np.float64)
    raise last


def fitted_q(model, measured: np.ndarray, n: int) -> float:
    grid = np.linspace(1.0, 2.0, 41)
    R = power.transitions(dataclasses.replace(model, sequence_length=n), n)
    return float(grid[np.argmin([power.wasserstein(power.power_profile(R, q), measured) for q in grid])])


def model_rows(wave: str, family: str, out: Path, log) -> list[dict]:
    n, samples = MODELS[wave, family]
    runs.LENGTH = n
    models_dir = HERE / "models" / wave
    model_dir, texts, folder = models_dir / f"{family}-trained", models_dir / "held_out.jsonl", out / wave / family
    baseline = runs.measure(model_dir, texts, folder / "baseline", runs.BASE_STATS[family], samples)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    layers, heads = hf_config.num_hidden_layers, hf_config.num_attention_heads
    models = runs.rollout_models(baseline, family, folder / "baseline" / "config.yaml")
    # The default route's q: the one `jaxroll measure` fitted and wrote to config.yaml (None: q = 1).
    composed = models["config"]
    q = 1.0 if composed.composition is None else float(composed.composition)
    log(f"{wave} {family}: q = {q:.4g} (config.yaml); the grid's best {fitted_q(composed, runs.profile_of(baseline['influence_per_sequence']), n):g}")
    # The probe's NumPy power rollout against the library's composed rollout of the same config.
    assert np.allclose(power.power_profile(power.transitions(composed, n), q), np.asarray(jaxroll.influence(composed)),
                       atol=1e-10)
    models = {name: dataclasses.replace(model, composition=None) for name, model in models.items()}
    rows = []
    for entry in runs.INTERVENTIONS[family]:
        mapping = runs.yaml_interventions(entry, layers, heads)
        slug = entry.replace("=", "").replace(",", "_").replace(" ", "-")
        spec = entry
        if mapping is not None:
            spec = str(folder / f"{slug}.yaml")
            Path(spec).write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in mapping.items()))
        try:
            changes = torch_plan.parse_for(spec, hf_config)
            sinks = next((c.num_sinks for c in changes if isinstance(c, interventions.SinkTokens)), 0)
            predictions = {key: predict(models, changes, n - sinks, value) for key, value in (("q=1", 1.0), ("fitted", q))}
        except jaxroll.ConfigError as error:
            log(f"  {entry}: not applied: {error}")
            continue
        if not sinks:  # q = 1 is the table's extended prediction
            reference_p = runs.predict(models, changes, n)
            assert all(np.allclose(a, b, atol=1e-10) for a, b in zip(predictions["q=1"], reference_p[:2]))
        reference = baseline if not sinks else runs.measure(model_dir, texts, folder / f"baseline-n{n - sinks}",
                                                            runs.STATS[family], samples, n - sinks)
        intervened = runs.measure(model_dir, texts, folder / slug, runs.STATS[family], samples, n - sinks, spec)
        row = {"model": f"{wave} {family}", "intervention": entry, "q": q}
        for key, (p_base, p_changed) in predictions.items():
            result = effect(reference["influence_per_sequence"], intervened["influence_per_sequence"], p_changed,
                            predicted_baseline=p_base, paired=True, B=1000, seed=0)
            middle = result.changes["middle_mass"]
            row["effect_ratio"], row["middle_measured"] = result.effect_ratio, middle.measured
            row["middle_interval"] = list(middle.measured_interval)
            row[key] = {"naive": result.prediction.ratio, "anchored": result.anchored.ratio,
                        "unchanged": score(p_base, intervened["influence_per_sequence"], B=1000, seed=0).ratio,
                        "baseline": score(p_base, reference["influence_per_sequence"], B=1000, seed=0).ratio,
                        "middle": middle.predicted}
        rows.append(row)
        log(f"  {entry:28s} effect {row['effect_ratio']:5.1f}x  naive {row['q=1']['naive']:5.1f}x -> "
            f"{row['fitted']['naive']:5.1f}x  anchored {row['q=1']['anchored']:5.1f}x -> {row['fitted']['anchored']:5.1f}x"
            f"  middle {row['middle_measured']:+.4f}: {row['q=1']['middle']:+.4f} -> {row['fitted']['middle']:+.4f}")
    return rows


def target_a(row: dict, key: str, which: str) -> bool | None:
    """`interventions.target_a`: an effect > 3x noise predicted within 2x the noise and closer than p_B."""
    if row["effect_ratio"] <= 3:
        return None
    return row[key][which] <= 2 and row[key][which] < row[key]["unchanged"]


def target_middle(row: dict, key: str) -> bool | None:
    kind = runs.KIND.get(row["intervention"], runs.KIND.get(row["intervention"].split("=")[0]))
    low, high = row["middle_interval"]
    if kind is None or low <= 0 <= high:
        return None
    measured, predicted = row["middle_measured"], row[key]["middle"]
    if kind == "sign":
        return bool(np.sign(predicted) == np.sign(measured))
    return bool(0.8 <= predicted / measured <= 1.25)


def markdown(rows: list[dict]) -> str:
    lines = ["| model | intervention | effect / noise | naive W1 / noise: q = 1 / fitted | anchored: q = 1 / fitted | "
             "unchanged p_B: q = 1 / fitted | middle mass: measured [95 %] | predicted: q = 1 / fitted |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, b = r["q=1"], r["fitted"]
        low, high = r["middle_interval"]
        lines.append(f"| {r['model']} (q = {r['q']:g}) | `{r['intervention']}` | {r['effect_ratio']:.1f}x | "
                     f"{a['naive']:.1f}x / {b['naive']:.1f}x | {a['anchored']:.1f}x / {b['anchored']:.1f}x | "
                     f"{a['unchanged']:.1f}x / {b['unchanged']:.1f}x | {r['middle_measured']:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{a['middle']:+.3f} / {b['middle']:+.3f} |")
    lines += ["", "| model | (a) naive met: q = 1 / fitted | (a) anchored met: q = 1 / fitted | (b, c) middle mass met: "
              "q = 1 / fitted | (d) unchanged W1 / noise to the baseline: q = 1 / fitted |", "|---|---:|---:|---:|---:|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        cells = []
        for test in (lambda r, k: target_a(r, k, "naive"), lambda r, k: target_a(r, k, "anchored"), target_middle):
            counted = [(test(r, "q=1"), test(r, "fitted")) for r in mine if test(r, "q=1") is not None]
            cells.append(f"{sum(a for a, _ in counted)} / {sum(b for _, b in counted)} of {len(counted)}")
        first = next(r for r in mine if not r["intervention"].startswith("sinks"))
        cells.append(f"{first['q=1']['baseline']:.2f}x / {first['fitted']['baseline']:.2f}x")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    out = runs.start_run(__doc__, argv)
    log = functools.partial(print, flush=True)
    rows = [row for wave, family in MODELS for row in model_rows(wave, family, out, log)]
    (out / "composition-fit.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows)
    (out / "composition-fit.md").write_text(table)
    log(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
