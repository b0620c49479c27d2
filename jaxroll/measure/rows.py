"""Every row of the rollout, the measured half: gradient influence on many query positions (torch).

The predicted half is `jaxroll.theory.rows` (`predicted_rows`; its
`normalised_rows` puts these norms on the predicted rows' scale).

For token ids ``(S, N)`` and query positions ``q_1 < ... < q_K``, two targets:

``target="probability"`` (the default, the scalar next-token target)::

    g[s, k, j] = || d f_{s,k} / d e_{s,j} ||_2,   f_{s,k} = max_v softmax(logits_{s, q_k})_v,

with the softmax in float32 (float64 for a float64 model). The last query
``N - 1`` gives exactly `jaxroll.measure.measure`'s ``influence_per_sequence``.

``target="hidden"`` (the hidden-state Jacobian)::

    g[s, k, j] = || d h_{s,q_k} / d e_{s,j} ||_F    (the D x D Jacobian, D the hidden size),

with ``h`` the residual stream leaving the last block, i.e. the input of
the final norm (``ln_f``, ``norm_f``, ``final_layer_norm`` or ``norm``
beside the blocks; `final_norm`): before the final norm, before the
unembedding. Where a model has no final norm (OPT with
``do_layer_norm_before=False``) it is the last block's output, the same
place. (Hugging Face's last ``output_hidden_states`` entry is *after* the
final norm for BLOOM, Llama and the others: not this ``h``.) It is what a
linear propagation rollout models most directly, the measurement of
Brändel et al. (arXiv 2606.29139)'s Jacobian sensitivity; their abstract
does not say before or after the final norm, so before it is our choice.

Both: ``e_{s,j}`` the token embedding at j (before any embedding LayerNorm
or embedding scale), the norms in float64, positions after ``q_k`` exactly
0 under causal masking.

Batched: one forward pass for a micro-batch of B sequences, then backward
passes of ``sum_s f_{s,k}`` (or of ``sum_s u . h_{s,q_k}``). Sequences are
independent in the forward pass (no cross-sequence operation in eval mode,
all of length N), so the gradient of that sum with respect to ``e_s`` is
sequence s's own gradient: the result equals one sequence at a time.

Cost: the probability target takes one backward pass per query; the hidden
target is exact, one backward pass per basis vector ``u`` of R^D, D per
query (vectorised: ``torch.autograd.grad(..., is_grads_batched=True)``
runs C of them at once). Memory: both hold the micro-batch's forward graph
(no activation checkpointing here); the hidden target also holds the C
gradients ``(C, B, N, D)`` in the model's dtype and C backward passes'
temporaries, C the largest count whose gradients fit in `JACOBIAN_BYTES`
(at least 1, at most D).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from ..errors import ConfigError
from ..theory.rows import query_positions
from .layer_maps import LayerMap, resolve
from .precision import frozen_eval, full_precision

__all__ = ["influence_rows", "final_norm", "TARGETS", "JACOBIAN_BYTES"]

TARGETS = ("probability", "hidden")
"""The targets of `influence_rows`: the max next-token probability, or the hidden state before the final norm."""

JACOBIAN_BYTES = 256 * 2**20
"""At most this many bytes of basis gradients ``(C, B, N, D)`` at once (``target="hidden"``)."""

FINAL_NORM_NAMES = ("ln_f", "norm_f", "final_layer_norm", "norm")
"""Where the final norm sits, beside the block list (GPT-2/BLOOM/Falcon/GPT-J, MPT, OPT/GPT-NeoX, the rest)."""


def influence_rows(model, token_ids, queries, *, batch_size: int = 8, layer_map: LayerMap | None = None,
                   progress=None, target: str = "probability") -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence gradient influence on every query position.

    ``target="probability"``: ``g[s, k, j] = || d f_{s,k} / d e_{s,j} ||_2``
    with ``f_{s,k}`` the max next-token probability at ``q_k``; one backward
    pass per query. ``target="hidden"``: ``g[s, k, j] = || d h_{s,q_k} /
    d e_{s,j} ||_F``, the Frobenius norm of the ``D x D`` Jacobian of the
    hidden state entering the final norm (`final_norm`); exact, D backward
    passes per query, run C at a time, C such that the ``(C, B, N, D)``
    gradients fit in `JACOBIAN_BYTES` (module docstring).

    Args:
        model: a Hugging Face ``*ForCausalLM`` (eval mode for the run, restored after).
        token_ids: ``(S, N)`` integer token ids.
        queries: a count K or positions (`jaxroll.theory.rows.query_positions`).
        batch_size: sequences per forward pass (B >= 1).
        layer_map: the model's `LayerMap` (default: chosen by its ``model_type``).
        progress: an object with ``update(n)`` (sequences done), or None.
        target: ``"probability"`` or ``"hidden"`` (`TARGETS`).

    Returns:
        ``(rows, positions)``: rows ``(S, K, N)`` float64 gradient norms and the
        query positions ``(K,)``.

    Raises:
        ConfigError: an unknown target, bad token ids or batch size, a model
            without a layer map, or a non-finite gradient.
    """
    if target not in TARGETS:
        raise ConfigError(f"target: got {target!r}; allowed: {', '.join(TARGETS)}")
    resolved = resolve(model, layer_map)
    ids = np.asarray(token_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"token_ids: got shape {ids.shape}, dtype {ids.dtype}; allowed: integer ids (S, N)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size: got {batch_size!r}; allowed: an integer >= 1")
    positions = query_positions(ids.shape[1], queries)
    hook = final_norm(model, resolved) if target == "hidden" else None
    device = model.get_input_embeddings().weight.device
    keep = torch.as_tensor(positions, device=device)
    # Only the query positions' logits, where the model can keep a subset (transformers >= 4.50).
    subset = "logits_to_keep" in inspect.signature(model.forward).parameters
    rows = np.zeros((ids.shape[0], positions.size, ids.shape[1]))
    with frozen_eval(model):
        for start in range(0, ids.shape[0], batch_size):
            batch = torch.as_tensor(ids[start:start + batch_size], dtype=torch.long, device=device)
            with full_precision(model):  # a float64 model in float64 throughout (precision.py)
                rows[start:start + batch.shape[0]] = (_batch_rows(model, batch, keep, subset) if hook is None
                                                      else _batch_jacobian_rows(model, batch, keep, subset, hook))
            if progress is not None:
                progress.update(batch.shape[0])
    if not np.all(np.isfinite(rows)):
        raise ConfigError("influence rows: a non-finite gradient; allowed: finite models")
    return rows, positions


