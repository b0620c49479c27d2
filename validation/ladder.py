"""The ladder of rollout refinements, scored against measured influence with its noise.

For one model: the refinement ingredients (`jaxroll.measure.refinements`,
sums kept for the even- and odd-indexed sequences separately) and the
per-sequence gradient influence ``(S, N)`` give

- the profile of every rung: the residual-aware rollout on the measured
  head-averaged attention (``base``), each refinement of
  `jaxroll.refinements.SWITCHES` alone, and the best combination (lowest
  in-sample W1 among all combinations of two or more switches);
- W1/(N-1), Spearman and KL(measured || predicted) of each rung against the
  measured mean profile, with a bootstrap interval: the sequences resampled
  with replacement `boots` times, the rung's score against each resample's
  mean profile, the 2.5 and 97.5 percentiles (the prediction is held fixed:
  the interval is the measurement's noise in the score);
- the random-split floor: `splits` random halvings of the sequences, the
  score of one half's mean profile against the other's; its median is what
  "the measurement's own noise" means in the ratios;
- out of sample: ingredients measured on the even sequences scored against
  the odd sequences' influence and vice versa (the mean of the two), for
  every rung (the best combination is chosen in-sample).

Plain NumPy bootstrap (the measurement helper's uncertainty module may
replace it).
"""

from __future__ import annotations

import itertools

import numpy as np

RUNGS_ALONE = ("position", "mlp", "norm", "heads")
LABELS = {(): "base: measured lambda_t and kernels", ("position",): "+ per-position lambda_t(i)",
          ("mlp",): "+ MLP counted as identity", ("norm",): "+ norm-weighted kernels",
          ("heads",): "+ heads weighted by output norm"}


def _metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, np.ndarray]:
    """W1/(N-1), Spearman, KL(measured || predicted); batched over leading axes (jaxroll.metrics)."""
    import jax.numpy as jnp
    from jaxroll import metrics

    p, q = jnp.asarray(predicted), jnp.asarray(measured)
    return {"wasserstein": np.asarray(metrics.wasserstein(p, q)), "spearman": np.asarray(metrics.spearman(p, q)),
            "kl": np.asarray(metrics.kl(q, p))}


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
    from jaxroll import refinements

    return {combo: np.asarray(refinements.refined_influence(refinements.compose(mean_ingredients, combo)))
            for combo in combinations}


def all_combinations():
    return [combo for size in range(len(RUNGS_ALONE) + 1) for combo in itertools.combinations(RUNGS_ALONE, size)]


def label(combo: tuple) -> str:
    return LABELS.get(combo, "+ " + " + ".join(combo))


def bootstrap_indices(num_sequences: int, boots: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_sequences, (boots, num_sequences))


