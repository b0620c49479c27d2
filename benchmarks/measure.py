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

4. ``measure_targets.csv`` and ``measure_peak.csv`` (issue 29's CPU rows):
   `measure` (lambda, content, influence; batched, checkpointed, and the
   variants without checkpointing and at batch size 1) against the bare
   forward + backward of the same model on the same batches (no hooks, no
   checkpointing), tiny BLOOM, N = 512, S = 16, interleaved repetitions,
   medians; target ratio <= 1.5. The peak resident memory growth of one
   sequence at N = 4096, default statistics against the bare pass, each in a
   fresh subprocess (BLOOM: eager, its only path; Llama: sdpa); target
   <= 1.5. (The overhead table against the loop of commit 0d814fc is in
   docs/cluster.md;
   ``git show fc8427a:benchmarks/_baseline_measure.py`` restores that loop.)
5. ``measure_parallel.csv``: one process (``python -m jaxroll measure``)
   against two (``torchrun --nproc-per-node 2 -m jaxroll measure``, gloo on
   the CPU), each with one thread, on a tiny saved BLOOM: seconds per
   sequence of the measuring loop (the slowest rank's, from
   metadata.json) and of the whole command (startup and loading included);
   target ratio <= 0.6; alternating repetitions, medians. Both runs' outputs are checked equal first.

6. ``measure_defaults_time.csv``, ``measure_defaults_peak.csv`` and
   ``measure_long.csv`` (issue 55, "Long context by default"): `measure`
   with its default statistics (``stats=None``: `default_stats` at the run's
   N and depth) on a tiny Llama (sdpa, float32, 1 thread) against the bare
   batched forward + backward of the same model. Time at N = 512 (4 layers,
   hidden 128, S = 16, the batch `measure` chooses, interleaved repetitions,
   medians; the dense mean ``attention`` is the default there), beside the
   default as it ran before the forward route of ``paths`` (the pass
   checkpointed, then the backward route on 4 sequences: ``before``), the
   default with checkpointing forced, without ``paths``, ``lambda,influence``
   (no kernel) and the offsets forced; peak memory at
   N = 4096 (offsets by default; and the dense ``attention``, the default
   before issue 55) and at N = 32768 (2 layers, hidden 32), each process
   fresh, one sequence: the peak RSS of the process
   (``getrusage(RUSAGE_SELF).ru_maxrss``, imports and weights included) and
   its growth during the measured call over a warm-up at N = 8
   (``VmHWM - VmRSS``), with the call's seconds. The library function is
   called directly (batch 1), so the command's memory refusal, whose
   estimate another table checks, does not enter. Targets: time <= 1.5x at
   N = 512, peak <= 1.5x at N = 4096 and N = 32768.

Correctness first: each family's influence is checked to sum to 1 and the
checkpointed run to equal the plain one before anything is timed.

    python3 benchmarks/measure.py [--length 128] [--samples 8] [--out benchmarks/results]
                                  [--tables cost,memory,falcon,targets,parallel,defaults,long]
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



def rotated_medians(runs: dict, repeats: int) -> dict:
    """Median seconds of each call, rounds interleaved and rotated: the machine's load hits all alike."""
    times = {name: [] for name in runs}
    names = list(runs)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}

def tiny(family, layers=2, seed=0, implementation="eager", **extra):
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
    return T.AutoModelForCausalLM.from_config(configs[family](), attn_implementation=implementation).eval()


def llama(layers, hidden, implementation="sdpa", seed=0):
    """A tiny Llama (HEADS heads, 2 key-value heads, MLP 2 x hidden), float32, eval mode."""
    import torch
    import transformers as T

    config = T.LlamaConfig(num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=2,
                           hidden_size=hidden, intermediate_size=2 * hidden, vocab_size=VOCAB,
                           max_position_embeddings=65536)
    torch.manual_seed(seed)
    return T.AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()


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


def rss(field: str) -> int:
    """Bytes of a ``/proc/self/status`` field (``VmRSS:`` now, ``VmHWM:`` the peak since the last reset)."""
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss() -> None:
    """Reset ``VmHWM`` to the current resident set (Linux ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


MEMORY_CHILD = r"""
import json, os, sys, numpy as np, torch
sys.path.insert(0, {bench!r})
from measure import reset_peak_rss, rss, tiny
from jaxroll.measure import measure
torch.set_num_threads(1)
layers, checkpointing, length = {layers}, {checkpointing}, {length}
model = tiny("bloom", layers=layers)
ids = np.random.default_rng(0).integers(0, 256, (1, length))
measure(model, ids[:, :8], stats=("influence",))  # import and allocator warm-up
reset_peak_rss()
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


