"""Worked example: train a small ALiBi model on text mixed with task records, then score and predict.

1. ``train``: a word-level tokenizer (built offline) and a BLOOM-type model
   (ALiBi, so that `jaxroll measure` gives slopes and content) trained on CPU
   for at most ``--budget`` seconds on a mixture of filler text and the three
   task formats of `jaxroll.task` (kv, passkey, copy) at lengths up to
   ``--train-length``, records at uniformly random depths. The budget keeps it
   small on purpose: it should retrieve imperfectly.
2. ``evaluate``: ``jaxroll task`` on a depth x length grid, ``jaxroll measure``
   on held-out prompts of the same formats, and ``jaxroll compare-task`` of
   every task curve against the rollout predicted from the measured
   configuration (``measure/config.yaml``), at each length.

Run (about 15 minutes on two shared cores)::

    OMP_NUM_THREADS=1 nice python validation/task_example.py --out results/task-example

Then read ``results/task-example/compare-*/compare.txt`` and the figures.
``--stage evaluate`` reuses a trained model. ``--tiny`` is the test size.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

SYLLABLES = ["ba", "ko", "mi", "tu", "re", "sa", "no", "li"]
TEMPLATE_WORDS = ("Extract the value corresponding to specified key in JSON object below data Key Corresponding "
                  "There is an important info hidden inside a lot of irrelevant text Find it and memorize I will "
                  "quiz you about information there The grass green sky blue sun yellow Here we go back again "
                  "pass Remember What Below some with passage random words Repeat when asked").split()
PUNCTUATION = ['"', ":", ",", "{", "}", ".", "?", ";"]


def build_tokenizer():
    """Word level: [UNK], template words, 64 two-syllable words, digits, punctuation; digits split one by one."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [a + b for a in SYLLABLES for b in SYLLABLES]
    vocabulary = ["[UNK]", "[EOS]", *dict.fromkeys(TEMPLATE_WORDS), *words, *"0123456789", *PUNCTUATION]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocabulary)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[EOS]")


def example(builder, rng, length, task):
    """Token ids of one training document: a task prompt with its answer, or plain filler words."""
    from jaxroll.task.cases import TASKS

    if task == "text":
        return list(rng.choice(builder.pool, length)), None
    case = builder.make(task, length, float(rng.uniform()), int(rng.integers(1 << 30)), int(rng.integers(1 << 30)))
    ids = list(case.prompt_ids) + list(case.answer_ids)
    assert task in TASKS
    return ids, (len(case.prompt_ids), len(ids))


def batch(builder, rng, size, length):
    """(inputs (B, length), loss weights (B, length - 1)): answers weigh 1, other tokens 0.1."""
    tasks = ("kv", "passkey", "copy", "text")
    inputs = np.zeros((size, length), dtype=np.int64)
    weights = np.zeros((size, length - 1))
    for row in range(size):
        task = tasks[row % len(tasks)]
        shortest = max(builder.minimum_length(name) for name in tasks[:3]) + 8
        prompt_length = int(rng.integers(shortest, length - 8))
        ids, answer = example(builder, rng, prompt_length if task != "text" else length, task)
        ids = ids[:length]
        inputs[row, : len(ids)] = ids
        weights[row, : len(ids) - 1] = 0.1
        if answer is not None:
            start, stop = answer
            weights[row, start - 1: stop - 1] = 1.0  # logits at start-1 .. stop-2 predict the answer
    return inputs, weights


