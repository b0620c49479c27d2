"""Cost and memory of `jaxroll.measure` on tiny random models; Falcon's two formulas.

Three tables, each printed and written as CSV into --out:

1. ``measure_cost.csv``: seconds per sequence of `measure` (lambda, content,
   influence; one forward and one backward pass) on a tiny model of each
   family, against a baseline measured in the same run: the same model's
   bare forward + backward of ``f`` (no hooks, no accumulation).
2. ``measure_memory.csv``: peak resident memory growth of the influence
   pass at 2 and 16 layers, with and without activation checkpointing, each
   in a fresh subprocess (peak RSS reset through /proc/self/clear_refs after
   the model is built), and the bytes autograd holds for the backward pass
   at the end of the forward (counted with saved_tensors_hooks): the part
   that checkpointing removes. The rest of the first pass's peak is one
   block's transient working set and the allocator growing its heap (after
   a full-size warm-up pass, the RSS growth of a second pass is within a
   few MiB at 2 and 16 layers).
3. ``measure_falcon.csv``: on one tiny Falcon (alibi=True), the measured
   numbers under the intended (once) and the eager-path (doubled) ALiBi
   formula, and the rollout profiles of the written configs with content in
   logit units (scaled, jaxroll's default) and raw ``q.k`` (the authors'
   convention).

Correctness first: each family's influence is checked to sum to 1 and the
checkpointed run to equal the plain one before anything is timed.

    python3 benchmarks/measure.py [--length 128] [--samples 8] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN, HEADS, VOCAB = 64, 4, 256


def tiny(family, layers=2, seed=0, **extra):
    import torch
    import transformers as T

    configs = {
        "bloom": lambda: T.BloomConfig(n_layer=layers, n_head=HEADS, hidden_size=HIDDEN, vocab_size=VOCAB, **extra),
        "mpt": lambda: T.MptConfig(n_layers=layers, n_heads=HEADS, d_model=HIDDEN, vocab_size=VOCAB,
                                   max_seq_len=2048, **extra),
        "falcon": lambda: T.FalconConfig(num_hidden_layers=layers, num_attention_heads=HEADS, hidden_size=HIDDEN,
                                         vocab_size=VOCAB, alibi=True, parallel_attn=False, bias=True,
                                         new_decoder_architecture=False, multi_query=False, **extra),
        "gpt2": lambda: T.GPT2Config(n_layer=layers, n_head=HEADS, n_embd=HIDDEN, vocab_size=VOCAB,
                                     n_positions=2048, bos_token_id=0, eos_token_id=0, **extra),
        "llama": lambda: T.LlamaConfig(num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=2,
                                       hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, vocab_size=VOCAB, **extra),
    }
    torch.manual_seed(seed)
    return T.AutoModelForCausalLM.from_config(configs[family](), attn_implementation="eager").eval()


def bare_forward_backward(model, ids):
    import torch

    embeddings = model.get_input_embeddings()(torch.as_tensor(ids)[None]).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeddings, use_cache=False, logits_to_keep=1).logits[0, -1]
    probability = torch.softmax(logits.float(), -1).max()
    torch.autograd.grad(probability, embeddings)


def cost_table(length, samples):
    import torch

    from jaxroll.measure import measure

    torch.set_num_threads(1)
    rows = []
    ids = np.random.default_rng(0).integers(0, VOCAB, (samples, length))
    for family in ("bloom", "mpt", "falcon", "gpt2", "llama"):
        model = tiny(family)
        stats = ("lambda", "influence") if family == "llama" else ("lambda", "content", "influence")
        check = measure(model, ids[:2], stats=stats)
        plain = measure(model, ids[:2], stats=stats, checkpointing=False)
        assert abs(check.influence.sum() - 1) < 1e-6 and np.allclose(check.influence, plain.influence, rtol=1e-5)
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        bare_forward_backward(model, ids[0])  # warm-up
        start = time.perf_counter()
        for row in ids:
            bare_forward_backward(model, row)
        baseline = (time.perf_counter() - start) / samples
        timings = {}
        for checkpointing in (True, False):
            measure(model, ids[:1], stats=stats, checkpointing=checkpointing)  # warm-up
            start = time.perf_counter()
            measure(model, ids, stats=stats, checkpointing=checkpointing)
            timings[checkpointing] = (time.perf_counter() - start) / samples
        rows.append({"family": family, "layers": 2, "hidden": HIDDEN, "heads": HEADS, "length": length,
                     "stats": "+".join(stats), "bare_fwd_bwd_ms": 1e3 * baseline,
                     "measure_ms": 1e3 * timings[True], "measure_no_ckpt_ms": 1e3 * timings[False],
                     "ratio": timings[True] / baseline, "ratio_no_ckpt": timings[False] / baseline})
    return rows


MEMORY_CHILD = r"""
import json, os, sys, numpy as np, torch
sys.path.insert(0, {bench!r})
from measure import tiny
from jaxroll.measure import measure
torch.set_num_threads(1)
layers, checkpointing, length = {layers}, {checkpointing}, {length}
model = tiny("bloom", layers=layers)
ids = np.random.default_rng(0).integers(0, 256, (1, length))
measure(model, ids[:, :8], stats=("influence",))  # import and allocator warm-up
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # reset the peak RSS
before = rss("VmRSS:")
measure(model, ids, stats=("influence",), checkpointing=checkpointing)
peak = rss("VmHWM:") - before
saved = [0]
def pack(tensor):
    saved[0] += tensor.numel() * tensor.element_size()
    return tensor
