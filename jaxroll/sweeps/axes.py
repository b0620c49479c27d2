"""The axes of a sweep: which fields may vary, and each value checked as `RolloutModel.create` checks it.

Errors are one line naming the axis and the index of the value
(``lambdas[1]: ...``), with the allowed range."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import equinox as eqx
import numpy as np

from .. import schedules
from .._checks import as_float_scalar, check_positive_int, check_range, is_concrete
from ..errors import ConfigError
from ..interventions import intervention_type, sweep_axes
from ..kernel_types import kernel_classes
from ..model import RolloutModel

__all__: list[str] = []  # the public names are re-exported by jaxroll.sweep

_FIELD_AXES = ("lambdas", "lambda_0", "beta", "alibi_slopes", "slope_scale", "diagonal_scores",
               "head_weights", "temperature", "slopes", "exponents")


def __getattr__(name: str):
    """`AXES`: the field axes, then the registry's intervention axes, read when asked (a type registered
    later is in it).

    The fields a sweep axis may name. ``lambdas``: schedules (a number for a
    constant, T numbers, or a ``(lambda_0, beta)`` tuple / ``{"lambda_0", "beta"}``
    mapping for power decay); ``lambda_0`` and ``beta`` (together): a power-decay
    grid; ``slope_scale``: a factor on the ALiBi slopes; the others: any value
    `RolloutModel.create` takes for that field.

    Any kernel sweeps the lambda axes (a schedule over measured `DenseKernel`s,
    say); its own fields by `KERNEL_AXES`: for the ALiBi + content kernel the
    ones above, for a `PowerKernel`, ``slopes``,
    ``exponents``, ``slope_scale`` (on ``slopes``), ``diagonal_scores`` and
    ``head_weights``; for a `TableKernel`, ``diagonal_scores`` and
    ``head_weights`` (see `KERNEL_AXES`). A registered kernel type adds the
    fields it declares (`AbstractKernel.sweep_fields`).

    The intervention axes (`intervention_axes`) ``tau``, ``kappa`` and ``gamma`` are the parameters of
    `jaxroll.interventions` (`Temperature`, `DistanceBias` with ``g(m) = ln(1 + m)``,
    `BranchScale`) on any kernel that intervention takes; a value is anything the
    intervention takes (a number, one per layer, per head, per layer and head), and
    ``slope_scale`` is `SlopeScale`'s factor on the slopes.
    """
    if name == "AXES":
        return _FIELD_AXES + intervention_axes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _KernelAxes(Mapping):
    """``{type name: its sweep_fields}`` over the registered kernel types, read when asked (a type
    registered later is in it)."""

    def _table(self) -> dict[str, tuple[str, ...]]:
        return {kind.__name__: tuple(kind.sweep_fields) for kind in kernel_classes()}

    def __getitem__(self, name: str) -> tuple[str, ...]:
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


KERNEL_AXES: Mapping[str, tuple[str, ...]] = _KernelAxes()
"""The kernel fields a sweep may vary, by kernel type (besides the lambda axes): each type's
`sweep_fields` (`jaxroll.kernel_types`); a type that declares none sweeps the lambda axes only."""


def intervention_axes() -> tuple[str, ...]:
    """The axes that are intervention parameters: the registered types that declare `sweep_axis`
    (`jaxroll.interventions.sweep_axes`: ``tau``, ``kappa``, ``gamma`` and any registered later),
    applied to every point in the order `jaxroll.interventions.from_mapping` applies them
    (``slope_scale``, a factor on the slopes, is a kernel axis and commutes with ``tau``)."""
    return sweep_axes()


def mixing_axes() -> tuple[str, ...]:
    """The intervention axes that change the mixing lambda_t alone (``gamma``): applied on the host, in float64,
    so a model whose layers share one kernel keeps the Krylov path (`Plan.chunk_leaves`)."""
    return tuple(name for name in sweep_axes() if intervention_type(name).changes == "mixing")


_LAMBDA_AXES = {"lambdas", "lambda_0", "beta"}


_SCALAR_AXES = {  # axis -> (lower bound, open at the bound, upper bound or None)
    # lambda_0 <= 1 and beta >= 0 keep every lambda_t = lambda_0 / (t + 1)^beta in [0, 1]:
    # nothing is clipped, as `RolloutModel.create` clips nothing.
    "lambda_0": (0.0, True, 1.0), "beta": (0.0, False, None), "slope_scale": (0.0, False, None),
    "temperature": (0.0, True, None)}


def _axis_values(name: str, values) -> list:
    known = _FIELD_AXES + intervention_axes()  # AXES, read here (a module's __getattr__ serves importers only)
    known += tuple(sorted({field for fields in KERNEL_AXES.values() for field in fields} - set(known)))
    if name not in known:
        raise ConfigError(f"axis {name!r}: unknown field; allowed: one of {', '.join(known)}")
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise ConfigError(f"{name}: got {type(values).__name__}; allowed: a non-empty list of values")
    values = list(values)
    if not values:
        raise ConfigError(f"{name}: the axis is empty; allowed: a non-empty list of values")
    return values


def _reword(axis: str, index: int, error: ConfigError) -> ConfigError:
    """``field: rest`` of a constructor's message as ``axis[index]: rest``."""
    field, _, rest = str(error).partition(": ")
    text = rest if field in (axis, "lambdas", "lambdas_custom", "lambda_const") else str(error)
    return ConfigError(f"{axis}[{index}]: {text}")