def bare_batches(model, batches, checkpointing=False):
    """The model's own cost: forward + backward of sum_b f_b on each batch, no hooks, no statistics."""
    import torch

    from jaxroll.measure.hooks import Hooks
    from jaxroll.measure.layer_maps import resolve

    for parameter in model.parameters():
        parameter.requires_grad_(False)
    with Hooks(resolve(model), model.config, checkpointing=checkpointing):
        for ids in batches:
            embeddings = model.get_input_embeddings()(torch.as_tensor(ids)).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeddings, use_cache=False, logits_to_keep=1).logits[:, -1]
            torch.autograd.grad(torch.softmax(logits.float(), -1).max(-1).values.sum(), embeddings)


def targets_table(length, samples, repeats):
    """Issue 29's CPU time row: measure (lambda, content, influence) / bare forward+backward, same batches."""
    import torch

    from jaxroll.measure import measure

    torch.set_num_threads(1)
    ids = np.random.default_rng(0).integers(0, VOCAB, (samples, length))
    model = tiny("bloom")
    stats = ("lambda", "content", "influence")
    batch = measure(model, ids[:2], stats=stats).metadata["batch_size"]  # warm-up; the chosen batch size
    batch = min(samples, measure(model, ids, stats=stats).metadata["batch_size"])
    batches = [ids[first:first + batch] for first in range(0, samples, batch)]
    runs = {"bare": lambda: bare_batches(model, batches),
            "bare_ckpt": lambda: bare_batches(model, batches, checkpointing=True),
            "measure": lambda: measure(model, ids, stats=stats, batch_size=batch, checkpointing=True),
            "measure_no_ckpt": lambda: measure(model, ids, stats=stats, batch_size=batch, checkpointing=False),
            "measure_batch1": lambda: measure(model, ids, stats=stats, batch_size=1, checkpointing=True)}
    median = rotated_medians(runs, repeats)
    return [{"model": f"bloom L=2 D={HIDDEN} H={HEADS}", "length": length, "samples": samples, "batch": batch,
             "repeats": repeats, "bare_s": median["bare"], "bare_ckpt_s": median["bare_ckpt"],
             "measure_s": median["measure"], "measure_no_ckpt_s": median["measure_no_ckpt"],
             "measure_batch1_s": median["measure_batch1"], "ratio": median["measure"] / median["bare"],
             "ratio_no_ckpt": median["measure_no_ckpt"] / median["bare"],
             "ratio_batch1": median["measure_batch1"] / median["bare"]}]


PEAK_CHILD = r"""
import json, sys, numpy as np, torch
sys.path.insert(0, {bench!r})
from measure import bare_batches, reset_peak_rss, rss, tiny
from jaxroll.measure import measure
from jaxroll.measure.loading import attention_implementation
torch.set_num_threads(1)
family, what, length = {family!r}, {what!r}, {length}
stats = ("lambda", "content", "influence") if family == "bloom" else ("lambda", "influence")
model = tiny(family, implementation=attention_implementation(tiny(family).config, stats))
ids = np.random.default_rng(0).integers(0, 256, (1, length))
measure(model, ids[:, :8], stats=stats, batch_size=1)  # import and allocator warm-up
bare_batches(model, [ids[:, :8]])
reset_peak_rss()
before = rss("VmRSS:")
if what == "bare":
    bare_batches(model, [ids])
else:
    measure(model, ids, stats=stats, batch_size=1)
print(json.dumps({{"peak_growth_bytes": rss("VmHWM:") - before,
                   "attention": model.config._attn_implementation}}))
"""


def peak_table(length):
    """Issue 29's CPU memory row: peak RSS growth of measure (default stats) against the bare pass, N = `length`."""
    rows = []
    bench = str(Path(__file__).resolve().parent)
    for family in ("bloom", "llama"):
        report = {}
        for what in ("bare", "measure"):
            code = PEAK_CHILD.format(bench=bench, family=family, what=what, length=length)
            output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            report[what] = json.loads(output.stdout.strip().splitlines()[-1])
        rows.append({"family": family, "length": length, "attention": report["measure"]["attention"],
                     "bare_MiB": report["bare"]["peak_growth_bytes"] / 2**20,
                     "measure_MiB": report["measure"]["peak_growth_bytes"] / 2**20,
                     "ratio": report["measure"]["peak_growth_bytes"] / report["bare"]["peak_growth_bytes"]})
    return rows


