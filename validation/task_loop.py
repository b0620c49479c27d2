"""The loop at task level on the task-U Llama (issue 54, item 3): measure, predict accuracy by depth, design, apply.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice python3 validation/task_loop.py --out validation/task-u-run/loop \
        --work /tmp/task-loop

The model is validation/models/task-u/llama-step2500 (the recipe run to its
end; step 1,500 was chosen on monitor cases), its cases the 4,400 held-out
cases there (N = 64 and 128, depth fractions 0, 0.1, .., 1, 200 each).
Every step is a jaxroll command, run in this process as a user would type it:

1. ``jaxroll task MODEL --cases held_out.jsonl``: accuracy by depth (the
   accuracy table, ``accuracy-table.csv``);
2. ``jaxroll measure MODEL --texts prompts-N.jsonl`` (token ids, no
   tokenizer) at N = 64 and 128 on ``--samples`` held-out prompts per length
   (the first samples of every depth), float64: influence and the default
   ingredients, config.yaml, plus ``sequence_rollout`` (each prompt's own
   rollout row);
3. ``jaxroll compare-task --accuracy accuracy-table.csv --measured M64
   --measured M128 --fit-settings L=64`` (and ``L=128``): the rollout's span
   mass -> the link fitted on one length, tested on the other; the same with
   ``--per-case held_out.jsonl``: each row's mean, over the measured prompts
   of its depth, of their own rollout row (``sequence_rollout_per_sequence``)
   over their gold span, and (``--per-case-rows influence``) of their own
   measured influence (the bound on what one profile per length could rank);
   and the mean measured profile's span mass (`jaxroll.task.external` with
   ``masses``). ``--only-predict`` stops here (it may take other ``--lengths``, e.g. 128 160 for
   the ALiBi model, with ``--held-out`` files holding them);
4. ``jaxroll design M64/config.yaml --goal ... --kl-budget`` for a declared
   list of candidates (`CANDIDATES`), each applied with ``jaxroll task
   --cases selection.jsonl --intervene`` on *selection* cases (a separate
   seed, 3, never the held-out cases); the candidate with the largest
   middle-depth gain there is "the designed change";
5. the designed change and the literature's (4 sink tokens, SSMax at s =
   0.43, Ms-PoE with ratios 1.2-1.8 ordered by its head statistics) applied
   to the held-out cases: accuracy by depth with 95 % bootstrap intervals,
   the middle (depth fractions 0.4-0.6) gain with a paired bootstrap
   interval, and the held-out losses (the answer's cross-entropy, the
   training objective; next-token loss over every position of the held-out
   sequences);
6. doses of the designed lever (gamma) and of sink tokens on the selection
   cases: middle gain against answer-loss change (`DOSES`), the comparison
   at equal loss cost.

Writes into ``--out``: ``accuracy-table.csv``, ``predict-*/`` (compare-task's
files), ``per-case-*/`` (the per-case rollout), ``bound-*/``, ``designs.json``, ``design.png`` (the chosen design's
profiles), ``interventions.yaml`` (the chosen design), ``mspoe.yaml``,
``results.json``, ``prediction.md`` (the prediction's scores), ``prediction-joint.md`` (the per-case Spearman's
interval with the measured prompts resampled too), ``table.md``, ``accuracy-by-depth.png``,
``doses.png``. Intermediate
measurements and scored cases go to ``--work``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "validation"))
import task_prediction  # noqa: E402  (the per-case and diagnostic parts of step 3)
import train_task  # noqa: E402  (the task's case builder: selection cases with their own seed)

from jaxroll.cli import main as cli  # noqa: E402

MODELS = ROOT / "validation" / "models" / "task-u"
MODEL = MODELS / "llama-step2500"
HELD_OUT = MODELS / "held_out.jsonl"
LENGTHS = (64, 128)
DEPTHS = train_task.DEPTHS
MIDDLE = train_task.MIDDLE
SELECTION_SEED = 3
"""Seed of the selection cases (held-out cases: 1, the training monitor: 2)."""
BUDGET = 0.05
CANDIDATES = {
    "joint, middle mass": ["--free", "tau=global,kappa=global,gamma=global", "--bounds", "gamma=0.5:1.5",
                           "--goal", "middle_mass", "--kl-budget", BUDGET],
    "joint, U-index": ["--free", "tau=global,kappa=global,gamma=global", "--bounds", "gamma=0.5:1.5",
                       "--goal", "u_index", "--kl-budget", BUDGET],
    "tau alone": ["--free", "tau=global", "--goal", "middle_mass", "--kl-budget", BUDGET],
    "kappa alone": ["--free", "kappa=global", "--goal", "middle_mass", "--kl-budget", BUDGET],
    "gamma alone": ["--free", "gamma=global", "--bounds", "gamma=0.5:1.5", "--goal", "middle_mass"],
    "target, middle spans x2": ["--free", "tau=global,kappa=global,gamma=global", "--bounds", "gamma=0.5:1.5",
                                "--target", "TARGET", "--loss", "kl"],
}
"""The designs tried: `jaxroll design` arguments on the N = 64 measurement. The first five were declared before
any was scored; the last (TARGET: `middle_target`) was added after all five lowered the middle on the selection
cases (docs/task.md says so)."""
BAND_GAIN = 2.0
"""The target design's factor on the rollout's mass over the middle records' spans."""
SSMAX_SCALE = 0.43
"""SSMax's s in Nakanishi (2025, arXiv 2501.19399), Figure 1."""
MSPOE = (1.2, 1.8)
"""Ms-PoE's ratio range (VITA-Group/Ms-PoE defaults, min_ratio and max_ratio)."""


