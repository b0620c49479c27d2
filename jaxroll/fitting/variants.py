"""The paper's comparison of rollout variants fitted to one target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._checks import check_positive_int
from ..model import RolloutModel
from ..rollout import influence
from .losses import resolve_loss
from .optimise import FitResult, fit
from .problem import _as_numpy_model, check_target, _compare

__all__ = ["VARIANTS", "compare_variants"]

VARIANTS = ("attention_only", "no_content", "content")
"""The rows of `compare_variants`: lambda = 1, the model without content, the model as given."""


def compare_variants(
    model: RolloutModel,
    target,
    *,
    steps: int = 500,
    schedule: str = "free",
    content: str = "per_layer",
    loss: str | Callable = "wasserstein",
    restarts: int = 1,
    key: Array | None = None,
    n: int | None = None,
    method: str = "auto",
) -> dict[str, FitResult]:
    """The paper's comparison: three rollout variants fitted to one target.

    The rows of the paper's Wasserstein/Spearman tables (arXiv 2602.16837),
    each a `FitResult` with its best loss and ``metrics.compare`` of its
    profile against `target`:

    - ``"attention_only"``: ``lambda_t = 1`` (``R_t = A_t``, the rollout of
      Abnar & Zuidema 2020 / Wu et al. 2025) with the model's kernels. Its
      one parameter is pinned by definition, so it is evaluated, not fitted
      (``steps = 0``, empty `losses`).
    - ``"no_content"``: residual-aware, diagonal content set to 0, lambdas
      fitted (`schedule`).
    - ``"content"``: residual-aware, lambdas and diagonal content fitted
      (`content`), starting from the model's content.

    Every variant keeps the model's ALiBi slopes, head weights and
    temperature. The other arguments are those of `fit`.

    Returns:
        ``{variant: FitResult}`` in the order of `VARIANTS`.
    """
    n = model.sequence_length if n is None else check_positive_int("n", n)
    checked = check_target(target, n)
    loss_function = resolve_loss(loss)
    common = dict(loss=loss, restarts=restarts, key=key, n=n, method=method, steps=steps)

    attention_only = _as_numpy_model(dataclasses.replace(model, lambdas=np.ones(model.num_layers)), n)
    profile = influence(attention_only, n, method=method)
    value = float(loss_function(profile, jnp.asarray(checked)))
    results = {"attention_only": FitResult(
        model=attention_only, profile=np.asarray(profile, dtype=np.float64),
        losses=np.zeros(0), initial_loss=value, final_loss=value,
        metrics=_compare(profile, jnp.asarray(checked)), steps=0,
        restart_losses=np.array([value]), schedule_parameters={}, converged=True,
        stop_reason="evaluated, not fitted (lambda = 1 by definition)")}
    no_content = dataclasses.replace(model, diagonal_scores=np.zeros((model.num_layers, model.num_heads)))
    results["no_content"] = fit(no_content, checked, fit=("lambdas",), schedule=schedule, **common)
    results["content"] = fit(model, checked, fit=("lambdas", "diagonal_scores"), schedule=schedule,
                             content=content, **common)
    return results