def defaults_time_table(length, samples, repeats, layers=4, hidden=128, family="llama"):
    """Issue 55, time: measure with its default statistics / the bare batched forward+backward, same batches.
    `family` ``llama`` (rotary, sdpa, hidden `hidden`) or ``bloom`` (ALiBi, eager, `tiny`'s hidden size), whose
    default since issue 53 also measures the tables of its `AnchoredTableKernel`.

    ``no_gains``: the default without ``attention_gains`` (the same where the default has none: N > 362 at
    4 layers); ``no_distances`` likewise without ``attention_distances``; ``no_tables`` without either (an ALiBi
    model's default before issue 53's anchored tables). ``before``: the default as it ran before the forward route, reproduced in
    the same run: the pass checkpointed, then ``paths`` by the backward route
    (`path_stats.measure_paths` on the first 4 sequences, 8 projections),
    as `additions.add_paths` called it.
    """
    import torch

    from jaxroll.measure import measure
    from jaxroll.measure.path_stats import measure_paths

    torch.set_num_threads(1)
    ids = np.random.default_rng(0).integers(0, VOCAB, (samples, length))
    model = llama(layers, hidden) if family == "llama" else tiny(family, layers)
    first = measure(model, ids)  # warm-up; the default at this N and depth, the batch and checkpointing it chooses
    default, batch = first.metadata["stats"], min(samples, first.metadata["batch_size"])
    without_paths = tuple(name for name in default if name != "paths")
    batches = [ids[start:start + batch] for start in range(0, samples, batch)]
    kernel = [name for name in default if name in ("attention", "attention_offsets")]

    def before():
        measure(model, ids, stats=without_paths, batch_size=batch, checkpointing=True)
        measure_paths(model, ids)

    runs = {"bare": lambda: bare_batches(model, batches),
            "default": lambda: measure(model, ids, batch_size=batch),
            "before": before,
            "checkpointed": lambda: measure(model, ids, batch_size=batch, checkpointing=True),
            "no_paths": lambda: measure(model, ids, stats=without_paths, batch_size=batch),
            "no_kernel": lambda: measure(model, ids, stats=("lambda", "influence"), batch_size=batch),
            "no_gains": lambda: measure(model, ids, stats=tuple(n for n in default if n != "attention_gains"),
                                        batch_size=batch),
            "no_distances": lambda: measure(model, ids, batch_size=batch,
                                            stats=tuple(n for n in default if n != "attention_distances")),
            "no_tables": lambda: measure(model, ids, batch_size=batch, stats=tuple(
                n for n in default if n not in ("attention_gains", "attention_distances"))),
            "offsets": lambda: measure(model, ids, stats=("lambda", "influence", "attention_offsets", "paths"),
                                       batch_size=batch)}
    median = rotated_medians(runs, repeats)
    bare = median["bare"]
    name = (f"llama L={layers} D={hidden} H={HEADS} sdpa" if family == "llama"
            else f"{family} L={layers} D={HIDDEN} H={HEADS} eager")
    return [{"model": name, "length": length, "samples": samples,
             "batch": batch, "repeats": repeats, "default": "+".join(default),
             "checkpointing": first.metadata["activation_checkpointing"], "default_kernel": "+".join(kernel),
             "bare_s": bare, "default_s": median["default"], "ratio_default": median["default"] / bare,
             "ratio_before": median["before"] / bare, "ratio_checkpointed": median["checkpointed"] / bare,
             "ratio_no_paths": median["no_paths"] / bare, "ratio_no_kernel": median["no_kernel"] / bare,
             "ratio_no_gains": median["no_gains"] / bare, "ratio_no_distances": median["no_distances"] / bare,
             "ratio_no_tables": median["no_tables"] / bare,
             "ratio_offsets": median["offsets"] / bare}]