def run(*argv) -> str:
    """``jaxroll ARGV`` in this process; its stdout returned, an error raised."""
    with contextlib.redirect_stdout(io.StringIO()) as captured:
        code = cli([str(a) for a in argv])
    if code != 0:
        raise RuntimeError(f"jaxroll {' '.join(map(str, argv))}: exit {code}\n{captured.getvalue()}")
    return captured.getvalue()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def prepare(work: Path, samples_per_depth: int, selection: int) -> dict:
    """The measured prompts (the first `samples_per_depth` held-out cases of every depth, per length, depth
    varying fastest) and the selection cases (`SELECTION_SEED`, `selection` per depth and length)."""
    held = read_jsonl(HELD_OUT)
    files = {}
    for length in LENGTHS:
        chosen = sorted((r for r in held if r["length"] == length and r["sample"] < samples_per_depth),
                        key=lambda r: (r["sample"], r["depth_fraction"]))
        files[length] = write_jsonl(work / f"prompts-{length}.jsonl", ({"prompt_ids": r["prompt_ids"]}
                                                                      for r in chosen))
    prompt = held[0]["prompt_ids"]  # ends [QUERY, key, ARROW]: the key's tokens lie between the two
    layout = train_task.Layout(key_tokens=len(prompt) - 2 - prompt.index(train_task.QUERY),
                               value_tokens=len(held[0]["answer_ids"]))
    cases = train_task.grid(layout, LENGTHS, DEPTHS, selection, SELECTION_SEED)
    files["selection"] = write_jsonl(work / "selection.jsonl", (
        {"prompt_ids": c["prompt_ids"], "answer_ids": c["answer_ids"], "depth": c["depth"],
         "record_length": c["record_length"], "depth_fraction": c["depth_fraction"], "sample": c["sample"],
         "seed": c["seed"]} for c in cases))
    return files


def score(cases: Path, out: Path, intervene: str | None = None) -> list[dict]:
    """``jaxroll task MODEL --cases FILE [--intervene X]``: the scored rows (cases.jsonl), in the file's order."""
    if not (out / "cases.jsonl").is_file():
        run("task", MODEL, "--cases", cases, "--out", out, "--batch-size", 200, "--quiet", "--force",
            *(["--intervene", intervene] if intervene else []))
    return read_jsonl(out / "cases.jsonl")


