"""What a fit's summary says about parameters that ended at a bound of their range.

Each bounded parameter is the image of an unconstrained coordinate
(`jaxroll.fitting.parametrisation`): ``lambda = sigmoid(u)`` in (0, 1),
``m = softplus(u)`` and ``tau = softplus(u)`` above 0, ``beta = u^2`` at
least 0. A fit that pushes one of them to its bound (``lambda_0 =
0.999999``) has found the optimum at, or beyond, the edge of the model's
range; there the map is flat (``d sigmoid / du = lambda (1 - lambda) ~ 1e-6``),
so the profile's Jacobian in ``u`` has a near-zero column and the
`Identifiability` report would call the parameter "not determined" for a
reason that is not the data's. The summary says instead that it is at its
bound, and reports the others with it held there (`held_at_bounds`).
"""

from __future__ import annotations

import numpy as np

from .identification import Identifiability, identifiability_from_jacobian

__all__ = ["BOUND_TOLERANCE", "at_bounds", "held_at_bounds", "bound_lines"]

BOUND_TOLERANCE = 1e-5
"""A parameter is *at a bound* when it is within this of it (model units):
five decades above the 1e-6 clip of the parametrisation's inverse, and
far below any difference a measured profile resolves."""

# label prefix -> (low, high) of the parameter's range; None: no bound there.
_RANGES = {"lambda_0": (0.0, 1.0), "lambda_const": (0.0, 1.0), "lambdas": (0.0, 1.0), "beta": (0.0, None),
           "alibi_slopes": (0.0, None), "temperature": (0.0, None)}


def _value(result, label: str) -> float | None:
    """The fitted value of the parameter named `label` (an `Identifiability` name), or None if unbounded."""
    if label in result.schedule_parameters:
        return float(result.schedule_parameters[label])
    field, _, index = label.partition("[")
    if field not in _RANGES:
        return None
    array = np.asarray(getattr(result.model, field), dtype=np.float64)
    if index:
        array = array[tuple(int(i) for i in index.rstrip("]").split(","))]
    return float(array)


def at_bounds(result, tolerance: float = BOUND_TOLERANCE) -> dict[str, str]:
    """The parameters of a `FitResult` that ended within `tolerance` of a bound.

    Returns ``{name: text}`` in the report's order, e.g. ``{"lambda_0":
    "lambda_0 = 0.999999 (its upper bound 1)"}``; empty when none did or when
    there is no identifiability report (it names the parameters).
    """
    report = result.identifiability
    if report is None:
        return {}
    found = {}
    for label in report.names:
        value = _value(result, label)
        if value is None:
            continue
        low, high = _RANGES[label.partition("[")[0]]
        if value - low <= tolerance:
            found[label] = f"{label} = {value:.10g} (lower bound {low:g})"
        elif high is not None and high - value <= tolerance:
            found[label] = f"{label} = {value:.10g} (upper bound {high:g})"
    return found


def held_at_bounds(report: Identifiability, held) -> Identifiability | None:
    """`report` for the other parameters with those in `held` fixed: the same
    resolution ``rho``, the Jacobian without their columns (None when nothing is left)."""
    keep = [k for k, name in enumerate(report.names) if name not in set(held)]
    if not keep:
        return None
    return identifiability_from_jacobian(report.jacobian[:, keep], [report.names[k] for k in keep],
                            residual=report.resolution, scale=0.0, threshold=report.threshold)


def bound_lines(result) -> tuple[list[str], list[str]]:
    """The summary's identifiability lines, and its warnings about bounds.

    Without a parameter at a bound: ``report.summary()``. With some: one line
    naming them, then the report of the others with them held at their
    bounds (`held_at_bounds`), and a warning that the optimum lies at the
    edge of the model's range.
    """
    report = result.identifiability
    if report is None:
        return [], []
    bounds = at_bounds(result)
    if not bounds:
        return report.summary(), []
    held = held_at_bounds(report, bounds)
    lines = ["at a bound: " + "; ".join(bounds.values())]
    if held is not None:
        lines += [line.replace("identifiability:", f"identifiability with {', '.join(bounds)} held at the "
                               "bound:", 1) for line in held.summary()]
    warning = (f"warning: the fit ended at a bound: {'; '.join(bounds.values())}; the best fit lies at or "
               "beyond the edge of the model's range (another schedule or more free arrays may fit better), "
               "and the profile's sensitivity to it vanishes there")
    return lines, [warning]
