"""The per-case rollout on the extended layer: does the probability path rank the Llama's depths? (issues 53, 54)

The per-case rollout of docs/task.md ("Every held-out case measured") rolls out each measured prompt's own
layers, ``R_t^s = (1 - lambda_t^s) I + lambda_t^s A_t^s`` with the norm-ratio lambda and the head-averaged
attention, and ranks the depths of the task-u Llama at N = 128 at Spearman 0.52 (target 0.7, noise ceiling
0.83). Issue 53's extended layer (docs/design.md, "The probability path" and "The path's own row shape") says
the gradient the measurement takes reads each layer differently: the branch's share is the gradient share of
the measured paths, and the probability path's part of the branch (rho_t, 0.31 and 0.58 on this Llama) has its
own row shape. This script rolls out, per measured prompt and from the same forward pass, the four variants
declared before any was scored:

    base   lambda_t^s = norm ratio,     K_t^s = mean_h A_h             (reproduces sequence_rollout, checked)
    share  lambda_t^s = (V + P) / (I + V + P) of the prompt's measured paths (path_per_sequence), K_t^s
    shape  norm ratio, B_t^s = (1 - rho_t^s) K_t^s + rho_t^s C_t^s / rowsum, rho_t^s = P / (V + P),
           C_t^s = mean_h A_h * sqrt(1 - 2 A_h + sum_k A_{h,ik}^2) (orthogonal equal value deviations)
    both   the share's lambda and the shape's B

A fifth variant was declared after those four were scored, before it ran (2026-12-08 01:28 UTC): the rollout
refinement that weighs each head's attention by its value vectors' norms (docs/refinements.md, `norm`;
Kobayashi et al. 2020):

    norm   norm ratio, K_t^s = mean_h (A_h(i, j) ||W_O^h v_h(j)|| / sum_k A_h(i, k) ||W_O^h v_h(k)||)

It scores each as compare-task --per-case does (each table row's mean span mass through the two-parameter
link, fitted at one length and tested at the other). The measurement folders are task_loop.py's
(``--only-predict --samples-per-depth 200 --work W``: W/measure-N, with paths and sequence_rollout).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/task_extended_rows.py --work /tmp/s200/work \
        --accuracy validation/task-u-run/loop/per-case-all/llama/accuracy-table.csv --out OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxroll.engine.probability import path_weights
from jaxroll.measure.sequence_rollout import _own_ingredients
from jaxroll.theory.sequence_mean import rollouts_per_sequence

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("base", "share", "shape", "both", "norm")


def with_branch(lambdas: np.ndarray, branch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The layers ``R_t(i, :) = ((1 - l_t) e_i + l_t B_t(i, :)) / (1 - l_t + l_t sum_j B_t(i, j))`` as one lambda
    per row and a row-stochastic kernel: ``(l_t W_i / (1 - l_t + l_t W_i), B_t(i, :) / W_i)``, ``W_i = sum_j B_t(i, j)``
    (docs/design.md, "The probability path"; a row whose branch is empty keeps its identity)."""
    weight = branch.sum(-1)
    lam = np.asarray(lambdas, dtype=np.float64)[:, None]
    kernels = branch / np.where(weight > 0, weight, 1.0)[..., None]
    return lam * weight / (1.0 - lam + lam * weight), kernels


def variant_layers(state: dict, layers: int, paths: np.ndarray) -> dict:
    """One prompt's layers per variant, ``{variant: (lambdas (T, N), kernels (T, N, N))}``, float64.

    `state` is what the hooks delivered for the prompt (`jaxroll.measure.sequence_rollout._own_ingredients`'s
    input, plus ``("value_norms", t)``: ``||W_O^h v_h(j)|| (H, N)``); `paths` ``(4, T)`` its measured paths
    (identity, value, probability, MLP) at the last row."""
    ratio, kernels = _own_ingredients(state, layers)  # today's per-sequence layer, as sequence_rollout forms it
    alpha = [state[("alpha", t)].double().numpy() for t in range(layers)]
    identity, value, probability = paths[0], paths[1], paths[2]
    share = (value + probability) / (identity + value + probability)
    rho = probability / (value + probability)
    with jax.enable_x64(True):
        shapes = np.stack([np.asarray(path_weights(jnp.asarray(a))).mean(0) for a in alpha])
    # A row with one key (the first) has C = 0: its probability path carries nothing there.
    shapes /= np.where(shapes.sum(-1, keepdims=True) > 0, shapes.sum(-1, keepdims=True), 1.0)
    branch = (1.0 - rho)[:, None, None] * kernels + rho[:, None, None] * shapes
    norm = np.stack([_norm_kernel(a, state[("value_norms", t)].double().numpy()) for t, a in enumerate(alpha)])
    n = kernels.shape[-1]
    return {"base": (_per_row(ratio, n), kernels), "share": (_per_row(share, n), kernels),
            "shape": with_branch(ratio, branch), "both": with_branch(share, branch), "norm": (_per_row(ratio, n), norm)}


def _per_row(lambdas, n: int) -> np.ndarray:
    """One lambda a layer ``(T,)`` as one a row ``(T, N)``, so every variant's layers stack alike."""
    return np.repeat(np.asarray(lambdas, dtype=np.float64)[:, None], n, axis=1)


