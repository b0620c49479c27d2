"""The memory estimate that decides `jaxroll measure`'s refusals and batch sizes, against the measured peak.

Each case is a fresh process running ``jaxroll measure`` (the command line,
`jaxroll.cli.main`) on a tiny random model saved from its config into a
temporary folder, with S = batch sequences (one pass). The process records
the estimate the command took its decision on
(`jaxroll.measure.batching.measure_peak`, called by the memory check: the
whole process's peak resident set, its terms) and exits; the benchmark reads
that process's peak resident set from ``os.wait4`` (``ru_maxrss``, the
kernel's count for that child alone) and prints the estimate beside it with
the ratio estimate / measured (target: within [0.7, 1.3] both ways). A case
whose estimated growth exceeds the free memory is refused by the command
(not run here: its real peak would not fit either); the table says so.

Families: a tiny BLOOM (eager attention, its only path in transformers), a
tiny Llama (sdpa), a tiny GPT-2 (sdpa); statistics ``lambda,influence``, the
family's default, with ``attention_offsets`` and with ``attention``; batch 1
and 4; N from 512 to 32,768 where a case fits this machine in a minute or
two. One thread per case (``OMP_NUM_THREADS=1``): the machine is shared.

    PYTHONPATH=. python3 benchmarks/memory.py [--quick] [--cases REGEX] [--libraries]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64

# family, layers, hidden, heads, N, stats ("default": the family's), batch
CASES = [
    ("bloom", 2, 64, 4, 512, "lambda,influence", 1),
    ("bloom", 2, 64, 4, 512, "default", 4),
    ("bloom", 2, 64, 4, 4096, "lambda,influence", 1),
    ("bloom", 2, 64, 4, 4096, "default", 1),
    ("bloom", 2, 64, 4, 4096, "default", 4),
    ("bloom", 2, 64, 4, 4096, "lambda,influence,attention_offsets", 1),
    ("bloom", 2, 64, 4, 4096, "lambda,influence,attention", 1),
    ("bloom", 2, 64, 4, 8192, "default", 1),
    ("llama", 2, 32, 4, 512, "default", 4),
    ("llama", 2, 32, 4, 4096, "lambda,influence", 1),
    ("llama", 2, 32, 4, 4096, "lambda,influence", 4),
    ("llama", 2, 32, 4, 4096, "default", 1),
    ("llama", 2, 32, 4, 4096, "lambda,influence,attention_offsets", 4),
    ("llama", 2, 32, 4, 16384, "lambda,influence", 4),
    ("llama", 2, 32, 4, 16384, "lambda,influence,attention_offsets", 1),
    ("llama", 2, 32, 4, 32768, "lambda,influence", 1),
    ("llama", 2, 32, 4, 32768, "lambda,influence,attention_offsets", 1),
    ("llama", 2, 32, 4, 32768, "default", 1),
    ("gpt2", 2, 64, 4, 512, "default", 1),
    ("gpt2", 2, 64, 4, 4096, "lambda,influence", 4),
    ("gpt2", 2, 64, 4, 4096, "default", 1),
    ("gpt2", 2, 64, 4, 4096, "lambda,influence,attention_offsets", 4),
]
# N = 16: the peak less the resident set at the decision is what loads later (batching.LATER_LIBRARIES).
LIBRARIES = [("llama", 2, 32, 4, 16, "lambda,influence", 1), ("bloom", 2, 64, 4, 16, "lambda,influence", 1),
             ("gpt2", 2, 64, 4, 16, "default", 1)]
QUICK = [0, 1, 8, 9, 12, 18]

CHILD = r"""
import json, sys
from jaxroll.measure import batching
seen = []
original = batching.measure_peak
def spy(*args, **keywords):
    estimate = original(*args, **keywords)
    seen.append(estimate)
    return estimate
batching.measure_peak = spy
from jaxroll.cli import main
report, sys.argv = sys.argv[1], ["jaxroll", *sys.argv[2:]]
code = main()  # as the command line runs it (argv None: the compilation cache on)
first = seen[0]
terms = {name: getattr(first, name) for name in ("resident", "libraries", "weights", "batch", "per_sequence",
                                                 "per_pass", "sums", "finish", "total", "growth")}
with open(report, "w") as handle:
    json.dump({"code": code, "estimate": terms, "free": batching.free_bytes("cpu")}, handle)
