"""What `jaxroll.measure.measure` decides before its first pass: checked inputs, token ids, sinks, slopes, metadata.

Each function has one idea and raises a one-line `ConfigError` on bad
input; `jaxroll.measure.passes.measure` calls them in order, so everything
is checked before a hook is attached or a sequence runs.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np
import torch

from ..errors import ConfigError
from .layer_maps import FALCON_VARIANTS
from .registry import check_stats_allowed, registered

__all__ = ["check_options", "token_ids_of", "Sinks", "prepend_sinks", "check_lengths", "shard_indices",
           "AttentionMode", "attention_mode", "Slopes", "slopes_of", "run_metadata", "fingerprint"]


def check_options(falcon_alibi, positions, batch_size) -> None:
    """`falcon_alibi` one of `FALCON_VARIANTS`, `positions` an integer >= 1, `batch_size` None or >= 1."""
    if falcon_alibi not in FALCON_VARIANTS:
        raise ConfigError(f"falcon_alibi: got {falcon_alibi!r}; allowed: one of {', '.join(FALCON_VARIANTS)}")
    if not isinstance(positions, int) or positions < 1:
        raise ConfigError(f"positions: got {positions!r}; allowed: an integer >= 1")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size: got {batch_size!r}; allowed: an integer >= 1 (or None: from free memory)")


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


def token_ids_of(sequences, tokenizer, length, samples, config, document_indices=None):
    """``(token_ids (S, N) int64, document_indices (S,))`` of token ids or of texts (with `tokenizer`, `length`).

    Texts: documents in order, those with at least N tokens, their first N
    (`jaxroll.measure.texts.select_sequences`). Token ids: at most `samples`
    of them, indexed ``0..S-1`` unless `document_indices` says which
    documents they were cut from.
    """
    if isinstance(sequences, (list, tuple)) and sequences and isinstance(sequences[0], str):
        if tokenizer is None or length is None:
            raise ConfigError("sequences: texts need a tokenizer and a length; allowed: token ids (S, N) or both")
        from .texts import select_sequences

        return select_sequences(sequences, tokenizer, length, samples)
    token_ids = _as_token_ids(sequences, length, getattr(config, "vocab_size", None))
    if samples is not None:
        token_ids = token_ids[:samples]
    if document_indices is None:
        return token_ids, np.arange(token_ids.shape[0])
    document_indices = np.asarray(document_indices)
    if document_indices.shape != (token_ids.shape[0],):
        raise ConfigError(f"document_indices: shape {document_indices.shape}; allowed: ({token_ids.shape[0]},), "
                          "one per sequence")
    return token_ids, document_indices


class Sinks(NamedTuple):
    """k sink ids in front of every sequence: the ids the model runs on, at ``N + k``, and their record."""

    model_ids: np.ndarray  # (S, N + k)
    run_length: int        # N + k
    record: dict | None    # metadata["sink_tokens"]; None without sinks


def prepend_sinks(token_ids, sinks: int, tokenizer, config) -> Sinks:
    """`token_ids` with `sinks` ids in front (`jaxroll.measure.torch_plan.sink_token`); unchanged for 0."""
    num_sequences, length = token_ids.shape
    if not sinks:
        return Sinks(token_ids, length, None)
    from .torch_plan import check_sink_length, sink_token

    run_length = length + sinks
    check_sink_length(config, length, sinks, flag="length")
    sink_id, origin = sink_token(tokenizer, config)
    record = {"count": sinks, "token_id": sink_id, "token": origin, "run_length": run_length}
    ids = np.concatenate([np.full((num_sequences, sinks), sink_id, dtype=np.int64), token_ids], axis=1)
    return Sinks(ids, run_length, record)


def check_lengths(layer_map, config, stats, length: int, run_length: int) -> None:
    """MPT's ``max_seq_len`` at the run's length, the statistics the family allows, N >= 2 for content."""
    if layer_map.name == "mpt" and run_length > config.max_seq_len:
        raise ConfigError(f"length: {run_length}; allowed: at most the model's max_seq_len ({config.max_seq_len})")
    check_stats_allowed(stats, layer_map.name, layer_map.position)
    if "content" in stats and length < 2:
        raise ConfigError("length: 1; allowed: >= 2 for content (the base is the mean below the diagonal)")


def shard_indices(num_sequences: int, shard) -> np.ndarray:
    """The sequences this process measures: all, or block ``rank`` of ``world`` near-equal blocks."""
    indices = np.arange(num_sequences)
    if shard is None:
        return indices
    rank, world = shard
    if not (isinstance(world, int) and world >= 1 and 0 <= rank < world):
        raise ConfigError(f"shard: got {shard!r}; allowed: (rank, world) with 0 <= rank < world")
    return np.array_split(indices, world)[rank]


class AttentionMode(NamedTuple):
    """How the attention is read: its implementation, whether rows are recomputed, Falcon's ALiBi variant."""

    implementation: str
    extra: dict             # the registered statistics among the stats, by name
    recompute: bool         # attention rows recomputed in chunks from q, k (attention_rows)
    variant: str | None     # Falcon ALiBi: "once" or "doubled"; None for other families
    zero_falcon_alibi: bool
    bias_multiplier: float  # c in the logit formula: 2 for Falcon's doubled eager path
    hooked: tuple = ()      # the statistics that read the hooked eager probabilities (B, H, N, N)


