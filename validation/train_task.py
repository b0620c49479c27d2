"""Train small causal LMs on key-value retrieval until accuracy by depth is not flat (issue 54, item 1).

The task is Liu et al.'s key-value retrieval (2023, "Lost in the Middle",
arXiv 2307.03172) in the shape `jaxroll task` builds it
(`jaxroll.task.cases`), written in a synthetic vocabulary of raw token ids
so that no tokenizer is needed:

    prompt = [BOS] + body + [QUERY, k_1 .. k_K, ARROW]      answer = [v_1 .. v_V]
    record = [OPEN, k_1 .. k_K, ARROW, v_1 .. v_V, CLOSE]

The body is distractor records (keys never equal to the gold key) with the
gold record starting at token index ``depth`` exactly:
``prompt[depth : depth + record_length] == record``. As in `jaxroll task`,
a depth fraction f in [0, 1] maps to the token index
``first + round(f (last - first))`` (`jaxroll.task.cases.token_depth`) with
``first = 1`` (after BOS) and ``last = length - query_length -
record_length``; the distractors before the record are the tail of a stream
of whole records and those after it the head of another, so only the body's
two ends may cut one. Keys and values are drawn from the ids
``FIRST_SYMBOL .. vocab - 1``.

Training is AdamW on the answers' cross-entropy alone (the distractors are
random, nothing else is predictable); ``--queries q`` puts q questions after
each training body (the first is the test's; the others ask about other
records of the body), ``--depth-law ends`` draws the gold record's depth
fraction from Beta(1/2, 1/2) instead of uniformly; ``--train-lengths`` draws
each batch's length from its own list (default: the evaluated ``--lengths``):
a BLOOM (ALiBi) trained at N = 64 and 128 alone stays on its loss plateau
(ln 56) for 1,000 steps, while one trained at N = 32 as well leaves it by
step ~600 (validation/models/task-u-alibi/README.md). Held-out cases use their
own seed (seed + 1); the monitor cases, on which the checkpoint is chosen,
another (seed + 2). Writes under ``--out``: ``FAMILY/`` (the chosen
checkpoint) and ``FAMILY-last/`` (the final state), each with
``config.json``, ``model.safetensors`` and ``held_out.jsonl`` (the record's
token span ``[record_start, record_end)``); ``accuracy.csv``/``.json``
(accuracy by depth, bootstrap standard errors, the U test);
``training.json`` (recipe, curves, steps, wall time); ``accuracy.png``.

The run of docs/task.md, "A model trained here" (validation/models/task-u/)::

    PYTHONPATH=. python3 -u validation/train_task.py --out RUN --families llama --key-tokens 1 --queries 4 \
        --depth-law ends --lr 3e-3 --steps 2500 --eval-every 100 --monitor-samples 24 --max-seconds 900
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from jaxroll.task.cases import token_depth

PAD, BOS, OPEN, ARROW, CLOSE, QUERY = 0, 1, 2, 3, 4, 5
FIRST_SYMBOL = 8
"""Ids below this are structure tokens; keys and values are drawn from the rest."""
DEPTHS = tuple(round(0.1 * i, 1) for i in range(11))
MIDDLE = (0.4, 0.5, 0.6)
"""The depth fractions whose mean accuracy is "the middle" of the U test."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """The synthetic vocabulary and the shape of a record.

    Attributes:
        vocab: number of token ids (structure ids ``< FIRST_SYMBOL``, symbols above).
        key_tokens, value_tokens: tokens per key and per value.
    """

    vocab: int = 64
    key_tokens: int = 2
    value_tokens: int = 1

    @property
    def record_length(self) -> int:
        """``OPEN + key + ARROW + value + CLOSE``."""
        return self.key_tokens + self.value_tokens + 3

    @property
    def query_length(self) -> int:
        """``QUERY + key + ARROW``."""
        return self.key_tokens + 2

    def depth_range(self, length: int) -> tuple[int, int]:
        """(first, last): the token indices where the gold record can start in a prompt of `length`."""
        first, last = 1, length - self.query_length - self.record_length
        if last < first:
            raise ValueError(f"length: got {length}; allowed: >= {1 + self.query_length + self.record_length}")
        return first, last

    def symbols(self, rng, count: int) -> list:
        return [int(s) for s in rng.integers(FIRST_SYMBOL, self.vocab, count)]


def record_ids(layout: Layout, key: list, value: list) -> list:
    """``[OPEN, *key, ARROW, *value, CLOSE]``."""
    return [OPEN, *key, ARROW, *value, CLOSE]


def _distractors(layout: Layout, key: list, rng, count: int, head: bool) -> list:
    """`count` tokens of whole distractor records (the stream's tail; `head`: its head); keys never equal `key`."""
    if count <= 0:
        return []
    tokens = []
    while len(tokens) < count:
        other = key
        while other == key:  # a distractor never repeats the gold key
            other = layout.symbols(rng, layout.key_tokens)
        tokens += record_ids(layout, other, layout.symbols(rng, layout.value_tokens))
    return tokens[:count] if head else tokens[len(tokens) - count:]


def case_at(layout: Layout, length: int, depth: int, rng) -> dict:
    """One prompt of `length` tokens with the gold record starting at token index `depth`.

    Returns a dict: ``prompt_ids`` (length ids), ``answer_ids`` (the gold
    value), ``depth``, ``record_length``, ``key``. Raises ValueError for a
    depth outside `Layout.depth_range`.
    """
    first, last = layout.depth_range(length)
    if not first <= depth <= last:
        raise ValueError(f"depth: got {depth}; allowed: {first}..{last} at length {length}")
    key, value = layout.symbols(rng, layout.key_tokens), layout.symbols(rng, layout.value_tokens)
    record = record_ids(layout, key, value)
    before = _distractors(layout, key, rng, depth - first, head=False)
    after = _distractors(layout, key, rng, length - layout.query_length - depth - len(record), head=True)
    prompt = [BOS, *before, *record, *after, QUERY, *key, ARROW]
    assert len(prompt) == length and prompt[depth: depth + len(record)] == record
    return {"prompt_ids": prompt, "answer_ids": value, "depth": depth, "record_length": len(record), "key": key}


def make_case(layout: Layout, length: int, depth_fraction: float, sample: int, seed: int) -> dict:
    """The case of (`length`, `depth_fraction`, `sample`) under `seed`, seeded one by one as `jaxroll task`'s.

    depth = ``first + round(depth_fraction (last - first))``; the generator is
    ``default_rng([seed, length, round(1e6 depth_fraction), sample])``.
    """
    first, last = layout.depth_range(length)
    rng = np.random.default_rng([seed, length, int(round(depth_fraction * 1e6)), sample])
    case = case_at(layout, length, token_depth(depth_fraction, first, last), rng)
    return {**case, "length": length, "depth_fraction": float(depth_fraction), "sample": sample, "seed": seed}


def grid(layout: Layout, lengths, depths, samples: int, seed: int) -> list:
    """Every case of lengths x depths x samples, in that order."""
    return [make_case(layout, n, f, s, seed) for n in lengths for f in depths for s in range(samples)]


def extra_queries(layout: Layout, case: dict, count: int, rng, depth_law: str = "uniform") -> list:
    """Up to `count` more ``[QUERY, key, ARROW, value]`` questions about whole distractor records of `case`'s body.

    Only records whose key occurs once in the prompt are asked about, so each
    question has one right answer. They are drawn without replacement,
    uniformly, or under ``ends`` with weights ``1 / sqrt(f (1 - f))`` of
    their depth fraction f (clipped to [0.02, 0.98]), the Beta(1/2, 1/2) density.
    """
    prompt, size = case["prompt_ids"], layout.record_length
    end = len(prompt) - layout.query_length
    starts = [i for i in range(1, end - size + 1) if prompt[i] == OPEN and prompt[i + size - 1] == CLOSE
              and i != case["depth"]]
    keys = [tuple(prompt[i + 1: i + 1 + layout.key_tokens]) for i in range(1, end) if prompt[i] == OPEN]
    unique = [i for i in starts if keys.count(tuple(prompt[i + 1: i + 1 + layout.key_tokens])) == 1]
    if not unique:
        return []
    first, last = layout.depth_range(len(prompt))
    f = np.clip((np.asarray(unique) - first) / (last - first), 0.02, 0.98)
    weights = 1 / np.sqrt(f * (1 - f)) if depth_law == "ends" else np.ones(f.size)
    chosen = rng.choice(unique, min(count, len(unique)), replace=False, p=weights / weights.sum())
    tokens = []
    for i in chosen:
        key = prompt[i + 1: i + 1 + layout.key_tokens]
        value = prompt[i + 2 + layout.key_tokens: i + 2 + layout.key_tokens + layout.value_tokens]
        tokens += [QUERY, *key, ARROW, *value]
    return tokens


def training_batch(layout: Layout, length: int, size: int, rng, depth_law: str = "uniform", queries: int = 1):
    """(input ids ``[size, T]``, targets ``[size, T]``, -100 where no answer is due) of fresh training cases.

    Each sequence is a case (`case_at`), its answer, and ``queries - 1``
    further questions with answers (`extra_queries`, padded with PAD where
    a body has too few unique records); the targets are the answer tokens,
    each at the position before it. `depth_law`: ``uniform`` draws the gold
    record's token index uniformly over the depth range; ``ends`` draws its
    fraction from Beta(0.5, 0.5) (density 1 / (pi sqrt(f (1 - f))): records
    near the two ends more often).
    """
    first, last = layout.depth_range(length)
    if depth_law == "uniform":
        depths = rng.integers(first, last + 1, size)
    elif depth_law == "ends":
        depths = [token_depth(f, first, last) for f in rng.beta(0.5, 0.5, size)]
    else:
        raise ValueError(f"depth_law: got {depth_law!r}; allowed: uniform, ends")
    total = length + layout.value_tokens + (queries - 1) * (layout.query_length + layout.value_tokens)
    inputs = torch.full((size, total - 1), PAD, dtype=torch.long)
    targets = torch.full((size, total - 1), -100, dtype=torch.long)
    for row, depth in enumerate(depths):
        case = case_at(layout, length, int(depth), rng)
        sequence = case["prompt_ids"] + case["answer_ids"] + extra_queries(layout, case, queries - 1, rng, depth_law)
        answers = [length - 1 + j for j in range(layout.value_tokens)]
        for q in range(length + layout.value_tokens, len(sequence), layout.query_length + layout.value_tokens):
            answers += [q + layout.query_length - 1 + j for j in range(layout.value_tokens)]
        inputs[row, : len(sequence) - 1] = torch.tensor(sequence[:-1])
        targets[row, answers] = torch.tensor([sequence[a + 1] for a in answers])
    return inputs, targets


# ----------------------------------------------------------------------------- models, scoring, training


def build_model(family: str, layout: Layout, *, layers: int, heads: int, hidden: int, length: int, seed: int):
    """A fresh BLOOM (ALiBi) or Llama (rotary) causal LM over the synthetic vocabulary, float32, seeded."""
    import transformers

    if family == "bloom":
        config = transformers.BloomConfig(vocab_size=layout.vocab, hidden_size=hidden, n_layer=layers, n_head=heads,
                                          hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=BOS,
                                          eos_token_id=BOS, pad_token_id=PAD)
    elif family == "llama":
        config = transformers.LlamaConfig(vocab_size=layout.vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                                          num_hidden_layers=layers, num_attention_heads=heads,
                                          num_key_value_heads=heads, max_position_embeddings=length,
                                          tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=BOS,
                                          pad_token_id=PAD)
    else:
        raise ValueError(f"family: got {family!r}; allowed: bloom, llama")
    torch.manual_seed(seed)
    implementation = "eager" if family == "bloom" else "sdpa"
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation)


