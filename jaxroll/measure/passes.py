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
- attention probabilities, wherever a statistic reads them (``attention``,
  ``attention_offsets``, ``sinks``, ``attention_heads``, ``norm_kernels``,
  ``sequence_rollout``): recomputed from the hooked q and k in row chunks,
  ``O(chunk N)`` float64 per head, on the eager and the efficient
  attention alike wherever the family's logit is stated exactly
  (`jaxroll.measure.attention_rows.recomputable`; each layer with its own
  sliding window); the hooked eager ``(B, H, N, N)`` probabilities
  otherwise (`jaxroll.measure.pass_setup.attention_mode`).
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
one row at a time (``(1, ...)``: a registered statistic never sees the batch axis). The batch size is `batch_size`
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
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import ConfigError
from .hooks import Hooks
from . import pass_setup as setup
from .layer_maps import LayerMap, resolve
from .partial_sums import PartialSums
from .precision import frozen_eval, full_precision
from .registry import HOOK_KINDS, Shapes, default_stats, parse_stats, registered
from .result import Measurement, measurement_from_sums

__all__ = ["measure", "influence_gradients"]


# Per-sequence sums (first axis S): merged across ranks by row, never added.
def measure(
    model,
    sequences,
    *,
    stats=None,
    tokenizer=None,
    length: int | None = None,
    samples: int | None = None,
    falcon_alibi: str = "once",
    positions: int = 1,
    checkpointing: bool | None = None,
    layer_map: LayerMap | None = None,
    progress=False,
    checkpoint_path=None,
    resume: bool = False,
    source: str | None = None,
    shard: tuple[int, int] | None = None,
    reduce: Callable | None = None,
    batch_size: int | None = None,
    interventions=(),
    queries=None,
    row_target: str | None = None,
    refine=None,
    document_indices=None,
    record: dict | None = None,
) -> Measurement | None:
    """Measure lambda_t, content scores, attention and gradient influence.

    Args:
        model: a Hugging Face ``*ForCausalLM`` (eval mode is set for the run
            and restored after), on any device or spread over several
            (``device_map``); inputs go to its embedding's device and every
            sum is accumulated in float64 on the CPU. ``"attention"`` and
            the registered statistics with ``observe_rows`` (sinks,
            attention_offsets, attention_heads, norm_kernels) recompute
            their rows in chunks from the hooked q and k
            (`jaxroll.measure.attention_rows`) on any attention
            implementation where the family's logit is stated exactly (the
            module docstring), so eager and ``sdpa`` give the same rows.
        sequences: token ids ``(S, N)`` (array or list of equal-length
            lists), or texts (a list of str) with `tokenizer` and `length`:
            documents in order, those with at least N tokens, their first N.
        stats: a subset of `statistic_names()`: ``lambda, content, influence,
            attention, qk`` and the registered ones (``sinks``); None:
            `default_stats` of the model's position encoding at this N and
            depth (ALiBi: ``lambda, content, influence``; otherwise the
            measured kernel too, ``attention`` while ``8 L N^2`` bytes fit
            `registry.DENSE_DEFAULT_BYTES`, else ``attention_offsets``).
        samples: with texts, stop after this many kept documents.
        falcon_alibi: ``"once"`` (Falcon's intended formula, its SDPA path,
            default) or ``"doubled"`` (its eager path, which adds the ALiBi
            bias twice; for reproducing published numbers).
        positions: stride of the positions at which ``qk_mean`` is kept.
        checkpointing: activation checkpointing of each block during the
            influence pass (each block's forward runs again in the backward,
            holding one block's activations at a time). None (default): only
            where memory needs it, `_checkpointing_needed`; results do not
            depend on it.
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
        queries: query positions ``(K,)`` (`jaxroll.theory.rows.query_positions`):
            also the rows of P_T on them, measured after the pass on the same
            sequences (`jaxroll.measure.additions.add_rows`; single process).
        row_target: with `queries`, what the rows differentiate:
            ``"probability"`` (default) or ``"hidden"`` (`jaxroll.measure.rows`).
        refine: refinement switches (`jaxroll.theory.refinements.SWITCHES`):
            recorded in ``metadata["refined"]`` (so `Measurement.save` writes
            ``refined.csv``) and, with `queries`, the refined rows
            ``refined_rows (K, N)``; `stats` must hold what they need.
        document_indices: ``(S,)`` which documents token ids were cut from
            (default ``0..S-1``).
        record: further metadata.json entries of the caller (e.g. the texts'
            protocol), recorded after the measured ones.

    Returns:
        A `Measurement` (None on a rank whose `reduce` returned None).

    Raises:
        ConfigError: bad input, a model outside the layer maps, a statistic
            the architecture cannot give; one line.
    """
    stats = None if stats is None else parse_stats(stats)
    setup.check_options(falcon_alibi, positions, batch_size)
    resolved = resolve(model, layer_map)
    patching, described, sinks = _patch(model, interventions, resolved)
    token_ids, indices = setup.token_ids_of(sequences, tokenizer, length, samples, model.config, document_indices)
    num_sequences, length = token_ids.shape
    if stats is None:
        stats = default_stats(resolved.layer_map.position, length, len(resolved.blocks))
    # SinkTokens: k ids in front of every sequence; the model runs at N + k (module docstring).
    prepended = setup.prepend_sinks(token_ids, sinks, tokenizer, model.config)
    setup.check_lengths(resolved.layer_map, model.config, stats, length, prepended.run_length)
    own = setup.shard_indices(num_sequences, shard)
    if checkpointing is None:
        checkpointing = _checkpointing_needed(model, prepended.run_length, stats, len(own), batch_size)
    mode = setup.attention_mode(model.config, resolved.layer_map, stats, falcon_alibi)
    slopes = setup.slopes_of(model, resolved.layer_map, model.config, resolved.num_heads, resolved.head_dim,
                             mode.bias_multiplier)
    metadata = setup.run_metadata(model, resolved, mode, slopes, source=source, stats=stats, length=length,
                                  num_sequences=num_sequences, positions=positions, checkpointing=checkpointing,
                                  record=described, sink_tokens=prepended.record)
    # Results do not depend on checkpointing (chosen from free memory when None): not part of a resume's identity.
    fingerprint = setup.fingerprint({key: value for key, value in metadata.items()
                                     if key != "activation_checkpointing"}, token_ids, shard)
    # The sums run at the model's N + k positions; `measurement_from_sums` splits the influence at the sinks.
    shape = Shapes(num_sequences, len(resolved.blocks), resolved.num_heads, prepended.run_length)
    sums = PartialSums(shape, stats, positions, own)
    if resume and checkpoint_path is not None and Path(checkpoint_path).is_file():
        sums.load(Path(checkpoint_path), fingerprint)
    grid = np.arange(0, prepended.run_length, positions)
    step = _Step(stats, shape.layers, prepended.run_length, grid, skip=sinks, hooked=mode.hooked)
    rotary = _recompute_rows(step, model, resolved, mode, slopes, falcon_alibi, patching, prepended.run_length)
    metadata["attention_rows"] = "recomputed from q, k in chunks" if mode.recompute else None
    hooks = _hooks(step, resolved, model.config, stats, mode, checkpointing)
    if batch_size is None:
        from .batching import choose_batch_size

        batch_size = choose_batch_size(model, prepended.run_length, stats, len(sums.indices) - sums.count,
                                       checkpointing=checkpointing)
    metadata["batch_size"] = int(batch_size)
    passes = _Passes(model, resolved, hooks, patching, rotary, step, stats, mode.recompute,
                     {"falcon_alibi": falcon_alibi, "length": prepended.run_length})
    sums.seconds = passes.run(sums, prepended.model_ids, batch_size, checkpoint_path, fingerprint,
                              _progress(progress, len(sums.indices), sums.count))
    if reduce is not None:
        sums = reduce(sums)
        if sums is None:
            return None
    timing = sums.timing or [(sums.count, sums.seconds)]
    # Seconds of the measuring loop (no loading) and sequences, per process.
    metadata["timing"] = {"sequences_per_process": [int(count) for count, _ in timing],
                          "loop_seconds_per_process": [float(seconds) for _, seconds in timing]}
    result = measurement_from_sums(sums, stats, token_ids, indices, slopes.slopes, slopes.bias_scale,
                                   slopes.logit_scale, grid, metadata, shape, sinks)
    paths = (prepended.model_ids, patching, falcon_alibi) if "paths" in stats else None
    _add(result, model, token_ids, queries=queries, row_target=row_target, refine=refine, record=record,
         progress=progress is not False and progress is not None, paths=paths)
    return result


