"""Predict, apply, measure, score: every intervention on the validation models trained here (issue 47).

    PYTHONPATH=. python3 validation/interventions.py --models DIR --out DIR [--samples 64] [--force]

``--models`` holds ``bloom-trained/``, ``llama-trained/`` and
``held_out.jsonl`` (`validation/train.py`). For each model:

1. the baseline: ``jaxroll measure --dtype float64`` on the held-out texts
   (lambda, content for ALiBi, influence, the mean attention and its offsets);
2. the baseline's predicted profile ``p_B``: the rollout of the measured
   configuration (BLOOM: ALiBi slopes + measured content; Llama: the
   measured dense kernels, or, where an intervention needs a function of
   distance, the measured offset kernel `offset_rollout_model`);
3. for each intervention of `INTERVENTIONS`: the rollout's prediction
   ``p_I = influence(apply_all(model, interventions))`` (naive), the same
   change anchored on the measured baseline ``m_B p_I / p_B`` renormalised
   (what the rollout predicts of the *ratio*, applied to what was measured),
   ``jaxroll measure --intervene`` (the torch patch), and
   `jaxroll.measure.effect.effect` (paired: the same texts);
4. the held-out loss (nats per token) under each intervention, and
   ``jaxroll task`` (copy, N = 64) by depth before and after for the two
   interventions with the largest predicted middle-mass gain.

Writes ``table.md``, ``results.json`` and the measurement folders into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import contextlib
import io
import json
import shutil
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.engine.probability import plain_kernel  # noqa: E402
from jaxroll.measure import patching, row_prediction, torch_plan  # noqa: E402
from jaxroll.cli import main as cli  # noqa: E402
from jaxroll.measure.effect import anchored_profile, effect, middle_mass  # noqa: E402
from jaxroll.measure.offsets import offset_rollout_model  # noqa: E402
from jaxroll.measure.uncertainty import score  # noqa: E402

LENGTH = 64
INTERVENTIONS = {
    "bloom": ["tau=0.7", "tau=1.5", "slope_scale=0.5", "slope_scale=2", "gamma=0.5", "gamma=2",
              "kappa=-0.5", "kappa=0.5", "kappa=1,kappa_form=unsquash", "ssmax_scale=0.3", "ssmax_scale=0.5",
              "sinks=4", "sinks=8", "per-layer gamma", "per-head tau"],
    "llama": ["tau=0.7", "tau=1.5", "gamma=0.5", "gamma=2", "kappa=-0.5", "kappa=0.5",
              "kappa=1,kappa_form=unsquash", "ssmax_scale=0.3", "rotary_ratio=2", "rotary_ratio=0.5", "ms-poe",
              "sinks=4", "sinks=8", "per-layer gamma", "per-head tau"],
}
"""Each entry an ``--intervene`` value, or a name of `yaml_interventions`."""

STATS = {"bloom": "lambda,content,influence,attention_offsets", "llama": "lambda,influence,attention,attention_offsets"}
BASE_STATS = {"bloom": STATS["bloom"] + ",attention_gains,attention_distances,paths",
              "llama": STATS["llama"] + ",attention_gains,attention_distances,paths"}
"""The baseline also measures ``paths`` (issue 53): its config.yaml then carries the probability shares, the
default route's extended layer; and the Llama ``attention_gains`` (the mean rows at a grid of logit gains), as
the default does at these sizes, so its config.yaml is a `GainTableKernel`, with ``attention_distances`` (the
mean rows under distance scores), as the default also does. Intervened measurements need only
their influence, as before."""


def yaml_interventions(name: str, layers: int, heads: int) -> dict | None:
    """The per-layer and per-head interventions (written to YAML for ``--intervene``)."""
    if name == "per-layer gamma":
        return {"gamma": [1.0] * (layers // 2) + [0.5] * (layers - layers // 2)}
    if name == "per-head tau":
        return {"tau": np.linspace(0.7, 1.4, heads).round(3).tolist()}
    if name == "ms-poe":
        return {"rotary_ratio": np.asarray(interventions.ms_poe_ratios(heads)).round(4).tolist()}
    return None


def quiet_cli(argv) -> None:
    """``jaxroll ARGV`` in this process; its stdout kept out of the run's log, an error raised."""
    with contextlib.redirect_stdout(io.StringIO()) as captured:
        code = cli([str(a) for a in argv])
    if code != 0:
        raise RuntimeError(f"jaxroll {' '.join(map(str, argv))}: exit {code}\n{captured.getvalue()}")


