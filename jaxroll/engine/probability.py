"""The probability path: the rollout's layer carries the gradient through the softmax, and how a change moves it.

The rollout's layer ``R = (1 - lambda) I + lambda A`` models the gradient
through the residual identity and the attention's values at fixed
probabilities. The gradient also flows through the probabilities: with
``A_h = rowsoftmax(z_h)`` and content logits ``z_h(i, j) = s q_i . W_k x_j``,
``dA_ij / dz_ik = A_ij (delta_jk - A_ik)`` and ``dz_ij / dx_j = s W_k^T q_i``
(the same for every key j), so the probability path's Jacobian block from
key j to query i is ``A_ij (v_j - vbar_i) (x) s W_k^T q_i`` (``vbar_i = sum_k
A_ik v_k``), of norm ``A_ij |v_j - vbar_i| s |W_k^T q_i|``. With the value
deviations of one scale per layer, its shape over keys is ``A``'s and its size
is proportional to the logit gain ``s``: the factor on the content logits'
derivative (``1 / tau`` under a temperature, ``s ln n_i`` under SSMax).

So a layer measured with a branch share ``lambda`` of which the probability
path is the share ``rho`` (`share_from_ratio`: ``rho = r / (1 + r)`` from the
measured ratio r of probability-path to value-path influence) is, at logit
gains ``sigma_h(i)`` relative to the measured setting,

    W_h(i)   = 1 - rho + rho sigma_h(i)                   (head h's branch, relative to measured)
    B(i, :)  = sum_h w_h W_h(i) A_h(i, :),   W(i) = sum_h w_h W_h(i)      (w_h normalised)
    R(i, :)  = ((1 - lambda) e_i + lambda B(i, :)) / (1 - lambda + lambda W(i))
             = (1 - lambda_i) e_i + lambda_i K(i, :),   K = B / W,   lambda_i = lambda W(i) / (1 - lambda + lambda W(i))

At the measured setting (``sigma = 1``) or with ``rho = 0``, ``R`` is today's
layer exactly. A temperature multiplies ``sigma`` by ``1 / tau`` (and tempers
``A``): at ``tau > 1`` the branch loses weight to the identity; SSMax by
``s ln n_i``. Slope scale, distance scores, sinks and the rotary ratio change
``A`` only (position terms do not depend on the input, so they do not move
the gradient through the probabilities).

`with_probability_path(kernel, rho, sigma)` returns the kernel as a subclass
of its own type with the fields ``probability_shares (T,)`` and
``logit_gains (T, H)`` (PyTree leaves): its fields, sweeps, fits and logit
operations are the type's (returning the same subclass, ``temper`` dividing
``sigma``). With ``sigma`` constant along rows, ``K`` is the kernel with head
weights ``w_h W_h`` and ``lambda_i`` one per layer: each layer takes the type's
own fast product. SSMax's row-dependent gains form the layers densely
(`FormedPathKernel`, O(T N^2)).

The path's own row shape (docs/design.md, "The path's own row shape"): `path_weights` gives the path's weight
per key for orthogonal equal-norm values, ``C_ij = A_ij sqrt(1 - 2 A_ij + sum_k A_ik^2)`` (per head and
sequence); `moved_shape` moves the measured kernel's rows by a change of those weights, ``P = K C' / C``; and
`with_path_shape(K', P, rho, sigma)` forms ``B = (1 - rho) K' + rho sigma P / |P|`` as a `FormedPathKernel`,
today's layer exactly at no change. It needs the per-sequence rows before and after a change.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import check_range, is_concrete, per_layer
from ..errors import ConfigError
from .dense import DenseKernel
from .kernel import AbstractKernel, allowed, layer_head_values
from .plan import Path
from .step import layer_step

__all__ = ["ProbabilityPath", "FormedPathKernel", "with_probability_path", "probability_shares", "logit_gains",
           "plain_kernel", "share_from_ratio", "mixing_weight", "formed_rows", "formed_step", "path_weights",
           "moved_shape", "with_path_shape"]


def mixing_weight(weight, total):
    """``lambda W / (1 - lambda + lambda W)``: a layer's (or row's) lambda once its branch weighs ``W``."""
    return weight * total / (1.0 - weight + weight * total)


class ProbabilityPath(AbstractKernel):
    """A kernel type extended by the probability path (module docstring), mixed into a subclass of a
    registered type by `with_probability_path`, which adds ``probability_shares (T,)`` and ``logit_gains (T, H)``.
    """

    extension: ClassVar[bool] = True
    mixes_rows: ClassVar[bool] = True

    def with_path(self, shares, gains):
        """This kernel with shares ``rho (T,)`` and logit gains ``sigma (T, H)`` in place (checked by the caller)."""
        return dataclasses.replace(self, probability_shares=shares, logit_gains=gains)

    def branch(self):
        """One layer's ``(K, W)``: the plain kernel with head weights ``w_h (1 - rho + rho sigma_h)`` and ``W``."""
        factors = 1.0 - self.probability_shares + self.probability_shares * self.logit_gains
        return plain_kernel(self).reweighted_heads(factors)

    def step(self, row, weight, product, left: bool = False):
        """``(1 - lambda') row + lambda' (row through K)``, ``lambda' = lambda W / (1 - lambda + lambda W)``."""
        del left  # one weight per layer: the same in both orientations
        kernel, total = self.branch()
        return layer_step(row, mixing_weight(weight, total), product(row, kernel))

    def dense(self, n: int):
        """``K = sum_h w_h W_h A_h / W``, the branch's kernel (its lambda is `step`'s)."""
        return self.branch()[0].dense(n)

    def row_times_kernel(self, v, path: Path = Path()):
        return self.branch()[0].row_times_kernel(v, path)

    def plan(self, n: int, method: str, dtype) -> Path:
        """The base type's path, without its shared-kernel rollout (which would skip `step`)."""
        path = super().plan(n, method, dtype)
        return Path(method=method, checkpoint=True) if path.shared_kernel else path

    def temper(self, tau, field: str = "tau"):
        """The base type's temper, and ``sigma / tau``: the logits' derivative scales with them."""
        tempered = super().temper(tau, field)
        return with_probability_path(tempered, self.probability_shares, self.logit_gains / self._per_head(field, tau))

    def _per_head(self, field, value):
        return layer_head_values(field, value, self.num_layers, self.num_heads)

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa"):
        return _carried(super().add_distance_score(kappa, score, n, field), self)

    def prepend_sinks(self, num_sinks: int, n: int):
        return _carried(super().prepend_sinks(num_sinks, n), self)

    def padded(self, num_layers: int, num_heads: int):
        base = plain_kernel(self).padded(num_layers, num_heads)
        if base is None:
            return None
        shares, gains = np.asarray(self.probability_shares), np.asarray(self.logit_gains)
        gains = np.concatenate([gains, np.ones((len(gains), num_heads - gains.shape[1]))], axis=1)
        extra = num_layers - len(shares)
        return with_probability_path(base, np.concatenate([shares, np.repeat(shares[-1:], extra)]),
                                     np.concatenate([gains, np.repeat(gains[-1:], extra, axis=0)]))

    def replaced(self, **values):
        shares = values.pop("probability_shares", self.probability_shares)
        gains = values.pop("logit_gains", self.logit_gains)
        return with_probability_path(plain_kernel(self).replaced(**values), shares, gains)

    def scaled_rows(self, scale, row_factor, n: int, field: str = "ssmax_scale"):
        """SSMax on the extended layers: ``A'_h`` of the scaled logits and ``sigma'_h(i) = sigma_h s_h row_factor[i]``,
        formed at length n (`FormedPathKernel`)."""
        stacked, shared = self.scan_parts()
        keep = allowed(n, self.mask, self.window)

        def layer(inputs):  # one layer at a time: O(H n^2) memory, not O(T H n^2)
            part, layer_scale = inputs
            current = eqx.combine(part, shared)
            logits, weights = current.head_logits(n, field)
            gains = layer_scale[:, None] * row_factor[None, :]  # (H, n)
            per_head = jax.nn.softmax(jnp.where(keep, logits * gains[:, :, None], -jnp.inf), axis=-1)
            attention = jnp.einsum("h,hij->ij", weights, per_head)
            gained = jnp.einsum("h,hi,hij->ij", weights, current.logit_gains[:, None] * gains, per_head)
            return attention, gained

        attention, gained = jax.lax.map(layer, (stacked, scale))
        return FormedPathKernel(attention, gained, self.probability_shares, self.mask == "causal")


