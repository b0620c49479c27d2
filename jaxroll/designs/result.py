"""What `jaxroll.design` returns, and the lines a terminal summary prints from it."""

from __future__ import annotations

import equinox as eqx
import numpy as np

from ..fitting import Identifiability
from ..model import RolloutModel

__all__ = ["DesignResult"]


class DesignResult(eqx.Module):
    """The outcome of `jaxroll.design`.

    Attributes:
        interventions: the designed interventions (NumPy float64 parameters), in the order they
            apply; ``interventions.apply_all(model, result.interventions)`` is `model`.
        record: ``interventions.describe(result.interventions)``: the mapping design.yaml holds,
            which ``jaxroll rollout --intervene design.yaml`` reads back.
        values: ``{name: array}``, each free parameter in its own units and shape.
        model: the changed model.
        before, after: ``(n,)``, the influence profiles of the original and the changed model.
        target: ``(n,)``, the target profile, or None for a shape goal.
        objective: what was minimised, in words (``W1 to flat``, ``raise middle_mass within
            KL <= 0.05``).
        initial_value, final_value: the unpenalised objective at the start (the identity) and at
            the design: the loss to the target, ``1 - middle_mass`` or ``u_index + 1``.
        kl: ``(T,)``, each layer's ``(1/n) sum_i KL(A'_t[i, :] || A_t[i, :])`` at the design (0
            where no kernel parameter is free).
        kl_budget: the budget ``b`` of a shape goal, or None.
        middle_mass, u_index: ``(before, after)`` (`jaxroll.metrics`, edges of `fraction` n).
        argmin: ``(before, after)``, the least influential position.
        at_bounds: ``{label: text}`` of the parameters that ended within `BOUND_FRACTION` of the
            width of their box of an end.
        converged: the last local stage passed the stopping rule of `jaxroll.fitting` (gradient
            and relative loss change, the loss floor, or a stationary loss) and, for a budget,
            the outer loop ended feasible.
        stop_reason: one line.
        steps: optimisation steps over all outer iterations (of the winning starts).
        max_steps: the step limit of each local stage.
        optimizer: ``"lbfgs"``, ``"adam"`` or ``"custom"``.
        search_points: points of the global stage (0: none).
        outer_iterations: augmented-Lagrangian iterations (1 without a budget).
        identifiability: the `Identifiability` report of a target design (the profile's Jacobian
            in the unconstrained coordinates), else None.
        warnings: one line each: parameters at a bound, a budget not met, no convergence.
    """

    interventions: tuple
    record: dict
    values: dict
    model: RolloutModel
    before: np.ndarray
    after: np.ndarray
    target: np.ndarray | None
    objective: str
    initial_value: float
    final_value: float
    kl: np.ndarray
    kl_budget: float | None
    middle_mass: tuple[float, float]
    u_index: tuple[float, float]
    argmin: tuple[int, int]
    at_bounds: dict
    converged: bool
    stop_reason: str
    steps: int
    max_steps: int
    optimizer: str
    search_points: int
    outer_iterations: int
    identifiability: Identifiability | None
    warnings: tuple[str, ...]

    def summary(self) -> list[str]:
        """Lines for a terminal: the objective and how the search stopped, the designed values,
        the middle mass and U-index before and after, the KL used against the budget, bounds."""
        lines = [f"objective: {self.objective}: {self.stop_reason}",
                 f"  optimizer = {self.optimizer}, steps = {self.steps} (at most {self.max_steps} per local stage), "
                 f"outer iterations = {self.outer_iterations}, global design = {self.search_points} points",
                 f"  objective value: before {self.initial_value:.6g}, after {self.final_value:.6g}"]
        for name, value in self.record.items():
            array = np.asarray(value, dtype=object)
            if array.dtype == object and array.ndim == 0 and isinstance(value, str):
                lines.append(f"  {name} = {value}")
                continue
            numbers = np.ravel(np.asarray(value, np.float64))
            shown = ", ".join(f"{x:.6g}" for x in numbers[:8]) + (", ..." if numbers.size > 8 else "")
            lines.append(f"  {name} = {shown}" if numbers.size == 1 else f"  {name} = [{shown}]")
        change = self.middle_mass[1] - self.middle_mass[0]
        lines.append(f"  middle_mass: before {self.middle_mass[0]:.6g}, after {self.middle_mass[1]:.6g} "
                     f"(change {change:+.6g})")
        lines.append(f"  u_index: before {self.u_index[0]:.6g}, after {self.u_index[1]:.6g}; "
                     f"argmin: before {self.argmin[0]}, after {self.argmin[1]}")
        if self.kl_budget is not None:
            lines.append(f"  kernel KL (mean over rows, per layer): max {np.max(self.kl):.6g} of the budget "
                         f"{self.kl_budget:.6g} (used {np.max(self.kl) / self.kl_budget:.2%}; "
                         f"mean over layers {np.mean(self.kl):.6g})")
        elif np.any(self.kl > 0):
            lines.append(f"  kernel KL (mean over rows, per layer): max {np.max(self.kl):.6g}, "
                         f"mean {np.mean(self.kl):.6g}")
        if self.at_bounds:
            lines.append("  at a bound: " + "; ".join(self.at_bounds.values()))
        if self.identifiability is not None:
            lines += [f"  {line}" for line in self.identifiability.summary()]
        return lines
