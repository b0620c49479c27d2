"""Every row of P_T, hypothesis by hypothesis, on the subjects trained here (issue 43).

    PYTHONPATH=. python3 validation/rows_study.py --out validation/rows-run \
        [--models validation/models/rows] [--reference validation/models/wave5] [--samples 64] [--queries 16]

Subjects: the four BLOOMs (ALiBi) of `validation/train_rows.py` (with and without the
final LayerNorm, seeds 0 and 1, 4000 steps each) and the wave-5 Llama (rotary,
``validation/train.py``). Each is measured in float64 on the first ``--samples``
held-out documents of at least N = 64 tokens (`jaxroll.measure.texts.select_sequences`,
the protocol of docs/validation.md) at ``--queries`` query positions:

- measured rows, three targets (`jaxroll.measure.rows.influence_rows`): the gradient norm of the
  top next-token probability (``probability``, today's), the hidden-state Jacobian norm
  ``||d h_i / d e_j||_F`` (``hidden``, Brändel et al.'s G(j, r)), and the first with the attention
  probabilities detached (``values``: the gradient through values, residuals and MLPs only, not
  through the attention logits, `values_only`);
- predicted rows, one per hypothesis: the structural rollout of docs/rows.md (measured
  lambda, slopes, content: `Measurement.to_rollout_model`), the rollout of the measured mean
  attention (`jaxroll.theory.refinements.compose` with no switch), the mean over sequences of
  each sequence's own rollout (`jaxroll.theory.sequence_mean.mean_of_rollouts`), and every
  rung of the refinement ladder (`compose` with switches);
- scores per row (`jaxroll.measure.row_scores.score_rows`: W1 / noise, p, Holm) and the
  by-distance exponent p with its bootstrap interval over sequences
  (`jaxroll.measure.row_scores.distance_exponent`; left-edge buffer ``--buffer``).

Writes ``results.json``, ``table.md`` and ``rows.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_rows  # noqa: E402

BLOOMS = ("bloom-norm-seed0", "bloom-norm-seed1", "bloom-no-norm-seed0", "bloom-no-norm-seed1")
LADDER = ((), ("position",), ("mlp",), ("position", "mlp"), ("input_norm",), ("position", "input_norm"),
          ("heads",), ("head_positions",), ("norm",), ("norm", "heads"), ("gradient",),
          ("position", "mlp", "input_norm"), ("position", "mlp", "norm", "head_positions", "input_norm"),
          ("gradient", "norm", "heads", "input_norm"), ("mlp", "heads"), ("mlp", "head_positions"),
          ("mlp", "heads", "input_norm"))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("validation/rows-run"))
    parser.add_argument("--models", type=Path, default=Path("validation/models/rows"))
    parser.add_argument("--reference", type=Path, default=Path("validation/models/wave5"))
    parser.add_argument("--subjects", default=",".join((*BLOOMS, "llama")))
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--boots", type=int, default=1000)
    parser.add_argument("--buffer", type=int, default=1, help="left-edge buffer of the by-distance curves")
    parser.add_argument("--targets", default="probability,hidden,values")
    parser.add_argument("--combine", type=Path, nargs="*", default=None, metavar="RESULTS.json",
                        help="write table.md, rows.png and summary.json into --out from these results files "
                             "(runs of the same subjects with different --targets), measuring nothing")
    return parser.parse_args(argv)


@contextlib.contextmanager
def values_only():
    """The attention probabilities detached from the graph: the gradient flows through values, residuals and
    MLPs only, the paths the rollout models (not through the logits q.k). Both families call
    ``torch.nn.functional.softmax`` for their attention and nothing else; the target's softmax is ``torch.softmax``."""
    original = torch.nn.functional.softmax
    torch.nn.functional.softmax = lambda *args, **kwargs: original(*args, **kwargs).detach()
    try:
        yield
    finally:
        torch.nn.functional.softmax = original


