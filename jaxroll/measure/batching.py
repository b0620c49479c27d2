"""The peak memory of a `measure` process, estimated before loading: it decides refusals and batch sizes.

For a model of L blocks, hidden size D, H heads, MLP width I, in its dtype
(``s`` bytes per element), measured at N tokens with batches of B
sequences, the peak resident set of the whole process (on the CPU) is
estimated as

    peak = R + Lib + W + sums + max(pass, finish)
    pass = max(B seq, B fwd + chunks) + held

- ``R``: the process's resident set when the estimate is taken
  (`jaxroll.memory.resident_bytes`: Python, torch, transformers, JAX loaded);
  ``Lib`` (`LATER_LIBRARIES`): what loads after it (the tokenizer,
  safetensors, matplotlib for the figures); ``W``: the weights
  (`weight_bytes`).
- ``seq`` (`sequence_bytes`), one sequence's working set in the backward
  pass: with activation checkpointing (the influence pass's default) the
  block inputs autograd keeps, ``L N D s``, plus one block recomputed with
  its graph, ``N (a D + b I) s``; without it every block's graph,
  ``L N (a D + b I) s``; eager attention's scores ``H N^2 (3 s + 4) + N^2 s``
  (scores, probabilities, their gradients in the model's dtype, the float32
  softmax, and the ``(N, N)`` mask), once with checkpointing, per block
  without; the statistics' float64 ``(N, D)`` transients, ``4 N D 8``. On
  the CPU ``a, b = 20, 7`` (`BLOCK_ELEMENTS`; fitted to the peak RSS of tiny
  Llama, GPT-2 and BLOOM models at N = 2048 to 16,384, benchmarks/memory.py:
  Llama's float32 RMSNorm, rotary and repeated keys, GPT-2's composed GELU,
  the allocator's slack); on a GPU ``8, 3`` (run gpu-1 of
  docs/performance.md: it is 0.88 of a 24 x 1024 Llama's peak; BLOOM took
  about 17 bytes per score element).
- ``fwd``: one sequence in the checkpointed forward pass, ``L N D s + 4 N D 8``
  (``seq`` without checkpointing), beside the ``chunks`` (`chunk_bytes`) of
  the statistics that read probabilities: where they recompute their rows
  from q, k in chunks of ``CHUNK_BYTES`` (`jaxroll.measure.attention_rows`),
  `CHUNK_BUFFERS` such buffers live at once (logits, softmax, a
  statistic's gathers), once per pass whatever B; where they read eager
  probabilities whole, `EAGER_COPIES` float64 ``(H, N, N)`` buffers, and
  ``fwd`` holds the eager forward's scores ``H N^2 (s + 4) + N^2 s``.
- ``held``: ``attention`` keeps each layer's ``(N, N)`` float64 sum of the
  batch, ``L N^2 8``, through the pass.
- ``sums``: the float64 sums (`jaxroll.measure.registry.stats_bytes`, the
  rows of ``--queries``); ``finish``: after the pass, ``attention``'s batch
  sums and their stacked copy beside the sums, ``2 L N^2 8``.

On a GPU the estimate is the device's share, ``W + pass`` (the sums stay in
RAM). `choose_batch_size` fits ``pass`` in a share (`SAFETY`) of the free
memory; ``jaxroll measure`` refuses a run whose growth ``peak - R`` exceeds
the free memory. benchmarks/memory.py prints the estimate beside the
measured peak RSS (docs/performance.md, "Memory estimate against measured
peak").
"""

from __future__ import annotations

import dataclasses

SAFETY = 0.5
"""The share of the free memory the batches may take (the rest: the machine's other users, the estimate's error)."""
MAX_BATCH = 64
"""At most this many sequences per pass: a checkpoint (and a progress update) at least every 64 sequences."""

