"""The theory as code: the rollout's closed forms and limits, and the kinetic theory beside it.

- `jaxroll.theory.rollout_limits` (re-exported here): closed forms, depth
  limits and the four forces of the residual-aware rollout
  (arXiv 2602.16837): `total_mixing`, `diagonal`, `diagonal_lower_bound`,
  `collapse_mass`, `depth_profile`, `is_stochastically_monotone`, `forces`.
- `jaxroll.theory.kinetic`: the kinetic closed form of lost-in-the-middle
  (Duerinckx, Geshkovski, Rossi, arXiv 2605.09213): `kinetic.profile`,
  `kinetic.multi_head_profile`, `kinetic.critical_time`.
- `jaxroll.theory.bridge`: the mapping between the two, and the rollout a
  kinetic profile is compared with.
- `jaxroll.theory.baselines`: closed-form baselines, each checked against the
  rollout it approximates: the uniform-causal (Cesàro) rollout, exact at
  finite N and its continuum and deep limits (Chowdhury, arXiv 2603.10123):
  `cesaro_profile`, `cesaro_density`, `cesaro_atom`, `cesaro_poisson_density`;
  and the power law by distance (Brändel et al., arXiv 2606.29139):
  `power_law`, `fit_power_law`, `by_distance`.
- `jaxroll.theory.refinements`: refined rollouts, the predicted half
  (measured per-position mixing, per-head kernels and head weights composed
  into a rollout; `jaxroll.measure.refinements` measures them).
- `jaxroll.theory.rows`: rows of ``P_T`` at query positions, the predicted
  half (`jaxroll.measure.rows` measures them).
- `jaxroll.theory.two_theories` (imported on its own: it loads optax): both
  theories fitted to one profile, `compare_theories` (also
  `jaxroll.compare_theories`).
"""

from . import baselines as baselines
from . import bridge as bridge
from . import kinetic as kinetic
from . import refinements as refinements
from . import rows as rows
from .baselines import (
    cesaro_profile as cesaro_profile,
    cesaro_density as cesaro_density,
    cesaro_atom as cesaro_atom,
    cesaro_poisson_density as cesaro_poisson_density,
    power_law as power_law,
    PowerLawFit as PowerLawFit,
    fit_power_law as fit_power_law,
    by_distance as by_distance,
)
from .rollout_limits import (
    total_mixing as total_mixing,
    diagonal as diagonal,
    diagonal_lower_bound as diagonal_lower_bound,
    collapse_mass as collapse_mass,
    DepthProfile as DepthProfile,
    depth_profile as depth_profile,
    Monotonicity as Monotonicity,
    is_stochastically_monotone as is_stochastically_monotone,
    FORCES as FORCES,
    Forces as Forces,
    ladder as ladder,
    forces as forces,
)

__all__ = [
    "baselines", "bridge", "kinetic", "cesaro_profile", "cesaro_density", "cesaro_atom", "cesaro_poisson_density",
    "power_law", "PowerLawFit", "fit_power_law", "by_distance", "total_mixing", "diagonal", "diagonal_lower_bound", "collapse_mass",
    "DepthProfile", "depth_profile", "Monotonicity", "is_stochastically_monotone", "FORCES",
    "Forces", "ladder", "forces",
]
