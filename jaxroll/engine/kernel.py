"""The kernel interface: what the rollout engine needs of an attention kernel.

The rollout of arXiv 2602.16837, ``R_t = (1 - lambda_t) I + lambda_t A_t``,
needs only row-stochastic kernels ``A_t`` (``A[i, j]`` = weight with which
token i reads token j). A kernel type is an `eqx.Module` PyTree holding T
layers stacked on axis 0 of every array leaf (a 0-d leaf, such as a softmax
temperature, is shared by every layer). It declares

- ``row_times_kernel(v, path)``: ``v^T A_t`` for one layer (what
  `jaxroll.influence` needs; `path` is the planner's choice, see
  `jaxroll.engine.plan`),
- ``dense(n)``: the ``(n, n)`` matrix ``A_t`` of one layer,
- ``check_length(n)``: a one-line `ConfigError` unless defined at length n,
- ``influence_bytes(n, method, itemsize)``: the working memory of one
  influence pass at length n (`jaxroll.memory` asks the kernel),

and may override the planner's hooks (`plan`, `scan_parts`,
`shared_rollout_row`, `settled_rung`) where its structure allows a faster
path. A new kernel type is one module under `jaxroll/engine/` subclassing
`AbstractKernel` plus one line in `jaxroll.kernel_types.KERNEL_TYPES` (for the
YAML schema); `influence`, `grad` and sweeps need nothing else.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
from jaxtyping import Array, Float

from .plan import Path

__all__ = ["AbstractKernel"]


def _per_layer(leaf) -> bool:
    return eqx.is_array(leaf) and leaf.ndim > 0


class AbstractKernel(eqx.Module):
    """A stack of T layer kernels ``A_t`` behind the engine's interface (abstract).

    Subclasses are `eqx.Module` PyTrees whose array leaves carry the layer on
    axis 0 (0-d leaves are shared by every layer); `jax.lax.scan` over
    `scan_parts` hands each step one layer of the same type.
    """

    @property
    @abc.abstractmethod
    def num_layers(self) -> int:
        """T, the number of stacked layers."""

    @property
    @abc.abstractmethod
    def num_heads(self) -> int:
        """H, the heads mixed in each layer (1 for a measured head average)."""

    @property
    def mask(self) -> str:
        """``"causal"``, ``"sliding"`` or ``"full"``: which j a row i may read."""
        return "causal"

    @property
    def window(self) -> int | None:
        """The sliding window W, or None."""
        return None

    def default_length(self) -> int:
        """The sequence length a model over this kernel defaults to."""
        return 256

    @abc.abstractmethod
    def row_times_kernel(self, v: Float[Array, " n"], path: Path = Path()) -> Float[Array, " n"]:
        """One layer's ``v^T A``, shape ``(n,)``: ``(v^T A)_j = sum_i v_i A[i, j]``."""

    @abc.abstractmethod
    def dense(self, n: int) -> Float[Array, "n n"]:
        """One layer's dense kernel ``A``, shape ``(n, n)``, rows summing to 1."""

    @abc.abstractmethod
    def check_length(self, n: int) -> None:
        """Raise a one-line `ConfigError` unless the kernel is defined at length n."""

    @abc.abstractmethod
    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        """Peak working memory of one influence pass at length n, in bytes (an estimate)."""

    def row_bytes(self, n: int, itemsize: int) -> int:
        """Working memory of one vmapped row product at length n (what a sweep point holds per start row)."""
        return self.influence_bytes(n, "structured", itemsize)

    def check(self) -> None:
        """Raise a one-line `ConfigError` when concrete arrays leave their allowed ranges (default: none)."""

    # The planner's hooks: defaults that take the plain per-layer products.

    def plan(self, n: int, method: str, dtype) -> Path:
        """The path `jaxroll.engine.plan.plan` takes for this kernel (method already resolved)."""
        del n, dtype
        return Path(method=method, checkpoint=True)

    def scan_parts(self, path: Path = Path()) -> tuple["AbstractKernel", "AbstractKernel"]:
        """``(stacked, shared)``: the leaves a scan over layers slices, and those every layer reads whole.

        ``eqx.combine(stacked[t], shared)`` is layer t. Default: 0-d leaves are shared.
        """
        del path
        return eqx.partition(self, _per_layer)

    def layer(self, t) -> "AbstractKernel":
        """Layer t (0-based) as a kernel of the same type (axis 0 of the per-layer arrays removed)."""
        stacked, shared = self.scan_parts()
        return eqx.combine(jax.tree.map(lambda x: x[t], stacked), shared)

    def shared_rollout_row(self, row, lambdas) -> Float[Array, " n"]:
        """``row^T R_T ... R_1`` when `plan` chose ``shared_kernel`` (one kernel for every layer)."""
        raise NotImplementedError(f"{type(self).__name__} plans no shared-kernel path")

    def settled_rung(self, dtype):
        """Which of `plan`'s ``rungs`` a traced kernel takes (when ``settled`` is None)."""
        raise NotImplementedError(f"{type(self).__name__} plans no run-time rungs")
