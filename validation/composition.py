"""The composition test (issue 53, deliver 2): is today's error in the layer model or in how layers compose?

    PYTHONPATH=. python3 validation/composition.py --models validation/models/wave5 --out RUN [--samples 32] [--force]

For each model of ``--models`` (``bloom-trained``, ``llama-trained``; ``held_out.jsonl``), on the first
``--samples`` held-out sequences of N = 64 tokens, in float64:

- **measured end-to-end influence** ``m``: ``jaxroll measure --dtype float64`` (``||d f / d e_j||``, f the top
  next-token probability at the last position, normalised, mean over sequences weighted by mass), with its
  bootstrap noise (`jaxroll.measure.uncertainty.score`, 1000 resamples, seed 0);
- **today's prediction**: ``jaxroll rollout`` of that measurement's ``config.yaml`` (measured lambda_t and
  kernel: BLOOM the ALiBi slopes with measured content, Llama the measured mean attention; its paths composed
  with the exponent q that ``jaxroll measure`` fitted), and the same transitions composed linearly
  (``today, q = 1``);
- **each block's full local Jacobian norm** ``M_t^s(i, j) = ||d h'_i / d h_j||_F`` for every i, j and every
  sequence s (`local_influence`), and its paths (`jaxroll.measure.paths.layer_paths` at ``--path-queries``
  query rows);
- **the norm of the product** ``H^s(j) = ||d h_L[N-1] / d h_0[j]||_F`` (`end_to_end`): the block stack's own
  Jacobian, ``J_L ... J_1`` summed over paths before the norm is taken.

The local influence is rolled out like the rollout: the last row of ``M_L ... M_1`` (layer 1 acts first,
`compose_last_row`), in two normalisations (`row_normalise`):

- ``rows``: ``Mn_t(i, j) = M_t(i, j) / sum_j' M_t(i, j')``, each row summing to 1 like ``R_t = (1 - lambda_t) I
  + lambda_t A_t``: what composes is the *share* of row i's local influence that comes from j, as in the
  rollout; the per-row magnitude (norm gains 1/sigma, MLP gain) is discarded;
- ``norms``: ``M_t`` as measured (magnitudes kept), the last row normalised once at the end (a factor per
  layer cancels there): ``(M_L ... M_1)(N-1, j) = sum_paths prod_t ||J_t||_F``, the product of norms, which
  bounds the norm of the product entrywise, ``H^s(j) <= (M_L^s ... M_1^s)(N-1, j)`` (triangle inequality
  and submultiplicativity; checked on every sequence);
- ``norms, per sequence, q = 1.5`` and ``q = 2``: the same products of norms with the paths added in the q-norm
  (`compose_in_power`), as the rollout with a composition exponent adds them (``q = 2``: in quadrature).

Compared by W1 / noise against ``m``, so that the error splits into steps that change one thing each:

    today (R_t, product of means) -> local influence Mn_t replacing R_t (the layer model) -> per-sequence
    products instead of the product of means -> products of norms -> the norm of the product (composition)
    -> the measured gradient of f (the readout: final norm, unembedding, the target's direction).

Writes ``results.json``, ``table.md``, ``profiles.csv`` and ``composition.png`` into ``--out`` (the
measurements under ``--out/<family>/``). The run and what it means: docs/validation.md, "The composition
test" (S = 32: 24 min of wall time on the shared 2-core machine at load 10-14, most of it the local Jacobians).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

FAMILIES = ("bloom", "llama")
STATS = {"bloom": "lambda,content,influence", "llama": "lambda,attention,influence"}
"""What ``jaxroll measure`` measures for today's prediction (as validation/interventions.py, without offsets)."""
LENGTH = 64
PATHS = ("identity", "value", "probability", "mlp")


# ---------------------------------------------------------------- the composition (NumPy, float64)

def row_normalise(matrices) -> np.ndarray:
    """``Mn(i, j) = M(i, j) / sum_j' M(i, j')`` over the last axis: each row sums to 1, shape as given ``(..., N, N)``.

    Raises:
        ValueError: a negative or non-finite entry, or a row summing to 0.
    """
    matrices = np.asarray(matrices, dtype=np.float64)
    if not np.all(np.isfinite(matrices)) or np.any(matrices < 0):
        raise ValueError("matrices: allowed: finite, non-negative entries")
    sums = matrices.sum(-1, keepdims=True)
    if np.any(sums <= 0):
        raise ValueError("matrices: a row sums to 0; allowed: every row with a positive entry")
    return matrices / sums


