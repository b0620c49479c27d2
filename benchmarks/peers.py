"""Peers, side by side: jaxroll's gradient influence beside captum, inseq and FlashTrace.

The quantity (arXiv 2602.16837's measured influence): for one sequence of N
token ids, ``influence_j = ||d f / d e_j||_2`` with ``f = max_v
softmax(logits_{N-1})_v`` (the top probability at the last position) and
``e_j`` the input embedding of token j. Computed by

- jaxroll ``influence_gradients(model, ids)`` (`jaxroll.measure.passes`; the
  output head and the last block's attention at the target row only,
  `jaxroll.measure.target_row`) and
  ``measure(model, ids[None], stats=("influence",), batch_size=1)``, its
  ``influence_per_sequence[0]`` (the default: activation checkpointing);
- captum: ``Saliency(forward).attribute(embeddings, abs=False)`` with
  ``forward(e) = softmax(model(inputs_embeds=e).logits[:, -1]).max(-1)``, then
  the L2 norm over the embedding dimension (written as a user would: the
  full logits, no ``logits_to_keep``);
- inseq: ``inseq.load_model(model, "saliency", tokenizer=...)`` and
  ``attribute(text, generated_texts=text + " " + top)``: captum's
  ``Saliency`` (abs=True) of inseq's default target, the step function
  ``"probability"`` (``softmax(logits)[target]`` of the forced next token),
  here the top token, so the same f; ``target_attributions`` ``(N, 1, d)``
  and the L2 norm over d (inseq's own ``vnorm`` aggregation). inseq stores
  attributions in float32 (``FeatureAttributionStepOutput.__post_init__``
  casts them), so its values carry float32 rounding;
- FlashTrace (``FlashTrace(model, tok, recompute_attention=True).trace(...,
  method="ifr-span")``, Llama only): a different quantity, timed beside the
  others; its per-token scores are compared by rank correlation only.

Values: the largest difference from jaxroll's ``influence_gradients`` over
positions, divided by its largest value. A float64 Llama in transformers
rounds to float32 inside (RMSNorm, rotary tables; `jaxroll.measure.precision`),
which jaxroll removes; the peers are run as a user runs them ("as shipped")
and, for the values only, again under jaxroll's ``full_precision(model)``
(the same arithmetic: "float64 mode"; captum's run is timed as its own row).

Times: median seconds over interleaved rounds (every method once per round,
after one warm-up call of each at a small N), one torch thread by default,
all in one process; ``over_captum`` and ``over_inseq`` are each method's
time divided by captum's and inseq's (the target: at most 1 for jaxroll).

Runs with the peers' own environment (not dependencies of jaxroll), which
imports jaxroll from this checkout. The environment (run peers-1): the
system torch and transformers kept, the peers with ``--no-deps`` and then
only what they import that is missing:

    python3 -m venv --system-site-packages /work/peers-venv
    /work/peers-venv/bin/pip install --no-deps captum==0.9.0 inseq==0.7.1 flashtrace==0.1.1 \
        typeguard==2.13.3 treescope==0.1.10 seaborn==0.13.2
    /work/peers-venv/bin/pip install spacy==3.8.18 wordfreq==3.1.1  # FlashTrace imports them
    /work/peers-venv/bin/python benchmarks/peers.py --n 512 4096 --rounds 15 5
    /work/peers-venv/bin/python benchmarks/peers.py --n 512 4096 --rounds 15 5 --dtype float32 --flashtrace-max-n 0
    /work/peers-venv/bin/python benchmarks/peers.py --n 32768 --rounds 1 --families llama \
        --only "captum Saliency + L2" "inseq saliency + L2"

``--dtype float32`` (the dtype users run by default) builds the models in
float32 for every method; the float64 mode rows are left out there (it does
nothing to a float32 model).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import resource
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's jaxroll, before any installed one

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 256
COLUMNS = ("family", "dtype", "N", "method", "seconds", "over_captum", "over_inseq", "rel_diff", "rel_diff_float64_mode",
           "rounds", "peak_rss_gib")


def tokenizer_for(vocab: int):
    """A word-level fast tokenizer: word ``w{i}`` is id i (inseq and FlashTrace take text, not ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", pad_token="w0")


def tiny_model(family: str, max_n: int, dtype: str = "float64", layers: int = 2):
    """A causal LM from a config in `dtype` (sdpa attention): `layers` layers (2 by default), hidden 64, 4 heads."""
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                          max_position_embeddings=max_n)
    else:
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=layers, n_head=4, n_positions=max_n)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.to(getattr(torch, dtype)).eval()
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(3.0)
    return model


