"""A change designed through the rollout against the ALiBi model's lost middle, beside the literature's (issue 54).

    PYTHONPATH=. OMP_NUM_THREADS=1 nice python3 validation/task_design_alibi.py \
        --out validation/task-u-run/loop/alibi-design --work /tmp/alibi-design

The model is validation/models/task-u-alibi/bloom-a5-step9000 (ALiBi, a task U
at N = 128, 160 and 192), its held-out cases those of held_out.jsonl at N = 128
and held_out_n160.jsonl (seed 1, 200 per depth fraction 0, 0.1, .., 1).
Every step is a jaxroll command, run in this process as a user types it
(`task_loop.run`):

1. ``jaxroll measure MODEL --texts prompts-N.jsonl --length N --samples S
   --dtype float64`` at N = 128 and 160 on the first held-out prompts of every
   depth: the ingredients (ALiBi slopes, content, lambda), config.yaml;
2. ``jaxroll design measure-128/config.yaml --free ... --goal ... --kl-budget``
   for the candidates declared in `CANDIDATES` (all declared before any was
   scored); each applied with ``jaxroll task --cases selection.jsonl
   --intervene DESIGN/interventions.yaml`` on *selection* cases (build_cases.py's
   builder, seed 3, never the held-out seed 1); the rollout's forecast of each
   at both lengths (``jaxroll rollout measure-N/config.yaml --intervene``): the
   mean over the middle records (f = 0.4-0.6) of the profile's mass on their
   span; the candidate with the largest selection middle gain (mean over the
   two lengths) is "the designed change";
3. it and the literature's changes (`LITERATURE`: 4 sink tokens; SSMax at s =
   0.43) on the held-out cases: middle accuracy (mean over f = 0.4, 0.5, 0.6)
   with a paired bootstrap 95 % interval of the gain, and the answer loss
   (mean cross-entropy of the answer token, the training objective) with a
   paired interval of its change;
4. doses on the selection cases: the designed change scaled along its own
   direction (`LEVER_STEPS`: each parameter moved ``t`` times its distance from
   the neutral value, clipped to its box) and 1, 2, 4, 8 sink tokens: middle
   gain against answer-loss change, and the sink tokens' gain interpolated at
   each lever dose's loss change (the comparison at equal loss cost).

Writes into ``--out``: ``results.json``, ``table.md``, ``accuracy-by-depth.png``,
``doses.png``, ``design.png`` and ``interventions.yaml`` (the designed
change). Measurements and scored cases go to ``--work`` and are reused there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "validation"))
sys.path.insert(0, str(ROOT / "validation" / "models" / "task-u-alibi"))
import build_cases  # noqa: E402  (the training builder at any length and seed)
import train_task  # noqa: E402
from task_loop import read_jsonl, record_text, run, write_jsonl  # noqa: E402

MODELS = ROOT / "validation" / "models" / "task-u-alibi"
MODEL = MODELS / "bloom-a5-step9000"
HELD_OUT = {128: MODELS / "held_out.jsonl", 160: MODELS / "held_out_n160.jsonl"}
LENGTHS = (128, 160)
DESIGN_LENGTH = 128
"""The measurement the designs are optimised on (the values apply at any length: ALiBi has no position table)."""
DEPTHS = train_task.DEPTHS
MIDDLE = train_task.MIDDLE
SELECTION_SEED = 3
"""Seed of the selection cases (held-out cases: 1, the training monitor: 2, training: 0)."""
BUDGET = 0.05
CANDIDATES = {
    "slope global": ["--free", "slope_scale=global", "--goal", "middle_mass", "--kl-budget", BUDGET],
    "slope global, KL 0.2": ["--free", "slope_scale=global", "--goal", "middle_mass", "--kl-budget", 0.2],
    "slope per layer": ["--free", "slope_scale=per_layer", "--goal", "middle_mass", "--kl-budget", BUDGET],
    "slope per layer and head": ["--free", "slope_scale=per_layer_head", "--goal", "middle_mass",
                                 "--kl-budget", BUDGET],
    "slope global, U-index": ["--free", "slope_scale=global", "--goal", "u_index", "--kl-budget", BUDGET],
    "slope + gamma": ["--free", "slope_scale=global,gamma=global", "--bounds", "gamma=0.5:1.5",
                      "--goal", "middle_mass", "--kl-budget", BUDGET],
    "tau, kappa, gamma (the Llama loop's)": ["--free", "tau=global,kappa=global,gamma=global",
                                             "--bounds", "gamma=0.5:1.5", "--goal", "middle_mass",
                                             "--kl-budget", BUDGET],
}
"""The designs tried, `jaxroll design` arguments on the N = 128 measurement; all declared before any was scored.
The middle mass is the rollout's ``sum p[k:N-k]``, k = N/10; the KL budget bounds every layer's kernel change."""
LITERATURE = {"4 sink tokens": "sinks=4", "SSMax s = 0.43": "ssmax_scale=0.43"}
"""The literature's changes at their published settings (SSMax: Nakanishi 2025, arXiv 2501.19399, Figure 1)."""
SINK_DOSES = (1, 2, 4, 8)
LEVER_STEPS = (0.5, 1.0, 1.5, 2.0)
"""Doses of the designed change: each parameter at ``neutral + t (designed - neutral)``, clipped to its box."""
NEUTRAL = {"slope_scale": 1.0, "gamma": 1.0, "tau": 1.0, "kappa": 0.0}
BOXES = {"slope_scale": (0.0, 4.0), "gamma": (0.0, 4.0), "tau": (0.25, 4.0), "kappa": (-2.0, 2.0)}
RESAMPLES = 2000


