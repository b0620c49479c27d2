"""The per-sequence-rows prediction of an intervention: each sequence's attention rows changed, averaged, rolled out.

For a Hugging Face causal LM with T blocks and H heads, sequences
``s = 1..S`` of N tokens, and an intervention whose torch patch
(`jaxroll.measure.torch_plan.check`) maps layer t's logits by the
`LogitChange` ``z' = a(i) z_c + c(i) b + d(i, j)`` (z_c the content logit
``s q_i . k_j``, b the model's ALiBi bias in logit units, 0 for rotary and
learned positions):

    log alpha_{t,h}^s[i, j] = z_c + b + r(i)                 (the measured row, r(i) its log normaliser)
    alpha'_{t,h}^s[i, :]    = softmax_j( a(i) (log alpha - b) + c(i) b + d(i, j) )
    A'_t                    = mean_{s,h} alpha'_{t,h}^s       (T, N, N), one kernel per layer
    lambda'_t               = gamma_t lambda_t / (gamma_t lambda_t + 1 - lambda_t)   (the branch scale, else lambda_t)
    p'                      = e_{N-1}^T R'_T ... R'_1 / sum,  R'_t = (1 - lambda'_t) I + lambda'_t A'_t

with ``alpha`` the eager attention probabilities (``alpha[i, j]`` = the
weight with which token i reads token j) and ``lambda_t`` the baseline
measurement's. The row constant ``a(i) r(i)`` cancels in the softmax, so the
changed row is exact at the first layer; later layers' q and k would change
with their inputs, which this holds fixed. The *predicted baseline* is the
same without the change, ``A_t = mean_{s,h} alpha_{t,h}^s`` rolled out with
``lambda_t``: the rollout of the mean kernel (the measured ``attention``
statistic's kernel), not the mean of per-sequence rollouts
(`jaxroll.measure.sequence_rollout`): averaging first is what the
intervention's change of order ("tempering the mean is not the mean of the
tempered rows", docs/interventions.md) is about, and only the rows change.

A rotary rescale (query head h rotated at positions ``p / r_h``, its keys
at their group's first ratio) is no map of the logits: there the changed rows
are recomputed from each layer's hooked q and k, rotated as the patched
attention rotates them (`jaxroll.measure.attention_rows.row_chunks` with the
same `LogitChange`, so tau and the rest apply with it). Sink tokens (a longer
sequence) are refused in one line. Sequences stream in micro-batches of B:
forward hooks turn one layer's ``(B, H, N, N)`` rows into the running sums
``(T, N, N)`` (changed and unchanged) before the next layer runs, so no
``S x T x H x N x N`` array is ever held (`working_bytes`).

**The probability path** (docs/interventions.md, "The probability path's shape"). Given the baseline
measurement's shares ``rho_t = r_t / (1 + r_t)`` (its ``probability_over_value`` r_t), the hooks also keep the
running means of the path weights of the unchanged and the changed rows,
``C_t = mean_{s,h} c(alpha_{t,h}^s)``, ``C'_t = mean_{s,h} c(alpha'_{t,h}^s)`` with
``c(A)_ij = A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)`` (`jaxroll.engine.probability.path_weights`), and
the prediction is the "closed ratio" layer (`with_path_shape` of `moved_shape`):

    P_t      = A_t (.) C'_t / C_t                       (1 where C_t = 0)
    B_t(i,:) = (1 - rho_t) A'_t(i,:) + rho_t sigma_t(i) P_t(i,:) / sum_j P_t(i,j)
    R'_t(i,:) = ((1 - lambda'_t) e_i + lambda'_t B_t(i,:)) / (1 - lambda'_t + lambda'_t sum_j B_t(i,j))

with ``sigma_t(i) = mean_h a_{t,h}(i)`` the change's factor on the content logits (1 / tau; SSMax's
``s ln n_i``; a per-head tau enters head-averaged; 1 for slope scale, kappa, gamma and the rotary ratio, where
only the shape ratio moves). With no change it is today's layer exactly, and the predicted baseline stays the
rollout of the mean kernel. Without shares (a baseline measured without ``paths``) the prediction is the
rollout of ``A'_t`` above.

**The composition exponent.** Where the baseline's config.yaml has a ``composition`` q (`jaxroll measure` fits
it, docs/design.md "How paths compose"), every rollout above, the predicted baseline included, composes its
paths in the q-norm, ``p ∝ (e_{N-1}^T |R_T|^{∘q} ... |R_1|^{∘q})^{1/q}``, as the default route does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["RowPrediction", "row_plan", "predict_rows", "predict_from_measurement", "write_prediction",
           "working_bytes", "rolled_out", "path_rolled_out", "logit_gains", "measured_composition",
           "PROFILE_FILE", "BASELINE_FILE", "CLOSED_RATIO", "ROWS_ONLY"]

PROFILE_FILE = "profile.csv"
"""The predicted profile of the intervened model (``jaxroll effect --predicted``)."""
BASELINE_FILE = "baseline_profile.csv"
"""The predicted profile of the unchanged model (``jaxroll effect --predicted-baseline``)."""
CLOSED_RATIO = "closed ratio"
"""`RowPrediction.form` with the probability path (the baseline measured ``paths``)."""
ROWS_ONLY = "rows"
"""`RowPrediction.form` without it: today's layer on the changed rows."""


