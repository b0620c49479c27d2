"""The value and probability paths at the last row from the forward pass alone: no backward through the model.

The same quantities as `jaxroll.measure.paths` (there by backward passes
through each block), at the target row ``i = N - 1``, for block t with input
``x`` ``(N, D)``: for each key j, the Frobenius norms of

    J^V_ij = sum_h A^h_ij W_O^h W_V^h J_n(x_j)                       (probabilities fixed)
    J^P_ij = sum_h a_h(j) b_h(j)^T   (+ the query's term at j = i)    (values fixed)

with ``A^h_i.`` the probabilities of row i, ``W_O^h (D, d)`` head h's
columns of the output projection, ``W_V^h, W_K^h, W_Q^h (d, D)`` its value,
key and query rows (a grouped head: its group's), ``J_n`` the Jacobian of the
pre-attention norm, ``a_h(j) = A^h_ij W_O^h (v^h_j - vbar^h_i)`` with
``vbar^h_i = sum_k A^h_ik v^h_k`` and ``b_h(j) = dz^h_ij / dx_j =
s J_n(x_j)^T W_K^h^T R_j^T q^h_i`` (``q^h_i`` rotated at i, ``R_j`` the key's
rotation, the identity without rotary; ``s`` the logit scale; an ALiBi bias
does not depend on x). The norm's Jacobian is a diagonal times the identity
minus a rank-2 (LayerNorm) or rank-1 (RMSNorm) term::

    J_n(x) = diag(gamma) S / sigma,   S = I - u u^T - w w^T   (LayerNorm: u = 1 / sqrt(D),
                                                              w = xhat / sqrt(D), u . w = 0)
                                      S = I - w w^T           (RMSNorm)

so that, with ``S^2 = I - u u^T - (2 - |w|^2) w w^T`` (RMSNorm: no u term),

    ||J^V_ij||^2 = (A_ij^T K A_ij - |G_j gamma.u|^2 - (2 - |w_j|^2) |G_j gamma.w_j|^2) / sigma_j^2,
    K_hh' = tr(W_O^h'^T W_O^h W_V^h Gamma^2 W_V^h'^T)   (H x H, once per layer),
    G_j y = sum_h A^h_ij W_O^h W_V^h y,
    ||J^P_ij||^2 = sum_hh' (a_h . a_h') (b_h . b_h'),

and at ``j = i``, where the query moves too, ``J^P_ii = sum_h a_h(i) b_h(i)^T
+ M Gamma S_i / sigma_i`` with ``M = sum_h W_O^h E_h W_Q^h`` and ``E_h = s
sum_l A^h_il (v^h_l - vbar^h_i) (R_i^T k^h_l)^T`` (k rotated at l), formed
as one D x D matrix. Everything is exact (the same definition as
`paths.layer_paths` in its exact mode); nothing is estimated.

Cost per block and sequence: the norm's statistics, row i of the
probabilities (``N H d``), the head-wise vectors ``a, Gamma y (H, N, D)``
(``2 N H d D`` multiply-adds) and their Gram matrices (``2 N H^2 D``), and
the ``D x D`` term at ``j = i``, in the model's precision (float32 for a
float32 model, float64 for float64), with no backward pass and nothing
``N x N``; keys in chunks of `CHUNK_BYTES`. It runs inside the measurement's
hooked pass on every sequence (`ForwardPaths.hooks`), reading the model's
own q, k, v from its projection modules; measured at 0.1-0.35 of a bare
forward+backward at N = 512 (docs/performance.md).

Where it applies (`unsupported`): the families whose logit the layer map
states exactly (`attention_rows.recomputable`) with linear q/k/v
projections read before any QK-norm, a LayerNorm or RMSNorm before the
attention, and no norm after it: GPT-2, BLOOM, Falcon with ALiBi, GPT-NeoX,
Llama, Mistral, Qwen2 (each checked against the backward route in
tests/test_path_forward.py). Elsewhere, and under an intervention, the
backward route (`paths.layer_paths`) runs. The MLP path needs the MLP's
Jacobian, so this route does not give it (NaN).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .attention_rows import key_bias, turn

__all__ = ["FORWARD_FAMILIES", "ForwardPaths", "unsupported", "forward_paths"]

FORWARD_FAMILIES = ("gpt2", "bloom", "falcon", "gpt_neox", "llama", "mistral", "qwen2")
"""The layer maps this route serves (each tested against the backward route)."""


def unsupported(model, resolved, patching=None) -> str | None:
    """Why `model` needs the backward route (one phrase), or None when this route computes its paths exactly."""
    layer_map = resolved.layer_map
    if patching is not None:
        return "an intervention changes the attention"
    if layer_map.name not in FORWARD_FAMILIES:
        return f"family {layer_map.name}"
    if layer_map.position == "rope" and layer_map.rotary is None:
        return "a rotary family without a stated rotation"
    if layer_map.name == "falcon" and layer_map.position != "alibi":
        return "Falcon with rotary positions"
    norm = _input_norm(resolved.blocks[0], layer_map)
    if _norm_kind(norm) is None:
        return f"the norm {type(norm).__name__}"
    return None


def _input_norm(block, layer_map):
    for name in layer_map.input_norm:
        try:
            return block.get_submodule(name)
        except AttributeError:
            continue
    return None


def _norm_kind(norm) -> str | None:
    if isinstance(norm, torch.nn.LayerNorm):
        return "layer"
    if norm is not None and type(norm).__name__.endswith("RMSNorm") and hasattr(norm, "variance_epsilon"):
        return "rms"
    return None


@dataclasses.dataclass(frozen=True)
class _Layer:
    """One block's weights in float64, per query head (a grouped key or value repeated), as in the module doc.

    ``query, key, value``: ``W (H, d, D)`` and ``b (H, d)``; ``out``: ``W_O^h^T (H, d, D)``; ``gram``: K
    ``(H, H)``; ``key_shift, value_shift``: ``W beta + b (H, d)``, so that ``W (gamma . xhat) = proj - shift``;
    ``key_u``: ``W_K^h gamma / sqrt(D) (H, d)`` and ``value_u``: ``W_O^h W_V^h gamma / sqrt(D) (H, D)``
    (LayerNorm; zeros for RMSNorm).
    """

    kind: str  # "layer" or "rms"
    tensors: dict
    cast: dict = dataclasses.field(default_factory=dict)

    def __getattr__(self, name):
        return self.tensors[name]

    def at(self, dtype) -> dict:
        """The tensors in `dtype` (kept: one conversion per run)."""
        if dtype not in self.cast:
            def to(item):
                if isinstance(item, tuple):
                    return tuple(to(part) for part in item)
                return item.to(dtype) if torch.is_tensor(item) else item
            self.cast[dtype] = {name: to(item) for name, item in self.tensors.items()}
        return self.cast[dtype]


def _affine(modules, pick, width, heads, dtype, device):
    """``(W (H, d, D), b (H, d))`` of a linear map read from its modules as ``f(I) - f(0)`` and ``f(0)``."""
    with torch.no_grad():
        basis = torch.eye(width, dtype=dtype, device=device)[None]
        zero = torch.zeros(1, 1, width, dtype=dtype, device=device)
        # .forward, not the call: the measurement's hooks on these modules must not see these inputs
        images, offsets = (pick(tuple(module.forward(x) for module in modules)) for x in (basis, zero))
        bias = offsets.reshape(heads, -1).double()
        matrix = images[0].reshape(width, heads, -1).double() - bias  # (D, H, d)
    return matrix.permute(1, 2, 0).contiguous(), bias


def _layer(block, resolved, layer) -> _Layer:
    layer_map, heads, head_dim, config = resolved.layer_map, resolved.num_heads, resolved.head_dim, resolved.config
    norm = _input_norm(block, layer_map)
    kind = _norm_kind(norm)
    weight = norm.weight.detach() if getattr(norm, "weight", None) is not None else None
    width = (weight.shape[0] if weight is not None else int(getattr(config, layer_map.hidden_size)))
    dtype, device = next(block.parameters()).dtype, next(block.parameters()).device
    gamma = weight.double() if weight is not None else torch.ones(width, dtype=torch.float64, device=device)
    bias = getattr(norm, "bias", None)
    beta = bias.detach().double() if bias is not None else torch.zeros_like(gamma)
    query_key = resolved.query_keys[layer]
    split = (lambda outputs: layer_map.split(outputs[0] if len(outputs) == 1 else outputs, heads, head_dim, config))
    query = _affine(query_key, lambda outputs: split(outputs)[0], width, heads, dtype, device)
    key = _affine(query_key, lambda outputs: split(outputs)[1], width, heads, dtype, device)
    value_module = block.get_submodule(layer_map.value)
    value = _affine((value_module,), lambda outputs: layer_map.value_split(outputs[0], heads, head_dim, config),
                    width, heads, dtype, device)
    w_out = block.get_submodule(layer_map.w_out or layer_map.output_projection)
    out = _affine((w_out,), lambda outputs: outputs[0], heads * head_dim, 1, dtype, device)[0][0]  # (D, H d)
    out_heads = out.T.reshape(heads, head_dim, width)  # W_O^h^T
    value_gamma = value[0] * gamma  # W_V^h Gamma
    # K_hh' = tr(W_O^h'^T W_O^h W_V^h Gamma^2 W_V^h'^T)
    outer = torch.einsum("gaD,hbD->hgab", out_heads, out_heads)  # [h, h'] = W_O^h'^T W_O^h, indices (a, b)
    inner = torch.einsum("hbD,gaD->hgba", value_gamma, value_gamma)  # [h, h'] = W_V^h G^2 W_V^h'^T, (b, a)
    layer_norm = 1.0 if kind == "layer" else 0.0  # the u terms exist for LayerNorm only
    return _Layer(kind, {
        "gamma": gamma, "beta": beta, "eps": float(norm.eps if kind == "layer" else norm.variance_epsilon),
        "query": query, "key": key, "value": value, "out": out_heads,
        "gram": torch.einsum("hgab,hgba->hg", outer, inner),
        "key_gamma": key[0] * gamma,  # W_K^h Gamma: gamma folded in once
        "key_shift": key[0] @ beta + key[1], "value_shift": value[0] @ beta + value[1],
        "key_u": layer_norm * key[0] @ gamma / math.sqrt(width),
        "value_u": layer_norm * torch.einsum("hdD,hd->hD", out_heads, value[0] @ gamma) / math.sqrt(width)})


def _normed(tensors, kind, x):
    """``(xhat, sigma)``: the norm's standardised input ``(B, N, D)`` (its output is ``gamma xhat + beta``), sigma ``(B, N)``."""
    centred = x - x.mean(-1, keepdim=True) if kind == "layer" else x
    sigma = (centred.pow(2).mean(-1, keepdim=True) + tensors["eps"]).sqrt()
    return centred.div_(sigma) if centred is not x else centred / sigma, sigma[..., 0]


