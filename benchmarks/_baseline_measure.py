# The measure loop as it was before per-sequence influence and progress (jaxroll commit 0d814fc),
# for benchmarks/measure.py: a verbatim copy of jaxroll/measure/measure.py at that commit with
# absolute imports, the baseline that the new path is timed against in the same process.
"""One forward and one backward pass per sequence: lambda_t, content, influence.

For a causal LM with L blocks, H heads, head dimension d and sequences of N
tokens (the measurements of arXiv 2602.16837):

- ``lambda_t``: per token ``||a|| / (||x|| + ||a||)`` (L2 over the hidden
  dimension, computed in float64, 0 where both norms vanish), ``x`` the
  residual stream entering block t, ``a`` its attention sub-layer output;
  averaged over the N positions, then over sequences (mean and standard
  deviation across sequences).
- content: the mean over sequences of the raw products ``q_i . k_j``,
  accumulated in float64 without forming per-sequence N x N matrices:
  ``diag = mean_i q_i . k_i`` and ``low = mean_{i > j} q_i . k_j`` come from
  the running sum ``sum_{j < i} k_j``. ``base = low``,
  ``diagonal = diag - base``. The full mean matrix (``"qk"``) is kept only
  when asked for, on every `positions`-th position.
- ``"attention"``: the head-averaged attention probabilities ``(L, N, N)``,
  averaged over sequences.
- influence: ``f = max_v softmax(logits_{N-1})_v`` (softmax in float32, or
  float64 for a float64 model), ``influence_j = ||df / de_j||_2`` with
  ``e_j`` the token embedding at j (before any embedding LayerNorm); the mean
  over sequences in float64, normalised to sum 1 over positions.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from jaxroll.errors import ConfigError
from jaxroll.measure.hooks import Hooks
from jaxroll.measure.layer_maps import FALCON_VARIANTS, LayerMap, resolve

__all__ = ["measure", "Measurement", "STATS", "DEFAULT_STATS", "influence_gradients", "parse_stats"]

STATS = ("lambda", "content", "influence", "attention", "qk")
DEFAULT_STATS = ("lambda", "content", "influence")


@dataclasses.dataclass
class Measurement:
    """The result of `measure`; arrays are float64 NumPy, absent stats are None.

    Shapes: ``lambdas, lambdas_std (L,)``, ``lambdas_per_sequence (S, L)``,
    ``token_ids (S, N)``, ``document_indices (S,)``, ``influence,
    influence_raw (N,)`` (normalised / mean gradient norms),
    ``target_token, target_probability (S,)``, ``alibi_slopes (H,)`` (the
    model's own), ``alibi_slopes_logit (H,)`` (in softmax-logit units,
    ``slope * bias_scale``), ``content_diagonal, content_base (L, H)`` (raw
    ``q.k``), ``logit_scale ()`` (the factor on ``q.k`` in the logit),
    ``qk_mean (L, H, n, n)`` at ``qk_positions (n,)``, ``attention_mean
    (L, N, N)``. `metadata` is JSON-ready.
    """

    lambdas: np.ndarray | None
    lambdas_std: np.ndarray | None
    lambdas_per_sequence: np.ndarray | None
    token_ids: np.ndarray
    document_indices: np.ndarray
    influence: np.ndarray | None
    influence_raw: np.ndarray | None
    target_token: np.ndarray | None
    target_probability: np.ndarray | None
    alibi_slopes: np.ndarray
    alibi_slopes_logit: np.ndarray
    content_diagonal: np.ndarray | None
    content_base: np.ndarray | None
    logit_scale: np.ndarray
    qk_mean: np.ndarray | None
    qk_positions: np.ndarray | None
    attention_mean: np.ndarray | None
    metadata: dict

    @property
    def num_layers(self) -> int:
        return int(self.metadata["num_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.metadata["num_heads"])

    @property
    def sequence_length(self) -> int:
        return int(self.token_ids.shape[1])

    def arrays(self) -> dict[str, np.ndarray]:
        """The measured arrays by name (those that are not None)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if field.name != "metadata" and getattr(self, field.name) is not None}

    def to_rollout_model(self, sequence_length: int | None = None):
        """A `jaxroll.RolloutModel` with the measured parameters, in logit units.

        ``lambdas`` as measured; ``alibi_slopes = alibi_slopes_logit`` (every
        layer); ``diagonal_scores = logit_scale * content_diagonal`` and
        ``base_scores = logit_scale * content_base`` (zero where content was
        not measured); temperature 1, causal mask.

        A model without ALiBi (rotary: Llama, Mistral, Qwen2; learned
        positions: GPT-2) whose mean attention was measured gets a
        `KernelRolloutModel` instead: its kernels are the measured
        ``attention_mean`` (L, N, N) as a `DenseKernel`, exactly as the
        model computed it (eager Llama takes its softmax in float32, so rows
        sum to 1 within ~1e-7). Only where a row misses 1 by more than
        `jaxroll.kernel_types.ROW_SUM_TOLERANCE` (bfloat16 models) are the
        rows divided by their sums.
        """
        from jaxroll.kernel_types import ROW_SUM_TOLERANCE, DenseKernel
        from jaxroll.model import KernelRolloutModel, RolloutModel

        if self.lambdas is None:
            raise ConfigError("stats: a rollout config needs 'lambda'; allowed: stats that include lambda")
        if self.attention_mean is not None and self.metadata.get("position_encoding") != "alibi":
            attention = self.attention_mean
            sums = attention.sum(axis=-1, keepdims=True)
            if np.max(np.abs(sums - 1.0)) > ROW_SUM_TOLERANCE:
                attention = attention / sums
            kernel = DenseKernel.create(attention, field="attention_mean")
            return KernelRolloutModel.create(kernel=kernel, lambdas=np.clip(self.lambdas, 0.0, 1.0),
                                             sequence_length=sequence_length or self.sequence_length)
        scale = float(self.logit_scale)
        diagonal = 0.0 if self.content_diagonal is None else scale * self.content_diagonal
        base = 0.0 if self.content_base is None else scale * self.content_base
        return RolloutModel.create(
            num_layers=self.num_layers, num_heads=self.num_heads,
            lambdas=np.clip(self.lambdas, 0.0, 1.0), alibi_slopes=self.alibi_slopes_logit,
            diagonal_scores=diagonal, base_scores=base,
            sequence_length=sequence_length or self.sequence_length,
        )


