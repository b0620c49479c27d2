"""Would an ALiBi model's changes be predicted better from its measured rows than from its analytic kernel?

    PYTHONPATH=. python3 validation/alibi_tables.py RUN > alibi-tables.md

RUN: a folder of validation/interventions.py's runs with ``wave5/`` and ``wave6/`` (their results.json and
``bloom/baseline``). Each BLOOM's baseline sequences are measured again with the rotary models' default
tables (``attention_gains``, ``attention_distances``; their statistics are declared for rotary and learned
positions, so this script allows ALiBi for its own run), the tables' `GainTableKernel` with the measured
probability shares is the config, and each distance score and temperature is predicted from the tables and
from the reweighted (or tempered) mean, beside the default route's ALiBi + content prediction (results.json's
``middle_extended``) and the measured change. A slope scale has no table (the bias is inside the rows), which
is why the ALiBi default keeps its analytic kernel.
"""
import dataclasses, json, sys
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline
import jaxroll
from jaxroll import interventions
from jaxroll.kernel_types import GainTableKernel
from jaxroll.measure import measure
from jaxroll.measure.registry import registered, _REGISTRY
from jaxroll.measure.effect import middle_mass
from jaxroll.measure.uncertainty import score
from jaxroll.model import with_probability_path
torch.set_num_threads(1)
registered()
for name in ("attention_gains", "attention_distances"):
    _REGISTRY[name] = dataclasses.replace(_REGISTRY[name], positions=("alibi", "rope", "learned"))
RUN = Path(sys.argv[1])
print("| model | change | measured [95 %] | ALiBi + content (default) | gain tables (a score reweights the mean) "
      "| gain and distance tables |")
print("|---|---|---:|---:|---:|---:|")
for wave in ("wave5", "wave6"):
    base = RUN / wave / "bloom" / "baseline"
    with np.load(base / "measurement.npz") as a:
        ids, measured_base = a["token_ids"], a["influence_per_sequence"]
    rows = {r["intervention"]: r for r in json.load(open(RUN / wave / "results.json"))["rows"]
            if r["family"] == "bloom" and "middle_measured" in r}
    model = pipeline.load_float64(Path(__file__).resolve().parent / "models" / wave / "bloom-trained")
    res = measure(model, ids, stats=("lambda", "attention", "attention_gains", "attention_distances", "paths"))
    e = res.extra
    ratio = np.nan_to_num(np.asarray(e["probability_over_value"]), nan=0.0)
    dist = {"rows": e["distance_rows"], "scores": e["distance_scores"], "grid": e["distance_grid"],
            "keys": tuple(str(k) for k in e["distance_keys"])}
    out = {}
    for label, d in (("tables", dist), ("reweighted mean", None)):
        k = GainTableKernel.create(e["gain_rows"], e["gain_weights"], e["gain_grid"], distances=d)
        m = jaxroll.RolloutModel.create(kernel=k, lambdas=np.clip(res.lambdas, 0, 1), sequence_length=ids.shape[1])
        m = with_probability_path(m, ratio / (1 + ratio))
        unchanged = np.asarray(jaxroll.influence(m))
        b = float(middle_mass(unchanged))
        out.setdefault("unchanged W1 / noise", {})[label] = score(unchanged, measured_base, B=1000, seed=0).ratio
        for spec in ("kappa=-0.5", "kappa=0.5", "kappa=1,kappa_form=unsquash", "tau=0.7", "tau=1.5"):
            c = float(middle_mass(np.asarray(jaxroll.influence(interventions.apply_all(m, interventions.parse(spec))))))
            out.setdefault(spec, {})[label] = c - b
    first = next(iter(rows.values()))
    v = out.pop("unchanged W1 / noise")
    print(f"| {wave} bloom | unchanged: W1 / noise | - | {first['baseline_extended_ratio']:.2f}x | "
          f"{v['reweighted mean']:.2f}x | {v['tables']:.2f}x |", flush=True)
    for spec, v in out.items():
        r = rows.get(spec, {})
        meas = r.get("middle_measured", float("nan")); lo, hi = r.get("middle_measured_interval", [np.nan, np.nan])
        print(f"| {wave} bloom | `{spec}` | {meas:+.4f} [{lo:+.4f}, {hi:+.4f}] | {r.get('middle_extended', np.nan):+.4f} "
              f"({r.get('middle_extended', np.nan)/meas:.2f}x) | {v['reweighted mean']:+.4f} ({v['reweighted mean']/meas:.2f}x) "
              f"| {v['tables']:+.4f} ({v['tables']/meas:.2f}x) |", flush=True)
