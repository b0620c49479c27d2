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
  over sequences in float64, normalised to sum 1 over positions; the
  per-sequence norms ``influence_per_sequence (S, N)`` are kept for
  uncertainty (`jaxroll.measure.uncertainty`).
- further statistics from the registry (`register_statistic`), e.g.
  ``"sinks"`` (`jaxroll.measure.sinks`, attention sinks after Gu et al. 2024).

Data parallel: `measure` can run on a shard of the sequences (`shard`) and
hand its partial sums to a `reduce` callable (`jaxroll.measure.distributed`
gathers them on rank 0); sums and counts merge exactly, per-sequence rows by
index.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import time
import zipfile
from typing import Callable
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from .hooks import Hooks
from .layer_maps import FALCON_VARIANTS, LayerMap, resolve

__all__ = ["measure", "Measurement", "STATS", "DEFAULT_STATS", "influence_gradients", "parse_stats",
           "Statistic", "register_statistic", "statistic_names", "default_stats", "PartialSums",
           "allowed_stats", "check_stats_allowed", "stats_bytes", "Shapes"]

BUILTIN_STATS = ("lambda", "content", "influence", "attention", "qk")
STATS = BUILTIN_STATS  # the built-in names; `statistic_names()` adds the registered ones
"""What `measure` can measure (``--stats``): lambda_t, content scores, gradient influence, mean attention, mean q.k."""
DEFAULT_STATS = ("lambda", "content", "influence")
"""What `measure` measures unless told otherwise (rotary models: see `default_stats`)."""
HOOK_KINDS = ("block_input", "attention_output", "query_key", "probabilities")
# Statistics that read q.k before the position encoding: meaningless under rotary.
_NEEDS_RAW_QK = ("content", "qk")