def load_subject(name: str, arguments):
    import transformers

    if name == "llama":
        directory = arguments.reference / "llama-trained"
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                                  dtype=torch.float64).eval()
    else:
        directory = arguments.models / name
        model = train_rows.load(directory)
    return model, transformers.AutoTokenizer.from_pretrained(directory)


def predictions(model, token_ids, queries) -> dict[str, np.ndarray]:
    """Predicted rows ``(K, N)`` of every hypothesis, by name."""
    import jax

    from jaxroll.measure import measure
    from jaxroll.measure.refinements import INGREDIENTS, measure_refinements
    from jaxroll.theory import refinements
    from jaxroll.theory.rows import predicted_rows
    from jaxroll.theory.sequence_mean import mean_of_rollouts

    # Rotary models have no content statistic: their structural rollout runs on the measured mean attention.
    alibi = model.config.model_type == "bloom"
    measurement = measure(model, token_ids, stats=("lambda", "content" if alibi else "attention", "influence"))
    per_sequence = measure_refinements(model, token_ids, ingredients=INGREDIENTS,
                                       groups=np.arange(token_ids.shape[0]))
    ingredients = per_sequence.mean() | {"lambdas": np.asarray(measurement.lambdas)}
    out = {}
    with jax.enable_x64(True):
        structural = measurement.to_rollout_model()
        out["structural"] = predicted_rows(structural, queries)
        for switches in LADDER:
            name = "+".join(switches) or "attention"
            out[name] = predicted_rows(refinements.compose(ingredients, switches), queries)
        kernels = per_sequence.attention_heads.mean(axis=2)  # (S, T, N, N): each sequence's head average
        out["mean of rollouts"] = mean_of_rollouts(per_sequence.lambda_positions.mean(axis=-1), kernels, queries)
        out["mean of rollouts, position"] = mean_of_rollouts(per_sequence.lambda_positions, kernels, queries)
    return out, ingredients, structural


def fitted_lambdas(model, measured, queries, rows: str) -> np.ndarray:
    """Rows of `model` (a `RefinedRollout`) with one lambda per layer fitted to measured rows.

    ``rows="last"`` fits the last row only (the other rows are then out of sample);
    ``rows="all"`` fits every row (in sample: how close a per-layer lambda on these
    kernels can come at all). Loss: the sum over the fitted rows of ``W1 / q_k`` on
    positions ``0..q_k`` (`jaxroll.measure.uncertainty.wasserstein`'s scale), L-BFGS-B
    (scipy) with the gradient by JAX, lambda_t = sigmoid(theta_t).
    """
    import jax
    import jax.numpy as jnp
    from scipy.optimize import minimize

    from jaxroll.theory.refinements import RefinedRollout, refined_rows

    layers, n = model.lambdas.shape
    starts = jnp.eye(n, dtype=model.head_kernels.dtype)[jnp.asarray(queries)]
    chosen = np.arange(len(queries)) if rows == "all" else np.array([len(queries) - 1])
    target = jnp.asarray(measured)
    masks = jnp.asarray(np.arange(n)[None, :] < np.asarray(queries)[:, None])  # j < q_k: the cdf terms counted
    scales = jnp.asarray(1.0 / np.maximum(np.asarray(queries), 1))

    def rows_of(lambdas):  # the model's kernels and head weights, one lambda per layer
        changed = RefinedRollout(jnp.broadcast_to(lambdas[:, None], (layers, n)), model.head_kernels,
                                 model.head_weights, model.input_gains)
        p = refined_rows(changed, starts)
        return p / p.sum(-1, keepdims=True)

    def loss(theta):
        predicted = rows_of(jax.nn.sigmoid(theta))
        distance = jnp.abs(jnp.cumsum(predicted - target, axis=-1)) * masks
        return jnp.sum((distance.sum(-1) * scales)[chosen])

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    start = np.asarray(jnp.log(model.lambdas.mean(-1) / (1 - model.lambdas.mean(-1))))
    result = minimize(lambda x: tuple(np.asarray(v, dtype=np.float64) for v in value_and_grad(jnp.asarray(x))),
                      start, jac=True, method="L-BFGS-B")
    return np.asarray(rows_of(jax.nn.sigmoid(jnp.asarray(result.x)))), np.asarray(jax.nn.sigmoid(result.x))


