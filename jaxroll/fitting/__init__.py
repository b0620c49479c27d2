"""Fitting the rollout's parameters to an influence profile, with optax.

Given a target profile ``q`` (measured on a model, say) and a starting
`RolloutModel`, `fit` minimises ``loss(p_T(theta), q)`` over the arrays named
in ``fit``, where ``p_T(theta)`` is the influence profile of the rollout
``R_t = (1 - lambda_t) I + lambda_t A_t``, ``P_T = R_T ... R_1``
(arXiv 2602.16837). The other arrays stay as they are in the model.

Every free array is the image of an unconstrained vector under a map that
keeps the model valid:

==================  =============================================  ==========
array               parametrisation                                shape
==================  =============================================  ==========
lambdas, free       ``lambda_t = sigmoid(u_t)``                    ``(T,)``
lambdas, power      ``lambda_t = lambda_0 / (t + 1)^beta``,
                    ``lambda_0 = sigmoid(u_0)``,
                    ``beta = u_1^2``                               ``(2,)``
lambdas, constant   ``lambda_t = sigmoid(u)``                      ``()``
diagonal_scores     ``d = u`` (logit units), shared by the heads
                    of a layer (``content="per_layer"``) or one
                    per head (``"per_head"``)                      ``(T, 1)``
                                                                   or
                                                                   ``(T, H)``
alibi_slopes        ``m = softplus(u) >= 0``                       ``(T, H)``
head_weights        ``w_t = softmax(u_t)`` over the heads          ``(T, H)``
temperature         ``tau = softplus(u) > 0``                      ``()``
==================  =============================================  ==========

The free/fixed split is an `eqx.partition` of the model. The optimisation of
each starting point is one jit-compiled `jax.lax.while_loop` with the optax
update and the stopping test inside (`jaxroll.fitting.optimise`): ``steps`` is a
maximum, and `FitResult` says whether the fit converged and why it stopped.
For up to `LBFGS_MAX_PARAMETERS` free parameters the default optimiser is
L-BFGS (``optax.lbfgs``), else Adam.

Two stages. A loss over a few parameters can have spurious minima that a
local optimiser started from a "generic" point never leaves (a power-decay fit
started from a constant schedule stops at ``beta -> 0`` with the same total
mixing as the truth). So `fit` first evaluates a space-filling design over the
parameter box (`BOX`; a Halton sequence for up to `GLOBAL_DIMENSIONS`
parameters, uniform draws beyond) together with the starting point, all in one
jit-compiled, vmapped call, and refines the best ``restarts`` of them with the
optimiser. After the fit, `identifiability` linearises the profile at the
solution and reports which parameter combinations it determines.

Modules, one idea each: `parametrisation` (unconstrained vectors -> model
arrays, `BOX`), `losses`, `problem` (the objective and its checks), `design`
(the global stage), `optimise` (the local stage and its stopping test, `fit`,
`FitResult`, `cosine_adam`), `identifiability`, `variants` (`compare_variants`).
`kernel_fit` (imported on its own, ``from jaxroll.fitting.kernel_fit import
fit_kernel``) fits a relative-position kernel to measured dense kernels with
the same loop.
"""

from .composition import fit_composition as fit_composition
from .design import GLOBAL_DIMENSIONS as GLOBAL_DIMENSIONS, GLOBAL_POINTS as GLOBAL_POINTS, halton as halton
from .identification import (
    DETERMINED_THRESHOLD as DETERMINED_THRESHOLD,
    IDENTIFIABILITY_MAX_PARAMETERS as IDENTIFIABILITY_MAX_PARAMETERS,
    Identifiability as Identifiability,
    identifiability as identifiability,
)
from .losses import LOSSES as LOSSES
from .optimise import (
    GRADIENT_TOLERANCE as GRADIENT_TOLERANCE,
    LBFGS_MAX_PARAMETERS as LBFGS_MAX_PARAMETERS,
    LBFGS_RESTARTS as LBFGS_RESTARTS,
    LOSS_TOLERANCE as LOSS_TOLERANCE,
    PATIENCE as PATIENCE,
    FitResult as FitResult,
    cosine_adam as cosine_adam,
    default_lbfgs as default_lbfgs,
    default_optimizer as default_optimizer,
    fit as fit,
)
from .parametrisation import BOX as BOX, CONTENTS as CONTENTS, FIELDS as FIELDS, SCHEDULES as SCHEDULES
from .problem import TARGET_SUM_TOLERANCE as TARGET_SUM_TOLERANCE, objective as objective
from .variants import VARIANTS as VARIANTS, compare_variants as compare_variants

__all__ = ["FIELDS", "SCHEDULES", "CONTENTS", "LOSSES", "VARIANTS", "BOX", "GLOBAL_DIMENSIONS",
           "GLOBAL_POINTS", "DETERMINED_THRESHOLD", "IDENTIFIABILITY_MAX_PARAMETERS", "TARGET_SUM_TOLERANCE",
           "GRADIENT_TOLERANCE", "LOSS_TOLERANCE", "PATIENCE", "LBFGS_MAX_PARAMETERS", "LBFGS_RESTARTS",
           "FitResult", "Identifiability", "fit", "objective", "identifiability", "compare_variants",
           "cosine_adam", "default_optimizer", "default_lbfgs", "halton", "fit_composition"]