def _checkpointing_needed(model, length, stats, remaining, batch_size) -> bool:
    """Whether the influence pass needs activation checkpointing to hold its batch.

    Checkpointing runs every block's forward a second time during the
    backward pass (about a third of a bare forward + backward more time) to
    hold one block's activations instead of all of them. It is chosen where
    holding all of them would shrink the batch: `batch_size` when given, else
    the batch a checkpointed pass would choose (`batching.choose_batch_size`,
    from the device's free memory).
    """
    if "influence" not in stats:
        return False
    from .batching import choose_batch_size

    plain = choose_batch_size(model, length, stats, max(1, remaining), checkpointing=False)
    wanted = batch_size if batch_size is not None else choose_batch_size(model, length, stats, max(1, remaining),
                                                                         checkpointing=True)
    return plain < wanted


def _add(result, model, token_ids, *, queries, row_target, refine, record, progress, paths=None) -> None:
    """Paths, rows (`queries`), the caller's `record` and the refinement (`refine`), in this order in metadata.json."""
    from . import additions

    if paths is not None:  # in the pass (forward route) or its own passes after it (jaxroll.measure.path_stats)
        model_ids, patching, falcon_alibi = paths
        additions.add_paths(result, model, model_ids, patching=patching, falcon_alibi=falcon_alibi)
    if queries is not None:
        additions.add_rows(result, model, token_ids, queries, progress=progress, target=row_target or "probability")
    elif row_target is not None:
        raise ConfigError(f"row_target: {row_target!r} without queries; allowed: queries with it (the rows it "
                          "measures)")
    if record:
        additions.add_record(result, record)
    if refine is not None:
        additions.add_refined(result, refine)


