"""Held-out key-value cases of validation/train_task.py at any length, as held_out.jsonl's (issue 54).

The cases of ``held_out.jsonl`` here (and validation/models/task-u/) are
``train_task.grid(Layout(vocab=64, key_tokens=1, value_tokens=1), (64, 128),
DEPTHS, 200, seed=1)``: the held-out seed of a run with ``--seed 0``. This
script writes the same grid at other lengths, one JSON line per case with the
gold record's token span ``[record_start, record_end)`` (``record_start =
1 + round(f (N - 3 - 5 - 1))``), in held_out.jsonl's columns less the
exact-match ones, so that ``jaxroll task MODEL --cases FILE`` scores them.
``--check FILE`` rebuilds FILE's cases (its lengths) and exits 1 on any
difference in ids, spans, answers, depth, sample or seed.

    PYTHONPATH=. python3 validation/models/task-u-alibi/build_cases.py --check validation/models/task-u-alibi/held_out.jsonl
    PYTHONPATH=. python3 validation/models/task-u-alibi/build_cases.py --lengths 96 --out held_out_n96.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # validation/, for train_task
import train_task as tt  # noqa: E402

LAYOUT = tt.Layout(vocab=64, key_tokens=1, value_tokens=1)
SEED, SAMPLES = 1, 200
KEYS = ("length", "depth_fraction", "sample", "seed", "record_start", "record_end", "prompt_ids", "answer_ids")


def rows(lengths, samples: int = SAMPLES, seed: int = SEED) -> list:
    """held_out.jsonl's rows (``family`` bloom, no exact-match column) for the grid lengths x DEPTHS x samples."""
    return [{"family": "bloom", "length": c["length"], "depth_fraction": c["depth_fraction"], "sample": c["sample"],
             "seed": c["seed"], "record_start": c["depth"], "record_end": c["depth"] + c["record_length"],
             "prompt_ids": c["prompt_ids"], "answer_ids": c["answer_ids"]}
            for c in tt.grid(LAYOUT, tuple(lengths), tt.DEPTHS, samples, seed)]


def check(path: Path) -> int:
    """The number of rows of `path` that the builder does not reproduce (KEYS compared); row counts must agree."""
    given = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    lengths = sorted({r["length"] for r in given})
    built = rows(lengths, samples=len(given) // (len(lengths) * len(tt.DEPTHS)))
    if len(built) != len(given):
        return max(len(built), len(given))
    return sum(any(b[k] != g[k] for k in KEYS) for b, g in zip(built, given))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[96])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    parser.add_argument("--check", type=Path, help="rebuild this file's cases and compare")
    args = parser.parse_args(argv)
    if args.check is not None:
        bad = check(args.check)
        print(f"{args.check}: {bad} rows differ from the builder's")
        return 1 if bad else 0
    if args.out is None:
        parser.error("--out: got nothing; allowed: a new .jsonl path (or --check FILE)")
    if args.out.exists() and not args.force:
        parser.error(f"--out {args.out} exists; allowed: a new path, or --force")
    with open(args.out, "w", encoding="utf-8") as handle:
        for row in rows(args.lengths):
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