@dataclasses.dataclass(frozen=True)
class Statistic:
    """A statistic beside the built-in ones, computed from the same hooked pass.

    How to add one (e.g. in a new module ``jaxroll/measure/refinements.py``)::

        register_statistic(Statistic(
            name="mine", hooks=("probabilities",),
            allocate=lambda shape: {"mine_sum": np.zeros((shape.layers, shape.length))},
            observe=lambda state, kind, layer, *tensors: ...,   # per layer, per sequence
            accumulate=lambda sums, state, index: ...,          # add the sequence to the sums
            finish=lambda sums, count, shape: {"mine": sums["mine_sum"] / count}))

    and import that module at the bottom of this file (next to
    ``from . import sinks``) so that it registers whenever `measure` is
    imported. Sums are float64 arrays added over sequences (merged
    across ranks by addition); arrays named in `per_sequence` have a first
    axis of length S and are merged by row. `finish` returns the arrays that
    go into ``measurement.npz`` (and `Measurement.extra`).

    Attributes:
        name: the ``--stats`` name.
        hooks: which of ``block_input (x)``, ``attention_output (a)``,
            ``query_key (q, k)``, ``probabilities (p)`` it reads; `observe`
            gets ``(state, kind, layer, *tensors)`` with tensors as the hooks
            deliver them (``(1, N, D)``, ``(1, N, H, d)``, ``(1, H, N, N)``).
        allocate: ``shape -> {name: zeros}``; `shape` is a `Shapes`.
        observe, accumulate, finish: see above; `state` is a dict emptied
            before every sequence.
        per_sequence: names of sums indexed by sequence (merged by row).
        positions: the position encodings it supports (``alibi, rope, learned``).
        needs_eager: it reads attention probabilities (eager attention only).
        memory: ``shape -> bytes`` of its float64 sums (checked before loading).
        summary: ``(outputs) -> str``, one line for the command's summary.
        attach: ``(resolved, deliver, recording) -> handles``: hooks of its own
            (modules beyond the four kinds above, or gradients), registered for
            the run and removed after; they call ``deliver(kind, layer,
            *tensors)`` (-> `observe`) and check ``recording()`` in forward hooks.
        requires: other statistics it needs in the same run (e.g. the
            influence backward pass).
    """

    name: str
    hooks: tuple
    allocate: Callable
    observe: Callable
    accumulate: Callable
    finish: Callable
    per_sequence: tuple = ()
    positions: tuple = ("alibi", "rope", "learned")
    needs_eager: bool = False
    memory: Callable | None = None
    summary: Callable | None = None
    attach: Callable | None = None
    requires: tuple = ()


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Sizes a statistic allocates for: S sequences, L layers, H heads, N tokens."""

    sequences: int
    layers: int
    heads: int
    length: int


_REGISTRY: dict[str, Statistic] = {}


def register_statistic(statistic: Statistic) -> None:
    """Add `statistic` to the names `measure` (and ``--stats``) accept."""
    if statistic.name in BUILTIN_STATS:
        raise ConfigError(f"statistic {statistic.name!r}: a built-in name; allowed: a new name")
    unknown = [kind for kind in statistic.hooks if kind not in HOOK_KINDS]
    if unknown:
        raise ConfigError(f"statistic {statistic.name!r}: hook {unknown[0]!r}; allowed: {', '.join(HOOK_KINDS)}")
    _REGISTRY[statistic.name] = statistic


def statistic_names() -> tuple[str, ...]:
    """Every name ``stats`` accepts: the built-in ones, then the registered ones."""
    return BUILTIN_STATS + tuple(_REGISTRY)


def default_stats(position: str) -> tuple[str, ...]:
    """What ``--stats`` is by default for a model whose positions enter as `position`.

    ``lambda, content, influence`` (ALiBi, learned positions); rotary models
    drop content, whose raw ``q.k`` the rotation changes.
    """
    return tuple(name for name in DEFAULT_STATS if not (position == "rope" and name in _NEEDS_RAW_QK))


def check_stats_allowed(stats, layer_map_name: str, position: str) -> None:
    """Refuse statistics that the architecture cannot give (from its config alone)."""
    if any(name in stats for name in _NEEDS_RAW_QK) and position == "rope":
        raise ConfigError(
            f"stats: content needs q.k as the logit sees it; {layer_map_name} rotates q and k after "
            f"the projection (rotary); allowed for it: {', '.join(allowed_stats(position))}"
        )
    for name in stats:
        statistic = _REGISTRY.get(name)
        missing = [other for other in (statistic.requires if statistic else ()) if other not in stats]
        if missing:
            raise ConfigError(f"stats: {name} needs {missing[0]} in the same run; allowed: add {missing[0]}")
        if statistic is not None and position not in statistic.positions:
            raise ConfigError(f"stats: {name} is not defined for {position} positions ({layer_map_name}); "
                              f"allowed for it: {', '.join(allowed_stats(position))}")


def allowed_stats(position: str) -> tuple[str, ...]:
    """The statistic names a model with this position encoding can give."""
    return tuple(name for name in statistic_names() if not (position == "rope" and name in _NEEDS_RAW_QK)
                 and (name not in _REGISTRY or position in _REGISTRY[name].positions))


def stats_bytes(stats, shape: Shapes, positions: int = 1) -> int:
    """Bytes of the float64 partial sums of `stats` (what a run holds and checkpoints)."""
    layers, heads, n, sequences = shape.layers, shape.heads, shape.length, shape.sequences
    needed = 0
    if "lambda" in stats:
        needed += 8 * sequences * layers
    if "influence" in stats:
        needed += 8 * (sequences * n + n + 2 * sequences)
    if "content" in stats:
        needed += 16 * layers * heads
    if "qk" in stats:
        kept = len(range(0, n, positions))
        needed += 8 * layers * heads * kept * kept
    if "attention" in stats:
        needed += 8 * layers * n * n
    for name in stats:
        statistic = _REGISTRY.get(name)
        if statistic is not None and statistic.memory is not None:
            needed += int(statistic.memory(shape))
    return needed


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
    influence_per_sequence: np.ndarray | None = None
    extra: dict = dataclasses.field(default_factory=dict)

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
        arrays = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in ("metadata", "extra") and getattr(self, field.name) is not None}
        return arrays | {name: np.asarray(value) for name, value in self.extra.items()}

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
        from ..kernel_types import ROW_SUM_TOLERANCE, DenseKernel
        from ..model import KernelRolloutModel, RolloutModel

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
    names = statistic_names()
    unknown = [item for item in stats if item not in names]
    if unknown or not stats:
        raise ConfigError(f"stats: got {unknown[0] if unknown else 'nothing'!r}; allowed: a subset of {', '.join(names)}")
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
# Per-sequence sums (first axis S): merged across ranks by row, never added.
_PER_SEQUENCE = ("lambdas_per_sequence", "influence_per_sequence", "target_token", "target_probability")


class PartialSums:
    """Running float64 sums over the sequences one process measured; what a checkpoint saves.

    ``count`` is how many of `indices` (this process's sequences, in order)
    are done. Sums add across processes; per-sequence arrays (first axis S)
    hold NaN (or -1) in rows this process did not measure and merge by row.
    """

    def __init__(self, shape: Shapes, stats, positions, indices=None):
        num_sequences, num_layers, num_heads, length = shape.sequences, shape.layers, shape.heads, shape.length
        self.count = 0
        self.seconds = 0.0
        self.timing = None
        self.indices = np.arange(num_sequences) if indices is None else np.asarray(indices, dtype=np.int64)
        self.arrays = {}
        self.per_sequence = set(_PER_SEQUENCE)
        if "lambda" in stats:
            self.arrays["lambdas_per_sequence"] = np.full((num_sequences, num_layers), np.nan)
        if "influence" in stats:
            self.arrays["influence_sum"] = np.zeros(length)
            self.arrays["influence_per_sequence"] = np.full((num_sequences, length), np.nan)
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
        for name in stats:
            if name in _REGISTRY:
                self.arrays.update(_REGISTRY[name].allocate(shape))
                self.per_sequence.update(_REGISTRY[name].per_sequence)

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
                    "(model, sequences, stats or number of processes); allowed: the same command, "
                    "or --force without --resume"
                )
            for name in self.arrays:
                self.arrays[name] = data[name]
            self.count = int(data["count"])

    def merge(self, others) -> "PartialSums":
        """This process's sums plus `others` (each a `state()` dict of another process), in place.

        Exact: sums and counts add, per-sequence rows are copied from the
        process that measured them.
        """
        self.timing = [(self.count, self.seconds)]
        for other in others:
            rows = np.asarray(other["indices"])[: int(other["count"])]
            for name, value in other["arrays"].items():
                if name in self.per_sequence:
                    self.arrays[name][rows] = value[rows]
                else:
                    self.arrays[name] = self.arrays[name] + value
            self.count += int(other["count"])
            self.timing.append((int(other["count"]), float(other["seconds"])))
        return self

    def state(self) -> dict:
        """What another process needs to merge these sums: count, indices, arrays, loop seconds."""
        return {"count": self.count, "indices": self.indices, "arrays": self.arrays, "seconds": self.seconds}


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
    progress=False,
    checkpoint_path=None,
    resume: bool = False,
    source: str | None = None,
    shard: tuple[int, int] | None = None,
    reduce: Callable | None = None,
) -> Measurement | None:
    """Measure lambda_t, content scores, attention and gradient influence.

    Args:
        model: a Hugging Face ``*ForCausalLM`` (eval mode is set for the run
            and restored after), on any device or spread over several
            (``device_map``); inputs go to its embedding's device and every
            sum is accumulated in float64 on the CPU. ``"attention"`` and
            ``"sinks"`` need ``attn_implementation="eager"``.
        sequences: token ids ``(S, N)`` (array or list of equal-length
            lists), or texts (a list of str) with `tokenizer` and `length`:
            documents in order, those with at least N tokens, their first N.
        stats: a subset of `statistic_names()`: ``lambda, content, influence,
            attention, qk`` and the registered ones (``sinks``).
        samples: with texts, stop after this many kept documents.
        falcon_alibi: ``"once"`` (Falcon's intended formula, its SDPA path,
            default) or ``"doubled"`` (its eager path, which adds the ALiBi
            bias twice; for reproducing published numbers).
        positions: stride of the positions at which ``qk_mean`` is kept.
        checkpointing: activation checkpointing of each block during the
            influence pass.
        progress: False, True (a `jaxroll.measure.progress.Progress` on
            stderr) or a `Progress`-like object with ``update(n)`` and
            ``close()``.
        checkpoint_path: a file for the partial sums, written atomically after
            every sequence; with `resume`, continue from it.
        shard: ``(rank, world)``: measure only the contiguous block
            ``rank`` of `world` near-equal blocks of the sequences.
        reduce: called with this process's `PartialSums` after the loop;
            returns the merged sums (rank 0) or None (other ranks, for which
            `measure` then returns None).

    Returns:
        A `Measurement` (None on a rank whose `reduce` returned None).

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
    check_stats_allowed(stats, layer_map.name, layer_map.position)
    if "content" in stats and length < 2:
        raise ConfigError("length: 1; allowed: >= 2 for content (the base is the mean below the diagonal)")
    indices = np.arange(num_sequences)
    if shard is not None:
        rank, world = shard
        if not (isinstance(world, int) and world >= 1 and 0 <= rank < world):
            raise ConfigError(f"shard: got {shard!r}; allowed: (rank, world) with 0 <= rank < world")
        indices = np.array_split(indices, world)[rank]

    implementation = getattr(config, "_attn_implementation", "eager")
    reading = [name for name in stats if name == "attention" or (
        name in _REGISTRY and (_REGISTRY[name].needs_eager or "probabilities" in _REGISTRY[name].hooks))]
    if reading and implementation != "eager":
        raise ConfigError(f"stats: {', '.join(reading)} read the attention probabilities; the model uses "
                          f"{implementation!r} attention; allowed: a model loaded with attn_implementation='eager'")
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
        slopes = layer_map.slopes(model, num_heads).cpu().numpy().astype(np.float64)
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
           "shape": list(token_ids.shape)}
        | ({"shard": list(shard)} if shard is not None and shard[1] > 1 else {}), sort_keys=True)

    shape = Shapes(num_sequences, num_layers, num_heads, length)
    sums = PartialSums(shape, stats, positions, indices)
    if resume and checkpoint_path is not None and Path(checkpoint_path).is_file():
        sums.load(Path(checkpoint_path), fingerprint)

    grid = np.arange(0, length, positions)
    step = _Step(stats, num_layers, length, grid)
    wants = {kind: any(kind in _REGISTRY[name].hooks for name in stats if name in _REGISTRY) for kind in HOOK_KINDS}
    hooks = Hooks(
        resolved, config,
        on_block_input=step.block_input if ("lambda" in stats or wants["block_input"]) else None,
        on_attention_output=step.attention_output if ("lambda" in stats or wants["attention_output"]) else None,
        on_query_key=step.query_key if ("content" in stats or "qk" in stats or wants["query_key"]) else None,
        on_probabilities=step.probabilities if ("attention" in stats or wants["probabilities"]) else None,
        zero_falcon_alibi=zero_falcon_alibi,
        checkpointing=checkpointing and "influence" in stats,
    )
    was_training = model.training
    grad_flags = [parameter.requires_grad for parameter in model.parameters()]
    device = model.get_input_embeddings().weight.device
    own = len(sums.indices)
    bar = _progress(progress, own, sums.count)
    started = time.perf_counter()
    model.eval()
    attached = []
    try:
        # Only the embeddings need gradients: weights that do not require
        # them save no activations for their own gradients.
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        with hooks:
            for statistic in step.registered:
                if statistic.attach is not None:
                    attached += statistic.attach(resolved, _deliver(step, statistic), lambda: hooks.recording)
            for position in range(sums.count, own):
                index = int(sums.indices[position])
                step.reset()
                hooks.recording = True
                ids = torch.as_tensor(token_ids[index], dtype=torch.long, device=device)[None]
                result = _forward_backward(model, ids, "influence" in stats, hooks)
                _accumulate(sums, step, result, index, stats)
                sums.count = position + 1
                if checkpoint_path is not None:
                    sums.save(Path(checkpoint_path), fingerprint)
                if bar is not None:
                    bar.update(1)
    finally:
        for handle in attached:
            handle.remove()
        if bar is not None:
            bar.close()
        for parameter, flag in zip(model.parameters(), grad_flags):
            parameter.requires_grad_(flag)
        model.train(was_training)
    sums.seconds = time.perf_counter() - started
    if reduce is not None:
        sums = reduce(sums)
        if sums is None:
            return None
    timing = sums.timing or [(sums.count, sums.seconds)]
    # Seconds of the measuring loop (no loading) and sequences, per process.
    metadata["timing"] = {"sequences_per_process": [int(count) for count, _ in timing],
                          "loop_seconds_per_process": [float(seconds) for _, seconds in timing]}
    return _finish(sums, stats, token_ids, document_indices, slopes, bias_scale, logit_scale, grid, metadata, shape)


