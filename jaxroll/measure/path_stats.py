"""The ``paths`` statistic: per layer, the ingredients of the extended layer (r_t and the branch's share).

From `jaxroll.measure.paths.layer_paths` (each block's local influence
``||d h'_i / d h_j||_F`` split into identity, value, probability and MLP
paths), at the influence's target row ``i = N - 1`` (the last position of
the model's run), for sequence s and block t::

    I_t      = sqrt(D)                                  (the identity: ||I||_F at j = i)
    V_{s,t}  = sum_j ||J^value_t(i, j)||_F               (probabilities held fixed)
    P_{s,t}  = sum_j ||J^probability_t(i, j)||_F         (values held fixed: through q.k)
    M_{s,t}  = sum_j ||J^mlp_t(i, j)||_F

and, with ``X_t = mean_s X_{s,t}`` over the sampled sequences::

    r_t            = P_t / V_t                          (probability_over_value)
    branch_share_t = (V_t + P_t) / (I_t + V_t + P_t)    (in [0, 1])

**Why this share.** The rollout's layer row is ``R_t(i, .) = (1 - lambda)
e_i + lambda A_i``: the identity carries ``1 - lambda`` and the attention
branch carries ``lambda`` in all, its diagonal ``lambda A_ii`` included
(the self-weight is ``(1 - lambda) + lambda A_ii``). ``branch_share`` splits
the same row the same way, but by the magnitudes the gradient moves: the
identity's ``||I||_F`` against everything the attention moves from every key,
the key ``j = i`` included, through either path. It is the lambda of a
rollout whose attention row is the measured mixing (value and probability
paths, in the ratio r_t), so it is the one to place beside today's
norm-ratio ``lambda = mean ||a|| / (||x|| + ||a||)``, which compares
activations, not influence. The MLP is outside both (the rollout has no MLP
term); ``path_mlp`` is reported for the reader. Magnitudes are summed, not
the Jacobians: ``||I + J(i, i)||_F`` is not ``sqrt(D) + ||J(i, i)||_F``, so
this is a share of path magnitudes (what each path could move), not of the
net gradient. Where ``V_t = 0``, r_t is NaN.

**Noise.** ``*_std`` are the standard deviations across the sampled
sequences (ddof 0, as ``lambdas_std``) of the per-sequence values (for r_t
and the share: of ``P_s / V_s`` and ``(V_s + P_s) / (I + V_s + P_s)``); the
per-sequence sums are kept as ``path_per_sequence (M, 4, L)`` (identity,
value, probability, mlp). Estimate mode adds its own scatter (relative
standard error of each squared norm at most ``sqrt(2 / R)``), which these
spreads include.

**Where it runs.** Two routes give the same sums (exact in both where
the backward route is exact, D <= R):

- the forward route (`jaxroll.measure.path_forward`), inside the hooked
  pass, on every sequence: the value and probability sums from each
  block's input in closed form (the norm's Jacobian, the projections'
  matrices and row i of the probabilities), no backward pass; for the
  families it names (`path_forward.FORWARD_FAMILIES`: GPT-2, BLOOM, Falcon
  with ALiBi, GPT-NeoX, Llama, Mistral, Qwen2) without interventions. It
  does not give the MLP path: ``path_mlp`` is NaN (the prediction reads only
  r_t and the share). ``metadata["paths"]["route"] = "forward"``.
- the backward route (`measure_paths`), after the pass, on the first
  `PATH_SAMPLES` sequences, in `PATH_PROJECTIONS` Gaussian projections
  (exact, D basis vectors, when ``D <= PATH_PROJECTIONS``), in its own passes
  (`jaxroll.measure.additions.add_paths`): the path separation recomputes
  each block alone from its input with its values detached, which the
  pass's activation checkpointing would replay without the detachment. It
  runs on the model as loaded, ``sdpa`` included (`layer_paths` needs no
  probabilities: the value path is the attention's Jacobian minus the
  probability path's), under the run's interventions (``--intervene``);
  Falcon with ALiBi gets the bias once under ``falcon_alibi="once"`` as in
  the pass. Every other family, and every run with an intervention, takes
  it; it also gives the MLP path. ``metadata["paths"]["route"] = "backward"``.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..errors import ConfigError
from .registry import Statistic, register_statistic

__all__ = ["PATH_SAMPLES", "PATH_PROJECTIONS", "PATH_NAMES", "measure_paths", "forward_record", "path_outputs",
           "probability_over_value", "branch_share", "path_ingredients"]

PATH_SAMPLES = 4
"""Sequences the statistic runs on: the first ones of the measurement."""
PATH_PROJECTIONS = 8
"""Gaussian projections R per block, path and sequence (exact when D <= R)."""
PATH_SEED = 0
PATH_NAMES = ("identity", "value", "probability", "mlp")
"""The paths in the order of `path_per_sequence`'s second axis."""


def probability_over_value(probability, value):
    """``r = P / V`` elementwise (NaN where ``V = 0``): the probability path's size against the value path's."""
    probability, value = np.asarray(probability, dtype=np.float64), np.asarray(value, dtype=np.float64)
    return np.divide(probability, value, out=np.full(np.broadcast(probability, value).shape, np.nan),
                     where=value != 0)


