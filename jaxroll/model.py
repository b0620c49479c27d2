"""The parameter PyTree of a rollout: `RolloutModel`, lambdas plus a kernel.

Layer t's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t``
(arXiv 2602.16837): a model holds the mixing coefficients ``lambda_t`` and
the layer kernels ``A_t`` as one of `jaxroll.kernel_types` (ALiBi + content,
measured dense, relative-position), plus the default sequence length. It is
the one model type: every function of jaxroll takes it, whatever its kernel.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Float

from ._checks import as_float_array, check_positive_int, check_range
from ._checks import per_layer as _per_layer
from .errors import ConfigError
from .engine import probability
from .kernel_types import AbstractKernel, AlibiKernel, DenseKernel

__all__ = ["RolloutModel", "KernelRolloutModel", "as_dense_model", "check_model", "checked_stream_norms", "checked_composition",
           "is_model",
           "layer_kernels", "with_probability_path"]

class RolloutModel(eqx.Module):
    """Parameters of a residual-aware attention rollout (a PyTree): lambdas plus a kernel.

    Each layer's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t``;
    ``A[i, j]`` is the weight with which token i reads token j. With the
    ALiBi + content kernel (`jaxroll.AlibiKernel`, what `create` builds from
    slopes and content) ``A_t = sum_h w_{t,h} rowsoftmax(s_{t,h})`` with
    ``s_{t,h}(i, j) = (-m_{t,h} (i - j) + d_{t,h} [i == j] + b_{t,h}) / tau``;
    its fields read through the model (``model.alibi_slopes``,
    ``model.diagonal_scores``, ``model.base_scores``, ``model.head_weights``,
    ``model.temperature``), and so do `eqx.tree_at` and `jax.grad` results.

    Attributes:
        lambdas: ``(T,)``, the mixing coefficients ``lambda_t`` in [0, 1].
        kernel: the layer kernels ``A_t``, T layers stacked (an `AbstractKernel`).
        sequence_length: the default N of `influence` and friends. Static.
        stream_norms: ``(T,)`` or None, the residual stream's RMS norm ``X_t`` at each layer's input
            (measured with lambda). Only a change of the branches' strength reads it
            (`jaxroll.interventions.BranchScale`: a scaled branch grows the stream that later
            layers' lambdas are shares of); the rollout does not.
        composition: ``()`` or None, the exponent ``q`` in [1, 2] with which paths compose:
            ``p(j) ∝ (e_{N-1}^T |R_T|^{∘q} ... |R_1|^{∘q})_j^{1/q}`` (`jaxroll.rollout.influence`).
            None is ``q = 1``, the paper's rollout, on the kernel's fastest path; a number takes the
            dense path. A measured influence is a gradient norm, whose paths add as vectors: ``q = 1``
            if they are aligned, ``q = 2`` if they are orthogonal (docs/design.md, "How paths compose");
            `jaxroll measure` fits it to the measured influence.

    Build one with `create` (keywords, broadcasting, checks); files in the
    YAML schema are read by `jaxroll.load_config`. Direct construction skips
    the checks and is meant for transformations such as `jax.grad`.
    """

    lambdas: Float[Array, " layers"]
    kernel: AbstractKernel
    sequence_length: int = eqx.field(static=True, default=256)
    stream_norms: Float[Array, " layers"] | None = None
    composition: Float[Array, ""] | None = None

    def __init__(self, lambdas, kernel: AbstractKernel | None = None, sequence_length: int = 256,
                 stream_norms=None, composition=None, **kernel_fields):
        """Unchecked construction (see `create`). `kernel_fields` replace fields of the kernel, so
        ``dataclasses.replace(model, temperature=t)`` changes the kernel's temperature; without a
        kernel they are an `AlibiKernel`'s fields."""
        self.lambdas = lambdas
        self.stream_norms = stream_norms
        self.composition = composition
        if kernel is None:
            self.kernel = AlibiKernel(**kernel_fields)
        else:
            self.kernel = dataclasses.replace(kernel, **kernel_fields) if kernel_fields else kernel
        self.sequence_length = sequence_length

    @property
    def num_layers(self) -> int:
        return self.lambdas.shape[-1]

    @property
    def num_heads(self) -> int:
        return self.kernel.num_heads

    @property
    def mask(self) -> str:
        return self.kernel.mask

    @property
    def window(self) -> int | None:
        return self.kernel.window

    def _alibi_field(self, name: str):
        # The ALiBi + content fields read through the model, on the kernel's analytic kernel (a measured ALiBi
        # config's anchor); a kernel without the field has none to read.
        kernel = self.kernel.analytic_kernel()
        if name not in {field.name for field in dataclasses.fields(kernel)}:
            raise AttributeError(f"{name}: a field of the ALiBi + content kernel; this model's kernel is a "
                                 f"{type(self.kernel).__name__} (read model.kernel)")
        return getattr(kernel, name)

    @property
    def alibi_slopes(self) -> Float[Array, "layers heads"]:
        """``(T, H)``, ALiBi slopes ``m >= 0`` (Press et al. 2022) of an `AlibiKernel`."""
        return self._alibi_field("alibi_slopes")

    @property
    def diagonal_scores(self) -> Float[Array, "layers heads"]:
        """``(T, H)``, diagonal content scores ``d`` in logit units."""
        return self._alibi_field("diagonal_scores")

    @property
    def base_scores(self) -> Float[Array, "layers heads"]:
        """``(T, H)``, content background ``b`` (cancels in the softmax; kept as measured)."""
        return self._alibi_field("base_scores")

    @property
    def head_weights(self) -> Float[Array, "layers heads"]:
        """``(T, H)``, head weights ``w >= 0`` (each layer normalised to sum 1 where the kernel is formed)."""
        return self._alibi_field("head_weights")

    @property
    def probability_shares(self) -> Float[Array, " layers"]:
        """``(T,)``, the probability path's share ``rho_t`` of each attention branch (`jaxroll.engine.probability`);
        zeros for a kernel without it (today's layer ``(1 - lambda) I + lambda A``)."""
        shares = probability.probability_shares(self.kernel)
        return np.zeros(self.num_layers) if shares is None else shares

    @property
    def logit_gains(self) -> Float[Array, "layers heads"]:
        """``(T, H)``, the factor on each head's logit derivative relative to the measured setting (``1 / tau``
        after a temperature); ones for a kernel without the probability path (or once formed by SSMax)."""
        gains = probability.logit_gains(self.kernel)
        return np.ones((self.num_layers, self.num_heads)) if gains is None else gains

    @property
    def temperature(self) -> Float[Array, ""]:
        """``()``, the softmax temperature ``tau > 0``."""
        return self._alibi_field("temperature")

    @classmethod
    def create(
        cls,
        *,
        lambdas,
        kernel: AbstractKernel | None = None,
        num_layers: int | None = None,
        num_heads: int | None = None,
        alibi_slopes=None,
        diagonal_scores=0.0,
        base_scores=0.0,
        head_weights=None,
        temperature=1.0,
        mask: str = "causal",
        window: int | None = None,
        sequence_length: int | None = None,
        probability_shares=None,
        logit_gains=None,
        stream_norms=None,
        composition=None,
    ) -> "RolloutModel":
        """Build a checked model, broadcasting per-layer and per-head values.

        Either a `kernel` (any of `jaxroll.kernel_types`; T from the kernel),
        or the ALiBi + content kernel from `num_layers`, `num_heads` and its
        fields (`AlibiKernel.create`): the per-head fields take a number, an
        ``(H,)`` array (the same heads in every layer), or a
        ``(T or 1, H or 1)`` array, as the YAML schema's nested lists do;
        `alibi_slopes` defaults to the standard slopes of
        `jaxroll.alibi_slopes(num_heads)`, `head_weights` to uniform.
        `lambdas` is a number or a ``(T,)`` array, each in [0, 1].
        `sequence_length` defaults to a dense kernel's N, else 256, and must
        be a length the kernel is defined at. `probability_shares` (a number
        or ``(T,)``, each in [0, 1)) and `logit_gains` (``(T, H)``-broadcast,
        > 0, default 1) extend every layer by the probability path
        (`jaxroll.engine.probability.with_probability_path`); both None keep
        the kernel as it is. `stream_norms` (``(T,)``, finite, > 0, or None)
        are the residual stream's norms at each layer's input, which a
        branch scale reads (`jaxroll.interventions.BranchScale`). `composition`
        (a number in [1, 2], or None for 1 on the fastest path) is the
        exponent q with which paths compose (`RolloutModel.composition`).

        Raises:
            ConfigError: a one-line message naming the field, the value and
                what is allowed.
        """
        if kernel is None:
            if num_layers is None or num_heads is None:
                raise ConfigError("kernel: got none; allowed: a kernel, or num_layers and num_heads "
                                  "(the ALiBi + content kernel)")
            kernel = AlibiKernel.create(num_layers=num_layers, num_heads=num_heads, alibi_slopes=alibi_slopes,
                                        diagonal_scores=diagonal_scores, base_scores=base_scores,
                                        head_weights=head_weights, temperature=temperature, mask=mask,
                                        window=window)
        elif not isinstance(kernel, AbstractKernel):
            raise ConfigError(f"kernel: got {type(kernel).__name__}; allowed: one of jaxroll.kernel_types "
                              "(an AbstractKernel)")
        else:
            kernel.check()
            if num_layers is not None and check_positive_int("num_layers", num_layers) != kernel.num_layers:
                raise ConfigError(f"num_layers: got {num_layers}; allowed: the kernel's {kernel.num_layers}")
        if probability_shares is not None or logit_gains is not None:
            shares = 0.0 if probability_shares is None else probability_shares
            kernel = probability.with_probability_path(kernel, shares, 1.0 if logit_gains is None else logit_gains)
        lambdas = _per_layer("lambdas", lambdas, kernel.num_layers)
        check_range("lambdas", lambdas, 0.0, 1.0)
        sequence_length = check_positive_int(
            "sequence_length", kernel.default_length() if sequence_length is None else sequence_length)
        kernel.check_length(sequence_length)
        return cls(lambdas=lambdas, kernel=kernel, sequence_length=sequence_length,
                   stream_norms=checked_stream_norms(stream_norms, kernel.num_layers),
                   composition=checked_composition(composition))


COMPOSITION_RANGE = (1.0, 2.0)
"""The exponents q a model may compose with: aligned paths (1) to orthogonal ones (2)."""


def checked_composition(value):
    """`value` as a float ``()`` array in `COMPOSITION_RANGE`; None stays None.

    Raises:
        ConfigError: one line naming ``composition``, the value and what is allowed.
    """
    if value is None:
        return None
    q = as_float_array("composition", value)
    low, high = COMPOSITION_RANGE
    if q.ndim != 0 or not np.isfinite(q) or not low <= q <= high:
        raise ConfigError.of("composition", np.asarray(value).tolist(), f"a number in [{low:g}, {high:g}], or none")
    return q


def checked_stream_norms(values, num_layers: int):
    """`values` as a float ``(T,)`` array, each finite and > 0; None stays None.

    Raises:
        ConfigError: one line naming ``stream_norms``, the value and what is allowed.
    """
    if values is None:
        return None
    norms = as_float_array("stream_norms", values).reshape(-1)
    if norms.shape != (num_layers,) or not np.all(np.isfinite(norms)) or np.any(norms <= 0):
        raise ConfigError.of("stream_norms", np.asarray(values).tolist(),
                             f"{num_layers} (num_layers) finite numbers > 0, or none")
    return norms


KernelRolloutModel = RolloutModel
"""The name earlier releases gave a model over any kernel: the same type (`RolloutModel.create(kernel=...)`)."""


def is_model(value) -> bool:
    """Whether `value` is a rollout model (the one type check on models; arguments that take a
    model or an array dispatch on it)."""
    return isinstance(value, RolloutModel)  # the model-type check every caller shares


def check_model(value, field: str = "model") -> RolloutModel:
    """`value` itself, or a one-line `ConfigError` naming what was given."""
    if not is_model(value):
        raise ConfigError(f"{field}: got {type(value).__name__}; allowed: a jaxroll.RolloutModel")
    return value


def with_probability_path(model: RolloutModel, shares, logit_gains=1.0) -> RolloutModel:
    """`model` with every layer extended by the probability path (`jaxroll.engine.probability`): shares
    ``rho_t`` in [0, 1) of each branch, logit gains ``sigma_{t,h} > 0`` relative to the measured setting, and
    ``R_t(i, :) = ((1 - lambda_t) e_i + lambda_t sum_h w_h W_h A_h(i, :)) / (1 - lambda_t + lambda_t W)`` with
    ``W_h = 1 - rho_t + rho_t sigma_{t,h}``, ``W = sum_h w_h W_h``. At ``sigma = 1`` (or ``rho = 0``) it is
    `model`'s rollout exactly. Pure and differentiable in both (jit, grad, vmap)."""
    model = check_model(model)
    return dataclasses.replace(model, kernel=probability.with_probability_path(model.kernel, shares, logit_gains))


def layer_kernels(model: RolloutModel, n: int) -> Float[Array, "layers n n"]:
    """The dense layer kernels ``A_t`` at length n, ``(T, n, n)``, one layer at a time (``lax.map``:
    O(H n^2) live); traceable, so `jax.grad` runs through the kernel's arrays. With the probability
    path, ``K_t`` (its lambdas are the kernel's `step`'s, not in this array)."""
    stacked, shared = model.kernel.scan_parts()
    return jax.lax.map(lambda part: eqx.combine(part, shared).dense(n), stacked)


def as_dense_model(model: RolloutModel, n: int | None = None) -> RolloutModel:
    """`model` with its layer kernels at length n (default its own) as a `DenseKernel`, same lambdas.

    ``A_t`` is the kernel's ``dense(n)`` in float64 with rows renormalised to
    sum 1 (a float32 kernel's rows miss 1 by ~1e-7); a model whose kernel
    already is dense is returned as it is. O(T n^2) memory.
    """
    if model.kernel.stores_dense:
        return model
    if model.kernel.mixes_rows:  # its rows' own lambdas would be lost in one dense kernel per layer
        raise ConfigError.of("model.kernel", type(model.kernel).__name__, "a kernel without the probability path "
                             "(jaxroll.engine.probability.plain_kernel), or a dense kernel extended by it")
    n = model.sequence_length if n is None else check_positive_int("n", n)
    model.kernel.check_length(n)
    kernels = np.array(layer_kernels(model, n), dtype=np.float64)
    kernels /= kernels.sum(axis=-1, keepdims=True)
    return RolloutModel.create(kernel=DenseKernel.create(kernels), lambdas=np.asarray(model.lambdas),
                               sequence_length=n, composition=model.composition)
