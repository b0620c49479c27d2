"""Is the probability path A-shaped? Its measured row shape, the first-order truth, and candidate layers (issue 53).

    nice python3 validation/probability_shape.py --model DIR --texts held_out.jsonl --out RUN [--samples 16]

For one model (float64, eager attention), S held-out sequences of N tokens, the last query i = N - 1:

1. **Shapes at the target row**, per layer t: the mean attention row
   ``A_t(i, :) = mean_{s,h} alpha^s_{t,h}(i, :)``; the measured probability
   and value paths' local influence ``L^prob_t(i, j)``, ``L^value_t(i, j)``
   (`jaxroll.measure.paths.layer_paths`, exact, the block alone), each over
   its row sum; and the closed form of orthogonal equal-norm values,
   ``C(i, j) = mean_{s,h} A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)``
   (per head and sequence before averaging), over its sum. Reported: the
   middle mass of each shape (fraction 0.1), its mass on key 0 and on the
   last 10 %, and total variation distances.
2. **The first-order truth**: the measured influence profile's middle mass
   under tau = 1 / beta, beta = 1 +- 0.05 (jaxroll's torch patch), and its
   central difference ``d middle / d beta`` at beta = 1; with the measured
   changes under tau = 0.7, 1.5 and SSMax 0.3 (the issue's rows).
3. **Candidate layers**, dense, each from the per-sequence rows changed by the
   logit map (tau: ``log alpha / tau``; SSMax: ``s ln(i + 1) log alpha``), with
   the measured lambda_t, the share ``rho_t = r_t / (1 + r_t)``
   (``r_t = sum_j L^prob / sum_j L^value`` at the target row) and the gain
   ``sigma(i)`` (``1 / tau``; ``s ln(i + 1)``):

   - ``today``: ``R = (1 - lambda) I + lambda mean(alpha')``;
   - ``A-shaped`` (the engine's extended layer):
     ``B_i = (1 - rho + rho sigma_i) K'_i``, ``R_i = ((1 - lambda) e_i + lambda B_i) / (1 - lambda + lambda W_i)``;
   - ``closed shape``: ``B_i = (1 - rho) K'_i + rho sigma_i C'_i / |C'_i|`` (the path's shape, its size as today's);
   - ``closed shape+size``: ``B_i = (1 - rho) K'_i + rho sigma_i C'_i / |C_i|`` (its size moving with the rows' spread);
   - ``closed ratio``: ``B_i = (1 - rho) K'_i + rho sigma_i P_i / |P_i|``, ``P = K * C' / C`` (A's shape moved
     by the closed form's change: today's layer exactly at no change); ``closed ratio (engine)`` the same through
     `jaxroll.engine.probability.with_path_shape` of `moved_shape` and `jaxroll.influence` (a check);
   - ``measured shape``: row i's path shape the measured target row's by offset
     (``P_t(i - j)``), moved by ``C'/C`` under the change, sized as closed shape+size;
   - ``mean: ...``: today's, the A-shaped and the closed-shape layers with the change applied to the mean kernel
     ``mean_{s,h} alpha`` (the engine's route for a measured dense kernel) and the closed form of that mean;
   - ``today, patched rows (and lambdas)``: today's layer on the patched model's own mean rows (and its own
     lambdas, ``jaxroll measure --intervene X --stats lambda``): whether later layers' changed q, k explain a miss.

   ``W_i = sum_j B_i(j)``. Predicted middle-mass change = the candidate's
   profile under the change minus its own unchanged profile.

Writes ``results.json`` (and ``shape.npz``, ``influence_rows.npz``) into ``--out``. ``--candidates-only``
recomputes the candidates of an earlier run (its measured columns kept); ``--table RUN...`` prints the Markdown
table of runs (a sign mark where the measured 95 % interval excludes 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.engine.probability import moved_shape, with_path_shape  # noqa: E402
from jaxroll.model import RolloutModel  # noqa: E402
from jaxroll.cli import main as cli  # noqa: E402
from jaxroll.measure import patching  # noqa: E402
from jaxroll.measure.effect import middle_mass  # noqa: E402
from jaxroll.measure.paths import layer_paths  # noqa: E402

CHANGES = {"beta=0.95": ("tau", 1 / 0.95), "beta=1.05": ("tau", 1 / 1.05), "tau=0.7": ("tau", 0.7),
           "tau=1.5": ("tau", 1.5), "ssmax_scale=0.3": ("ssmax", 0.3),
           "ssmax_scale=0.5": ("ssmax", 0.5)}


def baseline(model_dir: Path, texts: Path, out: Path, samples: int, length: int, spec: str | None = None) -> dict:
    """``jaxroll measure --stats lambda`` (float64, under `spec` if given): the measured lambdas and the token ids."""
    target = out / ("baseline" if spec is None else f"lambda-{spec}")
    if not (target / "measurement.npz").is_file():
        code = cli(["measure", str(model_dir), "--texts", str(texts), "--length", str(length), "--samples",
                    str(samples), "--dtype", "float64", "--stats", "lambda", "--out", str(target), "--quiet",
                    "--force"] + ([] if spec is None else ["--intervene", spec]))
        if code:
            raise RuntimeError(f"measure exit {code}")
    with np.load(target / "measurement.npz") as archive:
        return {"lambdas": np.asarray(archive["lambdas"], dtype=np.float64), "token_ids": archive["token_ids"]}


def influence_profile(model, ids: torch.Tensor, changes) -> np.ndarray:
    """``sum_s ||d f_s / d e_j|| / sum``: f the top next-token probability at the last position (as measured)."""
    def rows():
        out = []
        for start in range(0, ids.shape[0], 8):
            embeds = model.get_input_embeddings()(ids[start:start + 8]).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeds).logits[:, -1]
            top = torch.softmax(logits, -1).max(-1).values.sum()
            (grad,) = torch.autograd.grad(top, embeds)
            out.append(grad.norm(dim=-1).numpy())
        return np.concatenate(out)

    if changes:
        with patching.patch(model, changes):
            per_sequence = rows()
    else:
        per_sequence = rows()
    return per_sequence  # (S, N)


def attention_rows(model, ids: torch.Tensor, changes=()) -> np.ndarray:
    """``alpha (L, S, H, N, N)`` float64, the eager attention probabilities (of the patched model under `changes`)."""
    with torch.no_grad(), (patching.patch(model, list(changes)) if changes else _nothing()):
        out = model(input_ids=ids, output_attentions=True)
    return np.stack([a.double().numpy() for a in out.attentions])


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def pooled(rows, normalised: bool):
    """The profile ``sum_s rows / sum`` (as measured), or the mean of each sequence's row over its own sum."""
    if normalised:
        rows = rows / rows.sum(-1, keepdims=True)
    return rows.sum(0) / rows.sum()


