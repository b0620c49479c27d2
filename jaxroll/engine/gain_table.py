"""Measured rows tabulated over the logit gain: `GainTableKernel`, a measured layer that a temperature moves as
the sequences' own rows move.

A measured dense kernel is a mean over sequences s and heads h of softmax rows, ``A = mean_{s,h}
softmax(z^s_h)``. A temperature or SSMax multiplies each sequence's logits by a gain g, and the mean of the
changed rows, ``mean_{s,h} softmax(g z^s_h)``, is not the changed mean, ``softmax(g log A)`` (`DenseKernel.temper`):
sharp, content-placed rows sharpen where each sequence looks, while the mean of them (flat where the sequences
disagree) sharpens toward its own average shape. On rotary models this turned the predicted sign of every
temperature and SSMax (docs/interventions.md, "The probability path's shape"). So the measurement tabulates
the mean rows at a grid of gains ``g_1 < ... < g_G`` (1 among them; `jaxroll.measure.registry.GAIN_GRID`),
with the probability path's weights of orthogonal equal-norm values (`jaxroll.engine.probability.path_weights`) at the same gains:

    rows[t, k]    = mean_{s,h} softmax_j(g_k z^s_{t,h}(i, j))                      (T, G, N, N)
    weights[t, k] = mean_{s,h} c(softmax(g_k z^s_{t,h})),  c(A)_ij = A_ij sqrt(1 - 2 A_ij + sum_l A_il^2)

A row i at gain g (per layer; 1 as measured, ``1 / tau`` under a temperature, ``s ln n_i`` under SSMax) reads
the tables linearly in ``ln g`` between neighbouring grid gains; below the grid linearly in g toward g = 0,
where every row is uniform over its keys; above it, the last gain's rows. Rows are independent, so the
table is exact at grid gains for SSMax's row-dependent gains too. With ``d_t(i - j)`` added logits (a
distance score, `add_distance_score`) every row is reweighted by ``e^{d_t(i - j)}`` and renormalised; where
the measurement also tabulated the rows under that score's form (``distance_rows``,
`jaxroll.engine.distance_tables`), every gain's rows are multiplied instead by the tables' ratio
``T_f(kappa) / K1`` (`distance_ratio`; exact at gain 1 and a grid kappa). Then,
with the probability path's share ``rho_t`` (the measured ``r_t / (1 + r_t)``), layer t is the closed-ratio
layer of `jaxroll.engine.probability.with_path_shape`:

    K(i, :) = rows at g_t(i),      C(i, :) = weights at g_t(i),     K1, C1 the same at gain 1
    P(i, :) = K1(i, :) C(i, :) / C1(i, :) / sum       (1 where C1 = 0)
    B(i, :) = (1 - rho_t) K(i, :) + rho_t g_t(i) P(i, :),     W(i) = 1 - rho_t + rho_t g_t(i)
    R(i, :) = ((1 - lambda_t) e_i + lambda_t B(i, :)) / (1 - lambda_t + lambda_t W(i))

At gain 1 (and any rho) ``K = K1 = P`` and ``W = 1``: the measured kernel's plain rollout exactly, so the
unchanged prediction does not move. What it assumes: the change acts on the content logits as a gain (the
rows of a rotary or learned-position model carry no bias the gain leaves alone); later layers' logits do not
move with their inputs; the path's shape moves by the closed form's ratio (orthogonal equal-norm values).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import as_float_array, check_range, is_concrete
from ..errors import ConfigError
from .config import check_keys, read_kernel_arrays
from .dense import ROW_SUM_TOLERANCE, _row_renormalised, head_averaged_values
from .distance_tables import distance_key, distance_ratio
from .kernel import register_kernel
from .plan import Path
from .probability import ProbabilityPath, _checked_shares, formed_rows, formed_step

__all__ = ["GainTableKernel", "uniform_rows", "uniform_weights"]

def uniform_rows(n: int, dtype=jnp.float64) -> Float[Array, "n n"]:
    """The causal rows at gain 0: ``1 / (i + 1)`` for j <= i."""
    i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    return jnp.where(j <= i, 1.0 / (i + 1.0), 0.0).astype(dtype)


def uniform_weights(n: int, dtype=jnp.float64) -> Float[Array, "n n"]:
    """`path_weights` of `uniform_rows`: ``(1 / n_i) sqrt(1 - 1 / n_i)``, ``n_i = i + 1``, for j <= i."""
    i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    keys = i + 1.0
    return jnp.where(j <= i, jnp.sqrt(1.0 - 1.0 / keys) / keys, 0.0).astype(dtype)


def _at_gains(table, at_zero, grid, gains):
    """Each row i of `table` ``(G, n, n)`` read at gain ``gains[i]``: linear in ln g inside the grid, linear
    in g below it (to `at_zero` at 0), the last gain's row above. ``(n, n)``."""
    grid = jnp.asarray(grid, dtype=table.dtype)
    count, n = grid.shape[0], gains.shape[0]
    logs = jnp.log(grid)
    safe = jnp.maximum(gains, grid[0])
    index = jnp.clip(jnp.searchsorted(logs, jnp.log(safe), side="right") - 1, 0, count - 2)
    weight = jnp.clip((jnp.log(safe) - logs[index]) / (logs[index + 1] - logs[index]), 0.0, 1.0)
    rows = jnp.arange(n)
    inside = (1.0 - weight)[:, None] * table[index, rows] + weight[:, None] * table[index + 1, rows]
    below = gains / grid[0]
    return jnp.where((gains < grid[0])[:, None], below[:, None] * table[0] + (1.0 - below)[:, None] * at_zero,
                     inside)


