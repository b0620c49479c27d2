# LEAD: READ /work/wt-layer/LEAD_NOTE.md BEFORE GOING ON (a different form: it gets the signs right). Remove this line.
"""The probability path: the attention layer of the rollout, extended by the gradient through the softmax.

The rollout's layer ``R = (1 - lambda) I + lambda A`` carries influence through
the residual identity and through the attention's values at fixed
probabilities. The gradient also flows through the probabilities: with
``A_h = rowsoftmax(z_h)``, ``dA_ij / dz_ik = A_ij (delta_jk - A_ik)``, so a
relative change ``eps`` of the keys (the logits are linear in a key's input,
``dz_ij = eps z_ij``) moves row i's output by
``eps sum_j A_ij (z_ij - zbar_i) (v_j - vbar_i)``, ``zbar_i = sum_k A_ik z_ik``
(the row-constant part of the logits moves nothing). Key j's share of it has
the weight ``A_ij S_ij``, with the spread ``S_ij = |z_ij - zbar_i|`` (the value
deviation ``|v_j - vbar_i|`` taken as one scale per layer, folded into the gain).
Per layer, with the gain ``g >= 0`` and the kernel's head weights ``w_h``:

    B(i, :) = sum_h w_h (A_h(i, :) + g A_h(i, :) * S_h(i, :)),   c(i) = sum_h w_h sum_j A_h(i, j) S_h(i, j)
    K(i, :) = B(i, :) / (1 + g c(i))                              (row-stochastic)
    R(i, :) = ((1 - lambda) e_i + lambda B(i, :)) / (1 + lambda g c(i))
            = (1 - lambda_i) e_i + lambda_i K(i, :),   lambda_i = lambda (1 + g c(i)) / (1 + lambda g c(i))

``lambda`` is read as the value path's share against the identity (the
norm ratio); the probability path adds ``g c(i)`` to the branch, so each row's
identity share falls where the logits spread (small temperature) and rises
where they flatten: ``lambda_i`` is the branch's derived gradient share. At
``g = 0``, ``K = A`` and ``lambda_i = lambda``: today's rollout. The logits are
the kernel's own after every transform (temperature, slope scale, distance
score, rotary ratio, SSMax), so each intervention moves the probability path
through them (``S`` scales by ``1 / tau``).

`with_probability_gains(kernel, g)` returns the kernel as a subclass of its own
type with the field ``probability_gains (T,)`` (a PyTree leaf): every field,
sweep, fit and logit operation of the type is kept (they return the same
subclass, gains carried); its `dense` is ``K`` and its `step` the row-mixed
layer above. The layers are formed densely from `path_logits`, O((H + 8) n^2)
memory per layer, for n up to `MAX_LENGTH`. `gain_from_ratio` reads the gain
from a measured ratio of probability-path to value-path influence.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import check_positive_int, check_range, is_concrete, per_layer
from ..errors import ConfigError
from .dense import DenseKernel
from .kernel import AbstractKernel, allowed
from .plan import Path
from .step import layer_step

__all__ = ["MAX_LENGTH", "ProbabilityPath", "FormedPathKernel", "spread_sums", "with_probability_gains",
           "probability_gains", "plain_kernel", "row_spreads", "gain_from_ratio"]

MAX_LENGTH = 4096
"""The longest n an extended layer is formed at: O((H + 8) n^2) floats per layer (H = 32, float64,
n = 4096: 5 GB), beyond which it is refused in one line (`ProbabilityPath.check_length`)."""


def spread_sums(logits: Float[Array, "heads n n"], weights: Float[Array, " heads"]):
    """``(sum_h w_h A_h, sum_h w_h A_h * S_h)``, each ``(n, n)``, from per-head logits (``-inf`` off the mask).

    ``A_h = rowsoftmax(z_h)``, ``S_h(i, j) = |z_h(i, j) - zbar_h(i)|`` with
    ``zbar_h(i) = sum_j A_h(i, j) z_h(i, j)`` on the entries row i reads (0
    elsewhere). Heads one at a time (a checkpointed scan): O(n^2) live per head.
    """
    def head(carry, inputs):
        z, w = inputs
        keep = jnp.isfinite(z)
        a = jax.nn.softmax(z, axis=-1)
        finite = jnp.where(keep, z, 0.0)
        mean = jnp.sum(a * finite, axis=-1, keepdims=True)
        spread = jnp.where(keep, jnp.abs(finite - mean), 0.0)
        return (carry[0] + w * a, carry[1] + w * (a * spread)), None

    n = logits.shape[-1]
    zeros = jnp.zeros((n, n), dtype=jnp.result_type(logits, float))
    return jax.lax.scan(jax.checkpoint(head), (zeros, zeros), (logits, weights))[0]


class ProbabilityPath(AbstractKernel):
    """A kernel type extended by the probability path (module docstring): mixed into a subclass of a
    registered type by `with_probability_gains`, which adds the field ``probability_gains (T,)``.

    Its `dense(n)` is ``K``, its `step` the row-mixed layer; its logit operations are its base type's,
    returning the same extended type (gains carried).
    """

    extension: ClassVar[bool] = True
    mixes_rows: ClassVar[bool] = True

    def spread_parts(self, n: int):
        """One layer's ``(sum_h w_h A_h, sum_h w_h A_h * S_h)`` at length n (`spread_sums`)."""
        return spread_sums(*self.path_logits(n, "probability_gains"))

    def kernel_and_spread(self, n: int):
        """One layer's ``K (n, n)`` and ``c (n,)`` (module docstring) at its gain."""
        attention, spread = self.spread_parts(n)
        c = jnp.sum(spread, axis=-1)
        gain = self.probability_gains
        return (attention + gain * spread) / (1.0 + gain * c)[:, None], c

    def dense(self, n: int):
        """``K = (sum_h w_h (A_h + g A_h * S_h)) / (1 + g c)`` rowwise: the attention paths' kernel."""
        return self.kernel_and_spread(n)[0]

    def row_times_kernel(self, v, path: Path = Path()):
        del path
        return v @ self.dense(v.shape[-1])

    def step(self, row, weight, product, left: bool = False):
        """``row^T R`` (or ``R @ row``, `left`) with ``R = (1 - lambda_i) I + lambda_i K`` per row i,
        ``lambda_i = lambda (1 + g c_i) / (1 + lambda g c_i)``; `product` is not used (K is formed here)."""
        del product
        kernel, c = self.kernel_and_spread(row.shape[-1])
        extra = self.probability_gains * c
        mix = weight * (1.0 + extra) / (1.0 + weight * extra)
        if left:
            return layer_step(row, mix[:, None] if row.ndim == 2 else mix, kernel @ row)
        weighted = mix * row
        return row - weighted + weighted @ kernel

    def plan(self, n: int, method: str, dtype) -> Path:
        """The plain per-layer scan, checkpointed (each step forms its layer densely)."""
        del n, dtype
        return Path(method=method, checkpoint=True)

    def scores_by_offset(self, n: int):
        """None: the extended layer is not a softmax of offset scores (designs form it densely)."""
        del n
        return None

    def check_length(self, n: int) -> None:
        super().check_length(n)
        if n > MAX_LENGTH:
            raise ConfigError.of("n", n, f"at most {MAX_LENGTH} with probability_gains (each layer is formed "
                                 f"densely, (H + 8) n^2 floats: {self.num_heads + 8} x {n}^2 here)")

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        del method
        return int((self.num_heads + 8) * n * n * itemsize)

    def row_bytes(self, n: int, itemsize: int) -> int:
        return self.influence_bytes(n, "dense", itemsize)

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa"):
        return with_probability_gains(super().add_distance_score(kappa, score, n, field), self.probability_gains)

    def prepend_sinks(self, num_sinks: int, n: int):
        return with_probability_gains(super().prepend_sinks(num_sinks, n), self.probability_gains)

    def padded(self, num_layers: int, num_heads: int):
        base = plain_kernel(self).padded(num_layers, num_heads)
        if base is None:
            return None
        gains = np.asarray(self.probability_gains)
        return with_probability_gains(base, np.concatenate([gains, np.repeat(gains[-1:], num_layers - len(gains))]))

    def replaced(self, **values):
        gains = values.pop("probability_gains", self.probability_gains)
        return with_probability_gains(plain_kernel(self).replaced(**values), gains)

    def scaled_rows(self, scale, row_factor, n: int, field: str = "ssmax_scale"):
        """The extended layers of the scaled logits, formed at length n: a `FormedPathKernel` (gains kept)."""
        stacked, shared = self.scan_parts()
        keep = allowed(n, self.mask, self.window)

        def layer(inputs):  # one layer at a time: O(H n^2) memory, not O(T H n^2)
            part, layer_scale = inputs
            logits, weights = eqx.combine(part, shared).head_logits(n, field)
            scaled = logits * (layer_scale[:, None, None] * row_factor[:, None])
            return spread_sums(jnp.where(keep, scaled, -jnp.inf), weights)

        attention, spread = jax.lax.map(layer, (stacked, scale))
        return FormedPathKernel(attention, spread, self.probability_gains, self.mask == "causal")


