"""The parameter PyTree of a rollout: `RolloutModel`, and its constructors.

A model of T layers and H heads holds, per layer t and head h, the ALiBi slope
``m_{t,h}``, the diagonal content score ``d_{t,h}``, the content background
``b_{t,h}`` and the head weight ``w_{t,h}``; per layer the mixing coefficient
``lambda_t``; one softmax temperature ``tau``; and, as static metadata, the
mask, its window and the default sequence length. Layer t's transition is
``R_t = (1 - lambda_t) I + lambda_t A_t`` (arXiv 2602.16837).

`KernelRolloutModel` is its sibling for any other kernel type
(`jaxroll.kernel_types`: measured dense, relative-position): ``lambdas`` and
a kernel PyTree.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

from . import memory
from ._checks import as_float_array, check_positive_int, check_range
from ._checks import per_layer as _per_layer, per_layer_and_head as _per_layer_and_head
from .errors import ConfigError
from .kernel_types import KERNEL_TYPES, DenseKernel, _Kernel
from .kernels import MASKS, alibi_slopes as standard_alibi_slopes

__all__ = ["RolloutModel", "KernelRolloutModel"]

class RolloutModel(eqx.Module):
    """Parameters of a residual-aware attention rollout (a PyTree).

    Each layer's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t`` with
    ``A_t = sum_h w_{t,h} rowsoftmax(s_{t,h})`` and
    ``s_{t,h}(i, j) = (-m_{t,h} (i - j) + d_{t,h} [i == j] + b_{t,h}) / tau``.
    ``A[i, j]`` is the weight with which token i reads token j.

    Attributes:
        lambdas: ``(T,)``, the mixing coefficients ``lambda_t`` in [0, 1].
        alibi_slopes: ``(T, H)``, ALiBi slopes ``m >= 0`` (Press et al. 2022).
        diagonal_scores: ``(T, H)``, diagonal content scores ``d`` in logit units.
        base_scores: ``(T, H)``, content background ``b``; it adds the same
            value to every score of a row and so cancels in the softmax: kept
            because measured configurations carry it, it changes no profile.
        head_weights: ``(T, H)``, ``w >= 0``; each layer's row is normalised
            to sum 1 where the kernel is formed.
        temperature: ``()``, the softmax temperature ``tau > 0``.
        mask: ``"causal"`` (j <= i), ``"sliding"`` (i - W < j <= i) or
            ``"full"`` (every j). Static.
        window: the sliding window W, or None. Static.
        sequence_length: the default N of `influence` and friends. Static.

    Build one with `RolloutModel.create` (keywords, broadcasting, checks);
    files in the YAML schema are read by `jaxroll.load_config` (the I/O layer,
    `jaxroll.schema`). Direct construction skips the checks and is meant for
    transformations such as `jax.grad`.
    """

    lambdas: Float[Array, " layers"]
    alibi_slopes: Float[Array, "layers heads"]
    diagonal_scores: Float[Array, "layers heads"]
    base_scores: Float[Array, "layers heads"]
    head_weights: Float[Array, "layers heads"]
    temperature: Float[Array, ""]
    mask: str = eqx.field(static=True, default="causal")
    window: int | None = eqx.field(static=True, default=None)
    sequence_length: int = eqx.field(static=True, default=256)

    @property
    def num_layers(self) -> int:
        return self.lambdas.shape[-1]

    @property
    def num_heads(self) -> int:
        return self.alibi_slopes.shape[-1]

    @classmethod
    def create(
        cls,
        *,
        num_layers: int,
        num_heads: int,
        lambdas,
        alibi_slopes=None,
        diagonal_scores=0.0,
        base_scores=0.0,
        head_weights=None,
        temperature=1.0,
        mask: str = "causal",
        window: int | None = None,
        sequence_length: int = 256,
    ) -> "RolloutModel":
        """Build a checked model, broadcasting per-layer and per-head values.

        `lambdas` is a number or a ``(T,)`` array (each in [0, 1]). The
        per-head fields take a number, an ``(H,)`` array (the same heads in
        every layer), or a ``(T or 1, H or 1)`` array, as the YAML schema's
        nested lists do. `alibi_slopes` defaults to the standard slopes of
        `jaxroll.alibi_slopes(num_heads)`; `head_weights` to uniform.

        Raises:
            ConfigError: a one-line message naming the field, the value and
                what is allowed.
        """
        num_layers = check_positive_int("num_layers", num_layers)
        num_heads = check_positive_int("num_heads", num_heads)
        sequence_length = check_positive_int("sequence_length", sequence_length)
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
            alibi_slopes = standard_alibi_slopes(num_heads)
        if head_weights is None:
            head_weights = np.full(num_heads, 1.0 / num_heads)

        per_head = {
            "alibi_slopes": alibi_slopes,
            "diagonal_scores": diagonal_scores,
            "base_scores": base_scores,
            "head_weights": head_weights,
        }
        arrays = {
            name: _per_layer_and_head(name, value, num_layers, num_heads)
            for name, value in per_head.items()
        }
        lambdas = _per_layer("lambdas", lambdas, num_layers)
        temperature = as_float_array("temperature", temperature)
        if temperature.shape != ():
            raise ConfigError(f"temperature: got shape {temperature.shape}; allowed: one number")
        check_range("temperature", temperature, 0.0, None, low_open=True)
        check_range("lambdas", lambdas, 0.0, 1.0)
        check_range("alibi_slopes", arrays["alibi_slopes"], 0.0, None)
        check_range("diagonal_scores", arrays["diagonal_scores"])
        check_range("base_scores", arrays["base_scores"])
        check_range("head_weights", arrays["head_weights"], 0.0, None)
        empty = ~(arrays["head_weights"].sum(axis=1) > 0)
        if empty.any():
            layer = int(np.argmax(empty))
            raise ConfigError(
                f"head_weights: layer {layer} has all-zero weights; allowed: >= 0 with a positive sum"
            )
        return cls(
            lambdas=lambdas,
            temperature=temperature,
            mask=mask,
            window=window if mask == "sliding" else None,
            sequence_length=sequence_length,
            **arrays,
        )


class KernelRolloutModel(eqx.Module):
    """A rollout with any kernel type: ``R_t = (1 - lambda_t) I + lambda_t A_t`` (a PyTree).

    The sibling of `RolloutModel` for kernels other than ALiBi + content:
    `kernel` is one of `jaxroll.kernel_types` (`DenseKernel` measured
    attention, `PowerKernel` / `TableKernel` relative-position, or
    `AlibiKernel`), T layers stacked on axis 0. ``A[i, j]`` is the weight with
    which token i reads token j; `influence`, `rollout_matrix` and
    `attention_kernel` dispatch on the model type.

    Attributes:
        lambdas: ``(T,)``, the mixing coefficients in [0, 1].
        kernel: the layer kernels ``A_t``.
        sequence_length: the default N. Static.
    """

    lambdas: Float[Array, " layers"]
    kernel: _Kernel
    sequence_length: int = eqx.field(static=True, default=256)

    @property
    def num_layers(self) -> int:
        return self.lambdas.shape[-1]

    @property
    def num_heads(self) -> int:
        return self.kernel.num_heads

    @property
    def mask(self) -> str:
        return self.kernel.mask

    @classmethod
    def create(cls, *, kernel, lambdas, sequence_length: int | None = None) -> "KernelRolloutModel":
        """Build a checked model; `lambdas` a number or ``(T,)`` in [0, 1], T from the kernel.

        `sequence_length` defaults to a dense kernel's N, else 256; it must be
        a length the kernel is defined at.
        """
        if not isinstance(kernel, KERNEL_TYPES):
            raise ConfigError(f"kernel: got {type(kernel).__name__}; allowed: one of "
                              + ", ".join(t.__name__ for t in KERNEL_TYPES))
        lambdas = _per_layer("lambdas", lambdas, kernel.num_layers)
        check_range("lambdas", lambdas, 0.0, 1.0)
        if sequence_length is None:
            sequence_length = kernel.size if isinstance(kernel, DenseKernel) else 256
        sequence_length = check_positive_int("sequence_length", sequence_length)
        kernel.check_length(sequence_length)
        return cls(lambdas=lambdas, kernel=kernel, sequence_length=sequence_length)