"""


def model_config(family: str, layers: int, hidden: int, heads: int, length: int):
    """A transformers config of a tiny random model of `family` that accepts N = `length`."""
    import transformers as T

    if family == "bloom":
        return T.BloomConfig(n_layer=layers, n_head=heads, hidden_size=hidden, vocab_size=VOCAB)
    if family == "gpt2":
        return T.GPT2Config(n_layer=layers, n_head=heads, n_embd=hidden, vocab_size=VOCAB, n_positions=length,
                            bos_token_id=0, eos_token_id=0)
    return T.LlamaConfig(num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         hidden_size=hidden, intermediate_size=2 * hidden, vocab_size=VOCAB,
                         max_position_embeddings=length)


def run_case(case, root: Path) -> dict:
    """One case in a fresh process: its estimate, its exit status, its peak RSS (``os.wait4``) and seconds."""
    family, layers, hidden, heads, length, stats, batch = case
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_tokenizer import save_tiny, word_texts
    from transformers.utils import logging

    logging.disable_progress_bar()

    model = save_tiny(root / f"{family}-{length}", model_config(family, layers, hidden, heads, length))
    texts = word_texts(root / f"texts-{length}-{batch}.txt", [length + 8] * batch)
    report = root / "report.json"
    argv = ["measure", str(model), "--texts", str(texts), "--length", str(length), "--samples", str(batch),
            "--batch-size", str(batch), "--out", str(root / "out"), "--force", "--quiet"]
    if stats != "default":
        argv += ["--stats", stats]
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(report), *argv], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if not report.exists():
        raise RuntimeError(f"case {case} failed: {stderr.strip()[-400:]}")
    result = json.loads(report.read_text())
    report.unlink()
    code = result["code"]
    return {"case": case, "estimate": result["estimate"], "free": result["free"], "code": code,
            "peak": usage.ru_maxrss * 1024 if code == 0 else None, "seconds": seconds,
            "refusal": stderr.strip().splitlines()[-1] if code == 2 else ""}


def row(result) -> str:
    family, layers, hidden, heads, length, stats, batch = result["case"]
    estimate, mib = result["estimate"], 2**20
    terms = (f"{estimate['resident'] / mib:.0f} + {estimate['libraries'] / mib:.0f} + "
             f"{estimate['weights'] / mib:.2f} + {estimate['sums'] / mib:.1f} + max({estimate['per_pass'] / mib:.0f}, "
             f"{estimate['finish'] / mib:.0f}); seq {estimate['per_sequence'] / mib:.1f}")
    if result["peak"] is None:
        measured, ratio = "refused", (f"growth {estimate['growth'] / 2**30:.1f} GiB > free "
                                      f"{result['free'] / 2**30:.1f} GiB")
    else:
        measured, ratio = f"{result['peak'] / mib:.0f}", f"{estimate['total'] / result['peak']:.2f}"
    return (f"| {family} | {layers} x {hidden}, {heads} heads | {length} | {stats} | {batch} | {terms} | "
            f"{estimate['total'] / mib:.0f} | {measured} | {ratio} | {result['seconds']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset of the cases (about a minute)")
    parser.add_argument("--cases", default=None, help="only the cases whose description matches this regex")
    parser.add_argument("--libraries", action="store_true",
                        help="only cases at N = 16, whose peak less the resident set is what loads after the decision")
    arguments = parser.parse_args()
    cases = [CASES[index] for index in QUICK] if arguments.quick else CASES
    if arguments.libraries:
        cases = LIBRARIES
    if arguments.cases:
        cases = [case for case in cases if re.search(arguments.cases, " ".join(map(str, case)))]
    print("| family | model | N | stats | batch | estimate terms, MiB: R + Lib + W + sums + max(pass, finish); "
          "seq | estimate MiB | measured peak RSS MiB | estimate / measured | seconds |")
    print("|---|---|---:|---|---:|---|---:|---:|---|---:|", flush=True)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="jaxroll-memory-") as folder:
        for case in cases:
            result = run_case(case, Path(folder))
            print(row(result), flush=True)
            if result["peak"] is not None:
                ratios.append(result["estimate"]["total"] / result["peak"])
    if ratios:
        inside = sum(0.7 <= ratio <= 1.3 for ratio in ratios)
        print(f"\n{inside} of {len(ratios)} ratios within [0.7, 1.3]; range {min(ratios):.2f} .. {max(ratios):.2f}")


if __name__ == "__main__":
    main()