def accuracy_table(rows: list[dict], path: Path) -> Path:
    """The held-out accuracy by (length, depth) as compare-task's table: the gold record's span, 200 cases a row."""
    name = MODEL.relative_to(ROOT) if MODEL.is_relative_to(ROOT) else MODEL
    lines = [f"# {name} on its {len(rows):,} held-out cases (jaxroll task --cases), exact match of the one answer "
             "token", "setting,length,start,end,accuracy,n_cases"]
    for length in LENGTHS:
        for fraction in DEPTHS:
            cell = [r for r in rows if r["length"] == length and r["depth_fraction"] == fraction]
            start = cell[0]["depth"]
            lines.append(f"L={length},{length},{start},{start + cell[0]['record_length']},"
                         f"{np.mean([r['exact'] for r in cell]):.6g},{len(cell)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(files: dict, work: Path, samples: int) -> dict:
    """``jaxroll measure`` on the held-out prompts at each length (token ids, float64): the default statistics
    (the rollout's ingredients, config.yaml) plus ``sequence_rollout`` (each prompt's own rollout row)."""
    from jaxroll.measure import default_stats
    from jaxroll.measure.families import FAMILIES

    config = json.loads((MODEL / "config.json").read_text())
    folders = {}
    for length in LENGTHS:
        folders[length] = work / f"measure-{length}"
        stats = default_stats(FAMILIES[config["model_type"]].position, length, config.get("num_hidden_layers",
                                                                                           config.get("n_layer")))
        done = folders[length] / "measurement.npz"
        if not done.is_file() or "sequence_rollout_per_sequence" not in np.load(done).files:
            run("measure", MODEL, "--texts", files[length], "--length", length, "--samples", samples,
                "--dtype", "float64", "--stats", ",".join((*stats, "sequence_rollout")), "--out", folders[length],
                "--quiet", "--force")
    return folders


def measured(folders: dict) -> list:
    """compare-task's ``--measured`` arguments: one folder per length, in `LENGTHS` order."""
    return [item for n in LENGTHS for item in ("--measured", folders[n])]


def predict(table: Path, folders: dict, out: Path) -> dict:
    """``jaxroll compare-task --accuracy`` on the rollout of each length's measurement (one profile per length),
    and with ``--per-case``: each measured prompt's own rollout row over its own gold span; fitted on each length."""
    found = {}
    for fit in LENGTHS:
        text = run("compare-task", "--accuracy", table, *measured(folders),
                   "--fit-settings", f"L={fit}", "--out", out / f"predict-fit{fit}", "--force", "--float64", "--json")
        found[f"fit L={fit}"] = task_prediction.brief(json.loads(text))
        text = run("compare-task", "--accuracy", table, *measured(folders),
                   "--per-case", HELD_OUT, "--fit-settings", f"L={fit}", "--out", out / f"per-case-fit{fit}",
                   "--force", "--json")
        found[f"per case, fit L={fit}"] = task_prediction.brief(json.loads(text))
    found.update(task_prediction.mean_of_own_rollouts(table, folders, LENGTHS))
    task_prediction.per_case_figure(table, folders, HELD_OUT, out / "per-case.png", model_label(), fit=LENGTHS[0])
    return found


def bound(table_path: Path, folders: dict, out: Path) -> dict:
    """The link on the measured influence's span masses, fitted on each length and tested on the other: per case
    (``compare-task --per-case --per-case-rows influence``: each row's mean over the measured prompts of its depth
    of their own influence summed over the gold span) and of the mean measured profile."""
    from jaxroll.task import external

    found = {}
    for fit in LENGTHS:
        text = run("compare-task", "--accuracy", table_path, *measured(folders),
                   "--per-case", HELD_OUT, "--per-case-rows", "influence", "--fit-settings", f"L={fit}",
                   "--out", out / f"bound-fit{fit}", "--force", "--json")
        found[f"per case, fit L={fit}"] = task_prediction.brief(json.loads(text))
    table = external.read_accuracy_table(table_path)
    profiles = {n: np.load(folders[n] / "measurement.npz")["influence"] for n in LENGTHS}
    for fit in LENGTHS:
        result = external.compare_accuracy_table(table, None, fit_settings=[f"L={fit}"],
                                                 masses=external.span_masses(table, profiles),
                                                 source="measured influence (mean profile)")
        found[f"mean profile, fit L={fit}"] = task_prediction.brief(external.summary_of(result))
    return found


def middle_target(folders: dict, work: Path, base_rows: list[dict]) -> Path:
    """A target profile at N = 64: the rollout's own profile with the positions of the middle records' spans
    (depth fractions `MIDDLE`) multiplied by `BAND_GAIN`, renormalised (token_position,probability)."""
    text = run("rollout", folders[64] / "config.yaml", "--float64", "--out", work / "rollout-64", "--force")
    del text
    profile = np.loadtxt(work / "rollout-64" / "profile.csv", delimiter=",", skiprows=1)[:, 1]
    band = np.zeros(64, dtype=bool)
    for r in base_rows:
        if r["length"] == 64 and r["depth_fraction"] in MIDDLE:
            band[r["depth"]: r["depth"] + r["record_length"]] = True
    target = np.where(band, BAND_GAIN * profile, profile)
    target /= target.sum()
    path = work / "target-middle.csv"
    path.write_text("token_position,probability\n" + "".join(f"{j},{v:.17g}\n" for j, v in enumerate(target)))
    return path


def design(folders: dict, work: Path, files: dict, base_selection: list[dict], log, target: Path) -> dict:
    """Each candidate designed through the rollout (N = 64 measurement), scored on the selection cases."""
    found = {}
    for name, arguments in CANDIDATES.items():
        arguments = [target if item == "TARGET" else item for item in arguments]
        slug = name.replace(", ", "-").replace(" ", "-").lower()
        folder = work / f"design-{slug}"
        if not (folder / "design.json").is_file():
            run("design", folders[64] / "config.yaml", *arguments, "--float64", "--out", folder, "--force")
        summary = json.loads((folder / "design.json").read_text())
        profiles = np.loadtxt(folder / "profiles.csv", delimiter=",", skiprows=1)
        spans = [(r["depth"], r["depth"] + r["record_length"]) for r in base_selection
                 if r["length"] == 64 and r["depth_fraction"] in MIDDLE and r["sample"] == 0]
        rows = score(files["selection"], work / f"select-{slug}", str(folder / "interventions.yaml"))
        selection = middle_change(base_selection, rows)
        gains = {n: selection[n]["gain"] for n in LENGTHS}
        found[name] = {"folder": str(folder), "record": yaml.safe_load((folder / "interventions.yaml").read_text()),
                       "design": {k: summary.get(k) for k in ("middle_mass", "u_index", "kl", "converged")
                                  if k in summary},
                       "rollout_middle_span_masses": [[float(profiles[a:b, col].sum()) for a, b in spans]
                                                      for col in (1, 2)],
                       "selection_middle": selection, "selection_middle_gain": gains, "selection_gain_mean": float(np.mean(list(gains.values())))}
        log(f"  design {name:20s} {found[name]['record']}  selection middle gain "
            + ", ".join(f"N={n}: {g:+.3f}" for n, g in gains.items()))
    return found


def mspoe_spec(path: Path) -> Path:
    """Ms-PoE's per-layer, per-head ratios as its code sets them: heads ordered by their outlier share on the
    first input (the first held-out case), ``jaxroll.interventions.ms_poe_order`` and ``ms_poe_ratios``."""
    import transformers

    from jaxroll.interventions import ms_poe_order, ms_poe_ratios

    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64).eval()
    config, captured = model.config, {}
    heads, groups = config.num_attention_heads, config.num_key_value_heads
    hooks = [getattr(layer.self_attn, name).register_forward_hook(
        lambda _m, _i, output, key=(t, name): captured.__setitem__(key, output.detach()))
        for t, layer in enumerate(model.model.layers) for name in ("q_proj", "k_proj")]
    first = read_jsonl(HELD_OUT)[0]["prompt_ids"]
    with torch.no_grad():
        model(input_ids=torch.tensor([first]))
    for hook in hooks:
        hook.remove()
    ratios = []
    for t in range(config.num_hidden_layers):
        q = captured[(t, "q_proj")][0].reshape(len(first), heads, -1).transpose(0, 1).numpy()
        k = captured[(t, "k_proj")][0].reshape(len(first), groups, -1).transpose(0, 1).numpy()
        order = ms_poe_order(q, k)
        ratios.append(np.asarray(ms_poe_ratios(heads, *MSPOE, order=order), dtype=np.float64).round(6).tolist())
    path.write_text(yaml.safe_dump({"rotary_ratio": ratios}))
    return path