def _scalar(axis: str, index: int, value) -> float:
    low, low_open, high = _SCALAR_AXES[axis]
    if isinstance(value, (bool, np.bool_, str, bytes)):  # float() would take True and "0.2"
        raise ConfigError(f"{axis}[{index}]: got {value!r:.60}; allowed: a number (not a boolean or a string)")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{axis}[{index}]: got {value!r:.60}; allowed: a number") from None
    if not np.isfinite(number) or number < low or (low_open and number == low) or (high is not None and number > high):
        bound = ("(" if low_open else "[") + f"{low:g}, " + ("inf)" if high is None else f"{high:g}]")
        raise ConfigError(f"{axis}[{index}]: value {number!r} is outside the allowed range {bound}")
    return number


def _schedule(model: RolloutModel, value) -> np.ndarray:
    """One value of a ``lambdas`` axis as ``(T,)`` lambdas, never clipped.

    A number is a constant schedule (checked in [0, 1] by the model's
    constructor); a ``(lambda_0, beta)`` pair or ``{"lambda_0", "beta"}``
    mapping is power decay ``lambda_t = lambda_0 / (t + 1)^beta`` with
    ``lambda_0`` in (0, 1] and ``beta >= 0``, so every ``lambda_t`` is in
    [0, 1]; T numbers are the schedule itself.
    """
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"lambda_0", "beta"})
        if unknown or len(value) != 2:
            raise ConfigError(f"got keys {sorted(value)}; allowed: a mapping with lambda_0 and beta")
        value = (value["lambda_0"], value["beta"])
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ConfigError(f"got a tuple of {len(value)}; allowed: (lambda_0, beta)")
        lambda_0, beta = as_float_scalar("lambda_0", value[0]), as_float_scalar("beta", value[1])
        check_range("lambda_0", lambda_0, 0.0, 1.0, low_open=True)
        check_range("beta", beta, 0.0)
        return np.asarray(schedules.power_decay(float(lambda_0), float(beta), model.num_layers), np.float64)
    if np.ndim(value) == 0:
        value = as_float_scalar("lambdas", value)
        check_range("lambdas", value, 0.0, 1.0)  # as `RolloutModel.create` checks each lambda_t
        return np.full(model.num_layers, float(value))
    return np.asarray(value)