BLOCK_ELEMENTS = {"cpu": (20, 7), "cuda": (8, 3)}
"""``(a, b)``: elements of width D and of width I one recomputed block holds per token, by device type."""
STAT_VECTORS = 4
"""Float64 ``(N, D)`` transients of the statistics per sequence (q, k, the running key sum, norms)."""
CHUNK_BUFFERS = 5
"""Chunks of recomputed rows ``(B, H, c, N)`` float64 live at once (logits, softmax, a statistic's gathers)."""
EAGER_COPIES = 3
"""Float64 ``(H, N, N)`` buffers a statistic makes of eager probabilities read whole (the copy, its gathers)."""
LATER_LIBRARIES = 56 * 2**20
"""Bytes that load after the decision: tokenizers, safetensors, matplotlib (measured: 56 MiB at N = 16)."""

_PROBABILITY_STATS = ("attention", "sinks", "attention_heads", "norm_kernels", "attention_offsets")


def free_bytes(device) -> int:
    """Free memory of `device`: ``torch.cuda.mem_get_info`` on CUDA; available RAM on the CPU.

    The CPU's is psutil's ``virtual_memory().available`` when psutil is
    installed, else ``MemAvailable`` from /proc/meminfo
    (`jaxroll.memory.available_bytes`).
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        from ..memory import available_bytes

        return available_bytes()


def sequence_bytes(*, layers: int, hidden: int, heads: int, intermediate: int, length: int, itemsize: int,
                   eager: bool, checkpointing: bool, stats=(), device: str = "cpu") -> int:
    """``seq``, the peak bytes one sequence adds to a pass (module docstring), for N = `length`.

    ``graph + scores + 4 N D 8``: checkpointed ``graph = L N D s + N (a D + b I) s``
    and the eager ``scores = H N^2 (3 s + 4) + N^2 s`` once; without
    checkpointing ``L`` blocks of both; without influence (no backward) one
    block of both. ``(a, b) = BLOCK_ELEMENTS[device type]``.
    """
    a, b = BLOCK_ELEMENTS["cpu" if str(device).startswith("cpu") else "cuda"]
    n = length
    block = n * (a * hidden + b * intermediate) * itemsize
    scores = (heads * n * n * (3 * itemsize + 4) + n * n * itemsize) if eager else 0
    if checkpointing:
        graph = layers * n * hidden * itemsize + block + scores
    elif "influence" in stats:
        graph = layers * (block + scores)
    else:  # no backward pass: one block's forward at a time
        graph = block + scores
    return int(graph + STAT_VECTORS * n * hidden * 8)


def chunk_bytes(*, heads: int, length: int, batch: int, stats=(), recompute: bool = True) -> int:
    """What the statistics reading probabilities hold beside the forward pass (module docstring); 0 without them.

    Rows recomputed from q, k (`recompute`): ``CHUNK_BUFFERS * 8 B H c N``
    with ``c = max(1, min(N, CHUNK_BYTES // (8 B H N)))``
    (`attention_rows.chunk_rows`). Eager probabilities read whole:
    ``EAGER_COPIES * 8 H N^2`` (a registered statistic's float64 copy of one
    row's ``(H, N, N)`` and its gathers), plus ``8 B H N^2`` for
    ``attention`` (the batch's float64 copy).
    """
    if not any(name in _PROBABILITY_STATS for name in stats):
        return 0
    if not recompute:
        copies = EAGER_COPIES * 8 * heads * length * length if any(
            name in _PROBABILITY_STATS and name != "attention" for name in stats) else 0
        return int(copies + (8 * batch * heads * length * length if "attention" in stats else 0))
    from .attention_rows import chunk_rows

    return int(CHUNK_BUFFERS * 8 * batch * heads * chunk_rows(batch, heads, length) * length)


def rows_recomputed(config, implementation: str, stats) -> bool:
    """Whether `measure` recomputes probability rows from q, k (`pass_setup.attention_mode`) under `implementation`."""
    import copy

    from ..errors import ConfigError
    from .layer_maps import layer_map_for
    from .pass_setup import attention_mode

    config = copy.copy(config)
    config._attn_implementation = implementation
    try:
        layer_map = layer_map_for(type("Unloaded", (), {"config": config})())
        return bool(attention_mode(config, layer_map, tuple(stats), "once").recompute)
    except ConfigError:
        return implementation != "eager"


def pass_bytes(*, layers: int, hidden: int, heads: int, length: int, batch: int, itemsize: int, per_sequence: int,
               checkpointing: bool, stats=(), eager: bool = False, recompute: bool = True) -> int:
    """``pass``: a batch's peak in its pass (module docstring), ``max(B seq, B fwd + chunks) + held``.

    ``fwd = L N D s + 4 N D 8`` per sequence in the checkpointed forward
    pass, plus eager attention's forward scores ``H N^2 (s + 4) + N^2 s``
    where probabilities are read whole (not `recompute`); ``seq`` =
    `per_sequence` in the backward pass; `chunk_bytes`; ``held = L N^2 8``
    with ``attention`` (each layer's ``(N, N)`` float64 sum of the batch).
    """
    n = length
    forward = layers * n * hidden * itemsize + STAT_VECTORS * n * hidden * 8 if checkpointing else per_sequence
    if eager and not recompute and checkpointing:
        forward += heads * n * n * (itemsize + 4) + n * n * itemsize
    chunks = chunk_bytes(heads=heads, length=n, batch=batch, stats=stats, recompute=recompute)
    held = layers * n * n * 8 if "attention" in stats else 0
    return int(max(batch * per_sequence, batch * forward + chunks) + held)


def model_sizes(config) -> dict:
    """``layers, hidden, heads, intermediate, vocab`` of a transformers config (long-standing field names)."""
    def first(*names, default=None):
        for name in names:
            value = getattr(config, name, None)
            if value is not None:
                return int(value)
        return default

    hidden = first("hidden_size", "n_embd", "d_model")
    return {"layers": first("num_hidden_layers", "n_layer", "n_layers"),
            "hidden": hidden,
            "heads": first("num_attention_heads", "n_head", "n_heads"),
            "intermediate": first("intermediate_size", "n_inner", "ffn_hidden_size", default=4 * hidden),
            "vocab": first("vocab_size", default=0)}


def choose_batch_size(model, length: int, stats, remaining: int, *, checkpointing: bool = True,
                      free: int | None = None) -> int:
    """Sequences per pass: the largest B whose `pass_bytes` fit ``SAFETY free``, in ``[1, min(remaining, MAX_BATCH)]``.

    The weights are loaded and the sums allocated, so `free` (default
    `free_bytes` of the model's device) already excludes them.
    """
    device = model.get_input_embeddings().weight.device
    sizes = model_sizes(model.config)
    itemsize = next(model.parameters()).element_size()
    eager = getattr(model.config, "_attn_implementation", "eager") == "eager"
    per = sequence_bytes(layers=sizes["layers"], hidden=sizes["hidden"], heads=sizes["heads"],
                         intermediate=sizes["intermediate"], length=length, itemsize=itemsize, eager=eager,
                         checkpointing=checkpointing and "influence" in stats, stats=stats, device=device.type)
    free = free_bytes(device) if free is None else free
    upper = max(1, min(remaining, MAX_BATCH))
    checkpointed = checkpointing and "influence" in stats
    recompute = rows_recomputed(model.config, "eager" if eager else "sdpa", stats)
    fits = largest_fitting(int(SAFETY * free), lambda batch: pass_bytes(
        layers=sizes["layers"], hidden=sizes["hidden"], heads=sizes["heads"], length=length, batch=batch,
        itemsize=itemsize, per_sequence=per, checkpointing=checkpointed, stats=stats, eager=eager,
        recompute=recompute), 1, upper=upper)
    return max(1, fits)


def weight_bytes(config, itemsize: int) -> int:
    """Bytes of the model's parameters, counted on the meta device (no memory, no weights read)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return int(sum(parameter.numel() for parameter in model.parameters())) * itemsize
    except Exception:  # noqa: BLE001 - an estimate from the sizes when the class cannot be built
        sizes = model_sizes(config)
        hidden, layers = sizes["hidden"], sizes["layers"]
        parameters = 2 * sizes["vocab"] * hidden + layers * (4 * hidden**2 + 3 * hidden * sizes["intermediate"])
        return int(parameters) * itemsize


def largest_fitting(limit: int, cost, start: int, upper: int = 1 << 24) -> int:
    """The largest ``x`` in ``[1, upper]`` with ``cost(x) <= limit`` (0 if none); `cost` non-decreasing."""
    low, high = 0, min(upper, max(1, start))
    while high < upper and cost(high) <= limit:
        low, high = high, min(upper, 2 * high)
    if cost(high) <= limit:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if cost(middle) <= limit:
            low = middle
        else:
            high = middle
    return low


@dataclasses.dataclass(frozen=True)
class PeakEstimate:
    """The terms of a `measure` process's estimated peak memory, in bytes (`measure_peak`, module docstring).

    ``total = resident + libraries + weights + sums + max(per_pass, finish)``;
    ``growth = total - resident`` is what must fit in the free memory.
    """

    resident: int      # R: the process's resident set when the estimate is taken (0 on a GPU)
    libraries: int     # Lib: what loads after it
    weights: int       # W
    batch: int         # B
    per_sequence: int  # seq, `sequence_bytes`
    per_pass: int      # pass, `pass_bytes` of the batch
    sums: int          # the float64 sums (0 on a GPU: they stay in RAM)
    finish: int        # after the pass: attention's batch sums and their stacked copy

    @property
    def total(self) -> int:
        return (self.resident + self.libraries + self.weights + self.sums
                + max(self.per_pass, self.finish))

    @property
    def growth(self) -> int:
        return self.total - self.resident


def measure_peak(config, *, stats, length: int, batch: int, samples: int, itemsize: int, eager: bool,
                 checkpointing: bool, positions: int = 1, queries: int = 0, device: str = "cpu",
                 resident: int | None = None, recompute: bool | None = None,
                 weights: int | None = None) -> PeakEstimate:
    """The estimated peak memory of a `measure` process at N = `length`, from `config` before loading.

    On the CPU, ``R + Lib + W + sums + max(pass, finish)`` (module
    docstring): `resident` (default `jaxroll.memory.resident_bytes` now),
    `LATER_LIBRARIES`, `weight_bytes`, the float64 sums
    (`registry.stats_bytes` of S = `samples` sequences, plus
    ``8 (S + 1) K N`` for K = `queries` rows), `sequence_bytes`,
    `pass_bytes`, and ``finish = 2 L N^2 8`` with ``attention``. On a GPU the
    device's share: ``W + pass``. `recompute`: whether probability rows are
    recomputed from q, k (`rows_recomputed`; default: unless `eager`);
    `weights`: the weights' bytes when known (default `weight_bytes`).
    """
    from .registry import Shapes, stats_bytes

    sizes = model_sizes(config)
    stats = tuple(stats)
    per = sequence_bytes(layers=sizes["layers"], hidden=sizes["hidden"], heads=sizes["heads"],
                         intermediate=sizes["intermediate"], length=length, itemsize=itemsize, eager=eager,
                         checkpointing=checkpointing and "influence" in stats, stats=stats, device=device)
    per_pass = pass_bytes(layers=sizes["layers"], hidden=sizes["hidden"], heads=sizes["heads"], length=length,
                          batch=batch, itemsize=itemsize, per_sequence=per,
                          checkpointing=checkpointing and "influence" in stats, stats=stats, eager=eager,
                          recompute=not eager if recompute is None else recompute)
    weights = weight_bytes(config, itemsize) if weights is None else weights
    if not str(device).startswith("cpu"):
        return PeakEstimate(0, 0, weights, batch, per, per_pass, 0, 0)
    from ..memory import resident_bytes

    sums = stats_bytes(stats, Shapes(samples, sizes["layers"], sizes["heads"], length), positions)
    sums += 8 * (samples + 1) * queries * length
    finish = 2 * sizes["layers"] * length * length * 8 if "attention" in stats else 0
    resident = resident_bytes() if resident is None else resident
    return PeakEstimate(resident, LATER_LIBRARIES, weights, batch, per, per_pass, sums, finish)
