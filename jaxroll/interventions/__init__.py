"""Interventions on position bias: changes to a model, predicted by the rollout.

An intervention is a small PyTree (`eqx.Module`) whose parameters are arrays,
with a rollout transform ``apply(model) -> model``: pure, and differentiable
in the intervention's parameters, so `jax.grad` and `jax.vmap` work through
it (arXiv 2602.16837's rollout ``R_t = (1 - lambda_t) I + lambda_t A_t`` of
the changed model is the prediction). Each class says whether its transform
is exact in the theory or an approximation, and which.

| intervention | change to the model | rollout transform |
|---|---|---|
| `Temperature` | logits / tau per layer and head | exact on ALiBi + content and relative kernels; an approximation on measured mean kernels |
| `LengthScaledLogits` | SSMax: row i's logits x s ln(n_i) | exact on ALiBi + content and relative kernels (formed densely) |
| `SlopeScale` | ALiBi slopes x s per head | exact |
| `BranchScale` | attention output x gamma_t per layer | ``lambda' = gamma lambda / (gamma lambda + 1 - lambda)``: first order |
| `DistanceBias` | ``kappa g(i - j)`` added to the logits | exact on ALiBi + content and relative kernels (an offset kernel); an approximation on measured mean kernels |
| `RotaryRescale` | rotary positions / r per head (Ms-PoE; position interpolation) | ``f'(k) = f(k / r)`` on a rotary model's offset kernel (power: ``m r^-alpha``; table: interpolated): an approximation; refused on ALiBi |
| `SinkTokens` | k tokens prepended (attention sinks) | the model at length n + k; ``split`` gives the sinks' mass and the n originals' profile renormalised: exact for kernels of positions |

`apply_all(model, interventions)` applies several in order; `parse` reads
the command line's ``NAME=VALUE[,NAME=VALUE...]`` (or a YAML file) and
`describe` writes the record a result carries.

Each type declares its name, neutral value, design box, shapes, order and torch
change (`AbstractIntervention`); `register_intervention(cls)` adds a new type to
the one registry (`registry.py`) that parse, describe, designs, sweeps and the
torch patch read:

| name | intervention | neutral | design box |
|---|---|---|---|
| `sinks` | `SinkTokens` | 0 | |
| `rotary_ratio` | `RotaryRescale` | 1 | |
| `tau` | `Temperature` | 1 | [0.25, 4] |
| `slope_scale` | `SlopeScale` | 1 | [0, 4] |
| `kappa` | `DistanceBias` | 0 | [-2, 2] |
| `ssmax_scale` | `LengthScaledLogits` | | |
| `gamma` | `BranchScale` | 1 | [0, 4] |
"""

from ._base import SHAPES, AbstractIntervention, apply_all, length_change
from .kernels import DistanceBias, DistanceScore, LengthScaledLogits, SlopeScale, Temperature, log1p_distance, unsquash_distance
from .mixing import BranchScale
from .positions import RotaryRescale, SinkTokens, ms_poe_order, ms_poe_ratios, table_at_distances
from .registry import (designable, intervention_type, intervention_types, register_intervention, sweep_axes,
                       text_names, unregister_intervention)
from .spec import describe, from_mapping, parse

__all__ = ["AbstractIntervention", "BranchScale", "DistanceBias", "DistanceScore", "LengthScaledLogits", "NAMES", "RotaryRescale",
           "SHAPES", "SinkTokens", "SlopeScale", "Temperature", "apply_all", "describe", "designable", "from_mapping",
           "intervention_type", "intervention_types", "length_change", "log1p_distance", "ms_poe_order", "ms_poe_ratios",
           "parse",
           "register_intervention", "sweep_axes", "table_at_distances", "text_names", "unregister_intervention",
           "unsquash_distance"]

NAMES: tuple[str, ...]
"""Every name `parse` knows, in the order the interventions apply: the registry's `text_names()`, read when
asked (a type registered later is in it)."""


def __getattr__(name: str):
    if name == "NAMES":  # the registry's names when read, so a type registered later is in it
        return text_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
