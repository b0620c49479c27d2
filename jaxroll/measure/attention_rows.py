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
computed in float64 for the rows ``start <= i < stop`` only:
``(B, H, stop - start, N)``, so ``O(chunk N)`` memory per head. Under an
intervention the logit is first mapped as the patched model maps it,
``z' = a s q_i . k_j + c b_h(j) + d(i, j)`` (`jaxroll.measure.patching`),
with q and k rotated at ``p / r_h`` under a rotary rescale (`rerotate`).
`chunk_rows` picks the chunk from a byte budget; `row_chunks` walks all N
rows. Rotary: ``R q = q cos + rotate_half(q) sin`` (`rotate`), the
convention of Hugging Face's ``apply_rotary_pos_emb``, with ``(cos, sin)``
captured from the module the layer map's ``rotary`` names (`RotaryCapture`).

The eager path stays where the recomputation is not the model's own
attention: nothing here reproduces attention dropout, soft-capping or
per-layer scale changes (GPT-2's ``scale_attn_by_inverse_layer_idx`` is
refused by its layer map).
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .layer_maps import Resolved

__all__ = ["probability_rows", "row_chunks", "chunk_rows", "key_bias", "rotate", "RotaryCapture",
           "rotary_module", "sliding_window"]

CHUNK_BYTES = 64 * 2**20
"""Float64 bytes of one chunk of rows ``(B, H, chunk, N)`` (a few such buffers are live at once)."""


def chunk_rows(batch: int, heads: int, length: int, budget: int = CHUNK_BYTES) -> int:
    """Rows per chunk: ``max(1, budget // (8 B H N))``, at most N."""
    return int(max(1, min(length, budget // (8 * batch * heads * length))))


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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` for ``x (B, N, H, d)`` and ``cos, sin (B, N, d)``, in float64."""
    x = x.double()
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.double()[:, :, None, :] + turned * sin.double()[:, :, None, :]


def probability_rows(q: torch.Tensor, k: torch.Tensor, *, scale: float, bias: torch.Tensor | None = None,
                     start: int = 0, stop: int | None = None, window: int | None = None,
                     change=None) -> torch.Tensor:
    """``A_h(i, :)`` for ``start <= i < stop``: ``(B, H, stop - start, N)`` float64 (module docstring).

    `q`, `k` ``(B, N, H, d)`` (rotary families: already rotated). `change`,
    an intervention's logit map of this layer (``LogitChange.logits`` with
    the layer bound, `jaxroll.measure.patching`), takes the content
    logits ``s q . k``, the bias, the positions and the keys each row sees,
    and gives ``a s q . k + c b + d``: the rows of the intervened model.
    """
    n = k.shape[1]
    stop = n if stop is None else stop
    queries = q[:, start:stop].double().transpose(1, 2)  # (B, H, c, d)
    keys = k.double().transpose(1, 2)  # (B, H, N, d)
    logits = scale * (queries @ keys.transpose(-1, -2))
    bias = None if bias is None else bias.to(logits.device)[None, :, None, :]
    rows = torch.arange(start, stop, device=logits.device)
    columns = torch.arange(n, device=logits.device)
    i, j = rows[:, None], columns[None, :]
    hidden = j > i
    if window is not None:
        hidden = hidden | (i - j >= window)
    if change is not None:
        counts = (~hidden).sum(-1)[None, None, :, None]  # n_i, the keys row i sees
        logits = change(logits, bias, rows, columns, counts)
    elif bias is not None:
        logits = logits + bias
    return torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)


def row_chunks(q, k, *, scale, bias=None, window=None, chunk=None, change=None):
    """Yield ``(start, rows)`` over all N rows, ``rows = probability_rows(q, k, start, start + chunk)``."""
    batch, n, heads, _ = q.shape
    chunk = chunk or chunk_rows(batch, heads, n)
    for start in range(0, n, chunk):
        yield start, probability_rows(q, k, scale=scale, bias=bias, start=start, stop=min(n, start + chunk),
                                      window=window, change=change)


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
