"""The U test of README.md's tables from `jaxroll task --cases` outputs (issue 54, "a task U at two lengths").

For each given ``NAME=DIR`` (a `jaxroll task MODEL --cases FILE --out DIR`
run), reads ``DIR/cases.jsonl``, takes each case's exact match and prints one
Markdown row per length: accuracy at f = 0, 0.4, 0.5, 0.6, 1 with bootstrap
standard errors, ``middle = mean(acc[0.4], acc[0.5], acc[0.6])``, the gaps
``acc[0] - middle`` and ``acc[1] - middle`` in standard errors, and U (both
> 3 s.e.), all by validation/train_task.py's `by_depth` (1,000 resamples of
the cases within each depth, seed 0), on each length's cases alone (README.md's
earlier table drew the N = 64 and 128 resamples from one stream, so its
standard errors there differ from these by up to 0.002, its gap z-scores by up to 0.2). ``--merge FILE`` adds each run's exact match to FILE's rows
as the column ``exact_NAME`` (cases matched on length, depth fraction,
sample, seed and prompt ids; every row must be found) and rewrites FILE.

    PYTHONPATH=. python3 validation/models/task-u-alibi/u_table.py a5=RUN/a5-n96 step9000=RUN/s9-n96 \
        --merge validation/models/task-u-alibi/held_out_n96.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # validation/, for train_task
import train_task as tt  # noqa: E402

CHANCE = 1 / (64 - tt.FIRST_SYMBOL)
"""Exact match by guessing: one-token values drawn from the 56 symbol ids of the 64-id vocabulary."""


def read_run(folder: Path) -> list:
    """The scored cases of a `jaxroll task` run: dicts with length, depth_fraction, depth, sample, seed, exact."""
    rows = [json.loads(line) for line in (folder / "cases.jsonl").read_text(encoding="utf-8").splitlines()]
    return [{"length": r["length"], "depth_fraction": float(r["depth_fraction"]), "depth": r["depth"],
             "sample": r["sample"], "seed": r["seed"], "prompt_ids": r["prompt_ids"], "exact": int(r["exact"])}
            for r in rows]


def by_length(cases: list, boots: int = 1000) -> dict:
    """`tt.by_depth` of each length's cases alone (seed 0), so a length's row does not depend on the others scored."""
    table = {}
    for length in sorted({c["length"] for c in cases}):
        chosen = [c for c in cases if c["length"] == length]
        table.update(tt.by_depth(chosen, np.array([c["exact"] for c in chosen], dtype=float), boots=boots))
    return table


def markdown_rows(name: str, cases: list) -> list:
    """README.md's table rows of one checkpoint: ``| name | N | f=0 | 0.4 | 0.5 | 0.6 | f=1 | middle | gaps | U |``."""
    table = by_length(cases)
    lines = []
    for length, entry in table.items():
        cell = {r["depth_fraction"]: f"{r['accuracy']:.3f} ({r['se']:.3f})" for r in entry["rows"]}
        gaps = [f"{g['gap']:+.3f} ({g['z']:.1f} s.e.)" for g in (entry["gaps"]["start"], entry["gaps"]["end"])]
        lines.append(f"| {name} | {length} | " + " | ".join(cell[f] for f in (0.0, 0.4, 0.5, 0.6, 1.0))
                     + f" | {entry['middle']:.3f} | {gaps[0]} | {gaps[1]} | {'**yes**' if entry['u'] else 'no'} |")
    return lines


def plot(path: Path, tables: dict, step: int) -> None:
    """Accuracy by depth fraction, one panel per checkpoint, one line per length (+-1.96 s.e.); U lengths in the titles."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.2 * len(tables) + 1.4, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    for index, (name, table) in enumerate(tables.items()):
        axes = figure.add_subplot(1, len(tables), index + 1)
        for length, entry in table.items():
            rows = entry["rows"]
            axes.errorbar([r["depth_fraction"] for r in rows], [r["accuracy"] for r in rows],
                          yerr=[1.96 * r["se"] for r in rows], marker="o", ms=3, capsize=2,
                          label=f"N = {length}")
        axes.axhline(CHANCE, color="grey", lw=0.8, ls=":", label="chance (1/56)")
        u = ", ".join(length for length, entry in table.items() if entry["u"]) or "none"
        axes.set(title=f"{name}, step {step}\nU at N = {u}", xlabel="gold record's depth fraction",
                 ylabel="exact match (held-out)", ylim=(-0.02, 1.02))
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))  # the lines are the same per panel
    figure.suptitle("key-value retrieval, ALiBi (BLOOM), held-out exact match by length, 200 cases a point "
                    "(seed 1), 95% bars\ntrained at N = 32, 64, 128 (a5 then at 64, 128 only); "
                    "N = 96, 160, 192, 256 never trained; U: both ends > 3 s.e. above the middle (f = 0.4-0.6)", fontsize=9)
    figure.savefig(path, dpi=120)


def merge(path: Path, runs: dict) -> None:
    """Add ``exact_NAME`` per run to the rows of `path` (matched on length, f, sample, seed, ids) and rewrite it."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for name, cases in runs.items():
        found = {(c["length"], c["depth_fraction"], c["sample"], c["seed"], tuple(c["prompt_ids"])): c["exact"]
                 for c in cases}
        for row in rows:
            row[f"exact_{name}"] = found[(row["length"], float(row["depth_fraction"]), row["sample"], row["seed"],
                                          tuple(row["prompt_ids"]))]
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="NAME=DIR: a jaxroll task --cases output folder")
    parser.add_argument("--merge", type=Path, help="held-out file to add the exact_NAME columns to")
    parser.add_argument("--plot", type=Path, help="PNG of accuracy by depth, one panel per NAME, a line per length")
    parser.add_argument("--step", type=int, default=9000, help="the checkpoints' training step, for the panel titles")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, _, folder = item.partition("=")
        if not folder or not (Path(folder) / "cases.jsonl").is_file():
            parser.error(f"runs: got {item!r}; allowed: NAME=DIR with DIR/cases.jsonl")
        runs[name] = runs.get(name, []) + read_run(Path(folder))  # a name given twice: its runs pooled
    for name, cases in runs.items():
        print("\n".join(markdown_rows(name, cases)))
    if args.merge is not None:
        merge(args.merge, runs)
    if args.plot is not None:
        tables = {name: by_length(cases) for name, cases in runs.items()}
        plot(args.plot, tables, args.step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
