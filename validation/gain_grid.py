"""How fine the gain grid must be: the gain tables read between grid gains against the per-sequence rows.

    PYTHONPATH=. python3 validation/gain_grid.py --model validation/models/wave6/llama-trained \
        --results validation/probability-shape-run/wave6llama-S48/results.json --samples 48 --work RUN \
        [--grid 0.25,0.5,1,2,4]          # default: attention_gains' own grid, 2^(k/2) for k = -3..4

For the first S held-out sequences at N = 128 (the probability-shape run's), the eager float64 rows of every
layer are tabulated at the grid's gains as `attention_gains` does (``softmax(g log alpha)``, averaged over
sequences and heads, with the closed form's path weights), read at each change's row gains linearly in ln g
(as `jaxroll.kernel_types.GainTableKernel` does), and rolled out with the closed-ratio layer; printed beside
the measured middle-mass change and the exact closed ratio on the rows (the run's results.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402
import probability_shape as ps  # noqa: E402

from jaxroll.measure.registry import GAIN_GRID  # noqa: E402


def tables(alpha, grid):
    """``(rows, weights)`` (G, L, N, N): the rows at each gain and their path weights, means over S and H."""
    hidden = alpha == 0
    logs = np.where(hidden, -np.inf, np.log(np.where(hidden, 1.0, alpha)))
    rows, weights = [], []
    for gain in grid:
        x = gain * logs
        a = np.exp(x - x.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        rows.append(a.mean((1, 2)))
        weights.append(ps.closed_form(a))
    return np.stack(rows), np.stack(weights)


def read(table, grid, gains):
    """`table` (G, L, N, N) read at row gains (N,), linear in ln g; clamped at the grid's ends."""
    logs, n = np.log(grid), gains.shape[0]
    k = np.clip(np.searchsorted(logs, np.log(np.maximum(gains, 1e-12))) - 1, 0, len(grid) - 2)
    w = np.clip((np.log(np.maximum(gains, 1e-12)) - logs[k]) / (logs[k + 1] - logs[k]), 0, 1)
    rows = np.arange(n)
    out = (1 - w)[:, None, None] * table[k, :, rows, :] + w[:, None, None] * table[k + 1, :, rows, :]
    return np.transpose(out, (1, 0, 2))


def predict(rows, weights, grid, lambdas, rho, gains):
    one = list(grid).index(1.0)
    kernel, moved = read(rows, grid, gains), read(weights, grid, gains)
    layers = []
    for t, lam in enumerate(lambdas):
        base = weights[one, t]
        shape = rows[one, t] * np.where(base > 0, moved[t] / np.where(base > 0, base, 1), 1)
        shape /= shape.sum(-1, keepdims=True)
        k = kernel[t] / kernel[t].sum(-1, keepdims=True)
        layers.append(ps.layer_of(lam, (1 - rho[t]) * k + rho[t] * gains[:, None] * shape))
    return ps.roll(lambdas, np.stack(layers))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True, help="probability_shape.py's results.json")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--grid", default=None, help="comma-separated gains (default: GAIN_GRID)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = json.loads(args.results.read_text())
    base = ps.baseline(args.model, args.model.parent / "held_out.jsonl", args.work, args.samples, 128)
    model = pipeline.load_float64(args.model)
    alpha = ps.attention_rows(model, torch.as_tensor(base["token_ids"], dtype=torch.long))
    grid = np.array(GAIN_GRID if args.grid is None else [float(g) for g in args.grid.split(",")])
    rows, weights = tables(alpha, grid)
    rho, lambdas, n = np.asarray(results["rho"]), base["lambdas"], alpha.shape[-1]
    unchanged = predict(rows, weights, grid, lambdas, rho, np.ones(n))
    print("| change | measured | closed ratio, exact rows | gain table |\n|---|---:|---:|---:|")
    for spec, (kind, value) in ps.CHANGES.items():
        profile = predict(rows, weights, grid, lambdas, rho, ps.gains(kind, value, n))
        row = results["changes"][spec]
        print(f"| `{spec}` | {row['measured']:+.4f} | {row['closed ratio']:+.4f} | "
              f"{ps.middle_mass(profile) - ps.middle_mass(unchanged):+.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