def train(out: Path, budget: float, train_length: int, layers: int, hidden: int, seed: int, device: str = "cpu",
          batch_size: int = 16) -> dict:
    import torch
    import transformers

    from jaxroll.task.cases import Builder

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    builder = Builder(tokenizer)
    config = transformers.BloomConfig(n_layer=layers, n_head=4, hidden_size=hidden, vocab_size=len(tokenizer),
                                      bos_token_id=1, eos_token_id=1)
    model = transformers.AutoModelForCausalLM.from_config(config).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    start, step, log = time.time(), 0, []
    while time.time() - start < budget:
        inputs, weights = batch(builder, rng, batch_size, train_length)
        tensor = torch.as_tensor(inputs, device=device)
        logits = model(input_ids=tensor).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tensor[:, 1:].reshape(-1),
                                                   reduction="none").reshape(weights.shape)
        w = torch.as_tensor(weights, dtype=losses.dtype, device=device)
        loss = (losses * w).sum() / w.sum()
        warm = min(1.0, (step + 1) / 100)
        for group in optimiser.param_groups:
            group["lr"] = 3e-3 * warm
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        step += 1
        if step % 20 == 0:
            log.append({"step": step, "seconds": round(time.time() - start, 1), "loss": loss.item()})
            print(f"step {step}: weighted loss {loss.item():.3f} ({time.time() - start:.0f} s)", flush=True)
    directory = out / "model"
    model.cpu().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    info = {"steps": step, "device": device, "batch": batch_size, "seconds": round(time.time() - start, 1), "train_length": train_length,
            "layers": layers, "hidden": hidden, "parameters": sum(p.numel() for p in model.parameters()),
            "log": log}
    (out / "train.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def held_out_texts(out: Path, length: int, samples: int, seed: int) -> Path:
    """Prompts of all three tasks as measurement texts (one per line block), longer than `length` tokens."""
    from jaxroll.task.cases import Builder

    tokenizer = build_tokenizer()
    builder = Builder(tokenizer)
    rng = np.random.default_rng(seed + 1)
    documents = []
    for index in range(samples):
        task = ("kv", "passkey", "copy")[index % 3]
        case = builder.make(task, length + 8, float(rng.uniform()), index, seed + 1)
        documents.append(tokenizer.decode(list(case.prompt_ids)).replace("\n", " "))
    path = out / "texts.txt"
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def evaluate(out: Path, lengths, depths: int, samples: int, measure_samples: int) -> None:
    from jaxroll.cli import main

    model = out / "model"
    fractions = ",".join(f"{i / (depths - 1):.4g}" for i in range(depths))
    _call(main, ["task", model, "--out", out / "task", "--lengths", ",".join(map(str, lengths)), "--depths",
                 fractions, "--samples", samples, "--quiet", "--force"])
    measure_length = max(lengths)
    texts = held_out_texts(out, measure_length, measure_samples, 0)
    _call(main, ["measure", model, "--texts", texts, "--length", measure_length, "--samples", measure_samples,
                 "--out", out / "measure", "--quiet", "--force"])
    for task in ("kv", "passkey", "copy"):
        for length in lengths:
            for score, suffix in (("exact", ""), ("logprob", "-logprob")):
                _call(main, ["compare-task", out / "task", "--measured", out / "measure", "--task", task,
                             "--length", length, "--score", score, "--out", out / f"compare-{task}-{length}{suffix}",
                             "--force"])
    print(table(out))


def table(out: Path) -> str:
    """A Markdown table of every comparison in `out` (also written to ``out/table.md``)."""
    lines = ["| task | L | score | Spearman [95% CI] | depth effect / noise | explained (in sample, left out) |",
             "|---|---|---|---|---|---|"]
    results = [json.loads(path.read_text(encoding="utf-8")) for path in out.glob("compare-*/compare.json")]
    for r in sorted(results, key=lambda r: (r["task"], r["length"], r["score"])):
        low, high = r["spearman_interval"]
        lines.append(f"| {r['task']} | {r['length']} | {r['score']} | {r['spearman']:.2f} [{low:.2f}, {high:.2f}] | "
                     f"{r['depth_effect_to_noise']:.2f} | {_share(r['explained_in_sample'])}, "
                     f"{_share(r['explained_leave_one_depth_out'])} |")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text, encoding="utf-8")
    return text


def _share(value) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.0f}%"


def _call(main, argv) -> None:
    argv = [str(item) for item in argv]
    print("$ jaxroll " + " ".join(argv), flush=True)
    code = main(argv)
    if code != 0:
        raise SystemExit(f"jaxroll {argv[0]} failed with status {code}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/task-example"))
    parser.add_argument("--stage", choices=("all", "train", "evaluate"), default="all")
    parser.add_argument("--budget", type=float, default=840.0, help="training seconds (default 840)")
    parser.add_argument("--train-length", type=int, default=112)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lengths", default="64,112,160,224")
    parser.add_argument("--depths", type=int, default=11, help="depth fractions 0, 1/(D-1), ..., 1")
    parser.add_argument("--samples", type=int, default=40, help="cases per (task, length, depth)")
    parser.add_argument("--measure-samples", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where to train (cpu, or cuda where there is one)")
    parser.add_argument("--batch", type=int, default=16, help="training sequences per step")
    parser.add_argument("--tiny", action="store_true", help="test size: seconds, not minutes")
    arguments = parser.parse_args(argv)
    if arguments.tiny:
        arguments.budget, arguments.train_length, arguments.layers, arguments.hidden = 2.0, 96, 2, 32
        arguments.lengths, arguments.depths, arguments.samples, arguments.measure_samples = "96", 3, 2, 3
    arguments.out.mkdir(parents=True, exist_ok=True)
    lengths = [int(item) for item in arguments.lengths.split(",")]
    if arguments.stage in ("all", "train"):
        info = train(arguments.out, arguments.budget, arguments.train_length, arguments.layers, arguments.hidden,
                     arguments.seed, arguments.device, arguments.batch)
        print(f"trained {info['steps']} steps in {info['seconds']} s ({info['parameters']} parameters)")
    if arguments.stage in ("all", "evaluate"):
        evaluate(arguments.out, lengths, arguments.depths, arguments.samples, arguments.measure_samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