DEFAULTS_CHILD = r"""
import json, resource, sys, time, numpy as np, torch
sys.path.insert(0, {bench!r})
from measure import bare_batches, llama, reset_peak_rss, rss
from jaxroll.measure import measure
torch.set_num_threads(1)
what, length, layers, hidden = {what!r}, {length}, {layers}, {hidden}
model = llama(layers, hidden)
ids = np.random.default_rng(0).integers(0, 256, (1, length))
stats = {{"default": None, "dense": ("lambda", "influence", "attention")}}.get(what)
measure(model, ids[:, :8], stats=stats, batch_size=1)  # imports and allocator warm-up, on both sides
bare_batches(model, [ids[:, :8]])
reset_peak_rss()
before = rss("VmRSS:")
start = time.perf_counter()
if what == "bare":
    bare_batches(model, [ids])
    used = None
else:
    used = measure(model, ids, stats=stats, batch_size=1).metadata["stats"]
seconds = time.perf_counter() - start
print(json.dumps({{"growth": rss("VmHWM:") - before, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                   "seconds": seconds, "stats": used, "attention": model.config._attn_implementation}}))
"""


def _child(what, length, layers, hidden):
    code = DEFAULTS_CHILD.format(bench=str(Path(__file__).resolve().parent), what=what, length=length,
                                 layers=layers, hidden=hidden)
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


def defaults_peak_table(length, layers, hidden, whats=("default", "dense")):
    """Issue 55, memory: peak RSS of a fresh process, default statistics (and `whats`) against the bare pass."""
    bare = _child("bare", length, layers, hidden)
    rows = []
    for what in whats:
        report = _child(what, length, layers, hidden)
        rows.append({"model": f"llama L={layers} D={hidden} H={HEADS} {report['attention']}", "length": length,
                     "run": what, "stats": "+".join(report["stats"]), "bare_peak_MiB": bare["peak"] / 2**20,
                     "peak_MiB": report["peak"] / 2**20, "ratio_peak": report["peak"] / bare["peak"],
                     "bare_growth_MiB": bare["growth"] / 2**20, "growth_MiB": report["growth"] / 2**20,
                     "ratio_growth": report["growth"] / bare["growth"], "bare_s": bare["seconds"],
                     "seconds": report["seconds"], "ratio_time": report["seconds"] / bare["seconds"]})
    return rows


