"""The interface every intervention implements, what each declares about itself, and what they share.

An intervention type declares, as class attributes read by the registry (`registry.py`) and
every caller (the text record, designs, sweeps, the torch patch): its text name, its neutral
value, its default design box, its allowed shapes, its place in the application order,
whether it changes the kernel, the mixing or the length, and how the torch patch applies it.
The defaults refuse in one line, so a type declares only what it supports.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_range, is_concrete, per_layer
from ..engine.kernel import layer_head_values
from ..errors import ConfigError
from ..model import RolloutModel, check_model

__all__ = ["AbstractIntervention", "SHAPES", "apply_all", "length_change"]

SHAPES = ("global", "per_layer", "per_head", "per_layer_head")
"""How a parameter may be shared: one number, one per layer, one per head, one per layer and head."""

CHANGES = ("length", "kernel", "mixing")
"""What an intervention changes: the sequence length, the attention kernel A_t, or the mixing lambda_t."""

TORCH_CHANGES = ("sinks", "rotary", "branch", "divide", "bias_scale", "add", "log_length")
"""How the torch patch applies an intervention (`jaxroll.measure.torch_plan`): prepended sink tokens,
rotary ratios, a branch scale per layer, or one step of its `LogitChange` (``divide`` the logits,
``bias_scale`` the position bias, ``add`` a distance term, ``log_length`` SSMax's ``s ln n_i``)."""


class AbstractIntervention(eqx.Module):
    """A change to a model (abstract): ``apply(model)`` is the rollout's prediction of it.

    Subclasses hold their parameters as arrays (leaves), so `jax.grad` of a
    statistic of ``influence(intervention.apply(model))`` is the gradient
    with respect to the intervention.

    What a type declares (class attributes; the defaults refuse):

    - `name`: its text name (``--intervene NAME=VALUE``, a record's key, a
      design's or sweep's parameter), `parameter` the field that holds the
      value, `options` further text names it reads (with `options_purpose`);
    - `neutral`: the value at which it changes nothing (None: no such value);
    - `box` (``(low, high)``, None: a design cannot free it), `log_box`
      (the box is uniform in ``log value``), `lowest` (``(least value, open)``);
    - `shapes`: the `SHAPES` its value may take; `order`: its place in the
      application order (sinks first, since they set the length; the branch
      scale last); `changes`: one of `CHANGES`; `sweep_axis`: whether a sweep
      may vary it;
    - `torch_change`: one of `TORCH_CHANGES`, or None (no torch patch).
    """

    name: ClassVar[str | None] = None
    parameter: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    options_purpose: ClassVar[str] = ""
    neutral: ClassVar[float | None] = None
    box: ClassVar[tuple[float, float] | None] = None
    log_box: ClassVar[bool] = False
    lowest: ClassVar[tuple[float, bool]] = (-math.inf, True)
    shapes: ClassVar[tuple[str, ...]] = SHAPES
    order: ClassVar[float] = math.inf
    changes: ClassVar[str] = "kernel"
    sweep_axis: ClassVar[bool] = False
    torch_change: ClassVar[str | None] = None

    @abc.abstractmethod
    def apply(self, model: RolloutModel) -> RolloutModel:
        """The model with the intervention applied (pure; differentiable in the parameters)."""

    @property
    def value(self):
        """The intervention's value: the field its type names as `parameter`."""
        if not self.parameter:
            raise ConfigError(f"intervention: {type(self).__name__} declares no parameter; allowed: a type "
                              "that names the field holding its value")
        return getattr(self, self.parameter)

    @classmethod
    def text_value(cls, name: str, text: str):
        """One of its names' value as the command line writes it (``NAME=TEXT``): a finite number."""
        return number_from_text(name, text)

    @classmethod
    def from_record(cls, mapping: dict, source: str = "--intervene") -> AbstractIntervention:
        """The intervention that the mapping's `name` entry (and its `options`) describe."""
        return cls(mapping[cls.name])

    def record(self) -> dict:
        """``{name: value}`` as plain numbers or nested lists (`from_record` reads it back)."""
        return {self.name: plain_value(self.value)}

    def layer_head_value(self, num_layers: int, num_heads: int) -> np.ndarray:
        """The value at full shape as NumPy float64: ``(T, H)``, or ``(T,)`` for a type without per-head shapes."""
        value = np.asarray(self.value, np.float64)
        if "per_head" not in self.shapes:
            return np.asarray(per_layer(self.name, value, num_layers), np.float64)
        return np.asarray(layer_head_values(self.name, value, num_layers, num_heads), np.float64)

    def torch_values(self, num_layers: int, num_heads: int) -> np.ndarray:
        """What the torch patch's `torch_change` reads, NumPy float64 (no torch here): `layer_head_value`
        (tau for ``divide``, the factor for ``bias_scale``, gamma per layer for ``branch``, ...)."""
        return self.layer_head_value(num_layers, num_heads)

    def torch_distance(self) -> tuple | None:
        """The distance function of an ``add`` step, as ``(form, k)`` (`torch_plan` evaluates it in torch)."""
        return None

    @classmethod
    def mixed_lambdas(cls, value, lambdas, stream_norms=None):
        """The lambdas of a ``mixing`` intervention of `value` (per layer), array in, array out (NumPy or JAX);
        `stream_norms` the model's (`RolloutModel.stream_norms`, or None) for a rule that reads them."""
        raise ConfigError(f"{cls.name}: {cls.__name__} declares no change of the mixing alone; allowed: an "
                          "intervention with changes = 'mixing' that defines mixed_lambdas")


def number_from_text(name: str, text: str) -> float:
    """``float(text)``, finite; one line naming ``--intervene NAME`` otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--intervene {name}: got {text!r}; allowed: a number") from None
    if not np.isfinite(value):
        raise ConfigError(f"--intervene {name}: got {text!r}; allowed: a finite number")
    return value


def plain_value(value):
    """A value as a record holds it: a float, or nested lists of floats."""
    array = np.asarray(value, dtype=np.float64)
    return float(array) if array.ndim == 0 else array.tolist()


def length_change(interventions: Sequence[AbstractIntervention]):
    """The first of `interventions` that changes the sequence length (`SinkTokens`: ``changes = "length"``), or None."""
    return next((change for change in interventions if change.changes == "length"), None)


def apply_all(model: RolloutModel, interventions: Sequence[AbstractIntervention]) -> RolloutModel:
    """``interventions[-1].apply(... interventions[0].apply(model))``: several changes, in order."""
    model = check_model(model)
    for intervention in interventions:
        model = intervention.apply(model)
    return model


def checked_parameter(field: str, value, low=None, *, low_open: bool = False):
    """A parameter as a float array (range-checked when concrete), one line naming `field` otherwise."""
    if not is_concrete(value):
        return jnp.asarray(value)
    array = as_float_array(field, value)
    if array.ndim > 2:
        raise ConfigError(f"{field}: got shape {array.shape}; allowed: a number, (layers,), (heads,) or (layers, heads)")
    check_range(field, array, low, None, low_open=low_open)
    return array


def per_layer_head(field: str, value, model: RolloutModel):
    """`value` broadcast to ``(T, H)`` of `model`: a number, ``(H,)``, ``(T, 1)`` or ``(T, H)``.

    A ``(T,)`` value is one per layer (read as ``(T, 1)``), unless T == H, where
    ``(T,)`` would be ambiguous and ``(T, 1)`` or ``(1, H)`` must be given.
    """
    return layer_head_values(field, value, model.num_layers, model.num_heads)
