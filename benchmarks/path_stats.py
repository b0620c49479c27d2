"""Cost of the ``paths`` statistic (jaxroll.measure.path_stats) against a bare forward + backward, and r_t by both routes.

Table 1 (``path_stats_cost.csv``), per model: the bare forward + backward of
``f`` (the top last-position probability, to the input embeddings; no
hooks, no statistics) over the run's S sequences in batches of 4
(`measure.bare_batches`), against

- ``forward``: the forward route alone (`path_forward.forward_paths`: one
  forward pass without gradients over all S sequences, the sums formed from
  each block's input; no backward pass);
- ``backward``: the backward route (`measure_paths` at its defaults: the
  first ``PATH_SAMPLES`` sequences, ``PATH_PROJECTIONS`` projections);
- the default measurement with and without ``paths`` (`jaxroll.measure.measure`,
  batch size 4), whose difference is what ``paths`` adds inside the pass
  (``added_ratio``, in bare runs).

Interleaved repetitions, medians, one thread. ``ratio_*`` are seconds over
the bare run's; ``per_sequence_*`` the same per sequence each one ran.

Table 2 (``path_stats_r.csv``): r_t = probability_over_value per layer on
the wave-5 and wave-6 validation models (BLOOM and Llama each, the first S =
16 held-out texts): the forward route on all 16 sequences and on the first
4, beside the backward route on those 4 with its 8 Gaussian projections (D =
64 > 8: an estimate) and its spread across the 4 sequences
(``probability_over_value_std``); ``z`` is the backward route's distance from
the forward route on the same 4 sequences in units of that spread.

Models: a tiny random Llama (4 layers, hidden 128, N = 512, S = 16,
float32, loaded sdpa as the default route loads it) and the validation
models (validation/models/wave5 at N = 64, wave6 at N = 128, the held-out
texts, float64 as the validation runs).

    PYTHONPATH=. python3 benchmarks/path_stats.py [--repeats 3] [--out benchmarks/results] [--tables cost,r]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
WAVES = {"wave5": (ROOT / "validation" / "models" / "wave5", 64), "wave6": (ROOT / "validation" / "models" / "wave6", 128)}


def tiny_llama():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=128, intermediate_size=256, vocab_size=256,
                                      max_position_embeddings=1024)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return model, np.random.default_rng(0).integers(0, 256, (16, 512))


def validation_model(wave, family, samples=64):
    from jaxroll.measure import load_model, load_tokenizer, read_texts, select_sequences

    folder, length = WAVES[wave]
    directory = folder / f"{family}-trained"
    tokenizer = load_tokenizer(directory)
    ids, _ = select_sequences(read_texts(folder / "held_out.jsonl"), tokenizer, length, samples)
    model = load_model(directory, dtype="float64", attn_implementation="sdpa" if family == "llama" else "eager")
    return model.eval(), ids


def medians(functions: dict, repeats: int) -> dict:
    for function in functions.values():  # warm-up
        function()
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def row(name, model, ids, repeats):
    from measure import bare_batches

    from jaxroll.measure import default_stats, layer_map_for, measure
    from jaxroll.measure.path_forward import forward_paths
    from jaxroll.measure.path_stats import PATH_PROJECTIONS, PATH_SAMPLES, measure_paths

    layers = model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else model.config.n_layer
    stats = tuple(name for name in default_stats(layer_map_for(model).position, ids.shape[1], layers)
                  if name != "paths")
    batches = [ids[start:start + 4] for start in range(0, len(ids), 4)]
    runs = {"bare": lambda: bare_batches(model, batches),
            "forward": lambda: forward_paths(model, ids),
            "backward": lambda: measure_paths(model, ids),
            "measure": lambda: measure(model, ids, stats=stats, batch_size=4),
            "measure_paths": lambda: measure(model, ids, stats=stats + ("paths",), batch_size=4)}
    seconds = medians(runs, repeats)
    samples, width = min(PATH_SAMPLES, len(ids)), model.config.hidden_size
    bare = seconds["bare"]
    return {"model": name, "S": len(ids), "N": ids.shape[1], "D": width, "bare_s": bare,
            "forward_s": seconds["forward"], "ratio_forward": seconds["forward"] / bare,
            "per_sequence_forward": seconds["forward"] / bare,  # all S sequences, as the bare run
            "backward_M": samples, "backward_R": "exact" if width <= PATH_PROJECTIONS else PATH_PROJECTIONS,
            "backward_s": seconds["backward"], "ratio_backward": seconds["backward"] / bare,
            "per_sequence_backward": (seconds["backward"] / samples) / (bare / len(ids)),
            "measure_s": seconds["measure"], "measure_paths_s": seconds["measure_paths"],
            "added_ratio": (seconds["measure_paths"] - seconds["measure"]) / bare}


def r_rows(wave, family, samples=16):
    """r_t per layer: the forward route on all `samples` and on the first 4, the backward route on those 4."""
    from jaxroll.measure.path_forward import forward_paths
    from jaxroll.measure.path_stats import PATH_SAMPLES, measure_paths, path_outputs

    model, ids = validation_model(wave, family, samples)
    forward = forward_paths(model, ids)
    backward = path_outputs(measure_paths(model, ids)["per_sequence"])
    everything, first = path_outputs(forward), path_outputs(forward[:PATH_SAMPLES])
    rows = []
    for layer, r_backward in enumerate(backward["probability_over_value"]):
        spread = backward["probability_over_value_std"][layer]
        rows.append({"model": f"{wave} {family}-trained", "N": ids.shape[1], "layer": layer,
                     "r_forward_16": everything["probability_over_value"][layer],
                     "r_forward_4": first["probability_over_value"][layer], "r_backward_4": r_backward,
                     "backward_std": spread, "z": (r_backward - first["probability_over_value"][layer]) / spread,
                     "share_forward_16": everything["branch_share"][layer], "share_backward_4": backward["branch_share"][layer]})
    return rows


def markdown(rows):
    columns = list(rows[0])
    print("\n| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
    for entry in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in entry.values()) + " |")


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--tables", default="cost,r")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    from measure import show

    arguments.out.mkdir(parents=True, exist_ok=True)
    tables = arguments.tables.split(",")
    if "cost" in tables:
        rows = [row("tiny llama (random)", *tiny_llama(), arguments.repeats)]
        for family in ("bloom", "llama"):
            rows.append(row(f"wave5 {family}-trained", *validation_model("wave5", family), arguments.repeats))
        show(f"paths statistic against the bare forward + backward of the same run (1 thread, median of "
             f"{arguments.repeats}, interleaved)", rows, arguments.out / "path_stats_cost.csv")
        markdown(rows)
    if "r" in tables:
        rows = [entry for wave in ("wave5", "wave6") for family in ("bloom", "llama") for entry in r_rows(wave, family)]
        show("r_t by the forward route (exact) and the backward route (R = 8 projections)", rows,
             arguments.out / "path_stats_r.csv")
        markdown(rows)


if __name__ == "__main__":
    main()
