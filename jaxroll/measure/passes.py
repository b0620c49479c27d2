"""One forward and one backward pass per micro-batch: lambda_t, content, influence.

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
- under ``SinkTokens(k)`` (``--intervene sinks=k``): k sink ids in front of
  every sequence (`jaxroll.measure.torch_plan.sink_token`: the
  tokenizer's BOS, else its EOS, else the config's, else 0), the model at
  ``N + k``. ``influence`` and ``influence_per_sequence`` are over the N
  originals (normalised over them); ``sink_mass (S,)`` is the sinks' share
  of each sequence's gradient mass, ``sum_{j < k} g_j / sum_j g_j`` (the
  rollout's `SinkTokens.split`, per sequence); ``lambda`` and ``content``
  read the N original positions; ``attention``, ``qk`` and the registered
  statistics the model's ``N + k`` (the sinks are keys every row reads).
- further statistics from the registry (`register_statistic`), e.g.
  ``"sinks"`` (`jaxroll.measure.sinks`, attention sinks after Gu et al. 2024).

Batches: B sequences go through one forward and one backward pass. The
sequences are independent (no padding: all have N tokens; no family in the
layer maps normalises across the batch; the causal mask and the position
bias are per row), so the gradient of the sum of the per-sequence targets
``sum_b f_b`` with respect to the embeddings of sequence b is ``df_b / de``
of that sequence alone: per-sequence results equal one-at-a-time ones up to
floating-point summation order. Hooks deliver ``(B, N, ...)`` tensors; the
built-in statistics are computed per row on the device, registered ones see
one row at a time (``(1, ...)``, as before). The batch size is `batch_size`
or, by default, what the device's free memory holds
(`jaxroll.measure.batching`).

Data parallel: `measure` can run on a shard of the sequences (`shard`) and
hand its partial sums to a `reduce` callable (`jaxroll.measure.distributed`
gathers them on rank 0); sums and counts merge exactly, per-sequence rows by
index.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import ConfigError
from .hooks import Hooks
from .layer_maps import FALCON_VARIANTS, LayerMap, resolve
from .partial_sums import PartialSums
from .precision import full_precision
from .registry import DEFAULT_STATS, HOOK_KINDS, Shapes, check_stats_allowed, parse_stats, registered
from .result import Measurement, measurement_from_sums

__all__ = ["measure", "influence_gradients"]


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
    batch_size: int | None = None,
    interventions=(),
) -> Measurement | None:
    """Measure lambda_t, content scores, attention and gradient influence.

    Args:
        model: a Hugging Face ``*ForCausalLM`` (eval mode is set for the run
            and restored after), on any device or spread over several
            (``device_map``); inputs go to its embedding's device and every
            sum is accumulated in float64 on the CPU. Under an efficient
            attention (``sdpa``) ``"attention"`` and ``"sinks"`` recompute
            their rows in chunks from the hooked q and k
            (`jaxroll.measure.attention_rows`), as do the registered
            statistics with ``observe_rows`` (attention_heads, norm_kernels,
            attention_offsets).
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
            every batch; with `resume`, continue from it.
        shard: ``(rank, world)``: measure only the contiguous block
            ``rank`` of `world` near-equal blocks of the sequences.
        reduce: called with this process's `PartialSums` after the loop;
            returns the merged sums (rank 0) or None (other ranks, for which
            `measure` then returns None).
        batch_size: sequences per forward and backward pass (None: as many
            as the device's free memory holds, `batching.choose_batch_size`).
            Results do not depend on it (see the module docstring).
        interventions: `jaxroll.interventions` objects (`jaxroll.interventions.parse`):
            the passes run under `jaxroll.measure.patching.patch`, recomputed
            attention rows apply the same logit change, and the record
            (`jaxroll.interventions.describe`) goes into the metadata. A
            `SinkTokens` prepends its ids (module docstring; `tokenizer`, if
            given, chooses them) and ``metadata["sink_tokens"]`` records
            them.

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
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size: got {batch_size!r}; allowed: an integer >= 1 (or None: from free memory)")
    resolved = resolve(model, layer_map)
    layer_map = resolved.layer_map
    config = model.config
    interventions = list(interventions)
    patching, record, sinks = None, {}, 0
    if interventions:  # checked (one line) before anything runs
        from ..interventions import describe
        from .patching import patch

        patching, record = patch(model, interventions, resolved), describe(interventions)
        sinks = patching.plan.sinks
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
    # SinkTokens: k ids in front of every sequence; the model runs at N + k (module docstring).
    run_length = length + sinks
    sink_tokens, model_ids = None, token_ids
    if sinks:
        from .torch_plan import check_sink_length, sink_token

        check_sink_length(config, length, sinks, flag="length")
        sink_id, origin = sink_token(tokenizer, config)
        sink_tokens = {"count": sinks, "token_id": sink_id, "token": origin, "run_length": run_length}
        model_ids = np.concatenate([np.full((num_sequences, sinks), sink_id, dtype=np.int64), token_ids], axis=1)

    if layer_map.name == "mpt" and run_length > config.max_seq_len:
        raise ConfigError(f"length: {run_length}; allowed: at most the model's max_seq_len ({config.max_seq_len})")
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
    extra = {name: statistic for name, statistic in registered().items() if name in stats}
    reading = [name for name in stats if name == "attention" or (
        name in extra and (extra[name].needs_eager or "probabilities" in extra[name].hooks))]
    # Under an efficient attention, attention and statistics with observe_rows get
    # their rows recomputed in chunks from q and k (attention_rows); the rest need eager.
    recompute = bool(reading) and implementation != "eager"
    if recompute:
        reading = [name for name in reading if name != "attention" and extra[name].observe_rows is None]
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
        "attention_windows": resolved.windows,
        "parallel_block": resolved.parallel,
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
        "interventions": record,
        "sink_tokens": sink_tokens,
    }
    fingerprint = json.dumps({key: metadata[key] for key in (
        "model_class", "num_layers", "num_heads", "stats", "falcon_alibi", "dtype", "qk_position_stride",
        "interventions", "sink_tokens")}
        | {"tokens": int(np.asarray(token_ids, dtype=np.int64).sum() % 1_000_000_007),
           "shape": list(token_ids.shape)}
        | ({"shard": list(shard)} if shard is not None and shard[1] > 1 else {}), sort_keys=True)

    # The sums run at the model's N + k positions; `_finish` splits the influence at the sinks.
    shape = Shapes(num_sequences, num_layers, num_heads, run_length)
    sums = PartialSums(shape, stats, positions, indices)
    if resume and checkpoint_path is not None and Path(checkpoint_path).is_file():
        sums.load(Path(checkpoint_path), fingerprint)

    grid = np.arange(0, run_length, positions)
    step = _Step(stats, num_layers, run_length, grid, skip=sinks)
    rotary = None
    if recompute:
        from .attention_rows import RotaryCapture, key_bias, sliding_window

        rotary = RotaryCapture(model, resolved) if layer_map.position == "rope" else None
        step.rows = {"scale": logit_scale, "bias": key_bias(model, resolved, run_length, falcon_alibi),
                     "window": sliding_window(config, layer_map.name), "rotary": rotary,
                     "change": patching.plan.change if patching is not None else None}
    metadata["attention_rows"] = "recomputed from q, k in chunks" if recompute else None
    wants = {kind: any(kind in statistic.hooks for statistic in extra.values()) for kind in HOOK_KINDS}
    hooks = Hooks(
        resolved, config,
        on_block_input=step.block_input if ("lambda" in stats or wants["block_input"]) else None,
        on_attention_output=step.attention_output if ("lambda" in stats or wants["attention_output"]) else None,
        on_query_key=step.query_key if ("content" in stats or "qk" in stats or wants["query_key"]
                                        or recompute) else None,
        on_probabilities=step.probabilities if not recompute and ("attention" in stats or wants["probabilities"])
        else None,
        zero_falcon_alibi=zero_falcon_alibi,
        checkpointing=checkpointing and "influence" in stats,
    )
    was_training = model.training
    grad_flags = [parameter.requires_grad for parameter in model.parameters()]
    device = model.get_input_embeddings().weight.device
    own = len(sums.indices)
    if batch_size is None:
        from .batching import choose_batch_size

        batch_size = choose_batch_size(model, run_length, stats, own - sums.count, checkpointing=checkpointing)
    metadata["batch_size"] = int(batch_size)
    bar = _progress(progress, own, sums.count)
    started = time.perf_counter()
    model.eval()
    attached = []
    try:
        # Only the embeddings need gradients: weights that do not require
        # them save no activations for their own gradients.
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        # A float64 model in float64 end to end: no float32 norms, rotary tables or softmax (precision.py).
        # The patch after the hooks: a hook on the q/k projection reads the model's own q, k (the rows
        # apply the change), and the branch scale runs before the hook that reads a (it is prepended).
        with full_precision(model), hooks, (patching or contextlib.nullcontext()), \
                (rotary if rotary is not None else contextlib.nullcontext()):
            for statistic in step.registered:
                if statistic.attach is not None:
                    # Under recomputed rows its alpha comes from observe_rows, not from a hook.
                    keywords = {"recomputed": True} if recompute and statistic.observe_rows is not None else {}
                    attached += statistic.attach(resolved, _deliver(step, statistic), lambda: hooks.recording,
                                                 **keywords)
            for first in range(sums.count, own, batch_size):
                rows = [int(index) for index in sums.indices[first:first + batch_size]]
                step.reset(len(rows))
                hooks.recording = True
                ids = torch.as_tensor(model_ids[rows], dtype=torch.long, device=device)
                result = _forward_backward(model, ids, "influence" in stats, hooks)
                _accumulate(sums, step, result, rows, stats)
                sums.count = first + len(rows)
                if checkpoint_path is not None:
                    sums.save(Path(checkpoint_path), fingerprint)
                if bar is not None:
                    bar.update(len(rows))
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
    return measurement_from_sums(sums, stats, token_ids, document_indices, slopes, bias_scale, logit_scale, grid, metadata, shape,
                   sinks)


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

    from ..version import package_version

    return {"jaxroll": package_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


class _Step:
    """Per-batch values the hooks deliver: built-ins per row on the device, registered ones row by row.

    Hooks hand over ``(B, N, ...)`` tensors. lambda and content are computed
    for all B rows at once in float64 on the model's device (one transfer
    per batch, in `_accumulate`); a registered statistic's `observe` gets
    each row as a ``(1, ...)`` tensor with its own state, as when one
    sequence ran alone.
    """

    def __init__(self, stats, num_layers, length, grid, skip=0):
        self.stats = stats
        self.skip = skip  # sink tokens in front: lambda and content read the positions after them
        self.grid = torch.as_tensor(grid)
        self.registered = [registered()[name] for name in stats if name in registered()]
        self.rows = None  # {scale, bias, window, rotary, change}: recompute attention rows from q, k
        self.reset(1)

    def reset(self, batch):
        self.batch = batch
        self.x_norms = {}
        self.lambdas = {}
        self.diagonal = {}
        self.lower = {}
        self.qk = {}
        self.attention = {}
        self.states = [{statistic.name: {} for statistic in self.registered} for _ in range(batch)]

    def _observe(self, kind, layer, *tensors):
        for statistic in self.registered:
            if kind in statistic.hooks:
                for row, state in enumerate(self.states):
                    statistic.observe(state[statistic.name], kind, layer, *(t[row:row + 1] for t in tensors))

    def block_input(self, layer, x):
        if "lambda" in self.stats:
            self.x_norms[layer] = x.double().norm(dim=-1)[:, self.skip:]  # (B, N)
        self._observe("block_input", layer, x)

    def attention_output(self, layer, a):
        if "lambda" in self.stats:
            a_norm = a.double().norm(dim=-1)[:, self.skip:]
            x_norm = self.x_norms.pop(layer).to(a_norm.device)
            denominator = x_norm + a_norm
            # 0/0 (a zero residual stream and a zero update) counts as no mixing.
            ratio = torch.where(denominator > 0, a_norm / torch.where(denominator > 0, denominator, 1.0), 0.0)
            self.lambdas[layer] = ratio.mean(dim=-1)  # (B,), on the device until the batch ends
        self._observe("attention_output", layer, a)

    def query_key(self, layer, q, k):
        if "content" in self.stats or "qk" in self.stats:
            q64 = q.double().transpose(1, 2)  # (B, H, N, d)
            k64 = k.double().transpose(1, 2)
            if "content" in self.stats:
                # Sums over the batch's rows: content is a mean over sequences (over the positions after the sinks).
                q_own, k_own = q64[:, :, self.skip:], k64[:, :, self.skip:]
                n = q_own.shape[2]
                self.diagonal[layer] = (q_own * k_own).sum(-1).mean(-1).sum(0)
                before = torch.cumsum(k_own, dim=2) - k_own  # sum_{j < i} k_j
                self.lower[layer] = (q_own * before).sum((-1, -2)).sum(0) / (n * (n - 1) / 2)
            if "qk" in self.stats:
                grid = self.grid.to(q64.device)
                self.qk[layer] = (q64[:, :, grid] @ k64[:, :, grid].transpose(-1, -2)).sum(0)
        if self.rows is not None:
            self._recomputed_rows(layer, q, k)
        self._observe("query_key", layer, q, k)

    def _recomputed_rows(self, layer, q, k):
        from .attention_rows import rotate, row_chunks

        rows = self.rows
        if rows["rotary"] is not None:  # the rotation the attention applies after the projections
            cos, sin = rows["rotary"].cos, rows["rotary"].sin
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            ratios = None if rows["change"] is None else rows["change"].rotary_ratios
            if ratios is not None:  # a rotary rescale: at p / r per head, as the patched attention rotates
                from .patching import rerotate

                positions = torch.arange(q.shape[1], device=q.device)
                inv_freq = rows["rotary"].module.inv_freq
                q = rerotate(q.transpose(1, 2), positions, inv_freq, ratios[layer]).transpose(1, 2)
                k = rerotate(k.transpose(1, 2), positions, inv_freq, ratios[layer]).transpose(1, 2)
        watching = [statistic for statistic in self.registered if statistic.observe_rows is not None]
        n = q.shape[1]
        change = None if rows["change"] is None else functools.partial(rows["change"].logits, layer)
        for start, chunk in row_chunks(q, k, scale=rows["scale"], bias=rows["bias"], window=rows["window"],
                                       change=change):
            if "attention" in self.stats:
                if layer not in self.attention:
                    self.attention[layer] = chunk.new_zeros((n, n))
                self.attention[layer][start:start + chunk.shape[2]] += chunk.mean(1).sum(0)
            for statistic in watching:
                for row, state in enumerate(self.states):
                    statistic.observe_rows(state[statistic.name], layer, start, chunk[row:row + 1])

    def probabilities(self, layer, p):
        if "attention" in self.stats:
            self.attention[layer] = p.double().mean(1).sum(0)  # head mean, summed over the batch
        self._observe("probabilities", layer, p)


def _deliver(step, statistic):
    # An attached hook's tensors (one row each) go to that row's state of the current batch.
    def deliver(kind, layer, *tensors, row=0):
        statistic.observe(step.states[row][statistic.name], kind, layer, *tensors)
    return deliver


def _forward_backward(model, ids, want_influence, hooks):
    embeddings = model.get_input_embeddings()(ids).detach()
    embeddings.requires_grad_(want_influence)
    keywords = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        keywords["logits_to_keep"] = 1
    with torch.set_grad_enabled(want_influence):
        logits = model(inputs_embeds=embeddings, **keywords).logits[:, -1]
        # float32 at least (bfloat16 logits are upcast), float64 kept.
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probabilities = torch.softmax(logits.to(dtype), dim=-1)
        target, token = probabilities.max(dim=-1)  # (B,): f_b and its token
    hooks.recording = False  # the checkpointed recompute must not count twice
    out = {"token": token.cpu().numpy(), "probability": target.detach().cpu().numpy()}
    if not want_influence:
        return out
    # Rows are independent: d(sum_b f_b)/de_b = df_b/de_b (module docstring).
    (gradient,) = torch.autograd.grad(target.sum(), embeddings)
    # The norm in float64 whatever the model dtype (bfloat16 gradients are upcast first).
    out["norms"] = gradient.double().norm(dim=-1).cpu().numpy()  # (B, N)
    return out


def _stack(values: dict) -> np.ndarray:
    # {layer: tensor (...)} -> (layers, ...) float64 NumPy, one transfer.
    return torch.stack([values[t] for t in sorted(values)]).cpu().numpy()


def _accumulate(sums, step, result, rows, stats):
    arrays = sums.arrays
    num_layers = arrays["lambdas_per_sequence"].shape[1] if "lambda" in stats else None
    if "lambda" in stats:
        if len(step.lambdas) != num_layers:
            raise ConfigError(f"layer map: hooked {len(step.lambdas)} of {num_layers} attention outputs")
        arrays["lambdas_per_sequence"][rows] = _stack(step.lambdas).T
    if "influence" in stats:
        norms = result["norms"]
        for row, index in enumerate(rows):
            if not np.all(np.isfinite(norms[row])):
                raise ConfigError(f"influence: sequence {index} gave a non-finite gradient; allowed: finite models")
        for row in norms:  # one row at a time: the same summation order at every batch size
            arrays["influence_sum"] += row
        arrays["influence_per_sequence"][rows] = norms
        arrays["target_token"][rows] = result["token"]
        arrays["target_probability"][rows] = result["probability"]
    if "content" in stats:
        arrays["qk_diagonal_sum"] += _stack(step.diagonal)
        arrays["qk_lower_sum"] += _stack(step.lower)
    if "qk" in stats:
        arrays["qk_sum"] += _stack(step.qk)
    if "attention" in stats:
        arrays["attention_sum"] += _stack(step.attention)
    for statistic in step.registered:
        for row, index in enumerate(rows):
            statistic.accumulate(arrays, step.states[row][statistic.name], index)


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
        with full_precision(model):
            embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, position]
            dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
            probabilities = torch.softmax(logits.to(dtype), dim=-1)
            (gradient,) = torch.autograd.grad(probabilities.max(), embeddings)
    finally:
        model.train(was_training)
    return gradient[0].double().norm(dim=-1).cpu().numpy()


# Registered statistics: each module registers on import (after the names above exist).