def top_token(model, ids) -> int:
    from jaxroll.measure.precision import full_precision

    with torch.no_grad(), full_precision(model):
        return int(model(torch.as_tensor(ids)[None], use_cache=False).logits[0, -1].argmax())


def jaxroll_methods(model, ids):
    from jaxroll.measure import influence_gradients, measure

    return {
        "jaxroll influence_gradients": lambda: influence_gradients(model, ids),
        "jaxroll measure (influence)": lambda: measure(model, ids[None], stats=("influence",),
                                                       batch_size=1).influence_per_sequence[0],
        # Without the default activation checkpointing (which recomputes each block's forward to save memory).
        "jaxroll measure (influence, no checkpointing)": lambda: measure(
            model, ids[None], stats=("influence",), batch_size=1, checkpointing=False).influence_per_sequence[0],
    }


def captum_method(model, ids):
    from captum.attr import Saliency

    def forward(embeddings):
        logits = model(inputs_embeds=embeddings, use_cache=False).logits[:, -1]
        return torch.softmax(logits, dim=-1).max(dim=-1).values  # f per example: Saliency needs no target

    saliency = Saliency(forward)

    def run():
        embeddings = model.get_input_embeddings()(torch.as_tensor(ids)[None]).detach()
        return saliency.attribute(embeddings, abs=False)[0].norm(dim=-1).numpy()

    return run


_INSEQ = {}  # one inseq wrapper per model, loaded once as a user would


def inseq_method(model, tokenizer, ids, top):
    import inseq

    if id(model) not in _INSEQ:
        _INSEQ[id(model)] = inseq.load_model(model, "saliency", tokenizer=tokenizer)
    attribution_model = _INSEQ[id(model)]
    text = " ".join(f"w{i}" for i in ids)
    generated = f"{text} w{top}"  # the forced target: the top token, so inseq's "probability" is f

    def run():
        out = attribution_model.attribute(text, generated_texts=generated, show_progress=False)
        scores = out.sequence_attributions[0].target_attributions  # (N + 1, 1, d), prompt rows first
        return scores[: len(ids), 0].double().norm(dim=-1).numpy()

    return run


def flashtrace_method(model, tokenizer, ids, top):
    from flashtrace import FlashTrace

    tracer = FlashTrace(model, tokenizer, recompute_attention=True)
    text = " ".join(f"w{i}" for i in ids)

    def run():
        result = tracer.trace(prompt=text, target=f" w{top}", method="ifr-span")
        return np.asarray(result.scores, dtype=np.float64)

    return run


def in_float64_mode(model, function):
    from jaxroll.measure.precision import full_precision

    def run():
        with full_precision(model):
            return function()

    return run


def methods(family, model, tokenizer, ids, flashtrace_max_n, float64_mode, only=None):
    top = top_token(model, ids)
    found = dict(jaxroll_methods(model, ids))
    found["captum Saliency + L2"] = captum_method(model, ids)
    if float64_mode:  # the same arithmetic as jaxroll's, timed: what the float64 mode itself costs
        found["captum Saliency + L2, float64 mode"] = in_float64_mode(model, found["captum Saliency + L2"])
    found["inseq saliency + L2"] = inseq_method(model, tokenizer, ids, top)
    if family == "llama" and len(ids) <= flashtrace_max_n:
        found["FlashTrace ifr-span (other quantity)"] = flashtrace_method(model, tokenizer, ids, top)
    # --only: the reference (influence_gradients) and the methods named, for long N where each call takes minutes
    return {name: function for name, function in found.items()
            if only is None or name == "jaxroll influence_gradients" or name in only}


def rounds_of(functions: dict, rounds: int):
    """(median seconds, first result) of each function, calls interleaved round by round."""
    times = {name: [] for name in functions}
    results, failed = {}, {}
    for _ in range(rounds):
        for name, function in functions.items():
            if name in failed:
                continue
            start = time.perf_counter()
            try:
                value = function()
            except (RuntimeError, MemoryError, ValueError) as error:  # out of memory, a peer's refusal: said, not fatal
                failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                continue
            times[name].append(time.perf_counter() - start)
            results.setdefault(name, np.asarray(value, dtype=np.float64))
    return {name: statistics.median(values) for name, values in times.items() if values}, results, failed


def relative(value, reference) -> float:
    return float(np.max(np.abs(value - reference)) / np.max(np.abs(reference)))