_DISTANCE_PARTS = ("rows", "scores", "kappas", "grid", "keys")


def _checked_distances(distances, layers: int, n: int, field: str) -> tuple:
    """``(distance_rows, distance_scores, distance_kappas, distance_grid, distance_keys)`` of the mapping
    `distances` (`GainTableKernel.create`), checked in one line each; ``(None, None, None, (), ())`` for None."""
    if distances is None:
        return None, None, None, (), ()
    where = f"{field}.distances"
    check_keys(where, distances, _DISTANCE_PARTS, required=("rows", "scores", "grid", "keys"))
    keys = distances["keys"]
    if (isinstance(keys, str) or not all(isinstance(key, str) for key in keys) or not keys
            or len(set(keys)) != len(keys)):
        raise ConfigError.of(f"{where}.keys", keys, "distinct form names, at least one")
    grid = tuple(float(g) for g in as_float_array(f"{where}.grid", distances["grid"]).reshape(-1))
    if not grid or 0.0 in grid or any(b <= a for a, b in zip(grid, grid[1:])):
        raise ConfigError.of(f"{where}.grid", list(grid), "increasing nonzero kappas, at least one")
    shape = (layers, len(keys), len(grid), n, n)
    rows = as_float_array(f"{where}.rows", distances["rows"])
    if rows.shape != shape:
        raise ConfigError.of(f"{where}.rows", f"shape {rows.shape}", f"{shape} (layers, forms, kappas, N, N)")
    check_range(f"{where}.rows", rows, 0.0, None)
    sums = rows.sum(axis=-1)
    if np.any(np.abs(sums - 1.0) > ROW_SUM_TOLERANCE) or np.triu(rows, k=1).any():
        raise ConfigError.of(f"{where}.rows", "a row off 1 or weight above the diagonal",
                             "causal row-stochastic tables")
    scores = as_float_array(f"{where}.scores", distances["scores"])
    scores = np.broadcast_to(scores, (layers,) + scores.shape) if scores.ndim == 2 else scores
    if scores.shape != (layers, len(keys), n):
        raise ConfigError.of(f"{where}.scores", f"shape {scores.shape}", f"({len(keys)} forms, {n})")
    check_range(f"{where}.scores", scores, None, None)
    kappas = np.zeros((layers, len(keys))) if distances.get("kappas") is None else as_float_array(
        f"{where}.kappas", distances["kappas"])
    return rows, np.array(scores), kappas, grid, tuple(keys)


