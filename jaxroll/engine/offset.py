"""Relative-position (Toeplitz) kernel types: `PowerKernel` and `TableKernel`.

Head h scores a causal pair by its offset alone, ``s_h(i, j) = f_h(i - j)``
with ``f_h(0) = d_h`` (the diagonal content score); ``v^T A`` in
O(H N log N) by FFT (`jaxroll.engine.relative`). `PowerKernel` with
``alpha = 1`` is ALiBi (Press et al. 2022), computed by FFT instead of the
closed form; the rollout treats both alike.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import memory
from .._checks import as_float_array, check_positive_int, check_range, is_concrete, per_layer_and_head
from ..errors import ConfigError
from . import relative
from .kernel import AbstractKernel
from .plan import Path

__all__ = ["PowerKernel", "TableKernel"]


class _Relative(AbstractKernel):
    """Toeplitz kernels: subclasses give ``scores(n) = f_h(k)``, k = 0..n-1, shape ``(H, n)``."""

    @property
    def num_layers(self) -> int:
        return self.head_weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.head_weights.shape[-1]

    def check_length(self, n: int) -> None:
        del n  # defined at every length

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        """The FFT products' spectra per head (`jaxroll.memory.influence_bytes` "fft"), or dense kernels."""
        return memory.influence_bytes(n, self.num_heads, "dense" if method == "dense" else "fft", itemsize)

    def row_times_kernel(self, v, path: Path = Path()):
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