def prepare(work: Path, samples_per_depth: int, selection: int) -> dict:
    """The held-out cases at `LENGTHS` (one file), the measured prompts (the first `samples_per_depth` held-out
    cases of every depth per length, depth varying fastest) and the selection cases (`SELECTION_SEED`)."""
    held = [r for n in LENGTHS for r in read_jsonl(HELD_OUT[n]) if r["length"] == n]
    files = {"held": write_jsonl(work / "held-out.jsonl", ({k: v for k, v in r.items()
                                                             if not k.startswith("exact")} for r in held))}
    for n in LENGTHS:
        chosen = sorted((r for r in held if r["length"] == n and r["sample"] < samples_per_depth),
                        key=lambda r: (r["sample"], r["depth_fraction"]))
        files[n] = write_jsonl(work / f"prompts-{n}.jsonl", ({"prompt_ids": r["prompt_ids"]} for r in chosen))
    files["middle spans"] = {n: sorted({(r["record_start"], r["record_end"]) for r in held
                                        if r["length"] == n and r["depth_fraction"] in MIDDLE}) for n in LENGTHS}
    files["selection"] = write_jsonl(work / "selection.jsonl",
                                     build_cases.rows(LENGTHS, samples=selection, seed=SELECTION_SEED))
    return files


def score(cases: Path, out: Path, intervene: str | None = None) -> list[dict]:
    """``jaxroll task MODEL --cases FILE [--intervene X]``: the scored rows (cases.jsonl), reused when present."""
    if not (out / "cases.jsonl").is_file():
        run("task", MODEL, "--cases", cases, "--out", out, "--batch-size", 200, "--quiet", "--force",
            *(["--intervene", intervene] if intervene else []))
    return read_jsonl(out / "cases.jsonl")


def measure(files: dict, work: Path, samples: int) -> dict:
    """``jaxroll measure`` on the held-out prompts at each length (token ids, float64, default statistics)."""
    folders = {}
    for n in LENGTHS:
        folders[n] = work / f"measure-{n}"
        if not (folders[n] / "config.yaml").is_file():
            run("measure", MODEL, "--texts", files[n], "--length", n, "--samples", samples,
                "--dtype", "float64", "--out", folders[n], "--quiet", "--force")
    return folders