def parallel_table(length, samples, layers, hidden, repeats):
    import os
    import shutil
    import socket
    import tempfile

    import torch
    import transformers as T

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_tokenizer import WORDS, word_level_tokenizer

    root = Path(tempfile.mkdtemp(prefix="jaxroll-parallel-"))
    try:
        torch.manual_seed(0)
        config = T.BloomConfig(n_layer=layers, n_head=HEADS, hidden_size=hidden, vocab_size=64)
        T.AutoModelForCausalLM.from_config(config).save_pretrained(root / "model")
        word_level_tokenizer().save_pretrained(root / "model")
        rng = np.random.default_rng(0)
        texts = root / "docs.txt"
        texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=length + 4)) for _ in range(samples)) + "\n")
        environment = dict(os.environ, OMP_NUM_THREADS="1")
        command = ["-m", "jaxroll", "measure", str(root / "model"), "--texts", str(texts), "--length", str(length),
                   "--samples", str(samples), "--quiet", "--dtype", "float64"]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        launchers = {1: [sys.executable], 2: [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                             "--master-addr", "127.0.0.1", "--master-port", str(port)]}
        loops, walls = {1: [], 2: []}, {1: [], 2: []}
        for repeat in range(repeats):  # alternating 1, 2, 1, 2, ...: the machine's load hits both alike
            for processes, launcher in launchers.items():
                out = root / f"out{processes}-{repeat}"
                start = time.perf_counter()
                subprocess.run([*launcher, *command, "--out", str(out)], env=environment, check=True,
                               capture_output=True, text=True)
                walls[processes].append((time.perf_counter() - start) / samples)
                timing = json.loads((out / "metadata.json").read_text())["timing"]
                loops[processes].append(max(timing["loop_seconds_per_process"]) / samples)
        with np.load(root / "out1-0" / "measurement.npz") as one, np.load(root / "out2-0" / "measurement.npz") as two:
            for name in one.files:
                assert np.allclose(one[name], two[name], rtol=1e-12, atol=1e-15), name
        loop = {key: float(np.median(values)) for key, values in loops.items()}
        wall = {key: float(np.median(values)) for key, values in walls.items()}
        return [{"model": f"bloom L={layers} D={hidden} H={HEADS}", "length": length, "samples": samples,
                 "repeats": repeats, "loop_1proc_ms": 1e3 * loop[1], "loop_2proc_ms": 1e3 * loop[2],
                 "ratio_loop": loop[2] / loop[1], "ratios_loop_each": " ".join(
                     f"{two / one:.3f}" for one, two in zip(loops[1], loops[2])),
                 "wall_1proc_ms": 1e3 * wall[1], "wall_2proc_ms": 1e3 * wall[2], "ratio_wall": wall[2] / wall[1]}]
    finally:
        shutil.rmtree(root, ignore_errors=True)


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
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions of the targets table")
    parser.add_argument("--target-length", type=int, default=512)
    parser.add_argument("--target-samples", type=int, default=16)
    parser.add_argument("--peak-length", type=int, default=4096)
    parser.add_argument("--parallel-samples", type=int, default=16)
    parser.add_argument("--parallel-length", type=int, default=256)
    parser.add_argument("--parallel-repeats", type=int, default=3)
    parser.add_argument("--defaults-length", type=int, default=512)
    parser.add_argument("--defaults-samples", type=int, default=16)
    parser.add_argument("--defaults-family", choices=("llama", "bloom"), default="llama",
                        help="the model of the defaults time table (the peak tables stay on the Llama)")
    parser.add_argument("--long-length", type=int, default=32768)
    parser.add_argument("--tables", default="cost,memory,falcon,targets,parallel,defaults,long")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    tables = set(arguments.tables.split(","))
    if "cost" in tables:
        show(f"cost per sequence (N = {arguments.length}, S = {arguments.samples}, float32, 1 thread)",
             cost_table(arguments.length, arguments.samples), arguments.out / "measure_cost.csv")
    if "memory" in tables:
        show(f"peak memory growth of the influence pass (BLOOM, N = {arguments.memory_length}, float32)",
             memory_table(arguments.memory_length), arguments.out / "measure_memory.csv")
    if "falcon" in tables:
        show(f"tiny Falcon (4 layers, initializer_range 0.2, float64, N = {arguments.length}, "
             f"S = {arguments.samples})",
             falcon_table(arguments.length, arguments.samples), arguments.out / "measure_falcon.csv")
    if "targets" in tables:
        show(f"issue 29, time: measure (lambda, content, influence) against the bare forward + backward on the "
             f"same batches (N = {arguments.target_length}, S = {arguments.target_samples}, float32, 1 thread, "
             f"median of {arguments.repeats})",
             targets_table(arguments.target_length, arguments.target_samples, arguments.repeats),
             arguments.out / "measure_targets.csv")
        show(f"issue 29, memory: peak RSS growth, default statistics against the bare forward + backward "
             f"(N = {arguments.peak_length}, one sequence, float32)",
             peak_table(arguments.peak_length), arguments.out / "measure_peak.csv")
    if "defaults" in tables:
        show(f"issue 55, time: measure with its default statistics against the bare batched forward + backward "
             f"(tiny {arguments.defaults_family}, N = {arguments.defaults_length}, S = {arguments.defaults_samples}, "
             f"float32, 1 thread, median of {arguments.repeats})",
             defaults_time_table(arguments.defaults_length, arguments.defaults_samples, arguments.repeats,
                                 family=arguments.defaults_family),
             arguments.out / f"measure_defaults_time{'' if arguments.defaults_family == 'llama' else '_bloom'}.csv")
    if "defaults" in tables and arguments.defaults_family == "llama":
        show(f"issue 55, memory: peak RSS of a fresh process, default statistics (and the dense mean, the old "
             f"default) against the bare forward + backward (tiny Llama, N = {arguments.peak_length}, one sequence)",
             defaults_peak_table(arguments.peak_length, 4, 128), arguments.out / "measure_defaults_peak.csv")
    if "long" in tables:
        show(f"issue 55, long context: default statistics against the bare sdpa forward + backward (Llama 2 x 32, "
             f"N = {arguments.long_length}, one sequence, float32, 1 thread)",
             defaults_peak_table(arguments.long_length, 2, 32, whats=("default",)), arguments.out / "measure_long.csv")
    if "parallel" in tables:
        show(f"1 process against torchrun --nproc-per-node 2 (gloo, 1 thread each, float64, "
             f"N = {arguments.parallel_length}, S = {arguments.parallel_samples}, median of {arguments.parallel_repeats})",
             parallel_table(arguments.parallel_length, arguments.parallel_samples, 4, 128, arguments.parallel_repeats),
             arguments.out / "measure_parallel.csv")


if __name__ == "__main__":
    main()
