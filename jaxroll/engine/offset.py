"""Relative-position (Toeplitz) kernel types: `PowerKernel` and `TableKernel`.

Head h scores a causal pair by its offset alone, ``s_h(i, j) = f_h(i - j)``
with ``f_h(0) = d_h`` (the diagonal content score); ``v^T A`` in
O(H N log N) by FFT (`jaxroll.engine.relative`). `PowerKernel` with
``alpha = 1`` is ALiBi (Press et al. 2022), computed by FFT instead of the
closed form; the rollout treats both alike. `RelativeKernel` is their
common base and their YAML form (``kernel_type: relative`` with a
``family``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import memory
from .._checks import as_float_array, check_positive_int, check_range, is_concrete, per_layer_and_head
from ..errors import ConfigError
from . import relative
from .config import check_keys, compact, nested_array, read_kernel_file
from .kernel import AbstractKernel, layer_head_values, register_kernel
from .plan import Path

__all__ = ["RelativeKernel", "PowerKernel", "TableKernel", "biased_table", "table_at_distances"]

_RELATIVE_KEYS = {"kernel_type", "family", "num_heads", "slopes", "exponents", "offset_scores", "file",
                  "diagonal_scores", "head_weights"}


class RelativeKernel(AbstractKernel):
    """Toeplitz kernels (abstract): subclasses give ``scores(n) = f_h(k)``, k = 0..n-1, shape ``(H, n)``.

    Every logit operation of these kernels is exact in the theory except
    `read_at_distances` (a rotary model's measured kernel read between its
    integer distances). Their YAML form is ``kernel_type: relative`` with a
    ``family`` that names the subclass (each declares its `families`).
    """

    config_kind = "relative"
    families: ClassVar[tuple[str, ...]] = ()
    """The ``kernel_config.family`` names a subclass reads (`from_config`)."""

    @abc.abstractmethod
    def scores(self, n: int) -> Float[Array, "heads n"]:
        """One layer's ``f_h(k)``, k = 0..n-1 (``f_h(0) = d_h``)."""

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

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa") -> "TableKernel":
        """An offset kernel (`TableKernel`) of ``f'_h(k) = f_h(k) + kappa_h g(k)``: exact."""
        kappa = layer_head_values(field, kappa, self.num_layers, self.num_heads)
        table, diagonal = self.offset_table(max(n, 2))
        return biased_table(table, diagonal, self.head_weights, kappa, score, n)

    def offset_table(self, n: int):
        """``(f[t, h, k - 1] for k = 1..n-1, f[t, h, 0])``: the scores as a table and the diagonal."""
        scores = jax.vmap(lambda layer: layer.scores(n))(self)  # (T, H, n)
        return scores[..., 1:], scores[..., 0]

    def head_logits(self, n: int, field: str = "logits"):
        """``s_h(i, j) = f_h(i - j)`` (``f_h(0)`` above the diagonal too, masked by the caller), and ``w / sum w``."""
        offsets = jnp.maximum(jnp.arange(n)[:, None] - jnp.arange(n)[None, :], 0)
        return self.scores(n)[:, offsets], self.head_weights / jnp.sum(self.head_weights, axis=-1, keepdims=True)

    def reweighted_heads(self, factors):
        """Head weights ``w_h factors[h]`` (one layer) and ``sum_h (w_h / sum w) factors[h]``."""
        return (dataclasses.replace(self, head_weights=self.head_weights * factors),
                jnp.sum(self.head_weights * factors, axis=-1) / jnp.sum(self.head_weights, axis=-1))

    def scores_by_offset(self, n: int):
        scores = jax.vmap(lambda layer: layer.scores(n))(self)
        return scores, self.head_weights / jnp.sum(self.head_weights, axis=-1, keepdims=True)

    def _common_config(self) -> tuple[dict, dict]:
        weights = np.asarray(self.head_weights, dtype=np.float64)
        head = {"kernel_type": "relative", "num_heads": int(self.num_heads)}
        tail = {"diagonal_scores": compact(self.diagonal_scores),
                "head_weights": None if np.all(weights == weights.flat[0]) else compact(weights)}
        return head, tail

    @classmethod
    def from_config(cls, config, *, num_layers: int, directory=None) -> "RelativeKernel":
        """The subclass whose `families` holds ``kernel_config.family``, from the section's arrays."""
        section = "kernel_config"
        kernel_config = config[section]
        check_keys(section, kernel_config, _RELATIVE_KEYS, required={"family", "num_heads"})
        members = {family: member for member in RelativeKernel.__subclasses__() for family in member.families}
        family = kernel_config["family"]
        if not isinstance(family, str) or family not in members:
            raise ConfigError(f"{section}.family: got {family!r}; allowed: one of {', '.join(members)}")
        member = members[family]
        needed = member.family_keys(family, kernel_config)
        missing = sorted(needed - set(kernel_config))
        if missing:
            raise ConfigError(f"{section}.{missing[0]}: missing; the {family} family needs it")
        allowed = {"kernel_type", "family", "num_heads", "diagonal_scores", "head_weights"} | member.family_keys(family)
        extra = sorted(set(kernel_config) - allowed)
        if extra:
            raise ConfigError(f"{section}.{extra[0]}: not used by the {family} family; allowed: "
                              f"{', '.join(sorted(allowed))}")
        common = {
            "num_layers": num_layers,
            "num_heads": check_positive_int(f"{section}.num_heads", kernel_config["num_heads"]),
            "diagonal_scores": nested_array("diagonal_scores", kernel_config.get("diagonal_scores", [[0.0]])),
            "head_weights": nested_array("head_weights", kernel_config.get("head_weights")),
        }
        try:
            return member.from_family(family, kernel_config, common, directory)
        except ConfigError as error:
            raise error if (error.field or "").startswith(section + ".") else error.within(section) from None


