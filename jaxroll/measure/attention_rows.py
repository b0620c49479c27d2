"""Attention rows recomputed in chunks from the hooked queries and keys: no eager (N, N) per head.

For a batch of B sequences of N tokens, H heads of dimension d, with the
hooked ``q, k (B, N, H, d)`` (after the projection; rotary families rotated
here with the model's own ``cos, sin``), the family's exact logit (the
`LayerMap`'s formula)

    z_h(i, j) = s q_i . k_j + b_h(j)        (j <= i, and i - j < W with a sliding window W)

with ``s`` the logit scale and ``b_h(j)`` the per-key ALiBi bias in logit
units (BLOOM, MPT: the model's bias; Falcon: ``c m_h j s`` with c = 1, its
intended formula, or 2, its eager path; 0 for learned and rotary
positions), and the probabilities ``A_h(i, j) = softmax_j z_h(i, j)``,
computed for the rows ``start <= i < stop`` only, in float64 (a model in
float32 or half precision: its logits, their exponentials and their row
sums in float32, as its own softmax takes them, the quotients written in
float64; `work_dtype`):
``(B, H, stop - start, N)``, so ``O(chunk N)`` memory per head. Under an
intervention the logit is first mapped as the patched model maps it,
``z' = a s q_i . k_j + c b_h(j) + d(i, j)`` (`jaxroll.measure.patching`),
with q and k rotated at ``p / r_h`` under a rotary rescale (`rerotate`).
`chunk_rows` picks the chunk from a byte budget; `row_chunks` walks all N
rows. Rotary: ``R q = q cos + rotate_half(q) sin`` (`rotate`), the
convention of Hugging Face's ``apply_rotary_pos_emb``, with ``(cos, sin)``
captured from the module the layer map's ``rotary`` names (`RotaryCapture`).

Partial rotary (GPT-NeoX's ``rotary_pct``): the captured ``cos, sin`` are
``(B, N, r)`` with r < d, and only the first r dimensions of q and k turn.

Where the rows are recomputed (`recomputable`): on every attention
implementation, eager included, for the families whose logit the layer map
states exactly, ALiBi through `key_bias` (BLOOM, MPT, Falcon with
``alibi=True``), learned positions (GPT-2, OPT: the logit is ``s q . k``)
and rotary families whose map names the ``rotary`` module (Llama, Mistral,
Qwen2, GPT-NeoX). The hooked eager probabilities ``(B, H, N, N)`` are read
(copied to float64) only where the recomputation is not the model's own
attention: rotary families without a named ``rotary`` module (GPT-J's
interleaved rotation, Qwen3 and Gemma's QK-norms and soft-capping, Phi-3,
StableLM, StarCoder2, Mixtral, OLMo 2, Falcon without ALiBi), and
registered statistics that read probabilities without ``observe_rows``.
Nothing here reproduces attention dropout (measurements run in eval mode),
soft-capping or per-layer scale changes (GPT-2's
``scale_attn_by_inverse_layer_idx`` is refused by its layer map).

Working memory: one chunk of c rows is ``8 B H c N`` bytes, at most
`CHUNK_BYTES` (`CHUNK_BYTES_CUDA` on a GPU, where fewer, larger chunks keep
the kernels busy); only the keys the chunk's rows can see are scored (keys
before ``stop``, and within the window), in place in one buffer, so a chunk
costs two such buffers (the scored keys and the ``(B, H, c, N)`` rows, both
reused from chunk to chunk) plus what each statistic's sums gather from
the rows.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .layer_maps import Resolved

__all__ = ["probability_rows", "row_chunks", "chunk_rows", "key_bias", "rotate", "turn", "RotaryCapture",
           "rotary_module", "sliding_window", "recomputable", "work_dtype", "CHUNK_BYTES", "CHUNK_BYTES_CUDA"]

CHUNK_BYTES = 16 * 2**20
"""Float64 bytes of one chunk of rows ``(B, H, chunk, N)`` on the CPU (about two such buffers are live at once).

