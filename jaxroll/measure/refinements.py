"""The measured ingredients of the rollout refinements (`jaxroll.refinements`).

One forward pass per sequence (no backward) of a Hugging Face causal LM with
eager attention, with forward hooks on the modules of its `LayerMap`. For a
model with L blocks, H heads of dimension d, sequences of N tokens, and per
block t: ``x`` the residual stream entering the block, ``a`` the attention
sub-layer's output (the output projection's, bias included), ``m`` the MLP's
output (its down projection's), ``alpha_h (N, N)`` head h's attention
probabilities, ``v_h(j)`` its value vector at j (after the value projection,
so it includes the input norm ``LN(x_j)`` and the projection's bias),
``W_O^h`` the columns of the output projection that read head h:

- ``attention_heads (L, H, N, N)``: ``alpha_h``, the mean over sequences;
- ``lambda_positions (L, N)``: ``||a_i|| / (||x_i|| + ||a_i||)`` per position
  i (0 where both vanish), the mean over sequences. Its mean over i is the
  measured ``lambda_t`` of `jaxroll.measure.measure`;
- ``lambda_mlp_positions (L, N)``: ``||a_i|| / (||x_i|| + ||a_i|| + ||m_i||)``:
  the MLP's update counted with the identity path (it is position-wise, so it
  keeps each token's own information where it is);
- ``norm_kernels (L, H, N, N)``: Kobayashi et al. (EMNLP 2020) per head,
  ``K_h[i, j] = alpha_h[i, j] n_h(j) / sum_k alpha_h[i, k] n_h(k)`` with
  ``n_h(j) = ||W_O^h v_h(j)||``, computed per sequence, then averaged (rows
  whose weighted sum vanishes keep ``alpha_h``'s row);
- ``head_norms (L, H)``: ``mean_i ||W_O^h sum_j alpha_h[i, j] v_h(j)||``, each
  head's output norm, the mean over positions and sequences.

Sums are kept per group of sequences (`groups`, e.g. two halves for an
out-of-sample check), so any union of groups can be formed afterwards.
Everything is accumulated in float64.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from ..errors import ConfigError
from .layer_maps import LayerMap, resolve

__all__ = ["INGREDIENTS", "RefinementIngredients", "measure_refinements", "time_ingredients"]

INGREDIENTS = ("position", "mlp", "norm", "heads")
"""What can be measured: ``position`` -> lambda_positions, ``mlp`` ->
lambda_mlp_positions, ``norm`` -> norm_kernels, ``heads`` -> head_norms.
``attention_heads`` is always measured."""

# Per family: the MLP's output module and where the value vectors are (a
# module path from the block and how to cut (B, N, H, d) out of its output).
_MLP_OUTPUT = {"bloom": "mlp.dense_4h_to_h", "llama": "mlp.down_proj", "mistral": "mlp.down_proj",
               "qwen2": "mlp.down_proj", "gpt2": "mlp.c_proj"}
_VALUE = {"bloom": "self_attention.query_key_value", "llama": "self_attn.v_proj", "mistral": "self_attn.v_proj",
          "qwen2": "self_attn.v_proj", "gpt2": "attn.c_attn"}


def _module(root, path):
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _values(name, output, num_heads, head_dim):
    # -> (N, H, d) float64 value vectors of the first (only) batch row.
    output = output[0].double()
    n = output.shape[0]
    if name == "bloom":  # fused (H, 3, d): q, k, v interleaved per head
        return output.view(n, num_heads, 3, head_dim)[:, :, 2, :]
    if name == "gpt2":  # fused (3, H, d)
        return output[:, 2 * num_heads * head_dim:].reshape(n, num_heads, head_dim)
    values = output.view(n, -1, head_dim)  # separate v_proj; grouped keys/values repeat
    return values.repeat_interleave(num_heads // values.shape[1], dim=1)


def _output_matrix(module, num_heads, head_dim):
    # W_O as (hidden_out, H, d): nn.Linear stores (out, in); GPT-2's Conv1D stores (in, out).
    weight = module.weight.detach().double()
    if type(module).__name__ == "Conv1D":
        weight = weight.T
    return weight.reshape(weight.shape[0], num_heads, head_dim)


@dataclasses.dataclass
class RefinementIngredients:
    """Per-group sums of the refinement ingredients (float64 NumPy).

    ``counts (G,)`` sequences per group; every other array has a leading group
    axis G and holds the SUM over that group's sequences of the per-sequence
    quantity named in the module docstring (absent ingredients are None).
    `mean` turns a selection of groups into means.
    """

    counts: np.ndarray
    attention_heads: np.ndarray
    lambda_positions: np.ndarray | None
    lambda_mlp_positions: np.ndarray | None
    norm_kernels: np.ndarray | None
    head_norms: np.ndarray | None
    seconds: float

    def mean(self, groups=None) -> dict[str, np.ndarray]:
        """Means over the sequences of `groups` (default: all): a dict of the present ingredients."""
        groups = np.arange(self.counts.size) if groups is None else np.atleast_1d(groups)
        count = self.counts[groups].sum()
        if count == 0:
            raise ConfigError("groups: no sequences in the selected groups; allowed: groups with sequences")
        out = {}
        for field in ("attention_heads", "lambda_positions", "lambda_mlp_positions", "norm_kernels", "head_norms"):
            value = getattr(self, field)
            if value is not None:
                out[field] = value[groups].sum(axis=0) / count
        return out


def measure_refinements(model, token_ids, *, ingredients=INGREDIENTS, groups=None,
                        layer_map: LayerMap | None = None) -> RefinementIngredients:
    """Measure the refinement ingredients of `model` on `token_ids` ``(S, N)``.

    `model` must use eager attention (its attention module returns the
    probabilities) and be one of the families BLOOM, Llama, Mistral, Qwen2,
    GPT-2. `groups` ``(S,)`` integer labels 0..G-1 (default: one group).
    Returns sums per group (`RefinementIngredients`); ``seconds`` is the wall
    time of the passes.
    """
    ingredients = tuple(dict.fromkeys(ingredients))
    unknown = [item for item in ingredients if item not in INGREDIENTS]
    if unknown:
        raise ConfigError(f"ingredients: got {unknown[0]!r}; allowed: a subset of {', '.join(INGREDIENTS)}")
    resolved = resolve(model, layer_map)
    name = resolved.layer_map.name
    if name not in _VALUE:
        raise ConfigError(f"architecture: {name!r} has no refinement map; allowed: {', '.join(sorted(_VALUE))}")
    token_ids = np.asarray(token_ids, dtype=np.int64)
    if token_ids.ndim != 2:
        raise ConfigError(f"token_ids: got shape {token_ids.shape}; allowed: (S, N)")
    num_sequences, n = token_ids.shape
    groups = np.zeros(num_sequences, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if groups.shape != (num_sequences,) or groups.min() < 0:
        raise ConfigError(f"groups: got shape {groups.shape}; allowed: ({num_sequences},) labels >= 0")
    num_groups = int(groups.max()) + 1
    layers, heads, head_dim = len(resolved.blocks), resolved.num_heads, resolved.head_dim

    sums = {"attention_heads": np.zeros((num_groups, layers, heads, n, n))}
    if "position" in ingredients:
        sums["lambda_positions"] = np.zeros((num_groups, layers, n))
    if "mlp" in ingredients:
        sums["lambda_mlp_positions"] = np.zeros((num_groups, layers, n))
    if "norm" in ingredients:
        sums["norm_kernels"] = np.zeros((num_groups, layers, heads, n, n))
    if "heads" in ingredients:
        sums["head_norms"] = np.zeros((num_groups, layers, heads))
    need_a = bool({"position", "mlp"} & set(ingredients))
    need_values = "norm" in ingredients
    need_context = "heads" in ingredients
    w_out = [_output_matrix(p, heads, head_dim) for p in resolved.output_projections] \
        if (need_values or need_context) else None

    seen = {}

    def block_input(layer):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            seen[("x", layer)] = x[0].detach().double().norm(dim=-1)
        return hook

    def attention_output(layer):
        def pre(module, args):
            seen[("context", layer)] = args[0][0].detach().double()

        def post(module, args, output):
            seen[("a", layer)] = output[0].detach().double().norm(dim=-1)
        return pre, post

    def mlp_output(layer):
        def hook(module, args, output):
            seen[("m", layer)] = output[0].detach().double().norm(dim=-1)
        return hook

    def value(layer):
        def hook(module, args, output):
            seen[("v", layer)] = _values(name, output.detach(), heads, head_dim)
        return hook

    def probabilities(layer):
        def hook(module, args, output):
            p = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if p is None:
                raise ConfigError("attention: no probabilities; allowed: a model loaded with attn_implementation='eager'")
            seen[("alpha", layer)] = p[0].detach().double()
        return hook

    handles = []
    try:
        for layer, block in enumerate(resolved.blocks):
            handles.append(resolved.attentions[layer].register_forward_hook(probabilities(layer)))
            if need_a:
                handles.append(block.register_forward_pre_hook(block_input(layer), with_kwargs=True))
            if need_a or need_context:
                pre, post = attention_output(layer)
                projection = resolved.output_projections[layer]
                if need_context:
                    handles.append(projection.register_forward_pre_hook(pre))
                if need_a:
                    handles.append(projection.register_forward_hook(post))
            if "mlp" in ingredients:
                handles.append(_module(block, _MLP_OUTPUT[name]).register_forward_hook(mlp_output(layer)))
            if need_values:
                handles.append(_module(block, _VALUE[name]).register_forward_hook(value(layer)))
        was_training = model.training
        model.eval()
        started = time.perf_counter()
        with torch.no_grad():
            for index, row in enumerate(token_ids):
                seen.clear()
                model(input_ids=torch.as_tensor(row)[None], use_cache=False)
                g = groups[index]
                for t in range(layers):
                    alpha = seen[("alpha", t)]
                    sums["attention_heads"][g, t] += alpha.numpy()
                    if need_a:
                        x, a = seen[("x", t)], seen[("a", t)]
                        if "position" in ingredients:
                            sums["lambda_positions"][g, t] += _ratio(a, x + a)
                        if "mlp" in ingredients:
                            sums["lambda_mlp_positions"][g, t] += _ratio(a, x + a + seen[("m", t)])
                    if need_values:
                        # n_h(j) = ||W_O^h v_h(j)||: (N, H, d) x (D, H, d) -> (H, N)
                        norms = torch.einsum("nhd,ohd->hno", seen[("v", t)], w_out[t]).norm(dim=-1)
                        weighted = alpha * norms[:, None, :]
                        total = weighted.sum(-1, keepdim=True)
                        kernel = torch.where(total > 0, weighted / torch.where(total > 0, total, 1.0), alpha)
                        sums["norm_kernels"][g, t] += kernel.numpy()
                    if need_context:
                        context = seen[("context", t)].view(n, heads, head_dim)
                        outputs = torch.einsum("nhd,ohd->hno", context, w_out[t]).norm(dim=-1)  # (H, N)
                        sums["head_norms"][g, t] += outputs.mean(-1).numpy()
        seconds = time.perf_counter() - started
        model.train(was_training)
    finally:
        for handle in handles:
            handle.remove()
    counts = np.bincount(groups, minlength=num_groups)
    return RefinementIngredients(counts=counts, seconds=seconds,
                                 attention_heads=sums["attention_heads"],
                                 lambda_positions=sums.get("lambda_positions"),
                                 lambda_mlp_positions=sums.get("lambda_mlp_positions"),
                                 norm_kernels=sums.get("norm_kernels"), head_norms=sums.get("head_norms"))


def _ratio(numerator, denominator):
    # 0/0 (a zero stream and zero updates) counts as no mixing.
    safe = torch.where(denominator > 0, denominator, 1.0)
    return torch.where(denominator > 0, numerator / safe, 0.0).numpy()


def time_ingredients(model, token_ids, *, repeats: int = 1) -> dict[str, float]:
    """Seconds per sequence of each ingredient measured alone (plus ``attention``: alpha only, the baseline).

    Timing on a shared machine is noisy: compare the entries with each other
    (they are measured in the same process, one after the other), not across runs.
    """
    token_ids = np.asarray(token_ids)
    measure_refinements(model, token_ids[:1])  # warm-up: first-call allocations are not an ingredient's cost
    rows = {}
    for label, selection in [("attention", ())] + [(item, (item,)) for item in INGREDIENTS]:
        best = float("inf")
        for _ in range(repeats):
            best = min(best, measure_refinements(model, token_ids, ingredients=selection).seconds)
        rows[label] = best / token_ids.shape[0]
    return rows
