"""The mean of per-sequence rollouts, the measured half (torch): each sequence's own rollout rows, averaged.

The predicted half is `jaxroll.theory.sequence_mean` (`mean_of_rollouts`,
JAX): the same rows from ingredients already in memory, and the contrast
with the rollout of the mean (`jaxroll.theory.rows.predicted_rows`).

For a Hugging Face causal LM with T blocks and H heads, sequence s of N
tokens, and per block t (arXiv 2602.16837; Abnar & Zuidema 2020):

    A_t^s[i, j]  = mean_h alpha_{t,h}^s[i, j]                       (N, N), the head-averaged attention
    lambda_t^s   = mean_i ||a_i|| / (||x_i|| + ||a_i||)              (0 where both norms vanish)
    R_t^s        = (1 - lambda_t^s) I + lambda_t^s A_t^s
    rows[k, j]   = mean_s (e_{q_k}^T R_T^s ... R_1^s)_j

with ``alpha`` the attention probabilities (``A[i, j]`` = the weight with
which token i reads token j), ``x`` block t's input residual stream and
``a`` the attention sub-layer's output after its output projection (bias
included): the hooks of `jaxroll.measure.refinements` (``attention`` and
``position``), so ``lambda_t^s`` is the per-sequence value whose mean over
sequences is `jaxroll.measure.measure`'s ``lambda_t``. Everything is float64
(probabilities and norms upcast as they leave the model; a float64 model
runs in float64 throughout, `jaxroll.measure.precision.full_precision`).
Kernel rows are divided by their sums (a float32 softmax row sums to 1
within ~1e-7), as `mean_of_rollouts` does, so each row sums to 1.

Sequences stream through in micro-batches: a batch of B sequences holds B
head-averaged kernels ``(T, N, N)``, turned into rows ``(K, N)`` and added to
a running sum before the next batch; ``P_T`` is never formed (K start rows,
T vector-times-matrix products each).

Registered statistic ``sequence_rollout`` (``jaxroll measure --stats
lambda,influence,sequence_rollout``): ``sequence_rollout (N,)``, the last row
(``q = N - 1``) of the mean of per-sequence rollouts, and
``sequence_rollout_per_sequence (S, N)``, each sequence's own last row. The
registry hands a statistic no query positions, so ``--queries K`` adds no
``sequence_rollout_rows``: call `sequence_rollout_rows` for other rows.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..theory.rows import query_positions
from ..theory.sequence_mean import rollouts_per_sequence
from .layer_maps import LayerMap, resolve
from .refinements import _alpha_rows, _attach, _ratio
from .registry import Shapes, Statistic, register_statistic

__all__ = ["SWITCHES", "sequence_rollout_rows"]

SWITCHES = ("attention", "position")
"""The `jaxroll.measure.refinements` hooks read: alpha per head, and the norms of x and a per position."""


def sequence_rollout_rows(model, token_ids, queries, *, batch_size: int = 8,
                          layer_map: LayerMap | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The mean over sequences of each sequence's own rollout rows at the query positions.

    ``rows[k, j] = mean_s (e_{q_k}^T R_T^s ... R_1^s)_j`` with
    ``R_t^s = (1 - lambda_t^s) I + lambda_t^s A_t^s`` built from sequence s
    alone (module docstring), in float64.

    Args:
        model: a Hugging Face ``*ForCausalLM`` of a family in
            `jaxroll.measure.families.FAMILIES`, loaded with eager attention
            (its attention module returns the probabilities); eval mode for
            the run, restored after.
        token_ids: ``(S, N)`` integer token ids.
        queries: a count K or positions (`jaxroll.theory.rows.query_positions`).
        batch_size: sequences per forward pass (B >= 1).
        layer_map: the modules to hook (default: the model's family).

    Returns:
        ``(rows, positions)``: rows ``(K, N)`` float64, each summing to 1, and
        the query positions ``(K,)``.

    Raises:
        ConfigError: bad ids or batch size, a model without eager attention,
            a non-finite row.
    """
    import torch

    from .precision import full_precision  # torch is loaded here, not when the statistic registers

    resolved = resolve(model, layer_map)
    ids = np.asarray(token_ids)
    if ids.ndim != 2 or ids.shape[0] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"token_ids: got shape {ids.shape}, dtype {ids.dtype}; allowed: integer ids (S, N), S >= 1")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size: got {batch_size!r}; allowed: an integer >= 1")
    positions = query_positions(ids.shape[1], queries)
    layers = len(resolved.blocks)
    device = model.get_input_embeddings().weight.device
    states: list[dict] = []

    def deliver(kind, layer, value, row=0):
        states[row][(kind, layer)] = value.mean(0) if kind == "alpha" else value  # heads averaged at once

    total = np.zeros((positions.size, ids.shape[1]))
    handles = _attach(resolved, SWITCHES, deliver)
    was_training = model.training
    try:
        model.eval()
        for first in range(0, ids.shape[0], batch_size):
            batch = torch.as_tensor(ids[first:first + batch_size], dtype=torch.long, device=device)
            states[:] = [{} for _ in range(batch.shape[0])]
            with torch.no_grad(), full_precision(model):
                model(input_ids=batch, use_cache=False)
            mixing, kernels = zip(*(_own_ingredients(state, layers) for state in states))
            for rows in rollouts_per_sequence(np.stack(mixing), np.stack(kernels), positions):
                total += rows  # one sequence at a time: the same summation order at every batch size
            states.clear()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    rows = total / ids.shape[0]
    if not np.all(np.isfinite(rows)):
        raise ConfigError("sequence rollout rows: a non-finite value; allowed: finite models")
    return rows, positions


