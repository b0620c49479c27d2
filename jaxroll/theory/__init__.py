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
"""

from . import bridge as bridge
from . import kinetic as kinetic
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
    "bridge", "kinetic", "total_mixing", "diagonal", "diagonal_lower_bound", "collapse_mass",
    "DepthProfile", "depth_profile", "Monotonicity", "is_stochastically_monotone", "FORCES",
    "Forces", "ladder", "forces",
]