def losses(rows: list[dict], intervene: str | None) -> dict:
    """Held-out losses under a change: the answer's cross-entropy (the training objective, mean -logprob over
    the scored cases) and the next-token loss over every position of the held-out sequences (prompt + answer;
    sink tokens, if any, read but not scored), nats per token."""
    import transformers

    from jaxroll.measure.additions import sink_count
    from jaxroll.measure.patching import patch
    from jaxroll.measure.torch_plan import parse_for

    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    changes = parse_for(intervene, model.config)
    sinks = sink_count(changes)
    logit_changes = [c for c in changes if type(c).__name__ != "SinkTokens"]
    total, count = 0.0, 0
    held = read_jsonl(HELD_OUT)
    with patch(model, logit_changes) if logit_changes else contextlib.nullcontext(), torch.no_grad():
        for length in LENGTHS:
            ids = np.array([r["prompt_ids"] + r["answer_ids"] for r in held if r["length"] == length])
            inputs = np.concatenate([np.full((len(ids), sinks), model.config.bos_token_id), ids], axis=1)
            for start in range(0, len(ids), 200):
                batch = torch.as_tensor(inputs[start:start + 200])
                logits = model(input_ids=batch, use_cache=False).logits[:, sinks:-1].double()
                gold = torch.as_tensor(ids[start:start + 200, 1:])
                nll = -torch.log_softmax(logits, -1).gather(-1, gold[..., None])[..., 0]
                total, count = total + float(nll.sum()), count + nll.numel()
    return {"answer_loss": float(-np.mean([r["logprob"] for r in rows])), "next_token_loss": total / count}


