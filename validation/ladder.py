"""The ladder of rollout refinements, scored against measured influence with its noise.

For one model: the refinement ingredients (`jaxroll.measure.refinements`,
sums kept for the even- and odd-indexed sequences separately) and the
per-sequence gradient influence ``(S, N)`` give

- the profile of every rung: the residual-aware rollout on the measured
  head-averaged attention (``base``), each refinement of
  `jaxroll.theory.refinements.SWITCHES` alone, and the best combination (lowest
  in-sample W1 among all compatible combinations of two or more switches);
- every rung's `jaxroll.measure.uncertainty.score` against the
  measurement: W1 / noise of the mean (about 1 for a perfect prediction)
  with its interval and the p-value of H0 "the sequences were drawn around
  this rung's profile"; W1/(N-1), Spearman and KL(measured || predicted),
  each with its bias-corrected estimate and seeded bootstrap interval over
  sequences (the prediction held fixed);
- out of sample: ingredients measured on the even sequences scored against
  the odd sequences' influence and vice versa (the mean of the two), for
  every rung (the best combination is chosen in-sample).
"""

from __future__ import annotations

import itertools

import numpy as np

from jaxroll.measure import uncertainty

RUNGS_ALONE = ("position", "mlp", "norm", "heads", "gradient")
LABELS = {(): "base: measured lambda_t and kernels", ("position",): "+ per-position lambda_t(i)",
          ("mlp",): "+ MLP counted as identity", ("norm",): "+ norm-weighted kernels",
          ("heads",): "+ heads weighted by output norm", ("gradient",): "+ lambda_t from the backward pass"}
METRICS = ("wasserstein", "spearman", "kl")
_SCORE_NAMES = {"wasserstein": "w1", "spearman": "spearman", "kl": "kl"}


