"""jaxroll: the residual-aware attention rollout in JAX.

A theory of position bias in causal transformers from architecture alone
(Herasimchyk, Labryga, Prusina, Laue, arXiv 2602.16837): layer t mixes the
identity and an attention kernel, ``R_t = (1 - lambda_t) I + lambda_t A_t``,
and the last row of ``P_T = R_T ... R_1`` is the predicted influence of each
input position on the last one.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = [
    "AlibiKernel",
    "ConfigError",
    "DenseKernel",
    "FitResult",
    "Identifiability",
    "KernelRolloutModel",
    "PowerKernel",
    "RolloutModel",
    "SweepResult",
    "TableKernel",
    "__version__",
    "alibi_slopes",
    "attention_kernel",
    "compare_variants",
    "fit",
    "identifiability",
    "influence",
    "influence_with_mass",
    "kernel_types",
    "load_config",
    "metrics",
    "presets",
    "published",
    "read_profile",
    "rollout_matrix",
    "rollout_row",
    "save_config",
    "schedules",
    "sweep",
    "theory",
    "transition",
    "write_profile",
]

from . import kernel_types as kernel_types
from . import metrics as metrics
from . import presets as presets
from . import published as published
from . import schedules as schedules
from . import theory as theory
from .errors import ConfigError as ConfigError
from .fit import (
    FitResult as FitResult,
    Identifiability as Identifiability,
    compare_variants as compare_variants,
    fit as fit,
    identifiability as identifiability,
)
from .io import (
    load_config as load_config,
    read_profile as read_profile,
    save_config as save_config,
    write_profile as write_profile,
)
from .kernel_types import (
    AlibiKernel as AlibiKernel,
    DenseKernel as DenseKernel,
    PowerKernel as PowerKernel,
    TableKernel as TableKernel,
)
from .kernels import alibi_slopes as alibi_slopes
from .model import KernelRolloutModel as KernelRolloutModel, RolloutModel as RolloutModel
from .rollout import (
    attention_kernel as attention_kernel,
    influence as influence,
    influence_with_mass as influence_with_mass,
    rollout_matrix as rollout_matrix,
    rollout_row as rollout_row,
    transition as transition,
)
from .sweep import SweepResult as SweepResult, sweep as sweep

try:
    __version__ = version("jaxroll")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"
