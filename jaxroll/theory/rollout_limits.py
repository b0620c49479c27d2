"""The theory as code: closed forms, depth limits and the four forces.

Layer t's transition is ``R_t = (1 - lambda_t) I + lambda_t A_t`` with
``A[i, j]`` the weight with which token i reads token j, and the rollout is
``P_T = R_T ... R_1`` (arXiv 2602.16837). Under causal (or sliding-window)
masking every ``A_t`` is lower triangular, so ``P_T`` is too and its diagonal
is a product of scalars,

    P_T[i, i] = prod_t (1 - lambda_t + lambda_t A_t[i, i]).

For a token i > 0 with ``A_t[i, i] <= 1 - delta`` this stays bounded away from
0 iff the total mixing ``sum_t lambda_t`` is finite: a power-decay schedule
``lambda_t = lambda_0 / (t + 1)^beta`` with ``beta > 1`` keeps every token,
``beta <= 1`` (or a constant lambda) collapses all influence onto token 0.

At finite depth four forces shape the profile (for stochastically monotone
kernels, `is_stochastically_monotone`): causal masking pulls mass to early
positions, the residual path keeps it late, ALiBi (Press et al. 2022) adds
recency, a positive diagonal content score adds recency and a negative one
primacy. `forces` measures each as a rung of an ablation ladder.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .. import metrics
from .._checks import check_positive_int
from ..errors import ConfigError
from ..engine.alibi import layer_kernel
from ..engine.step import layer_step
from ..model import RolloutModel, is_model
from ..rollout import influence

__all__ = [
    "total_mixing", "diagonal", "diagonal_lower_bound", "collapse_mass",
    "DepthProfile", "depth_profile", "Monotonicity", "is_stochastically_monotone",
    "FORCES", "Forces", "ladder", "forces",
]

FORCES = ("causal", "residual", "alibi", "content")
"""The rungs of `ladder` and `forces`, in order."""


def _length(model: RolloutModel, n: int | None) -> int:
    return model.sequence_length if n is None else check_positive_int("n", n)


def _triangular(model: RolloutModel, what: str) -> None:
    if model.mask == "full":
        raise ConfigError(f"mask: got 'full'; allowed for {what}: 'causal' or 'sliding' "
                          "(the closed form needs a lower-triangular P_T)")


def total_mixing(model: RolloutModel) -> Float[Array, ""]:
    """``sum_t lambda_t``: finite in the limit of depth iff no collapse onto token 0."""
    return jnp.sum(model.lambdas)


def _kernel_diagonal(slopes, diagonal_scores, head_weights, temperature, n, mask, window):
    """``A[i, i] = sum_h w_h A_h[i, i]`` in closed form, O(H n), shape ``(n,)``.

    Row i of head h scores ``d / tau`` on the diagonal and ``-m k / tau`` at
    distance k = 1..c_i (``c_i = i`` causal, ``min(i, W - 1)`` sliding), so
    ``A_h[i, i] = 1 / (1 + S_i e^{-d / tau})`` with the geometric sum
    ``S_i = sum_{k=1}^{c_i} e^{-a k} = e^{-a} expm1(-a c_i) / expm1(-a)``,
    ``a = m / tau`` (``S_i = c_i`` when a = 0). Computed as a sigmoid of
    ``d / tau - log S_i``: no score is exponentiated, so content of +-1000
    neither overflows nor underflows.
    """
    positions = jnp.arange(n, dtype=jnp.result_type(float))
    count = positions if mask == "causal" else jnp.minimum(positions, window - 1)
    a = (slopes / temperature)[:, None]
    safe_a = jnp.where(a > 0, a, 1.0)
    safe_count = jnp.where(count > 0, count, 1.0)
    log_ratio = jnp.where(a > 0, jnp.log(jnp.expm1(-safe_a * safe_count) / jnp.expm1(-safe_a)),
                          jnp.log(safe_count))
    log_sum = jnp.where(a > 0, -a, 0.0) + log_ratio
    per_head = jnp.where(count > 0, jax.nn.sigmoid((diagonal_scores / temperature)[:, None] - log_sum), 1.0)
    weights = head_weights / jnp.sum(head_weights)
    return weights @ per_head


@functools.partial(jax.jit, static_argnames=("n",))
def _diagonal(model: RolloutModel, n: int):
    def apply_layer(log_diagonal, layer):
        weight, slopes, content, weights = layer
        a_ii = _kernel_diagonal(slopes, content, weights, model.temperature, n, model.mask, model.window)
        return log_diagonal + jnp.log1p(-weight * (1.0 - a_ii)), None

    start = jnp.zeros(n, dtype=jnp.result_type(float))
    layers = (model.lambdas, model.alibi_slopes, model.diagonal_scores, model.head_weights)
    log_diagonal, _ = jax.lax.scan(apply_layer, start, layers)
    return jnp.exp(log_diagonal)


def diagonal(model: RolloutModel, n: int | None = None) -> Float[Array, " n"]:
    """The diagonal of the rollout in closed form, shape ``(n,)``:

        P_T[i, i] = prod_t (1 - lambda_t + lambda_t A_t[i, i]),

    with ``A_t[i, i]`` the head-weighted ALiBi + content softmax of the
    diagonal entry. Exact because ``P_T`` is lower triangular under causal or
    sliding masks. O(T H n), one `lax.scan` over layers, accumulated in logs.
    ``P_T[0, 0] = 1`` always.

    Raises:
        ConfigError: for ``mask = "full"`` (P_T is not triangular).
    """
    _triangular(model, "diagonal")
    return _diagonal(model, _length(model, n))


@functools.partial(jax.jit, static_argnames=("n",))
def _diagonal_lower_bound(model: RolloutModel, n: int):
    def apply_layer(log_bound, layer):
        weight, slopes, content, weights = layer
        a_ii = _kernel_diagonal(slopes, content, weights, model.temperature, n, model.mask, model.window)
        delta = 1.0 - jnp.min(a_ii)
        return log_bound + jnp.log1p(-weight * delta), None

    layers = (model.lambdas, model.alibi_slopes, model.diagonal_scores, model.head_weights)
    log_bound, _ = jax.lax.scan(apply_layer, jnp.zeros((), jnp.result_type(float)), layers)
    return jnp.exp(log_bound)


def diagonal_lower_bound(model: RolloutModel, n: int | None = None) -> Float[Array, ""]:
    """The finite-mixing theorem's bound ``prod_t (1 - lambda_t delta_t)``, a scalar.

    ``delta_t = max_i (1 - A_t[i, i])``, so ``P_T[i, i] >= prod_t (1 - lambda_t
    delta_t) >= exp(-sum_t lambda_t delta_t / (1 - lambda_t delta_t))`` for
    every i: positive in the limit of depth whenever ``sum_t lambda_t`` is
    finite (and ``lambda_t delta_t < 1``). Equal to ``min_i P_T[i, i]`` when
    every layer's least diagonal sits at the same row (layer-independent
    kernels). O(T H n).
    """
    _triangular(model, "diagonal_lower_bound")
    return _diagonal_lower_bound(model, _length(model, n))


@functools.partial(jax.jit, static_argnames=("n",))
def _first_column(model: RolloutModel, n: int):
    def apply_layer(column, layer):
        weight, slopes, content, base, weights = layer
        kernel = layer_kernel(slopes, content, base, weights, model.temperature, n,
                              model.mask, model.window)
        return layer_step(column, weight, kernel @ column), None

    first = jnp.zeros(n, dtype=jnp.result_type(float)).at[0].set(1.0)
    layers = (model.lambdas, model.alibi_slopes, model.diagonal_scores, model.base_scores,
              model.head_weights)
    column, _ = jax.lax.scan(apply_layer, first, layers)
    return column


def collapse_mass(model: RolloutModel, n: int | None = None) -> Float[Array, ""]:
    """``min_i P_T[i, 0]``: the least influence of token 0 on any token, in [0, 1].

    Tends to 1 exactly when every token's influence collapses onto token 0
    (row 0 of ``P_T`` is always ``e_0``, so a maximum over rows says nothing).
    Computed as the column ``P_T e_0 = R_T (... (R_1 e_0))``: T dense
    kernel-times-vector products in one `lax.scan`, O(T H n^2). Note
    ``collapse_mass <= 1 - P_T[i, i]`` for every i > 0.
    """
    return jnp.min(_first_column(model, _length(model, n)))


class DepthProfile(NamedTuple):
    """Diagnostics of one kernel under a lambda schedule at several depths (`depth_profile`).

    Arrays have a leading axis of ``D`` depths.
    """

    depths: Int[Array, " D"]                     # T, increasing
    total_mixing: Float[Array, " D"]             # sum_{t <= T} lambda_t
    profiles: Float[Array, "D n"]                # p_T = P_T[n-1, :]
    diagonal: Float[Array, "D n"]                # P_T[i, i]
    diagonal_min: Float[Array, " D"]             # min_i P_T[i, i]
    diagonal_lower_bound: Float[Array, " D"]     # prod_{t <= T} (1 - lambda_t delta)
    collapse_mass: Float[Array, " D"]            # min_i P_T[i, 0]
    delta: Float[Array, ""]                      # max_i (1 - A[i, i])


@functools.partial(jax.jit, static_argnames=("slots",))
def _depth_scan(kernel, schedule, slot_of_layer, slots: int):
    n = kernel.shape[0]
    dtype = kernel.dtype
    kernel_diagonal = jnp.diagonal(kernel)
    delta = jnp.max(1.0 - kernel_diagonal)

    def step(carry, layer):
        row, column, log_diagonal, log_bound, mixing, records = carry
        weight, slot = layer
        # The kernels are all the same A, so the R_t commute and
        # P_T = P_{T-1} R_T as well as R_T P_{T-1}: the last row and the first
        # column both advance forward, one layer at a time.
        row = layer_step(row, weight, row @ kernel)
        column = layer_step(column, weight, kernel @ column)
        log_diagonal = log_diagonal + jnp.log1p(-weight * (1.0 - kernel_diagonal))
        log_bound = log_bound + jnp.log1p(-weight * delta)
        mixing = mixing + weight
        record = (row / jnp.sum(row), jnp.exp(log_diagonal), jnp.exp(log_bound)[None],
                  jnp.min(column)[None], mixing[None])
        # Layers that are not a requested depth write into a spare slot, so
        # every step is one in-place update of size O(n), not a select over all.
        records = tuple(jax.lax.dynamic_update_index_in_dim(buffer, value, slot, 0)
                        for buffer, value in zip(records, record))
        return (row, column, log_diagonal, log_bound, mixing, records), None

    last = jnp.zeros(n, dtype).at[n - 1].set(1.0)
    first = jnp.zeros(n, dtype).at[0].set(1.0)
    records = (jnp.zeros((slots + 1, n), dtype), jnp.zeros((slots + 1, n), dtype),
               jnp.zeros((slots + 1, 1), dtype), jnp.zeros((slots + 1, 1), dtype),
               jnp.zeros((slots + 1, 1), dtype))
    start = (last, first, jnp.zeros(n, dtype), jnp.zeros((), dtype), jnp.zeros((), dtype), records)
    (*_, records), _ = jax.lax.scan(step, start, (schedule.astype(dtype), slot_of_layer))
    profiles, diagonals, bound, collapse, mixing = (buffer[:slots] for buffer in records)
    return profiles, diagonals, bound[:, 0], collapse[:, 0], mixing[:, 0], delta


def depth_profile(kernel, schedule, depths, n: int | None = None) -> DepthProfile:
    """Profile, diagonal and first-column diagnostics of one kernel at many depths.

    Every layer uses the same kernel A and its own ``lambda_t`` from
    `schedule`: ``P_T = prod_{t <= T} ((1 - lambda_t) I + lambda_t A)``. These
    transitions are polynomials in A, so they commute, and one `lax.scan` over
    ``max(depths)`` layers carries the last row ``p_T``, the first column
    ``P_T e_0`` and ``log P_T[i, i] = sum_t log(1 - lambda_t (1 - A[i, i]))``,
    recording them at each requested depth: O(max(depths) n^2) time, O(D n)
    memory, so 10^5 layers are cheap at n of a few hundred.

    This shows the depth dichotomy: with ``lambda_t = lambda_0 / (t + 1)^beta``
    and ``delta = max_i (1 - A[i, i])``, ``min_i P_T[i, i] =
    prod_t (1 - lambda_t delta)`` levels off for ``beta > 1`` and falls like
    ``exp(-delta sum_t lambda_t)`` to 0 for ``beta <= 1``, while
    ``collapse_mass = min_i P_T[i, 0]`` rises to 1.

    Args:
        kernel: a `RolloutModel` with one layer (its kernel is used, its
            lambda is not), or a dense lower-triangular row-stochastic
            ``(n, n)`` array.
        schedule: ``(T_max,)`` mixing coefficients in [0, 1], e.g.
            `jaxroll.schedules.power_decay`.
        depths: increasing depths in 1..T_max.
        n: sequence length for a model kernel (default its sequence_length).

    Returns:
        A `DepthProfile`; profiles are normalised to sum 1.

    Raises:
        ConfigError: a model with more than one layer or a full mask, a
            kernel that is not square, lower triangular and row-stochastic, a
            schedule outside [0, 1], depths not increasing within 1..T_max.
    """
    if is_model(kernel):
        if kernel.num_layers != 1:
            raise ConfigError(f"kernel: a model with {kernel.num_layers} layers; allowed: exactly 1 "
                              "(the layer-independent kernel)")
        _triangular(kernel, "depth_profile")
        n = _length(kernel, n)
        kernel = layer_kernel(kernel.alibi_slopes[0], kernel.diagonal_scores[0], kernel.base_scores[0],
                              kernel.head_weights[0], kernel.temperature, n, kernel.mask, kernel.window)
    else:
        array = np.asarray(kernel, dtype=np.float64)
        if array.ndim != 2 or array.shape[0] != array.shape[1]:
            raise ConfigError(f"kernel: got shape {array.shape}; allowed: (n, n)")
        if not np.all(np.isfinite(array)) or (array < 0).any():
            raise ConfigError("kernel: has negative or non-finite entries; allowed: finite and >= 0")
        if np.abs(np.triu(array, 1)).max(initial=0.0) > 0:
            raise ConfigError("kernel: has entries above the diagonal; allowed: lower triangular (causal)")
        worst = float(np.abs(array.sum(axis=1) - 1).max())
        if worst > 1e-6:
            raise ConfigError(f"kernel: a row sums to 1 +- {worst:.3g}; allowed: row-stochastic (1e-6)")
        kernel = jnp.asarray(kernel, dtype=jnp.result_type(float))
    schedule_np = np.asarray(schedule, dtype=np.float64)
    if schedule_np.ndim != 1 or schedule_np.size == 0:
        raise ConfigError(f"schedule: got shape {schedule_np.shape}; allowed: (T_max,) with T_max >= 1")
    if not np.all(np.isfinite(schedule_np)) or (schedule_np < 0).any() or (schedule_np > 1).any():
        raise ConfigError("schedule: values outside [0, 1]; allowed: each lambda_t in [0, 1]")
    depths_np = np.asarray(depths)
    if (depths_np.ndim != 1 or depths_np.size == 0 or not np.issubdtype(depths_np.dtype, np.integer)
            or depths_np[0] < 1 or depths_np[-1] > schedule_np.size or np.any(np.diff(depths_np) <= 0)):
        raise ConfigError(f"depths: got {depths_np.tolist()!s:.60}; allowed: increasing integers in "
                          f"1..{schedule_np.size} (the schedule's length)")
    depths_np = depths_np.astype(np.int64)
    slots = depths_np.size
    slot_of_layer = np.full(schedule_np.size, slots, dtype=np.int32)
    slot_of_layer[depths_np - 1] = np.arange(slots)
    stop = int(depths_np[-1])
    profiles, diagonals, bound, collapse, mixing, delta = _depth_scan(
        kernel, jnp.asarray(schedule_np[:stop]), jnp.asarray(slot_of_layer[:stop]), slots)
    return DepthProfile(
        depths=jnp.asarray(depths_np), total_mixing=mixing, profiles=profiles, diagonal=diagonals,
        diagonal_min=jnp.min(diagonals, axis=-1), diagonal_lower_bound=bound,
        collapse_mass=collapse, delta=delta,
    )


class Monotonicity(NamedTuple):
    """Result of `is_stochastically_monotone`; the worst pair when it fails."""

    holds: bool
    row: int          # i: row i+1 fails to dominate row i ...
    next_row: int     # i + 1
    position: int     # ... at this j: F_{i+1}(j) > F_i(j)
    excess: float     # max_{i, j} F_{i+1}(j) - F_i(j) (<= tolerance when it holds)
    layer: int        # for a stack of kernels, which one (0 otherwise)


def is_stochastically_monotone(kernel, tolerance: float | None = None, n: int | None = None) -> Monotonicity:
    """Whether later rows read later positions: the finite-depth theorem's assumption.

    A row-stochastic A is stochastically monotone when row i+1 dominates row
    i for every i: with the row CDFs ``F_i(j) = sum_{k <= j} A[i, k]``,

        F_{i+1}(j) <= F_i(j)   for all i, j.

    (Adjacent rows suffice: dominance is transitive.) Every causal ALiBi +
    diagonal-content kernel has it, whatever the slope and content signs.

    Args:
        kernel: an ``(n, n)`` or stacked ``(L, n, n)`` array, or a
            `RolloutModel` (each layer's kernel at length `n` is checked).
        tolerance: allowed excess for rounding; default ``64 eps`` of the dtype.

    Returns:
        A `Monotonicity` with the worst violating pair (or the largest excess
        when it holds).
    """
    if is_model(kernel):
        model = kernel
        size = _length(model, n)
        kernel = jax.vmap(lambda *layer: layer_kernel(*layer, model.temperature, size, model.mask,
                                                      model.window))(
            model.alibi_slopes, model.diagonal_scores, model.base_scores, model.head_weights)
    kernel = jnp.asarray(kernel)
    if kernel.ndim not in (2, 3) or kernel.shape[-1] != kernel.shape[-2]:
        raise ConfigError(f"kernel: got shape {kernel.shape}; allowed: (n, n) or (L, n, n)")
    stack = kernel[None] if kernel.ndim == 2 else kernel
    if tolerance is None:
        tolerance = 64 * float(jnp.finfo(stack.dtype).eps)
    cdf = jnp.cumsum(stack, axis=-1)
    excess = np.asarray(cdf[:, 1:, :] - cdf[:, :-1, :])
    if excess.size == 0:
        return Monotonicity(True, 0, 1, 0, 0.0, 0)
    layer, row, position = np.unravel_index(int(np.argmax(excess)), excess.shape)
    worst = float(excess[layer, row, position])
    return Monotonicity(bool(worst <= tolerance), int(row), int(row) + 1, int(position), worst, int(layer))


class Forces(NamedTuple):
    """The four-forces ladder of a model (`forces`); leading axis = `FORCES`."""

    names: tuple                            # ("causal", "residual", "alibi", "content")
    profiles: Float[Array, "4 n"]           # the profile of each rung
    center_of_mass: Float[Array, " 4"]
    first_mass: Float[Array, " 4"]          # mass of the first tenth
    last_mass: Float[Array, " 4"]           # mass of the last tenth
    drift_center_of_mass: Float[Array, " 4"]  # what each force adds to center_of_mass
    drift_first: Float[Array, " 4"]
    drift_last: Float[Array, " 4"]


def ladder(model: RolloutModel) -> tuple[RolloutModel, ...]:
    """The four rungs of `forces`, each adding one force to the one before.

    1. causal masking alone: ``lambda = 1``, slopes 0, content 0;
    2. + residuals: the model's lambdas;
    3. + ALiBi: the model's slopes;
    4. + content: the model's diagonal (and background) content.
    """
    zeros = jnp.zeros_like(model.alibi_slopes)
    causal = dataclasses.replace(model, lambdas=jnp.ones_like(model.lambdas), alibi_slopes=zeros,
                                 diagonal_scores=zeros, base_scores=zeros)
    residual = dataclasses.replace(causal, lambdas=model.lambdas)
    alibi = dataclasses.replace(residual, alibi_slopes=model.alibi_slopes)
    return causal, residual, alibi, model


def forces(model: RolloutModel, n: int | None = None, *, fraction: float = 0.1,
           method: str = "auto") -> Forces:
    """Decompose a model's profile into the four forces by an ablation ladder.

    Rung k's profile ``p^(k)`` comes from `jaxroll.influence` of `ladder`'s
    k-th model; the drift of force k is the change it makes,

        drift_k(s) = s(p^(k)) - s(p^(k-1)),   s in {center_of_mass, first, last},

    with ``p^(0) = e_{n-1}`` (no mixing at all: center of mass 1, first tenth
    0, last tenth 1) before causal masking. For stochastically monotone
    kernels the theory signs them: causal < 0 (primacy), residual >= 0 and
    alibi >= 0 (recency), content with the sign of the diagonal scores
    (when they share one). First/last tenth use ``k = max(1, round(fraction n))``.
    """
    n = _length(model, n)
    profiles = jnp.stack([influence(rung, n, method) for rung in ladder(model)])
    com = metrics.center_of_mass(profiles)
    edges = metrics.edge_mass(profiles, fraction)
    identity = jnp.zeros(n, profiles.dtype).at[n - 1].set(1.0)
    base_edges = metrics.edge_mass(identity, fraction)

    def drift(values, start):
        return jnp.diff(values, prepend=jnp.asarray(start, values.dtype)[None])

    return Forces(
        names=FORCES, profiles=profiles, center_of_mass=com,
        first_mass=edges[:, 0], last_mass=edges[:, 1],
        drift_center_of_mass=drift(com, metrics.center_of_mass(identity)),
        drift_first=drift(edges[:, 0], base_edges[0]),
        drift_last=drift(edges[:, 1], base_edges[1]),
    )
