"""How many sequences one forward and backward pass of `measure` takes: sized from free memory.

The working set of one sequence of N tokens through an L-block model of
hidden size D, head count H and MLP width I, in the model's dtype (``s``
bytes per element), is estimated as

- with activation checkpointing (the influence pass's default): the block
  inputs autograd keeps, ``L N D s``, plus one block recomputed with its
  graph, ``N (8 D + 3 I) s``;
- without it: every block's graph, ``L N (8 D + 3 I) s``;
- the attention: eager builds scores and probabilities ``(H, N, N)``, a
  float32 softmax and, in the backward pass, their gradients,
  ``H N^2 (3 s + 8)``, per block held (no checkpointing) or once
  (checkpointing); an efficient implementation (``sdpa``) holds ``O(N)`` per
  head, counted in the block term. (Measured on one H200, run gpu-1 of
  docs/performance.md: BLOOM 24 x 1024, 16 heads, float32, N = 16,384, one
  sequence peaked at 68.4 GiB, about 17 bytes per score element; the
  earlier ``2 s + 4`` counted 12 and chose a bfloat16 batch of 2 that ran
  out of memory.)
- the statistics' float64 transients: ``4 N max(D, H d) 8`` (q, k, the
  running key sum, norms) and, for statistics that read probabilities,
  ``H N^2 8`` (a float64 copy), plus ``L N^2 8`` for ``attention`` (each
  layer's sum, held on the device until the batch ends).

`choose_batch_size` divides a share (`SAFETY`) of the free memory by this
estimate. The estimate is deliberately simple; `benchmarks/gpu.py` and
`benchmarks/measure.py` print measured peaks beside it.
"""

from __future__ import annotations

SAFETY = 0.5
"""The share of the free memory the batches may take (the rest: allocator slack, the logits, fragmentation)."""
MAX_BATCH = 64
"""At most this many sequences per pass: a checkpoint (and a progress update) at least every 64 sequences."""

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
                   eager: bool, checkpointing: bool, stats=()) -> int:
    """Estimated peak bytes one sequence adds to a pass (module docstring), for N = `length`."""
    n = length
    block = n * (8 * hidden + 3 * intermediate) * itemsize
    scores = heads * n * n * (3 * itemsize + 8) if eager else 0
    if checkpointing:
        graph = layers * n * hidden * itemsize + block + scores
    else:
        graph = layers * (block + scores)
    transient = 4 * n * hidden * 8
    if any(name in _PROBABILITY_STATS for name in stats):
        transient += heads * n * n * 8
    if "attention" in stats:  # the (N, N) float64 sum of every layer, on the device until the batch ends
        transient += layers * n * n * 8
    return int(graph + transient)


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
    """Sequences per pass: ``floor(SAFETY * free / sequence_bytes)``, within ``[1, min(remaining, MAX_BATCH)]``."""
    device = model.get_input_embeddings().weight.device
    sizes = model_sizes(model.config)
    itemsize = next(model.parameters()).element_size()
    eager = getattr(model.config, "_attn_implementation", "eager") == "eager"
    per = sequence_bytes(layers=sizes["layers"], hidden=sizes["hidden"], heads=sizes["heads"],
                         intermediate=sizes["intermediate"], length=length, itemsize=itemsize, eager=eager,
                         checkpointing=checkpointing and "influence" in stats, stats=stats)
    free = free_bytes(device) if free is None else free
    # The weights are loaded: the free memory already excludes them.
    fits = int(SAFETY * free // max(per, 1))
    return max(1, min(fits, remaining, MAX_BATCH))


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
        return int(2 * sizes["vocab"] * hidden + layers * (4 * hidden**2 + 3 * hidden * sizes["intermediate"])) * itemsize


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
