"""The names the parser offers as choices, without importing JAX.

``jaxroll --help`` and argument errors must answer before JAX loads, but
`jaxroll.presets`, `jaxroll.published`, `jaxroll.fit` and
`jaxroll.fitting.kernel_fit` import JAX (and optax). Their names are repeated here;
tests/test_lazy_imports.py checks that they equal ``presets.names()``,
``presets.DEFAULT``, ``published.names()``, ``published.DATASETS``, the fit
module's ``FIELDS``, ``SCHEDULES``, ``CONTENTS``, ``LOSSES`` and
``kernel_fit.FAMILIES``; tests/test_latency.py checks `INTERVENTIONS` and `DESIGNABLE` against the
intervention registry (``intervention_types()``, ``designable()``); tests/test_refinements.py checks the refinement
names against ``refinements.SWITCHES``, ``refinements.STATS_FOR`` and the
statistics `jaxroll.measure.refinements` registers.
"""

from __future__ import annotations

__all__ = ["PRESETS", "DEFAULT_PRESET", "PUBLISHED", "DATASETS", "FIT_FIELDS", "FIT_SCHEDULES",
           "FIT_CONTENTS", "FIT_LOSSES", "KERNEL_FAMILIES", "REFINEMENT_SWITCHES", "REFINEMENT_STATS",
           "REFINEMENT_STAT_FOR", "INTERVENTIONS", "DESIGNABLE"]

PRESETS = ("bloom-176b", "bloom-7b1", "mpt-7b", "mpt-30b", "falcon-rw-7b")
DEFAULT_PRESET = "bloom-176b"
PUBLISHED = ("bloom-176b", "bloom-7b1", "mpt-7b", "mpt-30b", "falcon-rw-7b")
DATASETS = ("fineweb-edu", "dclm", "wikipedia")
FIT_FIELDS = ("lambdas", "diagonal_scores", "alibi_slopes", "head_weights", "temperature")
FIT_SCHEDULES = ("free", "power_decay", "constant")
FIT_CONTENTS = ("per_layer", "per_head")
FIT_LOSSES = ("wasserstein", "kl", "l2")
KERNEL_FAMILIES = ("alibi", "power", "table")
REFINEMENT_SWITCHES = ("position", "mlp", "norm", "heads", "gradient", "head_positions", "input_norm")
REFINEMENT_STATS = ("attention_heads", "lambda_positions", "lambda_mlp", "norm_kernels", "head_norms",
                    "lambda_gradient", "head_norms_positions", "input_norm_gains")
REFINEMENT_STAT_FOR = {"position": "lambda_positions", "mlp": "lambda_mlp", "norm": "norm_kernels",
                       "heads": "head_norms", "gradient": "lambda_gradient", "head_positions": "head_norms_positions",
                       "input_norm": "input_norm_gains"}
INTERVENTIONS = (("sinks", ()), ("rotary_ratio", ()), ("tau", ()), ("slope_scale", ()),
                 ("kappa", ("kappa_form", "kappa_k")), ("ssmax_scale", ()), ("gamma", ()))
"""The built-in interventions (name, options) in the order they apply: the --intervene helps before JAX loads."""
DESIGNABLE = (("tau", (0.25, 4.0)), ("slope_scale", (0.0, 4.0)), ("kappa", (-2.0, 2.0)), ("gamma", (0.0, 4.0)))
"""The built-in designable interventions (name, box): ``jaxroll design --help`` before JAX loads."""
