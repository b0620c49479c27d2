"""End-to-end validation of the residual-aware rollout on language models trained here.

The claim under test (arXiv 2602.16837): on a trained causal LM, the
residual-aware rollout

    R_t = (1 - lambda_t) I + lambda_t A_t,    P_T = R_T ... R_1,    p_T(j) = P_T[N-1, j]

(``A[i, j]`` = weight with which token i reads token j, ``lambda_t`` the
measured mixing coefficient) predicts the measured gradient influence
``||d f / d e_j||`` of each input embedding on the last position's top
probability far better than the attention-only rollout (``lambda_t = 1``),
and better still with measured content.

Everything here is offline and seeded: the corpus is the Python standard
library's own source (present on every machine that runs Python), the
tokenizer is a byte-level BPE trained on it with `tokenizers`, the models
are a BLOOM (ALiBi) and a Llama (rotary) trained from scratch with torch on
the CPU. `validation/run.py` is the full run; `tests/test_validation.py`
runs a tiny version of the same functions.

Independent of jaxroll's measuring code, `crosscheck` recomputes lambda_t and
the gradient influence with plain PyTorch hooks on other modules (BLOOM: the
attention module's output minus the block input; both: a forward hook on
the embedding that swaps in a leaf tensor, and a normal ``input_ids``
forward) so that `jaxroll measure` is checked against a second derivation.
For Llama the attention module's output is its output projection's, so
there the two derivations read the same tensors and agree bit for bit; for
BLOOM they take different routes and agree to rounding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from jaxroll.measure.precision import full_precision

FAMILIES = ("bloom", "llama")
EOS = "<|endoftext|>"


# ----------------------------------------------------------------------------- corpus and tokenizer


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's ``*.py`` files, sorted by path relative to `root`.

    `root` defaults to ``sysconfig.get_paths()["stdlib"]``; third-party
    packages (``site-packages``, ``dist-packages``) are left out, so the corpus
    is the same on every installation of one Python version.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [path for path in root.rglob("*.py")
             if not ({"site-packages", "dist-packages", "__pycache__"} & set(path.relative_to(root).parts))]
    return sorted(files, key=lambda path: path.relative_to(root).as_posix())


def split_corpus(files: list[Path], held_out_every: int = 10) -> tuple[list[str], list[str]]:
    """Texts of the train and held-out files: every `held_out_every`-th file (from index 0) is held out.

    A fixed, seed-free split by position in the sorted list. Files are read
    as UTF-8 with undecodable bytes replaced (a few test files hold
    deliberately bad encodings).
    """
    train, held_out = [], []
    for index, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        (held_out if index % held_out_every == 0 else train).append(text)
    return train, held_out


def train_tokenizer(texts: list[str], vocab_size: int, directory: Path, *, max_characters: int = 8_000_000):
    """A byte-level BPE tokenizer trained on `texts`, saved so ``AutoTokenizer.from_pretrained(directory)`` loads it.

    Trained on the first `max_characters` characters of the texts (in
    order), which is deterministic. The only special token is ``EOS``, which
    separates documents in training; no BOS is added to encoded text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    sample, total = [], 0
    for text in texts:
        if total >= max_characters:
            break
        sample.append(text)
        total += len(text)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sample, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, model_max_length=1_000_000)
    directory.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(directory))
    return wrapped


def token_stream(tokenizer, texts: list[str]) -> np.ndarray:
    """One int64 stream: each text's tokens followed by EOS."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    pieces = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        pieces.append(np.asarray(ids, dtype=np.int64))
        pieces.append(np.array([eos], dtype=np.int64))
    return np.concatenate(pieces)


# ----------------------------------------------------------------------------- models and training


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The size of a trained model: layers, heads, hidden width, context length."""

    layers: int = 6
    heads: int = 6
    hidden: int = 192
    length: int = 256