def formed_rows(attention, gained, share):
    """One layer's ``(K, W)`` from its formed arrays: ``B = (1 - rho) attention + rho gained``,
    ``W(i) = sum_j B(i, j)``, ``K = B / W`` (``(n, n)`` and ``(n,)``)."""
    branch = (1.0 - share) * attention + share * gained
    total = jnp.sum(branch, axis=-1)
    return branch / total[:, None], total


def formed_step(attention, gained, share, row, weight, left: bool = False):
    """One layer of formed arrays (`formed_rows`) on `row`, row i mixed with ``lambda_i = lambda W(i) /
    (1 - lambda + lambda W(i))``: ``row^T R`` for rows ``(..., n)``, or ``R @ row`` (``left``) for ``(n, m)``."""
    kernel, total = formed_rows(attention, gained, share)
    mix = mixing_weight(weight, total)
    if left:
        return layer_step(row, mix[:, None] if row.ndim == 2 else mix, kernel @ row)
    weighted = mix * row
    return row - weighted + weighted @ kernel


class FormedPathKernel(ProbabilityPath):
    """Extended layers formed densely (SSMax on an extended kernel): per layer ``attention = sum_h w_h A_h``
    and ``gained = sum_h w_h sigma_h(i) A_h``, ``(T, N, N)`` each, and ``probability_shares (T,)``; then
    ``B = (1 - rho) attention + rho gained``, ``W(i) = sum_j B(i, j)``, and each row its own lambda.

    Lengths as a `DenseKernel`'s (n <= N causal, n = N otherwise); no logit operations, no YAML form.
    """

    attention: Float[Array, "layers n n"]
    gained: Float[Array, "layers n n"]
    probability_shares: Float[Array, " layers"]
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

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        del method
        return int((2 * self.num_layers * self.default_length() ** 2 + 4 * n * n) * itemsize)

    def _rows(self, n: int):
        return formed_rows(self.attention[:n, :n], self.gained[:n, :n], self.probability_shares)

    def step(self, row, weight, product, left: bool = False):
        """Row i mixed with ``lambda_i = lambda W(i) / (1 - lambda + lambda W(i))`` (`formed_step`)."""
        del product
        n = row.shape[-1]
        return formed_step(self.attention[:n, :n], self.gained[:n, :n], self.probability_shares, row, weight, left)

    def dense(self, n: int):
        return self._rows(n)[0]

    def row_times_kernel(self, v, path: Path = Path()):
        del path
        return v @ self.dense(v.shape[-1])

    def plan(self, n: int, method: str, dtype) -> Path:
        del n, dtype
        return Path(method=method, checkpoint=True)

    def temper(self, tau, field: str = "tau"):
        del tau
        raise self.refusal(field, "is formed already (SSMax); temper before it", "temper")

    def padded(self, num_layers: int, num_heads: int):
        del num_layers, num_heads
        return None

    def with_path(self, shares, gains):
        """The shares replaced; the gains are formed into ``gained`` already."""
        del gains
        return dataclasses.replace(self, probability_shares=shares)

    def replaced(self, **values):
        return AbstractKernel.replaced(self, **values)

    def scaled_rows(self, scale, row_factor, n: int, field: str = "ssmax_scale"):
        del scale, row_factor, n
        raise self.refusal(field, "is formed already (SSMax once)", "head_logits")


