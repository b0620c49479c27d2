"""A measured (or given) dense kernel per layer: `DenseKernel`."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import as_float_array, check_range, per_layer
from ..errors import ConfigError
from .config import check_keys, read_kernel_file
from .kernel import AbstractKernel, register_kernel
from .plan import Path

__all__ = ["DenseKernel", "ROW_SUM_TOLERANCE"]

ROW_SUM_TOLERANCE = 1e-6
"""A dense kernel's rows must sum to 1 within this (absolute).

Softmax rows of a float32 model sum to 1 within ~1e-7 at the lengths
measured here; `jaxroll measure` renormalises its mean attention (float64
sums of the model's probabilities, bfloat16 ones included) before writing
it. The kernel is stored as given, so a file round-trips bit for bit; the
influence profile is normalised at the end, so a row-sum error of e moves it
by O(T e)."""


class DenseKernel(AbstractKernel):
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

    def default_length(self) -> int:
        return self.size

    def check_length(self, n: int) -> None:
        size = self.size
        if self.causal and n > size:
            raise ConfigError(f"n: got {n}; allowed: at most the dense kernels' N = {size}")
        if not self.causal and n != size:
            raise ConfigError(f"n: got {n}; allowed: exactly the dense kernels' N = {size} (not causal)")

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        """The held ``(T, N, N)`` array and a few ``(n, n)`` blocks."""
        del method
        return int(self.num_layers * self.size * self.size + 3 * n * n) * itemsize

    def row_bytes(self, n: int, itemsize: int) -> int:
        return 3 * n * itemsize  # the (T, N, N) array is shared by every point, not held per row

    def row_times_kernel(self, v, path: Path = Path()):
        n = v.shape[-1]
        return v @ self.kernels[:n, :n]

    def dense(self, n: int):
        return self.kernels[:n, :n]

    # Declared capabilities (`AbstractKernel`). A mean over sequences of softmax rows has no logits:
    # a change of logits is applied to the mean, an approximation (the mean of changed rows differs).

    config_kind = "dense"
    stores_dense = True

    def _per_layer(self, field: str, value):
        return head_averaged_values(self, field, value)

    def temper(self, tau, field: str = "tau") -> "DenseKernel":
        """The mean tempered, ``A'[i, j] ~ A[i, j]^(1 / tau_t)`` renormalised per row (tau per layer)."""
        tau = self._per_layer(field, tau)
        positive = self.kernels > 0
        logs = jnp.log(jnp.where(positive, self.kernels, 1.0))
        tempered = jnp.where(positive, jnp.exp(logs / tau[:, None, None]), 0.0)
        return dataclasses.replace(self, kernels=_row_renormalised(tempered))

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa") -> "DenseKernel":
        """The mean reweighted, ``A'[i, j] ~ A[i, j] e^(kappa_t g(i - j))`` renormalised per row (kappa per layer)."""
        del n
        kappa = self._per_layer(field, kappa)
        size = self.size
        distance = jnp.maximum(jnp.arange(size)[:, None] - jnp.arange(size)[None, :], 0)
        weights = jnp.exp(kappa[:, None, None] * score(distance)[None])
        return dataclasses.replace(self, kernels=_row_renormalised(self.kernels * weights))

    def to_config(self, kernel_file: str | None = None) -> dict:
        """``kernel_type: dense`` and the npz `kernel_file` that holds the kernels (`file_arrays`)."""
        return {"kernel_config": {"kernel_type": "dense", "file": kernel_file}}

    def file_arrays(self) -> dict:
        return {"kernels": np.asarray(self.kernels, dtype=np.float64)}

    @classmethod
    def from_config(cls, config, *, num_layers: int, directory=None) -> "DenseKernel":
        section = config["kernel_config"]
        check_keys("kernel_config", section, {"kernel_type", "file"}, required={"file"})
        kernels = read_kernel_file(section["file"], "kernels", directory)
        kernel = cls.create(kernels, field=f"kernel_config.file ({section['file']})")
        if kernel.num_layers != num_layers:
            raise ConfigError(f"kernel_config.file: holds {kernel.num_layers} layers; allowed: num_layers ({num_layers})")
        return kernel


def head_averaged_values(kernel, field: str, value):
    """One value per layer for a kernel of one head-averaged kernel per layer (`DenseKernel`, `GainTableKernel`):
    a number, ``(T,)`` or ``(T, 1)``; a per-head shape is refused in one line naming `field`."""
    if jnp.ndim(value) == 2 and jnp.shape(value)[1] != 1:
        raise ConfigError(f"{field}: got shape {jnp.shape(value)}; allowed for a measured {type(kernel).__name__} "
                          "(one head-averaged kernel per layer): a number or one per layer")
    return per_layer(field, jnp.reshape(value, (-1,)) if jnp.ndim(value) == 2 else value, kernel.num_layers)


def _row_renormalised(kernels):
    return kernels / jnp.sum(kernels, axis=-1, keepdims=True)


register_kernel(DenseKernel)