def measure(model_dir: Path, texts: Path, out: Path, stats: str, samples: int, length: int | None = None,
            intervene: str | None = None) -> dict:
    """``jaxroll measure`` (float64) into `out` unless its measurement.npz is there; its arrays. `length`: N
    (default the run's `LENGTH`)."""
    length = LENGTH if length is None else length
    if not (out / "measurement.npz").is_file():
        argv = ["measure", model_dir, "--texts", texts, "--length", length, "--samples", samples, "--dtype",
                "float64", "--stats", stats, "--out", out, "--quiet", "--force"]
        quiet_cli(argv + (["--intervene", intervene] if intervene else []))
    with np.load(out / "measurement.npz", allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def rollout_models(measured: dict, family: str, config: Path):
    """The baseline's rollout models: the measured configuration, and for Llama the offset kernel too.

    With ``paths`` measured, both are the extended layer (docs/design.md, "The probability path"): the
    config.yaml of the default route carries ``probability_shares`` ``rho_t = r_t / (1 + r_t)``, and the
    offset kernel gets the same shares (`jaxroll.model.with_probability_path`).
    """
    models = {"config": jaxroll.load_config(config)}
    if "attention_offsets" in measured:
        offsets = offset_rollout_model(measured["attention_offsets"], measured["lambdas"], LENGTH)
        if "probability_over_value" in measured:
            offsets = jaxroll.model.with_probability_path(offsets, probability_shares(measured))
        models["offsets"] = offsets
    return models


def branch_share_models(models: dict, measured: dict) -> dict:
    """The extended models with lambda_t replaced by the measured ``branch_share`` (the share of path magnitudes
    the attention moves, `jaxroll.measure.path_stats`): the issue's "(b) the branch's share of the gradient",
    tried beside the norm ratio to see which ingredient the slope, branch and distance changes need."""
    share = np.clip(np.asarray(measured["branch_share"], dtype=np.float64), 0.0, 1.0)
    return {name: dataclasses.replace(model, lambdas=jax.numpy.asarray(share)) for name, model in models.items()}


def probability_shares(measured: dict) -> np.ndarray:
    """``rho_t = r_t / (1 + r_t)`` of the measured ratio r_t of probability- to value-path influence (NaN -> 0),
    as `jaxroll.measure.result.Measurement.to_rollout_model` writes them."""
    ratio = np.nan_to_num(np.asarray(measured["probability_over_value"], dtype=np.float64), nan=0.0)
    return ratio / (1.0 + ratio)


def today_models(models: dict) -> dict:
    """The same rollout models without the probability path (`plain_kernel`): today's layer ``(1 - lambda) I + lambda A``.

    A `GainTableKernel` (the Llama's default since the gain tables) becomes the `DenseKernel` of its rows at gain
    1, the mean attention: today's layer as it was, a change of logits applied to the mean kernel; an
    `AnchoredTableKernel` (an ALiBi model's, since) its ALiBi + content kernel."""
    return {name: dataclasses.replace(model, kernel=_plain(model.kernel)) for name, model in models.items()}


def _plain(kernel):
    if isinstance(kernel, jaxroll.AnchoredTableKernel):  # an ALiBi model's: its analytic kernel, as it was
        return kernel.anchor
    if isinstance(kernel, jaxroll.GainTableKernel):
        return jaxroll.DenseKernel.create(np.asarray(kernel.rows)[:, list(kernel.grid).index(1.0)])
    return plain_kernel(kernel)


def predict(models: dict, changes, length: int):
    """``(p_B, p_I, which model)`` at `length`: the first model the interventions apply to."""
    sinks = next((c for c in changes if isinstance(c, interventions.SinkTokens)), interventions.SinkTokens(0))
    last = None
    for name, model in models.items():
        base = dataclasses.replace(model, sequence_length=length)
        try:
            changed = interventions.apply_all(base, changes)
        except jaxroll.ConfigError as error:
            last = error
            continue
        p_base = np.asarray(jaxroll.influence(base), dtype=np.float64)
        _, p_changed = sinks.split(jaxroll.influence(changed))
        return p_base, np.asarray(p_changed, dtype=np.float64), name
    raise last


def held_out_loss(model, stream: np.ndarray, changes) -> float:
    """Mean next-token loss (nats) on the held-out stream, the model patched by `changes` (`pipeline.held_out_loss`)."""
    if not changes:
        return pipeline.held_out_loss(model, stream, LENGTH)
    with patching.patch(model, changes):
        return pipeline.held_out_loss(model, stream, LENGTH)


def per_sequence_prediction(model, token_ids: np.ndarray, lambdas, changes, stream_norms=None):
    """``(p_I, p_B)`` by the per-sequence rows: `jaxroll.measure.row_prediction.predict_rows` (each sequence's
    own eager rows changed by the patch's `LogitChange`, averaged over sequences and heads, rolled out with the
    lambdas, `BranchScale` acting on them; p_B the same unchanged), float64 throughout. The code that was here
    (``log A`` of a float32-softmax forward) moved into the library and ``jaxroll predict-rows``. Returns
    ``(p_I (N,), p_B (N,))``, NumPy float64. `stream_norms` (the baseline's) for a branch scale's stream rule."""
    prediction = row_prediction.predict_rows(model, token_ids, lambdas, changes, stream_norms=stream_norms)
    return prediction.profile, prediction.baseline


def held_stream(models_dir: Path) -> np.ndarray:
    """The held-out token stream of `pipeline` (the texts the models never trained on), as in training.

    Read from the models' ``held_out.jsonl`` (`pipeline.write_texts`), so a pair trained on another corpus
    (`validation/train.py --corpus-root`) is scored on its own held-out files.
    """
    tokenizer = transformers.AutoTokenizer.from_pretrained(models_dir / "bloom-trained")
    with open(models_dir / "held_out.jsonl", encoding="utf-8") as handle:
        held_texts = [json.loads(line)["text"] for line in handle if line.strip()]
    return pipeline.token_stream(tokenizer, held_texts)


def start_run(doc: str, argv=None) -> Path:
    """The ``--out`` of a validation script's command line (``doc``'s first line its description), with JAX in
    float64 and one torch thread (the machine is shared): what the probes of issue 53 start with."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args(argv).out
    jax.config.update("jax_enable_x64", True)
    torch.set_num_threads(1)
    return out


def profile_of(rows):
    return rows.sum(0) / rows.sum()


def run_family(family: str, models_dir: Path, out: Path, samples: int, log, extras: bool = True) -> list[dict]:
    """Every intervention of `INTERVENTIONS` on one model: today's predictions and the extended layer's, scored.

    ``extras`` False skips the held-out loss (its values do not depend on the prediction: see the earlier run).
    """
    model_dir, texts = models_dir / f"{family}-trained", models_dir / "held_out.jsonl"
    base_dir = out / family / "baseline"
    baseline = measure(model_dir, texts, base_dir, BASE_STATS[family], samples)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    layers, heads = hf_config.num_hidden_layers, hf_config.num_attention_heads
    model = pipeline.load_float64(model_dir)
    stream = held_stream(models_dir) if extras else None
    loss_before = held_out_loss(model, stream, []) if extras else None
    context = {"family": family, "model_dir": model_dir, "texts": texts, "out": out, "samples": samples,
               "baseline": baseline, "base_dir": base_dir, "hf_config": hf_config, "model": model,
               "stream": stream, "loss_before": loss_before,
               "p_sequences_base": per_sequence_prediction(model, baseline["token_ids"], baseline["lambdas"], [])[1],
               "extended": rollout_models(baseline, family, base_dir / "config.yaml")}
    context["today"] = today_models(context["extended"])
    context["share"] = branch_share_models(context["extended"], baseline)
    log(f"  {family} lambda_t = {np.round(baseline['lambdas'], 4).tolist()}, branch share = "
        f"{np.round(baseline['branch_share'], 4).tolist()}")
    log(f"  {family} probability shares rho_t = {np.round(probability_shares(baseline), 4).tolist()}")
    rows = []
    for entry in INTERVENTIONS[family]:
        mapping = yaml_interventions(entry, layers, heads)
        slug = entry.replace("=", "").replace(",", "_").replace(" ", "-")
        spec = entry
        if mapping is not None:
            spec = str(out / family / f"{slug}.yaml")
            Path(spec).parent.mkdir(parents=True, exist_ok=True)
            Path(spec).write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in mapping.items()))
        try:
            changes = torch_plan.parse_for(spec, hf_config)
            row = run_row(context, entry, slug, spec, changes)
        except jaxroll.ConfigError as error:
            log(f"  {family} {entry}: not applied: {error}")
            rows.append({"family": family, "intervention": entry, "error": str(error)})
            continue
        rows.append(row)
        log(f"  {family} {entry:28s} effect {row['effect_ratio']:6.1f}x (p {row['effect_p']:.3f})  today "
            f"{row['naive_ratio']:6.1f}x / anchored {row['anchored_ratio']:6.1f}x  extended "
            f"{row['extended_ratio']:6.1f}x / anchored {row['extended_anchored_ratio']:6.1f}x  unchanged "
            f"{row['unchanged_ratio']:6.1f}x  middle {row['middle_measured']:+.4f} vs today "
            f"{row['middle_predicted']:+.4f}, extended {row['middle_extended']:+.4f}  ({row['seconds']:.0f} s)")
    return rows


def run_row(context: dict, entry: str, slug: str, spec: str, changes) -> dict:
    """One intervention: predicted by today's layer and the extended one, applied, measured, scored."""
    started = time.perf_counter()
    family, baseline, samples = context["family"], context["baseline"], context["samples"]
    model_dir, texts, out = context["model_dir"], context["texts"], context["out"]
    sinks = next((c.num_sinks for c in changes if isinstance(c, interventions.SinkTokens)), 0)
    length = LENGTH - sinks
    # Sinks: the n = N - k original tokens against a baseline of the same n tokens.
    reference = baseline if not sinks else measure(model_dir, texts, out / family / f"baseline-n{length}",
                                                   STATS[family], samples, length)
    p_base, p_changed, which = predict(context["today"], changes, length)
    p_base_ext, p_extended, _ = predict(context["extended"], changes, length)
    p_base_share, p_share, _ = predict(context["share"], changes, length)
    # Sinks lengthen the sequence and a rotary rescale moves q and k: neither is a map of the baseline's rows.
    rows_apply = not sinks and not any(isinstance(c, interventions.RotaryRescale) for c in changes)
    p_sequences = per_sequence_prediction(context["model"], baseline["token_ids"], baseline["lambdas"],
                                          changes, baseline.get("stream_norms"))[0] if rows_apply else None
    intervened = measure(model_dir, texts, out / family / slug, STATS[family], samples, length, spec)
    measured_ref, measured_int = reference["influence_per_sequence"], intervened["influence_per_sequence"]
    m_ref = profile_of(measured_ref)
    result = effect(measured_ref, measured_int, p_changed, predicted_baseline=p_base, paired=True, B=1000, seed=0)
    extended = effect(measured_ref, measured_int, p_extended, predicted_baseline=p_base_ext, paired=True, B=1000,
                      seed=0)
    if p_sequences is not None:
        sequences = score(p_sequences, measured_int, B=1000, seed=0)
        anchored_sequences = score(anchored_profile(m_ref, context["p_sequences_base"], p_sequences), measured_int,
                                   B=1000, seed=0)
    shared = effect(measured_ref, measured_int, p_share, predicted_baseline=p_base_share, paired=True, B=1000,
                    seed=0)
    unchanged = score(p_base, measured_int, B=1000, seed=0)
    unchanged_ext = score(p_base_ext, measured_int, B=1000, seed=0)
    middle = result.changes["middle_mass"]
    stream, model = context["stream"], context["model"]
    return {
        "family": family, "intervention": entry, "rollout_model": which, "length": length,
        "effect_ratio": result.effect_ratio, "effect_p": result.effect_p_value,
        "naive_ratio": result.prediction.ratio, "naive_p": result.prediction.p_value,
        "anchored_ratio": result.anchored.ratio, "anchored_p": result.anchored.p_value,
        "extended_ratio": extended.prediction.ratio, "extended_p": extended.prediction.p_value,
        "extended_anchored_ratio": extended.anchored.ratio, "extended_beats_no_change": extended.beats_no_change,
        "sequences_ratio": sequences.ratio if p_sequences is not None else None,
        "sequences_p": sequences.p_value if p_sequences is not None else None,
        "anchored_sequences_ratio": anchored_sequences.ratio if p_sequences is not None else None,
        "middle_sequences": float(middle_mass(p_sequences) - middle_mass(context["p_sequences_base"]))
        if p_sequences is not None else None,
        "unchanged_ratio": unchanged.ratio, "unchanged_extended_ratio": unchanged_ext.ratio,
        "unchanged_max_difference": float(np.max(np.abs(p_base_ext - p_base))),
        "baseline_ratio": score(p_base, measured_ref, B=1000, seed=0).ratio,
        "baseline_extended_ratio": score(p_base_ext, measured_ref, B=1000, seed=0).ratio,
        "middle_measured": middle.measured, "middle_measured_interval": list(middle.measured_interval),
        "middle_predicted": middle.predicted, "middle_extended": extended.changes["middle_mass"].predicted,
        "share_ratio": shared.prediction.ratio, "share_anchored_ratio": shared.anchored.ratio,
        "middle_share": shared.changes["middle_mass"].predicted,
        "middle_anchored": float(middle_mass(anchored_profile(m_ref, p_base, p_changed)) - middle_mass(m_ref)),
        "loss_before": context["loss_before"],
        "loss_after": held_out_loss(model, stream, changes) if not sinks and stream is not None else None,
        "spec": spec, "seconds": time.perf_counter() - started,
    }


def task_by_depth(model_dir: Path, out: Path, spec: str | None) -> dict:
    """``jaxroll task`` (copy, N = 64, five depths, 32 cases each): gold log-probability and exact match by depth."""
    if not (out / "summary.json").is_file():
        argv = ["task", model_dir, "--out", out, "--tasks", "copy", "--lengths", LENGTH, "--depths",
                "0,0.25,0.5,0.75,1", "--samples", 32, "--dtype", "float64", "--quiet", "--force"]
        quiet_cli(argv + (["--intervene", spec] if spec else []))
    with open(out / "summary.csv", newline="") as handle:
        import csv

        rows = list(csv.DictReader(handle))
    return {"depth": [float(r["depth_fraction"]) for r in rows], "logprob": [float(r["logprob"]) for r in rows],
            "accuracy": [float(r["accuracy"]) for r in rows]}


def tasks(family: str, models_dir: Path, out: Path, rows: list[dict], log) -> dict:
    """Task by depth before and after the two interventions with the largest predicted middle-mass gain."""
    ranked = sorted((r for r in rows if "error" not in r and r["middle_predicted"] > 0),
                    key=lambda r: -r["middle_predicted"])[:2]
    model_dir = models_dir / f"{family}-trained"
    results = {"baseline": task_by_depth(model_dir, out / family / "task-baseline", None)}
    for row in ranked:
        results[row["intervention"]] = task_by_depth(model_dir, out / family / f"task-{Path(row['spec']).stem}",
                                                     row["spec"])
    for name, result in results.items():
        log(f"  {family} task copy {name:28s} log-prob by depth "
            + " ".join(f"{v:7.2f}" for v in result["logprob"]) + "  exact " + " ".join(f"{v:.2f}" for v in result["accuracy"]))
    return results


def target_a(row: dict, key: str = "extended_ratio") -> str | None:
    """Issue 53's first target: an effect > 3x its noise predicted within 2x the noise of the intervened
    measurement and closer than the unchanged baseline prediction p_B (None: no effect > 3x noise)."""
    if row["effect_ratio"] <= 3:
        return None
    return "met" if row[key] <= 2 and row[key] < row["unchanged_ratio"] else "missed"


KIND = {"tau": "sign", "per-head tau": "sign", "ssmax_scale": "sign", "slope_scale": "size", "gamma": "size",
        "per-layer gamma": "size", "kappa": "size"}
"""Issue 53's middle-mass targets by intervention: temperature and SSMax in sign, slope, branch and distance
changes in size (within 1.25x of the measured)."""


def target_middle(row: dict, key: str = "middle_extended") -> str | None:
    """The sign target (temperature, SSMax) or the 1.25x size target (slope, gamma, kappa), where the measured
    middle-mass change is significant (its 95 % interval excludes 0); None where neither applies."""
    kind = KIND.get(row["intervention"], KIND.get(row["intervention"].split("=")[0]))
    low, high = row["middle_measured_interval"]
    if kind is None:
        return None
    if low <= 0 <= high:
        return "not significant"
    measured, predicted = row["middle_measured"], row[key]
    if kind == "sign":
        return "met (sign)" if np.sign(predicted) == np.sign(measured) else "missed (sign)"
    ratio = predicted / measured
    return f"{'met' if 1 / 1.25 <= ratio <= 1.25 else 'missed'} ({ratio:.2f}x)"


def markdown(rows: list[dict]) -> str:
    """The validation table of docs/interventions.md, today's layer beside the extended one (issue 53)."""
    lines = ["| model | intervention | effect / noise (p) | today: naive | today: anchored | per-seq. rows | "
             "extended | extended anchored | extended, lambda = branch share | unchanged p_B | target (a): today naive / "
             "anchored / extended / anchored | middle mass: measured [95 %] | predicted: today / extended / branch share | "
             "target (b, c): today / extended / branch share |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | `{r['intervention']}` | not applied: {r['error']} ||||||||||||")
            continue
        low, high = r["middle_measured_interval"]
        seq = "-" if r["sequences_ratio"] is None else f"{r['sequences_ratio']:.1f}x"
        a = "-" if target_a(r) is None else " / ".join(
            target_a(r, key) for key in ("naive_ratio", "anchored_ratio", "extended_ratio", "extended_anchored_ratio"))
        m = target_middle(r)
        m = "-" if m is None else f"{target_middle(r, 'middle_predicted')} / {m} / {target_middle(r, 'middle_share')}"
        lines.append(f"| {r['family']} | `{r['intervention']}` | {r['effect_ratio']:.1f}x ({r['effect_p']:.3f}) | "
                     f"{r['naive_ratio']:.1f}x | {r['anchored_ratio']:.1f}x | {seq} | {r['extended_ratio']:.1f}x | "
                     f"{r['extended_anchored_ratio']:.1f}x | {r['share_ratio']:.1f}x | {r['unchanged_ratio']:.1f}x | "
                     f"{a} | {r['middle_measured']:+.3f} [{low:+.3f}, {high:+.3f}] | {r['middle_predicted']:+.3f} / "
                     f"{r['middle_extended']:+.3f} / {r['middle_share']:+.3f} | {m} |")
    return "\n".join(lines) + "\n" + summary(rows)


def summary(rows: list[dict]) -> str:
    """Per model: the share of rows meeting each target, today's layer and the extended one, and the unchanged row."""
    lines = ["", "| model | (a) rows > 3x noise met: today naive / today anchored / extended / extended anchored / "
             "branch share / branch share anchored | (b) tau, SSMax sign met (today / extended / branch "
             "share) | "
             "(c) slope, gamma, kappa within 1.25x (today / extended / branch share) | (d) unchanged p_B vs baseline measurement: today / extended "
             "(max abs profile difference) |", "|---|---:|---:|---:|---|"]
    for family in dict.fromkeys(r["family"] for r in rows):
        done = [r for r in rows if r["family"] == family and "error" not in r]
        big = [r for r in done if target_a(r) is not None]
        count = lambda key, check, subset: sum(check(r, key) for r in subset)  # noqa: E731
        a = " / ".join(str(count(key, lambda r, k: target_a(r, k) == "met", big))
                       for key in ("naive_ratio", "anchored_ratio", "extended_ratio", "extended_anchored_ratio",
                                   "share_ratio", "share_anchored_ratio")) + f" of {len(big)}"
        parts = []
        for kind in ("sign", "size"):
            subset = [r for r in done if KIND.get(r["intervention"], KIND.get(r["intervention"].split("=")[0])) == kind
                      and target_middle(r) != "not significant"]
            met = lambda r, k: target_middle(r, k).startswith("met")  # noqa: E731
            parts.append(f"{count('middle_predicted', met, subset)} / {count('middle_extended', met, subset)} / "
                         f"{count('middle_share', met, subset)} of {len(subset)}")
        first = done[0]
        d = (f"{first['baseline_ratio']:.2f}x / {first['baseline_extended_ratio']:.2f}x "
             f"({max(r['unchanged_max_difference'] for r in done):.1e})")
        lines.append(f"| {family} | {a} | {parts[0]} | {parts[1]} | {d} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    global LENGTH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--families", default="bloom,llama")
    parser.add_argument("--table-only", action="store_true", help="rewrite table.md from results.json")
    parser.add_argument("--length", type=int, default=LENGTH, help="measured sequence length N (the models' window)")
    parser.add_argument("--no-extras", action="store_true",
                        help="skip the held-out loss and the task by depth (neither depends on the prediction)")
    arguments = parser.parse_args(argv)
    LENGTH = arguments.length  # every measurement, rollout and task of the run reads the module's N
    torch.set_num_threads(1)
    arguments.out.mkdir(parents=True, exist_ok=True)
    log = functools.partial(print, flush=True)
    if arguments.table_only:
        (arguments.out / "table.md").write_text(markdown(json.loads((arguments.out / "results.json").read_text())["rows"]))
        log((arguments.out / "table.md").read_text())
        return 0
    results, task_results = [], {}
    for family in arguments.families.split(","):
        rows = run_family(family, arguments.models, arguments.out, arguments.samples, log, not arguments.no_extras)
        if not arguments.no_extras:
            task_results[family] = tasks(family, arguments.models, arguments.out, rows, log)
        results += rows
    (arguments.out / "results.json").write_text(json.dumps({"rows": results, "tasks": task_results}, indent=2) + "\n")
    (arguments.out / "table.md").write_text(markdown(results))
    log((arguments.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
