"""Every row of P_T on a model trained here, and the final LayerNorm with and without.

    PYTHONPATH=. python3 validation/rows.py --out validation/rows-results [--minutes 5]

Two small BLOOMs (ALiBi) are trained on the Python standard library exactly
as `validation/run.py` trains its models (same corpus split, tokenizer,
optimiser; `pipeline.py`), one as built and one with its final LayerNorm
``ln_f`` replaced by the identity (Kim et al., ACL Findings 2026, argue that
LayerNorm adds a recency mechanism that residual-attention rollouts leave
out). For each, on held-out sequences (float64):

- measured: lambda_t, content, the last-row influence (`jaxroll.measure.measure`)
  and the gradient influence on K query positions (`jaxroll.measure.rows`);
- predicted: rows ``P_T[q_k, :]`` of the residual-aware rollout on the
  measured configuration (`Measurement.to_rollout_model`, `jaxroll.theory.rows.predicted_rows`);
- per row: ``W1 / q_k`` between predicted and measured on positions
  ``0..q_k``, the noise of the measured mean (the bootstrap median of
  ``W1(m*, m)`` over resampled sequences) and their ratio (about 1 for a
  perfect prediction);
- by distance ``r = i - j``: the median over query positions of the
  row-normalised influence, measured and predicted, each fitted by
  Brändel et al.'s ``gamma + beta (r + 1)^-p`` on ``r >= 1`` (95 % intervals).

Writes ``table.md``, ``results.json`` and ``rows.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402

VARIANTS = ("final-norm", "no-final-norm")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("validation/rows-results"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--corpus-files", type=int, default=900)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--minutes", type=float, default=5.0, help="wall-time cap per model's training")
    parser.add_argument("--samples", type=int, default=64, help="held-out sequences measured")
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--boots", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def row_noise(rows_k: np.ndarray, boots: int, rng) -> np.ndarray:
    """Median over resamples of ``W1(m*, m)`` for each row: ``(S, K, n)`` -> ``(K,)`` (W1 over n - 1)."""
    from jaxroll.measure.uncertainty import wasserstein

    sequences = rows_k.shape[0]
    measured = rows_k.mean(axis=0)
    measured = measured / measured.sum(axis=-1, keepdims=True)
    counts = np.zeros((boots, sequences))
    np.add.at(counts, (np.repeat(np.arange(boots), sequences), rng.integers(0, sequences, boots * sequences)), 1)
    resampled = np.einsum("bs,skn->bkn", counts, rows_k)
    resampled /= resampled.sum(axis=-1, keepdims=True)
    return np.median(wasserstein(resampled, measured[None]), axis=0)


def fit(distance_profile: np.ndarray) -> dict:
    """Brändel et al.'s ``gamma + beta (r + 1)^-p`` on ``r >= 1`` (`jaxroll.theory.baselines.fit_power_law`)."""
    from jaxroll.theory.baselines import fit_power_law

    r = np.arange(1, distance_profile.size, dtype=np.float64)
    result = fit_power_law(r, distance_profile[1:])
    gamma, beta, p = (float(x) for x in result.parameters)
    low, high = (float(x) for x in result.interval[2])
    return {"gamma": gamma, "beta": beta, "p": p, "p_interval": [low, high], "at_bound": bool(result.at_bound)}


def analyse(model, token_ids, arguments, rng) -> dict:
    import jax

    from jaxroll.measure import measure
    from jaxroll.measure.rows import influence_rows
    from jaxroll.measure.uncertainty import wasserstein
    from jaxroll.theory.rows import normalised_rows, predicted_rows
    from jaxroll.theory.baselines import by_distance

    measurement = measure(model, token_ids, stats=("lambda", "content", "influence"))
    rows, queries = influence_rows(model, token_ids, arguments.queries, batch_size=8)
    measured = normalised_rows(rows)
    with jax.enable_x64(True):
        predicted = predicted_rows(measurement.to_rollout_model(), queries)
    per_row = []
    noise_all = []
    for k, q in enumerate(queries):
        span = slice(0, int(q) + 1)
        w1 = float(wasserstein(predicted[k, span], measured[k, span]))
        noise = float(row_noise(rows[:, k: k + 1, span], arguments.boots, rng)[0])
        noise_all.append(noise)
        per_row.append({"query": int(q), "w1": w1, "noise": noise, "ratio": w1 / noise})
    distance = {"measured": by_distance(measured, queries, "median")[1],
                "predicted": by_distance(predicted, queries, "median")[1]}
    fits = {name: fit(profile) for name, profile in distance.items()}
    ratios = np.array([row["ratio"] for row in per_row])
    return {"rows": per_row, "queries": queries.tolist(), "measured_rows": measured, "predicted_rows": predicted,
            "distance": distance, "power_law": fits, "last_row": measurement.influence,
            "lambdas": measurement.lambdas, "ratio_mean": float(ratios.mean()), "ratio_median": float(np.median(ratios))}


