"""Forward hooks that hand a measurement the tensors it reads, per layer.

`Hooks` registers, on the modules a `LayerMap` names:

- a forward pre-hook (with kwargs) on each block: ``x``, the residual stream
  entering the block, ``(B, N, D)``;
- a forward hook on each attention output projection: ``a``, the attention
  sub-layer output after the projection and its bias, before dropout and
  the residual add, ``(B, N, D)``;
- a forward hook on the query/key projection(s): ``q, k``, ``(B, N, H, d)``,
  after the input LayerNorm and the projection bias, before any position
  bias, mask, scale or softmax;
- a forward hook on each attention module: its probabilities
  ``(B, H, N, N)`` when the implementation returns them (eager).

Callbacks receive detached tensors and run only while `recording` is true,
so that activation checkpointing, which runs each block's forward again
during the backward pass, does not count a sequence twice.

Falcon with ALiBi: its eager attention adds the bias twice (once in the
attention mask, which already holds ``m j / sqrt(d)``, and once more to
``q.k`` before the scale), its SDPA path once. For the intended formula on an
eager model, a pre-hook passes a zero ``alibi`` to the attention, leaving
the single bias in the mask. Nothing else in the model is changed.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError
from .precision import checkpoint_contexts

__all__ = ["Hooks", "forward_then_remove"]


def forward_then_remove(model, ids, handles) -> None:
    """The model's forward pass on token ids ``(S, N)`` without gradients (no cache), its hooks' `handles`
    removed afterwards whatever happens."""
    try:
        with torch.no_grad():
            device = model.get_input_embeddings().weight.device
            model(input_ids=torch.as_tensor(ids, dtype=torch.long, device=device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()


class Hooks:
    """Context manager: register the measurement hooks, remove them on exit.

    Args:
        resolved: the model's modules (`layer_maps.resolve`).
        config: the model's config (the q/k split reads it).
        on_block_input: ``(layer, x)``.
        on_attention_output: ``(layer, a)``.
        on_query_key: ``(layer, q, k)``.
        on_probabilities: ``(layer, p)``.
        zero_falcon_alibi: pass ``alibi = 0`` to each attention (see above).
        checkpointing: run each block under ``torch.utils.checkpoint`` (non
            reentrant) while gradients are on, so that the backward pass holds
            one block's activations at a time instead of all of them.
    """

    def __init__(self, resolved, config, *, on_block_input=None, on_attention_output=None, on_query_key=None,
                 on_probabilities=None, zero_falcon_alibi: bool = False, checkpointing: bool = False):
        self.resolved = resolved
        self.config = config
        self.on_block_input = on_block_input
        self.on_attention_output = on_attention_output
        self.on_query_key = on_query_key
        self.on_probabilities = on_probabilities
        self.zero_falcon_alibi = zero_falcon_alibi
        self.checkpointing = checkpointing
        self.recording = True
        self._handles = []
        self._patched = []
        self._pending = {}

    def __enter__(self) -> "Hooks":
        resolved = self.resolved
        try:
            for layer, block in enumerate(resolved.blocks):
                if self.on_block_input is not None:
                    self._handles.append(block.register_forward_pre_hook(self._block_input(layer), with_kwargs=True))
                if self.on_attention_output is not None:
                    self._handles.append(
                        resolved.output_projections[layer].register_forward_hook(self._attention_output(layer)))
                if self.on_query_key is not None:
                    modules = resolved.query_keys[layer]
                    for index, module in enumerate(modules):
                        self._handles.append(module.register_forward_hook(self._query_key(layer, index, len(modules))))
                attention = resolved.attentions[layer]
                if self.on_probabilities is not None:
                    self._handles.append(attention.register_forward_hook(self._probabilities(layer)))
                if self.zero_falcon_alibi:
                    self._handles.append(attention.register_forward_pre_hook(_zero_alibi, with_kwargs=True))
                if self.checkpointing:
                    self._patch(block)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for block, previous in self._patched:
            # The wrapper lives in the instance's __dict__; deleting it
            # restores the class's forward, unless an instance forward was
            # there before (accelerate's device-map dispatch puts one there).
            if previous is None:
                del block.forward
            else:
                block.forward = previous
        self._patched.clear()
        self._pending.clear()

    def _patch(self, block) -> None:
        original = block.forward
        previous = block.__dict__.get("forward")

        def forward(*args, **kwargs):
            if not torch.is_grad_enabled():
                return original(*args, **kwargs)
            return checkpoint(original, *args, use_reentrant=False, context_fn=checkpoint_contexts, **kwargs)

        # An instance attribute, signature-agnostic: the block's own class
        # (and its attention class) stay untouched.
        block.forward = forward
        self._patched.append((block, previous))

    def _block_input(self, layer):
        def hook(module, args, kwargs):
            if self.recording:
                x = args[0] if args else kwargs.get("hidden_states")
                if x is None:
                    raise ConfigError(f"layer map {self.resolved.layer_map.name!r}: block {layer} got no hidden_states")
                self.on_block_input(layer, x.detach())
            return None
        return hook

    def _attention_output(self, layer):
        def hook(module, args, output):
            if self.recording:
                self.on_attention_output(layer, output.detach())
        return hook

    def _query_key(self, layer, index, count):
        resolved = self.resolved

        def hook(module, args, output):
            if not self.recording:
                return
            # Separate q_proj and k_proj report one after the other.
            outputs = self._pending.setdefault(layer, [None] * count)
            outputs[index] = output.detach()
            if all(item is not None for item in outputs):
                del self._pending[layer]
                parts = outputs[0] if count == 1 else tuple(outputs)
                q, k = resolved.layer_map.split(parts, resolved.num_heads, resolved.head_dim, self.config)
                self.on_query_key(layer, q, k)
        return hook

    def _probabilities(self, layer):
        def hook(module, args, output):
            if not self.recording:
                return
            probabilities = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if probabilities is None:
                raise ConfigError(
                    "stats: 'attention' needs the attention probabilities; allowed: a model loaded with "
                    "attn_implementation='eager'"
                )
            self.on_probabilities(layer, probabilities.detach())
        return hook


def _zero_alibi(module, args, kwargs):
    alibi = kwargs.get("alibi")
    if alibi is None:
        raise ConfigError("falcon_alibi: the attention got no alibi keyword; allowed: a Falcon model with alibi=True")
    kwargs["alibi"] = torch.zeros_like(alibi)
    return args, kwargs
