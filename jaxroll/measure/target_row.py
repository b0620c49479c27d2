"""The last block's attention at the target row only, for a gradient read at one position.

`jaxroll.measure.influence_gradients` differentiates ``f``, a function of
the logits at one position p alone. After the last block every operation is
per position (final norm, output head), so of the last block's outputs only
row p reaches f, and of its attention only query row p: every block before
it feeds its keys and values at all positions, the last one's queries at
rows other than p feed nothing. Its attention is then

    out_p = softmax(s q_p K_{<=p}^T + mask_p) V_{<=p}        (1, H, 1, d) instead of (1, H, N, d),

O(N) work and memory instead of O(N^2) for that one layer, in the forward
and in the backward pass, and the same numbers for row p (the same kernel
on the same row, up to its floating-point summation order). Rows other
than p get a zero attention output: what the rest of the last block
computes from them is never read. On an L-layer model this removes 1/L of
the attention work (half on the two-layer models of benchmarks/peers.py).

It acts through transformers' attention interface (the ``"sdpa"`` entry of
``ALL_ATTENTION_FUNCTIONS``, as `jaxroll.measure.patching` does), for the
one attention module given and a query of the whole sequence only; any
other call, a model on another attention implementation, or a mask or bias
of a shape it does not know, falls through to the full computation. The
single query is the last of its p + 1 keys, the shape of a decoding step
with a cache, which every attention wrapper already handles.
"""

from __future__ import annotations

import contextlib

from .patching import interface_entry

__all__ = ["last_block_at_row"]

KEY = "sdpa"


def _sliced_mask(mask, row: int, n: int):
    """The mask's row `row` over keys ``<= row`` ``(B|1, 1|H, 1, row + 1)``; `False` for a shape it does not know."""
    if mask is None:
        return None
    if getattr(mask, "ndim", 0) != 4 or mask.shape[-2] != n or mask.shape[-1] != n:
        return False
    return mask[..., row:row + 1, :row + 1]


def _row_wrapper(previous, attention, row: int, n: int):
    import torch

    def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
        mask = _sliced_mask(attention_mask, row, n)
        if (module is not attention or args or query.shape[2] != n or key.shape[2] != n or mask is False
                or kwargs.get("position_bias") is not None):
            return previous(module, query, key, value, attention_mask, *args, **kwargs)
        out, weights = previous(module, query[:, :, row:row + 1], key[:, :, :row + 1], value[:, :, :row + 1],
                                mask, **kwargs)
        # (B, 1, H, d) -> (B, n, H, d): zero rows around row `row`, whose later values nothing reads.
        return torch.nn.functional.pad(out, (0, 0, 0, 0, row, n - 1 - row)), weights

    return wrapper


@contextlib.contextmanager
def last_block_at_row(model, attention, position: int, n: int):
    """While inside, `attention` (a module of `model`) computes only query row ``p = position % n`` (module docstring).

    Its sdpa call on q, k, v ``(B, H, n, d)`` becomes one on ``q[:, :, p]``
    against ``k, v[:, :, :p + 1]`` (and the mask's row p), whose output
    ``(B, 1, H, d)`` is padded with zero rows to ``(B, n, H, d)``: row p is
    ``softmax(s q_p K_{<=p}^T + mask_p) V_{<=p}``, the others 0. For a model on sdpa attention; on any other implementation, or without
    transformers' attention interface, it does nothing. The interface entry
    is restored on exit, also after an error.
    """
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # a transformers without the interface: nothing to narrow
        ALL_ATTENTION_FUNCTIONS = None
    if implementation != KEY or ALL_ATTENTION_FUNCTIONS is None or KEY not in ALL_ATTENTION_FUNCTIONS:
        yield
        return
    with interface_entry(KEY, lambda previous: _row_wrapper(previous, attention, position % n, n)):
        yield
