"""A float64 model computed in float64 end to end (``--dtype float64``).

transformers keeps some of a model's arithmetic in float32 whatever the
dtype of its weights, on purpose for half precision, which leaves a
float64 model with float32 rounding (about 1e-8 relative) in the middle:

- the RMSNorm of the Llama-style families (``hidden_states.to(torch.float32)``;
  Gemma's ``x.float()``), applied to every block input, to the final norm and
  to QK-norm;
- the rotary tables: ``inv_freq`` is built at initialisation as a float32
  buffer (``torch.arange(..., dtype=torch.float)``; casting the model to
  float64 keeps its float32-rounded values), and the rotary module's forward
  computes ``position * inv_freq`` and its cos/sin in float32
  (``.float()``, ``dtype=torch.float``) before casting them to the model's dtype;
- the eager attention softmax (``softmax(..., dtype=torch.float32)``) and
  GPT-J's eager ``q, k`` upcast; GPT-J's sinusoidal table (a float32 buffer).

`full_precision(model)` removes all of them for the duration of a pass,
for a model whose parameters are float64, and does nothing otherwise:

- `Float64Mode`, a ``TorchFunctionMode``, turns every request for float32
  inside the model's code into float64 (a ``torch.float32`` argument,
  ``Tensor.float()``) and makes float64 the default dtype;
- every non-persistent float buffer that a module derives from its config
  (the rotary ``*inv_freq`` buffers, GPT-J's ``embed_positions``) is computed
  again in float64 by building a fresh module of the same class from the
  same config under that mode; the model's own buffers come back on exit.

The backward pass replays the operations the forward recorded (all float64);
activation checkpointing's recompute of each block enters the mode again
(`checkpoint_contexts`, the ``context_fn`` of `jaxroll.measure.hooks`). ``tests/test_measure_float64.py`` checks
that no operation of a measured pass on any family produces a float32
tensor, and compares Mistral, Qwen2, Llama and GPT-2 with a float64
forward and autograd written in the test.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["Float64Mode", "full_precision", "rebuild_float64_buffers", "checkpoint_contexts", "frozen_eval"]


def _widen(value):
    if value is torch.float32:
        return torch.float64
    if isinstance(value, (list, tuple)):
        return type(value)(_widen(item) for item in value)
    return value


class Float64Mode(TorchFunctionMode):
    """Inside it, torch functions asked for float32 compute in float64 (module docstring)."""

    depth = 0  # modes entered and not left (one thread: the measuring loop)

    @classmethod
    def active(cls) -> bool:
        """Whether a `Float64Mode` is entered."""
        return cls.depth > 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(_widen(arg) for arg in args)
        kwargs = {key: _widen(value) for key, value in kwargs.items()}
        return func(*args, **kwargs)

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        type(self).depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        type(self).depth -= 1
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)


def checkpoint_contexts():
    """``context_fn`` of ``torch.utils.checkpoint``: the recompute in the backward runs in the forward's precision.

    The mode is not carried into the backward pass, where activation
    checkpointing runs each block's forward again; without it the recompute
    would take transformers' float32 paths and fail checkpointing's check
    that it saves the same tensors.
    """
    return contextlib.nullcontext(), (Float64Mode() if Float64Mode.active() else contextlib.nullcontext())


def _is_float64(model) -> bool:
    parameter = next(model.parameters(), None)
    return parameter is not None and parameter.dtype == torch.float64


def _derived_buffers(module) -> list[str]:
    # Non-persistent float buffers: not in the checkpoint, so derived from the config at init.
    return [name for name, buffer in module.named_buffers(recurse=False)
            if name in module._non_persistent_buffers_set and buffer is not None and buffer.is_floating_point()]


def _fresh(module):
    # A module of the same class from the same config (rotary modules: (config); GPT-J attention: (config, layer)).
    config = getattr(module, "config", None)
    if config is None:
        return None
    for args in ((config,), (config, getattr(module, "layer_idx", 0))):
        try:
            return type(module)(*args)
        except TypeError:
            continue
    return None


def rebuild_float64_buffers(model) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """Compute the config-derived buffers (module docstring) again in float64; returns what to put back.

    A module whose class cannot be built again from its config keeps its
    buffers (none among the supported families).
    """
    saved = []
    with Float64Mode():
        for module in model.modules():
            names = _derived_buffers(module)
            if not names:
                continue
            with torch.device("cpu"), torch.random.fork_rng(devices=[]):  # a fresh module draws its weights
                fresh = _fresh(module)
            if fresh is None:
                continue
            for name in names:
                old = getattr(module, name)
                new = getattr(fresh, name, None)
                if not isinstance(new, torch.Tensor) or new.shape != old.shape:
                    continue
                saved.append((module, name, old))
                module._buffers[name] = new.to(device=old.device, dtype=torch.float64)
    return saved


@contextlib.contextmanager
def full_precision(model):
    """A float64 `model` computed in float64 end to end while inside; no effect on other dtypes."""
    if not _is_float64(model):
        yield
        return
    saved = rebuild_float64_buffers(model)
    try:
        with Float64Mode():
            yield
    finally:
        for module, name, old in reversed(saved):
            module._buffers[name] = old


@contextlib.contextmanager
def frozen_eval(model):
    """`model` in eval mode with every weight's ``requires_grad`` off while inside; both restored after.

    A measuring pass differentiates with respect to the input embeddings only:
    frozen weights keep no inputs for their own gradients, and eval mode turns
    dropout off.
    """
    was_training = model.training
    flags = [parameter.requires_grad for parameter in model.parameters()]
    model.eval()
    try:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        yield model
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
        model.train(was_training)