def plot(results: dict, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    for variant, style in zip(results, ("-o", "--s")):
        rows = results[variant]["rows"]
        axes[0].plot([row["query"] for row in rows], [row["ratio"] for row in rows], style, label=variant)
    axes[0].axhline(1.0, color="0.5", lw=0.8, ls=":")
    axes[0].set(xlabel="query position i", ylabel="W1(predicted, measured) / noise of the mean",
                title="Row i of P_T: rollout vs measured (1 = at the noise)")
    axes[0].legend()
    base = results[VARIANTS[0]]
    queries = base["queries"]
    for k, colour in zip((0, len(queries) // 2, len(queries) - 1), ("C0", "C1", "C2")):
        q = queries[k]
        positions = np.arange(q + 1)
        axes[1].plot(positions, base["measured_rows"][k, : q + 1], color=colour, label=f"measured, i = {q}")
        axes[1].plot(positions, base["predicted_rows"][k, : q + 1], color=colour, ls="--", label=f"rollout, i = {q}")
    axes[1].set(xlabel="input position j", ylabel="influence on position i (row sums to 1)", yscale="log",
                title=f"Rows of P_T ({VARIANTS[0]} model)")
    axes[1].legend(fontsize=7, ncol=2)
    for name, style in (("measured", "-"), ("predicted", "--")):
        profile = base["distance"][name]
        r = np.arange(1, profile.size)
        fitted = base["power_law"][name]
        low, high = fitted["p_interval"]
        axes[2].plot(r, profile[1:], style, color="C0" if name == "measured" else "C3",
                     label=f"{name}: p = {fitted['p']:.2f} [{low:.2f}, {high:.2f}]")
        axes[2].plot(r, fitted["gamma"] + fitted["beta"] * (r + 1.0) ** -fitted["p"], ":", color="0.3", lw=0.8)
    axes[2].set(xscale="log", yscale="log", xlabel="distance r = i - j (r >= 1)",
                ylabel="median over i of row-normalised influence",
                title="By distance; dotted: gamma + beta (r+1)^-p")
    axes[2].legend(fontsize=8)
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _p(fitted: dict) -> str:
    low, high = fitted["p_interval"]
    return f"{fitted['p']:.2f} [{low:.2f}, {high:.2f}]" + (" (at a bound)" if fitted["at_bound"] else "")


def table(results: dict, training: dict) -> str:
    lines = ["| model | steps | held-out loss | rows | W1/noise mean | median | best row (i, ratio) | worst row (i, ratio) "
             "| p measured | p predicted |", "|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for variant, result in results.items():
        rows = result["rows"]
        best = min(rows, key=lambda row: row["ratio"])
        worst = max(rows, key=lambda row: row["ratio"])
        fits = result["power_law"]
        lines.append(f"| {variant} | {training[variant]['steps']} | {training[variant]['final_held_out_loss']:.3f} | "
                     f"{len(rows)} | {result['ratio_mean']:.2f} | {result['ratio_median']:.2f} | "
                     f"{best['query']}, {best['ratio']:.2f} | {worst['query']}, {worst['ratio']:.2f} | "
                     f"{_p(fits['measured'])} | {_p(fits['predicted'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from jaxroll.measure.uncertainty import wasserstein

    arguments = parse(argv)
    torch.set_num_threads(1)
    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    files = pipeline.stdlib_files()[: arguments.corpus_files]
    train_texts, held_texts = pipeline.split_corpus(files)
    tokenizer = pipeline.train_tokenizer(train_texts, arguments.vocab, out / "tokenizer", max_characters=3_000_000)
    train_stream = pipeline.token_stream(tokenizer, train_texts)
    held_stream = pipeline.token_stream(tokenizer, held_texts)
    starts = np.random.default_rng(arguments.seed + 7).integers(0, held_stream.size - arguments.length,
                                                                arguments.samples)
    token_ids = np.stack([held_stream[s: s + arguments.length] for s in starts])
    geometry = pipeline.Geometry(arguments.layers, arguments.heads, arguments.hidden, arguments.length)
    results, training = {}, {}
    for variant in VARIANTS:
        model = pipeline.build_model("bloom", geometry, len(tokenizer), arguments.seed)
        if variant == "no-final-norm":
            model.transformer.ln_f = torch.nn.Identity()
        print(f"training {variant}")
        curve = pipeline.train(model, train_stream, held_stream, steps=arguments.steps, length=arguments.length,
                               seed=arguments.seed, max_seconds=60 * arguments.minutes)
        training[variant] = {"steps": curve[-1]["step"], "final_held_out_loss": curve[-1]["held_out_loss"],
                             "curve": curve}
        results[variant] = analyse(model.double().eval(), token_ids, arguments, np.random.default_rng(arguments.seed))
    last_rows = [results[variant]["last_row"] for variant in VARIANTS]
    summary = {"started": started, "arguments": {k: str(v) for k, v in vars(arguments).items()},
               "training": training,
               "last_row_w1_between_variants": float(wasserstein(*last_rows)),
               "results": {variant: {key: value for key, value in result.items()
                                     if key in ("rows", "queries", "power_law", "ratio_mean", "ratio_median")}
                           for variant, result in results.items()}}
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=float))
    text = table(results, training)
    text += (f"\nLast-row W1 between the two models' measured profiles: "
             f"{summary['last_row_w1_between_variants']:.4f} (run {started}).\n")
    (out / "table.md").write_text(text)
    plot(results, out / "rows.png", f"Rows of P_T on BLOOMs trained here ({arguments.layers} layers, "
                                    f"N = {arguments.length}, S = {arguments.samples}; run {started})")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