def by_depth(rows: list[dict]) -> dict:
    """``{length: (exact (depths, cases) float array)}``, cases by sample index (paired across changes)."""
    return {n: np.array([[r["exact"] for r in sorted(rows, key=lambda r: r["sample"])
                          if r["length"] == n and r["depth_fraction"] == f] for f in DEPTHS], dtype=float)
            for n in LENGTHS}


def middle_change(before: list[dict], after: list[dict], resamples: int = 2000, seed: int = 0) -> dict:
    """Middle accuracy (mean over `MIDDLE` cells) before and after, per length, with 95 % bootstrap intervals:
    cases resampled within each depth, the same draws for both (paired: one case's before and after together)."""
    rng = np.random.default_rng(seed)
    rows = [DEPTHS.index(f) for f in MIDDLE]
    found = {}
    for n, (b, a) in {n: (by_depth(before)[n], by_depth(after)[n]) for n in LENGTHS}.items():
        b, a = b[rows], a[rows]
        draws = rng.integers(0, b.shape[1], size=(resamples, len(rows), b.shape[1]))
        pick = np.arange(len(rows))[None, :, None]
        boot_b, boot_a = b[pick, draws].mean(axis=(1, 2)), a[pick, draws].mean(axis=(1, 2))
        q = lambda x: [float(v) for v in np.quantile(x, [0.025, 0.975])]  # noqa: E731
        found[n] = {"before": float(b.mean()), "before_interval": q(boot_b), "after": float(a.mean()),
                    "after_interval": q(boot_a), "gain": float(a.mean() - b.mean()),
                    "gain_interval": q(boot_a - boot_b)}
        found[n]["beyond_interval"] = bool(found[n]["after"] > found[n]["before_interval"][1]
                                           and found[n]["gain_interval"][0] > 0)
    return found


def depth_curves(folder: Path) -> dict:
    """summary.csv of ``jaxroll task``: ``{length: (accuracy, low, high) arrays over DEPTHS}``."""
    import csv

    with open(folder / "summary.csv", newline="") as handle:
        cells = list(csv.DictReader(handle))
    return {n: np.array([[float(c[k]) for c in cells if int(c["length"]) == n] for k in
                         ("accuracy", "accuracy_low", "accuracy_high")]) for n in LENGTHS}


def model_label() -> str:
    """The model's name in figure titles: ``task-u/llama-step2500`` (its folder and parent)."""
    return f"{MODEL.parent.name}/{MODEL.name}"