_EXTENDED: dict[type, type] = {}


def _extended_type(base: type) -> type:
    """The subclass of `base` with the probability path (one per base type, made once)."""
    if base not in _EXTENDED:
        namespace = {"__annotations__": {"probability_shares": Float[Array, " layers"],
                                         "logit_gains": Float[Array, "layers heads"]},
                     "probability_shares": eqx.field(default=None), "logit_gains": eqx.field(default=None),
                     "__module__": __name__,
                     "__doc__": f"`{base.__name__}` extended by the probability path (`ProbabilityPath`)."}
        _EXTENDED[base] = type(f"ProbabilityPath{base.__name__}", (ProbabilityPath, base), namespace)
    return _EXTENDED[base]


def _carried(kernel: AbstractKernel, source: ProbabilityPath) -> AbstractKernel:
    """`kernel` (a logit operation's result) with `source`'s shares and gains."""
    gains = getattr(source, "logit_gains", None)  # none once formed (FormedPathKernel)
    return with_probability_path(kernel, source.probability_shares, 1.0 if gains is None else gains)


def _checked_shares(shares, layers: int):
    """``rho_t`` ``(T,)`` from a number or ``(T,)``; concrete values must lie in [0, 1) (one-line ConfigError)."""
    shares = per_layer("probability_shares", shares, layers)
    if is_concrete(shares):
        check_range("probability_shares", np.asarray(shares), 0.0, 1.0)
        if np.any(np.asarray(shares) == 1.0):
            raise ConfigError.of("probability_shares", np.asarray(shares).tolist(), "each in [0, 1)")
    return shares


