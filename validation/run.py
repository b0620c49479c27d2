"""Train small causal LMs here, measure them, and test the rollout's predictions.

    PYTHONPATH=. python3 validation/run.py --out validation/results [--force]

Steps (all offline, seeded; see `pipeline.py` for each formula):

1. corpus: the Python standard library's ``*.py`` files, sorted; every 10th
   file is held out; a byte-level BPE tokenizer is trained on the rest;
2. for BLOOM (ALiBi) and Llama (rotary), ``--layers`` x ``--heads`` x
   ``--hidden``: save the seeded initialisation, train ``--steps`` AdamW
   steps on windows of ``--length`` tokens (stopping early at ``--minutes``
   of wall time, which is then reported), save the trained model;
3. for each of the four models: ``jaxroll measure --dtype float64`` on the
   held-out files, the plain-PyTorch cross-check, the predicted profiles and
   their W1 / Spearman / KL against the measured influence;
4. the ladder of rollout refinements (`ladder.py`): the refinement
   ingredients measured on the same sequences (even and odd halves kept
   apart), every rung's W1 / noise of the mean with its p-value, W1 / Spearman
   / KL with bias-corrected estimates and bootstrap intervals, and the
   out-of-sample scores; a figure per model
   (``ladder-<model>.png`` next to ``--figure``);
5. write ``table.md``, ``ladder.md``, ``table.csv``, ``results.json``, ``losses.csv`` into
   ``--out`` and the figure to ``--figure``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ladder  # noqa: E402
import pipeline  # noqa: E402

from jaxroll.errors import ConfigError  # noqa: E402


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("validation/results"))
    parser.add_argument("--figure", type=Path, default=Path("validation/validation.png"))
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out and an existing --figure")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--length", type=int, default=64, help="training window and measured sequence length N")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--corpus-files", type=int, default=900, help="use only the first this many files (smoke runs)")
    parser.add_argument("--tokenizer-characters", type=int, default=3_000_000)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=6.0, help="wall-time cap per model's training")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between held-out losses of the curve")
    parser.add_argument("--samples", type=int, default=64, help="held-out sequences measured")
    parser.add_argument("--fit-steps", type=int, default=200)
    parser.add_argument("--boots", type=int, default=1000, help="bootstrap resamples of the sequences")
    parser.add_argument("--timing-sequences", type=int, default=8,
                        help="sequences on which each refinement ingredient's measurement is timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true",
                        help="skip training: measure and score the models (and losses.csv) already in --out")
    return parser.parse_args(argv)


def check_outputs(arguments) -> None:
    out, figure = arguments.out, arguments.figure
    if out.exists() and any(out.iterdir()) and not (arguments.force or arguments.reuse):
        raise ConfigError(f"--out {out}: directory is not empty; pass --force to overwrite")
    if figure.exists() and not arguments.force:
        raise ConfigError(f"--figure {figure}: exists; pass --force to overwrite")


def main(argv=None) -> int:
    arguments = parse(argv)
    try:
        check_outputs(arguments)
    except ConfigError as error:
        print(f"validation: error: {error}", file=sys.stderr)
        return 2
    # One thread: on a shared 2-core machine two torch threads spin against
    # other jobs; measured here (18:37 UTC, load 5-7) a training step of the
    # 4-layer BLOOM took 2.3 s with two threads and 0.17 s with one.
    torch.set_num_threads(1)
    from transformers.utils import logging

    logging.disable_progress_bar()  # one log line per step of the run, not per shard written
    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    arguments.figure.parent.mkdir(parents=True, exist_ok=True)
    geometry = pipeline.Geometry(arguments.layers, arguments.heads, arguments.hidden, arguments.length)
    started = time.perf_counter()

    files = pipeline.stdlib_files()[: arguments.corpus_files]
    train_texts, held_texts = pipeline.split_corpus(files)
    print(f"corpus: {len(files)} files ({len(train_texts)} train, {len(held_texts)} held out), "
          f"{sum(map(len, train_texts)) / 1e6:.1f} M characters of training text")
    if arguments.reuse:
        texts = out / "held_out.jsonl"
        curves, training = read_training(out)
    else:
        texts, curves, training = train_models(arguments, geometry, train_texts, held_texts)

    results, ladders = {}, {}
    for family in pipeline.FAMILIES:
        for state in ("init", "trained"):
            name = f"{family}-{state}"
            print(f"measuring {name}")
            measured = pipeline.run_measure(out / name, texts, out / "measure" / name, family=family,
                                            length=arguments.length, samples=arguments.samples)
            model = pipeline.load_float64(out / name)
            check = pipeline.crosscheck(model, measured["token_ids"])
            del model
            profiles, details = pipeline.predictions(measured, fit_steps=arguments.fit_steps)
            for profile in profiles.values():
                pipeline.check_profile(profile)
            target = measured["influence"]
            ladder_result, timing = run_ladder(out / name, measured, check, arguments)
            ladder.plot(name, ladder_result, arguments.figure.parent / f"ladder-{name}.png",
                        extra={"residual, no content (structural)": profiles["residual, no content"],
                               "fitted lambdas (in-sample)": profiles["fitted lambdas"]})
            ladders[name] = ladder_result
            results[name] = {
                "ladder": ladder_result, "ingredient_seconds_per_sequence": timing,
                "scores": pipeline.scores(profiles, target),
                "noise": pipeline.noise_of_the_mean(check["influence"], boots=arguments.boots, seed=arguments.seed),
                "crosscheck": pipeline.crosscheck_differences(measured, check),
                "lambdas": measured["lambdas"].tolist(),
                "fitted_lambdas": details["fitted_lambdas"].tolist(),
                "profiles": {key: value.tolist() for key, value in profiles.items()},
                "measured": target.tolist(),
            }
            print(pipeline.format_rows(name, results[name]))
            print(ladder.markdown({name: ladder_result}, metric="ratio"), flush=True)
            print(f"  ingredient seconds per sequence: {timing}  (load {os.getloadavg()})", flush=True)
    seconds = time.perf_counter() - started
    summary = {"geometry": vars(arguments) | {"out": str(out), "figure": str(arguments.figure)},
               "load_average_at_end": os.getloadavg(),
               "training": training, "results": results, "seconds": seconds,
               "machine": pipeline.machine_description(), "python": sys.version.split()[0]}
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    table = pipeline.markdown_table(results)
    (out / "table.md").write_text(table)
    pipeline.write_csv(results, out / "table.csv")
    ladder_tables = "\n".join(ladder.markdown(ladders, metric=m) for m in ("ratio", "wasserstein", "spearman", "kl"))
    (out / "ladder.md").write_text(ladder_tables)
    print(ladder_tables)
    print(timing_table(results))
    arguments.figure.parent.mkdir(parents=True, exist_ok=True)
    pipeline.plot(results, curves, arguments.figure)
    print(table)
    print(pipeline.training_summary(training))
    print(f"total {seconds / 60:.1f} min")
    return 0


def train_models(arguments, geometry, train_texts, held_texts):
    """Train the tokenizer and both families (saving each initialisation and trained model) and write losses.csv."""
    out = arguments.out
    tokenizer = pipeline.train_tokenizer(train_texts, arguments.vocab, out / "tokenizer",
                                         max_characters=arguments.tokenizer_characters)
    train_stream = pipeline.token_stream(tokenizer, train_texts)
    held_stream = pipeline.token_stream(tokenizer, held_texts)
    texts = pipeline.write_texts(held_texts, out / "held_out.jsonl")
    print(f"tokens: {train_stream.size} train, {held_stream.size} held out (vocabulary {len(tokenizer)})")

    curves, training = {}, {}
    for family in pipeline.FAMILIES:
        model = pipeline.build_model(family, geometry, len(tokenizer), arguments.seed)
        model.save_pretrained(out / f"{family}-init")
        tokenizer.save_pretrained(str(out / f"{family}-init"))
        print(f"training {family}: {sum(p.numel() for p in model.parameters())} parameters")
        curve = pipeline.train(model, train_stream, held_stream, steps=arguments.steps, length=arguments.length,
                               batch_size=arguments.batch, seed=arguments.seed, eval_every=arguments.eval_every,
                               max_seconds=60 * arguments.minutes,
                               on_step=_checkpointer(arguments, out / f"{family}-series", tokenizer))
        model.save_pretrained(out / f"{family}-trained")
        tokenizer.save_pretrained(str(out / f"{family}-trained"))
        curves[family] = curve
        training[family] = _training_summary(curve, model)
        del model
    with open(out / "losses.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["family", "step", "train_loss", "held_out_loss", "seconds"])
        for family, curve in curves.items():
            for row in curve:
                writer.writerow([family, row["step"], row["train_loss"], row["held_out_loss"], row["seconds"]])

    return texts, curves, training


def _checkpointer(arguments, directory: Path, tokenizer):
    """``on_step`` saving ``directory/checkpoint-STEP/`` at the steps of ``--checkpoints`` (None without it)."""
    steps = {int(step) for step in (getattr(arguments, "checkpoints", None) or "").split(",") if step}
    if not steps:
        return None

    def save(step, model):
        if step in steps:
            model.save_pretrained(directory / f"checkpoint-{step}")
            tokenizer.save_pretrained(str(directory / f"checkpoint-{step}"))
    return save


def _training_summary(curve, model) -> dict:
    """Steps, seconds, first and last losses of a training `curve`, and the model's parameter count."""
    return {"steps": curve[-1]["step"], "seconds": curve[-1]["seconds"],
            "initial_held_out_loss": curve[0]["held_out_loss"], "final_held_out_loss": curve[-1]["held_out_loss"],
            "final_train_loss": curve[-1]["train_loss"], "parameters": sum(p.numel() for p in model.parameters())}


