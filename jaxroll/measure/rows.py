"""Every row of the rollout, the measured half: gradient influence on many query positions (torch).

The predicted half is `jaxroll.theory.rows` (`predicted_rows`; its
`normalised_rows` puts these norms on the predicted rows' scale).

For token ids ``(S, N)`` and query positions ``q_1 < ... < q_K``:

    g[s, k, j] = || d f_{s,k} / d e_{s,j} ||_2,   f_{s,k} = max_v softmax(logits_{s, q_k})_v,

with ``e_{s,j}`` the token embedding at j (before any embedding LayerNorm),
the softmax in float32 (float64 for a float64 model) and the norm in float64.
The last query ``N - 1`` gives exactly `jaxroll.measure.measure`'s
``influence_per_sequence``. Positions after ``q_k`` get exactly 0 under causal
masking.

Batched: one forward pass for a micro-batch of B sequences, then one backward
pass per query position, of ``sum_s f_{s,k}``. Sequences are independent in
the forward pass (no cross-sequence operation in eval mode, all of length
N), so the gradient of that sum with respect to ``e_s`` is sequence s's own
gradient: the result equals one sequence at a time.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from ..errors import ConfigError
from ..theory.rows import query_positions
from .layer_maps import LayerMap, resolve
from .precision import full_precision

__all__ = ["influence_rows"]


def influence_rows(model, token_ids, queries, *, batch_size: int = 8, layer_map: LayerMap | None = None,
                   progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence gradient influence on every query position.

    Args:
        model: a Hugging Face ``*ForCausalLM`` (eval mode for the run, restored after).
        token_ids: ``(S, N)`` integer token ids.
        queries: a count K or positions (`jaxroll.theory.rows.query_positions`).
        batch_size: sequences per forward pass (B >= 1).
        progress: an object with ``update(n)`` (sequences done), or None.

    Returns:
        ``(rows, positions)``: rows ``(S, K, N)`` float64 gradient norms and the
        query positions ``(K,)``.
    """
    resolve(model, layer_map)
    ids = np.asarray(token_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"token_ids: got shape {ids.shape}, dtype {ids.dtype}; allowed: integer ids (S, N)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size: got {batch_size!r}; allowed: an integer >= 1")
    positions = query_positions(ids.shape[1], queries)
    device = model.get_input_embeddings().weight.device
    keep = torch.as_tensor(positions, device=device)
    # Only the query positions' logits, where the model can keep a subset (transformers >= 4.50).
    subset = "logits_to_keep" in inspect.signature(model.forward).parameters
    rows = np.zeros((ids.shape[0], positions.size, ids.shape[1]))
    flags = [parameter.requires_grad for parameter in model.parameters()]
    was_training = model.training
    model.eval()
    try:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        for start in range(0, ids.shape[0], batch_size):
            batch = torch.as_tensor(ids[start:start + batch_size], dtype=torch.long, device=device)
            with full_precision(model):  # a float64 model in float64 throughout (precision.py)
                rows[start:start + batch.shape[0]] = _batch_rows(model, batch, keep, subset)
            if progress is not None:
                progress.update(batch.shape[0])
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
        model.train(was_training)
    if not np.all(np.isfinite(rows)):
        raise ConfigError("influence rows: a non-finite gradient; allowed: finite models")
    return rows, positions


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
