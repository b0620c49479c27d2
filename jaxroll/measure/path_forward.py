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

Cost per block and sequence: the norm, the key and value projections of the
N positions and the query at i (``2 N D H d``), the head-wise vectors
``a, b (N, H, D)`` (``3 N H d D``), their Gram matrices (``2 N H^2 D``) and
the ``D x D`` term at ``j = i``: about a projection's work, in float64,
with no backward pass and nothing ``N x N``; it runs inside the measurement's
hooked pass on every sequence (`ForwardPaths.hooks`).

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

from .attention_rows import key_bias, rotate

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
    """One block's weights in float64: per query head (a grouped key or value repeated), as in the module doc."""

    kind: str  # "layer" or "rms"
    gamma: torch.Tensor  # (D,)
    beta: torch.Tensor  # (D,)
    eps: float
    query: tuple  # (W (H d, D), b (H d,))
    key: tuple
    value: tuple
    out: torch.Tensor  # (D, H d): the output projection's matrix
    gram: torch.Tensor  # (H, H): K
    value_u: torch.Tensor  # (H d,): W_V (gamma . u) (LayerNorm; zeros for RMSNorm)


def _affine(modules, pick, width, dtype, device):
    """``(W (H d, D), b (H d,))`` of a linear map read from its modules as ``f(I) - f(0)`` and ``f(0)``."""
    with torch.no_grad():
        basis = torch.eye(width, dtype=dtype, device=device)[None]
        zero = torch.zeros(1, 1, width, dtype=dtype, device=device)
        # .forward, not the call: the measurement's hooks on these modules must not see these inputs
        images, offsets = (pick(tuple(module.forward(x) for module in modules)) for x in (basis, zero))
        bias = offsets.reshape(-1).double()
        matrix = images[0].reshape(width, -1).double() - bias  # (D, H d)
    return matrix.T.contiguous(), bias


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
    eps = float(norm.eps if kind == "layer" else norm.variance_epsilon)
    query_key = resolved.query_keys[layer]
    split = (lambda outputs: layer_map.split(outputs[0] if len(outputs) == 1 else outputs, heads, head_dim, config))
    query = _affine(query_key, lambda outputs: split(outputs)[0], width, dtype, device)
    key = _affine(query_key, lambda outputs: split(outputs)[1], width, dtype, device)
    value_module = block.get_submodule(layer_map.value)
    value = _affine((value_module,), lambda outputs: layer_map.value_split(outputs[0], heads, head_dim, config),
                    width, dtype, device)
    w_out = block.get_submodule(layer_map.w_out or layer_map.output_projection)
    out = _affine((w_out,), lambda outputs: outputs[0], heads * head_dim, dtype, device)[0]  # (D, H d)
    out_heads = out.reshape(width, heads, head_dim)  # W_O^h = out_heads[:, h]
    value_heads = (value[0] * gamma).reshape(heads, head_dim, width)  # W_V^h Gamma
    # K_hh' = tr(W_O^h'^T W_O^h W_V^h Gamma^2 W_V^h'^T)
    outer = torch.einsum("Dga,Dhb->hgab", out_heads, out_heads)  # [h, h'] = W_O^h'^T W_O^h, indices (a, b)
    inner = torch.einsum("hbD,gaD->hgba", value_heads, value_heads)  # [h, h'] = W_V^h G^2 W_V^h'^T, (b, a)
    gram = torch.einsum("hgab,hgba->hg", outer, inner)
    value_u = value[0] @ gamma / math.sqrt(width) if kind == "layer" else torch.zeros_like(value[1])
    return _Layer(kind, gamma, beta, eps, query, key, value, out, gram, value_u)


def _normed(weights: _Layer, x):
    """``(n, w, sigma)``: the norm's output, ``w = xhat / sqrt(D)`` and sigma, each ``(B, N, .)`` float64."""
    centred = x - x.mean(-1, keepdim=True) if weights.kind == "layer" else x
    sigma = (centred.pow(2).mean(-1, keepdim=True) + weights.eps).sqrt()
    xhat = centred / sigma
    return weights.gamma * xhat + weights.beta, xhat / math.sqrt(x.shape[-1]), sigma


def _project(weights: _Layer, parts, n, heads):
    matrix, bias = parts
    out = n @ matrix.T + bias
    return out.reshape(*out.shape[:-1], heads, -1)


def _apply_s(weights: _Layer, y, w):
    """``S y`` for ``y (B, N, H, D)`` and ``w (B, N, D)``: ``y - u (u . y) - w (w . y)`` (RMSNorm: no u term)."""
    out = y - w[:, :, None, :] * (y * w[:, :, None, :]).sum(-1, keepdim=True)
    if weights.kind == "layer":
        out = out - y.mean(-1, keepdim=True)  # u (u . y) with u = 1 / sqrt(D)
    return out