def middle_change(rows, rows0, draws: int = 2000, seed: int = 0, normalised: bool = False) -> list:
    """Middle mass of `pooled` rows minus the baseline's, and its paired 95 % bootstrap over sequences."""
    def change(index):
        return middle_mass(pooled(rows[index], normalised)) - middle_mass(pooled(rows0[index], normalised))

    generator = np.random.default_rng(seed)
    count = len(rows)
    spread = [change(generator.integers(0, count, count)) for _ in range(draws)]
    return [float(change(np.arange(count))), float(np.quantile(spread, 0.025)), float(np.quantile(spread, 0.975))]


def changed(alpha: np.ndarray, kind: str, value: float) -> np.ndarray:
    """Rows under the logit map: tau ``log alpha / tau``; SSMax ``s ln(i + 1) log alpha`` (rotary: no bias)."""
    n = alpha.shape[-1]
    hidden = alpha == 0
    logits = np.log(np.where(hidden, 1.0, alpha))
    factor = (1.0 / value) * np.ones(n) if kind == "tau" else value * np.log(np.arange(1, n + 1))
    logits = np.where(hidden, -np.inf, logits * factor[:, None])
    logits -= logits.max(-1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(-1, keepdims=True)


def gains(kind: str, value: float, n: int) -> np.ndarray:
    """``sigma(i)``: the logits' derivative factor relative to the measured setting."""
    return np.full(n, 1.0 / value) if kind == "tau" else value * np.log(np.arange(1, n + 1))


def closed_form(alpha: np.ndarray) -> np.ndarray:
    """``mean_{s,h} A_ij sqrt(1 - 2 A_ij + sum_k A_ik^2)`` (orthogonal equal-norm values), per layer ``(L, N, N)``."""
    square = (alpha ** 2).sum(-1, keepdims=True)
    return (alpha * np.sqrt(np.clip(1.0 - 2.0 * alpha + square, 0.0, None))).mean(axis=(1, 2))


def roll(lambdas, layers) -> np.ndarray:
    """``e_{N-1}^T R_T ... R_1`` over its sum, ``layers (L, N, N)`` the row-stochastic ``R_t``."""
    row = np.zeros(layers.shape[-1])
    row[-1] = 1.0
    for layer in layers[::-1]:
        row = row @ layer
    return row / row.sum()


def layer_of(lam, branch) -> np.ndarray:
    """``R_i = ((1 - lambda) e_i + lambda B_i) / (1 - lambda + lambda W_i)``, ``W_i = sum_j B_i(j)``."""
    n = branch.shape[-1]
    total = branch.sum(-1)
    return ((1.0 - lam) * np.eye(n) + lam * branch) / (1.0 - lam + lam * total)[:, None]


def offset_shape(row: np.ndarray) -> np.ndarray:
    """Row i's shape ``P(i - j)`` (j <= i) from the target row ``P(N - 1 - j)``, each row over its sum."""
    n = row.shape[-1]
    by_offset = row[::-1]  # by_offset[d] = P(N - 1 - d)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    shape = np.where(j <= i, by_offset[np.clip(i - j, 0, n - 1)], 0.0)
    return shape / shape.sum(-1, keepdims=True)


def candidates(alpha, lambdas, rho, measured_rows, kind=None, value=None) -> dict:
    """Each candidate's profile, unchanged (kind None) or under the change."""
    n = alpha.shape[-1]
    rows = alpha if kind is None else changed(alpha, kind, value)
    sigma = np.ones(n) if kind is None else gains(kind, value, n)
    mean, mean0 = rows.mean(axis=(1, 2)), alpha.mean(axis=(1, 2))
    closed, closed0 = closed_form(rows), closed_form(alpha)
    closed[:, 0, 0] = closed0[:, 0, 0] = 1.0  # row 0 sees one key: its path is 0, its shape that key
    out = {}
    for name in ("today", "A-shaped", "closed shape", "closed shape+size", "closed ratio", "measured shape"):
        layers = []
        for t, lam in enumerate(lambdas):
            prob_weight = rho[t] * sigma[:, None]
            if name == "today":
                branch = mean[t]
            elif name == "A-shaped":
                branch = (1.0 - rho[t] + prob_weight) * mean[t]
            elif name == "closed shape":
                branch = (1.0 - rho[t]) * mean[t] + prob_weight * closed[t] / closed[t].sum(-1, keepdims=True)
            elif name == "closed ratio":  # A's shape moved by C'/C: today's layer at the measured setting
                moved = mean0[t] * closed[t] / np.where(closed0[t] > 0, closed0[t], 1.0)
                branch = (1.0 - rho[t]) * mean[t] + prob_weight * moved / moved.sum(-1, keepdims=True)
            elif name == "closed shape+size":
                size = np.where(closed0[t].sum(-1) > 0, closed0[t].sum(-1), 1.0)
                branch = (1.0 - rho[t]) * mean[t] + prob_weight * closed[t] / size[:, None]
            else:
                ratio = np.where(closed0[t] > 0, closed[t] / np.where(closed0[t] > 0, closed0[t], 1.0), 1.0)
                branch = (1.0 - rho[t]) * mean[t] + prob_weight * offset_shape(measured_rows[t]) * ratio
            layers.append(layer_of(lam, branch))
        out[name] = roll(lambdas, np.stack(layers))
    out["closed ratio (engine)"] = engine_profile(mean0, mean, closed0, closed, lambdas, rho, sigma)
    return out | mean_candidates(alpha.mean(axis=(1, 2)), lambdas, rho, kind, value)


def engine_profile(mean0, mean, closed0, closed, lambdas, rho, sigma) -> np.ndarray:
    """The "closed ratio" candidate through the engine: `with_path_shape` of `moved_shape`, `jaxroll.influence`."""
    shape = moved_shape(mean0, closed0, closed)
    kernel = with_path_shape(mean, shape, rho, np.broadcast_to(sigma, (len(lambdas), len(sigma))))
    model = RolloutModel.create(kernel=kernel, lambdas=np.clip(lambdas, 0.0, 1.0), sequence_length=mean.shape[-1])
    return np.asarray(jaxroll.influence(model), dtype=np.float64)


def mean_candidates(mean0, lambdas, rho, kind=None, value=None) -> dict:
    """The engine's route on a dense measured kernel: the change acts on the mean kernel ``mean_{s,h} alpha``
    (tempering the mean), and the closed form is taken of the (changed) mean kernel as one head."""
    n = mean0.shape[-1]
    mean = mean0 if kind is None else changed(mean0[:, None, None], kind, value)[:, 0, 0]
    sigma = np.ones(n) if kind is None else gains(kind, value, n)
    closed = closed_form(mean[:, None, None])
    closed[:, 0, 0] = 1.0
    out = {}
    for name in ("mean: today", "mean: A-shaped", "mean: closed shape"):
        layers = []
        for t, lam in enumerate(lambdas):
            prob_weight = rho[t] * sigma[:, None]
            if name == "mean: today":
                branch = mean[t]
            elif name == "mean: A-shaped":
                branch = (1.0 - rho[t] + prob_weight) * mean[t]
            else:
                branch = (1.0 - rho[t]) * mean[t] + prob_weight * closed[t] / closed[t].sum(-1, keepdims=True)
            layers.append(layer_of(lam, branch))
        out[name] = roll(lambdas, np.stack(layers))
    return out


def shape_table(alpha, prob, value, rho) -> list[dict]:
    """Per layer, at the target row: A's, the probability and value paths' and the closed form's row shapes
    (`shape_stats`) and their total variation distances."""
    closed = closed_form(alpha)[:, -1]
    shapes = []
    for t in range(len(prob)):
        a_row = alpha[t].mean(axis=(0, 1))[-1]
        rows = {"A": a_row, "probability": prob[t] / prob[t].sum(), "value": value[t] / value[t].sum(),
                "closed": closed[t] / closed[t].sum()}
        entry = {name: shape_stats(row) for name, row in rows.items()}
        entry["tv(prob, A)"] = float(0.5 * np.abs(rows["probability"] - a_row).sum())
        entry["tv(prob, closed)"] = float(0.5 * np.abs(rows["probability"] - rows["closed"]).sum())
        entry["tv(value, A)"] = float(0.5 * np.abs(rows["value"] - a_row).sum())
        entry["rho"] = float(rho[t])
        shapes.append(entry)
    return shapes


def shape_stats(row: np.ndarray) -> dict:
    """Middle mass, key 0's mass and the last 10 %'s, of a row over its sum."""
    row = row / row.sum()
    k = max(1, round(0.1 * len(row)))
    return {"middle": float(middle_mass(row)), "first": float(row[0]), "last10": float(row[-k:].sum())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--texts", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--table", type=Path, nargs="*", help="print the Markdown table of these runs and stop")
    parser.add_argument("--candidates-only", action="store_true",
                        help="recompute the candidates' columns of an earlier run's results.json (its measured kept)")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(args.table))
        return 0
    torch.set_num_threads(1)
    if args.candidates_only:
        return refresh(args)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    base = baseline(args.model, args.texts, args.out, args.samples, args.length)
    model = pipeline.load_float64(args.model)
    ids = torch.as_tensor(base["token_ids"], dtype=torch.long)
    alpha = attention_rows(model, ids).astype(np.float64)  # (L, S, H, N, N)
    paths = layer_paths(model, base["token_ids"])
    prob, value = paths.probability[:, 0], paths.value[:, 0]  # (L, N) at the last query
    rho = prob.sum(-1) / value.sum(-1)
    rho = rho / (1.0 + rho)
    shapes = shape_table(alpha, prob, value, rho)
    print(f"# shapes done {time.time() - start:.0f} s", flush=True)
    measured_shape = prob / prob.sum(-1, keepdims=True)
    np.savez(args.out / "shape.npz", probability=measured_shape, value=value, A=alpha.mean(axis=(1, 2))[:, -1])
    rows0 = influence_profile(model, ids, [])
    profile0 = rows0.sum(0) / rows0.sum()
    predicted0 = candidates(alpha, base["lambdas"], rho, measured_shape)
    rows, intervals, per_sequence = {}, {}, {}
    for spec, (kind, value) in CHANGES.items():
        text = f"tau={value!r}" if kind == "tau" else spec
        changes = interventions.parse(text)
        per_sequence[spec] = influence_profile(model, ids, changes)
        intervals[spec] = middle_change(per_sequence[spec], rows0)
        predicted = candidates(alpha, base["lambdas"], rho, measured_shape, kind, value)
        rows[spec] = {"measured": intervals[spec][0]}
        rows[spec] |= {name: float(middle_mass(p) - middle_mass(predicted0[name])) for name, p in predicted.items()}
        # the split: today's layer on the patched model's own rows, with its lambdas as measured, then with both
        true_rows = attention_rows(model, ids, changes).mean(axis=(1, 2))
        true_lambdas = baseline(args.model, args.texts, args.out, args.samples, args.length, text)["lambdas"]
        plain = lambda lams, kernels: roll(lams, np.stack([layer_of(l, k) for l, k in zip(lams, kernels)]))
        rows[spec]["today, patched rows"] = float(middle_mass(plain(base["lambdas"], true_rows))
                                                  - middle_mass(predicted0["today"]))
        rows[spec]["today, patched rows and lambdas"] = float(middle_mass(plain(true_lambdas, true_rows))
                                                              - middle_mass(predicted0["today"]))
        rows[spec]["interval"] = intervals[spec]
        # each sequence's row over its own sum: a change of which sequences weigh most in the pooled profile
        rows[spec]["measured, rows normalised"] = middle_change(per_sequence[spec], rows0, normalised=True)
        print(spec, json.dumps(rows[spec]), flush=True)
    derivative = {name: (rows["beta=1.05"][name] - rows["beta=0.95"][name]) / 0.1 for name in rows["beta=1.05"]
                  if name not in ("interval", "measured, rows normalised")}
    derivative["measured interval"] = [x / 0.1 for x in middle_change(per_sequence["beta=1.05"],
                                                                      per_sequence["beta=0.95"])]
    result = {"model": str(args.model), "samples": args.samples, "length": args.length,
              "lambdas": base["lambdas"].tolist(), "rho": rho.tolist(), "shapes": shapes, "changes": rows,
              "d_middle_d_beta": derivative, "baseline_middle": {"measured": float(middle_mass(profile0))}
              | {name: float(middle_mass(p)) for name, p in predicted0.items()},
              "wall_s": time.time() - start}
    np.savez_compressed(args.out / "influence_rows.npz", baseline=rows0, **per_sequence)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({"d_middle_d_beta": derivative, "baseline_middle": result["baseline_middle"],
                      "wall_s": result["wall_s"]}, indent=1))
    for t, entry in enumerate(shapes):
        print(t, json.dumps(entry))
    return 0