def answer_logits(model, inputs: torch.Tensor, value_tokens: int) -> torch.Tensor:
    """Logits ``[batch, value_tokens, vocab]`` predicting the answer, teacher-forced.

    The answer's first token is predicted at the prompt's last position; with
    more than one value token, the answer's own tokens are appended.
    """
    return model(input_ids=inputs).logits[:, inputs.shape[1] - 1: inputs.shape[1] - 1 + value_tokens]


def score(model, cases: list, value_tokens: int, batch_size: int = 64) -> np.ndarray:
    """Exact match (1/0) per case: every answer token is the argmax, teacher-forced (batches of one length)."""
    exact = np.zeros(len(cases))
    model.eval()
    with torch.no_grad():
        for length in sorted({c["length"] for c in cases}):
            index = [i for i, c in enumerate(cases) if c["length"] == length]
            for start in range(0, len(index), batch_size):
                chunk = [cases[i] for i in index[start: start + batch_size]]
                ids = torch.tensor([c["prompt_ids"] + c["answer_ids"][:-1] for c in chunk])
                gold = torch.tensor([c["answer_ids"] for c in chunk])
                hit = (answer_logits(model, ids, value_tokens).argmax(-1) == gold).all(-1)
                exact[index[start: start + batch_size]] = hit.double().numpy()
    return exact