class PowerKernel(RelativeKernel):
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

    sweep_fields = ("slopes", "exponents", "slope_scale", "diagonal_scores", "head_weights")
    slope_field = "slopes"
    families = ("alibi", "power")

    def temper(self, tau, field: str = "tau") -> "PowerKernel":
        """``f / tau``: slopes and content divided by tau (``(T, H)``-broadcast); exact."""
        tau = layer_head_values(field, tau, self.num_layers, self.num_heads)
        return dataclasses.replace(self, slopes=self.slopes / tau, diagonal_scores=self.diagonal_scores / tau)

    def scale_slopes(self, scale, field: str = "slope_scale") -> "PowerKernel":
        return dataclasses.replace(self, slopes=self.slopes * layer_head_values(field, scale, self.num_layers,
                                                                                 self.num_heads))

    def read_at_distances(self, ratio, n: int, field: str = "rotary_ratio") -> "PowerKernel":
        """``-m (k / r)^alpha = -(m r^-alpha) k^alpha``: the same family, defined at every length."""
        del n
        ratio = layer_head_values(field, ratio, self.num_layers, self.num_heads)
        return dataclasses.replace(self, slopes=self.slopes * jnp.power(ratio, -self.exponents))

    def to_config(self, kernel_file: str | None = None) -> dict:
        """``family: alibi`` (every exponent 1) or ``power``, slopes (and exponents) inline."""
        del kernel_file
        head, tail = self._common_config()
        exponents = np.asarray(self.exponents, dtype=np.float64)
        head |= {"family": "alibi" if np.all(exponents == 1.0) else "power", "slopes": compact(self.slopes)}
        if head["family"] == "power":
            head["exponents"] = compact(exponents)
        return {"kernel_config": head | tail}

    @staticmethod
    def family_keys(family: str, kernel_config=None) -> set[str]:
        """The keys `family` needs (and, with `kernel_config`, the ones it needs of that section)."""
        del kernel_config
        return {"slopes", "exponents"} if family == "power" else {"slopes"}

    @classmethod
    def from_family(cls, family: str, kernel_config, common: dict, directory) -> "PowerKernel":
        del directory
        exponents = nested_array("exponents", kernel_config["exponents"]) if family == "power" else 1.0
        return cls.create(slopes=nested_array("slopes", kernel_config["slopes"]), exponents=exponents, **common)


