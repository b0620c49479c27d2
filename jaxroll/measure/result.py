"""What `jaxroll.measure.measure` returns: the `Measurement` record (float64 NumPy)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..errors import ConfigError
from .registry import registered


@dataclasses.dataclass
class Measurement:
    """The result of `measure`; arrays are float64 NumPy, absent stats are None.

    Shapes: ``lambdas, lambdas_std (L,)``, ``lambdas_per_sequence (S, L)``,
    ``token_ids (S, N)``, ``document_indices (S,)``, ``influence,
    influence_raw (N,)`` (normalised / mean gradient norms),
    ``target_token, target_probability (S,)``, ``alibi_slopes (H,)`` (the
    model's own), ``alibi_slopes_logit (H,)`` (in softmax-logit units,
    ``slope * bias_scale``), ``content_diagonal, content_base (L, H)`` (raw
    ``q.k``), ``logit_scale ()`` (the factor on ``q.k`` in the logit),
    ``qk_mean (L, H, n, n)`` at ``qk_positions (n,)``, ``attention_mean
    (L, N, N)``. `metadata` is JSON-ready. ``refined_profile (N,)``, when
    measured with ``refine``, is the refined rollout's profile
    (``refined.csv``; not in ``measurement.npz``).
    """

    lambdas: np.ndarray | None
    lambdas_std: np.ndarray | None
    lambdas_per_sequence: np.ndarray | None
    token_ids: np.ndarray
    document_indices: np.ndarray
    influence: np.ndarray | None
    influence_raw: np.ndarray | None
    target_token: np.ndarray | None
    target_probability: np.ndarray | None
    alibi_slopes: np.ndarray
    alibi_slopes_logit: np.ndarray
    content_diagonal: np.ndarray | None
    content_base: np.ndarray | None
    logit_scale: np.ndarray
    qk_mean: np.ndarray | None
    qk_positions: np.ndarray | None
    attention_mean: np.ndarray | None
    metadata: dict
    influence_per_sequence: np.ndarray | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    refined_profile: np.ndarray | None = None  # (N,) the refined rollout's profile: refined.csv, not the npz

    @property
    def num_layers(self) -> int:
        return int(self.metadata["num_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.metadata["num_heads"])

    @property
    def sequence_length(self) -> int:
        return int(self.token_ids.shape[1])

    def arrays(self) -> dict[str, np.ndarray]:
        """The measured arrays by name (those that are not None).

        A measurement made under interventions also carries their record
        (`jaxroll.interventions.describe`) as ``interventions``, a JSON string
        (a 0-d unicode array: readable without pickle), so the archive alone
        says what was done to the model.
        """
        arrays = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in ("metadata", "extra", "refined_profile") and getattr(self, field.name) is not None}
        record = self.metadata.get("interventions") if isinstance(self.metadata, dict) else None
        if record:
            arrays["interventions"] = np.asarray(json.dumps(record, sort_keys=True))
        return arrays | {name: np.asarray(value) for name, value in self.extra.items()}

    def to_rollout_model(self, sequence_length: int | None = None):
        """A `jaxroll.RolloutModel` with the measured parameters, in logit units.

        ``lambdas`` as measured; ``alibi_slopes = alibi_slopes_logit`` (every
        layer); ``diagonal_scores = logit_scale * content_diagonal`` and
        ``base_scores = logit_scale * content_base`` (zero where content was
        not measured); temperature 1, causal mask.

        A model without ALiBi (rotary: Llama, Mistral, Qwen2; learned
        positions: GPT-2) whose mean attention was measured gets a
        `RolloutModel` over a `DenseKernel` instead: its kernels are the measured
        ``attention_mean`` (L, N, N) as a `DenseKernel`, exactly as the
        model computed it (eager Llama takes its softmax in float32, so rows
        sum to 1 within ~1e-7). Only where a row misses 1 by more than
        `jaxroll.kernel_types.ROW_SUM_TOLERANCE` (bfloat16 models) are the
        rows divided by their sums.

        Measured with ``attention_gains`` as well (`jaxroll.measure.gain_rows`, the default for such a model
        where its tables are small), the kernel is a `GainTableKernel` of the mean rows at a grid of logit
        gains: the same rollout as the `DenseKernel` (its table at gain 1 is ``attention_mean``), and a
        temperature or SSMax reads the rows at the changed gains; with ``attention_distances`` (the default
        beside it) a distance score reads the mean rows under the score's form (`jaxroll.measure.distance_rows`).

        Such a model measured with ``attention_offsets`` and without
        ``attention`` (the default above `registry.DENSE_DEFAULT_BYTES`) gets
        the offset kernel, `jaxroll.measure.offsets.offset_rollout_model`: a
        `TableKernel` with scores ``log a_{t,h}(o)``, layer kernel
        ``K_t[i, j] = (1 / H) sum_h a_{t,h}(i - j) / sum_{o <= i} a_{t,h}(o)``,
        defined up to the measured N.

        A measurement with ``paths`` (`jaxroll.measure.path_stats`) extends
        every layer by the probability path (`jaxroll.model.with_probability_path`):
        shares ``rho_t = r_t / (1 + r_t)`` from the measured ratio ``r_t`` of
        probability-path to value-path influence, logit gains 1 (the measured
        setting), so the unchanged prediction is the plain rollout's exactly
        and a temperature or SSMax moves the branch's share (docs/design.md,
        "The probability path").

        With lambda come the residual stream's norms (``extra["stream_norms"]``), which the model carries
        for a branch scale (`jaxroll.interventions.BranchScale`).

        With influence measured at the model's length, the model composes paths with the exponent q in
        [1, 2] nearest the measured profile (`jaxroll.fitting.fit_composition`, ``composition`` in the
        config; docs/design.md, "How paths compose"): one number fitted on this measurement, with which
        every change is then predicted.
        """
        if self.lambdas is None:
            raise ConfigError("stats: a rollout config needs 'lambda'; allowed: stats that include lambda")
        model = self._kernel_model(sequence_length)
        if "stream_norms" in self.extra:
            from ..model import checked_stream_norms

            model = dataclasses.replace(model, stream_norms=checked_stream_norms(self.extra["stream_norms"],
                                                                                 model.num_layers))
        if "probability_over_value" in self.extra:
            from ..model import with_probability_path

            # share_from_ratio's rho = r / (1 + r), in float64 here (the config keeps every digit).
            ratio = np.nan_to_num(np.asarray(self.extra["probability_over_value"], dtype=np.float64), nan=0.0)
            model = with_probability_path(model, ratio / (1.0 + ratio))
        return self._composed(model)

    def _composed(self, model):
        """`model` with the composition exponent fitted to the measured influence (`jaxroll.fitting.fit_composition`),
        where influence was measured at the model's length; q = 1 leaves the model as it is (the fast path)."""
        if self.influence is None or self.influence.shape[-1] != model.sequence_length:
            return model
        from ..fitting.composition import fit_composition
        from ..model import checked_composition

        q, _ = fit_composition(model, np.asarray(self.influence, dtype=np.float64))
        return model if q == 1.0 else dataclasses.replace(model, composition=checked_composition(q))

    def _kernel_model(self, sequence_length):
        """The plain rollout model of the measured lambdas and kernel (`to_rollout_model` without the paths)."""
        from ..kernel_types import AlibiKernel, AnchoredTableKernel, DenseKernel, GainTableKernel
        from ..model import RolloutModel

        length = sequence_length or self.sequence_length
        lambdas = np.clip(self.lambdas, 0.0, 1.0)
        alibi = self.metadata.get("position_encoding") == "alibi"
        offsets = self.extra.get("attention_offsets")
        if self.attention_mean is None and offsets is not None and not alibi:
            from .offsets import offset_rollout_model

            return offset_rollout_model(offsets, self.lambdas, length)
        if self.attention_mean is not None and not alibi:
            kernel = (GainTableKernel.create(**self._tables(), field="gain_rows") if "gain_rows" in self.extra
                      else DenseKernel.create(_stochastic(self.attention_mean), field="attention_mean"))
            return RolloutModel.create(kernel=kernel, lambdas=lambdas, sequence_length=length)
        scale = float(self.logit_scale)
        diagonal = 0.0 if self.content_diagonal is None else scale * self.content_diagonal
        base = 0.0 if self.content_base is None else scale * self.content_base
        anchor = AlibiKernel.create(num_layers=self.num_layers, num_heads=self.num_heads,
                                    alibi_slopes=self.alibi_slopes_logit, diagonal_scores=diagonal, base_scores=base)
        kernel = (AnchoredTableKernel.create(**self._tables(), anchor=anchor, field="gain_rows")
                  if "gain_rows" in self.extra else anchor)
        return RolloutModel.create(kernel=kernel, lambdas=lambdas, sequence_length=length)

    def _tables(self) -> dict:
        """`GainTableKernel.create`'s ``rows``, ``weights`` and ``grid`` from ``attention_gains``, and its
        ``distances`` from ``attention_distances`` where measured (else None)."""
        distances = None
        if "distance_rows" in self.extra:
            distances = {"rows": _stochastic(np.asarray(self.extra["distance_rows"], dtype=np.float64)),
                         "scores": self.extra["distance_scores"], "grid": self.extra["distance_grid"],
                         "keys": tuple(str(key) for key in np.asarray(self.extra["distance_keys"]))}
        return {"rows": _stochastic(np.asarray(self.extra["gain_rows"], dtype=np.float64)),
                "weights": self.extra["gain_weights"], "grid": self.extra["gain_grid"], "distances": distances}


