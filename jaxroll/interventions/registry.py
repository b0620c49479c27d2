"""The interventions by name: one registry, made from what each type declares (`AbstractIntervention`).

Every table of intervention names reads it: the text record (`parse`, `from_mapping`,
`describe`), a design's free parameters and boxes (`jaxroll.designs`), a sweep's intervention
axes (`jaxroll.sweep`), the torch patch (`jaxroll.measure.torch_plan`), the command line's help
and the docs' tables (checked by a test). A new type registers with one call::

    @register_intervention
    class LogitScale(AbstractIntervention):
        name, parameter, neutral, order = "logit_scale", "scale", 1.0, 25
        ...

The registry sits below the types: it imports none of them, and the package's modules
register the built-in types when they load.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from ._base import CHANGES, SHAPES, TORCH_CHANGES, AbstractIntervention

__all__ = ["register_intervention", "unregister_intervention", "intervention_types", "intervention_type",
           "text_names", "designable", "sweep_axes"]

_TYPES: dict[str, type] = {}


def _check_declarations(cls) -> None:
    """One line naming the first declaration of `cls` that the registry cannot take."""
    # The one type check on interventions the package keeps: what registers must be an intervention.
    if not (isinstance(cls, type) and issubclass(cls, AbstractIntervention)):
        raise ConfigError.of("register_intervention", cls, "a subclass of AbstractIntervention")
    label = f"{cls.__name__}.name"
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise ConfigError.of(label, cls.name, "an identifier such as 'logit_scale'")
    owner = next((other for other in _TYPES.values() if other is not cls and (
        {cls.name, *cls.options} & {other.name, *other.options})), None)
    if owner is not None:
        raise ConfigError.of(label, cls.name, f"a name and options not taken ({owner.__name__} has "
                                              f"{', '.join((owner.name, *owner.options))})")
    checks = (("order", isinstance(cls.order, (int, float)) and math.isfinite(cls.order), "a finite number"),
              ("changes", cls.changes in CHANGES, f"one of {', '.join(CHANGES)}"),
              ("shapes", bool(cls.shapes) and set(cls.shapes) <= set(SHAPES), f"a tuple of {', '.join(SHAPES)}"),
              ("torch_change", cls.torch_change is None or cls.torch_change in TORCH_CHANGES,
               f"None or one of {', '.join(TORCH_CHANGES)}"),
              ("box", cls.box is None or (len(cls.box) == 2 and cls.box[0] < cls.box[1]), "None or (low, high)"),
              ("neutral", cls.box is None or cls.neutral is not None, "a number when a box is declared"))
    for field, ok, allowed in checks:
        if not ok:
            raise ConfigError.of(f"{cls.__name__}.{field}", getattr(cls, field), allowed)


def register_intervention(cls):
    """Register the intervention type `cls` under its declared `name` (and options); returns `cls`.

    Usable as a class decorator. Registering the same class again changes nothing.

    Raises:
        ConfigError: one line naming the declaration: not an intervention type, a name that
            is not an identifier or is taken by another type, an order that is not finite, an
            unknown `changes`, `shapes` or `torch_change`, a box without a neutral value.
    """
    _check_declarations(cls)
    _TYPES[cls.name] = cls
    return cls


def unregister_intervention(cls) -> None:
    """Forget the type `cls` (a test's toy, say); the built-in types stay."""
    if _TYPES.get(getattr(cls, "name", None)) is cls:
        del _TYPES[cls.name]


def intervention_types() -> tuple[type, ...]:
    """The registered types in the order they apply (their `order`)."""
    return tuple(sorted(_TYPES.values(), key=lambda cls: cls.order))


def intervention_type(name) -> type | None:
    """The type whose name or option is `name`, or None."""
    return next((cls for cls in _TYPES.values() if name == cls.name or name in cls.options), None)


def text_names() -> tuple[str, ...]:
    """Every name the text record knows (each type's name, then its options), in the order they apply."""
    return tuple(name for cls in intervention_types() for name in (cls.name, *cls.options))


def designable() -> tuple[type, ...]:
    """The types a design may free (those that declare a `box`), in the order they apply."""
    return tuple(cls for cls in intervention_types() if cls.box is not None)


def sweep_axes() -> tuple[str, ...]:
    """The names a sweep may vary as intervention axes (types with `sweep_axis`), in the order they apply."""
    return tuple(cls.name for cls in intervention_types() if cls.sweep_axis)
