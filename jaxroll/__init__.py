"""jaxroll: the residual-aware attention rollout in JAX.

A theory of position bias in causal transformers from architecture alone
(Herasimchyk, Labryga, Prusina, Laue, *A Structural Theory of Position Bias
in Transformers*, arXiv 2602.16837v2; v1 was titled *A Residual-Aware
Theory of Position Bias in Transformers*): layer t mixes the
identity and an attention kernel, ``R_t = (1 - lambda_t) I + lambda_t A_t``,
and the last row of ``P_T = R_T ... R_1`` is the predicted influence of each
input position on the last one.

Imports are lazy (PEP 562): ``import jaxroll`` loads neither JAX nor any
submodule; each public name loads its module on first use, so a rollout
never pays for optax (the fits), matplotlib (the figures), pandas (sweep
tables) or torch (measurements), and ``jaxroll --help`` answers before JAX
loads. ``__all__`` and ``dir(jaxroll)`` list every public name, loaded or not.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

__all__ = [
    "AlibiKernel",
    "AnchoredTableKernel",
    "ConfigError",
    "DenseKernel",
    "DesignResult",
    "FitResult",
    "GainTableKernel",
    "Identifiability",
    "KernelRolloutModel",
    "PowerKernel",
    "RolloutModel",
    "SweepResult",
    "TableKernel",
    "__version__",
    "alibi_slopes",
    "compare_theories",
    "attention_kernel",
    "compare_variants",
    "design",
    "fit",
    "identifiability",
    "influence",
    "influence_with_mass",
    "interventions",
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
    "track",
    "transition",
    "write_profile",
]

# Public name -> (module, attribute); attribute None: the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    "ConfigError": (".errors", "ConfigError"),
    "AlibiKernel": (".kernel_types", "AlibiKernel"),
    "DenseKernel": (".kernel_types", "DenseKernel"),
    "GainTableKernel": (".kernel_types", "GainTableKernel"),
    "AnchoredTableKernel": (".kernel_types", "AnchoredTableKernel"),
    "PowerKernel": (".kernel_types", "PowerKernel"),
    "TableKernel": (".kernel_types", "TableKernel"),
    "KernelRolloutModel": (".model", "KernelRolloutModel"),
    "RolloutModel": (".model", "RolloutModel"),
    "alibi_slopes": (".engine.alibi", "alibi_slopes"),
    "attention_kernel": (".rollout", "attention_kernel"),
    "influence": (".rollout", "influence"),
    "influence_with_mass": (".rollout", "influence_with_mass"),
    "rollout_matrix": (".rollout", "rollout_matrix"),
    "rollout_row": (".rollout", "rollout_row"),
    "transition": (".rollout", "transition"),
    "load_config": (".io", "load_config"),
    "read_profile": (".io", "read_profile"),
    "save_config": (".io", "save_config"),
    "write_profile": (".io", "write_profile"),
    "FitResult": (".fitting", "FitResult"),
    "Identifiability": (".fitting", "Identifiability"),
    "compare_variants": (".fitting", "compare_variants"),
    "fit": (".fitting", "fit"),
    "identifiability": (".fitting", "identifiability"),
    "SweepResult": (".sweeps", "SweepResult"),
    "DesignResult": (".designs", "DesignResult"),
    "design": (".designs", "design"),
    "compare_theories": (".theory.two_theories", "compare_theories"),
    "sweep": (".sweeps", "sweep"),
    "track": (".measure.tracking", "track"),
    "interventions": (".interventions", None),
    "kernel_types": (".kernel_types", None),
    "metrics": (".metrics", None),
    "presets": (".presets", None),
    "published": (".published", None),
    "schedules": (".schedules", None),
    "theory": (".theory", None),
}

def __getattr__(name: str):
    if name == "__version__":
        from .version import package_version

        value = package_version()
    elif name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name, __name__)
        value = module if attribute is None else getattr(module, attribute)
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # any other submodule, e.g. jaxroll.io
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static checkers see: the names as plain imports
    from . import interventions as interventions
    from . import kernel_types as kernel_types
    from . import metrics as metrics
    from . import presets as presets
    from . import published as published
    from . import schedules as schedules
    from . import theory as theory
    from .designs import DesignResult as DesignResult, design as design
    from .errors import ConfigError as ConfigError
    from .fitting import (
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
        AnchoredTableKernel as AnchoredTableKernel,
        DenseKernel as DenseKernel,
        GainTableKernel as GainTableKernel,
        PowerKernel as PowerKernel,
        TableKernel as TableKernel,
    )
    from .engine.alibi import alibi_slopes as alibi_slopes
    from .model import KernelRolloutModel as KernelRolloutModel, RolloutModel as RolloutModel
    from .rollout import (
        attention_kernel as attention_kernel,
        influence as influence,
        influence_with_mass as influence_with_mass,
        rollout_matrix as rollout_matrix,
        rollout_row as rollout_row,
        transition as transition,
    )
    from .measure.tracking import track as track
    from .sweeps import SweepResult as SweepResult, sweep as sweep
    from .theory.two_theories import compare_theories as compare_theories

    __version__: str