def _project(parts, n):
    """``n W^T + b`` per head: ``(..., D) -> (..., H, d)``."""
    matrix, bias = parts
    return (n @ matrix.reshape(-1, matrix.shape[-1]).T).reshape(*n.shape[:-1], *bias.shape) + bias


def _probabilities(q_last, k, scale, bias, window):
    """``A (B, H, N)``: row i = N - 1 of the softmax of ``s q_i . k_j + b_h(j)`` (window: ``i - j < W``)."""
    logits = scale * torch.einsum("bhd,bnhd->bhn", q_last, k)
    if bias is not None:
        logits = logits + bias[None].to(logits.dtype)
    if window is not None:
        length = k.shape[1]
        logits = logits.masked_fill(torch.arange(length, device=k.device) <= length - 1 - window, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _turn(x, cos, sin):
    """`attention_rows.turn` for ``x (B, n, H, d)``, ``cos, sin (B, n, r)`` broadcast over the heads, in x's dtype."""
    return turn(x, cos[:, :, None, :], sin[:, :, None, :])


def _inverse(x, rotary, positions):
    """``R_j^T x`` for ``x (B, n, H, d)``, j running over `positions` (a slice of n) or one position for all n."""
    if rotary is None:
        return x
    cos, sin = (t.to(x.dtype) for t in rotary)
    if isinstance(positions, int):
        cos, sin = (t[:, positions:positions + 1].expand(-1, x.shape[1], -1) for t in (cos, sin))
    else:
        cos, sin = cos[:, positions], sin[:, positions]
    return _turn(x, cos, -sin)


def _per_head(vectors, matrices):
    """``(B, n, H, d) x (H, d, D) -> (H, B n, D)``: one matrix product per head."""
    batch, length, heads, dim = vectors.shape
    return torch.matmul(vectors.permute(2, 0, 1, 3).reshape(heads, batch * length, dim), matrices)


def _pairs(left, right=None):
    """``(H, H, m)``: ``left_h . right_g`` over the last axis of ``(H, m, D)`` (`right` None: `left`)."""
    right = left if right is None else right
    return torch.einsum("hmD,gmD->hgm", left, right)


CHUNK_BYTES = 8 * 2**20
"""Bytes of the probability path's per-key vectors ``a, Gamma y (H, B c, D)`` and their work, per chunk of keys."""


def _key_terms(t, kind, p, *, scale, rotary):
    """``(||J^V_ij||^2 sigma_j^2, ||sum_h a_h(j) b_h(j)^T||^2)`` each ``(B, N)``, and ``a, Gamma y`` at j = N - 1.

    `p` holds the probabilities ``(B, H, N)``, the spread ``v_j - vbar_i``,
    ``W_V (gamma . w_j)``, ``W_K (gamma . w_j)``, ``|w_j|^2``, sigma and the
    query at i; keys in chunks (`CHUNK_BYTES`).
    """
    batch, heads, length = p["A"].shape
    width = t["gamma"].shape[0]
    chunk = max(1, CHUNK_BYTES // (p["spread"].element_size() * 6 * batch * heads * width))
    value_sq, probability_sq = [], []
    shifted = _per_head(p["centre"][:, None], t["out"]).reshape(heads, batch, width)  # W_O^h (vbar_h - shift_h)
    for start in range(0, length, chunk):
        part = slice(start, min(length, start + chunk))
        count = part.stop - start
        weights = p["A"][:, :, part].transpose(1, 2)  # (B, c, H)
        a = _per_head(weights[..., None] * p["spread"][:, part], t["out"])  # (H, B c, D): a_h(j)
        # Value path: G_j gamma.w = (sum_h a_h + sum_h A_h W_O^h (vbar_h - shift_h)) / sqrt(D)
        through_w = a.sum(0).reshape(batch, count, width) + torch.einsum("bnh,hbD->bnD", weights, shifted)
        c_w = 2 - p["w2"][:, part]
        squares = (torch.einsum("bnh,hg,bng->bn", weights, t["gram"], weights)
                   - c_w * through_w.pow(2).sum(-1) / width - (weights @ t["value_u"]).pow(2).sum(-1))
        value_sq.append(squares)
        # Probability path: (b_h . b_g) sigma^2 / s^2 = Gy_h . Gy_g - (u . Gy_h)(u . Gy_g) - c_w (w . Gy_h)(w . Gy_g)
        turned = _inverse(p["q"][:, None].expand(-1, count, -1, -1), rotary, part)  # R_j^T q_i (B, c, H, d)
        gamma_y = _per_head(turned, t["key_gamma"])  # (H, B c, D): Gamma W_K^h^T R_j^T q_i
        along_w = (turned * p["key_w"][:, part]).sum(-1).permute(2, 0, 1).reshape(heads, -1)  # w . Gamma y_h
        along_u = (turned * t["key_u"]).sum(-1).permute(2, 0, 1).reshape(heads, -1)
        b_pairs = (_pairs(gamma_y) - along_u[:, None] * along_u[None]
                   - c_w.reshape(-1) * along_w[:, None] * along_w[None])
        b_pairs = b_pairs * (scale / p["sigma"][:, part].reshape(-1)).pow(2)
        probability_sq.append((_pairs(a) * b_pairs).sum((0, 1)).reshape(batch, count))
    return torch.cat(value_sq, 1), torch.cat(probability_sq, 1), a, gamma_y


def _apply_s(kind, y, w):
    """``S y`` along the last axis: ``y - u (u . y) - w (w . y)`` (RMSNorm: no u term); w broadcast."""
    out = y - w * (y * w).sum(-1, keepdim=True)
    return out - y.mean(-1, keepdim=True) if kind == "layer" else out


def _own_square(t, kind, p, k, a_last, gamma_y_last, *, scale, rotary):
    """``||J^P_ii||_F^2 (B,)``: the key's term plus the query's, ``M Gamma S_i / sigma_i`` (module doc), as D x D."""
    heads, length = p["A"].shape[1:]
    w_last, sigma_last = p["w"][:, -1], p["sigma"][:, -1]
    b_last = _apply_s(kind, gamma_y_last, w_last) * (scale / sigma_last)[:, None]  # (H, B, D): b_h(i)
    change = scale * torch.einsum("bhn,bnhd,bnhe->bhde", p["A"], p["spread"],
                                  _inverse(k, rotary, length - 1))  # E_h, keys turned back by the query's rotation
    m = torch.einsum("hdD,bhde,heE->bDE", t["out"], change, t["query"][0]) * t["gamma"]
    m = _apply_s(kind, m, w_last[:, None, :])  # times S_i from the right (S symmetric)
    own = torch.einsum("hbD,hbE->bDE", a_last, b_last) + m / sigma_last[:, None, None]
    return own.pow(2).sum((-1, -2))


def block_sums(weights: _Layer, x, *, heads: int, scale: float, bias=None, window=None, rotary=None,
               projected=None):
    """``(B, 2)`` float64: ``sum_j ||J^V_ij||_F`` and ``sum_j ||J^P_ij||_F`` at ``i = N - 1`` (module docstring).

    `x` the block input ``(B, N, D)``; `bias` ``(H, N)`` the ALiBi bias in
    logit units or None; `window` the sliding window or None; `rotary` the
    model's ``(cos, sin)`` ``(B, N, r)`` or None; `projected` the model's own
    ``(q, k, v)`` ``(B, N, H, d)`` (after the projections' biases, before any
    rotation), or None to project here. Computed in float64 for a float64
    input, else in float32 (the precision of the model's own pass).
    """
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    t, kind = weights.at(dtype), weights.kind
    x = x.to(dtype)
    width = x.shape[-1]
    xhat, sigma = _normed(t, kind, x)
    if projected is None:
        n = t["gamma"] * xhat + t["beta"]
        q_last = _project(t["query"], n[:, -1])  # (B, H, d)
        k, v = _project(t["key"], n), _project(t["value"], n)  # (B, N, H, d)
        del n
    else:
        q_last, k, v = projected[0][:, -1].to(dtype), projected[1].to(dtype), projected[2].to(dtype)
    w = xhat.div_(math.sqrt(width))  # w_j = xhat_j / sqrt(D), in place: xhat is not read again
    key_w = (k - t["key_shift"]) / math.sqrt(width)  # W_K^h (gamma . w_j), before any rotation
    if rotary is not None:
        cos, sin = (r.to(dtype) for r in rotary)
        q_last = _turn(q_last[:, None], cos[:, -1:], sin[:, -1:])[:, 0]
        k = _turn(k, cos, sin)
    probabilities = _probabilities(q_last, k, scale, bias, window)  # (B, H, N)
    vbar = torch.einsum("bhn,bnhd->bhd", probabilities, v)
    p = {"A": probabilities, "spread": v - vbar[:, None], "centre": vbar - t["value_shift"], "key_w": key_w,
         "w": w, "w2": w.pow(2).sum(-1), "sigma": sigma, "q": q_last}
    value_sq, probability_sq, a, gamma_y = _key_terms(t, kind, p, scale=scale, rotary=rotary)
    value_sq = value_sq / sigma.pow(2)
    batch = x.shape[0]
    a_last, gamma_y_last = (z.reshape(heads, batch, -1, width)[:, :, -1] for z in (a, gamma_y))
    probability_sq[:, -1] = _own_square(t, kind, p, k, a_last, gamma_y_last, scale=scale, rotary=rotary)
    sums = [value_sq.clamp(min=0).sqrt().double().sum(-1), probability_sq.clamp(min=0).sqrt().double().sum(-1)]
    return torch.stack(sums, dim=-1)


class ForwardPaths:
    """The per-block weights of one model and run, and hooks that form the path sums from each block's input.

    Args:
        model: the loaded model (`unsupported` must be None for it).
        resolved: its modules (`layer_maps.resolve`).
        length: the run's sequence length (the model's N, sinks included).
        falcon_alibi: Falcon's bias once or doubled (`attention_rows.key_bias`).
    """

    def __init__(self, model, resolved, length: int, falcon_alibi: str = "once"):
        self.resolved = resolved
        self.scale = float(resolved.layer_map.logit_scale(model.config, resolved.head_dim))
        bias = key_bias(model, resolved, length, falcon_alibi)
        self.bias = None if bias is None else bias.to(next(model.parameters()).device)
        self.layers = [_layer(block, resolved, t) for t, block in enumerate(resolved.blocks)]
        self.rotary = resolved.layer_map.position == "rope"

    def sums(self, layer: int, x, kwargs, projected=None) -> torch.Tensor:
        """``(B, 2)`` value and probability sums of block `layer` from its input `x`, call keywords and (q, k, v)."""
        rotary = kwargs.get("position_embeddings") if self.rotary else None
        if self.rotary and rotary is None:
            raise RuntimeError(f"block {layer} got no position_embeddings: the forward route needs (cos, sin)")
        with torch.no_grad():
            return block_sums(self.layers[layer], x.detach(), heads=self.resolved.num_heads, scale=self.scale,
                              bias=self.bias, window=self.resolved.windows[layer], rotary=rotary,
                              projected=projected)

    def _projected(self, outputs) -> tuple:
        """The model's ``(q, k, v)`` ``(B, N, H, d)`` from the hooked outputs of the q/k module(s) and the value module."""
        resolved, layer_map = self.resolved, self.resolved.layer_map
        parts = outputs["query_key"]
        q, k = layer_map.split(parts[0] if len(parts) == 1 else tuple(parts), resolved.num_heads,
                               resolved.head_dim, resolved.config)
        v = layer_map.value_split(outputs["value"], resolved.num_heads, resolved.head_dim, resolved.config)
        return q, k, v

    def hooks(self, deliver, recording=lambda: True) -> list:
        """Hooks on every block calling ``deliver(layer, sums (B, 2))``; the handles (remove them).

        A pre-hook keeps the block's input and keywords, forward hooks its
        q/k and value modules' outputs (the model's own projections, not
        recomputed), and the block's forward hook forms the sums; only while
        `recording()` (a checkpointed replay does not count twice).
        """
        pending = {}

        def enter(layer):
            def hook(module, args, kwargs):
                if recording():
                    x = args[0] if args else kwargs["hidden_states"]
                    count = len(self.resolved.query_keys[layer])
                    pending[layer] = {"x": x.detach(), "kwargs": kwargs, "query_key": [None] * count}
            return hook

        def keep(layer, index):
            def hook(module, args, output):
                if layer in pending:
                    output = (output[0] if isinstance(output, tuple) else output).detach()
                    if index is None:
                        pending[layer]["value"] = output
                    else:
                        pending[layer]["query_key"][index] = output
            return hook

        def leave(layer):
            def hook(module, args, output):
                entry = pending.pop(layer, None)
                if entry is not None:
                    deliver(layer, self.sums(layer, entry["x"], entry["kwargs"], self._projected(entry)))
            return hook

        handles = []
        for t, block in enumerate(self.resolved.blocks):
            handles.append(block.register_forward_pre_hook(enter(t), with_kwargs=True))
            for index, module in enumerate(self.resolved.query_keys[t]):
                handles.append(module.register_forward_hook(keep(t, index)))
            handles.append(block.get_submodule(self.resolved.layer_map.value).register_forward_hook(keep(t, None)))
            handles.append(block.register_forward_hook(leave(t)))
        return handles


def forward_paths(model, token_ids, *, falcon_alibi: str = "once") -> np.ndarray:
    """``(S, 4, L)`` float64: per sequence and block, ``sqrt(D)``, ``sum_j ||J^V||``, ``sum_j ||J^P||`` and NaN (MLP).

    One forward pass without gradients over `token_ids` ``(S, N)``, the
    sums formed from each block's input (module docstring); the model as
    loaded (eval mode, its attention implementation). For a model where
    `unsupported` gives a reason, use `jaxroll.measure.path_stats.measure_paths`.
    """
    from .hooks import Hooks, forward_then_remove
    from .layer_maps import resolve
    from .precision import frozen_eval, full_precision

    ids = np.asarray(token_ids)
    resolved = resolve(model)
    width = int(getattr(model.config, resolved.layer_map.hidden_size))
    found = {}
    falcon = resolved.layer_map.name == "falcon" and getattr(model.config, "_attn_implementation", "eager") in (
        None, "eager") and falcon_alibi == "once"
    with frozen_eval(model), full_precision(model), Hooks(resolved, model.config, zero_falcon_alibi=falcon):
        paths = ForwardPaths(model, resolved, ids.shape[1], falcon_alibi)
        forward_then_remove(model, ids, paths.hooks(lambda layer, sums: found.__setitem__(layer, sums.cpu().numpy())))
    sums = np.stack([found[t] for t in range(len(resolved.blocks))], axis=-1)  # (S, 2, L)
    identity = np.full((ids.shape[0], 1, sums.shape[-1]), math.sqrt(width))
    return np.concatenate([identity, sums, np.full_like(identity, np.nan)], axis=1)