def build_model(family: str, geometry: Geometry, vocab_size: int, seed: int):
    """A freshly initialised BLOOM (ALiBi) or Llama (rotary) causal LM, float32, seeded."""
    import transformers

    if family == "bloom":
        config = transformers.BloomConfig(
            vocab_size=vocab_size, hidden_size=geometry.hidden, n_layer=geometry.layers, n_head=geometry.heads,
            hidden_dropout=0.0, attention_dropout=0.0, eos_token_id=0, bos_token_id=0)
    elif family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=geometry.hidden, intermediate_size=4 * geometry.hidden,
            num_hidden_layers=geometry.layers, num_attention_heads=geometry.heads,
            num_key_value_heads=geometry.heads, max_position_embeddings=geometry.length,
            tie_word_embeddings=True, eos_token_id=0, bos_token_id=0)
    else:
        raise ValueError(f"family: got {family!r}; allowed: one of {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    # BLOOM has only the eager attention in transformers 5.24; Llama trains faster on SDPA.
    implementation = "eager" if family == "bloom" else "sdpa"
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation)


def _windows(stream: np.ndarray, starts: np.ndarray, length: int) -> torch.Tensor:
    return torch.as_tensor(np.stack([stream[s: s + length] for s in starts]))


def held_out_loss(model, stream: np.ndarray, length: int, *, windows: int = 64, seed: int = 1) -> float:
    """Mean next-token cross-entropy (nats) on `windows` fixed windows of the held-out stream."""
    starts = np.random.default_rng(seed).integers(0, stream.size - length, windows)
    batch = _windows(stream, starts, length)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [float(model(input_ids=batch[i: i + 8], labels=batch[i: i + 8]).loss)
                  for i in range(0, windows, 8)]
    model.train(was_training)
    return float(np.mean(losses))


def train(model, stream: np.ndarray, held_out: np.ndarray, *, steps: int, length: int, batch_size: int = 16,
          learning_rate: float = 2e-3, warmup: int = 100, seed: int = 0, eval_every: int = 100,
          max_seconds: float = float("inf"), log=print, on_step=None) -> list[dict]:
    """AdamW on random windows of `stream`; returns the loss curve.

    Schedule: linear warm-up over `warmup` steps, cosine decay to 10 % of
    `learning_rate` over the steps or `max_seconds`, whichever ends first; betas (0.9, 0.95), weight decay 0.1, gradient clipping
    at norm 1. Windows start at offsets drawn from ``default_rng(seed)``.
    Each row of the curve: step, mean training loss since the last row,
    held-out loss, wall seconds since the start. Training stops early once
    `max_seconds` of wall time have passed (the machine may be shared, so a
    fixed step count can take much longer than planned); the last row says
    how far it got. ``on_step(step, model)``, when given, is called at step 0
    (before training) and after every optimiser step (checkpoints).
    """
    generator = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)

    def rate(step, elapsed):
        # Cosine over whichever runs out first, the steps or the wall time,
        # so a run cut short by a busy machine still ends annealed.
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, max((step - warmup) / max(1, steps - warmup), elapsed / max_seconds))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    curve = [{"step": 0, "train_loss": float("nan"), "held_out_loss": held_out_loss(model, held_out, length),
              "seconds": 0.0}]
    start, running = time.perf_counter(), []
    if on_step is not None:
        on_step(0, model)
    model.train()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * rate(step - 1, time.perf_counter() - start)
        batch = _windows(stream, generator.integers(0, stream.size - length, batch_size), length)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running.append(loss.item())
        if on_step is not None:
            model.eval()
            on_step(step, model)
            model.train()
        out_of_time = time.perf_counter() - start > max_seconds
        if step % eval_every == 0 or step == steps or out_of_time:
            row = {"step": step, "train_loss": float(np.mean(running)),
                   "held_out_loss": held_out_loss(model, held_out, length),
                   "seconds": time.perf_counter() - start}
            curve.append(row)
            running = []
            log(f"  step {step:5d}  train {row['train_loss']:.3f}  held-out {row['held_out_loss']:.3f}  "
                f"{row['seconds']:.0f} s")
        if out_of_time:
            break
    model.eval()
    return curve


# ----------------------------------------------------------------------------- measuring


def stats_for(family: str) -> str:
    """What `jaxroll measure` can give: content (q.k before the softmax) only for ALiBi models."""
    return "lambda,content,influence,attention" if family == "bloom" else "lambda,influence,attention"