class GainTableKernel(ProbabilityPath):
    """Measured mean rows at a grid of logit gains, read at each row's gain (module docstring).

    Fields (T layers, G gains, N tokens): ``rows (T, G, N, N)`` row-stochastic, ``weights (T, G, N, N)`` >= 0,
    ``row_gains (T, N)`` >= 0 (1 as measured), ``distance_bias (T, N)`` (added logits by offset i - j, 0 as
    measured), ``probability_shares (T,)`` in [0, 1) and the static ``grid`` (G,) increasing, 1 among them.
    Optional distance tables (F forms, K kappas; `jaxroll.engine.distance_tables`): ``distance_rows
    (T, F, K, N, N)`` row-stochastic, ``distance_scores (T, F, N)`` each form's ``g_f(m)`` (the same in every
    layer), ``distance_kappas (T, F)`` (0 as measured), the static ``distance_grid`` (K,) increasing, nonzero,
    and ``distance_keys`` (F,) (`distance_key`). Lengths as a `DenseKernel`'s (n <= N, causal). Build with
    `create` (checks).
    """

    rows: Float[Array, "layers gains n n"]
    weights: Float[Array, "layers gains n n"]
    row_gains: Float[Array, "layers n"]
    distance_bias: Float[Array, "layers n"]
    probability_shares: Float[Array, " layers"]
    grid: tuple[float, ...] = eqx.field(static=True)
    distance_rows: Float[Array, "layers forms kappas n n"] | None = None
    distance_scores: Float[Array, "layers forms n"] | None = None
    distance_kappas: Float[Array, "layers forms"] | None = None
    distance_grid: tuple[float, ...] = eqx.field(static=True, default=())
    distance_keys: tuple[str, ...] = eqx.field(static=True, default=())

    extension: ClassVar[bool] = False
    config_kind = "gain_table"

    @classmethod
    def create(cls, rows, weights, grid, *, row_gains=None, distance_bias=None, probability_shares=0.0,
               distances=None, field: str = "rows") -> "GainTableKernel":
        """Check and build (module docstring for the fields; `row_gains` default 1, `distance_bias` 0).

        `distances`: None, or a mapping with ``rows`` ``(T, F, K, N, N)``, ``scores`` ``(F, N)`` or
        ``(T, F, N)``, ``grid`` (K,), ``keys`` (F,) and optionally ``kappas`` ``(T, F)`` (default 0).

        Raises:
            ConfigError: one line naming the field, the value and what is allowed.
        """
        grid = tuple(float(g) for g in as_float_array(f"{field}.grid", grid).reshape(-1))
        if len(grid) < 2 or 1.0 not in grid or any(b <= a for a, b in zip(grid, grid[1:])) or grid[0] <= 0:
            raise ConfigError.of(f"{field}.grid", list(grid), "increasing gains > 0, at least two, 1 among them")
        rows, weights = as_float_array(field, rows), as_float_array(f"{field}.weights", weights)
        layers, count = rows.shape[:2] if rows.ndim == 4 else (0, 0)
        if rows.ndim != 4 or count != len(grid) or rows.shape[2] != rows.shape[3] or layers < 1:
            raise ConfigError.of(field, f"shape {rows.shape}", f"(num_layers, {len(grid)} gains, N, N)")
        if weights.shape != rows.shape:
            raise ConfigError.of(f"{field}.weights", f"shape {weights.shape}", f"the rows' shape {rows.shape}")
        check_range(field, rows, 0.0, None)
        check_range(f"{field}.weights", weights, 0.0, None)
        sums = rows.sum(axis=-1)
        if np.any(np.abs(sums - 1.0) > ROW_SUM_TOLERANCE):
            raise ConfigError.of(field, f"a row summing to {sums.flat[np.argmax(np.abs(sums - 1.0))]!r}",
                                 f"row-stochastic tables (rows sum to 1 within {ROW_SUM_TOLERANCE:g})")
        if np.triu(rows, k=1).any():
            raise ConfigError.of(field, "weight above the diagonal", "causal rows (j <= i)")
        n = rows.shape[-1]
        gains = np.ones((layers, n)) if row_gains is None else as_float_array("row_gains", row_gains)
        bias = np.zeros((layers, n)) if distance_bias is None else as_float_array("distance_bias", distance_bias)
        kernel = cls(rows, weights, gains, bias, _checked_shares(probability_shares, layers), grid,
                     *_checked_distances(distances, layers, n, field))
        kernel.check()
        return kernel

    def check(self) -> None:
        layers, n = self.num_layers, self.size
        tabulated = (("distance_kappas", (layers, len(self.distance_keys))),) if self.distance_keys else ()
        for name, shape in (("row_gains", (layers, n)), ("distance_bias", (layers, n))) + tabulated:
            value = getattr(self, name)
            if tuple(np.shape(value)) != shape:
                raise ConfigError.of(name, f"shape {tuple(np.shape(value))}", f"{shape}")
            if is_concrete(value):
                check_range(name, np.asarray(value), 0.0 if name == "row_gains" else None, None)
        _checked_shares(self.probability_shares, layers)

    @property
    def num_layers(self) -> int:
        return self.rows.shape[0]

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def size(self) -> int:
        return self.rows.shape[-1]

    @property
    def logit_gains(self):
        """None: the gains live per row in ``row_gains`` (the model reports ones; config.yaml writes none)."""
        return None

    def default_length(self) -> int:
        return self.size

    def check_length(self, n: int) -> None:
        if n > self.size:
            raise ConfigError.of("n", n, f"at most the gain tables' N = {self.size}")

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        del method
        tables = 2 * len(self.grid) + len(self.distance_keys) * len(self.distance_grid)
        return int((tables * self.num_layers * self.size ** 2 + 8 * n * n) * itemsize)

    def _layer_arrays(self, n: int):
        """One layer's ``(attention, gained)`` at length n: ``K`` and ``g(i) P(i, :)`` (module docstring)."""
        gains, one = self.row_gains[:n], self.grid.index(1.0)
        offsets = jnp.maximum(jnp.arange(n)[:, None] - jnp.arange(n)[None, :], 0)
        tilt = jnp.exp(self.distance_bias[:n][offsets])
        at_zero = uniform_rows(n, self.rows.dtype) * tilt  # every sequence's row is uniform there: exact
        if self.distance_keys:
            causal = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]
            scores = jnp.where(causal, self.distance_scores[:, offsets], 0.0)  # g_f(i - j), (F, n, n)
            at_zero = at_zero * jnp.exp(jnp.einsum("f,fij->ij", self.distance_kappas, scores))
            tilt = tilt * distance_ratio(self.rows[one, :n, :n], self.distance_rows[:, :, :n, :n],
                                         self.distance_grid, scores, self.distance_kappas)
        rows, weights = self.rows[:, :n, :n] * tilt, self.weights[:, :n, :n]
        anchor = self.anchor_factor(n)
        rows = rows if anchor is None else rows * anchor
        kernel = _row_renormalised(_at_gains(rows, at_zero, self.grid, gains))
        weight = _at_gains(weights, uniform_weights(n, rows.dtype), self.grid, gains)
        measured = weights[one]  # a grid gain reads its own table (weight 0 on the neighbour)
        ratio = jnp.where(measured > 0, weight / jnp.where(measured > 0, measured, 1.0), 1.0)
        return kernel, gains[:, None] * _row_renormalised(rows[one] * ratio)

    def anchor_factor(self, n: int):
        """A factor ``(n, n)`` on every table's rows of one layer before they are renormalised, or None (here:
        the measured rows as they are; `jaxroll.engine.anchored_table` moves an analytic kernel by them)."""
        del n
        return None

    def step(self, row, weight, product, left: bool = False):
        """Row i mixed with ``lambda_i = lambda W(i) / (1 - lambda + lambda W(i))`` (`formed_step`)."""
        del product
        attention, gained = self._layer_arrays(row.shape[-1])
        return formed_step(attention, gained, self.probability_shares, row, weight, left)

    def dense(self, n: int):
        return formed_rows(*self._layer_arrays(n), self.probability_shares)[0]

    def row_times_kernel(self, v, path: Path = Path()):
        del path
        return v @ self.dense(v.shape[-1])

    def plan(self, n: int, method: str, dtype) -> Path:
        del n, dtype
        return Path(method=method, checkpoint=True)

    def with_path(self, shares, gains):
        """The probability path's shares replaced and the row gains multiplied by `gains` ``(T, 1)``."""
        return dataclasses.replace(self, probability_shares=shares,
                                   row_gains=self.row_gains * jnp.reshape(gains, (-1, 1)))

    def _per_layer(self, field: str, value):
        return head_averaged_values(self, field, value)

    def temper(self, tau, field: str = "tau") -> "GainTableKernel":
        """Every row's gain divided by ``tau_t > 0`` (per layer)."""
        return dataclasses.replace(self, row_gains=self.row_gains / self._per_layer(field, tau)[:, None])

    def scaled_rows(self, scale, row_factor, n: int, field: str = "ssmax_scale") -> "GainTableKernel":
        """SSMax: row i's gain multiplied by ``s_t row_factor[i]`` (``ln n_i``), at length n."""
        scale = self._per_layer(field, scale)
        tables = {} if not self.distance_keys else {"distance_rows": self.distance_rows[..., :n, :n],
                                                    "distance_scores": self.distance_scores[..., :n]}
        return dataclasses.replace(self, rows=self.rows[:, :, :n, :n], weights=self.weights[:, :, :n, :n],
                                   row_gains=self.row_gains[:, :n] * scale[:, None] * row_factor[None, :n],
                                   distance_bias=self.distance_bias[:, :n], **tables)

    def add_distance_score(self, kappa, score, n: int, field: str = "kappa") -> "GainTableKernel":
        """``kappa_t g(i - j)`` added to every logit (per layer): read from the distance tables where they hold
        g's form (`score.form`, `score.k`: `jaxroll.interventions.DistanceScore`), else the rows reweighted by
        ``e^{kappa g}``."""
        del n
        kappa = self._per_layer(field, kappa)
        key = distance_key(score.form, score.k) if hasattr(score, "form") else None
        if key in self.distance_keys:
            column = self.distance_keys.index(key)
            return dataclasses.replace(self, distance_kappas=jnp.asarray(self.distance_kappas).at[:, column].add(kappa))
        return dataclasses.replace(self, distance_bias=self.distance_bias
                                   + kappa[:, None] * score(jnp.arange(self.size))[None, :])

    def prepend_sinks(self, num_sinks: int, n: int):
        self.check_length(n + num_sinks)  # the sinks are read as tokens like any other (AbstractKernel's rule)
        return self

    def padded(self, num_layers: int, num_heads: int):
        del num_layers, num_heads
        return None

    def replaced(self, **values):
        kernel = dataclasses.replace(self, **values)
        kernel.check()
        return kernel

    def to_config(self, kernel_file: str | None = None) -> dict:
        """``kernel_type: gain_table`` and the npz `kernel_file` that holds the tables (`file_arrays`)."""
        return {"kernel_config": {"kernel_type": "gain_table", "file": kernel_file}}

    def file_arrays(self) -> dict:
        arrays = {name: np.asarray(getattr(self, name), dtype=np.float64)
                  for name in ("rows", "weights", "row_gains", "distance_bias")} | {"grid": np.asarray(self.grid)}
        if self.distance_keys:
            arrays |= {"distance_rows": np.asarray(self.distance_rows, dtype=np.float64),
                       "distance_scores": np.asarray(self.distance_scores, dtype=np.float64),
                       "distance_kappas": np.asarray(self.distance_kappas, dtype=np.float64),
                       "distance_grid": np.asarray(self.distance_grid), "distance_keys": np.asarray(self.distance_keys)}
        return arrays

    @classmethod
    def from_config(cls, config, *, num_layers: int, directory=None) -> "GainTableKernel":
        section = config["kernel_config"]
        check_keys("kernel_config", section, {"kernel_type", "file"}, required={"file"})
        name = section["file"]
        tables = tuple(f"distance_{key}" for key in _DISTANCE_PARTS)
        arrays = read_kernel_arrays(name, directory, ("rows", "weights", "grid", "row_gains", "distance_bias"),
                                    optional=tables, names=("distance_keys",))
        distances = None
        if any(key in arrays for key in tables):
            missing = [key for key in tables if key not in arrays]
            if missing:
                raise ConfigError(f"kernel_config.file ({name}): has distance tables without {missing[0]!r}; "
                                  f"allowed: all of {', '.join(tables)} or none")
            distances = {key: arrays[f"distance_{key}"] for key in _DISTANCE_PARTS}
        kernel = cls.create(arrays["rows"], arrays["weights"], arrays["grid"], row_gains=arrays["row_gains"],
                            distance_bias=arrays["distance_bias"], distances=distances,
                            field=f"kernel_config.file ({name})")
        if kernel.num_layers != num_layers:
            raise ConfigError(f"kernel_config.file: holds {kernel.num_layers} layers; allowed: num_layers ({num_layers})")
        return kernel


register_kernel(GainTableKernel)