def compose_last_row(layers, row: int = -1) -> np.ndarray:
    """``e_row^T M_L ... M_1``: row `row` of the product of the layers, layer 1 (index 0) acting first.

    The rollout's order (``P_T = R_T ... R_1``, profile = its last row). `layers` is ``(..., L, N, N)``
    (leading axes, e.g. sequences, are kept); returns ``(..., N)``, not normalised.
    """
    layers = np.asarray(layers, dtype=np.float64)
    n = layers.shape[-1]
    vector = np.zeros(layers.shape[:-3] + (n,))
    vector[..., row % n] = 1.0
    for t in reversed(range(layers.shape[-3])):
        vector = np.einsum("...i,...ij->...j", vector, layers[..., t, :, :])
    return vector


POWERS = (1.5, 2.0)
"""The exponents the composition test adds the paths' products of norms in, beside q = 1."""


def pooled_profile(rows) -> np.ndarray:
    """``sum_s r_s / sum_{s, j} r_s[j]`` for rows ``(S, N)``: sequences weigh by their mass, as the measured profile."""
    rows = np.asarray(rows, dtype=np.float64)
    return rows.sum(0) / rows.sum()


def compose_in_power(layers, q: float) -> np.ndarray:
    """``(e_{N-1}^T M_L^{∘q} ... M_1^{∘q})^{1/q}``: the paths' products of norms added in the q-norm, ``(..., N)``.

    q = 1 is `compose_last_row` (paths add linearly, the bound on the norm of the product); q = 2 adds them in
    quadrature, the expected norm when the paths' vectors are independent and centred (design.md, "How paths
    compose"; `jaxroll.RolloutModel.composition`).
    """
    return compose_last_row(np.asarray(layers, dtype=np.float64) ** q) ** (1.0 / q)


def composed_profiles(local, transitions=None) -> dict[str, np.ndarray]:
    """The rolled-out local influence ``(N,)`` profiles, by name, from ``local (S, L, N, N)`` = ``M_t^s``.

    ``rows, product of means``: last row of ``prod_t rownorm(mean_s M_t^s)``; ``norms, product of means``: of
    ``prod_t mean_s M_t^s``; ``rows, per sequence``: mean over s of each ``prod_t rownorm(M_t^s)``'s last row
    (each sums to 1); ``norms, per sequence``: `pooled_profile` of each ``prod_t M_t^s``'s last row;
    ``norms, per sequence, q = Q``: the same with the paths added in the Q-norm (`compose_in_power`), Q in
    `POWERS`. With `transitions` ``(L, N, N)`` (today's ``R_t``), also ``R_t -> Mn_t at layer t`` for each t.
    """
    local = np.asarray(local, dtype=np.float64)
    mean = local.mean(0)
    out = {"rows, product of means": _normalised(compose_last_row(row_normalise(mean))),
           "norms, product of means": _normalised(compose_last_row(mean)),
           "rows, per sequence": compose_last_row(row_normalise(local)).mean(0),
           "norms, per sequence": pooled_profile(compose_last_row(local)),
           **{f"norms, per sequence, q = {q:g}": pooled_profile(compose_in_power(local, q)) for q in POWERS}}
    if transitions is not None:
        for t in range(local.shape[1]):
            swapped = np.array(transitions, dtype=np.float64)
            swapped[t] = row_normalise(mean[t])
            out[f"R_t -> Mn_t at layer {t + 1}"] = _normalised(compose_last_row(swapped))
    return out


def _normalised(vector):  # a profile: sums to 1
    return vector / vector.sum()


# ---------------------------------------------------------------- the measurements (torch)

def _checked_blocks(model):
    from jaxroll import ConfigError
    from jaxroll.measure.layer_maps import resolve

    blocks = resolve(model).blocks
    for block in blocks:
        # u = h + a feeds both the MLP's norm and the residual: the block is sequential, pre-LN.
        if getattr(block, "apply_residual_connection_post_layernorm", False) or \
                not hasattr(block, "post_attention_layernorm"):
            raise ConfigError.of("model", type(block).__name__,
                                 "a sequential pre-LN block with post_attention_layernorm (BLOOM, Llama)")
    return blocks