COLUMNS = ("today", "A-shaped", "closed shape", "closed ratio", "measured shape", "mean: today", "mean: A-shaped",
           "mean: closed shape", "today, patched rows", "today, patched rows and lambdas")


def markdown(runs: list[Path]) -> str:
    """One row per model and change: the measured middle-mass change [95 %] and each candidate's prediction,
    a sign mark where the measured interval excludes 0."""
    head = "| model | change | measured [95 %] | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for run in runs:
        result = json.loads((run / "results.json").read_text())
        model = Path(result["model"])
        name = f"{model.parent.name} {model.name.split('-')[0]} (S = {result['samples']})"
        for spec, row in result["changes"].items():
            low, high = row["interval"][1:]
            significant = low > 0 or high < 0
            cells = []
            for column in COLUMNS:
                value = row.get(column)
                right = value is not None and np.sign(value) == np.sign(row["measured"])
                mark = "" if value is None or not significant else (" ok" if right else " WRONG")
                cells.append("-" if value is None else f"{value:+.4f}{mark}")
            measured = f"{row['measured']:+.4f} [{low:+.4f}, {high:+.4f}]"
            lines.append(f"| {name} | `{spec}` | {measured} | " + " | ".join(cells) + " |")
        derivative = result["d_middle_d_beta"]
        low, high = derivative["measured interval"][1:]
        cells = [f"{derivative[c]:+.3f}" if c in derivative else "-" for c in COLUMNS]
        lines.append(f"| {name} | d middle / d beta at 1 | {derivative['measured']:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def refresh(args) -> int:
    """The candidates of an earlier run recomputed from its rho, lambdas and token ids (a forward pass)."""
    result = json.loads((args.out / "results.json").read_text())
    base = baseline(args.model, args.texts, args.out, args.samples, args.length)
    alpha = attention_rows(pipeline.load_float64(args.model), torch.as_tensor(base["token_ids"], dtype=torch.long))
    rho, lambdas = np.asarray(result["rho"]), base["lambdas"]
    keep = set()
    if (args.out / "shape.npz").is_file():
        with np.load(args.out / "shape.npz") as archive:
            measured_shape = archive["probability"]
    else:  # a run before shape.npz: its measured-shape column kept as it was
        measured_shape, keep = alpha.mean(axis=(1, 2))[:, -1], {"measured shape"}
    predicted0 = {k: v for k, v in candidates(alpha, lambdas, rho, measured_shape).items() if k not in keep}
    for spec, (kind, value) in CHANGES.items():
        if spec not in result["changes"]:
            continue
        predicted = candidates(alpha, lambdas, rho, measured_shape, kind, value)
        result["changes"][spec] |= {name: float(middle_mass(p) - middle_mass(predicted0[name]))
                                    for name, p in predicted.items() if name not in keep}
        print(spec, json.dumps(result["changes"][spec]), flush=True)
    up, down = result["changes"]["beta=1.05"], result["changes"]["beta=0.95"]
    result["d_middle_d_beta"] |= {name: (up[name] - down[name]) / 0.1 for name in predicted0}
    result["baseline_middle"] |= {name: float(middle_mass(p)) for name, p in predicted0.items()}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