def write_texts(texts: list[str], path: Path) -> Path:
    """The held-out documents as a ``.jsonl`` with a ``text`` field (a ``.txt`` would split code at blank lines)."""
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def run_measure(model_dir: Path, texts: Path, out: Path, *, family: str, length: int, samples: int) -> dict:
    """``jaxroll measure MODEL_DIR --dtype float64 ...`` (the command line, in this process); the measured arrays."""
    from jaxroll import cli
    from jaxroll.measure import read_measurement

    status = cli.main(["measure", str(model_dir), "--texts", str(texts), "--length", str(length),
                       "--samples", str(samples), "--out", str(out), "--stats", stats_for(family),
                       "--dtype", "float64", "--force"])
    if status != 0:
        raise RuntimeError(f"jaxroll measure {model_dir} failed with status {status}")
    arrays, metadata = read_measurement(out)
    arrays["metadata"] = metadata
    return arrays


def load_float64(directory: Path):
    """A saved model in float64 with eager attention, through transformers alone (for `crosscheck`)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), local_files_only=True, dtype=torch.float64, attn_implementation="eager").eval()


def _blocks(model):
    # Where each family keeps its blocks and attention: written here, not read from jaxroll's layer maps.
    if model.config.model_type == "bloom":
        return [(block, block.self_attention) for block in model.transformer.h]
    return [(block, block.self_attn) for block in model.model.layers]


def crosscheck(model, token_ids: np.ndarray) -> dict[str, np.ndarray]:
    """lambda_t and gradient influence per sequence, from plain PyTorch hooks (no jaxroll code).

    - ``lambda_t = mean_i ||a_i|| / (||x_i|| + ||a_i||)`` with ``x`` the block
      input (a forward pre-hook on the block) and ``a`` the attention
      sub-layer's contribution to the residual stream: for Llama the
      attention module's output; for BLOOM, whose attention module adds the
      residual itself, its output minus ``x``.
    - influence ``||d f / d e_j||_2``, ``f`` the top next-token probability at
      the last position: a forward hook on the input embedding replaces its
      output by a leaf tensor whose ``.grad`` is read after ``f.backward()``;
      the model is called with ``input_ids``.

    Returns ``lambdas (S, T)`` and ``influence (S, N)`` (unnormalised norms).
    """
    blocks = _blocks(model)
    is_bloom = model.config.model_type == "bloom"
    inputs, ratios, leaf = {}, {}, {}

    def block_input(layer):
        def hook(module, args, kwargs):
            inputs[layer] = (args[0] if args else kwargs["hidden_states"]).detach()
        return hook

    def attention_output(layer):
        def hook(module, args, output):
            out = (output[0] if isinstance(output, tuple) else output).detach()
            x = inputs[layer]
            a = out - x if is_bloom else out
            a_norm, x_norm = a.norm(dim=-1), x.norm(dim=-1)
            ratios[layer] = float((a_norm / (x_norm + a_norm)).mean())
        return hook

    def embedding(module, args, output):
        leaf["e"] = output.detach().requires_grad_(True)
        return leaf["e"]

    handles = [model.get_input_embeddings().register_forward_hook(embedding)]
    for layer, (block, attention) in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(block_input(layer), with_kwargs=True))
        handles.append(attention.register_forward_hook(attention_output(layer)))
    flags = [parameter.requires_grad for parameter in model.parameters()]
    lambdas, influence = [], []
    model.eval()
    try:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        for row in np.asarray(token_ids):
            ratios.clear()
            with full_precision(model):  # a float64 model in float64 throughout, as measure runs it
                logits = model(input_ids=torch.as_tensor(row)[None], use_cache=False).logits[0, -1]
                torch.softmax(logits, dim=-1).max().backward()
            lambdas.append([ratios[t] for t in range(len(blocks))])
            influence.append(leaf["e"].grad[0].norm(dim=-1).double().numpy())
    finally:
        for handle in handles:
            handle.remove()
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
    return {"lambdas": np.asarray(lambdas), "influence": np.asarray(influence)}


def crosscheck_differences(measured: dict, check: dict) -> dict[str, float]:
    """Largest absolute differences between `jaxroll measure` and `crosscheck`.

    ``lambda``: per layer, mean over sequences; ``influence``: the normalised
    mean profile (what the rollout is compared with); ``influence_raw``: the
    mean gradient norms, relative to their largest value.
    """
    influence_raw = check["influence"].mean(axis=0)
    return {
        "lambda": float(np.max(np.abs(measured["lambdas"] - check["lambdas"].mean(axis=0)))),
        "influence": float(np.max(np.abs(measured["influence"] - influence_raw / influence_raw.sum()))),
        "influence_raw": float(np.max(np.abs(measured["influence_raw"] - influence_raw)) / np.max(influence_raw)),
    }


# ----------------------------------------------------------------------------- predictions and scores


def influence_from_kernels(lambdas: np.ndarray, kernels: np.ndarray) -> np.ndarray:
    """The residual-aware rollout with dense per-layer kernels, NumPy float64.

    ``p^T = e_{N-1}^T R_T ... R_1`` with ``R_t = (1 - lambda_t) I + lambda_t A_t``,
    applied from layer T down to layer 1 as ``p <- (1 - lambda_t) p + lambda_t p A_t``
    (one vector-times-matrix product per layer; P_T is never formed).
    `lambdas` ``(T,)``, `kernels` ``(T, N, N)`` row-stochastic (the measured
    head-averaged attention ``attention_mean``). Returns ``(N,)``.
    """
    lambdas = np.asarray(lambdas, dtype=np.float64)
    kernels = np.asarray(kernels, dtype=np.float64)
    p = np.zeros(kernels.shape[-1])
    p[-1] = 1.0
    for t in range(lambdas.size - 1, -1, -1):
        p = (1.0 - lambdas[t]) * p + lambdas[t] * (p @ kernels[t])
    return p


def structural_model(measured: dict, *, lambdas=None, content: bool = True):
    """The jaxroll model of a measurement: measured slopes (logit units), lambdas, content (or none).

    Content in logit units is ``logit_scale * content_diagonal`` (what
    ``config.yaml`` of `jaxroll measure` holds); Llama has no slopes (0) and
    no measured content, so its structural kernel is uniform causal attention.
    """
    import jaxroll

    metadata = measured["metadata"]
    layers, heads = int(metadata["num_layers"]), int(metadata["num_heads"])
    diagonal = 0.0
    if content and "content_diagonal" in measured:
        diagonal = float(measured["logit_scale"]) * measured["content_diagonal"]
    return jaxroll.RolloutModel.create(
        num_layers=layers, num_heads=heads,
        lambdas=np.clip(measured["lambdas"] if lambdas is None else lambdas, 0.0, 1.0),
        alibi_slopes=measured["alibi_slopes_logit"], diagonal_scores=diagonal,
        sequence_length=int(measured["influence"].size))


def predictions(measured: dict, *, fit_steps: int = 500) -> tuple[dict[str, np.ndarray], dict]:
    """Predicted influence profiles of one measurement, by variant.

    - ``attention-only``: ``lambda_t = 1``, structural kernels (measured
      slopes, no content), the rollout of Abnar & Zuidema / Wu et al.;
    - ``attention-only, measured kernels``: ``lambda_t = 1``, ``A_t`` =
      measured mean attention;
    - ``residual, no content``: measured lambda_t, structural kernels without content;
    - ``residual, measured content``: measured lambda_t and diagonal content (ALiBi only);
    - ``residual, measured kernels``: measured lambda_t and ``A_t``
      (`influence_from_kernels`);
    - ``fitted lambdas``: `jaxroll.fit` of a free lambda schedule to the
      measured influence (Wasserstein loss), starting from the best
      structural variant (with content where measured). In-sample: it shows
      what the functional form can express, not a prediction. Skipped
      (no profile, empty details) when `fit_steps` is 0.

    Returns the profiles and the fit's details.
    """
    import jaxroll

    n = int(measured["influence"].size)
    layers = int(measured["metadata"]["num_layers"])
    has_content = "content_diagonal" in measured
    profiles = {}
    profiles["attention-only"] = np.asarray(jaxroll.influence(structural_model(
        measured, lambdas=np.ones(layers), content=False)), dtype=np.float64)
    profiles["attention-only, measured kernels"] = influence_from_kernels(np.ones(layers), measured["attention_mean"])
    profiles["residual, no content"] = np.asarray(jaxroll.influence(structural_model(measured, content=False)),
                                                  dtype=np.float64)
    if has_content:
        profiles["residual, measured content"] = np.asarray(jaxroll.influence(structural_model(measured)),
                                                            dtype=np.float64)
    profiles["residual, measured kernels"] = influence_from_kernels(measured["lambdas"], measured["attention_mean"])
    if fit_steps == 0:
        return profiles, {}
    start = structural_model(measured, content=has_content)
    target = measured["influence"] / measured["influence"].sum()
    result = jaxroll.fit(start, target, fit=("lambdas",), steps=fit_steps, n=n)
    profiles["fitted lambdas"] = np.asarray(result.profile, dtype=np.float64)
    details = {"fitted_lambdas": np.asarray(result.model.lambdas, dtype=np.float64),
               "fit_initial_loss": result.initial_loss, "fit_final_loss": result.final_loss}
    return profiles, details


def scores(profiles: dict[str, np.ndarray], measured_profile: np.ndarray) -> dict[str, dict[str, float]]:
    """W1/(N-1), Spearman and KL(measured || predicted) of each profile (`jaxroll.measure.uncertainty`'s metrics)."""
    from jaxroll.measure import uncertainty

    q = np.asarray(measured_profile, dtype=np.float64)
    return {name: {"wasserstein": float(uncertainty.wasserstein(p, q)), "spearman": float(uncertainty.spearman(p, q)),
                   "kl": float(uncertainty.kl(q, p))} for name, p in profiles.items()}


def noise_of_the_mean(per_sequence_influence: np.ndarray, *, boots: int = 1000, seed: int = 0) -> dict[str, float]:
    """The measurement's own noise: the median bootstrap W1 between a resampled mean and the mean.

    `jaxroll.measure.uncertainty.score`'s ``noise`` (``wasserstein``) and
    ``noise_q95`` (``q95``): a perfect prediction scores W1 about ``noise``.
    """
    from jaxroll.measure import uncertainty

    rows = np.asarray(per_sequence_influence, dtype=np.float64)
    measured = rows.sum(axis=0) / rows.sum()
    result = uncertainty.score(measured, rows, B=boots, seed=seed)
    return {"wasserstein": result.noise, "q95": result.noise_q95, "n_eff": result.n_eff}


def check_profile(p: np.ndarray, *, tolerance: float = 1e-6) -> None:
    """Raise AssertionError unless `p` is a probability vector (finite, >= 0, sum 1 within `tolerance`).

    Why 1e-6 and not 1e-12: BLOOM computes its attention softmax in float32
    even in a float64 model, so measured kernels are row-stochastic only to
    ~3e-8 per row, and a rollout through T of them to about T times that.
    """
    p = np.asarray(p)
    if not (np.all(np.isfinite(p)) and np.all(p >= -tolerance) and abs(p.sum() - 1.0) <= tolerance):
        raise AssertionError(f"not a probability vector: min {p.min():.3g}, sum {p.sum():.12g}")


# ----------------------------------------------------------------------------- reporting

METRICS = (("wasserstein", "W1/(N-1), lower is better"), ("spearman", "Spearman, higher is better"),
           ("kl", "KL(measured || predicted), nats, lower is better"))


def format_rows(name: str, result: dict) -> str:
    """A plain-text block of one model's scores, for the log."""
    lines = [f"{name}: cross-check max |diff| lambda {result['crosscheck']['lambda']:.2e}, "
             f"influence {result['crosscheck']['influence']:.2e}"]
    for variant, row in result["scores"].items():
        lines.append(f"  {variant:34s} W1 {row['wasserstein']:.4f}  rho {row['spearman']:+.3f}  KL {row['kl']:.4f}")
    lines.append(f"  {'noise of the mean (median W1)':34s} W1 {result['noise']['wasserstein']:.4f}")
    return "\n".join(lines)


def markdown_table(results: dict) -> str:
    """One Markdown table per metric: variants down, models across (the paper's layout)."""
    names = list(results)
    variants = list(dict.fromkeys(v for result in results.values() for v in result["scores"]))
    blocks = []
    for metric, title in METRICS:
        lines = [f"**{title}**", "", "| variant | " + " | ".join(names) + " |",
                 "|---|" + "---:|" * len(names)]
        # The noise of the mean is a W1: it has no Spearman or KL row.
        for variant in variants + (["noise of the mean (median W1)"] if metric == "wasserstein" else []):
            cells = []
            for name in names:
                row = results[name]["noise"] if variant.startswith("noise") else results[name]["scores"].get(variant)
                cells.append("" if row is None or metric not in row else f"{row[metric]:.4f}" if metric != "spearman"
                             else f"{row[metric]:+.3f}")
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    checks = ["| cross-check, max abs difference | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, label in (("lambda", "lambda_t"), ("influence", "influence (normalised)"),
                       ("influence_raw", "influence (raw, relative)")):
        checks.append(f"| {label} | " + " | ".join(f"{results[n]['crosscheck'][key]:.1e}" for n in names) + " |")
    blocks.append("\n".join(checks))
    return "\n\n".join(blocks) + "\n"


def write_csv(results: dict, path: Path) -> Path:
    """``model,variant,wasserstein,spearman,kl`` (the noise of the mean as variant ``noise of the mean``)."""
    import csv

    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "variant", "wasserstein", "spearman", "kl"])
        for name, result in results.items():
            for variant, row in result["scores"].items():
                writer.writerow([name, variant, row["wasserstein"], row["spearman"], row["kl"]])
            writer.writerow([name, "noise of the mean", result["noise"]["wasserstein"], "", ""])
    return path