def final_norm(model, resolved=None) -> tuple[torch.nn.Module, bool]:
    """``(module, before)``: where ``target="hidden"`` reads h, the residual stream after the last block.

    The final norm beside the block list (the first of `FINAL_NORM_NAMES`
    that the blocks' parent module has), ``before=True``: h is its input.
    Where that attribute is None (OPT without a final norm), the last
    block, ``before=False``: h is its output.

    Raises:
        ConfigError: the blocks' parent has none of those names.
    """
    resolved = resolved or resolve(model)
    path = resolved.layer_map.blocks.rpartition(".")[0]
    parent = model
    for part in filter(None, path.split(".")):
        parent = getattr(parent, part)
    for name in FINAL_NORM_NAMES:
        if hasattr(parent, name):
            module = getattr(parent, name)
            return (module, True) if module is not None else (resolved.blocks[-1], False)
    raise ConfigError(f"target 'hidden': no final norm ({', '.join(FINAL_NORM_NAMES)}) beside "
                      f"{resolved.layer_map.blocks!r} in {type(model).__name__}; allowed: target='probability'")


def _batch_rows(model, batch, keep, subset) -> np.ndarray:
    embeddings = model.get_input_embeddings()(batch).detach().requires_grad_(True)
    keywords = {"use_cache": False} | ({"logits_to_keep": keep} if subset else {})
    logits = model(inputs_embeds=embeddings, **keywords).logits
    logits = logits if subset else logits[:, keep]
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    targets = torch.softmax(logits.to(dtype), dim=-1).amax(dim=-1)  # (B, K)
    norms = []
    for k in range(targets.shape[1]):
        (gradient,) = torch.autograd.grad(targets[:, k].sum(), embeddings, retain_graph=k + 1 < targets.shape[1])
        norms.append(gradient.double().norm(dim=-1).cpu().numpy())  # (B, N)
    return np.stack(norms, axis=1)


def _batch_jacobian_rows(model, batch, keep, subset, hook) -> np.ndarray:
    module, before = hook
    captured = []
    if before:
        handle = module.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    else:
        handle = module.register_forward_hook(
            lambda _module, _args, output: captured.append(output[0] if isinstance(output, tuple) else output))
    embeddings = model.get_input_embeddings()(batch).detach().requires_grad_(True)
    keywords = {"use_cache": False} | ({"logits_to_keep": keep[-1:]} if subset else {})
    try:
        model(inputs_embeds=embeddings, **keywords)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise ConfigError(f"target 'hidden': {type(module).__name__} ran {len(captured)} times in one forward pass; "
                          "allowed: a final norm that runs once")
    states = captured[0][:, keep]  # (B, K, D)
    size, width = states.shape[-1], embeddings.shape[0] * embeddings.shape[1] * embeddings.shape[2]
    chunk = int(min(size, max(1, JACOBIAN_BYTES // (width * embeddings.element_size()))))
    norms = []
    for k in range(states.shape[1]):
        squares = torch.zeros(embeddings.shape[:2], dtype=torch.float64, device=states.device)  # (B, N)
        for start in range(0, size, chunk):
            # Basis vectors u_a, a in [start, start + c): rows a of every sequence's Jacobian at once.
            index = torch.arange(start, min(start + chunk, size), device=states.device)
            basis = torch.zeros(index.numel(), states.shape[0], size, dtype=states.dtype, device=states.device)
            basis[torch.arange(index.numel(), device=states.device), :, index] = 1  # (c, B, D)
            (gradient,) = torch.autograd.grad(states[:, k], embeddings, grad_outputs=basis, retain_graph=True,
                                              is_grads_batched=True)  # (c, B, N, D)
            squares += gradient.double().square().sum(dim=(0, 3))
        norms.append(squares.sqrt().cpu().numpy())
    return np.stack(norms, axis=1)