def parse_stats(stats) -> tuple[str, ...]:
    """Statistic names from a sequence or a comma-separated string, checked."""
    if isinstance(stats, str):
        stats = [item.strip() for item in stats.split(",") if item.strip()]
    stats = tuple(dict.fromkeys(stats))
    unknown = [item for item in stats if item not in STATS]
    if unknown or not stats:
        raise ConfigError(f"stats: got {unknown[0] if unknown else 'nothing'!r}; allowed: a subset of {', '.join(STATS)}")
    return stats


def _as_token_ids(sequences, length, vocab_size):
    if isinstance(sequences, torch.Tensor):
        sequences = sequences.cpu().numpy()
    if isinstance(sequences, np.ndarray):
        rows = sequences
        if rows.ndim != 2:
            raise ConfigError(f"sequences: got shape {rows.shape}; allowed: (S, N) token ids")
        if not np.issubdtype(rows.dtype, np.integer):
            raise ConfigError(f"sequences: got dtype {rows.dtype}; allowed: integer token ids")
    else:
        rows = list(sequences)
        if not rows:
            raise ConfigError("sequences: got none; allowed: at least one sequence")
        wanted = length if length is not None else len(rows[0])
        for index, row in enumerate(rows):
            if len(row) != wanted:
                raise ConfigError(
                    f"sequences: sequence {index} has {len(row)} tokens; allowed: exactly N = {wanted}"
                )
        rows = np.asarray(rows, dtype=np.int64)
    if length is not None and rows.shape[1] != length:
        raise ConfigError(f"sequences: sequences have {rows.shape[1]} tokens; allowed: exactly N = {length}")
    if rows.shape[0] < 1 or rows.shape[1] < 1:
        raise ConfigError(f"sequences: got shape {rows.shape}; allowed: at least one sequence of >= 1 token")
    if rows.min() < 0 or (vocab_size is not None and rows.max() >= vocab_size):
        raise ConfigError(f"sequences: token ids in [{rows.min()}, {rows.max()}]; allowed: 0 .. {vocab_size - 1}")
    return rows.astype(np.int64)


