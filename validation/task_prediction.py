"""The per-case parts of the loop's prediction step (validation/task_loop.py, step 3), and its diagnostics.

The compare-task runs themselves stay in task_loop.py (each a ``jaxroll``
command); this module holds what is computed beside them from the same
measurements: the span masses of the mean of the prompts' own rollout rows
(one profile per length), whether a prompt's own row singles out its gold
record, the per-case figure titled with the model, and the table of scores
that docs/task.md, "What the rollout predicts", reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import train_task  # the task's structure tokens (OPEN, CLOSE)


def brief(summary: dict) -> dict:
    """compare-task's summary without its rows: the link, the scores and the rows' span masses."""
    return {"link": summary["link"], "scores": summary["scores"],
            "masses": [row["mass"] for row in summary["rows"]]}


def held_out_union(files, lengths, refuse) -> list[dict]:
    """The held-out cases of `files` (one per length, or several lengths a file) at `lengths`, in the files'
    order; `refuse(message)` (the parser's error: exit 2) when a length has no case or two files share one."""
    rows, seen = [], {}
    for path in files:
        if not Path(path).is_file():
            refuse(f"--held-out {path}: no such file; allowed: train_task.py's held-out cases (JSON lines)")
        found = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        for length in sorted({r["length"] for r in found} & set(lengths)):
            if length in seen:
                refuse(f"--held-out {path}: cases at N = {length}, also in {seen[length]}; allowed: one file a length")
            seen[length] = path
        rows += [r for r in found if r["length"] in lengths]
    missing = [n for n in lengths if n not in seen]
    if missing:
        refuse(f"--lengths {' '.join(map(str, lengths))}: no held-out case at N = {missing}; allowed: the lengths of "
               f"{', '.join(map(str, files))} ({', '.join(map(str, sorted(seen)))} among the asked)")
    return rows


def per_case_figure(table_path: Path, folders: dict, held_out: Path, path: Path, label: str, fit: int = 64) -> Path:
    """compare-task's per-case figure (link fitted at N = `fit`), titled with the model and the number of measured
    prompts a depth rather than the work folders."""
    from jaxroll.plot import plot_accuracy_table
    from jaxroll.task import external, per_case

    result = per_case.compare_per_case(external.read_accuracy_table(table_path), list(folders.values()), held_out,
                                       fit_settings=[f"L={fit}"])
    return plot_accuracy_table(path, result, level=external.LEVEL, title=(
        f"{label}: held-out accuracy by depth; each prompt's own rollout row over its gold record "
        f"({external._count_range(result.cases_per_row)} a depth), link fitted at N = {fit}"))


def mean_of_own_rollouts(table_path: Path, folders: dict, lengths) -> dict:
    """The link on the span masses of the mean of the measured prompts' own rollout rows (``sequence_rollout``,
    one profile per length: averaged after the rollout, not per depth), fitted on each length: what separates
    the per-case rollout from the order of averaging alone."""
    from jaxroll.task import external

    table = external.read_accuracy_table(table_path)
    profiles = {n: np.load(folders[n] / "measurement.npz")["sequence_rollout"] for n in lengths}
    masses = external.span_masses(table, profiles)
    return {f"mean of own rollouts, fit L={fit}": brief(external.summary_of(external.compare_accuracy_table(
        table, None, fit_settings=[f"L={fit}"], masses=masses, source="mean of per-sequence rollouts")))
        for fit in lengths}


def gold_among_records(folders: dict, held_out: Path, lengths) -> dict:
    """Does a prompt's own row single out its gold record among the prompt's whole records (``OPEN ... CLOSE``)?

    Per length and row kind (each prompt's own rollout row, its measured influence): the median over the measured
    prompts of (the gold record's span mass) / (the mean span mass of the prompt's other whole records), and the
    share of prompts whose gold record has the largest span mass of all its records (chance: 1 / records)."""
    cases = {tuple(r["prompt_ids"]): r for r in (json.loads(line) for line in held_out.read_text().splitlines()
                                                  if line.strip())}
    found = {}
    for n in lengths:
        arrays = np.load(folders[n] / "measurement.npz")
        for key in ("sequence_rollout_per_sequence", "influence_per_sequence"):
            ratios, top, records = [], [], []
            for row, ids in zip(arrays[key], arrays["token_ids"].tolist()):
                case = cases[tuple(ids)]
                start, size = case["record_start"], case["record_end"] - case["record_start"]
                starts = [i for i in range(n - size + 1) if ids[i] == train_task.OPEN
                          and ids[i + size - 1] == train_task.CLOSE]
                masses = np.array([row[i:i + size].sum() for i in starts])
                gold = starts.index(start)
                ratios.append(masses[gold] / np.delete(masses, gold).mean())
                top.append(bool(masses[gold] >= masses.max()))
                records.append(len(starts))
            found[f"N={n}, {key}"] = {"median_gold_over_others": float(np.median(ratios)),
                                      "gold_largest_share": float(np.mean(top)),
                                      "chance": float(np.mean([1 / k for k in records])), "prompts": len(ratios)}
    return found


ROUTES = {"rollout, mean kernel": ("prediction", ""),
          "rollout, mean of own rows": ("prediction", "mean of own rollouts, "),
          "rollout, per case": ("prediction", "per case, "),
          "measured, per case": ("measured bound", "per case, "),
          "measured, mean profile": ("measured bound", "mean profile, ")}
"""The table's rows: (results' section, key prefix) of each route."""


def prediction_table(results: dict, lengths) -> str:
    """The prediction's scores as docs/task.md's table: Spearman [95 %] and error (a constant's), both ways."""
    def cell(score):
        low, high = score["spearman_interval"]
        return f"{score['spearman']:.2f} [{low:.2f}, {high:.2f}]; {score['rmse']:.3f} ({score['rmse_constant']:.3f})"

    lines = ["| span mass from | link fitted on | in sample: Spearman [95 %]; error (constant) | "
             "held out: Spearman [95 %]; error (constant) |", "|---|---|---|---|"]
    for name, (section, prefix) in ROUTES.items():
        for fit in lengths:
            scores = results[section][f"{prefix}fit L={fit}"]["scores"]
            lines.append(f"| {name} | N = {fit} | {cell(scores['fitted'])} | {cell(scores['held out'])} |")
    return "\n".join(lines) + "\n"


def joint_bootstrap(table_path: Path, folders: dict, held_out: Path, lengths, resamples: int = 2000,
                    seed: int = 0) -> dict:
    """Spearman of (per-case span mass, accuracy) within each length, with an interval that also resamples the
    measured prompts (compare-task's resamples the accuracy alone, the masses held fixed).

    Per length N and row kind k (`jaxroll.task.per_case.ROWS`), over the table's rows r at N (R_N of them), with
    ``m_s`` a measured prompt's own row summed over its gold span and ``S_r`` the prompts of row r's span:

        x*_r = mean of |S_r| draws of m_s, s in S_r (with replacement),   y*_r ~ Binomial(n_r, y_r) / n_r,
        rho* = Spearman(x*, y*) over the R_N rows;   interval: the 2.5 and 97.5 % quantiles of 2,000 rho*.

    Returns ``{"k, N=n": {"spearman", "interval" (both resampled), "interval_accuracy_only" (x* = x)}}``.
    """
    from jaxroll.task import external, given, per_case

    table = external.read_accuracy_table(table_path)
    cases = given.read_cases(Path(held_out))
    rng = np.random.default_rng(seed)
    found = {}
    for kind in per_case.ROWS:
        for n in lengths:
            measured = per_case.read_measured_cases(folders[n], cases, rows=kind)
            own, spans = measured.span_masses(), measured.spans
            rows = np.flatnonzero(table.lengths == n)
            groups = [own[(spans[:, 0] == table.starts[r]) & (spans[:, 1] == table.ends[r])] for r in rows]
            y, k = table.accuracy[rows], table.n_cases[rows].astype(np.int64)
            x = np.array([g.mean() for g in groups])
            accuracy = rng.binomial(k, y, size=(resamples, len(rows))) / k
            masses = np.stack([rng.choice(g, size=(resamples, len(g))).mean(axis=1) for g in groups], axis=1)
            quantiles = lambda rhos: [float(v) for v in np.nanquantile(rhos, [0.025, 0.975])]  # noqa: E731
            found[f"{kind}, N={n}"] = {
                "spearman": external.spearman(x, y), "prompts_per_row": [len(g) for g in groups],
                "interval": quantiles([external.spearman(a, b) for a, b in zip(masses, accuracy)]),
                "interval_accuracy_only": quantiles([external.spearman(x, b) for b in accuracy])}
    return found


def joint_table(found: dict) -> str:
    """`joint_bootstrap` as a Markdown table: Spearman within each length and its two intervals."""
    lines = ["| span mass from | N | Spearman | 95 %, accuracy resampled | 95 %, prompts and accuracy resampled |",
             "|---|---|---|---|---|"]
    names = {"sequence_rollout": "rollout, per case", "influence": "measured, per case"}
    for key, score in found.items():
        kind, n = key.split(", N=")
        (a, b), (c, d) = score["interval_accuracy_only"], score["interval"]
        lines.append(f"| {names[kind]} | {n} | {score['spearman']:.2f} | [{a:.2f}, {b:.2f}] | [{c:.2f}, {d:.2f}] |")
    return "\n".join(lines) + "\n"