def _patch(model, interventions, resolved):
    """``(patch or None, the record of the interventions, k sinks)``: checked (one line) before anything runs."""
    interventions = list(interventions)
    if not interventions:
        return None, {}, 0
    from ..interventions import describe
    from .patching import patch

    patching = patch(model, interventions, resolved)
    return patching, describe(interventions), patching.plan.sinks


def _recompute_rows(step, model, resolved, mode, slopes, falcon_alibi, patching, run_length):
    """Under recomputed rows, what `_Step` needs to form them from q and k; the rotary capture (or None)."""
    if not mode.recompute:
        return None
    from .attention_rows import RotaryCapture, key_bias

    rotary = RotaryCapture(model, resolved) if resolved.layer_map.position == "rope" else None
    # Each layer's own window (Qwen2's layer_types: sliding layers from max_window_layers on).
    step.rows = {"scale": slopes.logit_scale, "bias": key_bias(model, resolved, run_length, falcon_alibi),
                 "windows": list(resolved.windows), "rotary": rotary,
                 "change": patching.plan.change if patching is not None else None}
    return rotary


def _hooks(step, resolved, config, stats, mode, checkpointing) -> Hooks:
    """The hooks the stats need: block input and attention output (lambda), q and k (content, qk, rows),
    probabilities (only for the statistics that read them hooked: `AttentionMode.hooked`), and each
    registered statistic's other kinds."""
    wants = {kind: any(kind in statistic.hooks for statistic in mode.extra.values()) for kind in HOOK_KINDS}
    return Hooks(
        resolved, config,
        on_block_input=step.block_input if ("lambda" in stats or wants["block_input"]) else None,
        on_attention_output=step.attention_output if ("lambda" in stats or wants["attention_output"]) else None,
        on_query_key=step.query_key if ("content" in stats or "qk" in stats or wants["query_key"]
                                        or mode.recompute) else None,
        on_probabilities=step.probabilities if mode.hooked else None,
        zero_falcon_alibi=mode.zero_falcon_alibi,
        checkpointing=checkpointing and "influence" in stats,
    )