def by_depth(cases: list, exact: np.ndarray, *, boots: int = 1000, seed: int = 0) -> dict:
    """Accuracy by (length, depth fraction) with bootstrap standard errors over cases, and the U test.

    For each length: ``acc[f] = mean(exact | f)``; ``middle = mean_f in MIDDLE acc[f]``;
    ``gap_start = acc[0] - middle``, ``gap_end = acc[1] - middle``. Standard
    errors: the standard deviation of each statistic over `boots` resamples
    of the cases within each depth (with replacement). ``u`` is true when
    both gaps exceed 3 standard errors.
    """
    rng = np.random.default_rng(seed)
    result = {}
    for length in sorted({c["length"] for c in cases}):
        cells = {}
        for f in sorted({c["depth_fraction"] for c in cases if c["length"] == length}):
            index = [i for i, c in enumerate(cases) if c["length"] == length and c["depth_fraction"] == f]
            cells[f] = (exact[index], cases[index[0]]["depth"])
        draws = {f: rng.choice(v, (boots, v.size)).mean(1) for f, (v, _) in cells.items()}
        middle_draws = np.mean([draws[f] for f in MIDDLE], axis=0)
        rows = [{"length": length, "depth_fraction": f, "depth": d, "cases": int(v.size), "accuracy": float(v.mean()),
                 "se": float(draws[f].std())} for f, (v, d) in cells.items()]
        middle = float(np.mean([cells[f][0].mean() for f in MIDDLE]))
        gaps = {}
        for name, f in (("start", 0.0), ("end", 1.0)):
            gap = float(cells[f][0].mean() - middle)
            se = float((draws[f] - middle_draws).std())
            gaps[name] = {"gap": gap, "se": se, "z": gap / se if se > 0 else (math.inf if gap > 0 else 0.0)}
        result[str(length)] = {"rows": rows, "middle": middle, "gaps": gaps,
                               "u": all(g["z"] > 3 for g in gaps.values())}
    return result