def branch_share(identity, value, probability):
    """``(V + P) / (I + V + P)`` elementwise, in [0, 1]: the attention branch's share of the layer row's magnitude."""
    identity, value, probability = (np.asarray(x, dtype=np.float64) for x in (identity, value, probability))
    attention = value + probability
    total = identity + attention
    return np.divide(attention, total, out=np.zeros(np.broadcast(attention, total).shape), where=total != 0)


@contextlib.contextmanager
def _falcon_alibi_once(model, zero: bool):
    """Falcon's eager path adds ALiBi twice: a pre-hook passes a zero ``alibi`` to each attention (once, in the
    mask), as the hooked pass does (`jaxroll.measure.hooks`); nothing for other models."""
    if not zero:
        yield
        return
    from .hooks import Hooks
    from .layer_maps import resolve

    with Hooks(resolve(model), model.config, zero_falcon_alibi=True):
        yield


def measure_paths(model, token_ids, *, samples: int = PATH_SAMPLES, projections: int | None = PATH_PROJECTIONS,
                  seed: int = PATH_SEED, patching=None, falcon_alibi: str = "once") -> dict:
    """Per-sequence path sums at the last row of the first `samples` sequences: ``(M, 4, L)`` and the record.

    ``per_sequence[s, p, t] = sum_j ||J^p_t(N - 1, j)||_F`` for p in
    `PATH_NAMES` (module docstring), with the model's own attention
    implementation, under `patching` (a `jaxroll.measure.patching.Patch`, or
    None; Falcon's ALiBi as `falcon_alibi` says). `projections` None, or
    ``>= D``: exact.

    Returns:
        ``{"per_sequence": (M, 4, L) float64, "record": dict}`` (the record
        goes into ``metadata["paths"]``).
    """
    from .layer_maps import resolve
    from .paths import layer_paths
    from .precision import frozen_eval

    ids = np.asarray(token_ids)
    if not (isinstance(samples, (int, np.integer)) and not isinstance(samples, bool) and samples >= 1):
        raise ConfigError.of("path_samples", samples, "an integer >= 1")
    if projections is not None and not (isinstance(projections, (int, np.integer))
                                        and not isinstance(projections, bool) and projections >= 1):
        raise ConfigError.of("path_projections", projections, "None (exact) or an integer R >= 1")
    if ids.ndim != 2 or ids.shape[0] < 1:
        raise ConfigError.of("token_ids", tuple(ids.shape), "a (S, N) array of token ids, S >= 1")
    ids = ids[: int(samples)]
    resolved = resolve(model)
    width = int(getattr(model.config, resolved.layer_map.hidden_size))
    exact = projections is None or int(projections) >= width
    falcon = resolved.layer_map.name == "falcon" and resolved.layer_map.position == "alibi"
    eager = getattr(model.config, "_attn_implementation", "eager") in (None, "eager")
    # As the hooked pass: dropout off, no weight gradients (they would only hold memory).
    with frozen_eval(model), _falcon_alibi_once(model, falcon and eager and falcon_alibi == "once"), \
            (patching if patching is not None else contextlib.nullcontext()):
        info = layer_paths(model, ids, queries=[-1], projections=None if exact else int(projections),
                           seed=seed, keep_sequences=True)
    sums = [info.per_sequence[name][:, :, 0, :].sum(-1) for name in PATH_NAMES[1:]]  # (M, L) each
    per_sequence = np.stack([np.full_like(sums[0], math.sqrt(width))] + sums, axis=1)
    record = {"route": "backward", "samples": int(ids.shape[0]), "query": int(ids.shape[1] - 1),
              "projections": None if exact else int(projections), "seed": int(seed),
              "relative_standard_error": float(info.relative_standard_error),
              "outputs": "path_* (L,) in measurement.npz; docs/refinements.md"}
    return {"per_sequence": per_sequence, "record": record}


def forward_record(per_sequence, model_ids) -> dict:
    """``metadata["paths"]`` of the forward route (`jaxroll.measure.path_forward`): exact, every sequence, no MLP."""
    return {"route": "forward", "samples": int(np.asarray(per_sequence).shape[0]),
            "query": int(np.asarray(model_ids).shape[1] - 1), "projections": None, "seed": None,
            "relative_standard_error": 0.0, "mlp": "NaN: the forward route does not give the MLP path",
            "outputs": "path_* (L,) in measurement.npz; docs/refinements.md"}