class FormedPathKernel(ProbabilityPath):
    """An extended layer stack formed densely: ``attention = sum_h w_h A_h`` and ``spread = sum_h w_h A_h * S_h``
    per layer, ``(T, N, N)`` each, with ``probability_gains (T,)`` (what SSMax forms on an extended kernel).

    Lengths as a `DenseKernel`'s (n <= N causal, n = N otherwise); no logit operations, no YAML form.
    """

    attention: Float[Array, "layers n n"]
    spread: Float[Array, "layers n n"]
    probability_gains: Float[Array, " layers"]
    causal: bool = eqx.field(static=True, default=True)

    @property
    def num_layers(self) -> int:
        return self.attention.shape[0]

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "full"

    def default_length(self) -> int:
        return self.attention.shape[-1]

    def check_length(self, n: int) -> None:
        size = self.attention.shape[-1]
        if (self.causal and n > size) or (not self.causal and n != size):
            raise ConfigError.of("n", n, f"{'at most' if self.causal else 'exactly'} the formed kernels' N = {size}")

    def spread_parts(self, n: int):
        return self.attention[:n, :n], self.spread[:n, :n]

    def padded(self, num_layers: int, num_heads: int):
        del num_layers, num_heads
        return None

    def replaced(self, **values):
        return AbstractKernel.replaced(self, **values)

    def scaled_rows(self, scale, row_factor, n: int, field: str = "ssmax_scale"):
        del scale, row_factor, n
        raise self.refusal(field, "has no logits to scale (formed already)", "head_logits")