16 MiB: at N = 32768 with 4 heads a chunk is 16 rows, and the statistics'
working set (about 40 MiB) stays small beside the model's own pass
(benchmarks/measure.py, docs/performance.md "Long context by default")."""
CHUNK_BYTES_CUDA = 256 * 2**20
"""The same on a CUDA device: fewer, larger chunks (each chunk is a handful of kernel launches)."""


def chunk_rows(batch: int, heads: int, length: int, budget: int | None = None, device=None) -> int:
    """Rows per chunk: ``max(1, budget // (8 B H N))``, at most N.

    `budget` defaults to `CHUNK_BYTES` (`CHUNK_BYTES_CUDA` when `device`
    is a CUDA device), read when called.
    """
    if budget is None:
        budget = CHUNK_BYTES_CUDA if getattr(device, "type", None) == "cuda" else CHUNK_BYTES
    return int(max(1, min(length, budget // (8 * batch * heads * length))))


def recomputable(layer_map) -> bool:
    """Whether `layer_map` states its logit exactly, so that rows from q and k are the model's own.

    ALiBi families with a `key_bias`, learned positions, and rotary families
    whose map names the ``rotary`` module (module docstring); False for the
    other rotary families, whose statistics read the eager probabilities.
    """
    if layer_map.position == "alibi":
        return layer_map.key_bias is not None
    if layer_map.position == "learned":
        return True
    return layer_map.rotary is not None


def key_bias(model, resolved: Resolved, length: int, falcon_alibi: str = "once") -> torch.Tensor | None:
    """``b_h(j)`` ``(H, N)`` float64 in logit units (module docstring), or None without ALiBi.

    Built by the model's own builder in its dtype (as the model adds it),
    then widened to float64.
    """
    layer_map = resolved.layer_map
    if layer_map.key_bias is None:
        return None
    dtype = next(model.parameters()).dtype
    bias = layer_map.key_bias(model, resolved.num_heads, length, dtype).double()
    if layer_map.name == "falcon":
        multiplier = {"once": 1.0, "doubled": 2.0}[falcon_alibi]
        bias = bias * multiplier * float(layer_map.logit_scale(model.config, resolved.head_dim))
    return bias


def sliding_window(config, layer_map_name: str) -> int | None:
    """The attention window W of Mistral (``sliding_window``) and Qwen2 (with ``use_sliding_window``), else None."""
    window = getattr(config, "sliding_window", None)
    if layer_map_name == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return int(window) if window and layer_map_name in ("mistral", "qwen2") else None


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` on the first ``r`` dimensions of ``x``'s last axis, ``cos, sin`` already
    broadcastable to ``x[..., :r]`` and in its dtype.

    ``r = d``: the whole head turns; ``r < d`` (partial rotary, GPT-NeoX's
    ``rotary_pct``): the first r dimensions turn and the other ``d - r``
    pass unchanged, as Hugging Face's ``apply_rotary_pos_emb`` does.
    """
    width = cos.shape[-1]
    turning, half = x[..., :width], width // 2
    turned = torch.cat((-turning[..., half:], turning[..., :half]), dim=-1)
    rotated = turning * cos + turned * sin
    return rotated if width == x.shape[-1] else torch.cat((rotated, x[..., width:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`turn` for ``x (B, N, H, d)`` and ``cos, sin (B, N, r)`` (broadcast over the heads), in float64."""
    return turn(x.double(), cos.double()[:, :, None, :], sin.double()[:, :, None, :])


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision of the logits and their exponentials: float64 for a float64 model, else float32.

    A float32 (or half-precision) model's own attention forms its logits and
    softmax in float32 at best; the rows are then written, and every
    statistic summed, in float64. Half the time and memory of float64 for
    the two costly steps (the ``q k^T`` product and ``exp``) on a CPU.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def probability_rows(q: torch.Tensor, k: torch.Tensor, *, scale: float, bias: torch.Tensor | None = None,
                     start: int = 0, stop: int | None = None, window: int | None = None,
                     change=None, precision: torch.dtype | None = None) -> torch.Tensor:
    """``A_h(i, :)`` for ``start <= i < stop``: ``(B, H, stop - start, N)`` float64 (module docstring).

    `q`, `k` ``(B, N, H, d)`` (rotary families: already rotated). `change`,
    an intervention's logit map of this layer (``LogitChange.logits`` with
    the layer bound, `jaxroll.measure.patching`), takes the content
    logits ``s q . k``, the bias, the positions and the keys each row sees,
    and gives ``a s q . k + c b + d``: the rows of the intervened model.
    `precision`: the model's dtype (default q's), whose `work_dtype` the
    logits take (rotary callers pass it: their rotated q is float64).
    """
    work = work_dtype(precision or q.dtype)
    queries, keys = _heads_first(q, work), _heads_first(k, work)
    return _rows(queries, keys, scale=scale, bias=bias, start=start, stop=keys.shape[2] if stop is None else stop,
                 window=window, change=change)


def _heads_first(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # (B, N, H, d) -> (B, H, N, d) in the working dtype, contiguous: converted once per layer, read by every chunk.
    return x.to(dtype).transpose(1, 2).contiguous()


def _rows(queries, keys, *, scale, bias, start, stop, window, change, buffers=None):
    """`probability_rows` on ``(B, H, N, d)`` queries and keys in the working dtype; float64 rows.

    Only the keys a row of the chunk can see are scored: ``lo <= j < stop``
    with ``lo = max(0, start - W + 1)`` under a window W, else 0 (half the
    work of all N keys, on average, for causal rows); the logits are scaled,
    biased, masked (causal rows: only the chunk's own triangle) and
    exponentiated in place in one buffer, and normalised into the
    ``(B, H, c, N)`` float64 rows, zero elsewhere. `buffers` ``(scores,
    rows)``, flat tensors (working dtype, float64 zeros) of at least
    ``B H c N`` elements, are written instead of fresh ones (`row_chunks`
    reuses them from chunk to chunk, in order: fresh pages cost more than
    the arithmetic on a CPU, and the rows past a chunk's last row stay zero).
    """
    batch, heads, n, _ = keys.shape
    count = stop - start
    low = 0 if window is None else max(0, start - window + 1)
    left, right = queries[:, :, start:stop], keys[:, :, low:stop].transpose(-1, -2)
    if buffers is None:
        logits = torch.matmul(left, right)  # (B, H, c, stop - low)
        out = logits.new_empty((batch, heads, count, n), dtype=torch.float64)
    else:
        logits = buffers[0][:batch * heads * count * (stop - low)].view(batch, heads, count, stop - low)
        torch.bmm(left.reshape(batch * heads, count, -1), right.reshape(batch * heads, -1, stop - low),
                  out=logits.view(batch * heads, count, stop - low))
        out = buffers[1][:batch * heads * count * n].view(batch, heads, count, n)
    logits.mul_(scale)
    bias = None if bias is None else bias[:, low:stop].to(device=logits.device, dtype=logits.dtype)[None, :, None, :]
    rows = torch.arange(start, stop, device=logits.device)
    # Causal rows miss only keys of the chunk's own triangle (j > i >= start); a window also hides keys on the left.
    edge = start if window is None else low
    i, j = rows[:, None], torch.arange(edge, stop, device=logits.device)[None, :]
    hidden = j > i
    if window is not None:
        hidden = hidden | (i - j >= window)
    if change is not None:
        counts = (rows + 1 if window is None else (rows + 1).clamp(max=window))[None, None, :, None]  # n_i
        logits = change(logits, bias, rows, torch.arange(low, stop, device=logits.device), counts)
    elif bias is not None:
        logits.add_(bias)
    # softmax: exp(z - max) / sum; the diagonal is always visible, so no row is all -inf.
    logits[..., edge - low:].masked_fill_(hidden, float("-inf"))
    logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    out[..., :low].zero_()  # keys before a window (reused rows: earlier chunks wrote there)
    if buffers is None:
        out[..., stop:].zero_()  # reused rows start zero and no earlier chunk reaches past this one's stop
    # The row sums in the working dtype (float32 rows then sum to 1 within ~1e-7, as the model's own softmax);
    # the quotients written in float64.
    torch.div(logits, logits.sum(dim=-1, keepdim=True), out=out[..., low:stop])
    return out


def row_chunks(q, k, *, scale, bias=None, window=None, chunk=None, change=None, reuse: bool = False,
               precision: torch.dtype | None = None, rotary=None, buffers: dict | None = None):
    """Yield ``(start, rows)`` over all N rows, ``rows = probability_rows(q, k, start, start + chunk)``.

    `chunk` rows at a time (default `chunk_rows` of the batch, the heads and
    N on q's device); q and k are converted to the `work_dtype` of
    `precision` (default q's dtype) once, not per chunk. `rotary`, ``(cos,
    sin)`` ``(B, N, r)``: q and k (unrotated) are turned here, in the working
    dtype and heads-first (as `rotate`, the model's own rotation in its
    precision). With `reuse` the chunks share two buffers, so each ``rows``
    is valid only until the next one is yielded (the measuring pass, whose
    statistics sum each chunk before the next, reads them so); `buffers`, a
    dict the caller keeps, holds them from call to call (fresh pages are
    costly on a CPU).
    """
    batch, n, heads, _ = q.shape
    chunk = chunk or chunk_rows(batch, heads, n, device=q.device)
    work = work_dtype(precision or q.dtype)
    queries, keys = _heads_first(q, work), _heads_first(k, work)
    if rotary is not None:
        queries, keys = (_turn(x, *rotary) for x in (queries, keys))
    scratch = None
    if reuse:
        size = batch * heads * min(chunk, n) * n
        scratch = (buffers if buffers is not None else {}).get((size, work, queries.device))
        if scratch is None:
            scratch = (queries.new_empty(size), queries.new_zeros(size, dtype=torch.float64))
            if buffers is not None:
                buffers.clear()  # one pair at a time: the last shape's
                buffers[(size, work, queries.device)] = scratch
        else:
            scratch[1].zero_()
    for start in range(0, n, chunk):
        yield start, _rows(queries, keys, scale=scale, bias=bias, start=start, stop=min(n, start + chunk),
                           window=window, change=change, buffers=scratch)


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`turn` on heads-first ``x (B, H, N, d)`` in x's dtype: ``cos, sin (B, N, r)`` broadcast over the heads."""
    return turn(x, cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None])


def rotary_module(model, resolved: Resolved):
    """The module the layer map's ``rotary`` names (its ``inv_freq`` and ``(cos, sin)``); one line if none."""
    path = resolved.layer_map.rotary
    if path is None:
        raise ConfigError(f"layer map {resolved.layer_map.name!r}: no rotary module; allowed: a rotary "
                          "family whose map names it (rotary=...)")
    module = model
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            raise ConfigError(f"layer map {resolved.layer_map.name!r}: rotary {path!r} not found")
    return module


class RotaryCapture:
    """Context manager: a forward hook on the layer map's ``rotary`` module keeps its latest ``(cos, sin)``.

    Every layer of the Llama-style families reads the same ``(cos, sin)``
    (computed once per forward from the position ids), so the latest output
    rotates every layer's q and k of that forward.
    """

    def __init__(self, model, resolved: Resolved):
        self.module = rotary_module(model, resolved)
        self.cos = self.sin = None
        self._handle = None

    def __enter__(self) -> "RotaryCapture":
        def hook(module, args, output):
            self.cos, self.sin = (tensor.detach() for tensor in output[:2])
        self._handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