@dataclasses.dataclass(frozen=True)
class RowPrediction:
    """What `predict_rows` returns, NumPy float64.

    Attributes:
        profile: ``p' (N,)``, the intervened model's predicted profile (sums to 1).
        baseline: ``p (N,)``, the same without the change (the rollout of the mean kernel).
        lambdas: ``lambda'_t (T,)`` the intervened rollout used (the branch scale applied).
        kernels: ``A'_t (T, N, N)``, the mean changed kernels; baseline_kernels: ``A_t``.
        sequences: S, the sequences averaged.
        form: `CLOSED_RATIO` (with the probability path) or `ROWS_ONLY`.
        rows_profile: ``(N,)`` today's layer on the changed rows (`profile` itself under `ROWS_ONLY`).
        weights, changed_weights: ``C_t``, ``C'_t (T, N, N)``, the mean path weights (None under `ROWS_ONLY`).
        gains: ``sigma_t(i) (T, N)``, the logit gains (None under `ROWS_ONLY`).
    """

    profile: np.ndarray
    baseline: np.ndarray
    lambdas: np.ndarray
    kernels: np.ndarray
    baseline_kernels: np.ndarray
    sequences: int
    form: str = ROWS_ONLY
    rows_profile: np.ndarray | None = None
    weights: np.ndarray | None = None
    changed_weights: np.ndarray | None = None
    gains: np.ndarray | None = None


def row_plan(changes, config):
    """`torch_plan.check` of `changes` against a transformers `config`, refusing what is no map of the rows.

    Raises:
        ConfigError: one line naming the intervention: anything the torch
            patch refuses (a rotary rescale outside the rotary families whose
            rotary module is mapped, among others), sink tokens.
    """
    from .torch_plan import check

    plan = check(changes, config)
    if plan.sinks:
        raise ConfigError.of("--intervene sinks", plan.sinks,
                             "interventions that map the measured rows (tau, slope_scale, ssmax_scale, kappa, "
                             "rotary_ratio, gamma); sink tokens lengthen the sequence: jaxroll rollout --intervene "
                             "sinks=K")
    return plan


def working_bytes(layers: int, heads: int, length: int, batch_size: int) -> int:
    """Peak bytes of `predict_rows` beside the model's own forward: the four running sums ``4 T N^2`` (rows and
    path weights, unchanged and changed) and about six ``(B, H, N, N)`` float64 copies of one layer's rows
    (read, log, changed logits, softmax, mask, path weights)."""
    n2 = int(length) ** 2
    return 8 * (4 * int(layers) * n2 + 6 * int(batch_size) * int(heads) * n2 + 2 * int(layers) * int(length))


