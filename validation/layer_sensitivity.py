"""Which layers a branch scale's error comes from (issue 53): gamma on one layer at a time.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/layer_sensitivity.py --models validation/models/wave6 \
        --family bloom --length 128 --samples 48 --gamma 0.5 --out RUN

The per-layer gamma of `validation/interventions.py` (the later half of the layers scaled by 0.5) is predicted
at 1.8x its measured middle-mass change on the wave-6 BLOOM, even with the model's own measured ingredients
(`validation/own_ingredients.py`): the layer, not its inputs. This run splits that change by layer. For each
layer t, `--gamma` on layer t alone (every other layer 1), and then on the later half at once:

- predicted: the default route, the baseline's config.yaml (the extended layer, the stream rule for lambda
  under a branch scale), middle mass of the changed rollout minus the unchanged one;
- measured: ``jaxroll measure --intervene`` on the same texts, the paired change of the mean influence's
  middle mass with its 95 % interval (`jaxroll.measure.effect.effect`, 1000 resamples).

If the layers' changes add up, the later half's change is their sum; the ratio per layer says where the
rollout's sensitivity to a branch differs from the model's. Writes ``layers.md`` and ``layers.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interventions as runs  # noqa: E402  (validation/interventions.py)

from jaxroll.measure import torch_plan  # noqa: E402
from jaxroll.measure.effect import effect, middle_mass  # noqa: E402


def change_of(out: Path, family: str, gammas: list[float], context: dict) -> dict:
    """One per-layer gamma: predicted and measured middle-mass change."""
    slug = "gamma-" + "-".join(f"{g:g}" for g in gammas)
    spec = out / f"{slug}.yaml"
    spec.write_text(f"gamma: {json.dumps(gammas)}\n")
    changes = torch_plan.parse_for(str(spec), context["hf_config"])
    p_base, p_changed, _ = runs.predict(context["models"], changes, runs.LENGTH)
    share_base, share_changed, _ = runs.predict(context["share"], changes, runs.LENGTH)
    intervened = runs.measure(context["model_dir"], context["texts"], out / slug, runs.STATS[family],
                              context["samples"], runs.LENGTH, str(spec))
    result = effect(context["baseline"]["influence_per_sequence"], intervened["influence_per_sequence"], p_changed,
                    predicted_baseline=p_base, paired=True, B=1000, seed=0)
    middle = result.changes["middle_mass"]
    return {"gamma": gammas, "measured": middle.measured, "interval": list(middle.measured_interval),
            "predicted": middle.predicted,
            "predicted_share": float(middle_mass(share_changed) - middle_mass(share_base))}


def markdown(rows: list[dict], family: str, gamma: float) -> str:
    lines = [f"| {family}: gamma = {gamma:g} on | measured [95 %] | predicted (ratio) | lambda = branch share (ratio) |",
             "|---|---:|---:|---:|"]
    for row in rows:
        if row["interval"] is None:  # a sum of the layers' paired changes: no interval of its own
            interval, significant = "(sum)", True
        else:
            low, high = row["interval"]
            interval, significant = f"[{low:+.4f}, {high:+.4f}]", low > 0 or high < 0
        ratio = (lambda key: f" ({row[key] / row['measured']:.2f}x)" if significant else "")  # noqa: E731
        lines.append(f"| {row['label']} | {row['measured']:+.4f} {interval} | {row['predicted']:+.4f}"
                     f"{ratio('predicted')} | {row['predicted_share']:+.4f}{ratio('predicted_share')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--family", default="bloom")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--gamma", type=float, default=0.5)
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args(argv)
    runs.LENGTH = arguments.length
    torch.set_num_threads(1)
    log = functools.partial(print, flush=True)
    family, out = arguments.family, arguments.out
    out.mkdir(parents=True, exist_ok=True)
    model_dir, texts = arguments.models / f"{family}-trained", arguments.models / "held_out.jsonl"
    baseline = runs.measure(model_dir, texts, out / "baseline", runs.BASE_STATS[family], arguments.samples)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    layers = hf_config.num_hidden_layers
    context = {"model_dir": model_dir, "texts": texts, "samples": arguments.samples, "baseline": baseline,
               "hf_config": hf_config, "models": runs.rollout_models(baseline, family, out / "baseline" / "config.yaml")}
    context["share"] = runs.branch_share_models(context["models"], baseline)
    rows = []
    for t in range(layers):
        gammas = [arguments.gamma if s == t else 1.0 for s in range(layers)]
        rows.append({"label": f"layer {t + 1}", **change_of(out, family, gammas, context)})
        log(f"layer {t + 1}: measured {rows[-1]['measured']:+.4f}, predicted {rows[-1]['predicted']:+.4f}")
    half = [1.0] * (layers // 2) + [arguments.gamma] * (layers - layers // 2)
    rows.append({"label": f"layers {layers // 2 + 1}-{layers} at once", **change_of(out, family, half, context)})
    later = rows[layers // 2:layers]
    rows.append({"label": f"sum of layers {layers // 2 + 1}-{layers} alone",
                 "measured": float(sum(r["measured"] for r in later)), "interval": None,
                 "predicted": float(sum(r["predicted"] for r in later)),
                 "predicted_share": float(sum(r["predicted_share"] for r in later))})
    (out / "layers.json").write_text(json.dumps({"family": family, "gamma": arguments.gamma, "length": runs.LENGTH,
                                                  "samples": arguments.samples, "rows": rows}, indent=2) + "\n")
    table = markdown(rows, family, arguments.gamma)
    (out / "layers.md").write_text(table)
    log(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