def _split_forward(model, blocks, ids, split_mlp: bool = True, leaves=None) -> list[dict]:
    """One forward in which block t reads a fresh leaf ``h`` and (`split_mlp`) its MLP branch a fresh leaf ``v``.

    ``u = h + a(h)`` (the residual after attention) is what the post-attention norm reads; with `split_mlp`
    the norm reads ``v`` (a detached copy of u) while the residual still adds u, so the block output is
    ``h' = u(h) + m(v)``: ``d u / d h`` is the attention sub-layer's local Jacobian with its identity and
    ``d h' / d v`` the MLP branch's, and ``d h' / d h = (I + J_m) d u / d h`` exactly (v = u). `leaves`:
    the blocks whose input becomes a leaf (default all); the others keep the graph from the one before.
    """
    import torch

    from jaxroll.measure.precision import full_precision

    leaves = range(len(blocks)) if leaves is None else leaves
    records = [dict() for _ in blocks]
    handles = []

    def enter(t):
        def hook(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            if t in leaves:
                h = h.detach().requires_grad_(True)
            records[t]["h"] = h
            return ((h,) + tuple(args[1:]), kwargs) if args else (args, dict(kwargs, hidden_states=h))
        return hook

    def middle(t):
        def hook(module, args):
            records[t]["u"] = args[0]
            records[t]["v"] = args[0].detach().requires_grad_(True)
            return (records[t]["v"],) + tuple(args[1:])
        return hook

    def leave(t):
        def hook(module, args, output):
            records[t]["out"] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    for t, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(enter(t), with_kwargs=True))
        handles.append(block.register_forward_hook(leave(t)))
        if split_mlp:
            handles.append(block.post_attention_layernorm.register_forward_pre_hook(middle(t)))
    try:
        with torch.enable_grad(), full_precision(model):
            model(input_ids=torch.as_tensor(np.asarray(ids), dtype=torch.long), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return records


def _row_norms(output, source, position: int, vectors):
    """``||d output[s, position] / d source[s, j]||_F`` ``(S, n)`` from the cotangents `vectors` ``(R, S, D)``.

    Row r of the Jacobian for every j at once is one backward pass from ``vectors[r] . output[:, position]``
    (vmapped over r); the squared norm sums over r and the source's features.
    """
    import torch

    cotangents = torch.zeros((vectors.shape[0],) + tuple(output.shape), dtype=output.dtype)
    cotangents[:, :, position, :] = vectors
    (grads,) = torch.autograd.grad(output, source, grad_outputs=cotangents, is_grads_batched=True,
                                   retain_graph=True)
    return grads.pow(2).sum((0, 3)).sqrt()


def _mlp_factors(model, blocks, ids) -> list:
    """``C_t[s, i] = I + d m(v_i) / d v_i`` ``(S, N, D, D)`` per block: the MLP branch is position-wise, so
    one backward from ``e_r`` at every position gives row r at every position."""
    import torch

    records = _split_forward(model, blocks, ids)
    width = records[0]["h"].shape[-1]
    eye = torch.eye(width, dtype=records[0]["h"].dtype)
    factors = []
    for record in records:
        cotangents = eye[:, None, None, :].expand((width,) + tuple(record["out"].shape))
        (grads,) = torch.autograd.grad(record["out"], record["v"], grad_outputs=cotangents,
                                       is_grads_batched=True, retain_graph=True)
        factors.append((grads.permute(1, 2, 0, 3) + eye).detach())
    return factors


def local_influence(model, token_ids, batch: int = 8) -> np.ndarray:
    """``M_t^s(i, j) = ||d h'_i / d h_j||_F`` of every block t, sequence s, query i and key j: ``(S, L, N, N)``.

    ``J_t(i, j) = (I + J_m(i)) d u_i / d h_j`` (`_split_forward`): the rows of ``C_t(i) = I + J_m(i)``
    (`_mlp_factors`) are the cotangents at u_i, so D backward passes through the attention sub-layer
    give row i for every j. Query i runs on the first i + 1 tokens (the model is causal: the block
    inputs at positions <= i are those of the whole sequence). Float64 NumPy.
    """
    blocks = _checked_blocks(model)
    ids = np.asarray(token_ids)
    count, n = ids.shape
    out = np.zeros((count, len(blocks), n, n))
    for start in range(0, count, batch):
        chunk = ids[start:start + batch]
        factors = _mlp_factors(model, blocks, chunk)
        for query in range(n):
            records = _split_forward(model, blocks, chunk[:, :query + 1])
            for t, record in enumerate(records):
                vectors = factors[t][:, query].permute(1, 0, 2)  # (D, S, D): rows of C_t(query)
                norms = _row_norms(record["u"], record["h"], query, vectors)
                out[start:start + len(chunk), t, query, :query + 1] = norms.detach().numpy()
    return out


def direct_local_influence(model, token_ids, query: int) -> np.ndarray:
    """``||d h'_query / d h_j||_F`` ``(S, L, N)`` straight from each block's output (no factorisation):
    the check of `local_influence`. D backward passes per block, each block's input a fresh leaf."""
    import torch

    blocks = _checked_blocks(model)
    records = _split_forward(model, blocks, token_ids, split_mlp=False)
    width = records[0]["h"].shape[-1]
    basis = torch.eye(width, dtype=records[0]["h"].dtype)[:, None, :].expand(width, len(token_ids), width)
    return np.stack([_row_norms(r["out"], r["h"], query, basis).detach().numpy() for r in records], axis=1)


def end_to_end(model, token_ids, batch: int = 8) -> np.ndarray:
    """``H^s(j) = ||d h_L[N-1] / d h_0[j]||_F`` ``(S, N)``: the norm of the product of the blocks' Jacobians
    (h_0 the first block's input, h_L the last block's output, before the final norm)."""
    import torch

    blocks = _checked_blocks(model)
    ids = np.asarray(token_ids)
    rows = []
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        records = _split_forward(model, blocks, chunk, split_mlp=False, leaves=(0,))
        width = records[0]["h"].shape[-1]
        basis = torch.eye(width, dtype=records[0]["h"].dtype)[:, None, :].expand(width, len(chunk), width)
        rows.append(_row_norms(records[-1]["out"], records[0]["h"], ids.shape[1] - 1, basis).detach().numpy())
    return np.concatenate(rows)


def sampled_paths(model, token_ids, queries) -> dict[str, np.ndarray]:
    """`jaxroll.measure.paths.layer_paths` at each query q on the first q + 1 tokens (causal: the same
    block inputs, half the work on average): ``{path: (L, K, N)}`` means over sequences, 0 beyond q."""
    from jaxroll.measure.paths import layer_paths

    ids = np.asarray(token_ids)
    out = {name: np.zeros((len(_checked_blocks(model)), len(queries), ids.shape[1])) for name in PATHS}
    for k, query in enumerate(queries):
        paths = layer_paths(model, ids[:, :query + 1], queries=[query])
        for name in PATHS:
            out[name][:, k, :query + 1] = getattr(paths, name)[:, 0]
    return out


# ---------------------------------------------------------------- today's rollout and its ingredients

def quiet_cli(argv) -> None:
    """``jaxroll ARGV`` in this process, its stdout kept out of the log; an error raised."""
    from jaxroll.cli import main as cli

    with contextlib.redirect_stdout(io.StringIO()) as captured:
        code = cli([str(a) for a in argv])
    if code != 0:
        raise RuntimeError(f"jaxroll {' '.join(map(str, argv))}: exit {code}\n{captured.getvalue()}")


def measure_and_roll_out(family: str, models: Path, out: Path, samples: int):
    """``jaxroll measure`` (float64) then ``jaxroll rollout`` of its config.yaml: (arrays, today's profile, config path)."""
    from jaxroll.io import read_profile

    measured, rolled = out / family / "measurement", out / family / "rollout"
    quiet_cli(["measure", models / f"{family}-trained", "--texts", models / "held_out.jsonl", "--length", LENGTH,
               "--samples", samples, "--dtype", "float64", "--stats", STATS[family], "--out", measured,
               "--quiet", "--force"])
    quiet_cli(["rollout", measured / "config.yaml", "--out", rolled, "--float64", "--no-figure", "--json", "--force"])
    with np.load(measured / "measurement.npz", allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    return arrays, read_profile(rolled / "profile.csv"), measured / "config.yaml"


def todays_transitions(config_path: Path, n: int) -> tuple[np.ndarray, float]:
    """Today's ``R_t = (1 - lambda_t) I + lambda_t A_t`` ``(L, N, N)`` of the measured configuration, and the
    exponent q its rollout composes them with (config.yaml's ``composition``, 1 without it)."""
    import jaxroll
    from jaxroll.rollout import transition

    model = jaxroll.load_config(config_path)
    q = 1.0 if model.composition is None else float(model.composition)
    return np.stack([np.asarray(transition(model, t, n), dtype=np.float64) for t in range(model.num_layers)]), q


def sequence_transitions(model, token_ids, lambdas) -> dict[str, np.ndarray]:
    """Per sequence ``R_t^s = (1 - lambda_t^s) I + lambda_t^s A_t^s`` ``(S, L, N, N)`` (A the head mean, lambda
    the mean over positions, `jaxroll.measure.refinements`), the mean-attention ``R_t`` ``(L, N, N)`` with
    the measured `lambdas`, and the gradient share ``lambda_gradient`` ``(S, L)``."""
    from jaxroll.measure.refinements import measure_refinements

    ids = np.asarray(token_ids)
    per = measure_refinements(model, ids, ingredients=("position", "gradient"), groups=np.arange(len(ids)))
    counts = per.counts[:, None, None, None]
    attention = per.attention_heads.mean(axis=2) / counts  # (S, L, N, N): sums over a group of one
    mixing = (per.lambda_positions / per.counts[:, None, None]).mean(-1)  # (S, L)
    eye = np.eye(ids.shape[1])
    per_sequence = (1 - mixing)[..., None, None] * eye + mixing[..., None, None] * attention
    mean = (1 - lambdas)[:, None, None] * eye + np.asarray(lambdas)[:, None, None] * attention.mean(0)
    return {"per_sequence": per_sequence, "mean_attention": mean, "mixing": mixing,
            "lambda_gradient": per.lambda_gradient / per.counts[:, None]}


# ---------------------------------------------------------------- per-layer ingredients

def layer_rows(local, paths, queries, lambdas, lambda_gradient, transitions) -> list[dict]:
    """Per layer: lambda_t, the gradient share, the mixing ``1 - R(i, i)`` of today's R_t and of the local
    influence ``1 - Mn(i, i)`` (last row; mean over rows i >= 1), and the path shares of the sum of the
    path norms ``sum_j L_path(q, j)`` (last row; pooled over the sampled rows `queries`), the probability
    path's share of the attention branch, and ``sum_paths / sum_j M(q, j)`` (>= 1: the paths cancel)."""
    mean = np.asarray(local).mean(0)
    rows = []
    for t in range(mean.shape[0]):
        normalised = row_normalise(mean[t])
        row = {"layer": t + 1, "lambda": float(lambdas[t]), "lambda_gradient": float(lambda_gradient[t]),
               "mixing_today_last": float(1 - transitions[t][-1, -1]),
               "mixing_today_mean": float(1 - np.diag(transitions[t])[1:].mean()),
               "mixing_local_last": float(1 - normalised[-1, -1]),
               "mixing_local_mean": float(1 - np.diag(normalised)[1:].mean())}
        for scope, picked in (("last", [len(queries) - 1]), ("pooled", list(range(len(queries))))):
            sums = {name: float(paths[name][t, picked].sum()) for name in PATHS}
            total = sum(sums.values())
            for name in PATHS:
                row[f"{name}_{scope}"] = sums[name] / total
            row[f"probability_of_attention_{scope}"] = sums["probability"] / (sums["value"] + sums["probability"])
            row[f"cancellation_{scope}"] = total / float(mean[t][np.asarray(queries)[picked]].sum())
        rows.append(row)
    return rows


# ---------------------------------------------------------------- one model

CHAIN = ("today (jaxroll rollout)", "R_t, mean attention", "R_t, per sequence", "rows, product of means",
         "norms, product of means", "rows, per sequence", "norms, per sequence", "norm of the product")

STEPS = (("today (jaxroll rollout)", "today, q = 1"), ("today, q = 1", "R_t, mean attention"),
         ("R_t, mean attention", "R_t, per sequence"),
         ("R_t, mean attention", "rows, product of means"), ("rows, product of means", "norms, product of means"),
         ("rows, product of means", "rows, per sequence"), ("norms, product of means", "norms, per sequence"),
         ("norms, per sequence", "norm of the product"), ("norms, per sequence", "norms, per sequence, q = 2"),
         ("norms, per sequence, q = 2", "norm of the product"), ("norm of the product", "measured"))
"""The split: each pair changes one thing (kernel, R_t per sequence, layer model, normalisation, ..., readout)."""


def steps(profiles: dict, noise: float) -> dict[str, float]:
    """``W1(a, b) / noise`` for each pair of `STEPS` (`profiles` by name, ``measured`` included)."""
    from jaxroll.measure.uncertainty import wasserstein

    return {f"{a} -> {b}": float(wasserstein(np.asarray(profiles[a]), np.asarray(profiles[b]))) / noise
            for a, b in STEPS}


def study(family: str, arguments, log) -> dict:
    """Measure, roll out and score one model (module docstring); the profiles, scores, checks and timings."""
    import torch
    import transformers

    from jaxroll.measure.uncertainty import profile_band, score

    seconds = {}
    clock = time.perf_counter()
    arrays, today, config_path = measure_and_roll_out(family, arguments.models, arguments.out, arguments.samples)
    ids, measured = arrays["token_ids"], arrays["influence_per_sequence"]
    n = ids.shape[1]
    seconds["measure and rollout"] = time.perf_counter() - clock
    model = transformers.AutoModelForCausalLM.from_pretrained(
        arguments.models / f"{family}-trained", dtype=torch.float64, attn_implementation="eager").eval()
    for parameter in model.parameters():  # gradients with respect to hidden states only
        parameter.requires_grad_(False)
    clock = time.perf_counter()
    local = local_influence(model, ids)
    seconds["local Jacobians"] = time.perf_counter() - clock
    clock = time.perf_counter()
    direct = direct_local_influence(model, ids[:4], n - 1)
    stack = end_to_end(model, ids)
    seconds["checks and end to end"] = time.perf_counter() - clock
    clock = time.perf_counter()
    queries = [int(q) for q in np.linspace(n - 1, 0, arguments.path_queries, endpoint=False)[::-1].round()]
    paths = sampled_paths(model, ids, queries)
    seconds["paths"] = time.perf_counter() - clock
    clock = time.perf_counter()
    sequences = sequence_transitions(model, ids, arrays["lambdas"])
    transitions, q = todays_transitions(config_path, n)
    profiles = {"today (jaxroll rollout)": np.asarray(today, dtype=np.float64),
                "today, q = 1": _normalised(compose_last_row(transitions)),
                "R_t, mean attention": _normalised(compose_last_row(sequences["mean_attention"])),
                "R_t, per sequence": compose_last_row(sequences["per_sequence"]).mean(0),
                **composed_profiles(local, transitions), "norm of the product": pooled_profile(stack)}
    scores = {name: score(profile, measured, B=arguments.boots, seed=0) for name, profile in profiles.items()}
    noise = scores[CHAIN[0]].noise
    products = compose_last_row(local)  # (S, N): sum over paths of the product of norms
    checks = {
        "local vs direct (max abs, last query, 4 sequences)": float(np.abs(direct - local[:4, :, n - 1]).max()),
        "today: product of R_t in the q-norm vs jaxroll rollout (max abs)":
            float(np.abs(_normalised(compose_in_power(transitions, q)) - profiles[CHAIN[0]]).max()),
        "norm of product / product of norms (max over s, j; <= 1)":
            float(np.max(stack / np.where(products > 0, products, np.inf))),
        "mean lambda_positions vs measured lambda (max abs)":
            float(np.abs(sequences["mixing"].mean(0) - arrays["lambdas"]).max())}
    seconds["ingredients and scores"] = time.perf_counter() - clock
    result = {"family": family, "sequences": int(ids.shape[0]), "length": int(n), "path_queries": queries,
              "composition": q,
              "noise": noise, "noise_q95": scores[CHAIN[0]].noise_q95, "n_eff": scores[CHAIN[0]].n_eff,
              "scores": {name: {"w1": s.w1, "ratio": s.ratio, "ratio_interval": list(s.ratio_interval),
                                "p_value": s.p_value} for name, s in scores.items()},
              "steps": steps({**profiles, "measured": pooled_profile(measured)}, noise),
              "layers": layer_rows(local, paths, queries, arrays["lambdas"],
                                   sequences["lambda_gradient"].mean(0), transitions),
              "checks": checks, "seconds": seconds,
              "band": profile_band(measured).tolist(),
              "profiles": {"measured": pooled_profile(measured).tolist(),
                           **{name: np.asarray(p).tolist() for name, p in profiles.items()}}}
    log(f"{family}: " + ", ".join(f"{name} {scores[name].ratio:.2f}" for name in CHAIN) + f"; {seconds}; {checks}")
    return result


# ---------------------------------------------------------------- tables and figure

def split_table(results: dict) -> str:
    """Predictions (rows) by model (columns): W1 / noise [95 % interval], p; then each step's W1 / noise."""
    families = list(results["models"])
    models = results["models"]
    names = list(models[families[0]]["scores"])
    lines = ["| prediction | " + " | ".join(families) + " |", "|---|" + "---:|" * len(families)]
    for name in names:
        cells = []
        for family in families:
            entry = models[family]["scores"][name]
            low, high = entry["ratio_interval"]
            cells.append(f"{entry['ratio']:.2f} [{low:.2f}, {high:.2f}], p = {entry['p_value']:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| noise of the mean [95 % quantile]; n_eff / S | " + " | ".join(
        f"{models[f]['noise']:.4f} [{models[f]['noise_q95']:.4f}]; {models[f]['n_eff']:.1f} / {models[f]['sequences']}"
        for f in families) + " |")
    lines += ["", "| step (W1 between the two predictions / noise) | " + " | ".join(families) + " |",
              "|---|" + "---:|" * len(families)]
    for step in models[families[0]]["steps"]:
        lines.append(f"| {step} | " + " | ".join(f"{models[f]['steps'][step]:.2f}" for f in families) + " |")
    return "\n".join(lines) + "\n"


def layer_table(model: dict) -> str:
    """Per layer: lambda beside the gradient share and the two mixings; path shares; probability's share."""
    lines = ["| layer | lambda_t | gradient share | mixing 1 - R_t(i,i): last; mean | mixing 1 - Mn_t(i,i): last; mean "
             "| identity / value / probability / MLP, last row | same, pooled rows | probability / attention: "
             "last; pooled | sum of paths / full: last; pooled |", "|---:|" + "---:|" * 8]
    for row in model["layers"]:
        shares = [" / ".join(f"{row[f'{name}_{scope}']:.3f}" for name in PATHS) for scope in ("last", "pooled")]
        lines.append(
            f"| {row['layer']} | {row['lambda']:.3f} | {row['lambda_gradient']:.3f} | "
            f"{row['mixing_today_last']:.3f}; {row['mixing_today_mean']:.3f} | "
            f"{row['mixing_local_last']:.3f}; {row['mixing_local_mean']:.3f} | {shares[0]} | {shares[1]} | "
            f"{row['probability_of_attention_last']:.3f}; {row['probability_of_attention_pooled']:.3f} | "
            f"{row['cancellation_last']:.3f}; {row['cancellation_pooled']:.3f} |")
    return "\n".join(lines) + "\n"


SHOWN = (("today (jaxroll rollout)", "tab:blue", "-", "today: jaxroll rollout (R_t, fitted q)"),
         ("rows, product of means", "tab:orange", "-", "local ||dh'/dh||, rows normalised, product of means"),
         ("norms, per sequence", "tab:green", "--", "local ||dh'/dh||, product of norms per sequence"),
         ("norms, per sequence, q = 2", "tab:purple", "-.", "the same, paths added in quadrature (q = 2)"),
         ("norm of the product", "tab:red", ":", "norm of the product of the block Jacobians"))


def figure(results: dict, path: Path) -> Path:
    """One panel per model: the measured profile with its 95 % band, today's prediction and the composed local influence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(results["models"])
    fig, axes = plt.subplots(1, len(families), figsize=(6.2 * len(families), 4.4), constrained_layout=True,
                             squeeze=False)
    for axis, family in zip(axes[0], families):
        model = results["models"][family]
        positions = np.arange(model["length"])
        low, high = np.asarray(model["band"])
        axis.fill_between(positions, low, high, color="0.8", label="measured, 95 % bootstrap band")
        axis.plot(positions, model["profiles"]["measured"], color="black", lw=1.6, label="measured ||df/de_j||")
        for name, colour, style, label in SHOWN:
            ratio = model["scores"][name]["ratio"]
            axis.plot(positions, model["profiles"][name], color=colour, ls=style, lw=1.3,
                      label=f"{label}: W1 = {ratio:.1f} x noise")
        axis.set_yscale("log")
        axis.set_ylim(axis.get_ylim()[0], axis.get_ylim()[1] * 8)  # headroom above the profiles for the legend
        axis.set_xlabel("source position j (query: last, N - 1 = 63)")
        axis.set_ylabel("influence on the last position (sums to 1)")
        axis.set_title(f"{family}-trained, S = {model['sequences']}: measured vs composed local influence")
        axis.legend(fontsize=7.5, loc="upper left")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def profiles_csv(results: dict, path: Path) -> None:
    """Every profile of every model, one column each (``family: name``), one row per position."""
    columns = {f"{family}: {name}": values for family, model in results["models"].items()
               for name, values in model["profiles"].items()}
    rows = ["position," + ",".join(f'"{key}"' for key in columns)]
    length = len(next(iter(columns.values())))
    rows += [f"{j}," + ",".join(f"{values[j]:.12g}" for values in columns.values()) for j in range(length)]
    path.write_text("\n".join(rows) + "\n")


# ---------------------------------------------------------------- command line

def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("validation/models/wave5"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="write into an existing --out")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--samples", type=int, default=32, help="held-out sequences per model (S)")
    parser.add_argument("--path-queries", type=int, default=4, help="query rows at which the paths are split")
    parser.add_argument("--boots", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    return parser.parse_args(argv)


def check(arguments) -> None:
    """Refuse bad arguments before any work and before --out is created."""
    from jaxroll import ConfigError

    families = arguments.families.split(",")
    if not families or any(f not in FAMILIES for f in families):
        raise ConfigError.of("--families", arguments.families, f"a comma-separated subset of {', '.join(FAMILIES)}")
    for family in families:
        if not (arguments.models / f"{family}-trained" / "config.json").is_file():
            raise ConfigError.of("--models", str(arguments.models), f"a folder with {family}-trained/ (saved model)")
    if not (arguments.models / "held_out.jsonl").is_file():  # before any work: the texts are there
        raise ConfigError.of("--models", str(arguments.models), "a folder with held_out.jsonl")
    if arguments.samples < 2 or not 1 <= arguments.path_queries <= LENGTH or arguments.boots < 2:
        raise ConfigError.of("--samples/--path-queries/--boots",
                             (arguments.samples, arguments.path_queries, arguments.boots),
                             f"samples >= 2, 1 <= path-queries <= {LENGTH}, boots >= 2")
    if arguments.out.exists() and any(arguments.out.iterdir()) and not arguments.force:
        raise ConfigError.of("--out", str(arguments.out), "an empty or new folder, or --force")


def main(argv=None) -> int:
    import jax

    from jaxroll import ConfigError

    arguments = parse(argv)
    try:
        check(arguments)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    jax.config.update("jax_enable_x64", True)
    import torch

    torch.set_num_threads(arguments.threads)
    arguments.out.mkdir(parents=True, exist_ok=True)
    log_path = arguments.out / "run.log"

    def log(message):
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        with log_path.open("a") as handle:
            handle.write(line + "\n")

    started = time.perf_counter()
    results = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "models": {}}
    for family in arguments.families.split(","):
        results["models"][family] = study(family, arguments, log)
    results["seconds"] = time.perf_counter() - started
    (arguments.out / "results.json").write_text(json.dumps(results, indent=1))
    tables = [split_table(results)] + [f"\n**{family}**\n\n{layer_table(model)}"
                                       for family, model in results["models"].items()]
    (arguments.out / "table.md").write_text("".join(tables))
    profiles_csv(results, arguments.out / "profiles.csv")
    figure(results, arguments.out / "composition.png")
    log(f"done in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