_EXTENDED: dict[type, type] = {}


def _extended_type(base: type) -> type:
    """The subclass of `base` with the probability path (one per base type, made once)."""
    if base not in _EXTENDED:
        namespace = {"__annotations__": {"probability_gains": Float[Array, " layers"]},
                     "probability_gains": eqx.field(default=None), "__module__": __name__,
                     "__doc__": f"`{base.__name__}` extended by the probability path (`ProbabilityPath`)."}
        _EXTENDED[base] = type(f"ProbabilityPath{base.__name__}", (ProbabilityPath, base), namespace)
    return _EXTENDED[base]


def with_probability_gains(kernel: AbstractKernel, gains) -> AbstractKernel:
    """`kernel` extended by the probability path with gains ``g_t >= 0`` (a number or ``(T,)``).

    An extended kernel gets its gains replaced. Concrete gains are checked (finite, >= 0); traced
    ones (under `grad`, `vmap`) pass as they are.

    Raises:
        ConfigError: one line naming ``probability_gains``, the value and what is allowed.
    """
    gains = per_layer("probability_gains", gains, kernel.num_layers)
    if is_concrete(gains):
        check_range("probability_gains", np.asarray(gains), 0.0, None)
    if isinstance(kernel, ProbabilityPath):
        return dataclasses.replace(kernel, probability_gains=gains)
    fields = {field.name: getattr(kernel, field.name) for field in dataclasses.fields(kernel)}
    return _extended_type(type(kernel))(**fields, probability_gains=gains)


def probability_gains(kernel: AbstractKernel):
    """The kernel's gains ``(T,)``, or None for a kernel without the probability path."""
    return kernel.probability_gains if isinstance(kernel, ProbabilityPath) else None


def plain_kernel(kernel: AbstractKernel) -> AbstractKernel:
    """The kernel without the probability path (its base type's instance; a `FormedPathKernel`'s
    attention as a `DenseKernel`); a plain kernel as it is."""
    if isinstance(kernel, FormedPathKernel):
        return DenseKernel(kernel.attention, kernel.causal)
    if not isinstance(kernel, ProbabilityPath):
        return kernel
    base = next(cls for cls in type(kernel).__mro__[1:] if not issubclass(cls, ProbabilityPath))
    return base(**{field.name: getattr(kernel, field.name) for field in dataclasses.fields(base)})


def row_spreads(kernel: AbstractKernel, n: int) -> Float[Array, "layers n"]:
    """``c_t(i) = sum_h w_h sum_j A_h(i, j) S_h(i, j)`` of every layer at length n, ``(T, n)`` (independent
    of the gains); refused in one line for a kernel without logits (`path_logits`)."""
    extended = with_probability_gains(kernel, jnp.zeros(kernel.num_layers)) if probability_gains(kernel) is None \
        else kernel
    extended.check_length(n)
    stacked, shared = extended.scan_parts()
    return jax.lax.map(lambda part: jnp.sum(eqx.combine(part, shared).spread_parts(n)[1], axis=-1), stacked)


def gain_from_ratio(ratio, model, n: int | None = None, rows=None) -> Float[Array, " layers"]:
    """``g_t = r_t / cbar_t``: the gains at which each extended layer carries the measured ratio ``r_t``.

    ``r_t`` is the ratio of probability-path to value-path local influence of layer t (summed over
    keys, at the measured query rows: `jaxroll.measure.paths`), a number or ``(T,)``; ``cbar_t`` the
    mean of ``c_t(i)`` (`row_spreads`) over `rows` (default: the last row, n - 1, the paths
    statistic's default query and the row the influence profile starts from). At ``g = r / cbar`` a
    row with ``c(i) = cbar`` carries ``g c(i) = r`` through the probability path for every 1 through the
    values (exact at the last row by default). A layer with no spread (``cbar = 0``: flat logits) gets 0.
    Differentiable in `ratio` and in the model's kernel.

    Raises:
        ConfigError: a ratio that is not finite and >= 0, rows outside ``[0, n)``, n not allowed.
    """
    n = model.sequence_length if n is None else check_positive_int("n", n)
    ratio = per_layer("ratio", ratio, model.num_layers)
    if is_concrete(ratio):
        check_range("ratio", np.asarray(ratio), 0.0, None)
    rows = np.array([n - 1] if rows is None else rows, dtype=int).reshape(-1)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= n:
        raise ConfigError.of("rows", rows.tolist(), f"row indices in [0, {n - 1}]")
    spread = jnp.mean(row_spreads(model.kernel, n)[:, rows], axis=-1)
    safe = jnp.where(spread > 0, spread, 1.0)
    return jnp.where(spread > 0, ratio / safe, 0.0)