def plot(curves: dict, path: Path, lengths=LENGTHS, title: str | None = None, top: float | None = None) -> Path:
    """Held-out exact match by depth, one panel per length, a line per change with its 95 % interval:
    ``curves[name][n] = (y, low, high)``; `title` (default: the model and the changes) above, y from 0 to `top`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(lengths), figsize=(12, 4.5), sharey=True)
    for ax, n in zip(axes, lengths):
        for i, (name, curve) in enumerate(curves.items()):
            y, low, high = curve[n]
            x = np.array(DEPTHS) + (i - len(curves) / 2) * 0.006
            ax.errorbar(x, y, yerr=[y - low, high - y], marker="o", ms=4, capsize=2, label=name,
                        lw=2.2 if i < 2 else 1.1, alpha=1 if i < 2 else 0.8)
        ax.axvspan(min(MIDDLE) - 0.05, max(MIDDLE) + 0.05, color="0.9", zorder=0)
        ax.axhline(1 / 56, color="0.5", ls=":", lw=1)
        ax.set(title=f"N = {n} (200 held-out cases per depth)", xlabel="depth fraction of the gold record",
               ylim=(0, top))
    axes[0].set_ylabel("exact match (95 % bootstrap interval)")
    axes[1].legend(fontsize=8, loc="upper center")
    fig.suptitle(title or f"{model_label()}: accuracy by depth before and after each change "
                 "(shaded: the middle, 0.4-0.6; dotted: chance 1/56)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def record_text(record) -> str:
    if isinstance(record, str):
        return record
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items())


def _selection_cell(selection) -> str:
    if not selection:
        return "-"
    return "; ".join(f"{m['gain']:+.3f} [{m['gain_interval'][0]:+.3f}, {m['gain_interval'][1]:+.3f}]"
                     for m in (selection.get(n, selection.get(str(n))) for n in LENGTHS))


def markdown(changes: dict) -> str:
    """The changes' table: middle accuracy before -> after per length, the paired gain's interval, the losses."""
    lines = ["| change | intervention | rollout, N = 64: middle records' span mass; accuracy by the link | "
             + " | ".join(f"middle accuracy N={n}: before -> after (gain [95 %])" for n in LENGTHS)
             + " | selection cases: middle gain N=64, N=128 [95 %] | held-out answer loss (nats) |",
             "|---|---|---|" + "---|" * len(LENGTHS) + "---|---:|"]
    for name, c in changes.items():
        mass = c.get("rollout_middle_span_mass")
        cells = []
        for n in LENGTHS:
            m = c["middle"][str(n)] if str(n) in c["middle"] else c["middle"][n]
            lo, hi = m["gain_interval"]
            cells.append(f"{m['before']:.3f} -> {m['after']:.3f} ({m['gain']:+.3f} [{lo:+.3f}, {hi:+.3f}])"
                         + (" **beyond**" if m["beyond_interval"] else ""))
        lines.append(f"| {name} | {record_text(c['record'])} | "
                     + ("-" if mass is None else f"{mass[0]:.4f} -> {mass[1]:.4f}; "
                        f"{c['rollout_middle_accuracy'][0]:.3f} -> {c['rollout_middle_accuracy'][1]:.3f}")
                     + " | " + " | ".join(cells)
                     + " | " + _selection_cell(c.get("selection_middle")) + f" | {c['loss']['answer_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def apply_all(work: Path, out: Path, designs: dict, chosen: str, base_rows: list[dict], files: dict, log) -> dict:
    """The chosen design, the other candidates and the literature's changes on the held-out cases (and the
    literature's on the selection cases too, where the designs were already scored)."""
    literature = {"4 sink tokens": "sinks=4", f"SSMax s = {SSMAX_SCALE}": f"ssmax_scale={SSMAX_SCALE}"}
    if json.loads((MODEL / "config.json").read_text())["model_type"] == "llama":  # Ms-PoE rescales rotary positions
        literature["Ms-PoE 1.2-1.8"] = str(mspoe_spec(out / "mspoe.yaml"))
    specs = {f"designed ({chosen})": (designs[chosen]["folder"] + "/interventions.yaml", designs[chosen])}
    specs.update({name: (spec, None) for name, spec in literature.items()})
    specs.update({f"candidate: {name}": (d["folder"] + "/interventions.yaml", d) for name, d in designs.items()
                  if name != chosen})
    changes = {"baseline": {"record": "-", "middle": middle_change(base_rows, base_rows), "selection_middle": None,
                            "loss": losses(base_rows, None), "curves": depth_curves(work / "task-baseline")}}
    for name, (spec, found) in specs.items():
        slug = "".join(ch if ch.isalnum() else "-" for ch in name.lower())
        rows = score(HELD_OUT, work / f"held-{slug}", spec)
        record = found["record"] if found else (yaml.safe_load(Path(spec).read_text()) if spec.endswith(".yaml")
                                                else spec)
        if found is None:
            chosen_rows = score(files["selection"], work / f"select-{slug}", spec)
            selection = middle_change(score(files["selection"], work / "select-baseline"), chosen_rows)
        else:
            selection = found["selection_middle"]
        changes[name] = {"record": record, "spec": spec, "middle": middle_change(base_rows, rows),
                         "selection_middle": selection,
                         "loss": losses(rows, spec), "curves": depth_curves(work / f"held-{slug}"),
                         "rollout_middle_span_mass": None if found is None else
                         [float(np.mean(m)) for m in found["rollout_middle_span_masses"]],
                         "rollout_middle_accuracy": None if found is None else found.get("rollout_middle_accuracy")}
        log(f"  {name:28s} middle " + ", ".join(
            f"N={n}: {m['before']:.3f} -> {m['after']:.3f} [{m['gain_interval'][0]:+.3f}, "
            f"{m['gain_interval'][1]:+.3f}]" for n, m in changes[name]["middle"].items())
            + f"; answer loss {changes[name]['loss']['answer_loss']:.3f}")
    return changes