def with_probability_path(kernel: AbstractKernel, shares, gains=1.0) -> AbstractKernel:
    """`kernel` extended by the probability path: shares ``rho_t`` in [0, 1) (a number or ``(T,)``) and logit
    gains ``sigma_{t,h} > 0`` relative to the measured setting (a number, ``(H,)``, ``(T, 1)`` or ``(T, H)``;
    default 1). An extended kernel gets both replaced. Concrete values are checked; traced ones (under
    `grad`, `vmap`) pass as they are.

    Raises:
        ConfigError: one line naming ``probability_shares`` or ``logit_gains``, the value and what is allowed.
    """
    shares = _checked_shares(shares, kernel.num_layers)
    gains = layer_head_values("logit_gains", gains, kernel.num_layers, kernel.num_heads)
    if is_concrete(gains):
        check_range("logit_gains", np.asarray(gains), 0.0, None, low_open=True)
    if isinstance(kernel, ProbabilityPath):
        return kernel.with_path(shares, gains)
    fields = {field.name: getattr(kernel, field.name) for field in dataclasses.fields(kernel)}
    return _extended_type(type(kernel))(**fields, probability_shares=shares, logit_gains=gains)


def probability_shares(kernel: AbstractKernel):
    """The kernel's shares ``rho (T,)``, or None for a kernel without the probability path."""
    return kernel.probability_shares if isinstance(kernel, ProbabilityPath) else None


def logit_gains(kernel: AbstractKernel):
    """The kernel's logit gains ``sigma (T, H)`` relative to the measured setting; None without the probability
    path or once formed (`FormedPathKernel`)."""
    return getattr(kernel, "logit_gains", None) if isinstance(kernel, ProbabilityPath) else None


def plain_kernel(kernel: AbstractKernel) -> AbstractKernel:
    """The kernel without the probability path (its base type's instance; a `FormedPathKernel`'s attention as
    a `DenseKernel`); a plain kernel as it is."""
    if isinstance(kernel, FormedPathKernel):
        return DenseKernel(kernel.attention, kernel.causal)
    if not isinstance(kernel, ProbabilityPath):
        return kernel
    if not kernel.extension:  # a type that carries the path itself (GainTableKernel): its shares at 0
        return kernel.with_path(jnp.zeros(kernel.num_layers), 1.0)
    base = next(cls for cls in type(kernel).__mro__[1:] if not issubclass(cls, ProbabilityPath))
    return base(**{field.name: getattr(kernel, field.name) for field in dataclasses.fields(base)})


def share_from_ratio(ratio) -> Float[Array, "..."]:
    """``rho = r / (1 + r)``: the probability path's share of the branch from the measured ratio ``r >= 0`` of
    probability-path to value-path local influence (`jaxroll.measure.paths`, summed over keys at the measured
    query rows), any shape. Differentiable.

    Raises:
        ConfigError: a ratio that is not finite and >= 0 (when concrete).
    """
    if is_concrete(ratio):
        check_range("ratio", np.asarray(ratio, dtype=np.float64), 0.0, None)
    return jnp.asarray(ratio) / (1.0 + jnp.asarray(ratio))