# What autograd holds for the backward pass at the end of the forward.
with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
    measure(model, ids, stats=("influence",), checkpointing=checkpointing)
print(json.dumps({{"peak_growth_bytes": peak, "saved_bytes": saved[0]}}))
"""


def memory_table(length):
    rows = []
    bench = str(Path(__file__).resolve().parent)
    for layers in (2, 16):
        for checkpointing in (True, False):
            code = MEMORY_CHILD.format(bench=bench, layers=layers, checkpointing=checkpointing, length=length)
            output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            report = json.loads(output.stdout.strip().splitlines()[-1])
            rows.append({"family": "bloom", "layers": layers, "hidden": HIDDEN, "heads": HEADS, "length": length,
                         "checkpointing": checkpointing, "peak_rss_growth_MiB": report["peak_growth_bytes"] / 2**20,
                         "saved_for_backward_MiB": report["saved_bytes"] / 2**20})
    return rows


def falcon_table(length, samples):
    import jax

    jax.config.update("jax_enable_x64", True)
    import jaxroll
    from jaxroll.measure import measure

    model = tiny("falcon", layers=4, initializer_range=0.2).double()
    ids = np.random.default_rng(1).integers(0, VOCAB, (samples, length))
    rows, profiles = [], {}
    for variant in ("once", "doubled"):
        result = measure(model, ids, stats=("lambda", "content", "influence"), falcon_alibi=variant)
        for scaled in (True, False):
            rollout = result.to_rollout_model()
            if not scaled:  # the authors' convention: raw q.k as content
                import dataclasses

                rollout = dataclasses.replace(rollout, diagonal_scores=rollout.diagonal_scores / result.logit_scale,
                                              base_scores=rollout.base_scores / result.logit_scale)
            profile = np.asarray(jaxroll.influence(rollout), dtype=np.float64)
            profiles[variant, scaled] = profile
            rows.append({
                "variant": variant, "content": "scaled" if scaled else "raw",
                "mean_lambda": float(result.lambdas.mean()),
                "slope_logit_h0": float(result.alibi_slopes_logit[0]),
                "mean_abs_diagonal_logit": float(np.abs(np.asarray(rollout.diagonal_scores)).mean()),
                "measured_p0": float(result.influence[0]), "measured_plast": float(result.influence[-1]),
                "measured_argmin": int(np.argmin(result.influence)),
                "rollout_p0": float(profile[0]), "rollout_plast": float(profile[-1]),
                "rollout_argmin": int(np.argmin(profile)),
                "tv_rollout_vs_measured": 0.5 * float(np.abs(profile - result.influence).sum()),
            })
    reference = profiles["once", True]
    for row in rows:
        row["tv_vs_once_scaled"] = 0.5 * float(np.abs(profiles[row["variant"], row["content"] == "scaled"]
                                                      - reference).sum())
    return rows


def show(title, rows, path):
    print(f"\n{title}")
    keys = list(rows[0])
    print("  ".join(f"{key:>14}" for key in keys))
    for row in rows:
        print("  ".join(f"{value:>14.4g}" if isinstance(value, float) else f"{str(value):>14}" for value in row.values()))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--memory-length", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    show(f"cost per sequence (N = {arguments.length}, S = {arguments.samples}, float32, 1 thread)",
         cost_table(arguments.length, arguments.samples), arguments.out / "measure_cost.csv")
    show(f"peak memory growth of the influence pass (BLOOM, N = {arguments.memory_length}, float32)",
         memory_table(arguments.memory_length), arguments.out / "measure_memory.csv")
    show(f"tiny Falcon (4 layers, initializer_range 0.2, float64, N = {arguments.length}, S = {arguments.samples})",
         falcon_table(arguments.length, arguments.samples), arguments.out / "measure_falcon.csv")


if __name__ == "__main__":
    main()
