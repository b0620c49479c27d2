"""Refined rollouts, the measured half: the ingredients the predicted half composes.

The predicted half is `jaxroll.theory.refinements` (JAX, no torch): it turns
these ingredients into a refined rollout and its profile.

Forward hooks (and, for ``gradient``, tensor hooks on the backward pass) on
the modules of a Hugging Face causal LM's `LayerMap`. For a model with L
blocks, H heads of dimension d, sequences of N tokens, and per block t:
``x`` the residual stream entering the block, ``a`` the attention
sub-layer's output (the output projection's, bias included), ``m`` the
MLP's output (its down projection's), ``alpha_h (N, N)`` head h's attention
probabilities, ``v_h(j)`` its value vector at j (after the value
projection, so it includes the input norm ``LN(x_j)`` and the projection's
bias), ``W_O^h`` the columns of the output projection that read head h:

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
  head's output norm, the mean over positions and sequences;
- ``lambda_gradient (L,)``: the share of the gradient that block t's
  sub-layers add beside the residual path. With ``f`` the top next-token
  probability at the last position (the target of the measured influence),
  ``g_x(j) = df/dx(j)`` (block input) and ``g_a(j) = df/da(j)`` (attention
  output; for a sequential block it is the gradient at the residual stream
  after attention, ``x + a``, which the identity path hands to ``x``
  unchanged, while ``g_x - g_a`` is what the attention path carries back
  through ``a(LN(x))``):
  ``lambda_gradient = 1 - sum_j ||g_a(j)|| / sum_j ||g_x(j)||`` per
  sequence, then averaged (0 where no gradient arrives). The rollout keeps
  a share ``1 - lambda_t`` of the mass on the identity path; here that share
  is the residual path's gradient norm against the total gradient norm at
  the block input. It is negative where the attention path cancels part of
  the residual gradient (`jaxroll.theory.refinements.compose` clips it to [0, 1]);
- ``head_norms_positions (L, H, N)``: ``||W_O^h context_h(i)||`` per query
  position i, the mean over sequences (its mean over i is ``head_norms``);
- ``input_norm_gains (L, N)``: ``c_t(j)``, the mean over sequences of
  ``1 / sigma_t(j)``, the gain of the norm in front of block t's attention
  at position j (LayerNorm: ``sigma = sqrt(var(x_j) + eps)``, RMSNorm: the
  RMS of ``x_j`` with eps), read by a hook on that norm's input
  (`jaxroll.measure.norm_gains`; 1 where the attention reads ``x`` without
  a norm, as in OLMo 2).

Two ways to get them: `measure_refinements` (sums per group of sequences,
for in- and out-of-sample checks; ingredients named by the switches of
`jaxroll.theory.refinements.SWITCHES`), and the statistics registered with
`jaxroll.measure.measure` under `STATISTICS` (``jaxroll measure --stats
lambda,influence,attention_heads,lambda_positions,...``), which write the
same arrays into ``measurement.npz``; `refined_profile` turns a measurement
directory into the profile of any switch combination, and
`refined_rows_from_arrays` a measurement's arrays into its rows at query positions. Everything is
accumulated in float64. Families: every `jaxroll.measure.families.FAMILIES` entry. Where an RMSNorm
follows W_O (Gemma 2/3, OLMo 2: ``a_i = g * o_i / r_i``, `post_norm_gain`), head h's output is
``g * W_O^h context_h(i) / r_i`` (``head_norms``) and ``n_h(j) = ||g * W_O^h v_h(j)||``
(``norm_kernels``: ``1 / r_i`` is one factor per row).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..errors import ConfigError
from .layer_maps import LayerMap, resolve
from .norm_gains import input_gains, input_norm_module, norm_kind, post_norm_gain
from .registry import Shapes, Statistic, register_statistic

__all__ = ["INGREDIENTS", "STATISTICS", "RefinementIngredients", "measure_refinements", "time_ingredients",
           "refined_profile", "ingredients_from_arrays", "refined_from_arrays", "refined_rows_from_arrays"]

INGREDIENTS = ("position", "mlp", "norm", "heads", "gradient", "head_positions", "input_norm")
"""What `measure_refinements` can measure, by switch: ``position`` -> lambda_positions, ``mlp`` ->
lambda_mlp_positions, ``norm`` -> norm_kernels, ``heads`` -> head_norms, ``gradient`` ->
lambda_gradient (one backward pass more), ``head_positions`` -> head_norms_positions, ``input_norm`` ->
input_norm_gains. ``attention_heads`` is always measured."""

STATISTICS = {"attention_heads": "attention_heads", "lambda_positions": "lambda_positions",
              "lambda_mlp": "lambda_mlp_positions", "norm_kernels": "norm_kernels", "head_norms": "head_norms",
              "lambda_gradient": "lambda_gradient", "head_norms_positions": "head_norms_positions",
              "input_norm_gains": "input_norm_gains"}
"""The ``--stats`` names registered with `jaxroll.measure.measure` -> the array each writes into
``measurement.npz`` (the means defined in the module docstring). ``lambda_gradient`` needs
``influence`` (it reads that statistic's backward pass)."""

_OUTPUT = {"attention": "attention_heads", "position": "lambda_positions", "mlp": "lambda_mlp_positions",
           "norm": "norm_kernels", "heads": "head_norms", "gradient": "lambda_gradient",
           "head_positions": "head_norms_positions", "input_norm": "input_norm_gains"}
_SWITCH_OF_STAT = {"attention_heads": "attention", "lambda_positions": "position", "lambda_mlp": "mlp",
                   "norm_kernels": "norm", "head_norms": "heads", "lambda_gradient": "gradient",
                   "head_norms_positions": "head_positions", "input_norm_gains": "input_norm"}

def _module(root, path):
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _output_matrix(module, num_heads, head_dim):
    # W_O as (hidden_out, H, d): nn.Linear stores (out, in); GPT-2's Conv1D stores (in, out).
    weight = module.weight.detach().double()
    if type(module).__name__ == "Conv1D":
        weight = weight.T
    return weight.reshape(weight.shape[0], num_heads, head_dim)


def _attach(resolved, switches, deliver, recording=lambda: True, alpha_hooks: bool = True) -> list:
    """Register the hooks `switches` need (``attention``: alpha alone); they call ``deliver(kind, layer, value, row=b)``.

    Kinds (per sequence, float64 CPU tensors): ``alpha (H, N, N)``, ``x, a,
    m (N,)`` norms, ``value_norms (H, N)`` = ``||W_O^h v_h(j)||``,
    ``head_outputs (H, N)`` = ``||W_O^h context_h(i)||``, ``grad_x, grad_a
    (N, D)``, ``input_gain (N,)`` = ``1 / sigma(j)`` of the attention input
    norm. Forward hooks deliver only while `recording()` (activation
    checkpointing runs a block's forward again during the backward); the
    gradient hooks are registered in the recorded forward and fire once.
    A batch of B sequences delivers each row b separately (``row=b``).
    ``alpha_hooks=False``: alpha comes from rows recomputed from q and k
    (`_alpha_rows`), so no hook reads the model's probabilities.
    Returns the handles.
    """
    layer_map = resolved.layer_map
    refused = [switch for switch in switches if _OUTPUT.get(switch) in layer_map.refused
               or (switch in ("norm", "heads", "head_positions") and layer_map.value is None)
               or (switch == "mlp" and not layer_map.mlp_output)]
    if refused:
        reason = layer_map.refused.get(_OUTPUT[refused[0]], "its layer map names no value or MLP module")
        raise ConfigError(f"architecture: {layer_map.name!r} cannot give {_OUTPUT[refused[0]]}: {reason}")
    hooks = _Hooks(resolved, deliver, recording)
    handles = []
    try:
        for layer, block in enumerate(resolved.blocks):
            _attach_layer(hooks, resolved, layer, block, set(switches), alpha_hooks, handles)
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    return handles


def _attach_layer(hooks: "_Hooks", resolved, layer: int, block, switches: set, alpha_hooks: bool, handles: list):
    """Register the hooks of one block that `switches` need, appending their handles to `handles`."""
    layer_map = resolved.layer_map
    projection = resolved.output_projections[layer]
    if {"attention", "norm"} & switches and alpha_hooks:
        handles.append(resolved.attentions[layer].register_forward_hook(hooks.probabilities(layer)))
    if {"position", "mlp"} & switches:
        handles.append(block.register_forward_pre_hook(hooks.norms("x", layer, pre=True), with_kwargs=True))
        handles.append(projection.register_forward_hook(hooks.norms("a", layer)))
    if "mlp" in switches:
        handles.append(_module(block, layer_map.mlp_output).register_forward_hook(hooks.norms("m", layer)))
    if {"norm", "heads", "head_positions"} & switches:
        w_module = _module(block, layer_map.w_out) if layer_map.w_out else projection
        w_out = _output_matrix(w_module, hooks.heads, hooks.head_dim)
        post = None
        if projection is not w_module:  # a norm after W_O (Gemma 2/3, OLMo 2): an RMSNorm, checked
            gain, eps = post_norm_gain(projection, w_out.shape[0], layer_map.name)
            bias = getattr(w_module, "bias", None)
            post = (gain.to(w_out.device), eps,
                    0.0 if bias is None else bias.detach().double().to(w_out.device))
        if "norm" in switches:
            # n_h(j) = ||g * W_O^h v_h(j)||: the norm's 1 / r_i is one factor per row, gone in K's row sum.
            w_value = w_out if post is None else post[0][:, None, None] * w_out
            handles.append(_module(block, layer_map.value).register_forward_hook(hooks.value_norms(layer, w_value)))
        if {"heads", "head_positions"} & switches:
            handles.append(w_module.register_forward_pre_hook(hooks.head_outputs(layer, w_out, post)))
    if "input_norm" in switches:
        norm = input_norm_module(block, layer_map, resolved.config)
        hidden = int(getattr(resolved.config, layer_map.hidden_size))
        kind, eps = (None, 0.0) if norm is None else norm_kind(norm, hidden, layer_map.name)
        handles.append((norm or block).register_forward_pre_hook(hooks.gains(layer, kind, eps), with_kwargs=True))
    if "gradient" in switches:
        handles.append(block.register_forward_pre_hook(hooks.gradient("grad_x", layer, pre=True), with_kwargs=True))
        handles.append(projection.register_forward_hook(hooks.gradient("grad_a", layer)))


def _hooked_tensor(hook_args, pre: bool):
    """The tensor a hook reads: a pre-hook with kwargs gets (args, kwargs), a forward hook (args, output)."""
    if pre:
        args, kwargs = hook_args
        return args[0] if args else kwargs["hidden_states"]
    return hook_args[1]


class _Hooks:
    """Factories of the hooks `_attach` registers; each hook calls ``deliver(kind, layer, value, row=b)``
    per sequence b of the batch, and forward hooks only while ``recording()``."""

    def __init__(self, resolved, deliver, recording):
        self.deliver, self.recording = deliver, recording
        self.layer_map, self.config = resolved.layer_map, resolved.config
        self.heads, self.head_dim = resolved.num_heads, resolved.head_dim
        self.batch_rows = 1  # sequences in the pass, from the block input (OPT's MLP sees (B N, D))

    def probabilities(self, layer):
        def hook(module, args, output):
            if not self.recording():
                return
            p = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if p is None:
                raise ConfigError("attention: no probabilities; allowed: a model loaded with attn_implementation='eager'")
            for row in range(p.shape[0]):
                self.deliver("alpha", layer, p[row].detach().double().cpu(), row=row)
        return hook

    def norms(self, kind, layer, pre=False):
        def hook(module, *hook_args):
            if not self.recording():
                return
            tensor = _hooked_tensor(hook_args, pre)
            if tensor.dim() == 2:  # OPT's MLP runs on (B N, D): split it by the batch's block input
                tensor = tensor.reshape(self.batch_rows, -1, tensor.shape[-1])
            elif kind == "x":
                self.batch_rows = tensor.shape[0]
            norms = tensor.detach().double().norm(dim=-1).cpu()
            for row in range(norms.shape[0]):
                self.deliver(kind, layer, norms[row], row=row)
        return hook

    def value_norms(self, layer, w_out):
        import torch

        def hook(module, args, output):
            if self.recording():
                for row in range(output.shape[0]):
                    values = self.layer_map.value_split(output[row: row + 1].detach().double(), self.heads,
                                                        self.head_dim, self.config)[0]
                    # n_h(j) = ||W_O^h v_h(j)||: (N, H, d) x (D, H, d) -> (H, N)
                    self.deliver("value_norms", layer,
                                 torch.einsum("nhd,ohd->hno", values, w_out).norm(dim=-1).cpu(), row=row)
        return hook

    def head_outputs(self, layer, w_out, post):
        import torch

        def hook(module, args):
            if self.recording():
                for row in range(args[0].shape[0]):
                    context = args[0][row].detach().double()
                    context = context.reshape(context.shape[0], self.heads, self.head_dim)
                    outputs = torch.einsum("nhd,ohd->hno", context, w_out)  # W_O^h context_h(i): (H, N, D)
                    if post is not None:  # g * W_O^h context_h(i) / r_i, r_i = RMS of the whole W_O output
                        gain, eps, bias = post
                        total = outputs.sum(0) + bias
                        scale = torch.sqrt((total * total).mean(-1) + eps)  # (N,)
                        outputs = gain * outputs / scale[None, :, None]
                    self.deliver("head_outputs", layer, outputs.norm(dim=-1).cpu(), row=row)
        return hook

    def gains(self, layer, kind, eps):
        import torch

        def hook(module, *hook_args):
            if not self.recording():
                return
            tensor = _hooked_tensor(hook_args, pre=True)
            # no norm in front of the attention (OLMo 2): it reads x_j as it is, gain 1
            values = torch.ones(tensor.shape[:-1], dtype=torch.float64) if kind is None \
                else input_gains(tensor, kind, eps).cpu()
            for row in range(values.shape[0]):
                self.deliver("input_gain", layer, values[row], row=row)
        return hook

    def gradient(self, kind, layer, pre=False):
        def hook(module, *hook_args):
            if not self.recording():
                return
            tensor = _hooked_tensor(hook_args, pre)
            if tensor.requires_grad:
                tensor.register_hook(self.rows_of(kind, layer))
        return hook

    def rows_of(self, kind, layer):
        def on_gradient(grad):
            for row in range(grad.shape[0]):
                self.deliver(kind, layer, grad[row].detach().double().cpu(), row=row)
        return on_gradient


def _ratio(numerator, denominator):
    # 0/0 (a zero stream and zero updates) counts as no mixing.
    import torch

    safe = torch.where(denominator > 0, denominator, 1.0)
    return torch.where(denominator > 0, numerator / safe, 0.0).numpy()


def _rows(seen: dict, layers: int, switches) -> dict[str, np.ndarray]:
    """One sequence's ingredients (module docstring) from what `_attach` delivered, stacked over layers."""
    import torch

    out = {}
    if "attention" in switches:
        out["attention_heads"] = np.stack([seen[("alpha", t)].numpy() for t in range(layers)])
    if "position" in switches:
        out["lambda_positions"] = np.stack([_ratio(seen[("a", t)], seen[("x", t)] + seen[("a", t)])
                                            for t in range(layers)])
    if "mlp" in switches:
        out["lambda_mlp_positions"] = np.stack([
            _ratio(seen[("a", t)], seen[("x", t)] + seen[("a", t)] + seen[("m", t)]) for t in range(layers)])
    if "norm" in switches:
        kernels = []
        for t in range(layers):
            alpha = seen[("alpha", t)]
            weighted = alpha * seen[("value_norms", t)][:, None, :]
            total = weighted.sum(-1, keepdim=True)
            kernels.append(torch.where(total > 0, weighted / torch.where(total > 0, total, 1.0), alpha).numpy())
        out["norm_kernels"] = np.stack(kernels)
    if "heads" in switches:
        out["head_norms"] = np.stack([seen[("head_outputs", t)].mean(-1).numpy() for t in range(layers)])
    if "head_positions" in switches:
        out["head_norms_positions"] = np.stack([seen[("head_outputs", t)].numpy() for t in range(layers)])
    if "input_norm" in switches:
        out["input_norm_gains"] = np.stack([seen[("input_gain", t)].numpy() for t in range(layers)])
    if "gradient" in switches:
        shares = []
        for t in range(layers):
            if ("grad_x", t) not in seen or ("grad_a", t) not in seen:
                raise ConfigError(f"lambda_gradient: block {t} got no gradient; allowed: a pass with the "
                                  "influence backward (stats including influence)")
            residual = seen[("grad_a", t)].norm(dim=-1).sum()
            total = seen[("grad_x", t)].norm(dim=-1).sum()
            shares.append(float(1.0 - residual / total) if total > 0 else 0.0)
        out["lambda_gradient"] = np.asarray(shares)
    return out


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
    lambda_gradient: np.ndarray | None = None
    head_norms_positions: np.ndarray | None = None
    input_norm_gains: np.ndarray | None = None

    def mean(self, groups=None) -> dict[str, np.ndarray]:
        """Means over the sequences of `groups` (default: all): a dict of the present ingredients."""
        groups = np.arange(self.counts.size) if groups is None else np.atleast_1d(groups)
        count = self.counts[groups].sum()
        if count == 0:
            raise ConfigError("groups: no sequences in the selected groups; allowed: groups with sequences")
        out = {}
        for field in _OUTPUT.values():
            value = getattr(self, field)
            if value is not None:
                out[field] = value[groups].sum(axis=0) / count
        return out


def _target(logits):
    # f = the top next-token probability at the last position (the measured influence's target).
    import torch

    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.softmax(logits.to(dtype), dim=-1).max()


def measure_refinements(model, token_ids, *, ingredients=INGREDIENTS, groups=None,
                        layer_map: LayerMap | None = None) -> RefinementIngredients:
    """Measure the refinement ingredients of `model` on `token_ids` ``(S, N)``.

    `model` must use eager attention (its attention module returns the
    probabilities) and be of a family in `jaxroll.measure.families.FAMILIES`. `groups` ``(S,)`` integer labels 0..G-1 (default: one group).
    One forward pass per sequence; with ``gradient`` a forward and a
    backward (of the top next-token probability at the last position).
    Returns sums per group (`RefinementIngredients`); ``seconds`` is the wall
    time of the passes.
    """
    import torch

    from .precision import frozen_eval, full_precision  # torch is loaded here, not when the statistic registers

    ingredients = tuple(dict.fromkeys(ingredients))
    unknown = [item for item in ingredients if item not in INGREDIENTS]
    if unknown:
        raise ConfigError(f"ingredients: got {unknown[0]!r}; allowed: a subset of {', '.join(INGREDIENTS)}")
    resolved = resolve(model, layer_map)
    token_ids = np.asarray(token_ids, dtype=np.int64)
    if token_ids.ndim != 2:
        raise ConfigError(f"token_ids: got shape {token_ids.shape}; allowed: (S, N)")
    num_sequences, n = token_ids.shape
    groups = np.zeros(num_sequences, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if groups.shape != (num_sequences,) or groups.min() < 0:
        raise ConfigError(f"groups: got shape {groups.shape}; allowed: ({num_sequences},) labels >= 0")
    num_groups = int(groups.max()) + 1
    layers = len(resolved.blocks)
    seen = {}
    switches = ("attention", *ingredients)
    # One sequence per pass here: every delivery is row 0.
    handles = _attach(resolved, switches, lambda kind, layer, value, row=0: seen.__setitem__((kind, layer), value))
    sums = {}
    backward = "gradient" in ingredients
    try:
        with frozen_eval(model):  # only the embeddings need gradients
            started = time.perf_counter()
            for index, row in enumerate(token_ids):
                seen.clear()
                ids = torch.as_tensor(row, device=model.get_input_embeddings().weight.device)[None]
                with torch.set_grad_enabled(backward), full_precision(model):  # float64 models: float64 throughout
                    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(backward)
                    logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, -1]
                    if backward:
                        torch.autograd.grad(_target(logits), embeddings)
                for key, value in _rows(seen, layers, switches).items():
                    sums.setdefault(key, np.zeros((num_groups, *value.shape)))[groups[index]] += value
            seconds = time.perf_counter() - started
    finally:
        for handle in handles:
            handle.remove()
    counts = np.bincount(groups, minlength=num_groups)
    return RefinementIngredients(counts=counts, seconds=seconds, attention_heads=sums["attention_heads"],
                                 **{field: sums.get(field) for field in _OUTPUT.values() if field != "attention_heads"})


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


# ----------------------------------------------------------------------------- jaxroll measure --stats


def _alpha_rows(state, layer, start, rows):
    # Chunks of one sequence's recomputed rows (1, H, c, N) -> alpha (H, N, N) once complete.
    rows = rows[0]
    heads, count, n = rows.shape
    buffer = state.setdefault(("alpha_rows", layer), rows.new_zeros((heads, n, n)))
    buffer[:, start:start + count] = rows
    if start + count == n:
        state[("alpha", layer)] = state.pop(("alpha_rows", layer)).cpu()


def _statistic(stat: str) -> Statistic:
    switch = _SWITCH_OF_STAT[stat]
    output = _OUTPUT[switch]
    switches = (switch,)

    def allocate(shape: Shapes) -> dict:
        size = {"attention_heads": (shape.heads, shape.length, shape.length), "lambda_positions": (shape.length,),
                "lambda_mlp_positions": (shape.length,), "norm_kernels": (shape.heads, shape.length, shape.length),
                "head_norms": (shape.heads,), "lambda_gradient": (),
                "head_norms_positions": (shape.heads, shape.length), "input_norm_gains": (shape.length,)}[output]
        return {f"{output}_sum": np.zeros((shape.layers, *size))}

    def attach(resolved, deliver, recording, recomputed=False):
        return _attach(resolved, switches, deliver, recording, alpha_hooks=not recomputed)

    def observe(state, kind, layer, value):
        state[(kind, layer)] = value

    def accumulate(sums, state, index):
        layers = sums[f"{output}_sum"].shape[0]
        sums[f"{output}_sum"] += _rows(state, layers, switches)[output]

    def finish(sums, count, shape):
        return {output: sums[f"{output}_sum"] / count}

    def memory(shape: Shapes) -> int:
        return 8 * int(np.prod(next(iter(allocate(shape).values())).shape))

    return Statistic(name=stat, hooks=(), allocate=allocate, observe=observe, accumulate=accumulate, finish=finish,
                     needs_eager=switch in ("attention", "norm"), memory=memory, attach=attach,
                     observe_rows=_alpha_rows if switch in ("attention", "norm") else None,
                     requires=("influence",) if switch == "gradient" else ())


for _name in STATISTICS:
    register_statistic(_statistic(_name))


def ingredients_from_arrays(arrays: dict) -> dict[str, np.ndarray]:
    """The ingredient means `jaxroll.theory.refinements.compose` reads, from the arrays of ``measurement.npz``.

    ``lambdas`` is the measured ``lambda_t``; ``attention_heads`` as measured,
    or, without it, the head-averaged ``attention_mean (L, N, N)`` as one
    head (the same rollout while heads are weighted uniformly); the other
    ingredients as the registered statistics wrote them.
    """
    out = {name: np.asarray(arrays[name]) for name in _OUTPUT.values() if name in arrays}
    if "lambdas" in arrays:
        out["lambdas"] = np.asarray(arrays["lambdas"])
    if "attention_heads" not in out and "attention_mean" in arrays:
        out["attention_heads"] = np.asarray(arrays["attention_mean"])[:, None]
    return out


def refined_profile(directory, switches=()) -> np.ndarray:
    """The refined rollout's profile ``(N,)`` of the switches `switches` from a ``jaxroll measure --out`` directory.

    Needs in ``measurement.npz``: ``lambdas`` (stat ``lambda``) unless a
    switch replaces it, ``attention_heads`` or ``attention_mean`` (stat
    ``attention``; ``heads`` needs ``attention_heads``), and the stat of each
    switch (`jaxroll.theory.refinements.STATS_FOR`). Raises `ConfigError` naming the
    missing stat.
    """
    from .outputs import read_measurement

    arrays, _ = read_measurement(directory)
    return refined_from_arrays(arrays, switches)


def refined_from_arrays(arrays, switches=()) -> np.ndarray:
    """The refined profile ``(N,)`` of `switches` from the arrays of a measurement, computed in float64.

    The measured sums are float64; the rollout runs under ``jax.enable_x64``
    whatever the process's setting, so the profile is not rounded to float32
    on the way (which moves it by about 1e-8 and its sum off 1 by about 1e-7).
    """
    import jax

    from ..theory import refinements

    with jax.enable_x64(True):
        return np.asarray(refinements.refined_influence(_composed(arrays, switches)), dtype=np.float64)


def refined_rows_from_arrays(arrays, switches, queries) -> np.ndarray:
    """Rows ``P_T[q_k, :]`` ``(K, N)`` of the refined rollout of `switches`, float64, from a measurement's arrays.

    `queries`: as `jaxroll.theory.rows.query_positions` takes them (``jaxroll
    measure --queries`` stores them as ``query_positions``). Computed under
    ``jax.enable_x64`` like `refined_from_arrays`; the last row ``N - 1`` is
    its profile.
    """
    import jax

    from ..theory.rows import predicted_rows

    with jax.enable_x64(True):
        return predicted_rows(_composed(arrays, switches), queries)


def _composed(arrays, switches):
    # The RefinedRollout of `switches` (call under jax.enable_x64: create() builds float64 arrays).
    from ..theory import refinements

    ingredients = ingredients_from_arrays(arrays)
    if {"heads", "head_positions"} & set(switches) and "attention_heads" not in arrays and "norm" not in switches:
        ingredients.pop("attention_heads", None)  # heads needs the measured heads, not the mean as one head
    return refinements.compose(ingredients, switches)
