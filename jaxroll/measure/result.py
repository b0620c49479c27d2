"""What `jaxroll.measure.measure` returns: the `Measurement` record (float64 NumPy)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError


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
    (L, N, N)``. `metadata` is JSON-ready.
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
        """The measured arrays by name (those that are not None)."""
        arrays = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in ("metadata", "extra") and getattr(self, field.name) is not None}
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
        """
        from ..kernel_types import ROW_SUM_TOLERANCE, DenseKernel
        from ..model import RolloutModel

        if self.lambdas is None:
            raise ConfigError("stats: a rollout config needs 'lambda'; allowed: stats that include lambda")
        if self.attention_mean is not None and self.metadata.get("position_encoding") != "alibi":
            attention = self.attention_mean
            sums = attention.sum(axis=-1, keepdims=True)
            if np.max(np.abs(sums - 1.0)) > ROW_SUM_TOLERANCE:
                attention = attention / sums
            kernel = DenseKernel.create(attention, field="attention_mean")
            return RolloutModel.create(kernel=kernel, lambdas=np.clip(self.lambdas, 0.0, 1.0),
                                       sequence_length=sequence_length or self.sequence_length)
        scale = float(self.logit_scale)
        diagonal = 0.0 if self.content_diagonal is None else scale * self.content_diagonal
        base = 0.0 if self.content_base is None else scale * self.content_base
        return RolloutModel.create(
            num_layers=self.num_layers, num_heads=self.num_heads,
            lambdas=np.clip(self.lambdas, 0.0, 1.0), alibi_slopes=self.alibi_slopes_logit,
            diagonal_scores=diagonal, base_scores=base,
            sequence_length=sequence_length or self.sequence_length,
        )