def _progress(progress, total, initial):
    if progress is False or progress is None:
        return None
    if progress is True:
        from .progress import Progress

        return Progress(total, initial=initial)
    return progress


def _select(texts, tokenizer, length, samples):
    from .texts import select_sequences

    return select_sequences(texts, tokenizer, length, samples)


def _versions() -> dict:
    import platform

    import transformers

    from .. import __version__

    return {"jaxroll": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


class _Step:
    """Per-sequence values the hooks deliver (moved to the CPU in float64)."""

    def __init__(self, stats, num_layers, length, grid):
        self.stats = stats
        self.grid = torch.as_tensor(grid)
        self.registered = [_REGISTRY[name] for name in stats if name in _REGISTRY]
        self.reset()

    def reset(self):
        self.x_norms = {}
        self.lambdas = {}
        self.diagonal = {}
        self.lower = {}
        self.qk = {}
        self.attention = {}
        self.states = {statistic.name: {} for statistic in self.registered}

    def _observe(self, kind, layer, *tensors):
        for statistic in self.registered:
            if kind in statistic.hooks:
                statistic.observe(self.states[statistic.name], kind, layer, *tensors)

    def block_input(self, layer, x):
        if "lambda" in self.stats:
            self.x_norms[layer] = x[0].double().norm(dim=-1)
        self._observe("block_input", layer, x)

    def attention_output(self, layer, a):
        if "lambda" in self.stats:
            a_norm = a[0].double().norm(dim=-1)
            x_norm = self.x_norms.pop(layer).to(a_norm.device)
            denominator = x_norm + a_norm
            # 0/0 (a zero residual stream and a zero update) counts as no mixing.
            ratio = torch.where(denominator > 0, a_norm / torch.where(denominator > 0, denominator, 1.0), 0.0)
            self.lambdas[layer] = float(ratio.mean())
        self._observe("attention_output", layer, a)

    def query_key(self, layer, q, k):
        if "content" in self.stats or "qk" in self.stats:
            q64 = q[0].double().transpose(0, 1)  # (H, N, d)
            k64 = k[0].double().transpose(0, 1)
            n = q64.shape[1]
            if "content" in self.stats:
                self.diagonal[layer] = ((q64 * k64).sum(-1).mean(-1)).cpu().numpy()
                before = torch.cumsum(k64, dim=1) - k64  # sum_{j < i} k_j
                self.lower[layer] = ((q64 * before).sum((-1, -2)) / (n * (n - 1) / 2)).cpu().numpy()
            if "qk" in self.stats:
                grid = self.grid.to(q64.device)
                self.qk[layer] = (q64[:, grid] @ k64[:, grid].transpose(-1, -2)).cpu().numpy()
        self._observe("query_key", layer, q, k)

    def probabilities(self, layer, p):
        if "attention" in self.stats:
            self.attention[layer] = p[0].double().mean(0).cpu().numpy()
        self._observe("probabilities", layer, p)


def _deliver(step, statistic):
    # An attached hook's tensors go to this statistic's state of the current sequence.
    return lambda kind, layer, *tensors: statistic.observe(step.states[statistic.name], kind, layer, *tensors)


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
    # The norm in float64 whatever the model dtype (bfloat16 gradients are upcast first).
    norms = gradient[0].double().norm(dim=-1).cpu().numpy()
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
        arrays["influence_per_sequence"][index] = norms
        arrays["target_token"][index] = result["token"]
        arrays["target_probability"][index] = result["probability"]
    if "content" in stats:
        arrays["qk_diagonal_sum"] += np.stack([step.diagonal[t] for t in sorted(step.diagonal)])
        arrays["qk_lower_sum"] += np.stack([step.lower[t] for t in sorted(step.lower)])
    if "qk" in stats:
        arrays["qk_sum"] += np.stack([step.qk[t] for t in sorted(step.qk)])
    if "attention" in stats:
        arrays["attention_sum"] += np.stack([step.attention[t] for t in sorted(step.attention)])
    for statistic in step.registered:
        statistic.accumulate(arrays, step.states[statistic.name], index)


def _finish(sums, stats, token_ids, document_indices, slopes, bias_scale, logit_scale, grid, metadata, shape):
    arrays, count = sums.arrays, sums.count
    lambdas = lambdas_std = per_sequence = None
    if "lambda" in stats:
        per_sequence = arrays["lambdas_per_sequence"]
        lambdas = per_sequence.mean(axis=0)
        lambdas_std = per_sequence.std(axis=0)
    influence = influence_raw = token = probability = influence_rows = None
    if "influence" in stats:
        influence_raw = arrays["influence_sum"] / count
        total = influence_raw.sum()
        influence = influence_raw / total if total > 0 else np.full_like(influence_raw, 1.0 / influence_raw.size)
        token, probability = arrays["target_token"], arrays["target_probability"]
        influence_rows = arrays["influence_per_sequence"]
    diagonal = base = None
    if "content" in stats:
        base = arrays["qk_lower_sum"] / count
        diagonal = arrays["qk_diagonal_sum"] / count - base
    extra = {}
    for name in stats:
        if name in _REGISTRY:
            extra.update(_REGISTRY[name].finish(arrays, count, shape))
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
        metadata=metadata, influence_per_sequence=influence_rows, extra=extra,
    )


def influence_gradients(model, token_ids, *, position: int = -1, layer_map: LayerMap | None = None):
    """``||df/de_j||_2`` for one sequence, f the top probability at `position`.

    The unnormalised gradient norms ``(N,)`` (float64) that `measure`
    averages, for any target position (``-1``: the last). Positions after
    `position` get exactly 0 under causal masking.
    """
    resolve(model, layer_map)
    device = model.get_input_embeddings().weight.device
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long, device=device).reshape(1, -1)
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
    return gradient[0].double().norm(dim=-1).cpu().numpy()


# Registered statistics: each module registers on import (after the names above exist).
from . import sinks as _sinks  # noqa: E402,F401
from . import refinements as _refinements  # noqa: E402,F401


def summary_lines(measurement: Measurement) -> list[str]:
    """One line per registered statistic that `measurement` holds (its `Statistic.summary`)."""
    names = measurement.metadata.get("stats", [])
    return [_REGISTRY[name].summary(measurement.extra) for name in names
            if name in _REGISTRY and _REGISTRY[name].summary is not None]