def training_summary(training: dict) -> str:
    return "\n".join(
        f"{family}: {row['parameters']} parameters, {row['steps']} steps in {row['seconds'] / 60:.1f} min, "
        f"held-out loss {row['initial_held_out_loss']:.3f} -> {row['final_held_out_loss']:.3f} nats/token"
        for family, row in training.items())


def machine_description() -> str:
    import os
    import platform

    return f"{platform.machine()}, {os.cpu_count()} CPU cores visible, torch threads {torch.get_num_threads()}"


SHOWN = ("attention-only", "residual, no content", "residual, measured content", "residual, measured kernels",
         "fitted lambdas")


def plot(results: dict, curves: dict, path: Path) -> Path:
    """Measured and predicted profiles of each model (log scale), and the loss curves."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(results)
    columns = len(names) + 1
    figure = Figure(figsize=(3.2 * columns, 3.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, columns)
    for axis, name in zip(axes, names):
        measured = np.asarray(results[name]["measured"])
        positions = np.arange(measured.size)
        axis.plot(positions, measured, color="black", linewidth=2.0, label="measured")
        for colour, variant in enumerate(SHOWN):
            # A fixed colour per variant, also in panels that lack one (no content for rotary models).
            if variant in results[name]["profiles"]:
                axis.plot(positions, results[name]["profiles"][variant], linewidth=1.0, label=variant,
                          color=f"C{colour}")
        axis.set_yscale("log")
        axis.set_ylim(max(1e-6, measured.min() / 30), 1.5)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("input position j", fontsize=8)
        axis.tick_params(labelsize=7)
    axes[0].set_ylabel("influence on the last position", fontsize=8)
    axes[0].legend(fontsize=6, loc="lower left")
    for family, curve in curves.items():
        steps = [row["step"] for row in curve]
        axes[-1].plot(steps, [row["held_out_loss"] for row in curve], marker=".", label=f"{family} held out")
        axes[-1].plot(steps[1:], [row["train_loss"] for row in curve[1:]], linestyle="--", label=f"{family} train")
    axes[-1].set_title("training: held-out and train loss", fontsize=9)
    axes[-1].set_xlabel("step", fontsize=8)
    axes[-1].set_ylabel("cross-entropy, nats/token", fontsize=8)
    axes[-1].legend(fontsize=6)
    axes[-1].tick_params(labelsize=7)
    figure.savefig(path, dpi=90)
    return path
