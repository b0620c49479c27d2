"""Measured tables moving an analytic kernel: `AnchoredTableKernel`, an ALiBi model's default layer.

An ALiBi model's analytic kernel (slopes and diagonal content, `AlibiKernel`) predicts its unchanged influence
better than the measured mean rows do, but a change of its logits, applied to that kernel, misses what the
sequences' own rows do: each sequence's row is reweighted under its own normaliser, and the mean of the changed
rows is not the changed mean (`jaxroll.engine.gain_table`, `jaxroll.engine.distance_tables`). The anchored
kernel keeps both: the measured tables say how the rows move, the analytic kernel where they start,

    K(change)(i, :) = T(change)(i, :) K_an(i, :) / T(none)(i, :)  /  sum_j (same)

with ``T`` the mean rows the tables read under a gain (temperature, SSMax) and a distance score, ``T(none)``
the measured mean rows ``K1``, and ``K_an`` the analytic layer kernel (0 where ``K1`` is 0). A slope scale
moves ``K_an`` (the tables hold no slope axis: the bias is inside the measured rows), and a temperature per
head is split into its mean logit gain ``g_t = sum_h w_h / tau_{t,h}`` (``w`` the normalised head weights),
which the tables read, and the heads' gains relative to it, ``sigma_{t,h} = 1 / (tau_{t,h} g_t)``, which move
``K_an`` and its heads' weights as the probability path moves an extended ALiBi kernel's (1 for a temperature
shared by the heads: the anchor then does not move). The probability path's rows and shares are the gain tables'
(`GainTableKernel`), on the same factor. With nothing changed ``K = K_an``: the analytic model's rollout, so
the unchanged prediction does not move; where the tables equal the analytic kernel's own rows the factor is 1
and every change is the tables' (exact at grid gains and kappas).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import is_concrete
from ..errors import ConfigError
from .alibi import AlibiKernel
from .gain_table import GainTableKernel
from .kernel import AbstractKernel, layer_head_values, register_kernel
from .probability import with_probability_path

__all__ = ["AnchoredTableKernel"]


class AnchoredTableKernel(GainTableKernel):
    """A `GainTableKernel` whose rows move the analytic kernel `anchor` (module docstring): the tables' fields,
    and ``anchor`` an `AlibiKernel` of the same T layers with a causal mask. Build with `create`."""

    anchor: AlibiKernel | None = None

    config_kind = "anchored_gain_table"
    config_keys = frozenset({"kernel_config"}) | AlibiKernel.config_keys
    sweep_fields = ("slope_scale",)
    slope_field = "anchor.alibi_slopes"

    @classmethod
    def create(cls, rows, weights, grid, *, anchor: AlibiKernel | None = None, field: str = "rows",
               **tables) -> "AnchoredTableKernel":
        """The tables as `GainTableKernel.create` checks them (`tables`: its keywords), moving `anchor`.

        Raises:
            ConfigError: one line naming the field, the value and what is allowed.
        """
        return cls._around(GainTableKernel.create(rows, weights, grid, field=field, **tables), anchor, "anchor")

    @classmethod
    def _around(cls, tables: GainTableKernel, anchor, field: str) -> "AnchoredTableKernel":
        """`tables` moving `anchor` (checked: an `AlibiKernel`, causal, the tables' layers; `field` names it)."""
        # The anchor is read and written as the paper's ALiBi sections (to_config, from_config): its kind is asked.
        alibi = (isinstance(anchor, AbstractKernel) and anchor.config_kind == AlibiKernel.config_kind
                 and not anchor.extension)
        if not alibi or anchor.mask != "causal":
            raise ConfigError.of(field, anchor.mask if alibi else type(anchor).__name__,
                                 "an AlibiKernel with a causal mask (the tables are causal rows)")
        if anchor.num_layers != tables.num_layers:
            raise ConfigError.of(field, f"{anchor.num_layers} layers", f"the tables' {tables.num_layers}")
        values = {item.name: getattr(tables, item.name) for item in dataclasses.fields(tables)}
        kernel = cls(**values, anchor=anchor)
        kernel.check()
        return kernel

    @property
    def num_heads(self) -> int:
        """The anchor's H: a slope scale or temperature may be per head (the tables hold the heads' mean)."""
        return self.anchor.num_heads

    def _per_layer(self, field: str, value):
        """One value per layer for what the tables read (a distance score, SSMax's scale, the path's gains): a
        number, ``(T,)``, ``(T, 1)``, or ``(T, H)`` with the same value in every head (a per-layer value at full
        shape, as sweeps and designs hand it; traced, the heads' mean). Heads that differ are refused in one line:
        the tables hold the heads' mean rows."""
        if jnp.ndim(value) == 2 and jnp.shape(value)[1] == self.num_heads > 1:
            if is_concrete(value) and np.ptp(np.asarray(value, dtype=np.float64), axis=1).max() > 0:
                raise ConfigError.of(field, np.asarray(value).tolist(), "one value per layer on a measured ALiBi "
                                     "config (its tables hold the heads' mean rows); per head: a temperature or "
                                     "a slope scale")
            value = jnp.mean(jnp.asarray(value), axis=1)
        return super()._per_layer(field, value)

    def with_path(self, shares, gains):
        """The probability path's shares replaced and the row gains multiplied by `gains` (one per layer)."""
        return super().with_path(shares, self._per_layer("logit_gains", gains))

    def analytic_kernel(self) -> AlibiKernel:
        """The anchor: the ALiBi + content kernel the tables move."""
        return self.anchor

    def anchor_factor(self, n: int) -> Float[Array, "n n"]:
        """``K_an / K1`` of one layer at length n (0 where the measured rows are 0)."""
        measured = self.rows[self.grid.index(1.0), :n, :n]
        positive = measured > 0
        return jnp.where(positive, self.anchor.dense(n) / jnp.where(positive, measured, 1.0), 0.0)

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        return super().influence_bytes(n, method, itemsize) + int(self.anchor.num_heads * n * n * itemsize)

    def scale_slopes(self, scale, field: str = "slope_scale") -> "AnchoredTableKernel":
        """The anchor's slopes multiplied by ``s >= 0`` (the tables hold no slope axis)."""
        return dataclasses.replace(self, anchor=self.anchor.scale_slopes(scale, field))

    def temper(self, tau, field: str = "tau") -> "AnchoredTableKernel":
        """``tau_{t,h} > 0`` split into the mean gain ``g_t = sum_h w_h / tau_{t,h}``, every row's gain
        multiplied by it, and the relative gains ``sigma_{t,h} = 1 / (tau_{t,h} g_t)`` on the anchor: its logits
        multiplied by them, and its head weights by ``1 - rho_t + rho_t sigma_{t,h}`` (the probability path's
        rule for an extended kernel, `jaxroll.engine.probability`; their weighted mean is 1)."""
        tau = layer_head_values(field, tau, self.num_layers, self.num_heads)
        weights = self.anchor.head_weights / jnp.sum(self.anchor.head_weights, axis=-1, keepdims=True)
        gain = jnp.sum(weights / tau, axis=-1)
        relative = 1.0 / (tau * gain[:, None])
        shares = jnp.reshape(self.probability_shares, (-1, 1))
        anchor = self.anchor.temper(1.0 / relative, field)
        anchor = dataclasses.replace(anchor, head_weights=anchor.head_weights * (1.0 - shares + shares * relative))
        return dataclasses.replace(self, row_gains=self.row_gains * gain[:, None], anchor=anchor)

    def check_length(self, n: int) -> None:
        if n > self.size:
            raise ConfigError.of("n", n, f"at most the tables' N = {self.size} (the ALiBi + content kernel alone "
                                 "serves any length: measure with --stats lambda,content,influence,paths)")

    def prepend_sinks(self, num_sinks: int, n: int):
        """The kernel at ``n + k`` tokens: itself within the tables' N; beyond it, while the tables move nothing
        (every row at gain 1, no score: sinks come first), the anchor with the same probability shares, which is
        this kernel's layer there and is defined at any length (later changes then act on it analytically)."""
        if n + num_sinks > self.size and self._unmoved():
            return with_probability_path(self.anchor, self.probability_shares)
        return super().prepend_sinks(num_sinks, n)

    def _unmoved(self) -> bool:
        arrays = [self.row_gains - 1.0, self.distance_bias] + ([self.distance_kappas] if self.distance_keys else [])
        return all(is_concrete(array) and not np.any(np.asarray(array)) for array in arrays)

    def to_config(self, kernel_file: str | None = None) -> dict:
        """``kernel_type: anchored_gain_table`` with the npz `kernel_file` of the tables, beside the anchor's
        ALiBi sections."""
        return {"kernel_config": {"kernel_type": self.config_kind, "file": kernel_file}} | self.anchor.to_config()

    @classmethod
    def from_config(cls, config, *, num_layers: int, directory=None) -> "AnchoredTableKernel":
        anchor = AlibiKernel.from_config({key: value for key, value in config.items() if key != "kernel_config"},
                                         num_layers=num_layers)
        tables = GainTableKernel.from_config(config, num_layers=num_layers, directory=directory)
        return cls._around(tables, anchor, "mask_config.mask_type")


register_kernel(AnchoredTableKernel)