def _kernel_fields(kernel) -> dict[str, np.ndarray]:
    """A kernel's array fields (the PyTree leaves), as float64 NumPy; a kernel inside it (an
    `AnchoredTableKernel`'s ``anchor``) by dotted names, ``anchor.alibi_slopes``."""
    fields = {}
    for field in dataclasses.fields(kernel):
        value = getattr(kernel, field.name)
        if isinstance(value, eqx.Module):
            fields |= {f"{field.name}.{name}": inner for name, inner in _kernel_fields(value).items()}
        elif value is not None and not field.metadata.get("static", False):
            fields[field.name] = np.asarray(value, np.float64)
    return fields


def with_fields(module, fields: dict):
    """`module` with `fields` (names as `_kernel_fields` gives them, dotted into inner kernels) put in."""
    outer = {name: value for name, value in fields.items() if "." not in name}
    for inner in {name.split(".", 1)[0] for name in fields if "." in name}:
        values = {name.split(".", 1)[1]: value for name, value in fields.items() if name.startswith(f"{inner}.")}
        outer[inner] = with_fields(getattr(module, inner), values)
    return dataclasses.replace(module, **outer)


def slope_field(kernel) -> str:
    """The kernel field a ``slope_scale`` axis multiplies (the kernel's `slope_field`; "" for none)."""
    return type(kernel).slope_field or ""


def _intervention_value(model: RolloutModel, name: str, value) -> np.ndarray:
    """One value of an intervention axis, checked by applying the intervention to `model`, in its full
    shape (`layer_head_value`): ``(T,)`` for gamma, ``(T, H)`` for tau and kappa (what the point's
    transform reads)."""
    from ..interventions import apply_all, from_mapping

    if not is_concrete(value) or isinstance(value, (bool, np.bool_, str, bytes, dict)):
        raise ConfigError(f"got {value!r:.60}; allowed: a number or nested lists of numbers")
    (change,) = from_mapping({name: value}, source="axis")
    apply_all(model, [change])  # refuses what the kernel cannot take (slopes of a table kernel, a full mask)
    return change.layer_head_value(model.num_layers, model.num_heads)


def _checked_axis(model: RolloutModel, name: str, values: list) -> np.ndarray:
    """The axis' values as stacked arrays, each checked as the model's (kernel's) `create` checks it."""
    kernel = model.kernel
    if name in intervention_axes():
        stacked = []
        for k, value in enumerate(values):
            try:
                stacked.append(_intervention_value(model, name, value))
            except ConfigError as error:
                raise _reword(name, k, error) from None
        return np.stack(stacked)
    allowed = tuple(type(kernel).sweep_fields)
    if name not in allowed and name not in _LAMBDA_AXES:
        raise ConfigError(f"axis {name!r}: not a field of a {type(kernel).__name__} model; allowed: "
                          + ", ".join(("lambdas", "lambda_0", "beta") + allowed))
    if name in _SCALAR_AXES:
        return np.array([_scalar(name, k, value) for k, value in enumerate(values)])
    stacked = []
    for k, value in enumerate(values):
        try:
            if not is_concrete(value):
                raise ConfigError(f"got {type(value).__name__}; allowed: concrete numbers")
            if name == "lambdas":
                checked = RolloutModel.create(kernel=kernel, lambdas=_schedule(model, value),
                                              sequence_length=model.sequence_length)
            else:
                checked = kernel.replaced(**{name: value})
        except ConfigError as error:
            raise _reword(name, k, error) from None
        stacked.append(np.asarray(getattr(checked, name), np.float64))
    return np.stack(stacked)


def _check_lengths(lengths) -> tuple[int, ...] | None:
    if lengths is None:
        return None
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__len__") or not len(lengths):
        raise ConfigError(f"lengths: got {lengths!r:.60}; allowed: a non-empty list of integers >= 1")
    return tuple(check_positive_int(f"lengths[{k}]", n) for k, n in enumerate(lengths))
