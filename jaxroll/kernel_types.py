"""Attention kernels behind one interface: ALiBi + content, measured dense, relative-position.

The rollout of arXiv 2602.16837, ``R_t = (1 - lambda_t) I + lambda_t A_t``,
needs only row-stochastic kernels ``A_t`` (``A[i, j]`` = weight with which
token i reads token j). Each kernel type here is an `eqx.Module` PyTree that
holds T layers stacked on axis 0; `jax.lax.scan` over it (or `layer(t)`)
hands each step one layer of the same type, on which

- ``row_times_kernel(v)`` gives ``v^T A_t`` (what `jaxroll.influence` needs),
- ``dense(n)`` gives the ``(n, n)`` matrix ``A_t``,

and ``check_length(n)`` says (one line) whether the kernel is defined at
length n. All of them work under `jit`, `vmap` and `grad`.

| type | parameters per layer | ``v^T A`` | lengths |
|---|---|---|---|
| `AlibiKernel` | slopes, content, weights (H) | O(H N), `jaxroll.structured` | any |
| `DenseKernel` | ``A_t`` (N, N) | O(N^2) | n <= N (causal), n = N (other) |
| `PowerKernel` | ``f_h(k) = -m_h k^alpha_h``, content | O(H N log N), `jaxroll.relative` | any |
| `TableKernel` | ``f_h(k)`` for k = 1..K, content | O(H N log N), `jaxroll.relative`; O(H N^2) exact where a table rises | n <= K + 1 |

`PowerKernel` with ``alpha = 1`` is ALiBi (Press et al. 2022), computed by
FFT instead of the closed form; the rollout treats both alike.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import relative, structured
from ._checks import as_float_array, check_positive_int, check_range, is_concrete, per_layer_and_head
from .errors import ConfigError
from .kernels import layer_kernel

__all__ = ["AlibiKernel", "DenseKernel", "PowerKernel", "TableKernel", "KERNEL_TYPES",
           "ROW_SUM_TOLERANCE"]

ROW_SUM_TOLERANCE = 1e-6
"""A dense kernel's rows must sum to 1 within this (absolute).

