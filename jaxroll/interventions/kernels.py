"""Interventions that change the attention logits: temperature, slope scale, distance bias.

Head h of layer t scores ``s_{t,h}(i, j)``; for ALiBi + content
``s = (-m (i - j) + d [i == j] + b) / tau_0`` (Press et al. 2022;
arXiv 2602.16837), for a relative kernel ``s = f_h(i - j)``. Each intervention
here maps the scores, and on these kernel types the map is again a kernel of
the theory: the rollout transform is exact. A measured `DenseKernel` is a mean
over sequences of softmax rows; changing its logits is not the same as
changing every sequence's logits before the mean, so there the transform is an
approximation (stated on each class).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln
from jaxtyping import Array, Float

from ..engine.alibi import allowed
from ..engine.dense import DenseKernel
from ..errors import ConfigError
from ..model import RolloutModel, check_model
from ._base import AbstractIntervention, checked_parameter, per_layer_head, plain_value
from .registry import register_intervention

__all__ = ["Temperature", "LengthScaledLogits", "SlopeScale", "DistanceBias", "DistanceScore", "log1p_distance",
           "unsquash_distance"]


def _replace_kernel(model: RolloutModel, kernel) -> RolloutModel:
    return dataclasses.replace(model, kernel=kernel)


@register_intervention
class Temperature(AbstractIntervention):
    """Logits divided by ``tau_{t,h} > 0``: ``s'_{t,h}(i, j) = s_{t,h}(i, j) / tau_{t,h}``.

    ``tau < 1`` sharpens every head's softmax, ``tau > 1`` flattens it.
    `tau` is a number, ``(H,)``, ``(T, 1)`` or ``(T, H)`` (a ``(T,)`` array is
    per layer unless T == H).

    Rollout transform: exact on ALiBi + content (slopes, content and
    background divided by tau) and on relative kernels (``f_h / tau``). On a
    measured `DenseKernel`, a mean over sequences of softmax rows, the
    transform tempers the mean, ``A'[i, j] ~ A[i, j]^(1 / tau_t)`` renormalised
    per row: exact for a kernel that is one softmax of one sequence, an
    approximation for a mean (the mean of tempered rows is not the tempered
    mean); `tau` is then per layer only.

    Attention temperature as a lever on position bias: SSMax (Nakanishi 2025,
    arXiv 2501.19399) scales logits by ``s log n``, a length-dependent
    temperature (`LengthScaledLogits`); this class is the constant form.
    """

    name, parameter, neutral, order = "tau", "tau", 1.0, 20
    box, log_box, lowest = (0.25, 4.0), True, (0.0, True)  # a scale: as much room below 1 as above
    sweep_axis, torch_change = True, "divide"

    tau: Float[Array, "..."]

    def __init__(self, tau):
        self.tau = checked_parameter("tau", tau, 0.0, low_open=True)

    def apply(self, model: RolloutModel) -> RolloutModel:
        return _replace_kernel(model, check_model(model).kernel.temper(self.tau, "tau"))


@register_intervention
class LengthScaledLogits(AbstractIntervention):
    """SSMax: row i's logits multiplied by ``s_{t,h} ln n_i``, n_i the number of keys row i reads.

    Scalable-softmax (Nakanishi 2025, arXiv 2501.19399) replaces
    ``softmax(z)`` over n keys by ``softmax(s ln(n) z)``, so attention does
    not flatten as the context grows; under a causal mask ``n_i = i + 1``
    (row 0 reads one key, its weight stays 1). `scale` is a number, ``(H,)``,
    ``(T, 1)`` or ``(T, H)``, each > 0.

    Rollout transform: exact on ALiBi + content and relative kernels. The
    changed kernel is no longer of either family (each row has its own
    temperature), so it is formed densely at the model's `sequence_length`
    as a `DenseKernel`: O(T N^2) memory, the plain O(N^2) product per layer.
    Refused on a measured `DenseKernel` (its logits are not known). On a
    kernel extended by the probability path the kernel forms the changed
    layers itself (`AbstractKernel.scaled_rows`: attention and spread per
    layer, gains kept), so the spreads are those of the scaled logits.
    """

    name, parameter, order, lowest = "ssmax_scale", "scale", 50, (0.0, True)  # no neutral value: s ln n_i != 1
    torch_change = "log_length"

    scale: Float[Array, "..."]

    def __init__(self, scale):
        self.scale = checked_parameter("ssmax_scale", scale, 0.0, low_open=True)

    def apply(self, model: RolloutModel) -> RolloutModel:
        kernel = check_model(model).kernel
        scale = per_layer_head("ssmax_scale", self.scale, model)
        n = model.sequence_length
        keep = allowed(n, kernel.mask, kernel.window)
        row_log_length = jnp.log(jnp.sum(keep, axis=1).astype(jnp.result_type(float)))  # ln n_i, (n,)
        formed = kernel.scaled_rows(scale, row_log_length, n, "ssmax_scale")  # a layer beyond its softmax rows
        if formed is not None:
            return _replace_kernel(model, formed)
        stacked, shared = kernel.scan_parts()

        def layer_kernel(inputs):  # one layer at a time: O(H n^2) memory, not O(T H n^2)
            part, layer_scale = inputs
            logits, weights = eqx.combine(part, shared).head_logits(n, "ssmax_scale")
            scaled = logits * (layer_scale[:, None, None] * row_log_length[:, None])
            per_head = jax.nn.softmax(jnp.where(keep, scaled, -jnp.inf), axis=-1)
            return jnp.einsum("h,hij->ij", weights, per_head)

        kernels = jax.lax.map(layer_kernel, (stacked, scale))
        return _replace_kernel(model, DenseKernel(kernels, kernel.mask == "causal"))


@register_intervention
class SlopeScale(AbstractIntervention):
    """ALiBi slopes multiplied by ``s_{t,h} >= 0``: ``m' = s m`` (Press et al. 2022's bias ``-m (i - j)``).

    ``s > 1`` strengthens the recency bias, ``s = 0`` removes it. `scale` is a
    number, ``(H,)``, ``(T, 1)`` or ``(T, H)``. Rollout transform: exact on
    ALiBi + content and on `PowerKernel` (``f = -m k^alpha``); refused on
    other kernels (a rotary model has no slopes).
    """

    name, parameter, neutral, order = "slope_scale", "scale", 1.0, 30
    box, lowest = (0.0, 4.0), (0.0, False)
    torch_change = "bias_scale"  # a sweep varies slope_scale as a kernel axis (KERNEL_AXES), a factor on the slopes

    scale: Float[Array, "..."]

    def __init__(self, scale):
        self.scale = checked_parameter("slope_scale", scale, 0.0)

    def apply(self, model: RolloutModel) -> RolloutModel:
        return _replace_kernel(model, check_model(model).kernel.scale_slopes(self.scale, "slope_scale"))


def log1p_distance(distance):
    """``g(m) = ln(1 + m)``: a plain logarithmic distance bias (``g(0) = 0``)."""
    return jnp.log1p(distance)


def unsquash_distance(distance, k: float = 2.0):
    """``g(m) = ln c_m`` with ``c_m = Gamma(m + 1/k) / (Gamma(m + 1) Gamma(1/k))`` (``g(0) = 0``).

    The "unsquash" coefficients of Attributor (tylerpayne/Attributor,
    ``unsquashed/``): ``c_m ~ m^(1/k - 1) / Gamma(1/k)`` for large m, so with
    ``kappa > 0`` the bias falls like ``(1/k - 1) kappa ln m``. Default k = 2.
    """
    alpha = 1.0 / k
    return gammaln(distance + alpha) - gammaln(distance + 1.0) - gammaln(alpha)


_DISTANCE_FORMS = {"log1p": log1p_distance, "unsquash": unsquash_distance}


@dataclasses.dataclass(frozen=True)
class DistanceScore:
    """``g(m)`` of a named distance form: ``log1p``, ``g(m) = ln(1 + m)``, or ``unsquash``, ``g(m) = ln c_m``
    (`unsquash_distance` with its k). A callable a kernel evaluates at the distances it needs, and whose name
    (`form`, `k`) lets a measured kernel read its tables of rows under that form
    (`jaxroll.kernel_types.GainTableKernel`)."""

    form: str
    k: float = 2.0

    def __post_init__(self):
        if self.form not in _DISTANCE_FORMS:
            raise ConfigError(f"kappa_form: got {self.form!r:.60}; allowed: log1p or unsquash")

    def __call__(self, distance):
        distance = jnp.asarray(distance, dtype=jnp.result_type(float))
        if self.form == "unsquash":
            return unsquash_distance(distance, self.k)
        return log1p_distance(distance)


@register_intervention
class DistanceBias(AbstractIntervention):
    """``kappa_{t,h} g(i - j)`` added to the logits of every causal pair: ``s' = s + kappa g(i - j)``.

    `form` is ``"log1p"`` (``g(m) = ln(1 + m)``) or ``"unsquash"`` (``g(m) =
    ln c_m``, Attributor's coefficients with ``k`` = `k`, default 2; see
    `unsquash_distance`). `kappa` is a number, ``(H,)``, ``(T, 1)`` or
    ``(T, H)``; negative kappa with ``log1p`` favours distant tokens.

    Rollout transform: exact on ALiBi + content and relative kernels, where
    the result is an offset kernel (`TableKernel`) with ``f'_h(r) = f_h(r) +
    kappa_h g(r)``, defined up to the model's `sequence_length` (causal masks
    only). On a measured `DenseKernel` (a mean of softmax rows) the kernel is
    reweighted, ``A'[i, j] ~ A[i, j] e^(kappa_t g(i - j))`` renormalised per
    row: exact for one sequence's kernel, an approximation for a mean; kappa
    is then per layer.
    """

    name, parameter, neutral, order = "kappa", "kappa", 0.0, 40
    options, options_purpose = ("kappa_form", "kappa_k"), "set the distance bias' form"
    box, sweep_axis, torch_change = (-2.0, 2.0), True, "add"

    @classmethod
    def text_value(cls, name: str, text: str):
        return text if name == "kappa_form" else super().text_value(name, text)

    @classmethod
    def from_record(cls, mapping: dict, source: str = "--intervene") -> DistanceBias:
        form, k = mapping.get("kappa_form", "log1p"), mapping.get("kappa_k", 2.0)
        if not isinstance(form, str):
            raise ConfigError(f"{source} kappa_form: got {form!r:.60}; allowed: log1p or unsquash")
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ConfigError(f"{source} kappa_k: got {k!r:.60}; allowed: a number > 0")
        return cls(mapping["kappa"], form, k=float(k))

    def record(self) -> dict:
        return {"kappa": plain_value(self.kappa), "kappa_form": self.form, "kappa_k": self.k}

    def torch_distance(self) -> tuple:
        return self.form, self.k

    kappa: Float[Array, "..."]
    form: str = eqx.field(static=True, default="log1p")
    k: float = eqx.field(static=True, default=2.0)

    def __init__(self, kappa, form: str = "log1p", k: float = 2.0):
        if form not in _DISTANCE_FORMS:
            raise ConfigError(f"form: got {form!r}; allowed: one of {', '.join(_DISTANCE_FORMS)}")
        if not (isinstance(k, (int, float)) and k > 0):
            raise ConfigError(f"k: got {k!r}; allowed: a number > 0")
        self.kappa = checked_parameter("kappa", kappa)
        self.form = form
        self.k = float(k)

    @property
    def score(self) -> DistanceScore:
        """``g``, named by its form: ``score(m)`` at distances m >= 0."""
        return DistanceScore(self.form, self.k)

    def apply(self, model: RolloutModel) -> RolloutModel:
        kernel = check_model(model).kernel
        if kernel.mask != "causal":
            raise ConfigError(f"kappa: a distance bias on a {kernel.mask!r} mask; allowed: causal kernels")
        return _replace_kernel(model, kernel.add_distance_score(self.kappa, self.score, model.sequence_length,
                                                                "kappa"))