def _norm_kernel(alpha: np.ndarray, value_norms: np.ndarray) -> np.ndarray:
    """``mean_h`` of ``A_h(i, j) n_h(j) / sum_k A_h(i, k) n_h(k)`` (a row with no weight keeps ``A_h``), ``(N, N)``."""
    weighted = alpha * value_norms[:, None, :]
    total = weighted.sum(-1, keepdims=True)
    return np.where(total > 0, weighted / np.where(total > 0, total, 1.0), alpha).mean(0)


def rows_of(model, folder: Path, batch: int = 8) -> dict:
    """Every measured prompt's last row per variant ``{variant: (S, N)}``: one forward pass a batch (float64), each
    batch's layers rolled out by `jaxroll.theory.sequence_mean.rollouts_per_sequence`."""
    import torch

    from jaxroll.measure.layer_maps import resolve
    from jaxroll.measure.precision import full_precision
    from jaxroll.measure.refinements import _attach

    arrays = np.load(folder / "measurement.npz")
    ids, paths = arrays["token_ids"], arrays["path_per_sequence"]
    resolved = resolve(model, None)
    layers = len(resolved.blocks)
    states: list[dict] = []

    def deliver(kind, layer, value, row=0):
        states[row][(kind, layer)] = value.double().cpu()

    found = {v: np.zeros(ids.shape) for v in VARIANTS}
    handles = _attach(resolved, ("attention", "position", "norm"), deliver)
    try:
        model.eval()
        for first in range(0, ids.shape[0], batch):
            chunk = torch.as_tensor(ids[first:first + batch], dtype=torch.long)
            states[:] = [{} for _ in range(chunk.shape[0])]
            with torch.no_grad(), full_precision(model):
                model(input_ids=chunk, use_cache=False)
            prompts = [variant_layers(state, layers, paths[first + k]) for k, state in enumerate(states)]
            for v in VARIANTS:
                lambdas, kernels = (np.stack(part) for part in zip(*(prompt[v] for prompt in prompts)))
                found[v][first:first + len(prompts)] = rollouts_per_sequence(lambdas, kernels, [ids.shape[1] - 1])[:, 0]
    finally:
        for handle in handles:
            handle.remove()
    stored = arrays["sequence_rollout_per_sequence"]
    gap = float(np.abs(found["base"] - stored).max())
    if gap > 1e-10:
        raise SystemExit(f"base rows differ from the measured sequence_rollout by {gap:.3g}: not the same rollout")
    return found


def markdown(results: dict, lengths) -> str:
    """The held-out Spearman [95 %] of each variant (columns), fitted at one length and tested at the other (rows)."""
    lines = ["| fitted -> tested | " + " | ".join(VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]
    for fit, test in (lengths, lengths[::-1]):
        cells = []
        for v in VARIANTS:
            held = results[f"{v}, fit L={fit}"]["scores"]["held out"]
            low, high = held["spearman_interval"]
            cells.append(f"{held['spearman']:.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {fit} -> {test} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "validation/models/task-u/llama-step2500")
    parser.add_argument("--held-out", type=Path, nargs="+", default=[ROOT / "validation/models/task-u/held_out.jsonl"])
    parser.add_argument("--work", type=Path, required=True, help="task_loop.py's --work (measure-N folders)")
    parser.add_argument("--accuracy", type=Path, required=True, help="task_loop.py's accuracy-table.csv")
    parser.add_argument("--lengths", type=int, nargs=2, default=(64, 128))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="write over --out's results.json and scores.md")
    arguments = parser.parse_args(argv)
    if (arguments.out / "results.json").exists() and not arguments.force:
        parser.error(f"--out {arguments.out}: holds results.json; allowed: a new folder, or --force to write over it")
    import torch
    from transformers import AutoModelForCausalLM

    from jaxroll.task import external, per_case
    from jaxroll.task.given import read_cases

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(arguments.model, attn_implementation="eager",
                                                 dtype=torch.float64)
    table = external.read_accuracy_table(arguments.accuracy)
    cases = [case for path in arguments.held_out for case in read_cases(path)]
    measured = {}
    for n in arguments.lengths:
        folder = arguments.work / f"measure-{n}"
        spans = per_case.read_measured_cases(folder, cases).spans
        rows = rows_of(model, folder)
        measured[n] = {v: per_case.MeasuredCases(str(folder), rows[v], spans) for v in VARIANTS}
        print(f"N = {n}: {len(spans)} prompts rolled out", file=sys.stderr)
    results = {}
    for v in VARIANTS:
        masses, _ = per_case.per_case_masses(table, {n: measured[n][v] for n in arguments.lengths})
        for fit in arguments.lengths:
            result = external.compare_accuracy_table(table, None, fit_settings=[f"L={fit}"], masses=masses,
                                                     source=f"per-case rows, {v}")
            summary = external.summary_of(result)
            results[f"{v}, fit L={fit}"] = {"scores": summary["scores"], "masses": masses.tolist()}
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (arguments.out / "scores.md").write_text(markdown(results, tuple(arguments.lengths)))
    print(markdown(results, tuple(arguments.lengths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