def _reads_probabilities(name: str, extra: dict) -> bool:
    return name == "attention" or (name in extra and (extra[name].needs_eager
                                                      or "probabilities" in extra[name].hooks))


def attention_mode(config, layer_map, stats, falcon_alibi) -> AttentionMode:
    """Which statistics get their rows recomputed in chunks from q and k, which read the eager probabilities.

    ``attention`` and the statistics with ``observe_rows`` are recomputed
    (`jaxroll.measure.attention_rows`: ``O(chunk N)`` float64 per head) on
    every implementation where the layer map states the logit exactly
    (`attention_rows.recomputable`), and under an efficient attention in
    any case (a family that cannot be recomputed exactly is loaded eager by
    `loading.attention_implementation`). The rest (a family whose rows are
    not recomputable, a registered statistic without ``observe_rows``)
    read the hooked eager probabilities: eager attention only, as does
    Falcon's doubled path.
    """
    from .attention_rows import recomputable

    implementation = getattr(config, "_attn_implementation", "eager")
    extra = {name: statistic for name, statistic in registered().items() if name in stats}
    reading = [name for name in stats if _reads_probabilities(name, extra)]
    rows = [name for name in reading if name == "attention" or extra[name].observe_rows is not None]
    recompute = bool(rows) and (implementation != "eager" or recomputable(layer_map))
    hooked = tuple(name for name in reading if not (recompute and name in rows))
    if hooked and implementation != "eager":
        raise ConfigError(f"stats: {', '.join(hooked)} read the attention probabilities; the model uses "
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
    return AttentionMode(implementation, extra, recompute, variant, zero_falcon_alibi, bias_multiplier, hooked)


class Slopes(NamedTuple):
    """The model's ALiBi slopes ``(H,)`` (zeros without ALiBi) and the factors of its logit."""

    slopes: np.ndarray
    bias_scale: float   # slopes in softmax-logit units: slope * bias_scale
    logit_scale: float  # the factor on q.k in the logit


def slopes_of(model, layer_map, config, num_heads: int, head_dim: int, bias_multiplier: float) -> Slopes:
    """BLOOM and MPT add ``m j`` to the scaled logit; Falcon adds it before the scale (times c)."""
    logit_scale = float(layer_map.logit_scale(config, head_dim))
    if layer_map.slopes is None:
        return Slopes(np.zeros(num_heads), 0.0, logit_scale)
    slopes = layer_map.slopes(model, num_heads).cpu().numpy().astype(np.float64)
    bias_scale = bias_multiplier * (logit_scale if layer_map.name == "falcon" else 1.0)
    return Slopes(slopes, bias_scale, logit_scale)


def _versions() -> dict:
    import platform

    import transformers

    from ..version import package_version

    return {"jaxroll": package_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def run_metadata(model, resolved, mode: AttentionMode, slopes: Slopes, *, source, stats, length, num_sequences,
                 positions, checkpointing, record, sink_tokens) -> dict:
    """The JSON-ready record of a run (metadata.json), before its timing and batch size are known."""
    config, layer_map = model.config, resolved.layer_map
    return {
        "model": source or str(getattr(config, "_name_or_path", "") or type(model).__name__),
        "model_class": type(model).__name__,
        "model_type": getattr(config, "model_type", None),
        "layer_map": layer_map.name,
        "num_layers": len(resolved.blocks),
        "num_heads": resolved.num_heads,
        "head_dim": resolved.head_dim,
        "position_encoding": layer_map.position,
        "attention_windows": resolved.windows,
        "parallel_block": resolved.parallel,
        "attn_implementation": mode.implementation,
        "logit_formula": layer_map.formula + (f",  c = {int(mode.bias_multiplier)}" if mode.variant else ""),
        "falcon_alibi": mode.variant,
        "logit_scale": slopes.logit_scale,
        "bias_scale": slopes.bias_scale,
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
        "interventions": record,
        "sink_tokens": sink_tokens,
    }


def fingerprint(metadata: dict, token_ids, shard) -> str:
    """What a checkpoint must match to be resumed: the model, the stats, the tokens (a checksum), the shard."""
    return json.dumps({key: metadata[key] for key in (
        "model_class", "num_layers", "num_heads", "stats", "falcon_alibi", "dtype", "qk_position_stride",
        "interventions", "sink_tokens")}
        | {"tokens": int(np.asarray(token_ids, dtype=np.int64).sum() % 1_000_000_007),
           "shape": list(token_ids.shape)}
        | ({"shard": list(shard)} if shard is not None and shard[1] > 1 else {}), sort_keys=True)