def summary_line(table: dict) -> str:
    """One line per length: accuracy at each depth, the two gaps in standard errors, U or not."""
    lines = []
    for length, entry in table.items():
        accs = " ".join(f"{r['accuracy']:.2f}" for r in entry["rows"])
        z = entry["gaps"]
        lines.append(f"N={length}: {accs} | start z={z['start']['z']:.1f} end z={z['end']['z']:.1f}"
                     f"{' U' if entry['u'] else ''}")
    return "\n".join(lines)


def _rate(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine to 10 % at `steps`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _u_margin(table: dict) -> float:
    """The smallest of the four gap z-scores (two ends x two lengths): > 3 is a U at both lengths."""
    return min(g["z"] for entry in table.values() for g in entry["gaps"].values())


def train(model, layout: Layout, *, lengths, steps: int, batch_size: int, learning_rate: float, warmup: int,
          depth_law: str, queries: int, seed: int, monitor: list, eval_every: int, max_seconds: float,
          log=print) -> dict:
    """AdamW on the answer's cross-entropy; returns the curve and the chosen checkpoint's state.

    Each step draws one length from `lengths` and a batch of fresh cases
    (`training_batch`) from ``default_rng([seed, 7])``. Every `eval_every`
    steps the `monitor` cases are scored; the checkpoint kept is the one with
    the largest `_u_margin` on them (the held-out cases are never seen).
    AdamW betas (0.9, 0.95), weight decay 0.1, clipping at norm 1. Stops at
    `steps`, at `max_seconds` of wall time, or when the monitor accuracy is
    >= 0.99 at every depth (flat at the ceiling: nothing left to see).
    """
    rng = np.random.default_rng([seed, 7])
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    start, curve, running = time.perf_counter(), [], []
    best = {"margin": -math.inf, "step": 0, "state": None}
    for step in range(1, steps + 1):
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * _rate(step - 1, steps, warmup)
        inputs, targets = training_batch(layout, int(rng.choice(lengths)), batch_size, rng, depth_law, queries)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, layout.vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running.append(loss.item())
        elapsed = time.perf_counter() - start
        if step % eval_every == 0 or step == steps or elapsed > max_seconds:
            table = by_depth(monitor, score(model, monitor, layout.value_tokens), boots=200)
            margin = _u_margin(table)
            curve.append({"step": step, "train_loss": float(np.mean(running)), "seconds": elapsed,
                          "u_margin": margin, "monitor": {n: [r["accuracy"] for r in e["rows"]]
                                                          for n, e in table.items()}})
            running = []
            log(f"step {step} loss {curve[-1]['train_loss']:.3f} {elapsed:.0f} s margin {margin:.1f}\n"
                + summary_line(table))
            if margin > best["margin"]:
                best = {"margin": margin, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            if min(r["accuracy"] for e in table.values() for r in e["rows"]) >= 0.99 or elapsed > max_seconds:
                break
    return {"curve": curve, "best_step": best["step"], "best_margin": best["margin"], "state": best["state"],
            "last_state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "steps_run": step, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------- outputs


def write_cases(path: Path, cases: list, exact: np.ndarray, family: str) -> None:
    """One held-out case per line: ids, the gold record's token span [start, end), the answer, exact match."""
    with open(path, "w", encoding="utf-8") as handle:
        for case, hit in zip(cases, exact):
            row = {"family": family, "length": case["length"], "depth_fraction": case["depth_fraction"],
                   "sample": case["sample"], "seed": case["seed"], "record_start": case["depth"],
                   "record_end": case["depth"] + case["record_length"], "prompt_ids": case["prompt_ids"],
                   "answer_ids": case["answer_ids"], "exact": int(hit)}
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")


def write_table(path: Path, tables: dict) -> None:
    """accuracy.csv: family, length, depth fraction, record start (token), cases, accuracy, bootstrap se."""
    lines = ["family,length,depth_fraction,record_start,cases,accuracy,se"]
    for family, table in tables.items():
        for entry in table.values():
            lines += [f"{family},{r['length']},{r['depth_fraction']},{r['depth']},{r['cases']},{r['accuracy']:.4f},"
                      f"{r['se']:.4f}" for r in entry["rows"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def plot(path: Path, tables: dict, title: str, steps: dict, chance: float) -> None:
    """Accuracy by depth fraction, one panel per family (its checkpoint's step), one line per length, +-1.96 se bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(4.8, 3.6 * len(tables)), 3.4), layout="constrained")
    FigureCanvasAgg(figure)
    for index, (family, table) in enumerate(tables.items()):
        axes = figure.add_subplot(1, len(tables), index + 1)
        for length, entry in table.items():
            f = [r["depth_fraction"] for r in entry["rows"]]
            axes.errorbar(f, [r["accuracy"] for r in entry["rows"]], yerr=[1.96 * r["se"] for r in entry["rows"]],
                          marker="o", ms=3, capsize=2, label=f"N = {length}{' (U)' if entry['u'] else ''}")
        axes.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
        axes.set(title=f"{family}, step {steps[family]}", xlabel="gold record's depth fraction",
                 ylabel="exact match (held-out)",
                 ylim=(-0.02, 1.02))
        axes.legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=120)


def run_family(family: str, args, layout: Layout, out: Path, log=print) -> dict:
    """Train one family; score the held-out grid with each kept state, save model and cases under out/NAME.

    Returns ``{NAME: {table, curve, best_step (the state's step), ...}}``.
    """
    lengths = tuple(args.lengths)
    # --train-lengths: the lengths trained on (default: the evaluated ones); short ones shorten the plateau.
    train_lengths = tuple(args.train_lengths or lengths)
    if args.init is not None:  # a continuation: start from an earlier run's saved model of this family
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(str(args.init / family), dtype=torch.float32)
    else:
        model = build_model(family, layout, layers=args.layers, heads=args.heads, hidden=args.hidden,
                            length=max(lengths + train_lengths), seed=args.seed)
    monitor = grid(layout, lengths, DEPTHS, args.monitor_samples, seed=args.seed + 2)
    result = train(model, layout, lengths=train_lengths, steps=args.steps, batch_size=args.batch,
                   learning_rate=args.lr, warmup=args.warmup, depth_law=args.depth_law, queries=args.queries,
                   seed=args.seed, monitor=monitor, eval_every=args.eval_every, max_seconds=args.max_seconds, log=log)
    last, chosen = result.pop("last_state"), result.pop("state")
    held_out = grid(layout, lengths, DEPTHS, args.samples, seed=args.seed + 1)
    parameters = int(sum(p.numel() for p in model.parameters()))
    # --keep u: the monitor's choice as FAMILY, the final state beside it as FAMILY-last; --keep last: the final only.
    states = {family: (last, result["steps_run"])} if args.keep == "last" else \
        {family: (chosen, result["best_step"]), f"{family}-last": (last, result["steps_run"])}
    entries = {}
    for name, (state, step) in states.items():
        model.load_state_dict(state)
        exact = score(model, held_out, layout.value_tokens)
        table = by_depth(held_out, exact)
        model.save_pretrained(str(out / name), safe_serialization=True)
        write_cases(out / name / "held_out.jsonl", held_out, exact, family)
        log(f"{name} held-out (step {step}):\n" + summary_line(table))
        entries[name] = {"table": table, **result, "best_step": step, "parameters": parameters}
    return entries


def _trained_at(train_lengths) -> str:
    """The figure title's note of the training lengths, empty when they are the evaluated ones."""
    return f", trained at N = {', '.join(map(str, train_lengths))}" if train_lengths else ""


def replot(out: Path) -> Path:
    """Redraw ``out/accuracy.png`` from a finished run's ``accuracy.json`` and ``training.json``."""
    tables = json.loads((out / "accuracy.json").read_text(encoding="utf-8"))
    training = json.loads((out / "training.json").read_text(encoding="utf-8"))
    recipe = training["recipe"]
    plot(out / "accuracy.png", tables,
         f"key-value retrieval, {recipe['depth_law']} depths{_trained_at(recipe.get('train_lengths'))}, "
         f"{recipe['layers']} layers x hidden {recipe['hidden']}\n"
         f"held-out exact match ({recipe['samples']} cases a point), 95% bars",
         {f: r["best_step"] for f, r in training["families"].items()}, 1 / (recipe["vocab"] - FIRST_SYMBOL))
    return out / "accuracy.png"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="write into an existing --out")
    parser.add_argument("--families", nargs="+", default=["bloom", "llama"], choices=["bloom", "llama"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--train-lengths", nargs="+", type=int, default=None,
                        help="lengths drawn for training batches (default: --lengths, which are evaluated)")
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--key-tokens", type=int, default=2)
    parser.add_argument("--value-tokens", type=int, default=1)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--depth-law", default="uniform", choices=["uniform", "ends"])
    parser.add_argument("--queries", type=int, default=1,
                        help="questions per training sequence (the first is the test's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default="u", choices=["u", "last"],
                        help="u: the checkpoint with the largest U margin on the monitor cases; last: the final one")
    parser.add_argument("--init", type=Path, default=None, help="continue from INIT/FAMILY (an earlier --out)")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--monitor-samples", type=int, default=40)
    parser.add_argument("--samples", type=int, default=200, help="held-out cases per (length, depth)")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="wall-time cap per family")
    args = parser.parse_args(argv)
    layout = Layout(vocab=args.vocab, key_tokens=args.key_tokens, value_tokens=args.value_tokens)
    try:  # refused in one line before --out is made
        for length in args.lengths + (args.train_lengths or []):
            layout.depth_range(length)
    except ValueError as error:
        parser.error(f"--lengths: {error}")
    if args.vocab <= FIRST_SYMBOL + 1 or min(args.key_tokens, args.value_tokens, args.queries, args.steps) < 1:
        parser.error(f"--vocab > {FIRST_SYMBOL + 1}, --key-tokens, --value-tokens, --queries, --steps >= 1")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        parser.error(f"--out {args.out} exists and is not empty; allowed: a new folder, or --force")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # the machine is shared
    started, results = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), {}
    for family in args.families:
        results.update(run_family(family, args, layout, args.out))
    tables = {family: r.pop("table") for family, r in results.items()}
    write_table(args.out / "accuracy.csv", tables)
    (args.out / "accuracy.json").write_text(json.dumps(tables, indent=1) + "\n", encoding="utf-8")
    recipe = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    training = {"started_utc": started, "recipe": recipe, "layout": dataclasses.asdict(layout),
                "record_length": layout.record_length, "query_length": layout.query_length,
                "depths": DEPTHS, "middle": MIDDLE, "held_out_seed": args.seed + 1, "monitor_seed": args.seed + 2,
                "families": results, "threads": 1}
    (args.out / "training.json").write_text(json.dumps(training, indent=1) + "\n", encoding="utf-8")
    plot(args.out / "accuracy.png", tables,
         f"key-value retrieval, {args.depth_law} depths{_trained_at(args.train_lengths)}, "
         f"{args.layers} layers x hidden {args.hidden}\n"
         f"held-out exact match ({args.samples} cases a point), 95% bars",
         {f: r["best_step"] for f, r in results.items()}, 1 / (args.vocab - FIRST_SYMBOL))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