class _Passes:
    """The loop over micro-batches: one forward and one backward pass each, under the hooks and the patch."""

    def __init__(self, model, resolved, hooks, patching, rotary, step, stats, recompute, run_context=None):
        self.model, self.resolved, self.hooks, self.patching = model, resolved, hooks, patching
        self.rotary, self.step, self.stats, self.recompute = rotary, step, stats, recompute
        self.run_context = dict(run_context or {}, model=model, patching=patching)

    def run(self, sums, model_ids, batch_size, checkpoint_path, fingerprint, bar) -> float:
        """Every batch of this process's sequences not yet in `sums`; the seconds of the loop."""
        model = self.model
        started = time.perf_counter()
        attached = []
        try:
            # Only the embeddings need gradients (frozen_eval). A float64 model in float64 end to end: no
            # float32 norms, rotary tables or softmax (precision.py). The patch after the hooks: a hook on the
            # q/k projection reads the model's own q, k (the rows apply the change), and the branch scale runs
            # before the hook that reads a (it is prepended).
            with frozen_eval(model), full_precision(model), self.hooks, \
                    (self.patching or contextlib.nullcontext()), \
                    (self.rotary if self.rotary is not None else contextlib.nullcontext()):
                attached += self._attach()
                self._batches(sums, model_ids, batch_size, checkpoint_path, fingerprint, bar)
        finally:
            for handle in attached:
                handle.remove()
            if bar is not None:
                bar.close()
        return time.perf_counter() - started

    def _attach(self) -> list:
        attached = []
        for statistic in self.step.registered:
            if statistic.attach is not None:
                # Under recomputed rows its alpha comes from observe_rows, not from a hook.
                keywords = {"recomputed": True} if self.recompute and statistic.observe_rows is not None else {}
                if "run" in inspect.signature(statistic.attach).parameters:  # what a run-dependent attach reads
                    keywords["run"] = self.run_context
                attached += statistic.attach(self.resolved, _deliver(self.step, statistic),
                                             lambda: self.hooks.recording, **keywords)
        return attached

    def _batches(self, sums, model_ids, batch_size, checkpoint_path, fingerprint, bar) -> None:
        device = self.model.get_input_embeddings().weight.device
        own = len(sums.indices)
        for first in range(sums.count, own, batch_size):
            rows = [int(index) for index in sums.indices[first:first + batch_size]]
            self.step.reset(len(rows))
            self.hooks.recording = True
            ids = torch.as_tensor(model_ids[rows], dtype=torch.long, device=device)
            result = _forward_backward(self.model, ids, "influence" in self.stats, self.hooks)
            _accumulate(sums, self.step, result, rows, self.stats)
            sums.count = first + len(rows)
            if checkpoint_path is not None:
                sums.save(Path(checkpoint_path), fingerprint)
            if bar is not None:
                bar.update(len(rows))


def _progress(progress, total, initial):
    if progress is False or progress is None:
        return None
    if progress is True:
        from .progress import Progress

        return Progress(total, initial=initial)
    return progress