def spearman(a, b) -> float:
    ranks = [np.argsort(np.argsort(x)).astype(np.float64) for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def float64_mode_values(model, functions: dict, reference) -> dict:
    """inseq's values again under jaxroll's float64 mode (the same arithmetic as jaxroll's; captum's is timed)."""
    from jaxroll.measure.precision import full_precision

    out = {}
    if "inseq saliency + L2" in functions:
        with full_precision(model):
            out["inseq saliency + L2"] = relative(np.asarray(functions["inseq saliency + L2"](), np.float64), reference)
    return out


def case(family, n, rounds, flashtrace_max_n, model, tokenizer, float64_mode=True, only=None,
         dtype="float64") -> list[dict]:
    ids = np.random.default_rng(n).integers(1, VOCAB, n)  # id 0 ("w0") is the pad token, which inseq drops
    functions = methods(family, model, tokenizer, ids, flashtrace_max_n, float64_mode, only)
    seconds, values, failed = rounds_of(functions, rounds)
    reference = values["jaxroll influence_gradients"]
    ran = {name: functions[name] for name in values}
    exact = float64_mode_values(model, ran, reference) if float64_mode else {}
    if "captum Saliency + L2, float64 mode" in values:
        exact["captum Saliency + L2"] = relative(values["captum Saliency + L2, float64 mode"], reference)
    captum, inseq = seconds.get("captum Saliency + L2"), seconds.get("inseq saliency + L2")
    rows = []
    for name, value in values.items():
        other = name.startswith("FlashTrace")
        rows.append({
            "family": family, "dtype": dtype, "N": n, "method": name, "seconds": seconds[name],
            "over_captum": seconds[name] / captum if captum else "", "over_inseq": seconds[name] / inseq if inseq else "",
            "rel_diff": f"rank corr {spearman(value, reference):.3f}" if other else relative(value, reference),
            "rel_diff_float64_mode": exact.get(name, ""), "rounds": rounds,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        })
    for name, error in failed.items():
        rows.append({"family": family, "dtype": dtype, "N": n, "method": name, "seconds": "", "over_captum": "", "over_inseq": "",
                     "rel_diff": error, "rel_diff_float64_mode": "", "rounds": rounds, "peak_rss_gib": ""})
    return rows


def versions() -> str:
    names = ("torch", "transformers", "captum", "inseq", "flashtrace", "numpy")
    return ", ".join(f"{name} {metadata.version(name)}" for name in names) + f", python {platform.python_version()}"


def fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 4096, 32768])
    parser.add_argument("--families", nargs="+", default=["llama", "gpt2"], choices=["llama", "gpt2"])
    parser.add_argument("--rounds", type=int, nargs="+", default=[5, 3, 1],
                        help="interleaved rounds at each N (the last value for the remaining N)")
    parser.add_argument("--flashtrace-max-n", type=int, default=4096,
                        help="FlashTrace forms (H, N, N) attention per layer: beyond this N it is not run")
    parser.add_argument("--float64-mode-max-n", type=int, default=4096,
                        help="the peers' values again under jaxroll's float64 mode up to this N (one more call each)")
    parser.add_argument("--only", nargs="+", default=None, help="time only these methods (by name) and jaxroll's "
                        "influence_gradients, e.g. --only 'captum Saliency + L2' 'inseq saliency + L2'")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                        help="the models' dtype, the same for every method (float32: no float64 mode rows)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the tiny models (influence_gradients "
                        "computes the last one's attention at the target row only: 1/layers of the attention)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as CSV")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# {versions()}; torch threads {args.threads}; {args.dtype}; {args.layers} layers; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS), flush=True)
    rows = []
    for family in args.families:
        model, tokenizer = tiny_model(family, max(args.n) + 1, args.dtype, args.layers), tokenizer_for(VOCAB)
        wide = args.dtype == "float64"  # the float64 mode changes nothing in a float32 model
        case(family, 64, 1, args.flashtrace_max_n, model, tokenizer, float64_mode=wide)  # warm-up: first calls
        for index, n in enumerate(args.n):
            rounds = args.rounds[min(index, len(args.rounds) - 1)]
            for row in case(family, n, rounds, args.flashtrace_max_n, model, tokenizer,
                            float64_mode=wide and n <= args.float64_mode_max_n, only=args.only, dtype=args.dtype):
                rows.append(row)
                print("| " + " | ".join(fmt(row[c]) for c in COLUMNS) + " |", flush=True)
    print(f"# done {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    if args.out is not None:
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
