"""Masks, ALiBi slopes, scores and the dense attention kernels of the theory.

Convention (arXiv 2602.16837): ``A[i, j]`` is the weight with which token i
reads token j (an edge j -> i); rows sum to 1. Head h of a layer scores

    s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau

on the allowed entries (``m_h >= 0`` the ALiBi slope of Press et al. 2022,
``d_h`` the diagonal content score, ``b_h`` the content background, ``tau`` the
softmax temperature), ``A_h = rowsoftmax(s_h)``, and the layer kernel is the
head average ``A = sum_h w_h A_h`` with ``w_h >= 0`` normalised to sum 1.

The dense O(N^2) kernels here are for inspection and the reference for the
structured O(N) products of `jaxroll.engine.structured`; `AlibiKernel` is the
kernel type over them (the kernel of every `RolloutModel.create` with ALiBi
slopes and content).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import equinox as eqx

from .. import memory
from .._checks import as_float_array, check_positive_int, check_range, is_concrete, per_layer_and_head
from ..errors import ConfigError
from . import structured
from .config import check_keys, compact, nested_array
from .kernel import MASKS, AbstractKernel, allowed, layer_head_values, refuses, register_kernel
from .offset import biased_table
from .plan import Path

__all__ = ["MASKS", "AlibiKernel", "alibi_slopes", "allowed", "head_scores", "layer_kernel"]



def alibi_slopes(num_heads: int) -> np.ndarray:
    """The standard ALiBi slopes of Press et al. (2022), shape ``(H,)``.

    For H a power of two, ``m_h = 2^(-8 (h + 1) / H)``, h = 0..H-1. Otherwise,
    with ``n = 2^floor(log2 H)``, the first n slopes are those of n heads and
    the remaining ``H - n`` are every other slope of 2n heads,
    ``2^(-4 (2k + 1) / n)``, k = 0..H-n-1: the rule of BLOOM's
    ``build_alibi_tensor`` (BLOOM-176B has 112 heads) and of the ALiBi
    reference code.
    """
    num_heads = check_positive_int("num_heads", num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = 2.0 ** (-8.0 * np.arange(1, closest + 1) / closest)
    extra = 2.0 ** (-4.0 * np.arange(1, 2 * (num_heads - closest), 2) / closest)
    return np.concatenate([slopes, extra])


def head_scores(
    slope: Float[Array, ""],
    diagonal_score: Float[Array, ""],
    base_score: Float[Array, ""],
    temperature: Float[Array, ""],
    n: int,
) -> Float[Array, "n n"]:
    """``s(i, j) = (-m (i - j) + d [i == j] + b) / tau`` for every (i, j).

    The background `base_score` adds the same value to every allowed entry of
    a row, so it cancels in the row softmax: it is kept for completeness (the
    measured configurations carry it) and changes no kernel.
    """
    offsets = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]
    scores = -slope * offsets + diagonal_score * jnp.eye(n) + base_score
    return scores / temperature


def layer_kernel(
    slopes: Float[Array, " heads"],
    diagonal_scores: Float[Array, " heads"],
    base_scores: Float[Array, " heads"],
    head_weights: Float[Array, " heads"],
    temperature: Float[Array, ""],
    n: int,
    mask: str = "causal",
    window: int | None = None,
) -> Float[Array, "n n"]:
    """The dense layer kernel ``A = sum_h w_h rowsoftmax(s_h)``, shape ``(n, n)``.

    The softmax subtracts each row's largest allowed score before
    exponentiating, so scores of any magnitude (content of +-1000, slopes of
    10) neither overflow nor underflow to an empty row.
    """
    keep = allowed(n, mask, window)
    scores = jax.vmap(head_scores, in_axes=(0, 0, 0, None, None))(
        slopes, diagonal_scores, base_scores, temperature, n
    )
    per_head = jax.nn.softmax(jnp.where(keep, scores, -jnp.inf), axis=-1)
    weights = head_weights / jnp.sum(head_weights)
    return jnp.einsum("h,hij->ij", weights, per_head)


_standard_slopes = alibi_slopes  # `AlibiKernel.create` has a parameter of that name

# The paper's schema (arXiv 2602.16837's published files): the kernel's three top-level sections.
_SCHEMA_MASKS = {"causal": "causal", "full": "full", "sliding_window": "sliding"}
_SECTION_KEYS = {"mask_config": {"mask_type", "window_size"},
                 "attention_config": {"num_heads", "alibi_slopes", "head_weights", "softmax_temperature"},
                 "content_config": {"diagonal_scores", "base_scores"}}
# Where each keyword of `AlibiKernel.create` lives in the schema, for error messages.
_SCHEMA_PATHS = {"alibi_slopes": "attention_config.alibi_slopes", "diagonal_scores": "content_config.diagonal_scores",
                 "base_scores": "content_config.base_scores", "head_weights": "attention_config.head_weights",
                 "temperature": "attention_config.softmax_temperature", "mask": "mask_config.mask_type",
                 "window": "mask_config.window_size"}


class AlibiKernel(AbstractKernel):
    """ALiBi + diagonal content, ``s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau``.

    ``A_t = sum_h w_{t,h} rowsoftmax(s_{t,h})`` on the allowed entries of the
    mask (Press et al. 2022 for ALiBi; arXiv 2602.16837 for the content
    score). ``v^T A`` by the O(H N) products of `jaxroll.engine.structured`,
    ``dense`` by `layer_kernel`.

    Attributes:
        alibi_slopes: ``(T, H)``, ALiBi slopes ``m >= 0``.
        diagonal_scores: ``(T, H)``, diagonal content scores ``d`` in logit units.
        base_scores: ``(T, H)``, content background ``b``; it adds the same
            value to every score of a row and so cancels in the softmax: kept
            because measured configurations carry it, it changes no profile.
        head_weights: ``(T, H)``, ``w >= 0``; each layer's row is normalised
            to sum 1 where the kernel is formed.
        temperature: ``()``, the softmax temperature ``tau > 0`` (every layer).
        mask: ``"causal"`` (j <= i), ``"sliding"`` (i - W < j <= i) or
            ``"full"`` (every j). Static.
        window: the sliding window W, or None. Static.
    """

    alibi_slopes: Float[Array, "layers heads"]
    diagonal_scores: Float[Array, "layers heads"]
    base_scores: Float[Array, "layers heads"]
    head_weights: Float[Array, "layers heads"]
    temperature: Float[Array, ""]
    mask: str = eqx.field(static=True, default="causal")
    window: int | None = eqx.field(static=True, default=None)

    @classmethod
    def create(cls, *, num_layers: int, num_heads: int, alibi_slopes=None, diagonal_scores=0.0, base_scores=0.0,
               head_weights=None, temperature=1.0, mask: str = "causal", window: int | None = None) -> "AlibiKernel":
        """Build a checked kernel, broadcasting per-layer and per-head values.

        The per-head fields take a number, an ``(H,)`` array (the same heads
        in every layer), or a ``(T or 1, H or 1)`` array, as the YAML
        schema's nested lists do. `alibi_slopes` defaults to `alibi_slopes`
        of H heads, `head_weights` to uniform.

        Raises:
            ConfigError: a one-line message naming the field, the value and
                what is allowed.
        """
        num_layers = check_positive_int("num_layers", num_layers)
        num_heads = check_positive_int("num_heads", num_heads)
        # Five (T, H) float64 arrays: refuse sizes that cannot be allocated.
        memory.check_fits(5 * 8 * num_layers * num_heads, f"num_layers x num_heads = {num_layers} x {num_heads}",
                          allowed="fewer layers or heads")
        if mask not in MASKS:
            raise ConfigError(f"mask: got {mask!r}; allowed: one of {', '.join(MASKS)}")
        if mask == "sliding":
            if window is None:
                raise ConfigError("window: a sliding mask needs a window size; allowed: an integer >= 1")
            window = check_positive_int("window", window)
        if alibi_slopes is None:
            alibi_slopes = _standard_slopes(num_heads)
        if head_weights is None:
            head_weights = np.full(num_heads, 1.0 / num_heads)
        per_head = {"alibi_slopes": alibi_slopes, "diagonal_scores": diagonal_scores, "base_scores": base_scores,
                    "head_weights": head_weights}
        arrays = {name: per_layer_and_head(name, value, num_layers, num_heads) for name, value in per_head.items()}
        temperature = as_float_array("temperature", temperature)
        if temperature.shape != ():
            raise ConfigError(f"temperature: got shape {temperature.shape}; allowed: one number")
        kernel = cls(temperature=temperature, mask=mask, window=window if mask == "sliding" else None, **arrays)
        kernel.check()
        return kernel

    def check(self) -> None:
        arrays = (self.alibi_slopes, self.diagonal_scores, self.base_scores, self.head_weights, self.temperature)
        if not all(is_concrete(array) for array in arrays):
            return
        check_range("temperature", np.asarray(self.temperature), 0.0, None, low_open=True)
        check_range("alibi_slopes", np.asarray(self.alibi_slopes), 0.0, None)
        check_range("diagonal_scores", np.asarray(self.diagonal_scores))
        check_range("base_scores", np.asarray(self.base_scores))
        weights = np.asarray(self.head_weights)
        check_range("head_weights", weights, 0.0, None)
        empty = ~(weights.sum(axis=-1) > 0)
        if empty.any():
            raise ConfigError(f"head_weights: layer {int(np.argmax(empty))} has all-zero weights; "
                              "allowed: >= 0 with a positive sum")

    @property
    def num_layers(self) -> int:
        return self.alibi_slopes.shape[-2]

    @property
    def num_heads(self) -> int:
        return self.alibi_slopes.shape[-1]

    def check_length(self, n: int) -> None:
        del n  # defined at every length

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        return memory.influence_bytes(n, self.num_heads, method, itemsize)

    def row_bytes(self, n: int, itemsize: int) -> int:
        # A vmapped layer step holds a few (head chunk, n) arrays per row (`structured.HEAD_CHUNK`).
        return n * itemsize * (6 * min(self.num_heads, structured.HEAD_CHUNK) + 3)

    def row_times_kernel(self, v, path: Path = Path()):
        return structured.row_times_kernel(v, self.alibi_slopes, self.diagonal_scores, self.base_scores,
                                           self.head_weights, self.temperature, self.mask, self.window,
                                           transient=path.transient, settled=bool(path.settled))

    def dense(self, n: int):
        return layer_kernel(self.alibi_slopes, self.diagonal_scores, self.base_scores, self.head_weights,
                            self.temperature, n, self.mask, self.window)

    # The planner's hooks: decided in NumPy on concrete arrays, before compilation.

    def _traced(self, *arrays) -> bool:
        return not all(is_concrete(array) for array in arrays)

    def plan(self, n: int, method: str, dtype) -> Path:
        """One shared dense kernel at small N, layer 0's slopes hoisted, the settled prefix (causal).

        - ``shared_kernel``: concrete arrays that provably share one causal
          kernel, at N <= `structured.SHARED_DENSE_MAX` (deciding here keeps
          both a run-time test and the second branch out of every compiled
          program: a `lax.cond` compiled both and slowed per-layer models by
          1.6x at N = 256). A traced kernel takes the per-layer products,
          whose gradient is every layer's own.
        - ``shared_slopes``: every layer has layer 0's slopes, which the
          product then reads from outside the scan: its normaliser tables
          become loop-invariant and XLA computes them once instead of once
          per layer (BLOOM-176B with per-head content, N = 256, float64:
          32 -> 8 ms in one interleaved run). Concrete slopes only: reading
          layer 0's in every layer would send every layer's slope gradient there.
        - ``settled``: concrete arrays settle statically (`structured.settled_prefix`:
          the shortest prefix P every weighted head settles within, when n > P);
          traced ones beyond the dtype's prefix take one `lax.switch` around the
          whole rollout (`settled_rung`) instead of a branch in every product.
        """
        causal = self.mask == "causal"
        if causal and n <= structured.SHARED_DENSE_MAX and not self._traced(
                self.alibi_slopes, self.diagonal_scores, self.head_weights):
            if structured.shares_one_kernel(self.alibi_slopes, self.diagonal_scores, self.head_weights):
                return Path(method=method, shared_kernel=True)
        shared_slopes = not self._traced(self.alibi_slopes) and bool(
            (np.asarray(self.alibi_slopes) == np.asarray(self.alibi_slopes)[:1]).all())
        if not causal:
            return Path(method=method, shared_slopes=shared_slopes)
        if self._traced(self.alibi_slopes, self.head_weights, self.temperature):
            if n <= structured.transient_rows(dtype):
                return Path(method=method, shared_slopes=shared_slopes)
            rungs = (Path(method=method, shared_slopes=shared_slopes, settled=True,
                          transient=structured.alibi_prefix(dtype)),
                     Path(method=method, shared_slopes=shared_slopes, settled=True),
                     Path(method=method, shared_slopes=shared_slopes))
            return Path(method=method, shared_slopes=shared_slopes, settled=None, rungs=rungs)
        prefix = structured.settled_prefix(self.alibi_slopes, self.head_weights, self.temperature, dtype)
        if prefix is None or n <= prefix:
            return Path(method=method, shared_slopes=shared_slopes)
        return Path(method=method, shared_slopes=shared_slopes, settled=True, transient=prefix)

    def scan_parts(self, path: Path = Path()):
        stacked, shared = super().scan_parts(path)
        if path.shared_slopes:  # layer 0's slopes, read whole by every step (loop-invariant)
            stacked = eqx.tree_at(lambda k: k.alibi_slopes, stacked, None, is_leaf=lambda x: x is None)
            shared = eqx.tree_at(lambda k: k.alibi_slopes, shared, self.alibi_slopes[0],
                                 is_leaf=lambda x: x is None)
        return stacked, shared

    def shared_rollout_row(self, row, lambdas):
        """``row^T R_T ... R_1`` with layer 0's kernel in every layer, formed once densely.

        Plain JAX, differentiated by autodiff: the kernel's arrays are
        concrete here (constants, `plan`), so only lambdas and the temperature
        carry a gradient, and both enter as in the per-layer form.
        """
        return structured.shared_kernel_rollout_row(row, lambdas, self.alibi_slopes[0], self.diagonal_scores[0],
                                                    self.head_weights[0], self.temperature)

    def settled_rung(self, dtype):
        return structured.settled_rung(self.alibi_slopes, self.head_weights, self.temperature, dtype)

    # Declared capabilities (`AbstractKernel`): logit operations, YAML form, sweep and fit fields.

    config_kind = "alibi"
    config_keys = frozenset(_SECTION_KEYS)
    sweep_fields = ("alibi_slopes", "slope_scale", "diagonal_scores", "head_weights", "temperature")
    slope_field = "alibi_slopes"
    fittable_fields = {"diagonal_scores": "real", "alibi_slopes": "positive", "head_weights": "simplex",
                       "temperature": "positive"}

    def _layer_head(self, field, value):
        return layer_head_values(field, value, self.num_layers, self.num_heads)

    def temper(self, tau, field: str = "tau") -> "AlibiKernel":
        """Slopes, content and background divided by ``tau`` (``(T, H)``-broadcast): exact."""
        tau = self._layer_head(field, tau)
        return dataclasses.replace(self, alibi_slopes=self.alibi_slopes / tau,
                                   diagonal_scores=self.diagonal_scores / tau, base_scores=self.base_scores / tau)

    def scale_slopes(self, scale, field: str = "slope_scale") -> "AlibiKernel":
        return dataclasses.replace(self, alibi_slopes=self.alibi_slopes * self._layer_head(field, scale))

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa"):
        """An offset kernel (`TableKernel`) of ``f_h(k) = -(m_h / tau) k + kappa_h g(k)`` for k = 1..n-1 and
        ``f_h(0) = d_h / tau + kappa_h g(0)``: exact (the background cancels)."""
        kappa = self._layer_head(field, kappa)
        rate = self.alibi_slopes / self.temperature  # (T, H)
        offsets = jnp.arange(1, max(n, 2), dtype=jnp.result_type(float))
        return biased_table(-rate[..., None] * offsets, self.diagonal_scores / self.temperature, self.head_weights,
                            kappa, score, n)

    @refuses
    def read_at_distances(self, ratio, n: int, field: str = "rotary_ratio"):
        del ratio, n
        allowed = self.refusal(field, "", "read_at_distances", "a rotary model's measured offset kernel ({types})").allowed
        raise ConfigError(f"{field}: a rotary rescale on an ALiBi model; allowed: {allowed}", field=field,
                          value=type(self).__name__, allowed=allowed)

    def head_logits(self, n: int, field: str = "logits"):
        """``s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau``, ``(H, n, n)``, and ``w / sum w``."""
        logits = jax.vmap(head_scores, in_axes=(0, 0, 0, None, None))(self.alibi_slopes, self.diagonal_scores,
                                                                      self.base_scores, self.temperature, n)
        return logits, self.head_weights / jnp.sum(self.head_weights, axis=-1, keepdims=True)

    def reweighted_heads(self, factors):
        """Head weights ``w_h factors[h]`` (one layer) and ``sum_h (w_h / sum w) factors[h]``."""
        return (dataclasses.replace(self, head_weights=self.head_weights * factors),
                jnp.sum(self.head_weights * factors, axis=-1) / jnp.sum(self.head_weights, axis=-1))

    def scores_by_offset(self, n: int):
        """``f_h(k) = (-m_h k + d_h [k = 0]) / tau`` (the background cancels in the softmax); causal masks only."""
        if self.mask != "causal":
            return None
        offsets = jnp.arange(n, dtype=self.alibi_slopes.dtype)
        diagonal = jnp.where(offsets == 0, self.diagonal_scores[..., None], 0.0)
        scores = (-self.alibi_slopes[..., None] * offsets + diagonal) / self.temperature
        return scores, self.head_weights / jnp.sum(self.head_weights, axis=-1, keepdims=True)

    def padded(self, num_layers: int, num_heads: int) -> "AlibiKernel":
        """Heads ``H..H'-1`` with weight 0 and head 0's slope and scores; layers ``T..T'-1`` copies of the
        last layer (NumPy: the padding is decided on concrete arrays)."""
        layers, heads = self.num_layers, self.num_heads

        def per_head(values, fill_weight: bool = False):
            values = np.asarray(values)
            extra = np.zeros_like(values[:, :1]) if fill_weight else values[:, :1]
            values = np.concatenate([values, np.repeat(extra, num_heads - heads, axis=1)], axis=1)
            return np.concatenate([values, np.repeat(values[-1:], num_layers - layers, axis=0)], axis=0)

        return dataclasses.replace(self, alibi_slopes=per_head(self.alibi_slopes),
                                   diagonal_scores=per_head(self.diagonal_scores),
                                   base_scores=per_head(self.base_scores),
                                   head_weights=per_head(self.head_weights, fill_weight=True))

    def to_config(self, kernel_file: str | None = None) -> dict:
        """The paper's ``mask_config``, ``attention_config`` and ``content_config``; uniform weights as null."""
        del kernel_file
        weights = np.asarray(self.head_weights, dtype=np.float64)
        uniform = np.all(weights == weights.flat[0])
        schema_mask = {value: key for key, value in _SCHEMA_MASKS.items()}[self.mask]
        return {
            "mask_config": {"mask_type": schema_mask, "window_size": self.window},
            "attention_config": {
                "num_heads": int(self.num_heads),
                "alibi_slopes": compact(self.alibi_slopes),
                "head_weights": None if uniform else compact(weights),
                "softmax_temperature": float(self.temperature),
            },
            "content_config": {"diagonal_scores": compact(self.diagonal_scores),
                               "base_scores": compact(self.base_scores)},
        }

    @classmethod
    def from_config(cls, config, *, num_layers: int, directory=None) -> "AlibiKernel":
        """The kernel of the paper's sections; lists of length 1 broadcast over layers (outer) or heads (inner)."""
        del directory
        check_keys("", config, _SECTION_KEYS, required={"attention_config"})
        mask_config, attention = config.get("mask_config") or {}, config["attention_config"]
        content = config.get("content_config") or {}
        for section, value in (("mask_config", mask_config), ("attention_config", attention),
                               ("content_config", content)):
            check_keys(section, value, _SECTION_KEYS[section],
                       required={"num_heads", "alibi_slopes"} if section == "attention_config" else ())
        num_heads = check_positive_int("attention_config.num_heads", attention["num_heads"])
        mask_type = mask_config.get("mask_type", "causal")
        if not isinstance(mask_type, str) or mask_type not in _SCHEMA_MASKS:
            raise ConfigError(f"mask_config.mask_type: got {mask_type!r}; allowed: one of " + ", ".join(_SCHEMA_MASKS))
        window = mask_config.get("window_size")
        if mask_type == "sliding_window" and window is None:
            raise ConfigError("mask_config.window_size: sliding_window needs a window size; allowed: an integer >= 1")
        try:
            return cls.create(
                num_layers=num_layers, num_heads=num_heads,
                alibi_slopes=nested_array("alibi_slopes", attention["alibi_slopes"]),
                diagonal_scores=nested_array("diagonal_scores", content.get("diagonal_scores", [[0.0]])),
                base_scores=nested_array("base_scores", content.get("base_scores", [[0.0]])),
                head_weights=nested_array("head_weights", attention.get("head_weights")),
                temperature=attention.get("softmax_temperature", 1.0), mask=_SCHEMA_MASKS[mask_type], window=window)
        except ConfigError as error:
            raise error.renamed(_SCHEMA_PATHS.get(error.field, error.field)) if error.field else error from None


register_kernel(AlibiKernel)