Softmax rows of a float32 model sum to 1 within ~1e-7 at the lengths
measured here; `jaxroll measure` renormalises its mean attention (float64
sums of the model's probabilities, bfloat16 ones included) before writing
it. The kernel is stored as given, so a file round-trips bit for bit; the
influence profile is normalised at the end, so a row-sum error of e moves it
by O(T e)."""


class _Kernel(eqx.Module):
    """The shared part: layer slicing and the per-head view."""

    def layer(self, t):
        """Layer t (0-based) as a kernel of the same type (the arrays' axis 0 removed)."""
        return jax.tree.map(lambda x: x[t], self)

    # Head mixtures hold (T, H) head weights; `DenseKernel` overrides both.
    @property
    def num_layers(self) -> int:
        return self.head_weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.head_weights.shape[-1]

    def check_length(self, n: int) -> None:
        """Raise a one-line `ConfigError` unless the kernel is defined at length n."""


class AlibiKernel(_Kernel):
    """ALiBi + diagonal content, ``s_h(i, j) = (-m_h (i - j) + d_h [i == j] + b_h) / tau``.

    The kernel of `jaxroll.RolloutModel` as a kernel type (`from_model`):
    ``v^T A`` by the O(H N) products of `jaxroll.structured`, ``dense`` by
    `jaxroll.kernels.layer_kernel`. Arrays ``(T, H)``; the temperature is
    stored per layer, ``(T,)``, so that a scan over layers slices it too.
    """

    alibi_slopes: Float[Array, "layers heads"]
    diagonal_scores: Float[Array, "layers heads"]
    base_scores: Float[Array, "layers heads"]
    head_weights: Float[Array, "layers heads"]
    temperature: Float[Array, " layers"]
    mask: str = eqx.field(static=True, default="causal")
    window: int | None = eqx.field(static=True, default=None)

    @classmethod
    def from_model(cls, model) -> "AlibiKernel":
        """The kernel of a `RolloutModel` (its lambdas and length stay with the model)."""
        return cls(model.alibi_slopes, model.diagonal_scores, model.base_scores, model.head_weights,
                   jnp.broadcast_to(model.temperature, model.lambdas.shape), model.mask, model.window)

    def row_times_kernel(self, v):
        return structured.row_times_kernel(v, self.alibi_slopes, self.diagonal_scores, self.base_scores,
                                           self.head_weights, self.temperature, self.mask, self.window)

    def dense(self, n: int):
        return layer_kernel(self.alibi_slopes, self.diagonal_scores, self.base_scores, self.head_weights,
                            self.temperature, n, self.mask, self.window)


class DenseKernel(_Kernel):
    """A measured (or given) row-stochastic kernel per layer, ``kernels (T, N, N)``.

    ``v^T A_t`` is a plain O(N^2) product. Under causal masking (every
    kernel with ``A[i, j] = 0`` for j > i, as measured attention is) the
    top-left ``n x n`` block is the kernel at length n, so any n <= N is
    allowed; other kernels only at n = N. Build with `create` (checks).
    """

    kernels: Float[Array, "layers n n"]
    causal: bool = eqx.field(static=True, default=True)

    @classmethod
    def create(cls, kernels, *, field: str = "kernels") -> "DenseKernel":
        """Check and build: shape ``(T, N, N)``, finite, ``>= 0``, rows summing to 1.

        Rows must sum to 1 within `ROW_SUM_TOLERANCE` (absolute); the array
        is kept as given.

        Raises:
            ConfigError: one line naming `field`, the value and what is allowed.
        """
        array = as_float_array(field, kernels)
        if array.ndim != 3 or array.shape[1] != array.shape[2] or array.shape[0] < 1 or array.shape[1] < 1:
            raise ConfigError(f"{field}: got shape {array.shape}; allowed: (num_layers, N, N) with N >= 1")
        check_range(field, array, 0.0, None)
        sums = array.sum(axis=-1)
        bad = np.abs(sums - 1.0) > ROW_SUM_TOLERANCE
        if bad.any():
            layer, row = (int(k) for k in np.argwhere(bad)[0])
            raise ConfigError(
                f"{field}: layer {layer} row {row} sums to {sums[layer, row]!r}; allowed: row-stochastic "
                f"(rows sum to 1 within {ROW_SUM_TOLERANCE:g}, entries >= 0)"
            )
        causal = not np.triu(array, k=1).any()
        return cls(array, causal)

    @property
    def num_layers(self) -> int:
        return self.kernels.shape[0]

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def size(self) -> int:
        return self.kernels.shape[-1]

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "full"

    def check_length(self, n: int) -> None:
        size = self.size
        if self.causal and n > size:
            raise ConfigError(f"n: got {n}; allowed: at most the dense kernels' N = {size}")
        if not self.causal and n != size:
            raise ConfigError(f"n: got {n}; allowed: exactly the dense kernels' N = {size} (not causal)")

    def row_times_kernel(self, v):
        n = v.shape[-1]
        return v @ self.kernels[:n, :n]

    def dense(self, n: int):
        return self.kernels[:n, :n]


class _Relative(_Kernel):
    """Toeplitz kernels: subclasses give ``scores(n) = f_h(k)``, k = 0..n-1, shape ``(H, n)``."""

    mask = "causal"

    def row_times_kernel(self, v):
        return relative.row_times_kernel(v, self.scores(v.shape[-1]), self.head_weights)

    def dense(self, n: int):
        return relative.dense_kernel(self.scores(n), self.head_weights)


class PowerKernel(_Relative):
    """Exponential-power decay per head: ``f_h(k) = -m_h k^alpha_h`` (k >= 1), ``f_h(0) = d_h``.

    ``alpha = 1`` is ALiBi (slope m, Press et al. 2022); ``alpha < 1`` decays
    more slowly at long range. Arrays ``(T, H)``: ``slopes`` m >= 0,
    ``exponents`` alpha > 0, ``diagonal_scores`` d, ``head_weights`` w >= 0.
    """

    slopes: Float[Array, "layers heads"]
    exponents: Float[Array, "layers heads"]
    diagonal_scores: Float[Array, "layers heads"]
    head_weights: Float[Array, "layers heads"]

    @classmethod
    def create(cls, *, num_layers: int, num_heads: int, slopes, exponents=1.0, diagonal_scores=0.0,
               head_weights=None) -> "PowerKernel":
        """Checked construction; per-head values broadcast as in `RolloutModel.create`."""
        arrays = _per_head_arrays(num_layers, num_heads, slopes=slopes, exponents=exponents,
                                  diagonal_scores=diagonal_scores, head_weights=head_weights)
        if is_concrete(arrays["slopes"]):
            check_range("slopes", arrays["slopes"], 0.0, None)
            check_range("exponents", arrays["exponents"], 0.0, None, low_open=True)
        return cls(**arrays)

    def scores(self, n: int):
        offsets = jnp.arange(n, dtype=self.slopes.dtype)
        # k^alpha as exp(alpha log k) for k >= 1; offset 0 (log 0) is replaced by the content.
        logs = jnp.log(jnp.maximum(offsets, 1.0))
        decay = -self.slopes[:, None] * jnp.exp(self.exponents[:, None] * logs[None, :])
        return jnp.where(offsets[None, :] == 0, self.diagonal_scores[:, None], decay)


class TableKernel(_Relative):
    """A free score per offset and head: ``f_h(k) = table_h[k - 1]`` (k = 1..K), ``f_h(0) = d_h``.

    Arrays: ``offset_scores (T, H, K)`` (any finite values), ``diagonal_scores
    (T, H)``, ``head_weights (T, H)``. Defined for lengths n <= K + 1 (a
    table of at least n - 1 offsets). A layer whose table rises above its
    value at offset 1 (by more than ``log relative.MAX_AMPLIFICATION``) is
    multiplied exactly in O(H n^2) instead of by FFT (`jaxroll.relative`).
    """

    offset_scores: Float[Array, "layers heads offsets"]
    diagonal_scores: Float[Array, "layers heads"]
    head_weights: Float[Array, "layers heads"]

    @classmethod
    def create(cls, *, num_layers: int, num_heads: int, offset_scores, diagonal_scores=0.0,
               head_weights=None) -> "TableKernel":
        """Checked construction; the table is ``(K,)``, ``(H, K)`` or ``(1 or T, 1 or H, K)``."""
        num_layers = check_positive_int("num_layers", num_layers)
        num_heads = check_positive_int("num_heads", num_heads)
        table = as_float_array("offset_scores", offset_scores)
        if table.ndim < 1 or table.ndim > 3 or table.shape[-1] < 1:
            raise ConfigError(f"offset_scores: got shape {table.shape}; allowed: (layers, heads, K) with K >= 1")
        table = table.reshape((1,) * (3 - table.ndim) + table.shape)
        for axis, (name, size) in enumerate((("num_layers", num_layers), ("num_heads", num_heads))):
            if table.shape[axis] not in (1, size):
                raise ConfigError(f"offset_scores: axis {axis} has length {table.shape[axis]}; "
                                  f"allowed: 1 or {name} ({size})")
        check_range("offset_scores", table)
        table = np.array(np.broadcast_to(table, (num_layers, num_heads, table.shape[-1])))
        arrays = _per_head_arrays(num_layers, num_heads, diagonal_scores=diagonal_scores,
                                  head_weights=head_weights)
        return cls(offset_scores=table, **arrays)

    @property
    def num_offsets(self) -> int:
        return self.offset_scores.shape[-1]

    def check_length(self, n: int) -> None:
        if n - 1 > self.num_offsets:
            raise ConfigError(f"offset_scores: a table of {self.num_offsets} offsets; allowed at length {n}: "
                              f"at least n - 1 = {n - 1} offsets")

    def scores(self, n: int):
        return jnp.concatenate([self.diagonal_scores[:, None], self.offset_scores[:, : n - 1]], axis=-1)


KERNEL_TYPES = (AlibiKernel, DenseKernel, PowerKernel, TableKernel)
"""Every kernel type a `KernelRolloutModel` may hold."""


def _per_head_arrays(num_layers, num_heads, **values):
    """Per-layer-and-head arrays as `RolloutModel.create` builds them; uniform default weights."""
    num_layers = check_positive_int("num_layers", num_layers)
    num_heads = check_positive_int("num_heads", num_heads)
    if "head_weights" in values and values["head_weights"] is None:
        values["head_weights"] = np.full(num_heads, 1.0 / num_heads)
    arrays = {name: per_layer_and_head(name, value, num_layers, num_heads) for name, value in values.items()}
    for name in ("diagonal_scores",):
        if name in arrays and is_concrete(arrays[name]):
            check_range(name, arrays[name])
    if "head_weights" in arrays and is_concrete(arrays["head_weights"]):
        weights = arrays["head_weights"]
        check_range("head_weights", weights, 0.0, None)
        empty = ~(weights.sum(axis=1) > 0)
        if empty.any():
            raise ConfigError(f"head_weights: layer {int(np.argmax(empty))} has all-zero weights; "
                              "allowed: >= 0 with a positive sum")
    return arrays
