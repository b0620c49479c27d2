"""Attention kernel types behind one interface, and `KERNEL_TYPES`, the registry of their names.

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
| `GainTableKernel` | mean rows at G logit gains (G, N, N), their path weights, each row's gain | O(G N^2) | n <= N (causal) |
| `AnchoredTableKernel` | a `GainTableKernel`'s tables moving an `AlibiKernel` (ALiBi's default) | O((G + H) N^2) | n <= N (causal) |
| `PowerKernel` | ``f_h(k) = -m_h k^alpha_h``, content | O(H N log N), `jaxroll.engine.relative` | any |
| `TableKernel` | ``f_h(k)`` for k = 1..K, content | O(H N log N), `jaxroll.engine.relative`; O(H N^2) exact where a table rises | n <= K + 1 |

Each type declares on itself what else it can do (its logit operations, its
YAML form, its sweepable and fittable fields; `AbstractKernel`), and
`register_kernel(cls)` puts it in `KERNEL_TYPES` under its `config_kind`,
the ``kernel_type`` of a configuration file: ``alibi`` (the paper's
top-level sections), ``dense``, ``gain_table``, ``anchored_gain_table`` (beside
the ALiBi sections), ``relative`` (`PowerKernel` and `TableKernel` by
``family``). The schema (`jaxroll.schema`) and the command line read the
registry; a new kernel type is one module that ends with that one call
(docs/development.md).
"""

from __future__ import annotations

from .engine.alibi import AlibiKernel
from .engine.anchored_table import AnchoredTableKernel
from .engine.dense import ROW_SUM_TOLERANCE, DenseKernel
from .engine.gain_table import GainTableKernel
from .engine.kernel import KERNEL_TYPES, AbstractKernel, kernel_classes, register_kernel
from .engine.offset import PowerKernel, RelativeKernel, TableKernel

__all__ = ["AbstractKernel", "AlibiKernel", "AnchoredTableKernel", "DenseKernel", "GainTableKernel", "PowerKernel",
           "RelativeKernel", "TableKernel",
           "KERNEL_TYPES", "ROW_SUM_TOLERANCE", "kernel_classes", "register_kernel"]