def study(name: str, arguments, log) -> dict:
    from jaxroll.measure.row_scores import distance_exponent, score_rows
    from jaxroll.measure.rows import influence_rows
    from jaxroll.measure.texts import read_texts, select_sequences
    from jaxroll.theory import refinements
    from jaxroll.theory.rows import normalised_rows, predicted_rows

    started = time.perf_counter()
    model, tokenizer = load_subject(name, arguments)
    token_ids, _ = select_sequences(read_texts(arguments.reference / "held_out.jsonl"), tokenizer,
                                    arguments.length, arguments.samples)
    measured, queries = {}, None
    for target in arguments.targets.split(","):
        with values_only() if target == "values" else contextlib.nullcontext():
            measured[target], queries = influence_rows(model, token_ids, arguments.queries, batch_size=8,
                                                       target="probability" if target == "values" else target)
    predicted, ingredients, structural = predictions(model, token_ids, queries)
    result = {"queries": queries.tolist(), "targets": {}, "lambdas": ingredients["lambdas"].tolist()}
    for target, rows in measured.items():
        hypotheses = dict(predicted)
        fitted_lambdas_of = {}
        with _x64():
            import jaxroll

            # The command line's path: `jaxroll fit config.yaml influence.csv`, then the fitted config's rows.
            fitted = jaxroll.fit(structural, normalised_rows(rows)[-1], fit="lambdas")
            label = "structural, lambdas fitted to last rows"
            hypotheses[label] = predicted_rows(fitted.model, queries)
            fitted_lambdas_of[label] = np.asarray(fitted.model.lambdas)
            for base in ((), ("heads",)):
                model_r = refinements.compose(ingredients, base)
                for fitted_rows in ("last", "all"):
                    label = f"{'+'.join(base) or 'attention'}, lambdas fitted to {fitted_rows} rows"
                    hypotheses[label], fitted_lambdas_of[label] = fitted_lambdas(
                        model_r, normalised_rows(rows), queries, fitted_rows)
        entry = {"p_measured": distance_exponent(rows, queries, B=arguments.boots, buffer=arguments.buffer),
                 "fitted_lambdas": {key: value.tolist() for key, value in fitted_lambdas_of.items()},
                 "hypotheses": {}}
        for hypothesis, rows_predicted in hypotheses.items():
            scores = score_rows(rows_predicted, rows, queries, B=arguments.boots)
            entry["hypotheses"][hypothesis] = {
                "summary": scores.summary(), "ratio": np.asarray(scores.ratio).tolist(),
                "p_predicted": distance_exponent(rows_predicted, queries, buffer=arguments.buffer),
                "rows": rows_predicted.tolist()}
        entry["measured_rows"] = normalised_rows(rows).tolist()
        result["targets"][target] = entry
        log(f"{name} {target}: measured p {entry['p_measured']['p']:.3f}; " + ", ".join(
            f"{key} {value['summary']['ratio_mean']:.2f}" for key, value in entry["hypotheses"].items()))
    result["seconds"] = time.perf_counter() - started
    log(f"{name}: {result['seconds']:.0f} s")
    return result


def _x64():
    import jax

    return jax.enable_x64(True)


def _p(fitted: dict) -> str:
    low, high = fitted["p_interval"]
    return f"{fitted['p']:.2f} [{low:.2f}, {high:.2f}]"


