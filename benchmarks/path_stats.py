"""Cost of the ``paths`` statistic (jaxroll.measure.path_stats) against a bare forward + backward of the same run.

Per model: the bare forward + backward of ``f`` (the top last-position
probability, to the input embeddings; no hooks, no statistics) over the
run's S sequences in batches of 4 (`measure.bare_batches`), against the
statistic's own passes (`measure_paths` at its defaults: the first
``PATH_SAMPLES`` sequences, ``PATH_PROJECTIONS`` projections, eager view),
and the default measurement with and without ``paths`` (`jaxroll.measure.measure`,
batch size 4). Interleaved repetitions, medians, one thread. ``ratio`` is
the statistic's seconds over the bare run's; ``per_sequence`` the same per
sequence each one ran (the statistic's cost for another S is
``per_sequence * M / S`` bare runs).

Models: a tiny random Llama (4 layers, hidden 128, N = 512, S = 16,
float32, loaded sdpa as the default route loads it) and the wave-5
validation models (validation/models/wave5/{bloom,llama}-trained, N = 64,
S = 64, the held-out texts, float64 as the validation runs).

    PYTHONPATH=. python3 benchmarks/path_stats.py [--repeats 3] [--out benchmarks/results]
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
WAVE5 = ROOT / "validation" / "models" / "wave5"


def tiny_llama():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=128, intermediate_size=256, vocab_size=256,
                                      max_position_embeddings=1024)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return model, np.random.default_rng(0).integers(0, 256, (16, 512))


def wave5(family, length=64, samples=64):
    from jaxroll.measure import load_model, load_tokenizer, read_texts, select_sequences

    directory = WAVE5 / f"{family}-trained"
    tokenizer = load_tokenizer(directory)
    ids, _ = select_sequences(read_texts(WAVE5 / "held_out.jsonl"), tokenizer, length, samples)
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
    from jaxroll.measure.path_stats import PATH_PROJECTIONS, PATH_SAMPLES, measure_paths

    stats = default_stats(layer_map_for(model).position)
    batches = [ids[start:start + 4] for start in range(0, len(ids), 4)]
    runs = {"bare": lambda: bare_batches(model, batches),
            "paths": lambda: measure_paths(model, ids),
            "measure": lambda: measure(model, ids, stats=stats, batch_size=4),
            "measure_paths": lambda: measure(model, ids, stats=stats + ("paths",), batch_size=4)}
    seconds = medians(runs, repeats)
    samples, width = min(PATH_SAMPLES, len(ids)), model.config.hidden_size
    return {"model": name, "S": len(ids), "N": ids.shape[1], "D": width, "M": samples,
            "R": "exact" if width <= PATH_PROJECTIONS else PATH_PROJECTIONS,
            "bare_s": seconds["bare"], "paths_s": seconds["paths"],
            "ratio": seconds["paths"] / seconds["bare"],
            "per_sequence": (seconds["paths"] / samples) / (seconds["bare"] / len(ids)),
            "measure_s": seconds["measure"], "measure_paths_s": seconds["measure_paths"],
            "added_ratio": (seconds["measure_paths"] - seconds["measure"]) / seconds["bare"]}


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row("tiny llama (random)", *tiny_llama(), arguments.repeats)]
    for family in ("bloom", "llama"):
        rows.append(row(f"wave5 {family}-trained", *wave5(family), arguments.repeats))
    from measure import show

    arguments.out.mkdir(parents=True, exist_ok=True)
    show(f"paths statistic against the bare forward + backward of the same run (1 thread, median of "
         f"{arguments.repeats}, interleaved)", rows, arguments.out / "path_stats_cost.csv")
    columns = list(rows[0])
    print("\n| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
    for entry in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in entry.values()) + " |")


if __name__ == "__main__":
    main()
