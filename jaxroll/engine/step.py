"""The layer step of the rollout, written once.

``R_t = (1 - lambda_t) I + lambda_t A_t`` acts on a row vector as
``v^T R_t = (1 - lambda_t) v^T + lambda_t (v^T A_t)`` (arXiv 2602.16837);
every scan over layers in jaxroll (the influence row, the rollout matrix, the
shared-kernel path, the refinements, the theory's depth limits) takes this
step, with ``v^T A_t`` from whichever product its path uses.
"""

from __future__ import annotations

__all__ = ["layer_step"]


def layer_step(row, weight, product):
    """``(1 - lambda) row + lambda product``: one layer of the rollout, with `product` = ``row^T A_t``.

    Shapes broadcast: `row` and `product` ``(..., n)`` (or ``(n, n)`` for the
    matrix), `weight` a scalar or one per row.
    """
    return (1.0 - weight) * row + weight * product