def path_outputs(per_sequence) -> dict:
    """The ``measurement.npz`` arrays from the per-sequence sums ``(M, 4, L)`` (module docstring).

    ``path_identity, path_value, path_probability, path_mlp (L,)`` means over
    sequences and their ``*_std``; ``probability_over_value`` ``P_t / V_t``
    and ``branch_share`` ``(V_t + P_t) / (I_t + V_t + P_t)`` of the means,
    with the spreads of their per-sequence values; ``path_per_sequence``.
    """
    per_sequence = np.asarray(per_sequence, dtype=np.float64)
    if per_sequence.ndim != 3 or per_sequence.shape[1] != len(PATH_NAMES) or per_sequence.shape[0] < 1:
        raise ConfigError.of("path_per_sequence", per_sequence.shape, "(M, 4, L) with M >= 1")
    means, spreads = per_sequence.mean(0), per_sequence.std(0)
    out = {"path_per_sequence": per_sequence}
    for index, name in enumerate(PATH_NAMES):
        out[f"path_{name}"], out[f"path_{name}_std"] = means[index], spreads[index]
    identity, value, probability = (per_sequence[:, index] for index in range(3))
    out["probability_over_value"] = probability_over_value(means[2], means[1])
    out["probability_over_value_std"] = probability_over_value(probability, value).std(0)
    out["branch_share"] = branch_share(means[0], means[1], means[2])
    out["branch_share_std"] = branch_share(identity, value, probability).std(0)
    return out


def path_ingredients(measurement) -> dict:
    """The extended layer's ingredients from a measurement with ``paths``: ``{name: (L,) float64}``.

    `measurement`: a `jaxroll.measure.Measurement`, the `SavedMeasurement`
    of `jaxroll.measure.read_measurement`, a dict of its arrays, or a
    measurement folder. Returns ``r`` (probability_over_value),
    ``branch_share``, ``lambda`` (the norm-ratio lambdas, where measured),
    the four ``path_*`` means and every ``*_std``.

    Raises:
        ConfigError: no ``path_*`` arrays (a measurement without ``paths``).
    """
    arrays = _arrays_of(measurement)
    if "path_per_sequence" not in arrays:
        raise ConfigError.of("measurement", "without path_per_sequence",
                             "a measurement made with --stats ...,paths (jaxroll.measure.path_stats)")
    out = path_outputs(arrays["path_per_sequence"])
    out = {"r": out.pop("probability_over_value"), "r_std": out.pop("probability_over_value_std")} | out
    if "lambdas" in arrays:
        out["lambda"] = np.asarray(arrays["lambdas"], dtype=np.float64)
    return out


def _arrays_of(measurement) -> dict:
    if isinstance(measurement, dict):
        return measurement
    if hasattr(measurement, "to_rollout_model"):  # a Measurement
        return measurement.arrays()
    if hasattr(measurement, "arrays") and isinstance(measurement.arrays, dict):  # a SavedMeasurement
        return measurement.arrays
    from .outputs import read_measurement

    return read_measurement(measurement, need_metadata=False).arrays


def _summary(outputs: dict) -> str:
    if "branch_share" not in outputs:
        return "paths: not measured"
    r, share = outputs["probability_over_value"], outputs["branch_share"]
    return (f"paths: per layer r_t = probability/value {np.array2string(r, precision=3, separator=' ')}, "
            f"branch share {np.array2string(share, precision=3, separator=' ')} "
            f"(last row, {outputs['path_per_sequence'].shape[0]} sequences)")


def _allocate(shape) -> dict:
    return {"path_per_sequence": np.full((shape.sequences, len(PATH_NAMES), shape.layers), np.nan)}


def _observe(state, kind, layer, sums):
    state[layer] = sums


def _accumulate(arrays, state, index) -> None:
    if state:  # the forward route ran (else the backward route fills the rows after the pass)
        arrays["path_per_sequence"][index] = np.stack([state[t] for t in sorted(state)], axis=-1)


def _finish(arrays, count, shape) -> dict:
    per_sequence = arrays["path_per_sequence"]
    # Rows measured in the pass (the forward route) are finite in their value column; else add_paths fills them.
    return path_outputs(per_sequence) if np.isfinite(per_sequence[:, 1]).all() else {}


def _attach(resolved, deliver, recording, *, recomputed=False, run=None) -> list:
    """The forward route's hooks (`jaxroll.measure.path_forward`) where it applies to this run; else none.

    `run`: ``{model, patching, falcon_alibi, length}`` from the pass. Each
    block's sums reach `observe` per sequence as ``(4,)``: ``sqrt(D)``, the
    value and probability sums, NaN (the MLP, not given by this route).
    """
    from .path_forward import ForwardPaths, unsupported

    if run is None or unsupported(run["model"], resolved, run["patching"]) is not None:
        return []
    paths = ForwardPaths(run["model"], resolved, run["length"], run["falcon_alibi"])
    width = float(paths.layers[0].gamma.shape[0])

    def each_row(layer, sums):
        sums = sums.cpu().numpy()
        for row in range(sums.shape[0]):
            deliver("paths", layer, np.array([math.sqrt(width), sums[row, 0], sums[row, 1], np.nan]), row=row)
    return paths.hooks(each_row, recording)


# The forward route inside the hooked pass where it applies (`_attach`); else the backward route after it
# (`jaxroll.measure.additions.add_paths`).
register_statistic(Statistic(
    name="paths", hooks=(), allocate=_allocate, observe=_observe, accumulate=_accumulate, finish=_finish,
    per_sequence=("path_per_sequence",), attach=_attach,
    memory=lambda shape: 8 * len(PATH_NAMES) * shape.sequences * shape.layers, summary=_summary))