class _Step:
    """Per-batch values the hooks deliver: built-ins per row on the device, registered ones row by row.

    Hooks hand over ``(B, N, ...)`` tensors. lambda and content are computed
    for all B rows at once in float64 on the model's device (one transfer
    per batch, in `_accumulate`); a registered statistic's `observe` gets
    each row as a ``(1, ...)`` tensor with its own state, as when one
    sequence ran alone.
    """

    def __init__(self, stats, num_layers, length, grid, skip=0, hooked=()):
        self.stats = stats
        self.skip = skip  # sink tokens in front: lambda and content read the positions after them
        self.grid = torch.as_tensor(grid)
        self.registered = [registered()[name] for name in stats if name in registered()]
        self.hooked = tuple(hooked)  # statistics that read the hooked eager probabilities, not recomputed rows
        self.rows = None  # {scale, bias, windows, rotary, change}: recompute attention rows from q, k
        self.buffers = {}  # row_chunks' two chunk buffers, kept from layer to layer and batch to batch
        self.reset(1)

    def reset(self, batch):
        self.batch = batch
        self.x_norms = {}
        self.stream = {}
        self.lambdas = {}
        self.diagonal = {}
        self.lower = {}
        self.qk = {}
        self.attention = {}
        self.states = [{statistic.name: {} for statistic in self.registered} for _ in range(batch)]

    def _observe(self, kind, layer, *tensors):
        for statistic in self.registered:
            # Probabilities go only to the statistics that read them hooked (the rest get recomputed rows).
            if kind in statistic.hooks and (kind != "probabilities" or statistic.name in self.hooked):
                if statistic.batch_rows:
                    statistic.observe(self.states[0][statistic.name], kind, layer, *tensors)
                    continue
                for row, state in enumerate(self.states):
                    statistic.observe(state[statistic.name], kind, layer, *(t[row:row + 1] for t in tensors))

    def block_input(self, layer, x):
        if "lambda" in self.stats:
            self.x_norms[layer] = x.double().norm(dim=-1)[:, self.skip:]  # (B, N)
            self.stream[layer] = (self.x_norms[layer] ** 2).mean(dim=-1)  # (B,): the stream's mean square
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
        dtype = q.dtype  # the model's: the precision of the logits (attention_rows.work_dtype), before rotation
        turn = None  # the rotation the attention applies after the projections, done by row_chunks
        if rows["rotary"] is not None:
            cos, sin = rows["rotary"].cos, rows["rotary"].sin
            ratios = None if rows["change"] is None else rows["change"].rotary_ratios
            turn = (cos, sin) if ratios is None else None
            if ratios is not None:  # a rotary rescale: at p / r per head, as the patched attention rotates
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
                from .patching import rerotate

                positions = torch.arange(q.shape[1], device=q.device)
                inv_freq = rows["rotary"].module.inv_freq
                q = rerotate(q.transpose(1, 2), positions, inv_freq, ratios[layer]).transpose(1, 2)
                keys = rows["change"].key_rotary_ratios[layer]  # k is repeated per query head: its group's first
                k = rerotate(k.transpose(1, 2), positions, inv_freq, keys).transpose(1, 2)
        watching = [statistic for statistic in self.registered
                    if statistic.observe_rows is not None and statistic.name not in self.hooked]
        n = q.shape[1]
        change = None if rows["change"] is None else functools.partial(rows["change"].logits, layer)
        # reuse: every consumer below sums (or copies) a chunk before the next one overwrites it.
        for start, chunk in row_chunks(q, k, scale=rows["scale"], bias=rows["bias"], window=rows["windows"][layer],
                                       change=change, reuse=True, precision=dtype, rotary=turn,
                                       buffers=self.buffers):
            if "attention" in self.stats and "attention" not in self.hooked:
                if layer not in self.attention:
                    self.attention[layer] = chunk.new_zeros((n, n))
                stop = start + chunk.shape[2]  # keys after the chunk's last row are 0: not summed
                self.attention[layer][start:stop, :stop] += chunk[..., :stop].sum(dim=(0, 1)).div_(chunk.shape[1])
            for statistic in watching:
                if statistic.batch_rows:
                    statistic.observe_rows(self.states[0][statistic.name], layer, start, chunk)
                    continue
                for row, state in enumerate(self.states):
                    statistic.observe_rows(state[statistic.name], layer, start, chunk[row:row + 1])

    def probabilities(self, layer, p):
        if "attention" in self.hooked:
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
        arrays["stream_squares_per_sequence"][rows] = _stack(step.stream).T
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
        if statistic.batch_rows:
            statistic.accumulate(arrays, step.states[0][statistic.name], np.asarray(rows))
            continue
        for row, index in enumerate(rows):
            statistic.accumulate(arrays, step.states[row][statistic.name], index)


def influence_gradients(model, token_ids, *, position: int = -1, layer_map: LayerMap | None = None):
    """``||df/de_j||_2`` for one sequence, f the top probability at `position`.

    The unnormalised gradient norms ``(N,)`` (float64) that `measure`
    averages, for any target position (``-1``: the last). Positions after
    `position` get exactly 0 under causal masking. The last block's attention
    is computed at row `position` only (`jaxroll.measure.target_row`: the
    other rows of the last block never reach f).
    """
    from .target_row import last_block_at_row

    attentions = resolve(model, layer_map).attentions
    device = model.get_input_embeddings().weight.device
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long, device=device).reshape(1, -1)
    keywords = {"use_cache": False}
    row = position
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        # The output head on positions >= `position` only (the last N - p rows), not on all N.
        keywords["logits_to_keep"], row = ids.shape[1] - position % ids.shape[1], 0
    # Only the embeddings need gradients: frozen weights keep no inputs for their own gradients. Only
    # row `position` of the last block's attention reaches f: the others are not computed (target_row.py).
    with frozen_eval(model), full_precision(model), last_block_at_row(model, attentions[-1], position, ids.shape[1]):
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeddings, **keywords).logits[0, row]
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probabilities = torch.softmax(logits.to(dtype), dim=-1)
        (gradient,) = torch.autograd.grad(probabilities.max(), embeddings)
    return gradient[0].double().norm(dim=-1).cpu().numpy()


# Registered statistics: each module registers on import (after the names above exist).
