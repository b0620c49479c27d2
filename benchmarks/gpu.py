"""One prepared GPU benchmark of `jaxroll.measure` (issue 29), then the engine rows.

Builds its models from configs (random init on the device, no downloads, no
tokenizer: random token ids), a 24-layer, 1024-hidden, 16-head BLOOM (ALiBi;
transformers has no SDPA path for it, so eager attention) and Llama (rotary,
SDPA), in float32 and bfloat16, and for N = 1024, 4096, 16384 measures in the
same run, on the same batches:

- ``measure_s``: `jaxroll.measure.measure` with the default statistics
  (lambda, content, influence; Llama: lambda, influence), batch size from
  free memory, the whole call (setup, the loop, the finish);
- ``bare_s``: a bare forward + backward of the same model on the same
  batches: embeddings -> logits at the last position -> the top probability
  -> its gradient with respect to the embeddings, no hooks, no statistics,
  the same activation checkpointing of each block as `measure` (without it
  the bare pass does not fit at long N);
- both after one untimed bare batch at the row's shape (kernel choice,
  allocator growth);
- ``ratio = measure_s / bare_s`` (target <= 1.3) and the peak device memory
  of each (``torch.cuda.max_memory_allocated``; ratio target <= 1.5);
- the bfloat16 / float32 time ratio per family and N (target <= 1.0);
- the longest N with default statistics: Llama at N = 65,536, one sequence,
  if the remaining budget allows.

Rows whose memory estimate (`jaxroll.measure.batching`) exceeds the free
memory, or whose predicted time (from the row before, assuming the worst,
quadratic growth in N) exceeds the remaining ``--budget``, are skipped and
say so. Then ``engine_rows(budget_s)`` of ``benchmarks/gpu_engine.py`` runs
with what is left of the 8 minutes. One CSV (``--out``, default
``benchmarks/results/gpu.csv``) and one markdown table, printed and written
to ``$OUT/gpu.md`` when the environment variable OUT is set.

    python3 benchmarks/gpu.py [--budget 260] [--total 470] [--quick] [--out DIR]

``--quick``: tiny sizes on whatever device there is (the CPU in CI), for
checking the script.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this folder is sys.path[0]: its kernels.py would shadow the `kernels` package that
# transformers imports (hub kernels). The checkout's jaxroll comes first instead.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

FULL = {"layers": 24, "hidden": 1024, "heads": 16, "vocab": 32000, "lengths": (1024, 4096, 16384),
        "tokens": 32768, "longest": 65536}
QUICK = {"layers": 2, "hidden": 32, "heads": 4, "vocab": 128, "lengths": (32, 64, 128), "tokens": 256,
         "longest": 512}
COLUMNS = ("family", "dtype", "N", "S", "batch", "attention", "bare_s", "measure_s", "ratio", "bare_peak_GiB",
           "measure_peak_GiB", "memory_ratio", "note")


def build(family, sizes, dtype, device):
    """A random-init causal LM from a config (long-standing field names only)."""
    import torch
    import transformers

    hidden, heads, layers = sizes["hidden"], sizes["heads"], sizes["layers"]
    if family == "bloom":
        config = transformers.BloomConfig(n_layer=layers, n_head=heads, hidden_size=hidden, vocab_size=sizes["vocab"])
        implementation = "eager"
    else:
        config = transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=heads,
                                          num_key_value_heads=heads, hidden_size=hidden,
                                          intermediate_size=4 * hidden, vocab_size=sizes["vocab"],
                                          max_position_embeddings=max(sizes["longest"], max(sizes["lengths"])))
        implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    return model.to(dtype=getattr(torch, dtype)).eval()


def bare(model, batches, device):
    """Forward + backward of the top last-position probability, checkpointed blocks, no hooks: seconds."""
    import torch

    from jaxroll.measure.hooks import Hooks
    from jaxroll.measure.layer_maps import resolve

    flags = [parameter.requires_grad for parameter in model.parameters()]
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    _sync(device)
    start = time.perf_counter()
    try:
        with Hooks(resolve(model), model.config, checkpointing=True):
            for ids in batches:
                ids = torch.as_tensor(ids, device=device)
                embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
                logits = model(inputs_embeds=embeddings, use_cache=False, logits_to_keep=1).logits[:, -1]
                target = torch.softmax(logits.float(), dim=-1).max(dim=-1).values.sum()
                torch.autograd.grad(target, embeddings)
        _sync(device)
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
    return time.perf_counter() - start


def _sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    else:
        try:  # Linux: reset VmHWM (peak resident memory) to the current RSS
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass


def _peak_gib(device):
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def measure_row(model, family, dtype, length, samples, device, vocab, budget_left, predicted):
    """One table row: bare and measure on the same batches, or a skip with its reason."""
    import torch

    from jaxroll.measure import measure
    from jaxroll.measure.batching import choose_batch_size, free_bytes, sequence_bytes, model_sizes

    stats = ("lambda", "content", "influence") if family == "bloom" else ("lambda", "influence")
    row = {"family": family, "dtype": dtype, "N": length, "S": samples,
           "attention": model.config._attn_implementation}
    sizes = model_sizes(model.config)
    one = sequence_bytes(layers=sizes["layers"], hidden=sizes["hidden"], heads=sizes["heads"],
                         intermediate=sizes["intermediate"], length=length,
                         itemsize=next(model.parameters()).element_size(), eager=row["attention"] == "eager",
                         checkpointing=True, stats=stats, device=str(device))
    if one > free_bytes(device):
        return row | {"note": f"skipped: one sequence needs about {one / 2**30:.3g} GiB, "
                              f"{free_bytes(device) / 2**30:.3g} GiB free"}
    if predicted is not None and predicted > budget_left:
        return row | {"note": f"skipped: predicted {predicted:.0f} s > {budget_left:.0f} s left of --budget"}
    ids = np.random.default_rng(length).integers(0, vocab, (samples, length))
    batch = choose_batch_size(model, length, stats, samples)
    batches = [ids[first:first + batch] for first in range(0, samples, batch)]
    try:
        bare(model, batches[:1], device)  # warm-up at this shape (kernel choice, allocator), not timed
        _reset_peak(device)
        bare_seconds = bare(model, batches, device)
        bare_peak = _peak_gib(device)
        _reset_peak(device)
        _sync(device)
        start = time.perf_counter()
        result = measure(model, ids, stats=stats, batch_size=batch)
        _sync(device)
        measure_seconds = time.perf_counter() - start
        measure_peak = _peak_gib(device)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return row | {"batch": batch, "note": "out of memory"}
    assert abs(float(result.influence.sum()) - 1.0) < 1e-6 and np.all(np.isfinite(result.lambdas))
    return row | {"batch": batch, "bare_s": bare_seconds, "measure_s": measure_seconds,
                  "ratio": measure_seconds / bare_seconds, "bare_peak_GiB": bare_peak,
                  "measure_peak_GiB": measure_peak, "memory_ratio": measure_peak / bare_peak, "note": ""}


def run_measure_rows(sizes, device, budget, dtypes):
    import torch

    started = time.perf_counter()
    rows = []
    plan = [(family, dtype, length) for length in sizes["lengths"] for family in ("bloom", "llama")
            for dtype in dtypes]
    seconds_at = {}  # (family, dtype) -> (N, seconds of measure + bare)
    models = {}
    for family, dtype, length in plan:
        left = budget - (time.perf_counter() - started)
        samples = max(2, sizes["tokens"] // length)
        key = (family, dtype)
        previous = seconds_at.get(key)
        # The worst case: time grows as S N^2 (the attention), from the last row that ran.
        predicted = None if previous is None else previous[1] * samples * length**2 / (previous[2] * previous[0]**2)
        if key not in models:
            models.clear()
            if str(device).startswith("cuda"):
                torch.cuda.empty_cache()
            models[key] = build(family, sizes, dtype, device)
            # Warm-up: kernels load, the allocator grows (not counted in any row).
            from jaxroll.measure import measure

            measure(models[key], np.zeros((1, 16), dtype=np.int64), stats=("lambda", "influence"), batch_size=1)
        row = measure_row(models[key], family, dtype, length, samples, device, sizes["vocab"], left, predicted)
        if "measure_s" in row:
            seconds_at[key] = (length, row["measure_s"] + row["bare_s"], samples)
        rows.append(row)
        _print_progress(row)
    models.clear()
    # The longest N: Llama (SDPA), one sequence, the last dtype.
    length, dtype = sizes["longest"], dtypes[-1]
    left = budget - (time.perf_counter() - started)
    previous = seconds_at.get(("llama", dtype))
    predicted = None if previous is None else previous[1] * length**2 / (previous[2] * previous[0]**2)
    model = build("llama", sizes, dtype, device)
    row = measure_row(model, "llama", dtype, length, 1, device, sizes["vocab"], left, predicted)
    row["note"] = ("longest N; " + row.get("note", "")).strip("; ")
    rows.append(row)
    _print_progress(row)
    del model
    return rows


def _print_progress(row):
    print("  " + ", ".join(f"{key} {_fmt(row.get(key, ''))}" for key in COLUMNS if row.get(key, "") != ""),
          file=sys.stderr, flush=True)


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def dtype_rows(rows):
    """bfloat16 / float32 measure time per family and N, where both ran."""
    out = []
    for family in ("bloom", "llama"):
        for length in sorted({row["N"] for row in rows}):
            times = {row["dtype"]: row.get("measure_s") for row in rows if row["family"] == family
                     and row["N"] == length and "longest" not in row.get("note", "")}
            if times.get("float32") and times.get("bfloat16"):
                out.append(f"| {family} | {length} | {times['bfloat16'] / times['float32']:.3g} |")
    return out


def markdown(rows, extra, header):
    lines = [header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(row.get(column, "")) for column in COLUMNS) + " |" for row in rows]
    ratios = dtype_rows(rows)
    if ratios:
        lines += ["", "| family | N | bfloat16 / float32 time (measure) |", "|---|---:|---:|", *ratios]
    return "\n".join(lines + ["", *extra]) + "\n"


def engine(budget_s, quick=False):
    """The engine rows of `benchmarks/gpu_engine.py` (another part of the benchmark), as markdown lines."""
    import importlib.util

    path = HERE / "gpu_engine.py"
    if not path.is_file():
        return ["engine rows: benchmarks/gpu_engine.py missing"]
    spec = importlib.util.spec_from_file_location("gpu_engine", path)  # not via sys.path (see above)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine_rows = module.engine_rows
    if budget_s <= 0:
        return ["engine rows: skipped, no time left of the 8 minutes"]
    result = engine_rows(budget_s, quick=quick)
    if isinstance(result, str):
        return [result]
    if isinstance(result, (list, tuple)) and result and isinstance(result[0], dict):
        columns = list(dict.fromkeys(key for row in result for key in row))
        return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                *("| " + " | ".join(_fmt(row.get(column, "")) for column in columns) + " |" for row in result)]
    return [str(line) for line in (result or [])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=260.0, help="seconds for the measure rows (default 260)")
    parser.add_argument("--total", type=float, default=470.0,
                        help="seconds for the whole script; the engine rows get what is left (default 470)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check of the script, e.g. on a CPU)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    arguments = parser.parse_args(argv)
    started = time.perf_counter()

    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = QUICK if arguments.quick else FULL
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    header = (f"## benchmarks/gpu.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {name}, "
              f"torch {torch.__version__}, transformers {transformers.__version__}"
              f"{', --quick' if arguments.quick else ''}; {sizes['layers']} layers, hidden {sizes['hidden']}, "
              f"{sizes['heads']} heads; time in s, peak in GiB")
    rows = run_measure_rows(sizes, device, arguments.budget, ("float32", "bfloat16"))
    arguments.out.mkdir(parents=True, exist_ok=True)
    path = arguments.out / ("gpu_quick.csv" if arguments.quick else "gpu.csv")
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({column: row.get(column, "") for column in COLUMNS} for row in rows)
    if device == "cuda":
        torch.cuda.empty_cache()  # hand torch's cached blocks back before JAX allocates its own
    extra = ["### engine rows", "", *engine(arguments.total - (time.perf_counter() - started), arguments.quick)]
    text = markdown(rows, extra, header)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu.md").write_text(text)
    print(f"wrote {path}; {time.perf_counter() - started:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
