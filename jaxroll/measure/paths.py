"""Each path of each layer: a block's local influence split into identity, value, probability and MLP.

For block t with input ``h`` (the residual stream entering it, ``(N, D)``
per sequence) and output ``h'``, and a query position i::

    J_t(i, j) = d h'_i / d h_j                       (D x D)
              = delta_ij I  +  dA_i/dh_j |_{P fixed}  +  dA_i/dh_j |_{V fixed}  +  dM_i/dh_j
                 identity      value path              probability path         MLP path

where ``A`` is the attention sub-layer's output (the output projection's
output, the attention's residual update), ``P`` its softmax probabilities
and ``V`` its value vectors; the two attention terms sum to ``dA/dh``
exactly (product rule on ``A = W_O P V``). The MLP path is the rest,
``M = h' - h - A``: in a sequential block it includes the MLP's dependence
on ``A``; in a parallel block (GPT-J, Falcon, GPT-NeoX with
``use_parallel_residual``) the MLP reads ``h`` directly. For a family whose
attention update passes a norm after the output projection (Gemma 2/3,
OLMo 2), that norm's effect lands in the MLP path.

Each path is reported as its local influence ``L_t(i, j) = ||J_path(i, j)||_F``,
averaged over sequences (the mean of the per-sequence norms); the identity
is ``sqrt(D)`` at ``j = i`` and 0 elsewhere, the reference.

Estimator: ``||J(i, j)||_F^2 = sum_r ||e_r^T J(i, j)||^2`` over the D basis
vectors of the output at i: one backward pass from ``e_r . y_i`` gives row r
of ``J(i, j)`` for every j at once. Exact mode uses all D basis vectors;
estimate mode uses R Gaussian vectors u (``E ||u^T J||^2 = ||J||_F^2``),
whose relative standard error on the squared norm is at most
``sqrt(2 / R)`` (``Var = 2 ||J^T J||_F^2 <= 2 ||J||_F^4``), about half that on
the norm (1.6 % at R = 2000).

Each block is computed on its own: the model runs forward once with hooks
capturing each block's input (detached, requiring grad) and the extra
arguments of its call (attention mask, position embeddings, ALiBi), then
each block is recomputed alone from its input twice (values detached,
nothing detached), so the Jacobian is the block's local one. Per probe u,
three backward passes give ``u^T dA_i/dh`` (the attention),
``u^T dA_i/dh |_{V fixed}`` (the probability path) and ``u^T dM_i/dh``; the
value path's row is the first minus the second (the product rule, exact),
so no probability is detached and any attention implementation serves
(eager, ``sdpa``). Memory: the (L, K, N) results plus one block's graph;
never N x N per layer.

Cost: per block 2 block forwards and ``3 K P`` block backwards (P = D exact,
R estimate), batched as vmapped backwards (`CHUNK_ELEMENTS`). The cost of
the ``paths`` statistic that uses it is measured in
benchmarks/path_stats.py (docs/refinements.md). (Earlier, with the
softmax detached in eager attention, on a tiny float64 Llama, 2 layers,
D = 32, N = 16, 4 sequences, K = 1: exact 13-26x a bare forward+backward,
R = 8 6-17x.)

Any attention implementation: the values are detached at the layer map's
value module (`_value_mask`), which every implementation reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from ..errors import ConfigError
from .layer_maps import resolve
from .precision import full_precision

__all__ = ["PathInfluence", "layer_paths"]


@dataclasses.dataclass(frozen=True)
class PathInfluence:
    """Per-path local influence ``||d h'_i / d h_j||_F`` of each block, averaged over sequences.

    Attributes:
        identity, value, probability, mlp: ``(L, K, N)`` float64: block t,
            query ``queries[k]``, key position j.
        queries: ``(K,)`` the query positions (non-negative).
        projections: None (exact, all D basis vectors) or R (Gaussian estimate).
        relative_standard_error: bound on the relative standard error of each
            squared norm per sequence: 0 exact, ``sqrt(2 / R)`` estimated.
        sequences: how many sequences were averaged.
        per_sequence: with ``keep_sequences=True``, ``{value, probability,
            mlp}`` each ``(S, L, K, N)``: the per-sequence norms whose means
            are the arrays above; else None.
    """

    identity: np.ndarray
    value: np.ndarray
    probability: np.ndarray
    mlp: np.ndarray
    queries: np.ndarray
    projections: int | None
    relative_standard_error: float
    sequences: int
    per_sequence: dict | None = None


def _check(model, ids, queries, projections):
    if getattr(model, "training", False):
        raise ConfigError.of("model.training", True, "a model in eval mode (model.eval()): dropout is off")
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ConfigError.of("token_ids", tuple(ids.shape), "a (S, N) array of token ids, N >= 1")
    length = ids.shape[1]
    queries = [-1] if queries is None else list(np.atleast_1d(queries))
    if not queries or not all(_is_integer(q) and -length <= q < length for q in queries):
        raise ConfigError.of("queries", queries, f"integer positions in [-{length}, {length})")
    if projections is not None and not (_is_integer(projections) and projections >= 1):
        raise ConfigError.of("projections", projections, "None (exact) or an integer R >= 1")
    return np.array([int(q) % length for q in queries])


def _is_integer(value) -> bool:
    try:
        return not isinstance(value, bool) and int(value) == value
    except (TypeError, ValueError):
        return False


def _value_mask(layer_map, module_output_width, num_heads, head_dim, config, dtype):
    """1 at the columns of the value module's output that hold values, 0 at query/key columns.

    Read from the map's own `value_split` as the gradient of its output's sum
    (nonzero exactly at the columns it picks; a clamp such as MPT's
    ``clip_qkv`` passes the gradient at zero), so no layout is written twice.
    """
    import torch

    with torch.enable_grad():
        columns = torch.zeros(1, 1, module_output_width, dtype=dtype, requires_grad=True)
        picked = layer_map.value_split(columns, num_heads, head_dim, config)
        (grad,) = torch.autograd.grad(picked.sum(), columns)
    mask = (grad.reshape(-1) != 0).to(dtype)
    if not mask.any():
        raise ConfigError.of("layer_map.value_split", layer_map.name, "a split that selects output columns")
    return mask


@contextlib.contextmanager
def _hooked(module, hook):
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _block_output(block, args, kwargs, h):
    args = (h,) + tuple(args[1:]) if args else ()
    kwargs = dict(kwargs) if args else dict(kwargs, hidden_states=h)
    out = block(*args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


def _path_outputs(resolved, layer, call, h):
    """``{attention, probability, mlp}``: outputs ``(S, N, D)`` of two recomputations of the block.

    ``attention`` the attention's update ``A`` and ``mlp = h' - h - A`` from
    the plain block; ``probability`` the update with the values detached
    (the value module's value columns, `_value_mask`). The value path is
    their difference, per probe, in `_squared_rows` (module docstring).
    """
    block, projection = resolved.blocks[layer], resolved.output_projections[layer]
    captured = {}

    def keep(name):
        def hook(module, args, output):
            captured[name] = output[0] if isinstance(output, tuple) else output
        return hook

    layer_map = resolved.layer_map
    value_module = block.get_submodule(layer_map.value)

    def detach_values(module, args, output):
        mask = _value_mask(layer_map, output.shape[-1], resolved.num_heads, resolved.head_dim,
                           resolved.config, output.dtype).to(output.device)
        return output * (1 - mask) + output.detach() * mask

    with _hooked(projection, keep("probability")), _hooked(value_module, detach_values):
        _block_output(block, *call, h)
    with _hooked(projection, keep("attention")):
        out = _block_output(block, *call, h)
    return {"attention": captured["attention"], "probability": captured["probability"],
            "mlp": out - h - captured["attention"]}


CHUNK_ELEMENTS = 2 ** 24
"""At most this many elements per chunk of probes, counted as chunk x S x (N D + 4 N^2): the gradient and a few
attention maps of a batched backward (about 128 MiB of gradients in float64 at N^2 << N D)."""


def _gradients(row, h, batch):
    """``d (u_r . row) / d h`` for each u_r in `batch` ``(c, S, D)``: ``(c, S, N, D)``."""
    import torch

    try:
        (grads,) = torch.autograd.grad(row, h, grad_outputs=batch, retain_graph=True, is_grads_batched=True)
    except RuntimeError:  # no batching rule for some operation: the plain loop
        grads = torch.stack([torch.autograd.grad(row, h, grad_outputs=u, retain_graph=True)[0] for u in batch])
    return grads


def _squared_rows(outputs, h, query, vectors):
    """``{value, probability, mlp}``: ``sum_r ||u_r^T d path[s, query] / d h[s]||^2``, each (S, N).

    One backward pass per output and vector u_r, a chunk of vectors at a
    time as one batched (vmapped) backward (`CHUNK_ELEMENTS`, one at a time
    where an operation has no batching rule); the value path's row is the
    attention's minus the probability path's (the product rule, exact).
    """
    import torch

    per_vector = h.numel() + h.shape[0] * h.shape[1] * h.shape[1] * 4  # the gradient and a few (N, N) maps
    chunk = max(1, CHUNK_ELEMENTS // per_vector)
    totals = {name: torch.zeros(h.shape[:2], dtype=torch.float64, device=h.device)
              for name in ("value", "probability", "mlp")}
    rows = {name: output[:, query, :] for name, output in outputs.items()}
    for start in range(0, len(vectors), chunk):
        batch = torch.stack([vector.expand_as(rows["mlp"]) for vector in vectors[start:start + chunk]])
        attention = _gradients(rows["attention"], h, batch)
        probability = _gradients(rows["probability"], h, batch)
        grads = {"value": attention - probability, "probability": probability,
                 "mlp": _gradients(rows["mlp"], h, batch)}
        for name, grad in grads.items():
            totals[name] += grad.double().pow(2).sum((0, -1))
    return totals


def _block_paths(resolved, layer, call, h, queries, vectors):
    """``{path: (S, K, N)}`` per-sequence norms of one block (float64 NumPy)."""
    outputs = _path_outputs(resolved, layer, call, h)
    squared = [_squared_rows(outputs, h, int(q), vectors) for q in queries]
    return {name: np.stack([rows[name].sqrt().detach().cpu().numpy() for rows in squared], axis=1)
            for name in ("value", "probability", "mlp")}


def _capture_blocks(model, resolved, ids):
    from .hooks import forward_then_remove

    calls = [None] * len(resolved.blocks)

    def capture(layer):
        def hook(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            calls[layer] = (args, kwargs, h.detach().clone())
        return hook

    forward_then_remove(model, ids, [block.register_forward_pre_hook(capture(t), with_kwargs=True)
                                     for t, block in enumerate(resolved.blocks)])
    return calls


def _all_blocks(model, resolved, ids, queries, projections, seed):
    import torch

    calls = _capture_blocks(model, resolved, ids)
    width, dtype = calls[0][2].shape[-1], calls[0][2].dtype
    if projections is None:
        vectors = list(torch.eye(width, dtype=dtype, device=calls[0][2].device))
    else:
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randn(int(projections), ids.shape[0], width, generator=generator, dtype=torch.float64)
        # the sum over R is then the mean; the draws on the CPU, so a seed gives the same on every device
        vectors = list((draws / math.sqrt(int(projections))).to(dtype=dtype, device=calls[0][2].device))
    layers = [_block_paths(resolved, layer, (args, kwargs), h.requires_grad_(True), queries, vectors)
              for layer, (args, kwargs, h) in enumerate(calls)]
    return layers, width


def layer_paths(model, token_ids, queries=None, projections=None, seed=0, keep_sequences=False) -> PathInfluence:
    """Split each block's local influence ``||d h'_i / d h_j||_F`` into identity, value, probability and MLP paths.

    See the module docstring for the formulas. `token_ids` is ``(S, N)``
    (no padding); `queries` the K query positions (default: the last);
    `projections` None for exact (D backward passes per block, query and
    path) or R for the Gaussian estimate (seeded by `seed`);
    `keep_sequences` also returns the per-sequence norms ``(S, L, K, N)``
    (`PathInfluence.per_sequence`), whose means over S are the arrays.

    Returns:
        `PathInfluence` with ``(L, K, N)`` float64 arrays, means over sequences.

    Raises:
        ConfigError: a model in training mode, bad ids, queries
            or projections (before any work).
    """
    ids = np.asarray(token_ids)
    queries = _check(model, ids, queries, projections)
    resolved = resolve(model)
    if resolved.layer_map.value is None:
        raise ConfigError.of("layer_map.value", None, "the module holding the value vectors (the probability path)")
    with full_precision(model):  # a float64 model in float64 end to end (transformers' float32 softmax)
        layers, width = _all_blocks(model, resolved, ids, queries, projections, seed)
    count, length = ids.shape
    identity = np.zeros((len(layers), len(queries), length))
    identity[:, np.arange(len(queries)), queries] = math.sqrt(width)
    stacked = {name: np.stack([p[name] for p in layers], axis=1) for name in ("value", "probability", "mlp")}
    return PathInfluence(
        identity=identity,
        value=stacked["value"].mean(0),
        probability=stacked["probability"].mean(0),
        mlp=stacked["mlp"].mean(0),
        queries=queries,
        projections=None if projections is None else int(projections),
        relative_standard_error=0.0 if projections is None else math.sqrt(2.0 / int(projections)),
        sequences=count,
        per_sequence=stacked if keep_sequences else None,
    )