def _check_memory(layers: int, heads: int, length: int, batch: int, limit: int | None) -> None:
    """One line naming --batch-size when `working_bytes` exceeds `limit` (default: the memory available)."""
    from .. import memory

    memory.check_fits(working_bytes(layers, heads, length, batch),
                      f"--batch-size {batch}: per-sequence rows of T = {layers}, H = {heads}, N = {length}", limit,
                      allowed="a smaller --batch-size (or --max-memory SIZE to override)")


def rolled_out(lambdas, kernels, composition=None) -> np.ndarray:
    """``e_{N-1}^T R_T ... R_1`` over its sum, ``R_t = (1 - lambda_t) I + lambda_t A_t``: NumPy float64 ``(N,)``
    (`jaxroll.numpy_rollout.influence_with_mass` on the dense kernels ``(T, N, N)``). With a `composition`
    exponent q the paths compose in the q-norm, ``(e_{N-1}^T |R_T|^q ... |R_1|^q)^{1/q}`` over its sum, by the
    engine in float64 (`jaxroll.RolloutModel.composition`)."""
    from ..numpy_rollout import SmallModel, influence_with_mass

    kernels = np.asarray(kernels, dtype=np.float64)
    if composition is not None:
        from ..engine.dense import DenseKernel

        return _engine_profile(DenseKernel.create(kernels), lambdas, kernels.shape[-1], composition)
    model = SmallModel(lambdas=np.asarray(lambdas, dtype=np.float64), sequence_length=kernels.shape[-1],
                       kind="dense", kernels=kernels)
    return influence_with_mass(model)[0]


def logit_gains(plan, layers: int, length: int, windows) -> np.ndarray:
    """``sigma_t(i) = mean_h a_{t,h}(i)`` ``(T, N)`` float64: the change's factor on the content logits per layer
    and row (`LogitChange.terms`' a), head-averaged: ``1 / tau``, SSMax's ``s ln n_i`` (n_i the keys row i
    sees, its window's), 1 where the change leaves the content logits (slope scale, kappa, gamma, rotary ratio)
    or for no change. A per-head tau enters as its heads' mean gain (the closed-ratio layer carries one gain
    per layer and row)."""
    import torch

    gains = np.ones((int(layers), int(length)))
    if plan is None or plan.change is None:
        return gains
    rows = torch.arange(int(length))
    for layer in range(int(layers)):
        window = windows[layer] if windows is not None else None
        counts = (rows + 1 if window is None else (rows + 1).clamp(max=window)).to(torch.float64)
        a = plan.change.terms(layer, rows, rows, counts[None, None, :, None])[0]
        if a is not None:  # (1, H, N, 1)
            gains[layer] = a.mean(dim=(0, 1))[:, 0].cpu().numpy()
    return gains


def path_rolled_out(lambdas, kernels, baseline_kernels, weights, changed_weights, shares, gains,
                    composition=None) -> np.ndarray:
    """The closed-ratio rollout (module docstring) ``(N,)`` float64: `jaxroll.engine.probability.with_path_shape`
    of ``K' = kernels`` and ``moved_shape(K, C, C')`` (K = `baseline_kernels`, C = `weights`, C' =
    `changed_weights`, each ``(T, N, N)``), shares rho ``(T,)``, gains sigma ``(T, N)``, rolled out with
    `lambdas` ``(T,)`` by the engine in float64, its paths composed with exponent `composition` (None: q = 1).
    Equal to `rolled_out` of `kernels` where ``C' = C`` and ``sigma = 1``.

    Raises:
        ConfigError: one line naming ``probability_shares``, ``logit_gains`` or ``path_shape``.
    """
    import jax

    from ..engine.probability import moved_shape, with_path_shape

    kernels = np.asarray(kernels, dtype=np.float64)
    with jax.enable_x64(True):  # the rows' float64, as `rolled_out`'s NumPy
        shape = moved_shape(baseline_kernels, weights, changed_weights)
        kernel = with_path_shape(kernels, shape, np.asarray(shares, dtype=np.float64),
                                 np.asarray(gains, dtype=np.float64))
        return _engine_profile(kernel, lambdas, kernels.shape[-1], composition)


