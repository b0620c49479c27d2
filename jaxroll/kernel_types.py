"""Attention kernel types behind one interface: ALiBi + content, measured dense, relative-position.

The rollout of arXiv 2602.16837, ``R_t = (1 - lambda_t) I + lambda_t A_t``,
needs only row-stochastic kernels ``A_t`` (``A[i, j]`` = weight with which
token i reads token j). Each kernel type is an `eqx.Module` PyTree holding T
layers stacked on axis 0 and implementing `AbstractKernel`
(`jaxroll.engine.kernel`): ``row_times_kernel(v)`` gives ``v^T A_t``,
``dense(n)`` the ``(n, n)`` matrix, ``check_length(n)`` says (one line)
whether the kernel is defined at length n, ``influence_bytes`` its working
memory. All of them work under `jit`, `vmap` and `grad`; a `RolloutModel` is
lambdas plus one of them.

| type | parameters per layer | ``v^T A`` | lengths |
|---|---|---|---|
| `AlibiKernel` | slopes, content, weights (H) | O(H N), `jaxroll.engine.structured` | any |
| `DenseKernel` | ``A_t`` (N, N) | O(N^2) | n <= N (causal), n = N (other) |
| `PowerKernel` | ``f_h(k) = -m_h k^alpha_h``, content | O(H N log N), `jaxroll.engine.relative` | any |
| `TableKernel` | ``f_h(k)`` for k = 1..K, content | O(H N log N), `jaxroll.engine.relative`; O(H N^2) exact where a table rises | n <= K + 1 |

A new kernel type is one module under `jaxroll/engine/` and one line in
`KERNEL_TYPES` (docs/development.md).
"""

from __future__ import annotations

from .engine.alibi import AlibiKernel
from .engine.dense import ROW_SUM_TOLERANCE, DenseKernel
from .engine.kernel import AbstractKernel
from .engine.offset import PowerKernel, TableKernel

__all__ = ["AbstractKernel", "AlibiKernel", "DenseKernel", "PowerKernel", "TableKernel", "KERNEL_TYPES",
           "ROW_SUM_TOLERANCE"]

KERNEL_TYPES = (AlibiKernel, DenseKernel, PowerKernel, TableKernel)
"""The kernel types the YAML schema and the command line know by name (any `AbstractKernel` runs)."""