DOSES = {"branch scale (the design's lever)": ["gamma=1.25", "gamma=1.5", "gamma=2"],
         "sink tokens": ["sinks=1", "sinks=2", "sinks=4", "sinks=8"]}
"""Doses of the designed lever and of the sink tokens, scored on the selection cases: gain against cost."""


def doses(work: Path, files: dict, log) -> dict:
    """Middle gain (selection cases, paired interval) and answer-loss change (selection cases) of each dose:
    the designed change and the literature's cheapest compared at equal loss cost."""
    base = score(files["selection"], work / "select-baseline")
    base_loss = float(-np.mean([r["logprob"] for r in base]))
    found = {}
    for family, specs in DOSES.items():
        for spec in specs:
            rows = score(files["selection"], work / f"dose-{spec.replace('=', '-')}", spec)
            found[spec] = {"family": family, "middle": middle_change(base, rows),
                           "answer_loss_change": float(-np.mean([r["logprob"] for r in rows])) - base_loss}
            log(f"  dose {spec:12s} answer loss {found[spec]['answer_loss_change']:+.3f}; middle "
                + ", ".join(f"N={n}: {m['gain']:+.3f}" for n, m in found[spec]["middle"].items()))
    return found


def plot_doses(found: dict, path: Path) -> Path:
    """Middle gain against answer-loss change, one panel per length, a line per family of doses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, n in zip(axes, LENGTHS):
        for family in DOSES:
            specs = [k for k, v in found.items() if v["family"] == family]
            x = [found[k]["answer_loss_change"] for k in specs]
            y = np.array([found[k]["middle"][n]["gain"] for k in specs])
            low = np.array([found[k]["middle"][n]["gain_interval"][0] for k in specs])
            high = np.array([found[k]["middle"][n]["gain_interval"][1] for k in specs])
            ax.errorbar(x, y, yerr=[y - low, high - y], marker="o", capsize=3, label=family)
            for xi, yi, k in zip(x, y, specs):
                ax.annotate(k, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(0, color="0.5", lw=1)
        ax.set(title=f"N = {n} (500 selection cases per depth)", xlabel="answer loss change (nats, selection cases)")
    axes[0].set_ylabel("middle accuracy gain, f = 0.4-0.6 (paired 95 % interval)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{model_label()}: middle gain against loss cost, doses of the designed lever and of sink tokens",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    global MODEL, HELD_OUT, LENGTHS  # every step reads these; another model (e.g. an ALiBi one) replaces them
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the small outputs (validation/task-u-run/loop)")
    parser.add_argument("--work", type=Path, required=True, help="measurements and scored cases")
    parser.add_argument("--samples-per-depth", type=int, default=10, help="measured prompts per depth and length")
    parser.add_argument("--model", type=Path, default=None, help="the model (default the task-U Llama, step 2,500)")
    parser.add_argument("--held-out", type=Path, nargs="+", default=None,
                        help="its held-out cases (train_task.py's); several files: their union (e.g. one per length)")
    parser.add_argument("--lengths", type=int, nargs=2, default=list(LENGTHS),
                        help="the two lengths measured and compared (default 64 128; others with --only-predict)")
    parser.add_argument("--selection", type=int, default=500, help="selection cases per depth and length")
    parser.add_argument("--only-predict", action="store_true",
                        help="stop after the prediction (steps 1-3: the table, the measurements, compare-task)")
    arguments = parser.parse_args(argv)
    MODEL = MODEL if arguments.model is None else arguments.model.resolve()
    held_files = [HELD_OUT] if arguments.held_out is None else [path.resolve() for path in arguments.held_out]
    if (tuple(arguments.lengths) != LENGTHS and not arguments.only_predict  # the designs read the N = 64 rollout
            or len(set(arguments.lengths)) < 2):
        parser.error(f"--lengths {' '.join(map(str, arguments.lengths))}: allowed: 64 128, or two other lengths "
                     "with --only-predict")
    held = None if len(held_files) == 1 and tuple(arguments.lengths) == LENGTHS else \
        task_prediction.held_out_union(held_files, arguments.lengths, parser.error)  # checked before --out is made
    LENGTHS = tuple(arguments.lengths)
    torch.set_num_threads(1)
    started = time.time()

    def log(text):
        print(f"[{time.time() - started:6.0f} s] {text}", flush=True)

    arguments.out.mkdir(parents=True, exist_ok=True)
    arguments.work.mkdir(parents=True, exist_ok=True)
    HELD_OUT = held_files[0] if held is None else write_jsonl(arguments.work / "held-out.jsonl", held)
    files = prepare(arguments.work, arguments.samples_per_depth, arguments.selection)
    base_rows = score(HELD_OUT, arguments.work / "task-baseline")
    table = accuracy_table(base_rows, arguments.out / "accuracy-table.csv")
    log("baseline scored; measuring")
    folders = measure(files, arguments.work, len(DEPTHS) * arguments.samples_per_depth)
    results = {"model": str(MODEL.relative_to(ROOT) if MODEL.is_relative_to(ROOT) else MODEL),
               "prediction": predict(table, folders, arguments.out),
               "measured bound": bound(table, folders, arguments.out),
               "gold among records": task_prediction.gold_among_records(folders, HELD_OUT, LENGTHS)}
    (arguments.out / "prediction.md").write_text(task_prediction.prediction_table(results, LENGTHS))
    results["joint bootstrap"] = task_prediction.joint_bootstrap(table, folders, HELD_OUT, LENGTHS)
    (arguments.out / "prediction-joint.md").write_text(task_prediction.joint_table(results["joint bootstrap"]))
    if arguments.only_predict:
        results["wall_seconds"] = time.time() - started
        (arguments.out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
        log("predicted; stopping (--only-predict)\n" + task_prediction.prediction_table(results, LENGTHS))
        return 0
    log("predicted; designing")
    base_selection = score(files["selection"], arguments.work / "select-baseline")
    target = middle_target(folders, arguments.work, base_rows)
    results["designs"] = design(folders, arguments.work, files, base_selection, log, target)
    link = results["prediction"]["fit L=64"]["link"]
    for found in results["designs"].values():  # the rollout's own forecast: span masses through the N = 64 link
        found["rollout_middle_accuracy"] = [float(np.mean(1 / (1 + np.exp(-(link["a"] + link["b"] * np.log(m))))))
                                            for m in found["rollout_middle_span_masses"]]
    chosen = max(results["designs"], key=lambda name: results["designs"][name]["selection_gain_mean"])
    results["chosen"] = chosen
    shutil.copy(Path(results["designs"][chosen]["folder"]) / "interventions.yaml", arguments.out / "interventions.yaml")
    shutil.copy(Path(results["designs"][chosen]["folder"]) / "design.png", arguments.out / "design.png")
    log(f"chosen on the selection cases: {chosen}; applying to the held-out cases")
    changes = apply_all(arguments.work, arguments.out, results["designs"], chosen, base_rows, files, log)
    plot({name: c["curves"] for name, c in changes.items() if not name.startswith("candidate")},
         arguments.out / "accuracy-by-depth.png")
    results["doses"] = doses(arguments.work, files, log)
    plot_doses(results["doses"], arguments.out / "doses.png")
    for c in changes.values():
        c["curves"] = {str(n): v.tolist() for n, v in c["curves"].items()}
    results["changes"] = changes
    results["wall_seconds"] = time.time() - started
    (arguments.out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    (arguments.out / "table.md").write_text(markdown(changes))
    log("\n" + markdown(changes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