def _engine_profile(kernel, lambdas, n: int, composition) -> np.ndarray:
    """`jaxroll.influence` of `kernel` with `lambdas` at length `n`, paths composed with `composition`, float64."""
    import jax

    from ..model import RolloutModel, checked_composition
    from ..rollout import influence

    with jax.enable_x64(True):
        model = RolloutModel.create(kernel=kernel, lambdas=np.asarray(lambdas, dtype=np.float64), sequence_length=n,
                                    composition=None if composition is None else checked_composition(composition))
        return np.asarray(influence(model), dtype=np.float64)


def _changed_rows(probabilities, change, layer: int, bias, window):
    """One layer's rows ``(B, H, N, N)`` changed by `change` (module docstring), float64, hidden entries 0."""
    import torch

    n = probabilities.shape[-1]
    rows = keys = torch.arange(n, device=probabilities.device)
    counts = rows + 1 if window is None else (rows + 1).clamp(max=window)
    counts = counts.to(torch.float64)[None, None, :, None]  # n_i, the keys row i sees (SSMax)
    hidden = probabilities == 0  # above the diagonal, outside a window
    logits = torch.log(probabilities.masked_fill(hidden, 1.0))
    content = logits if bias is None else logits - bias
    # SSMax's a = s ln 1 = 0 at row 0: mask after the change, never 0 x -inf.
    logits = change.logits(layer, content, bias, rows, keys, counts).masked_fill(hidden, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _path_weights(rows):
    """``c(A)_ij = A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)`` of rows ``(B, H, q, N)`` (torch, float64): the
    engine's `jaxroll.engine.probability.path_weights`, without cancellation (`gain_rows.closed_path_weights`)."""
    from .gain_rows import closed_path_weights

    return closed_path_weights(rows.double())


def _add(sums, name, layer, rows, start: int = 0) -> None:
    """Rows ``(B, H, q, N)`` summed over the batch, averaged over heads, into ``sums[name][layer][start:]``,
    and their path weights into ``sums[name + "_weights"]`` (the same rows, so both means share S)."""
    stop = start + rows.shape[2]
    sums[name][layer][start:stop] += rows.mean(1).sum(0).cpu().numpy()  # in the rows' own precision, as before
    sums[name + "_weights"][layer][start:stop] += _path_weights(rows).mean(1).sum(0).cpu().numpy()


def _accumulate(sums, plan, bias, windows):
    """The hook's callback: one layer's probabilities added, head-averaged, to both running sums (and their
    path weights to theirs)."""
    def on_probabilities(layer, probabilities):
        p = probabilities.double()
        _add(sums, "baseline", layer, p)
        if plan is None:  # the changed rows come from q and k (`_accumulate_rotated`)
            return
        if plan.change is None:
            _add(sums, "changed", layer, p)
            return
        changed = _changed_rows(p, plan.change, layer, None if bias is None else bias.to(p.device), windows[layer])
        _add(sums, "changed", layer, changed)
    return on_probabilities


def _accumulate_rotated(sums, plan, resolved, capture, config):
    """The q, k hook's callback under a rotary rescale: the changed rows recomputed from the layer's q and k,
    rotated at ``p / r_h`` (keys at their group's first ratio, `LogitChange.key_rotary_ratios`), as the patched
    attention rotates them (`jaxroll.measure.passes` does the same for ``measure --intervene``)."""
    import functools

    import torch

    from .attention_rows import rotate, row_chunks
    from .patching import rerotate

    change = plan.change
    scale = float(resolved.layer_map.logit_scale(config, resolved.head_dim))

    def on_query_key(layer, q, k):
        dtype = q.dtype  # the model's precision for the logits, as its own attention
        q, k = rotate(q, capture.cos, capture.sin), rotate(k, capture.cos, capture.sin)
        positions = torch.arange(q.shape[1], device=q.device)
        inv_freq = capture.module.inv_freq
        q = rerotate(q.transpose(1, 2), positions, inv_freq, change.rotary_ratios[layer]).transpose(1, 2)
        k = rerotate(k.transpose(1, 2), positions, inv_freq, change.key_rotary_ratios[layer]).transpose(1, 2)
        for start, rows in row_chunks(q, k, scale=scale, window=resolved.windows[layer], precision=dtype,
                                      change=functools.partial(change.logits, layer)):
            _add(sums, "changed", layer, rows, start)
    return on_query_key


def _prediction(sums, count: int, lambdas, changes, plan, shares, windows, stream_norms=None,
                composition=None) -> RowPrediction:
    """The running sums of `count` sequences rolled out (paths composed with `composition`): today's layer on the
    rows (``rows_profile``), the baseline (the mean kernel), and with `shares` the closed-ratio profile
    (`path_rolled_out`)."""
    baseline_kernels, kernels = sums["baseline"] / count, sums["changed"] / count
    mixed = lambdas
    branch = [change for change in changes if getattr(change, "torch_change", None) == "branch"]
    if plan.gammas is not None and branch:  # the intervention's own mixing rule, declared on its type
        mixed = np.asarray(type(branch[0]).mixed_lambdas(np.asarray(plan.gammas), lambdas, stream_norms),
                           dtype=np.float64)
    rows_profile = rolled_out(mixed, kernels, composition)
    baseline = rolled_out(lambdas, baseline_kernels, composition)
    prediction = RowPrediction(rows_profile, baseline, mixed, kernels, baseline_kernels, int(count), ROWS_ONLY,
                               rows_profile)
    if shares is None:
        return prediction
    weights, changed_weights = sums["baseline_weights"] / count, sums["changed_weights"] / count
    layers, n = kernels.shape[0], kernels.shape[-1]
    gains = logit_gains(plan, layers, n, windows)
    profile = path_rolled_out(mixed, kernels, baseline_kernels, weights, changed_weights, shares, gains, composition)
    return dataclasses.replace(prediction, profile=profile, form=CLOSED_RATIO, weights=weights,
                               changed_weights=changed_weights, gains=gains)


def predict_rows(model, token_ids, lambdas, changes, *, batch_size: int = 8, max_memory: int | None = None,
                 plan=None, shares=None, stream_norms=None, composition=None) -> RowPrediction:
    """The per-sequence-rows prediction of `changes` and of the unchanged model (module docstring):

        A'_t = mean_{s,h} softmax_j(a(i) (log alpha_{t,h}^s - b) + c(i) b + d(i, j))     (T, N, N)
        p'   = e_{N-1}^T R'_T ... R'_1 / sum,  R'_t = (1 - lambda'_t) I + lambda'_t A'_t  (N,)

    and p the same with a = c = 1, d = 0 and lambda_t (the rollout of the mean kernel). With `shares` rho_t,
    p' is the closed-ratio layer's instead (`path_rolled_out`: the module docstring's B_t and R'_t).

    Args:
        model: a Hugging Face ``*ForCausalLM`` loaded with eager attention (its
            attention modules return the probabilities); eval mode for the
            run, restored after.
        token_ids: ``(S, N)`` integer ids, the baseline measurement's.
        lambdas: ``(T,)`` the baseline measurement's ``lambda_t``.
        changes: interventions (`jaxroll.interventions.parse`), ``[]`` for none.
        batch_size: sequences per forward pass (B >= 1).
        max_memory: refuse when `working_bytes` exceeds it (bytes; default: the memory available).
        plan: `row_plan` of `changes`, when the caller checked it already.
        shares: ``rho_t (T,)`` in [0, 1), the probability path's share of each branch (``r / (1 + r)`` of the
            baseline's ``probability_over_value``), or None for today's layer on the rows.
        stream_norms: ``(T,)`` the baseline's ``stream_norms``, which a branch scale's rule reads
            (`jaxroll.interventions.BranchScale`), or None for the plain formula.
        composition: the exponent q in [1, 2] in which every rollout here composes its paths (the baseline's
            config.yaml ``composition``, `jaxroll.RolloutModel.composition`), or None for q = 1.

    Returns:
        `RowPrediction`: profiles ``(N,)``, kernels ``(T, N, N)``, its form.

    Raises:
        ConfigError: one line naming the field: ids, batch size, lambdas,
            an intervention that maps no rows, the memory budget, a model
            without eager probabilities, a non-finite profile.
    """
    import contextlib

    import torch

    from .attention_rows import RotaryCapture, key_bias
    from .hooks import Hooks
    from .layer_maps import resolve
    from .precision import frozen_eval, full_precision

    ids = np.asarray(token_ids)
    if ids.ndim != 2 or ids.shape[0] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError.of("token_ids", f"shape {ids.shape}, dtype {ids.dtype}", "integer ids (S, N), S >= 1")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError.of("--batch-size", batch_size, "an integer >= 1")
    resolved = resolve(model)
    layers, n = len(resolved.blocks), ids.shape[1]
    lambdas = np.asarray(lambdas, dtype=np.float64)
    if lambdas.shape != (layers,) or not np.all((lambdas >= 0) & (lambdas <= 1)):
        raise ConfigError.of("lambdas", f"shape {lambdas.shape}", f"({layers},) values in [0, 1], one per block")
    if shares is not None:  # checked before the forward passes, not by the engine after them
        shares = np.asarray(shares, dtype=np.float64)
        if shares.shape != (layers,) or not np.all((shares >= 0) & (shares < 1)):
            raise ConfigError.of("probability_shares", f"shape {shares.shape}: {shares.tolist()}",
                                 f"({layers},) values in [0, 1), one per block")
    if composition is not None:  # checked before the forward passes, as the shares are
        from ..model import checked_composition

        checked_composition(composition)
    plan = row_plan(changes, model.config) if plan is None else plan
    _check_memory(layers, resolved.num_heads, n, min(int(batch_size), ids.shape[0]), max_memory)
    bias = key_bias(model, resolved, n)
    bias = None if bias is None else bias[None, :, None, :]  # (1, H, 1, N): b_h(j)
    sums = {name: np.zeros((layers, n, n)) for name in ("baseline", "changed", "baseline_weights", "changed_weights")}
    device = model.get_input_embeddings().weight.device
    rotated = plan.change is not None and plan.change.rotary_ratios is not None
    capture = RotaryCapture(model, resolved) if rotated else contextlib.nullcontext()
    hooks = Hooks(resolved, model.config, on_probabilities=_accumulate(sums, None if rotated else plan, bias,
                                                                       resolved.windows),
                  on_query_key=_accumulate_rotated(sums, plan, resolved, capture, model.config) if rotated else None)
    with frozen_eval(model), capture, hooks, torch.no_grad(), full_precision(model):
        for first in range(0, ids.shape[0], int(batch_size)):
            batch = torch.as_tensor(ids[first:first + int(batch_size)], dtype=torch.long, device=device)
            model(input_ids=batch, use_cache=False)
    prediction = _prediction(sums, ids.shape[0], lambdas, changes, plan, shares, resolved.windows, stream_norms,
                             composition)
    if not (np.all(np.isfinite(prediction.profile)) and np.all(np.isfinite(prediction.baseline))):
        raise ConfigError.of("per-sequence rows", "a non-finite profile", "finite attention rows")
    return prediction


def _measured_inputs(directory: Path, flag: str) -> tuple:
    """``(token_ids (S, N), lambdas (T,), metadata, shares (T,) or None, stream_norms (T,) or None)`` of a
    baseline measurement folder, checked; shares ``rho_t = r_t / (1 + r_t)`` of its ``probability_over_value``
    (NaN read as 0, as `MeasurementResult.to_rollout_model` reads it), None when it measured no ``paths``."""
    from .outputs import read_measurement

    if not directory.is_dir():
        raise ConfigError.of(flag, str(directory), "the --out of jaxroll measure (a folder)")
    arrays, metadata = read_measurement(directory, flag=flag)
    missing = [name for name in ("token_ids", "lambdas") if name not in arrays]
    if missing:
        raise ConfigError.of(f"{flag} {directory}", f"no {missing[0]} in measurement.npz",
                             "a measurement with --stats lambda,...")
    ids = np.asarray(arrays["token_ids"])
    n = ids.shape[-1]
    # Every per-position array of the folder must read the same N as its token ids (a folder edited by hand,
    # or arrays from two runs, would roll out one N against another's lambdas).
    lengths = {"metadata.json sequence_length": (metadata or {}).get("sequence_length"),
               "influence_per_sequence": arrays["influence_per_sequence"].shape[-1]
               if "influence_per_sequence" in arrays else None}
    for name, length in lengths.items():
        if length is not None and int(length) != n:
            raise ConfigError(f"{flag} {directory}: token_ids of N = {n}, {name} of N = {length}; allowed: one N "
                              "throughout (the --out of one jaxroll measure run)", field=flag, value=str(directory),
                              allowed="one N throughout")
    if (metadata or {}).get("interventions") or (metadata or {}).get("sink_tokens"):
        raise ConfigError.of(f"{flag} {directory}", "measured under --intervene",
                             "the baseline measurement (no --intervene)")
    lambdas, shares = np.asarray(arrays["lambdas"], dtype=np.float64), None
    if "probability_over_value" in arrays:
        ratio = np.nan_to_num(np.asarray(arrays["probability_over_value"], dtype=np.float64), nan=0.0)
        if ratio.shape != lambdas.shape or np.any(ratio < 0) or not np.all(np.isfinite(ratio)):
            raise ConfigError.of(f"{flag} {directory}", f"probability_over_value of shape {ratio.shape}",
                                 f"({lambdas.size},) finite values >= 0, one per block")
        shares = ratio / (1.0 + ratio)
    norms = None
    if "stream_norms" in arrays:
        from ..model import checked_stream_norms

        norms = checked_stream_norms(arrays["stream_norms"], lambdas.size)
    return ids, lambdas, metadata or {}, shares, norms


def measured_composition(directory: Path, flag: str = "--measured") -> float | None:
    """The composition exponent q of the baseline's ``config.yaml`` (what `jaxroll measure` fitted and wrote), or
    None where the folder has no config.yaml or it has no ``composition`` key (q = 1).

    Raises:
        ConfigError: one line naming the folder: a config.yaml that is not a YAML mapping, or a q outside [1, 2].
    """
    import yaml

    from ..model import checked_composition

    config = Path(directory) / "config.yaml"
    if not config.is_file():
        return None
    try:
        mapping = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError.of(f"{flag} {directory}", f"config.yaml unreadable ({type(error).__name__})",
                             "the config.yaml jaxroll measure wrote") from None
    if not isinstance(mapping, dict):
        raise ConfigError.of(f"{flag} {directory}", "config.yaml is not a mapping", "the config.yaml jaxroll "
                             "measure wrote")
    q = checked_composition(mapping.get("composition"))
    return None if q is None else float(q)


def predict_from_measurement(directory, spec: str, *, model_dir=None, batch_size: int = 8,
                             max_memory: int | None = None, device: str = "cpu", flag: str = "--measured"):
    """`predict_rows` of ``--intervene SPEC`` from a baseline measurement folder: ``(RowPrediction, record)``.

    The folder (``jaxroll measure``'s ``--out``) gives the model (its
    metadata.json's ``model``, unless `model_dir`), the token ids and the
    lambdas; the model loads in the dtype it was measured in, with eager
    attention. Everything the folder, the model's config.json and `spec`
    decide is checked before the weights load. `record` is JSON-ready.

    Raises:
        ConfigError: one line naming the field (`flag`, ``--model``,
            ``--intervene``, ``--batch-size``, the memory budget).
    """
    directory = Path(directory)
    token_ids, lambdas, metadata, shares, norms = _measured_inputs(directory, flag)  # before torch, transformers
    composition = measured_composition(directory, flag)
    from .loading import inspect_model, load_model
    from .torch_plan import parse_for, position_limit

    source = model_dir if model_dir is not None else metadata.get("model")
    if model_dir is not None and not Path(model_dir).is_dir():
        raise ConfigError.of("--model", str(model_dir), f"the folder of the model {flag} {directory} measured")
    if not source or not Path(source).is_dir():
        raise ConfigError.of("--model", None, f"--model DIR: {flag} {directory}/metadata.json names "
                             f"{source!r}, not a folder here")
    info = inspect_model(source)
    if info.num_layers != lambdas.size:
        raise ConfigError.of("--model", str(source), f"a model of {lambdas.size} blocks, as {flag} {directory} "
                             f"measured (it has {info.num_layers})")
    limit, field = position_limit(info.config)
    n = token_ids.shape[1]
    if limit is not None and n > limit:
        raise ConfigError.of(f"{flag} {directory}", f"N = {n}", f"N <= the model's {field} ({limit})")
    changes = parse_for(spec, info.config)
    plan = row_plan(changes, info.config)
    _check_memory(info.num_layers, info.num_heads, n, min(int(batch_size), token_ids.shape[0]), max_memory)
    dtype = str(metadata.get("dtype") or "float32")
    model = load_model(source, dtype=dtype, attn_implementation="eager", device=device)
    prediction = predict_rows(model, token_ids, lambdas, changes, batch_size=batch_size, max_memory=max_memory,
                              plan=plan, shares=shares, stream_norms=norms, composition=composition)
    from ..interventions import describe
    from .effect import middle_mass

    record = {"measured": str(directory), "model": str(source), "dtype": dtype, "intervention": spec,
              "interventions": describe(changes), "sequences": prediction.sequences, "length": int(n),
              "lambdas": lambdas.tolist(), "lambdas_intervened": prediction.lambdas.tolist(),
              "middle_mass": {"predicted": float(middle_mass(prediction.profile)),
                              "predicted_baseline": float(middle_mass(prediction.baseline)),
                              "predicted_rows_only": float(middle_mass(prediction.rows_profile))},
              "form": prediction.form, "method": _METHODS[prediction.form], "composition": composition}
    if norms is not None:  # what the branch-scale rule read (docs/interventions.md, "The stream under a branch scale")
        record["stream_norms"] = np.asarray(norms, dtype=np.float64).tolist()
    if shares is not None:
        record |= {"probability_shares": shares.tolist(),
                   "logit_gains_last_row": prediction.gains[:, -1].tolist()}
    middle = record["middle_mass"]
    middle["change"] = middle["predicted"] - middle["predicted_baseline"]
    middle["change_rows_only"] = middle["predicted_rows_only"] - middle["predicted_baseline"]
    return prediction, record


_METHODS = {
    ROWS_ONLY: "per-sequence rows: each sequence's attention rows changed by the patch's logit change, averaged "
               "over sequences and heads per layer, rolled out with the lambdas (the baseline measured no paths: "
               "no probability_over_value, so today's layer)",
    CLOSED_RATIO: "per-sequence rows with the probability path (closed ratio): the changed rows' mean K' and the "
                  "mean path weights C, C' of the unchanged and changed rows; B = (1 - rho) K' + rho sigma P/|P|, "
                  "P = K C'/C, rho = r/(1 + r) from the baseline's probability_over_value, sigma the logit gain; "
                  "rolled out with the lambdas (docs/interventions.md, 'The probability path's shape')"}


def write_prediction(out, prediction: RowPrediction, record: dict) -> list[Path]:
    """Write `PROFILE_FILE` (the intervened model's ``p'``), `BASELINE_FILE` (``p``) and rows.json (`record`)
    into the existing folder `out`, as ``jaxroll effect --predicted/--predicted-baseline`` read them."""
    import json

    from ..io import write_profile

    out = Path(out)
    paths = [write_profile(prediction.profile, out / PROFILE_FILE, overwrite=True),
             write_profile(prediction.baseline, out / BASELINE_FILE, overwrite=True)]
    path = out / "rows.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return paths + [path]
