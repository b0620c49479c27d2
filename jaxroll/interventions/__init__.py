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
"""

from ._base import AbstractIntervention, apply_all
from .kernels import DistanceBias, LengthScaledLogits, SlopeScale, Temperature, log1p_distance, unsquash_distance
from .mixing import BranchScale
from .positions import RotaryRescale, SinkTokens, ms_poe_ratios, table_at_distances
from .spec import NAMES, describe, from_mapping, parse

__all__ = ["AbstractIntervention", "BranchScale", "DistanceBias", "LengthScaledLogits", "NAMES", "RotaryRescale",
           "SinkTokens", "SlopeScale", "Temperature", "apply_all", "describe", "from_mapping", "log1p_distance",
           "ms_poe_ratios", "parse", "table_at_distances", "unsquash_distance"]