class TableKernel(RelativeKernel):
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

    sweep_fields = ("diagonal_scores", "head_weights")
    families = ("table",)

    def temper(self, tau, field: str = "tau") -> "TableKernel":
        """``f / tau``: table and content divided by tau (``(T, H)``-broadcast); exact."""
        tau = layer_head_values(field, tau, self.num_layers, self.num_heads)
        return dataclasses.replace(self, offset_scores=self.offset_scores / tau[..., None],
                                   diagonal_scores=self.diagonal_scores / tau)

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa") -> "TableKernel":
        kappa = layer_head_values(field, kappa, self.num_layers, self.num_heads)
        return biased_table(self.offset_scores, self.diagonal_scores, self.head_weights, kappa, score, n)

    def head_logits(self, n: int, field: str = "logits"):
        self.check_length(n)
        return super().head_logits(n, field)

    def read_at_distances(self, ratio, n: int, field: str = "rotary_ratio") -> "TableKernel":
        """The table read at ``k / r`` by linear interpolation (`table_at_distances`), K offsets kept.

        A ratio below 1 reads distances up to ``(n - 1) / r``, which the table must reach (refused
        otherwise when concrete; traced, the value is held at ``f(K)``).
        """
        ratio = layer_head_values(field, ratio, self.num_layers, self.num_heads)
        if is_concrete(ratio) and n >= 2:
            smallest = float(np.min(np.asarray(ratio)))
            if (n - 1) / smallest > self.num_offsets:
                raise ConfigError(f"{field}: ratio {smallest:g} reads distance (n - 1) / r = {(n - 1) / smallest:g} "
                                  f"at length {n}, beyond the table's {self.num_offsets} offsets; allowed: ratio >= "
                                  f"{(n - 1) / self.num_offsets:g} here")
        distances = jnp.arange(1, self.num_offsets + 1, dtype=jnp.result_type(self.offset_scores))
        return dataclasses.replace(self, offset_scores=table_at_distances(self.offset_scores,
                                                                          distances / ratio[..., None]))

    def to_config(self, kernel_file: str | None = None) -> dict:
        """``family: table``; the table goes to the npz `kernel_file` (`file_arrays`)."""
        head, tail = self._common_config()
        return {"kernel_config": head | {"family": "table", "file": kernel_file} | tail}

    def file_arrays(self) -> dict:
        return {"offset_scores": np.asarray(self.offset_scores, dtype=np.float64)}

    @staticmethod
    def family_keys(family: str, kernel_config=None) -> set[str]:
        if kernel_config is None:
            return {"offset_scores", "file"}
        return set() if "file" in kernel_config else {"offset_scores"}

    @classmethod
    def from_family(cls, family: str, kernel_config, common: dict, directory) -> "TableKernel":
        del family
        if "file" in kernel_config and "offset_scores" in kernel_config:
            raise ConfigError("file: give offset_scores inline or in a file, not both")
        table = (read_kernel_file(kernel_config["file"], "offset_scores", directory) if "file" in kernel_config
                 else as_float_array("offset_scores", kernel_config["offset_scores"]))
        return cls.create(offset_scores=table, **common)


register_kernel(RelativeKernel)


def biased_table(table, diagonal, weights, kappa, score, n: int) -> TableKernel:
    """The offset kernel ``f'_h(k) = table_h[k - 1] + kappa_h g(k)``, ``f'_h(0) = d_h + kappa_h g(0)``
    (``g = score``), checked at length n when concrete: a distance bias on any Toeplitz kernel."""
    offsets = jnp.arange(1, table.shape[-1] + 1)
    biased = TableKernel(offset_scores=table + kappa[..., None] * score(offsets),
                         diagonal_scores=diagonal + kappa * score(0), head_weights=weights)
    if is_concrete(biased.offset_scores):
        biased.check_length(n)
    return biased


def table_at_distances(offset_scores: Float[Array, "... K"], distances: Float[Array, "... m"]) -> Float[Array, "... m"]:
    """A score table ``f(k) = offset_scores[k - 1]`` (k = 1..K) read at real distances x >= 0.

    Linear interpolation between the integer distances,
    ``f(x) = (1 - u) f(floor x) + u f(floor x + 1)`` with ``u = x - floor x``,
    held at ``f(1)`` below distance 1 and at ``f(K)`` above K (the table says
    nothing outside ``[1, K]``; distance 0 is a `TableKernel`'s separate
    diagonal score, never read here). At an integer x in ``[1, K]`` the value
    is the table's entry exactly. Leading axes broadcast; differentiable in
    `distances` (piecewise linear: kinks at the integers).
    """
    size = offset_scores.shape[-1]
    position = jnp.clip(distances, 1.0, float(size)) - 1.0  # 0-based, in [0, K - 1]
    if size == 1:
        return jnp.broadcast_to(offset_scores, jnp.broadcast_shapes(offset_scores.shape, position.shape))
    lower = jnp.clip(jnp.floor(position), 0, size - 2)
    fraction = position - lower
    shape = jnp.broadcast_shapes(offset_scores.shape[:-1] + (1,), position.shape)
    table = jnp.broadcast_to(offset_scores, shape[:-1] + (size,))
    index = jnp.broadcast_to(lower.astype(jnp.int32), shape)
    below = jnp.take_along_axis(table, index, axis=-1)
    above = jnp.take_along_axis(table, index + 1, axis=-1)
    # (1 - u) a + u b, not a + u (b - a): exact at u = 0 and u = 1.
    return (1.0 - fraction) * below + fraction * above


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