class _Sums:
    """Running float64 sums over sequences; what a checkpoint saves."""

    def __init__(self, num_sequences, num_layers, num_heads, length, stats, positions):
        self.count = 0
        self.arrays = {}
        if "lambda" in stats:
            self.arrays["lambdas_per_sequence"] = np.full((num_sequences, num_layers), np.nan)
        if "influence" in stats:
            self.arrays["influence_sum"] = np.zeros(length)
            self.arrays["target_token"] = np.full(num_sequences, -1, dtype=np.int64)
            self.arrays["target_probability"] = np.full(num_sequences, np.nan)
        if "content" in stats:
            self.arrays["qk_diagonal_sum"] = np.zeros((num_layers, num_heads))
            self.arrays["qk_lower_sum"] = np.zeros((num_layers, num_heads))
        if "qk" in stats:
            n = len(range(0, length, positions))
            self.arrays["qk_sum"] = np.zeros((num_layers, num_heads, n, n))
        if "attention" in stats:
            self.arrays["attention_sum"] = np.zeros((num_layers, length, length))

    def save(self, path: Path, fingerprint: str) -> None:
        # Atomic: a crash mid-write leaves the previous checkpoint intact.
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "wb") as handle:
            np.savez(handle, count=self.count, fingerprint=fingerprint, **self.arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def load(self, path: Path, fingerprint: str) -> None:
        try:
            data = np.load(path, allow_pickle=False)
            stamp = str(data["fingerprint"])
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as error:
            raise ConfigError(f"--resume {path}: not a checkpoint of jaxroll measure "
                              f"({type(error).__name__}); allowed: the --out of an interrupted run") from None
        with data:
            if stamp != fingerprint:
                raise ConfigError(
                    f"--resume {path}: the checkpoint was written for other settings "
                    "(model, sequences or stats); allowed: the same command, or --force without --resume"
                )
            for name in self.arrays:
                self.arrays[name] = data[name]
            self.count = int(data["count"])


def measure(
    model,
    sequences,
    *,
    stats=DEFAULT_STATS,
    tokenizer=None,
    length: int | None = None,
    samples: int | None = None,
    falcon_alibi: str = "once",
    positions: int = 1,
    checkpointing: bool = True,
    layer_map: LayerMap | None = None,
    progress: bool = False,
    checkpoint_path=None,
    resume: bool = False,
    source: str | None = None,
) -> Measurement:
    """Measure lambda_t, content scores, attention and gradient influence.

    Args:
        model: a Hugging Face ``*ForCausalLM`` (eval mode is set for the run
            and restored after). ``"attention"`` needs
            ``attn_implementation="eager"``.
        sequences: token ids ``(S, N)`` (array or list of equal-length
            lists), or texts (a list of str) with `tokenizer` and `length`:
            documents in order, those with at least N tokens, their first N.
        stats: a subset of ``lambda, content, influence, attention, qk``.
        samples: with texts, stop after this many kept documents.
        falcon_alibi: ``"once"`` (Falcon's intended formula, its SDPA path,
            default) or ``"doubled"`` (its eager path, which adds the ALiBi
            bias twice; for reproducing published numbers).
        positions: stride of the positions at which ``qk_mean`` is kept.
        checkpointing: activation checkpointing of each block during the
            influence pass.
        checkpoint_path: a file for the partial sums, written atomically after
            every sequence; with `resume`, continue from it.

    Returns:
        A `Measurement`.

    Raises:
        ConfigError: bad input, a model outside the layer maps, a statistic
        the architecture cannot give; one line.
    """
    stats = parse_stats(stats)
    if falcon_alibi not in FALCON_VARIANTS:
        raise ConfigError(f"falcon_alibi: got {falcon_alibi!r}; allowed: one of {', '.join(FALCON_VARIANTS)}")
    if not isinstance(positions, int) or positions < 1:
        raise ConfigError(f"positions: got {positions!r}; allowed: an integer >= 1")
    resolved = resolve(model, layer_map)
    layer_map = resolved.layer_map
    config = model.config
    num_layers, num_heads, head_dim = len(resolved.blocks), resolved.num_heads, resolved.head_dim

    if isinstance(sequences, (list, tuple)) and sequences and isinstance(sequences[0], str):
        if tokenizer is None or length is None:
            raise ConfigError("sequences: texts need a tokenizer and a length; allowed: token ids (S, N) or both")
        token_ids, document_indices = _select(sequences, tokenizer, length, samples)
    else:
        token_ids = _as_token_ids(sequences, length, getattr(config, "vocab_size", None))
        if samples is not None:
            token_ids = token_ids[:samples]
        document_indices = np.arange(token_ids.shape[0])
    num_sequences, length = token_ids.shape

    if layer_map.name == "mpt" and length > config.max_seq_len:
        raise ConfigError(f"length: {length}; allowed: at most the model's max_seq_len ({config.max_seq_len})")
    if ("content" in stats or "qk" in stats) and layer_map.position == "rope":
        raise ConfigError(
            f"stats: content needs q.k as the logit sees it; {layer_map.name} rotates q and k after "
            "the projection (rotary); allowed for it: lambda, influence, attention"
        )
    if "content" in stats and length < 2:
        raise ConfigError("length: 1; allowed: >= 2 for content (the base is the mean below the diagonal)")

    implementation = getattr(config, "_attn_implementation", "eager")
    variant, zero_falcon_alibi, bias_multiplier = None, False, 1.0
    if layer_map.name == "falcon" and layer_map.position == "alibi":
        variant = falcon_alibi
        if falcon_alibi == "doubled":
            if implementation != "eager":
                raise ConfigError(
                    f"falcon_alibi: 'doubled' is Falcon's eager path; the model uses {implementation!r}; "
                    "allowed: a model loaded with attn_implementation='eager'"
                )
            bias_multiplier = 2.0
        else:
            zero_falcon_alibi = implementation == "eager"
    logit_scale = float(layer_map.logit_scale(config, head_dim))
    if layer_map.slopes is not None:
        slopes = layer_map.slopes(model, num_heads).numpy().astype(np.float64)
        # BLOOM and MPT add m j to the scaled logit; Falcon adds it before the scale.
        bias_scale = bias_multiplier * (logit_scale if layer_map.name == "falcon" else 1.0)
    else:
        slopes, bias_scale = np.zeros(num_heads), 0.0

    metadata = {
        "model": source or str(getattr(config, "_name_or_path", "") or type(model).__name__),
        "model_class": type(model).__name__,
        "model_type": getattr(config, "model_type", None),
        "layer_map": layer_map.name,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "head_dim": head_dim,
        "position_encoding": layer_map.position,
        "attn_implementation": implementation,
        "logit_formula": layer_map.formula + (f",  c = {int(bias_multiplier)}" if variant else ""),
        "falcon_alibi": variant,
        "logit_scale": logit_scale,
        "bias_scale": bias_scale,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "stats": list(stats),
        "sequence_length": int(length),
        "num_sequences": int(num_sequences),
        "qk_position_stride": positions if "qk" in stats else None,
        "activation_checkpointing": bool(checkpointing and "influence" in stats),
        "units": {
            "config.yaml": "content and slopes in softmax-logit units (content * logit_scale, slopes * bias_scale)",
            "measurement.npz": "content_diagonal/content_base raw q.k; alibi_slopes as the model builds them",
        },
        "versions": _versions(),
    }
    fingerprint = json.dumps({key: metadata[key] for key in (
        "model_class", "num_layers", "num_heads", "stats", "falcon_alibi", "dtype", "qk_position_stride")}
        | {"tokens": int(np.asarray(token_ids, dtype=np.int64).sum() % 1_000_000_007),
           "shape": list(token_ids.shape)}, sort_keys=True)

    sums = _Sums(num_sequences, num_layers, num_heads, length, stats, positions)
    if resume and checkpoint_path is not None and Path(checkpoint_path).is_file():
        sums.load(Path(checkpoint_path), fingerprint)

    grid = np.arange(0, length, positions)
    step = _Step(stats, num_layers, length, grid)
    hooks = Hooks(
        resolved, config,
        on_block_input=step.block_input if "lambda" in stats else None,
        on_attention_output=step.attention_output if "lambda" in stats else None,
        on_query_key=step.query_key if ("content" in stats or "qk" in stats) else None,
        on_probabilities=step.probabilities if "attention" in stats else None,
        zero_falcon_alibi=zero_falcon_alibi,
        checkpointing=checkpointing and "influence" in stats,
    )
    was_training = model.training
    grad_flags = [parameter.requires_grad for parameter in model.parameters()]
    iterator = range(sums.count, num_sequences)
    if progress:
        from tqdm.auto import tqdm

        # disable=None: a bar on a terminal, silence in logs and pipes.
        iterator = tqdm(iterator, total=num_sequences, initial=sums.count, desc="measure", unit="seq",
                        disable=None)
    model.eval()
    try:
        # Only the embeddings need gradients: weights that do not require
        # them save no activations for their own gradients.
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        with hooks:
            for index in iterator:
                step.reset()
                hooks.recording = True
                ids = torch.as_tensor(token_ids[index], dtype=torch.long)[None]
                result = _forward_backward(model, ids, "influence" in stats, hooks)
                _accumulate(sums, step, result, index, stats)
                sums.count = index + 1
                if checkpoint_path is not None:
                    sums.save(Path(checkpoint_path), fingerprint)
    finally:
        for parameter, flag in zip(model.parameters(), grad_flags):
            parameter.requires_grad_(flag)
        model.train(was_training)

    return _finish(sums, stats, token_ids, document_indices, slopes, bias_scale, logit_scale, grid, metadata)


def _select(texts, tokenizer, length, samples):
    from jaxroll.measure.texts import select_sequences

    return select_sequences(texts, tokenizer, length, samples)


def _versions() -> dict:
    import platform

    import transformers

    from jaxroll import __version__

    return {"jaxroll": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


class _Step:
    """Per-sequence values the hooks deliver."""

    def __init__(self, stats, num_layers, length, grid):
        self.stats = stats
        self.grid = torch.as_tensor(grid)
        self.reset()

    def reset(self):
        self.x_norms = {}
        self.lambdas = {}
        self.diagonal = {}
        self.lower = {}
        self.qk = {}
        self.attention = {}

    def block_input(self, layer, x):
        self.x_norms[layer] = x[0].double().norm(dim=-1)

    def attention_output(self, layer, a):
        a_norm = a[0].double().norm(dim=-1)
        denominator = self.x_norms.pop(layer) + a_norm
        # 0/0 (a zero residual stream and a zero update) counts as no mixing.
        ratio = torch.where(denominator > 0, a_norm / torch.where(denominator > 0, denominator, 1.0), 0.0)
        self.lambdas[layer] = float(ratio.mean())

    def query_key(self, layer, q, k):
        q = q[0].double().transpose(0, 1)  # (H, N, d)
        k = k[0].double().transpose(0, 1)
        n = q.shape[1]
        if "content" in self.stats:
            self.diagonal[layer] = ((q * k).sum(-1).mean(-1)).numpy()
            before = torch.cumsum(k, dim=1) - k  # sum_{j < i} k_j
            self.lower[layer] = ((q * before).sum((-1, -2)) / (n * (n - 1) / 2)).numpy()
        if "qk" in self.stats:
            self.qk[layer] = (q[:, self.grid] @ k[:, self.grid].transpose(-1, -2)).numpy()

    def probabilities(self, layer, p):
        self.attention[layer] = p[0].double().mean(0).numpy()


def _forward_backward(model, ids, want_influence, hooks):
    embeddings = model.get_input_embeddings()(ids).detach()
    embeddings.requires_grad_(want_influence)
    keywords = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        keywords["logits_to_keep"] = 1
    with torch.set_grad_enabled(want_influence):
        logits = model(inputs_embeds=embeddings, **keywords).logits[0, -1]
        # float32 at least (bfloat16 logits are upcast), float64 kept.
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probabilities = torch.softmax(logits.to(dtype), dim=-1)
        token = int(torch.argmax(probabilities))
        target = probabilities[token]
    hooks.recording = False  # the checkpointed recompute must not count twice
    if not want_influence:
        return {"token": token, "probability": float(target)}
    (gradient,) = torch.autograd.grad(target, embeddings)
    norms = gradient[0].double().norm(dim=-1).numpy()
    return {"token": token, "probability": float(target.detach()), "norms": norms}


def _accumulate(sums, step, result, index, stats):
    arrays = sums.arrays
    num_layers = arrays["lambdas_per_sequence"].shape[1] if "lambda" in stats else None
    if "lambda" in stats:
        if len(step.lambdas) != num_layers:
            raise ConfigError(f"layer map: hooked {len(step.lambdas)} of {num_layers} attention outputs")
        arrays["lambdas_per_sequence"][index] = [step.lambdas[t] for t in range(num_layers)]
    if "influence" in stats:
        norms = result["norms"]
        if not np.all(np.isfinite(norms)):
            raise ConfigError(f"influence: sequence {index} gave a non-finite gradient; allowed: finite models")
        arrays["influence_sum"] += norms
        arrays["target_token"][index] = result["token"]
        arrays["target_probability"][index] = result["probability"]
    if "content" in stats:
        arrays["qk_diagonal_sum"] += np.stack([step.diagonal[t] for t in sorted(step.diagonal)])
        arrays["qk_lower_sum"] += np.stack([step.lower[t] for t in sorted(step.lower)])
    if "qk" in stats:
        arrays["qk_sum"] += np.stack([step.qk[t] for t in sorted(step.qk)])
    if "attention" in stats:
        arrays["attention_sum"] += np.stack([step.attention[t] for t in sorted(step.attention)])


def _finish(sums, stats, token_ids, document_indices, slopes, bias_scale, logit_scale, grid, metadata):
    arrays, count = sums.arrays, sums.count
    lambdas = lambdas_std = per_sequence = None
    if "lambda" in stats:
        per_sequence = arrays["lambdas_per_sequence"]
        lambdas = per_sequence.mean(axis=0)
        lambdas_std = per_sequence.std(axis=0)
    influence = influence_raw = token = probability = None
    if "influence" in stats:
        influence_raw = arrays["influence_sum"] / count
        total = influence_raw.sum()
        influence = influence_raw / total if total > 0 else np.full_like(influence_raw, 1.0 / influence_raw.size)
        token, probability = arrays["target_token"], arrays["target_probability"]
    diagonal = base = None
    if "content" in stats:
        base = arrays["qk_lower_sum"] / count
        diagonal = arrays["qk_diagonal_sum"] / count - base
    return Measurement(
        lambdas=lambdas, lambdas_std=lambdas_std, lambdas_per_sequence=per_sequence,
        token_ids=np.asarray(token_ids), document_indices=np.asarray(document_indices),
        influence=influence, influence_raw=influence_raw, target_token=token, target_probability=probability,
        alibi_slopes=np.asarray(slopes, dtype=np.float64),
        alibi_slopes_logit=np.asarray(slopes, dtype=np.float64) * bias_scale,
        content_diagonal=diagonal, content_base=base, logit_scale=np.asarray(logit_scale),
        qk_mean=arrays["qk_sum"] / count if "qk" in stats else None,
        qk_positions=grid if "qk" in stats else None,
        attention_mean=arrays["attention_sum"] / count if "attention" in stats else None,
        metadata=metadata,
    )


def influence_gradients(model, token_ids, *, position: int = -1, layer_map: LayerMap | None = None):
    """``||df/de_j||_2`` for one sequence, f the top probability at `position`.

    The unnormalised gradient norms ``(N,)`` (float64) that `measure`
    averages, for any target position (``-1``: the last). Positions after
    `position` get exactly 0 under causal masking.
    """
    resolve(model, layer_map)
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long).reshape(1, -1)
    was_training = model.training
    model.eval()
    try:
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, position]
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probabilities = torch.softmax(logits.to(dtype), dim=-1)
        (gradient,) = torch.autograd.grad(probabilities.max(), embeddings)
    finally:
        model.train(was_training)
    return gradient[0].double().norm(dim=-1).numpy()
