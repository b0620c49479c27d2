"""The kernel interface: what the rollout engine needs of an attention kernel.

The rollout of arXiv 2602.16837, ``R_t = (1 - lambda_t) I + lambda_t A_t``,
needs only row-stochastic kernels ``A_t`` (``A[i, j]`` = weight with which
token i reads token j). A kernel type is an `eqx.Module` PyTree holding T
layers stacked on axis 0 of every array leaf (a 0-d leaf, such as a softmax
temperature, is shared by every layer). It declares

- ``row_times_kernel(v, path)``: ``v^T A_t`` for one layer (what
  `jaxroll.influence` needs; `path` is the planner's choice, see
  `jaxroll.engine.plan`),
- ``dense(n)``: the ``(n, n)`` matrix ``A_t`` of one layer,
- ``check_length(n)``: a one-line `ConfigError` unless defined at length n,
- ``influence_bytes(n, method, itemsize)``: the working memory of one
  influence pass at length n (`jaxroll.memory` asks the kernel),

and may override the planner's hooks (`plan`, `scan_parts`,
`shared_rollout_row`, `settled_rung`) where its structure allows a faster
path. `influence`, `grad` and sweeps over the lambdas need nothing else.

What else a kernel can do is declared on its type, with defaults that refuse
in one line (a `ConfigError` naming the caller's field, the kernel type and
the types that can); callers ask the kernel, never test its type:

- logit operations, each pure and differentiable in its parameter, each a new
  kernel: `temper` (``s / tau``), `scale_slopes` (``m' = s m``),
  `add_distance_score` (``s + kappa g(i - j)``), `read_at_distances`
  (``f'(k) = f(k / r)``), `prepend_sinks` (k tokens in front); and the arrays
  other changes form kernels from: `head_logits` (one layer's per-head
  logits, for SSMax's length-scaled rows) and `scores_by_offset` (the
  offset scores ``f_h(k)`` of a causal Toeplitz kernel);
- its YAML form: `config_kind` (the name it is registered under, the
  ``kernel_config.kernel_type`` of a configuration file), `config_keys` (the
  top-level sections it reads), `to_config`, `from_config` and `file_arrays`
  (what goes into the npz beside the file);
- the layer step, `step` (default ``(1 - lambda) v + lambda v^T A``; a kernel extended by the
  probability path mixes with its own lambda, `mixes_rows`), `reweighted_heads` (head weights
  scaled, what that path reads) and `scaled_rows` (a kernel that forms SSMax's rows itself);
- `analytic_kernel` (the kernel whose analytic fields a model reads: itself, or the one a measured
  kernel moves);
- `sweep_fields` (the fields a sweep axis may vary, set through `replaced`)
  and `fittable_fields` (the fields `jaxroll.fit` may free, each with its
  parametrisation).

`register_kernel(cls)` puts a type in `KERNEL_TYPES`, the registry the
schema and the command line read: a new kernel type is one module (the
class and, at its bottom, that one call) and nothing else (docs/development.md).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._checks import as_float_array, is_concrete, per_layer_and_head
from ..errors import ConfigError
from .plan import Path
from .step import layer_step

__all__ = ["AbstractKernel", "KERNEL_TYPES", "MASKS", "allowed", "register_kernel", "kernel_classes",
           "layer_head_values"]

MASKS = ("causal", "sliding", "full")
"""Attention masks: ``causal`` (j <= i), ``sliding`` (i - W < j <= i), ``full`` (every j)."""


def allowed(n: int, mask: str, window: int | None = None) -> Bool[Array, "n n"]:
    """Which entries a row may read: ``allowed[i, j]``.

    ``causal``: j <= i. ``sliding``: i - W < j <= i (W = `window`). ``full``:
    every j.
    """
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    if mask == "full":
        return jnp.ones((n, n), dtype=bool)
    if mask == "causal":
        return j <= i
    if mask == "sliding":
        return (j <= i) & (j > i - window)
    raise ValueError(f"mask: got {mask!r}; allowed: one of {', '.join(MASKS)}")


KERNEL_TYPES: dict[str, type] = {}
"""The kernel types the YAML schema and the command line know, by `config_kind` (`register_kernel`)."""


def register_kernel(cls: type) -> type:
    """Put the kernel type `cls` in `KERNEL_TYPES` under its `config_kind`; returns `cls` (a decorator too).

    Registering the same class again is a no-op; another class under a taken name is refused.
    """
    name = getattr(cls, "config_kind", None)
    if not (isinstance(cls, type) and issubclass(cls, AbstractKernel)):
        raise ConfigError.of("kernel type", cls, "a subclass of jaxroll.engine.kernel.AbstractKernel")
    if not isinstance(name, str) or not name:
        raise ConfigError.of(f"{cls.__name__}.config_kind", name, "a non-empty name (the YAML kernel_type)")
    if KERNEL_TYPES.get(name, cls) is not cls:
        raise ConfigError.of(f"{cls.__name__}.config_kind", name,
                             f"a name not taken (taken: {', '.join(KERNEL_TYPES)})")
    KERNEL_TYPES[name] = cls
    return cls


def kernel_classes() -> tuple[type, ...]:
    """The registered kernel types and their concrete subclasses (a registered family base such as
    `RelativeKernel` stands for its members), in registration order."""
    found = []
    for cls in KERNEL_TYPES.values():
        stack = [cls]
        while stack:
            current = stack.pop(0)
            if not getattr(current, "__abstractmethods__", None) and current not in found and not current.extension:
                found.append(current)
            stack.extend(current.__subclasses__())
    return tuple(found)


def _broadcast(field: str, value, shape: tuple[int, ...]):
    array = as_float_array(field, value)
    try:
        return np.array(np.broadcast_to(array, shape))
    except ValueError:
        raise ConfigError.of(field, value, f"an array that broadcasts to the field's shape {shape}") from None


def layer_head_values(field: str, value, num_layers: int, num_heads: int):
    """`value` broadcast to ``(T, H)``: a number, ``(H,)``, ``(T, 1)`` or ``(T, H)``.

    A ``(T,)`` value is one per layer (read as ``(T, 1)``), unless T == H, where
    ``(T,)`` would be ambiguous and ``(T, 1)`` or ``(1, H)`` must be given.
    """
    shape = jnp.shape(value)
    if len(shape) == 1 and shape[0] == num_layers and num_layers != num_heads:
        value = jnp.reshape(value, (num_layers, 1)) if not is_concrete(value) else as_float_array(field, value)[:, None]
    return per_layer_and_head(field, value, num_layers, num_heads)


def refuses(method):
    """Marks a default that refuses, so `AbstractKernel.refusal` lists only the types that override it."""
    method.refuses = True
    return method


def _per_layer(leaf) -> bool:
    return eqx.is_array(leaf) and leaf.ndim > 0


class AbstractKernel(eqx.Module):
    """A stack of T layer kernels ``A_t`` behind the engine's interface (abstract).

    Subclasses are `eqx.Module` PyTrees whose array leaves carry the layer on
    axis 0 (0-d leaves are shared by every layer); `jax.lax.scan` over
    `scan_parts` hands each step one layer of the same type.
    """

    @property
    @abc.abstractmethod
    def num_layers(self) -> int:
        """T, the number of stacked layers."""

    @property
    @abc.abstractmethod
    def num_heads(self) -> int:
        """H, the heads mixed in each layer (1 for a measured head average)."""

    extension: ClassVar[bool] = False
    """A kernel type built around a registered one (`jaxroll.engine.probability`), not a family of its
    own: `kernel_classes` leaves it out (refusals and sweep listings name the families)."""
    mixes_rows: ClassVar[bool] = False
    """Whether `step` mixes a layer with weights other than its lambda (the probability path: one per
    layer or per row): a sweep over the lambdas may then not expand it in powers of ``A``."""

    @property
    def mask(self) -> str:
        """``"causal"``, ``"sliding"`` or ``"full"``: which j a row i may read."""
        return "causal"

    @property
    def window(self) -> int | None:
        """The sliding window W, or None."""
        return None

    def default_length(self) -> int:
        """The sequence length a model over this kernel defaults to."""
        return 256

    @abc.abstractmethod
    def row_times_kernel(self, v: Float[Array, " n"], path: Path = Path()) -> Float[Array, " n"]:
        """One layer's ``v^T A``, shape ``(n,)``: ``(v^T A)_j = sum_i v_i A[i, j]``."""

    @abc.abstractmethod
    def dense(self, n: int) -> Float[Array, "n n"]:
        """One layer's dense kernel ``A``, shape ``(n, n)``, rows summing to 1."""

    @abc.abstractmethod
    def check_length(self, n: int) -> None:
        """Raise a one-line `ConfigError` unless the kernel is defined at length n."""

    @abc.abstractmethod
    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        """Peak working memory of one influence pass at length n, in bytes (an estimate)."""

    def row_bytes(self, n: int, itemsize: int) -> int:
        """Working memory of one vmapped row product at length n (what a sweep point holds per start row)."""
        return self.influence_bytes(n, "structured", itemsize)

    def check(self) -> None:
        """Raise a one-line `ConfigError` when concrete arrays leave their allowed ranges (default: none)."""

    # The planner's hooks: defaults that take the plain per-layer products.

    def plan(self, n: int, method: str, dtype) -> Path:
        """The path `jaxroll.engine.plan.plan` takes for this kernel (method already resolved)."""
        del n, dtype
        return Path(method=method, checkpoint=True)

    def scan_parts(self, path: Path = Path()) -> tuple["AbstractKernel", "AbstractKernel"]:
        """``(stacked, shared)``: the leaves a scan over layers slices, and those every layer reads whole.

        ``eqx.combine(stacked[t], shared)`` is layer t. Default: 0-d leaves are shared.
        """
        del path
        return eqx.partition(self, _per_layer)

    def layer(self, t) -> "AbstractKernel":
        """Layer t (0-based) as a kernel of the same type (axis 0 of the per-layer arrays removed)."""
        stacked, shared = self.scan_parts()
        return eqx.combine(jax.tree.map(lambda x: x[t], stacked), shared)

    def shared_rollout_row(self, row, lambdas) -> Float[Array, " n"]:
        """``row^T R_T ... R_1`` when `plan` chose ``shared_kernel`` (one kernel for every layer)."""
        raise NotImplementedError(f"{type(self).__name__} plans no shared-kernel path")

    def settled_rung(self, dtype):
        """Which of `plan`'s ``rungs`` a traced kernel takes (when ``settled`` is None)."""
        raise NotImplementedError(f"{type(self).__name__} plans no run-time rungs")

    def step(self, row, weight, product: Callable, left: bool = False):
        """One layer of the rollout, ``R = (1 - lambda) I + lambda A``, on `row` (this layer's kernel).

        ``left=False``: ``row^T R`` for row vectors ``(..., n)``, `product(row, self)` = ``row^T A``;
        ``left=True``: ``R @ row`` for a matrix ``(n, m)``, `product(row, self)` = ``A @ row``. Default:
        `jaxroll.engine.step.layer_step` (one lambda for every row); a kernel with `mixes_rows`
        overrides it (`jaxroll.engine.probability`), calling `product` with the kernel it mixes in.
        """
        del left
        return layer_step(row, weight, product(row, self))

    # What the kernel can do beyond the rollout, declared here with defaults that refuse.

    config_kind: ClassVar[str | None] = None
    """The name the kernel type is registered under (`register_kernel`): ``kernel_config.kernel_type``."""
    config_keys: ClassVar[frozenset[str]] = frozenset({"kernel_config"})
    """The top-level sections of a configuration that `from_config` reads and `to_config` writes."""
    sweep_fields: ClassVar[tuple[str, ...]] = ()
    """The fields a sweep axis may vary (each value checked by `replaced`); ``slope_scale`` where
    `slope_field` is set. The lambda axes sweep on every kernel."""
    slope_field: ClassVar[str | None] = None
    """The field a ``slope_scale`` axis multiplies (`scale_slopes`), or None."""
    stores_dense: ClassVar[bool] = False
    """Whether the kernel holds its layers as dense ``kernels (T, N, N)`` (measured attention): what
    `jaxroll.as_dense_model` returns as it is and `jaxroll.fit_kernel` fits offset kernels to."""
    fittable_fields: ClassVar[Mapping[str, str]] = {}
    """The fields `jaxroll.fit` may free, each with its map from unconstrained coordinates:
    ``"real"`` (as it is), ``"positive"`` (softplus), ``"unit"`` (sigmoid, in (0, 1)) or
    ``"simplex"`` (softmax over the last axis)."""

    def refusal(self, field: str, reason: str, operation: str, allowed: str = "{types}") -> ConfigError:
        """``"{field}: a {type} {reason}; allowed: {allowed}"``, `allowed`'s ``{types}`` the registered
        kernel types that implement `operation` (one line, for a refused capability)."""
        names = [cls.__name__ for cls in kernel_classes() if not getattr(getattr(cls, operation), "refuses", False)]
        types = " or ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else "none registered"
        allowed = allowed.format(types=types)
        return ConfigError(f"{field}: a {type(self).__name__} {reason}; allowed: {allowed}", field=field,
                           value=type(self).__name__, allowed=allowed)

    @refuses
    def temper(self, tau, field: str = "tau") -> "AbstractKernel":
        """The kernel with every logit divided by ``tau > 0``: ``s'(i, j) = s(i, j) / tau``.

        `tau` is a number or an array of a shape the kernel allows (per layer, head); refused by default.
        """
        del tau
        raise self.refusal(field, "has no logits to temper", "temper")

    @refuses
    def scale_slopes(self, scale, field: str = "slope_scale") -> "AbstractKernel":
        """The kernel with its ALiBi-like slopes multiplied by ``s >= 0``: ``m' = s m``; refused by default."""
        del scale
        raise self.refusal(field, "has no ALiBi slopes", "scale_slopes")

    @refuses
    def add_distance_score(self, kappa, score: Callable, n: int, field: str = "kappa") -> "AbstractKernel":
        """The kernel with ``kappa g(i - j)`` added to the logit of every causal pair, ``g = score``.

        `score` maps integer distances ``m >= 0`` (an array) to ``g(m)``; `n` is the length the result
        must serve. Refused by default.
        """
        del kappa, score, n
        raise self.refusal(field, "has no logits to bias", "add_distance_score")

    @refuses
    def read_at_distances(self, ratio, n: int, field: str = "rotary_ratio") -> "AbstractKernel":
        """The kernel read at rescaled distances, ``f'(k) = f(k / r)`` for ``k >= 1`` (``f'(0) = f(0)``);
        `n` the length it must serve. Refused by default (a kernel that is not a function of distance)."""
        del ratio, n
        raise self.refusal(field, "is not a function of distance", "read_at_distances",
                           "a rotary model's measured offset kernel ({types}), e.g. from jaxroll fit-kernel")

    @refuses
    def head_logits(self, n: int, field: str = "logits") -> tuple[Float[Array, "heads n n"], Float[Array, " heads"]]:
        """One layer's per-head logits ``s_h(i, j)`` at length n (before the mask) and its normalised
        head weights ``w_h / sum w``: what a change that forms the kernel itself (SSMax) needs. Called
        on a layer (`layer`, or a step of `scan_parts`). Refused by default."""
        del n
        raise self.refusal(field, "has no logits to scale", "head_logits")

    def reweighted_heads(self, factors) -> tuple["AbstractKernel", Float[Array, ""]]:
        """``(kernel, total)``: one layer with head h's weight multiplied by ``factors[h] > 0`` (``(H,)``), and
        ``total = sum_h (w_h / sum w) factors[h]`` (what the probability path reads, `jaxroll.engine.probability`).
        Called on a layer. Default: a one-head kernel is itself (``total = factors[0]``); refused otherwise."""
        if self.num_heads == 1:
            return self, jnp.reshape(factors, (-1,))[0]
        raise self.refusal("logit_gains", "has no head weights to scale", "reweighted_heads")

    def scaled_rows(self, scale, row_factor, n: int, field: str = "ssmax_scale") -> "AbstractKernel | None":
        """The kernel with layer t, head h, row i's logits multiplied by ``scale[t, h] row_factor[i]``,
        formed at length n by the kernel itself; None (the default): the caller forms the softmax rows
        (`jaxroll.interventions.LengthScaledLogits`). A kernel whose layer is more than its softmax
        rows (the probability path) forms it here."""
        del scale, row_factor, n, field
        return None

    def scores_by_offset(self, n: int) -> tuple[Float[Array, "layers heads n"], Float[Array, "layers heads"]] | None:
        """``(f, w)``: the scores ``f[t, h, k]`` of offsets k = 0..n-1 of a causal Toeplitz kernel
        (``A_h[i, j] ~ e^{f_h(i - j)}``, ``f[..., 0]`` the diagonal) and the normalised head weights;
        None for a kernel that is not one (the default)."""
        del n
        return None

    def analytic_kernel(self) -> "AbstractKernel":
        """The kernel whose analytic fields (ALiBi slopes, content scores) a model exposes and the commands over
        the paper's sections read: this one, or the analytic kernel a measured one moves (`AnchoredTableKernel`)."""
        return self

    def prepend_sinks(self, num_sinks: int, n: int) -> "AbstractKernel":
        """The kernel of n tokens with `num_sinks` tokens in front, run at length ``n + k``.

        A kernel of positions reads the sinks as tokens like any other, so by default it is unchanged,
        checked at length ``n + k`` (`check_length`'s one-line error otherwise).
        """
        self.check_length(n + num_sinks)
        return self

    def padded(self, num_layers: int, num_heads: int) -> "AbstractKernel | None":
        """The kernel with layers appended up to `num_layers` (copies of the last layer) and heads up to
        `num_heads` (weight 0), so nearby shapes share one compiled program (`jaxroll.bucket`); None
        (the default) for a kernel without such a rule."""
        del num_layers, num_heads
        return None

    # Its YAML form (`jaxroll.schema`) and its fields for sweeps.

    @refuses
    def to_config(self, kernel_file: str | None = None) -> dict[str, Any]:
        """The kernel's sections of a rollout YAML configuration (`config_keys`), plain Python values;
        its large arrays (`file_arrays`) are named by `kernel_file`. Refused by default."""
        del kernel_file
        raise self.refusal("kernel", "has no YAML form", "to_config")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, num_layers: int, directory=None) -> "AbstractKernel":
        """The kernel that `config`'s sections (`config_keys`) describe, checked; `directory` resolves
        a ``file``. Errors name the path in the file (``kernel_config.slopes``)."""
        del config, num_layers, directory
        raise ConfigError.of("kernel_config.kernel_type", cls.config_kind, "a kernel type with a YAML form")

    def file_arrays(self) -> dict[str, Any]:
        """The arrays `to_config`'s ``file`` names, written to the npz beside the configuration (default none)."""
        return {}

    def replaced(self, **values) -> "AbstractKernel":
        """The kernel with `values` in place of fields, broadcast and checked as a new kernel (a sweep
        point). Default: ``type(self).create(num_layers=T, num_heads=H, **fields)`` where the type has a
        ``create``, else each value broadcast to its field's shape and the kernel `check`ed."""
        create = getattr(type(self), "create", None)
        if create is None:
            kernel = dataclasses.replace(self, **{name: _broadcast(name, value, np.shape(getattr(self, name)))
                                                  for name, value in values.items()})
            kernel.check()
            return kernel
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return create(num_layers=self.num_layers, num_heads=self.num_heads, **{**fields, **values})
