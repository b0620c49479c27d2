"""Train the wave-5 validation models once, for every issue that needs them.

    PYTHONPATH=. python3 validation/train.py --out /path/to/models [--steps 4000] [--minutes 30]

BLOOM (ALiBi) and Llama (rotary) of docs/validation.md's run 3 geometry (4
layers unless ``--layers``, 4 heads, hidden 64, N = 64), trained by `pipeline.train` on the
Python standard library corpus with a step budget (a wall-time cap guards a
busy machine). Writes ``{family}-init/``, ``{family}-trained/`` (model and
tokenizer), ``held_out.jsonl``, ``losses.csv`` and ``training.json`` into
``--out``; measuring and scoring are left to the issue that uses them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402
import run  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-time cap per model")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--length", type=int, default=64, help="training window and measured sequence length N")
    parser.add_argument("--corpus-root", type=Path, default=None,
                        help="train on the *.py files under this folder (an installed package, e.g. sympy's) "
                             "instead of the standard library's")
    parser.add_argument("--checkpoints", default=None, metavar="STEPS",
                        help="also save FAMILY-series/checkpoint-STEP/ (model and tokenizer) at these steps, "
                             "e.g. 0,10,30,100,300,1000,3000 (the Hugging Face Trainer's layout)")
    arguments = run.parse(["--out", "unused", "--steps", "0"])
    own = parser.parse_args(argv)
    for name in ("out", "steps", "minutes", "layers", "seed", "checkpoints", "length"):
        setattr(arguments, name, getattr(own, name))
    if arguments.out.exists() and any(arguments.out.iterdir()):
        print(f"train: error: --out {arguments.out}: directory is not empty", file=sys.stderr)
        return 2
    arguments.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    geometry = pipeline.Geometry(arguments.layers, arguments.heads, arguments.hidden, arguments.length)
    train_texts, held_texts = pipeline.split_corpus(pipeline.stdlib_files(own.corpus_root)[: arguments.corpus_files])
    _, _, training = run.train_models(arguments, geometry, train_texts, held_texts)
    training["corpus_root"] = str(own.corpus_root or "the standard library")
    training["seed"], training["length"], training["layers"] = own.seed, own.length, own.layers
    (arguments.out / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    print(json.dumps(training, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