def read_training(out: Path):
    """The curves and training summary of a previous run in `out` (from losses.csv and the saved models)."""
    curves = {}
    with open(out / "losses.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            curves.setdefault(row["family"], []).append(
                {key: (int(row[key]) if key == "step" else float(row[key]))
                 for key in ("step", "train_loss", "held_out_loss", "seconds")})
    training = {}
    for family, curve in curves.items():
        model = pipeline.load_float64(out / f"{family}-trained")
        training[family] = _training_summary(curve, model)
        del model
    return curves, training


def run_ladder(model_dir, measured, check, arguments):
    """The refinement ingredients of one saved model (float64, eager), its ladder and the ingredients' timing."""
    from jaxroll.measure.refinements import measure_refinements, time_ingredients

    model = pipeline.load_float64(model_dir)
    ids = measured["token_ids"]
    ingredients = measure_refinements(model, ids, groups=np.arange(ids.shape[0]) % 2)
    timing = time_ingredients(model, ids[: arguments.timing_sequences])
    del model
    return ladder.run_ladder(ingredients, check["influence"], boots=arguments.boots, seed=arguments.seed), timing


def timing_table(results: dict) -> str:
    """Seconds per sequence of each refinement ingredient's forward pass, per model."""
    names = list(results)
    keys = list(next(iter(results.values()))["ingredient_seconds_per_sequence"])
    lines = ["| ingredient, s/sequence | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(
            f"{results[n]['ingredient_seconds_per_sequence'][key]:.4f}" for n in names) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