def random_split_floor(per_sequence: np.ndarray, splits: int = 200, seed: int = 1) -> dict:
    """Scores between the mean profiles of two random halves of the sequences, over `splits` halvings.

    Returns per metric the median and the 2.5 / 97.5 percentiles, and the raw values.
    """
    generator = np.random.default_rng(seed)
    s = per_sequence.shape[0]
    halves_a, halves_b = [], []
    for _ in range(splits):
        order = generator.permutation(s)
        halves_a.append(per_sequence[order[: s // 2]].mean(0))
        halves_b.append(per_sequence[order[s // 2: 2 * (s // 2)]].mean(0))
    values = _metrics(normalise(np.stack(halves_a)), normalise(np.stack(halves_b)))
    return {metric: {"median": float(np.median(v)), "low": float(np.percentile(v, 2.5)),
                     "high": float(np.percentile(v, 97.5))} for metric, v in values.items()}


def run_ladder(ingredients, per_sequence: np.ndarray, *, boots: int = 200, splits: int = 200, seed: int = 0) -> dict:
    """The ladder of one model (see the module docstring).

    `ingredients`: a `RefinementIngredients` with groups 0 (even-indexed
    sequences) and 1 (odd); `per_sequence`: gradient influence ``(S, N)``
    (raw norms) of the same sequences in the same order.
    """
    per_sequence = np.asarray(per_sequence, dtype=np.float64)
    s = per_sequence.shape[0]
    measured = normalise(per_sequence.mean(0))
    combos = all_combinations()
    inside = profiles(means(ingredients), combos)
    in_sample = {combo: _metrics(p, measured) for combo, p in inside.items()}
    multi = [combo for combo in combos if len(combo) >= 2]
    best = min(multi, key=lambda combo: float(in_sample[combo]["wasserstein"]))
    rungs = [(), *[(item,) for item in RUNGS_ALONE], best]

    index = bootstrap_indices(s, boots, seed)
    resampled = normalise(per_sequence[index].mean(axis=1))  # (boots, N)
    band = {"low": np.percentile(resampled, 2.5, axis=0), "high": np.percentile(resampled, 97.5, axis=0)}

    # Out of sample: even -> odd and odd -> even.
    groups = np.arange(s) % 2
    even, odd = (normalise(per_sequence[groups == g].mean(0)) for g in (0, 1))
    from_even, from_odd = profiles(means(ingredients, 0), rungs), profiles(means(ingredients, 1), rungs)

    rows = {}
    for combo in rungs:
        name = "best combination: " + " + ".join(combo) if combo == best else label(combo)
        boot = _metrics(np.broadcast_to(inside[combo], resampled.shape), resampled)
        forward, backward = _metrics(from_even[combo], odd), _metrics(from_odd[combo], even)
        oos = {metric: float((forward[metric] + backward[metric]) / 2) for metric in forward}
        rows[name] = {"switches": list(combo), "profile": inside[combo].tolist(),
                      **{metric: float(in_sample[combo][metric]) for metric in ("wasserstein", "spearman", "kl")},
                      "interval": {metric: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
                                   for metric, v in boot.items()},
                      "out_of_sample": oos}
    all_w1 = {"+".join(combo) or "base": float(in_sample[combo]["wasserstein"]) for combo in combos}
    floor = random_split_floor(per_sequence, splits, seed + 1)
    return {"rows": rows, "floor": floor, "all_combinations_w1": all_w1, "measured": measured.tolist(),
            "band": {key: value.tolist() for key, value in band.items()}, "num_sequences": s,
            "boots": boots, "splits": splits}


def markdown(ladders: dict, *, metric: str = "wasserstein") -> str:
    """One table per metric: rungs down, models across; cells ``score [interval]`` and the floor."""
    names = list(ladders)
    title = {"wasserstein": "W1/(N-1), lower is better", "spearman": "Spearman, higher is better",
             "kl": "KL(measured || predicted), nats, lower is better"}[metric]
    fmt = (lambda v: f"{v:+.3f}") if metric == "spearman" else (lambda v: f"{v:.4f}")
    rung_names = list(dict.fromkeys(r for name in names for r in ladders[name]["rows"]))
    lines = [f"**{title}** (in-sample [95 % bootstrap interval]; out of sample)", "",
             "| rung | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
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
            low, high = row["interval"][metric]
            extra = f" ({'+'.join(row['switches'])})" if key == "best combination" else ""
            out.append(f"{fmt(row[metric])} [{fmt(low)}, {fmt(high)}]; {fmt(row['out_of_sample'][metric])}{extra}")
        lines.append(f"| {key} | " + " | ".join(out) + " |")
    floors = [f"{fmt(ladders[n]['floor'][metric]['median'])} [{fmt(ladders[n]['floor'][metric]['low'])}, "
              f"{fmt(ladders[n]['floor'][metric]['high'])}]" for n in names]
    lines.append("| random-split floor, median [2.5, 97.5 %] | " + " | ".join(floors) + " |")
    if metric == "wasserstein":
        ratios = []
        for name in names:
            best = min(row["wasserstein"] for row in ladders[name]["rows"].values())
            ratios.append(f"{best / ladders[name]['floor']['wasserstein']['median']:.1f}x")
        lines.append("| best rung / median floor | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def plot(name: str, ladder: dict, path, *, extra: dict | None = None):
    """Measured profile with its bootstrap band, and every rung, on a log scale."""
    from jaxroll.plot import plt

    measured = np.asarray(ladder["measured"])
    positions = np.arange(measured.size)
    figure, axis = plt.subplots(figsize=(9.0, 3.8), constrained_layout=True)
    axis.fill_between(positions, ladder["band"]["low"], ladder["band"]["high"], color="0.75",
                      label="measured, 95 % bootstrap band")
    axis.plot(positions, measured, color="black", linewidth=1.8, label="measured influence")
    for colour, (rung, row) in enumerate(ladder["rows"].items()):
        axis.plot(positions, row["profile"], linewidth=1.0, color=f"C{colour}",
                  label=f"{rung} (W1 {row['wasserstein']:.4f})")
    for colour, (rung, profile) in enumerate((extra or {}).items(), start=len(ladder["rows"])):
        axis.plot(positions, profile, linewidth=1.0, linestyle="--", color=f"C{colour}", label=rung)
    floor = ladder["floor"]["wasserstein"]["median"]
    axis.set_yscale("log")
    axis.set_ylim(max(1e-6, float(np.min(ladder["band"]["low"])) / 30), 1.5)
    axis.set_title(f"{name}: refined rollouts vs measured influence "
                   f"(S = {ladder['num_sequences']}, floor W1 {floor:.4f})", fontsize=9)
    axis.set_xlabel("input position j", fontsize=8)
    axis.set_ylabel("influence on the last position", fontsize=8)
    axis.tick_params(labelsize=7)
    axis.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.savefig(path, dpi=100)
    plt.close(figure)
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