def normalise(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return rows / rows.sum(axis=-1, keepdims=True)


def means(ingredients, groups=None) -> dict:
    """Ingredient means over `groups`, plus ``lambdas (T,)``: the per-position lambdas' mean (the measured lambda_t)."""
    out = ingredients.mean(groups)
    out["lambdas"] = out["lambda_positions"].mean(axis=-1)
    return out


def profiles(mean_ingredients: dict, combinations) -> dict[tuple, np.ndarray]:
    """The refined-rollout profile of each switch combination (a tuple of switch names)."""
    from jaxroll.theory import refinements

    return {combo: np.asarray(refinements.refined_influence(refinements.compose(mean_ingredients, combo)))
            for combo in combinations}


def all_combinations(switches=RUNGS_ALONE):
    """Every subset of `switches` that `jaxroll.theory.refinements.compatible` allows, smallest first."""
    from jaxroll.theory import refinements

    return [combo for size in range(len(switches) + 1) for combo in itertools.combinations(switches, size)
            if refinements.compatible(combo)]


def label(combo: tuple) -> str:
    return LABELS.get(combo, "+ " + " + ".join(combo))


def _plain(predicted, measured):
    return {"wasserstein": float(uncertainty.wasserstein(predicted, measured)),
            "spearman": float(uncertainty.spearman(predicted, measured)),
            "kl": float(uncertainty.kl(measured, predicted))}


def run_ladder(ingredients, per_sequence: np.ndarray, *, boots: int = 1000, seed: int = 0,
               switches=RUNGS_ALONE) -> dict:
    """The ladder of one model (see the module docstring).

    `ingredients`: a `RefinementIngredients` with groups 0 (even-indexed
    sequences) and 1 (odd) holding every switch of `switches`;
    `per_sequence`: gradient influence ``(S, N)`` (raw norms) of the same
    sequences in the same order. `boots`, `seed`: of `uncertainty.score`
    (the same seed for every rung, so every rung sees the same resamples
    and the same noise).
    """
    per_sequence = np.asarray(per_sequence, dtype=np.float64)
    s = per_sequence.shape[0]
    # The measured profile exactly as `uncertainty.score` forms it, so the W1 of every combination
    # equals the W1 the rungs report.
    measured = uncertainty.profile_from_rows(np.ones((1, s)), per_sequence)[0]
    combos = all_combinations(switches)
    inside = profiles(means(ingredients), combos)
    all_w1 = {combo: float(uncertainty.wasserstein(p, measured)) for combo, p in inside.items()}
    multi = [combo for combo in combos if len(combo) >= 2]
    best = min(multi, key=all_w1.get) if multi else None
    rungs = [(), *[(item,) for item in switches]] + ([best] if best else [])

    groups = np.arange(s) % 2
    even, odd = (normalise(per_sequence[groups == g].mean(0)) for g in (0, 1))
    from_even, from_odd = profiles(means(ingredients, 0), rungs), profiles(means(ingredients, 1), rungs)

    rows, noise = {}, None
    for combo in rungs:
        name = "best combination: " + " + ".join(combo) if combo == best else label(combo)
        result = uncertainty.score(inside[combo], per_sequence, B=boots, seed=seed)
        forward, backward = _plain(from_even[combo], odd), _plain(from_odd[combo], even)
        rows[name] = {"switches": list(combo), "profile": inside[combo].tolist(),
                      **{metric: float(getattr(result, _SCORE_NAMES[metric])) for metric in METRICS},
                      "interval": {metric: list(getattr(result, _SCORE_NAMES[metric] + "_interval"))
                                   for metric in METRICS},
                      "bias_corrected": {metric: getattr(result, _SCORE_NAMES[metric] + "_bias_corrected")
                                         for metric in METRICS},
                      "ratio": result.ratio, "ratio_interval": list(result.ratio_interval),
                      "p_value": result.p_value,
                      "out_of_sample": {metric: (forward[metric] + backward[metric]) / 2 for metric in METRICS}}
        noise = {"median": result.noise, "q95": result.noise_q95, "n_eff": result.n_eff}
    low, high = uncertainty.profile_band(per_sequence, resamples=boots, seed=seed)
    return {"rows": rows, "noise": noise, "all_combinations_w1": {"+".join(c) or "base": w for c, w in all_w1.items()},
            "measured": measured.tolist(), "band": {"low": low.tolist(), "high": high.tolist()},
            "num_sequences": s, "boots": boots, "seed": seed}


def markdown(ladders: dict, *, metric: str = "wasserstein") -> str:
    """One table per metric: rungs down, models across.

    ``metric="ratio"``: cells ``W1 / noise [interval], p = ...``, then the
    noise of the mean and the effective number of sequences; otherwise
    cells ``score [interval]; out of sample``.
    """
    names = list(ladders)
    title = {"ratio": "W1 / noise of the mean, about 1 for a perfect prediction [95 % interval], one-sided p-value "
                      "of 'the sequences were drawn around this profile'",
             "wasserstein": "W1/(N-1), lower is better", "spearman": "Spearman, higher is better",
             "kl": "KL(measured || predicted), nats, lower is better"}[metric]
    fmt = (lambda v: f"{v:+.3f}") if metric == "spearman" else (lambda v: f"{v:.4f}")
    note = "" if metric == "ratio" else " (in-sample [95 % bootstrap interval]; out of sample)"
    lines = [f"**{title}**{note}", "", "| rung | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    generic = {}
    for name in names:
        for rung, row in ladders[name]["rows"].items():
            key = "best combination" if rung.startswith("best") else rung
            generic.setdefault(key, {})[name] = row
    for key, cells in generic.items():
        out = []
        for name in names:
            row = cells.get(name)
            if row is None:
                out.append("")
                continue
            extra = f" ({'+'.join(row['switches'])})" if key == "best combination" else ""
            if metric == "ratio":
                low, high = row["ratio_interval"]
                out.append(f"{row['ratio']:.2f} [{low:.2f}, {high:.2f}], p = {row['p_value']:.3f}{extra}")
                continue
            low, high = row["interval"][metric]
            out.append(f"{fmt(row[metric])} [{fmt(low)}, {fmt(high)}]; {fmt(row['out_of_sample'][metric])}{extra}")
        lines.append(f"| {key} | " + " | ".join(out) + " |")
    if metric == "ratio":
        lines.append("| noise of the mean: median W1(m*, m) [95 % quantile] | " + " | ".join(
            f"{ladders[n]['noise']['median']:.4f} [{ladders[n]['noise']['q95']:.4f}]" for n in names) + " |")
        lines.append("| effective sequences n_eff / S | " + " | ".join(
            f"{ladders[n]['noise']['n_eff']:.1f} / {ladders[n]['num_sequences']}" for n in names) + " |")
    return "\n".join(lines) + "\n"


def plot(name: str, ladder: dict, path, *, extra: dict | None = None):
    """Measured profile with its bootstrap band, and every rung, on a log scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    measured = np.asarray(ladder["measured"])
    positions = np.arange(measured.size)
    figure = Figure(figsize=(9.0, 3.8), layout="constrained")
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    axis.fill_between(positions, ladder["band"]["low"], ladder["band"]["high"], color="0.75",
                      label="measured, 95 % bootstrap band")
    axis.plot(positions, measured, color="black", linewidth=1.8, label="measured influence")
    for colour, (rung, row) in enumerate(ladder["rows"].items()):
        axis.plot(positions, row["profile"], linewidth=1.0, color=f"C{colour}",
                  label=f"{rung} (W1 {row['wasserstein']:.4f}, {row['ratio']:.1f}x noise, p {row['p_value']:.2g})")
    for colour, (rung, profile) in enumerate((extra or {}).items(), start=len(ladder["rows"])):
        axis.plot(positions, profile, linewidth=1.0, linestyle="--", color=f"C{colour}", label=rung)
    noise = ladder["noise"]["median"]
    axis.set_yscale("log")
    axis.set_ylim(max(1e-6, float(np.min(ladder["band"]["low"])) / 30), 1.5)
    axis.set_title(f"{name}: refined rollouts vs measured influence "
                   f"(S = {ladder['num_sequences']}, noise of the mean W1 {noise:.4f})", fontsize=9)
    axis.set_xlabel("input position j", fontsize=8)
    axis.set_ylabel("influence on the last position", fontsize=8)
    axis.tick_params(labelsize=7)
    axis.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.savefig(path, dpi=100)
    return path


def replot(results_json, folder) -> list:
    """Redraw every model's ladder figure (``ladder-<model>.png`` in `folder`) from a run's ``results.json``."""
    import json
    from pathlib import Path

    summary = json.loads(Path(results_json).read_text())
    paths = []
    for name, result in summary["results"].items():
        extra = {"residual, no content (structural)": result["profiles"]["residual, no content"],
                 "fitted lambdas (in-sample)": result["profiles"]["fitted lambdas"]}
        paths.append(plot(name, result["ladder"], Path(folder) / f"ladder-{name}.png", extra=extra))
    return paths