def _safe_sqrt(x):
    """``sqrt(x)`` for x > 0, 0 elsewhere, with a finite gradient at 0 (a row with one key)."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def path_weights(rows) -> Float[Array, "... n n"]:
    """The probability path's weight on each key for orthogonal value deviations of equal norm, per head and
    sequence (average afterwards): ``C_ij = A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)
    = A_ij sqrt(1 - 2 A_ij + sum_k A_ik^2)``, the norm ``A_ij |v_j - vbar_i|`` with ``v_k`` orthonormal.

    `rows` ``(..., n, n)`` row-stochastic attention (any leading axes); same shape out. Differentiable (a
    row with one key has weight 0 there and a finite gradient).
    """
    rows = jnp.asarray(rows)
    # Without cancellation (1 - 2 A_ij + sum_k A_ik^2 loses every digit where a row is one key to 1e-10): with m
    # the row's largest entry, r = sum_{k != m} A_ik and q = sum_{k != m} A_ik^2, the spread is r^2 + q at m and
    # (1 - A_ij)^2 + A_im^2 + q - A_ij^2 elsewhere.
    is_top = jax.nn.one_hot(jnp.argmax(rows, axis=-1), rows.shape[-1], dtype=bool)
    others = jnp.where(is_top, 0.0, rows)
    rest = jnp.sum(others, axis=-1, keepdims=True)
    squares = jnp.sum(others * others, axis=-1, keepdims=True)
    top = jnp.max(rows, axis=-1, keepdims=True)
    spread = jnp.where(is_top, rest * rest + squares, (1.0 - rows) ** 2 + top * top + squares - rows * rows)
    return rows * _safe_sqrt(spread)


def moved_shape(attention, weights, changed_weights) -> Float[Array, "layers n n"]:
    """The measured kernel's rows moved by a change of the path weights: ``P = K * C' / C`` (entrywise; 1 where
    ``C = 0``), with ``C``, ``C'`` the mean `path_weights` of the per-sequence, per-head rows before and
    after the change. At no change (``C' = C``) ``P = K``, so `with_path_shape` is today's layer there.

    All three ``(T, n, n)``; not normalised (`with_path_shape` normalises each row).
    """
    weights, changed_weights = jnp.asarray(weights), jnp.asarray(changed_weights)
    present = weights > 0
    ratio = jnp.where(present, changed_weights / jnp.where(present, weights, 1.0), 1.0)
    return jnp.asarray(attention) * ratio


def with_path_shape(attention, shape, shares, gains=1.0, causal: bool = True) -> FormedPathKernel:
    """Layers whose probability path has its own row shape: per layer t and row i,

        Phat(i, :) = shape(i, :) / sum_j shape(i, j)     (attention's row where the shape's row sums to 0)
        B(i, :)    = (1 - rho_t) K(i, :) + rho_t sigma_t(i) Phat(i, :),   W(i) = sum_j B(i, j)
        R(i, :)    = ((1 - lambda_t) e_i + lambda_t B(i, :)) / (1 - lambda_t + lambda_t W(i))

    a `FormedPathKernel` (``gained = sigma Phat``), rolled out with the model's lambdas. `attention` K
    ``(T, n, n)`` row-stochastic (the changed rows, averaged), `shape` ``(T, n, n)`` >= 0 (e.g. `moved_shape`),
    `shares` rho ``(T,)`` or a number in [0, 1), `gains` sigma a number, ``(T,)`` or ``(T, n)`` (per row,
    SSMax's ``s ln n_i``) >= 0. With ``shape = K`` and ``sigma = 1`` (or ``rho = 0``) it is today's layer
    ``(1 - lambda) I + lambda K``. Concrete inputs are checked; traced ones (grad, vmap) pass.

    Raises:
        ConfigError: one line naming ``path_shape``, ``probability_shares`` or ``logit_gains``.
    """
    attention, shape = jnp.asarray(attention), jnp.asarray(shape)
    if attention.ndim != 3 or shape.shape != attention.shape:
        raise ConfigError.of("path_shape", tuple(shape.shape),
                             f"an array of the attention's shape {tuple(attention.shape)}")
    layers, n = attention.shape[0], attention.shape[-1]
    shares = _checked_shares(shares, layers)
    gains = jnp.broadcast_to(jnp.asarray(gains, dtype=attention.dtype).reshape((-1, 1) if jnp.ndim(gains) == 1
                                                                              else jnp.shape(gains)), (layers, n))
    if is_concrete(shape) and np.any(np.asarray(shape) < 0):
        raise ConfigError.of("path_shape", float(np.min(np.asarray(shape))), "entries >= 0")
    if is_concrete(gains):  # >= 0: SSMax's s ln n_i is 0 at row 0, which sees one key
        check_range("logit_gains", np.asarray(gains), 0.0, None)
    total = jnp.sum(shape, axis=-1, keepdims=True)
    normalised = jnp.where(total > 0, shape / jnp.where(total > 0, total, 1.0), attention)
    return FormedPathKernel(attention, gains[:, :, None] * normalised, shares, causal)