def table(results: dict, target: str) -> str:
    """Hypotheses (rows) by subjects (columns): mean W1/noise over the rows, and the predicted p."""
    subjects = [name for name, entry in results["subjects"].items() if target in entry["targets"]]
    first = results["subjects"][subjects[0]]["targets"][target]["hypotheses"]
    order = sorted(first, key=lambda key: np.mean(
        [results["subjects"][name]["targets"][target]["hypotheses"][key]["summary"]["ratio_mean"]
         for name in subjects]))
    lines = ["| hypothesis | " + " | ".join(subjects) + " | mean |", "|---|" + "---:|" * (len(subjects) + 1)]
    lines.append("| measured p [95 % bootstrap] | " + " | ".join(
        _p(results["subjects"][name]["targets"][target]["p_measured"]) for name in subjects) + " | |")
    for key in order:
        cells, means = [], []
        for name in subjects:
            entry = results["subjects"][name]["targets"][target]["hypotheses"][key]
            means.append(entry["summary"]["ratio_mean"])
            cells.append(f"{means[-1]:.2f}; p {entry['p_predicted']['p']:.2f}")
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {np.mean(means):.2f} |")
    return "\n".join(lines) + "\n"


def training_table(arguments) -> str:
    training = json.loads((arguments.models / "training.json").read_text())
    reference = json.loads((arguments.reference / "training.json").read_text())
    lines = ["| subject | final norm | seed | steps | held-out loss (nats) |", "|---|---|---:|---:|---:|"]
    for name, entry in training.items():
        lines.append(f"| {name} | {'yes' if entry['final_norm'] else 'no'} | {entry['seed']} | {entry['steps']} | "
                     f"{entry['final_held_out_loss']:.3f} |")
    llama = reference["llama"]
    lines.append(f"| llama (rotary, wave 5) | yes | 0 | {llama['steps']} | {llama['final_held_out_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def final_norm_table(results: dict, target: str = "probability") -> str:
    """The final LayerNorm against training noise: mean over rows of W1 (on 0..q_k, over q_k) between the
    measured rows of two subjects, for pairs that differ in the seed only or in the norm only."""
    from jaxroll.measure.uncertainty import wasserstein

    subjects = results["subjects"]

    def distance(a, b):
        first = np.asarray(subjects[a]["targets"][target]["measured_rows"])
        second = np.asarray(subjects[b]["targets"][target]["measured_rows"])
        return float(np.mean([wasserstein(first[k, : q + 1], second[k, : q + 1])
                              for k, q in enumerate(subjects[a]["queries"])]))

    pairs = (("seed only (with the norm)", "bloom-norm-seed0", "bloom-norm-seed1"),
             ("seed only (without)", "bloom-no-norm-seed0", "bloom-no-norm-seed1"),
             ("norm only (seed 0)", "bloom-norm-seed0", "bloom-no-norm-seed0"),
             ("norm only (seed 1)", "bloom-norm-seed1", "bloom-no-norm-seed1"))
    lines = ["| pair | subjects | mean row W1 between the measured rows |", "|---|---|---:|"]
    for label, a, b in pairs:
        if a in subjects and b in subjects:
            lines.append(f"| {label} | {a}, {b} | {distance(a, b):.4f} |")
    return "\n".join(lines) + "\n"


def figure(results: dict, path: Path, shown=("structural", "position+mlp+input_norm",
                                            "structural, lambdas fitted to last rows",
                                            "attention, lambdas fitted to all rows")) -> Path:
    """Per subject: W1/noise by query position for a few rungs (top), and by distance (bottom), probability target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxroll.theory.baselines import by_distance

    names = list(results["subjects"])
    fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 7.0), constrained_layout=True, squeeze=False)
    for column, name in enumerate(names):
        subject = results["subjects"][name]
        entry = subject["targets"]["probability"]
        queries = np.asarray(subject["queries"])
        top, bottom = axes[0, column], axes[1, column]
        for index, key in enumerate(shown):
            hypothesis = entry["hypotheses"][key]
            top.plot(queries, hypothesis["ratio"], "-o", markersize=3, color=f"C{index}",
                     label=f"{key} (mean {hypothesis['summary']['ratio_mean']:.1f})")
        top.axhline(1.0, color="0.4", ls=":", lw=1)
        top.set(yscale="log", xlabel="query position i", title=name)
        top.legend(fontsize=6)
        measured = np.asarray(entry["measured_rows"])
        r, curve = by_distance(measured, queries, "median")
        bottom.plot(r[1:], curve[1:], "-", color="k", lw=1.6,
                    label=f"measured: p = {_p(entry['p_measured'])}")
        for index, key in enumerate(shown):
            hypothesis = entry["hypotheses"][key]
            r, curve = by_distance(np.asarray(hypothesis["rows"]), queries, "median")
            bottom.plot(r[1:], curve[1:], "--", color=f"C{index}", lw=1,
                        label=f"{key}: p = {hypothesis['p_predicted']['p']:.2f}")
        bottom.set(xscale="log", yscale="log", xlabel="distance r = i - j")
        bottom.legend(fontsize=6)
    axes[0, 0].set_ylabel("W1(predicted row, measured row) / noise")
    axes[1, 0].set_ylabel("median over i of row-normalised influence")
    fig.suptitle(f"Rows of P_T on the subjects trained here: target = top next-token probability "
                 f"(run {results['started']}, S = {results['arguments']['samples']})", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def combine(paths) -> dict:
    """One results dict from runs of the same subjects with different targets (the first run's settings)."""
    runs = [json.loads(Path(path).read_text()) for path in paths]
    results = runs[0]
    for run in runs[1:]:
        for name, subject in run["subjects"].items():
            results["subjects"][name]["targets"].update(subject["targets"])
        results.setdefault("also", []).append({"started": run["started"], "arguments": run["arguments"]})
    return results


def summary(results: dict) -> dict:
    """`results` without the predicted and measured rows (the numbers the tables are made of)."""
    def fit(entry):  # the exponent and its interval, not the curve
        return {key: value for key, value in entry.items() if key not in ("curve", "distances", "note")}

    out = {key: value for key, value in results.items() if key != "subjects"}
    out["subjects"] = {}
    for name, subject in results["subjects"].items():
        entry = {key: value for key, value in subject.items() if key != "targets"}
        entry["targets"] = {target: {"p_measured": fit(data["p_measured"]), "fitted_lambdas": data["fitted_lambdas"],
                                     "hypotheses": {key: {"summary": value["summary"], "ratio": value["ratio"],
                                                          "p_predicted": fit(value["p_predicted"])}
                                                    for key, value in data["hypotheses"].items()}}
                            for target, data in subject["targets"].items()}
        out["subjects"][name] = entry
    return out


def write_outputs(results: dict, arguments) -> str:
    targets = list(next(iter(results["subjects"].values()))["targets"])
    text = "Training\n\n" + training_table(arguments)
    for target in targets:
        text += f"\nTarget: {target} (mean W1/noise over the rows; p predicted)\n\n" + table(results, target)
    text += "\nThe final LayerNorm against training noise (target probability)\n\n" + final_norm_table(results)
    (arguments.out / "table.md").write_text(text)
    (arguments.out / "summary.json").write_text(json.dumps(summary(results), default=float))
    figure(results, arguments.out / "rows.png")
    return text


def main(argv=None) -> int:
    arguments = parse(argv)
    if arguments.combine:
        arguments.out.mkdir(parents=True, exist_ok=True)
        print(write_outputs(combine(arguments.combine), arguments))
        return 0
    torch.set_num_threads(1)
    arguments.out.mkdir(parents=True, exist_ok=True)
    path = arguments.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("started", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    results["arguments"] = {key: str(value) for key, value in vars(arguments).items()}
    for name in arguments.subjects.split(","):
        if name in results.get("subjects", {}):
            continue
        results.setdefault("subjects", {})[name] = study(name, arguments, lambda text: print(text, flush=True))
        path.write_text(json.dumps(results, default=float))  # resumable per subject
    print(write_outputs(results, arguments))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