def _stochastic(rows):
    """`rows` divided by their sums only where a row misses 1 by more than `ROW_SUM_TOLERANCE` (bfloat16)."""
    from ..kernel_types import ROW_SUM_TOLERANCE

    sums = rows.sum(axis=-1, keepdims=True)
    return rows / sums if np.max(np.abs(sums - 1.0)) > ROW_SUM_TOLERANCE else rows


def measurement_from_sums(sums, stats, token_ids, document_indices, slopes, bias_scale, logit_scale, grid, metadata,
                          shape, sinks=0) -> "Measurement":
    """The `Measurement` of the accumulated partial sums of `jaxroll.measure.measure` (means over sequences).

    ``influence = sum_s g_s / sum_{s,j} g_s[j]`` over the N original positions
    (with k sink tokens in front, the first k columns are the sinks': their
    share of each sequence's gradient mass is ``extra["sink_mass"]``);
    ``lambdas`` the mean and spread over sequences; content ``base`` (mean
    below the diagonal) and ``diagonal - base``; each registered statistic's
    own ``finish``; with lambda, ``extra["stream_norms"] (L,)``, the RMS of the
    residual stream's norm at each layer's input, ``sqrt(mean_{s,i} ||x_t||^2)``.
    """
    arrays, count = sums.arrays, sums.count
    lambdas = lambdas_std = per_sequence = None
    if "lambda" in stats:
        per_sequence = arrays["lambdas_per_sequence"]
        lambdas = per_sequence.mean(axis=0)
        lambdas_std = per_sequence.std(axis=0)
    extra = {}
    if "stream_squares_per_sequence" in arrays:
        # The RMS over sequences and positions of ||x_t||: what a branch scale's stream rule reads.
        extra["stream_norms"] = np.sqrt(arrays["stream_squares_per_sequence"].mean(axis=0))
    influence = influence_raw = token = probability = influence_rows = None
    if "influence" in stats:
        # With k sinks in front: the N originals' norms, and the sinks' share of each sequence's gradient mass
        # (SinkTokens.split of the rollout, per sequence).
        influence_raw = arrays["influence_sum"][sinks:] / count
        total = influence_raw.sum()
        influence = influence_raw / total if total > 0 else np.full_like(influence_raw, 1.0 / influence_raw.size)
        token, probability = arrays["target_token"], arrays["target_probability"]
        influence_rows = arrays["influence_per_sequence"][:, sinks:]
        if sinks:
            full = arrays["influence_per_sequence"]
            mass = full.sum(axis=1)
            extra["sink_mass"] = np.where(mass > 0, full[:, :sinks].sum(axis=1) / np.where(mass > 0, mass, 1.0), 0.0)
            metadata["sink_tokens"]["sink_mass_mean"] = float(np.mean(extra["sink_mass"]))
    diagonal = base = None
    if "content" in stats:
        base = arrays["qk_lower_sum"] / count
        diagonal = arrays["qk_diagonal_sum"] / count - base
    for name in stats:
        statistic = registered().get(name)
        if statistic is not None:
            extra.update(statistic.finish(arrays, count, shape))
    return Measurement(
        lambdas=lambdas, lambdas_std=lambdas_std, lambdas_per_sequence=per_sequence,
        token_ids=np.asarray(token_ids), document_indices=np.asarray(document_indices),
        influence=influence, influence_raw=influence_raw, target_token=token, target_probability=probability,
        alibi_slopes=np.asarray(slopes, dtype=np.float64),
        alibi_slopes_logit=np.asarray(slopes, dtype=np.float64) * bias_scale,
        content_diagonal=diagonal, content_base=base, logit_scale=np.asarray(logit_scale),
        qk_mean=arrays["qk_sum"] / count if "qk" in stats else None,
        qk_positions=grid if "qk" in stats else None,
        attention_mean=arrays["attention_sum"] / count if "attention" in stats else None,
        metadata=metadata, influence_per_sequence=influence_rows, extra=extra,
    )