def _probabilities(q_last, k, scale, bias, window):
    """``A (B, H, N)``: row i = N - 1 of the softmax of ``s q_i . k_j + b_h(j)`` (window: ``i - j < W``)."""
    logits = scale * torch.einsum("bhd,bnhd->bhn", q_last, k)
    if bias is not None:
        logits = logits + bias[None]
    if window is not None:
        length = k.shape[1]
        logits = logits.masked_fill(torch.arange(length, device=k.device) <= length - 1 - window, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _inverse(x, rotary, positions):
    """``R_j^T x`` for ``x (B, n, H, d)``, j running over `positions` (a slice of n) or one position for all n."""
    if rotary is None:
        return x
    cos, sin = (t.double() for t in rotary)
    if isinstance(positions, int):
        cos, sin = (t[:, positions:positions + 1].expand(-1, x.shape[1], -1) for t in (cos, sin))
    else:
        cos, sin = cos[:, positions], sin[:, positions]
    return rotate(x, cos, -sin)


CHUNK_BYTES = 16 * 2**20
"""Float64 bytes of the probability path's per-key vectors ``a, b (B, c, H, D)`` and their work, per chunk of keys."""


def _key_terms(weights: _Layer, probabilities, spread, q_last, w, sigma, *, scale, rotary):
    """``(||sum_h a_h(j) b_h(j)^T||_F^2 (B, N), a(N - 1), b(N - 1) (B, H, D))``, keys in chunks (`CHUNK_BYTES`)."""
    batch, length, width = w.shape
    heads = probabilities.shape[1]
    out_heads = weights.out.reshape(width, heads, -1)
    key_heads = weights.key[0].reshape(heads, -1, width)
    chunk = max(1, CHUNK_BYTES // (8 * 6 * batch * heads * width))  # a, b, their sources and products
    squares = []
    for start in range(0, length, chunk):
        part = slice(start, min(length, start + chunk))
        weighted = probabilities[:, :, part].transpose(1, 2)[..., None]  # (B, c, H, 1)
        a = torch.einsum("Dhd,bnhd->bnhD", out_heads, weighted * spread[:, part])
        turned = _inverse(q_last[:, None].expand(-1, part.stop - start, -1, -1), rotary, part)  # R_j^T q_i
        b = _apply_s(weights, scale * torch.einsum("hdD,bnhd->bnhD", key_heads, turned) * weights.gamma, w[:, part])
        b = b / sigma[:, part, None]
        squares.append((torch.einsum("bnhD,bngD->bnhg", a, a) * torch.einsum("bnhD,bngD->bnhg", b, b)).sum((-1, -2)))
    return torch.cat(squares, dim=1), a[:, -1], b[:, -1]


def _value_squares(weights: _Layer, probabilities, w, sigma):
    """``||J^V_ij||_F^2 (B, N)``: ``(A^T K A - |G gamma.u|^2 - (2 - |w|^2) |G gamma.w|^2) / sigma^2`` (module doc)."""
    batch, length, _ = w.shape
    heads = probabilities.shape[1]
    weighted = probabilities.transpose(1, 2)[..., None]  # (B, N, H, 1)
    trace = torch.einsum("bhn,hg,bgn->bn", probabilities, weights.gram, probabilities)
    through_w = weighted * ((weights.gamma * w) @ weights.value[0].T).reshape(batch, length, heads, -1)
    squares = trace - (2 - w.pow(2).sum(-1)) * (through_w.reshape(batch, length, -1) @ weights.out.T).pow(2).sum(-1)
    if weights.kind == "layer":
        through_u = weighted * weights.value_u.reshape(heads, -1)
        squares = squares - (through_u.reshape(batch, length, -1) @ weights.out.T).pow(2).sum(-1)
    return squares / sigma[..., 0].pow(2)


def _own_square(weights: _Layer, probabilities, spread, k, a_last, b_last, w_last, sigma_last, *, scale, rotary):
    """``||J^P_ii||_F^2 (B,)``: the key's term plus the query's, ``M Gamma S_i / sigma_i`` (module doc), as D x D."""
    heads, length = probabilities.shape[1:]
    width = w_last.shape[-1]
    change = scale * torch.einsum("bhn,bnhd,bnhe->bhde", probabilities, spread,
                                  _inverse(k, rotary, length - 1))  # E_h, keys turned back by the query's rotation
    query_heads = weights.query[0].reshape(heads, -1, width)
    m = torch.einsum("Dhd,bhde,heE->bDE", weights.out.reshape(width, heads, -1), change, query_heads) * weights.gamma
    m = m - (m @ w_last[..., None]) * w_last[:, None, :]  # times S_i from the right
    if weights.kind == "layer":
        m = m - m.mean(-1, keepdim=True)
    own = torch.einsum("bhD,bhE->bDE", a_last, b_last) + m / sigma_last[:, :, None]
    return own.pow(2).sum((-1, -2))


def block_sums(weights: _Layer, x, *, heads: int, scale: float, bias=None, window=None, rotary=None):
    """``(B, 2)`` float64: ``sum_j ||J^V_ij||_F`` and ``sum_j ||J^P_ij||_F`` at ``i = N - 1`` (module docstring).

    `x` the block input ``(B, N, D)``; `bias` ``(H, N)`` the ALiBi bias in
    logit units or None; `window` the sliding window or None; `rotary` the
    model's ``(cos, sin)`` ``(B, N, r)`` or None.
    """
    x = x.double()
    batch, length, width = x.shape
    n, w, sigma = _normed(weights, x)
    q_last = _project(weights, weights.query, n[:, -1], heads)  # (B, H, d)
    k, v = _project(weights, weights.key, n, heads), _project(weights, weights.value, n, heads)  # (B, N, H, d)
    if rotary is not None:
        cos, sin = (t.double() for t in rotary)
        q_last = rotate(q_last[:, None], cos[:, -1:], sin[:, -1:])[:, 0]
        k = rotate(k, cos, sin)
    probabilities = _probabilities(q_last, k, scale, bias, window)  # (B, H, N)
    value_sq = _value_squares(weights, probabilities, w, sigma)
    # Probability path: sum_hh' (a_h . a_h')(b_h . b_h').
    spread = v - torch.einsum("bhn,bnhd->bhd", probabilities, v)[:, None]  # v_j - vbar_i
    probability_sq, a_last, b_last = _key_terms(weights, probabilities, spread, q_last, w, sigma, scale=scale,
                                                rotary=rotary)
    probability_sq[:, -1] = _own_square(weights, probabilities, spread, k, a_last, b_last, w[:, -1], sigma[:, -1],
                                        scale=scale, rotary=rotary)
    return torch.stack([value_sq.clamp(min=0).sqrt().sum(-1), probability_sq.clamp(min=0).sqrt().sum(-1)], dim=-1)


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

    def sums(self, layer: int, x, kwargs) -> torch.Tensor:
        """``(B, 2)`` value and probability sums of block `layer` from its input `x` and call keywords."""
        rotary = kwargs.get("position_embeddings") if self.rotary else None
        if self.rotary and rotary is None:
            raise RuntimeError(f"block {layer} got no position_embeddings: the forward route needs (cos, sin)")
        with torch.no_grad():
            return block_sums(self.layers[layer], x.detach(), heads=self.resolved.num_heads, scale=self.scale,
                              bias=self.bias, window=self.resolved.windows[layer], rotary=rotary)

    def hooks(self, deliver, recording=lambda: True) -> list:
        """Forward pre-hooks on every block calling ``deliver(layer, sums (B, 2))``; the handles (remove them)."""
        def hook(layer):
            def pre_hook(module, args, kwargs):
                if recording():
                    deliver(layer, self.sums(layer, args[0] if args else kwargs["hidden_states"], kwargs))
            return pre_hook
        return [block.register_forward_pre_hook(hook(t), with_kwargs=True)
                for t, block in enumerate(self.resolved.blocks)]


def forward_paths(model, token_ids, *, falcon_alibi: str = "once") -> np.ndarray:
    """``(S, 4, L)`` float64: per sequence and block, ``sqrt(D)``, ``sum_j ||J^V||``, ``sum_j ||J^P||`` and NaN (MLP).

    One forward pass without gradients over `token_ids` ``(S, N)``, the
    sums formed from each block's input (module docstring); the model as
    loaded (eval mode, its attention implementation). For a model where
    `unsupported` gives a reason, use `jaxroll.measure.path_stats.measure_paths`.
    """
    from .hooks import Hooks
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
        handles = paths.hooks(lambda layer, sums: found.__setitem__(layer, sums.cpu().numpy()))
        try:
            with torch.no_grad():
                device = model.get_input_embeddings().weight.device
                model(input_ids=torch.as_tensor(ids, dtype=torch.long, device=device), use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
    sums = np.stack([found[t] for t in range(len(resolved.blocks))], axis=-1)  # (S, 2, L)
    identity = np.full((ids.shape[0], 1, sums.shape[-1]), math.sqrt(width))
    return np.concatenate([identity, sums, np.full_like(identity, np.nan)], axis=1)