def _own_ingredients(state: dict, layers: int) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's ``lambda_t^s`` ``(T,)`` and head-averaged ``A_t^s`` ``(T, N, N)``, float64, from what the
    hooks delivered: `state` maps ``("alpha", t)`` to ``(N, N)`` (already head-averaged) or ``(H, N, N)``, and
    ``("x", t)``, ``("a", t)`` to the norms ``(N,)`` (`jaxroll.measure.refinements._attach`)."""
    missing = [t for t in range(layers) if ("alpha", t) not in state or ("x", t) not in state
               or ("a", t) not in state]
    if missing:
        raise ConfigError(f"sequence rollout: block {missing[0]} delivered no attention or norms; allowed: a "
                          "model whose attention returns its probabilities (attn_implementation='eager')")
    kernels = [state[("alpha", t)].double().cpu() for t in range(layers)]
    kernels = np.stack([(kernel.mean(0) if kernel.dim() == 3 else kernel).numpy() for kernel in kernels])
    kernels /= kernels.sum(-1, keepdims=True)  # low-precision softmax rows (bfloat16) miss 1 by more than 1e-6
    mixing = np.array([float(_ratio(state[("a", t)], state[("x", t)] + state[("a", t)]).mean())
                       for t in range(layers)])
    return mixing, kernels


# ----------------------------------------------------------------------------- jaxroll measure --stats


def _allocate(shape: Shapes) -> dict:
    return {"sequence_rollout_sum": np.zeros(shape.length),
            "sequence_rollout_per_sequence": np.full((shape.sequences, shape.length), np.nan)}


def _attach_hooks(resolved, deliver, recording, recomputed=False):
    # Under an efficient attention alpha comes from the recomputed rows (`_alpha_rows`), not a hook.
    return _attach(resolved, SWITCHES, deliver, recording, alpha_hooks=not recomputed)


def _observe(state, kind, layer, value):
    state[(kind, layer)] = value.mean(0) if kind == "alpha" else value


def _accumulate(sums, state, index):
    n = sums["sequence_rollout_sum"].shape[0]
    layers = 1 + max((key[1] for key in state if key[0] in ("alpha", "x", "a")), default=-1)
    mixing, kernels = _own_ingredients(state, layers)
    row = rollouts_per_sequence(mixing[None], kernels[None], [n - 1])[0, 0]
    if not np.all(np.isfinite(row)):
        raise ConfigError(f"sequence_rollout: sequence {index} gave a non-finite row; allowed: finite models")
    sums["sequence_rollout_sum"] += row
    sums["sequence_rollout_per_sequence"][index] = row


def _finish(sums, count, shape):
    return {"sequence_rollout": sums["sequence_rollout_sum"] / count,
            "sequence_rollout_per_sequence": sums["sequence_rollout_per_sequence"]}


def _memory(shape: Shapes) -> int:
    return 8 * shape.length * (shape.sequences + 1)


def _summary(outputs: dict) -> str:
    row = outputs["sequence_rollout"]
    return f"sequence_rollout: mean of per-sequence rollouts, last row, weight on the last token {row[-1]:.4g}"


register_statistic(Statistic(
    name="sequence_rollout", hooks=(), allocate=_allocate, observe=_observe, accumulate=_accumulate,
    finish=_finish, per_sequence=("sequence_rollout_per_sequence",), needs_eager=True, memory=_memory,
    summary=_summary, attach=_attach_hooks, observe_rows=_alpha_rows))
