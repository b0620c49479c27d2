"""The planner: which algorithm a rollout runs, decided once, before compilation.

`plan(model, n, method)` returns a `Path`, a static (hashable) description
that `jaxroll.rollout` hands to its one scan and to each layer's
``row_times_kernel``. The decision uses only what is known before tracing:
the method asked for and the kernel's own `AbstractKernel.plan` hook, which
looks at concrete arrays (a traced kernel, under `jit`, `grad` or `vmap`,
keeps every layer's own arrays so every layer gets its own gradient).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from .._checks import check_positive_int
from ..errors import ConfigError

__all__ = ["METHODS", "Path", "plan", "resolve_method"]

METHODS = ("auto", "dense", "structured")
"""How `influence` multiplies by a kernel: ``structured`` (the kernel type's fast product, never forming A), ``dense`` (the (N, N) kernel, for checking), ``auto`` (structured)."""


@dataclasses.dataclass(frozen=True)
class Path:
    """A rollout's algorithm (static: part of the compiled program's key).

    Attributes:
        method: ``"structured"`` (the kernel's ``row_times_kernel``) or ``"dense"`` (``v @ dense(n)``).
        checkpoint: checkpoint each layer step, so reverse mode keeps one row per layer
            (products without a VJP of their own).
        shared_kernel: every layer has one kernel, formed once (`AbstractKernel.shared_rollout_row`).
        shared_slopes: every layer reads layer 0's slopes from outside the scan (loop-invariant tables).
        settled: the causal products skip their run-time branch (True), keep it (False), or one
            `lax.switch` around the whole rollout picks among `rungs` (None, traced arrays).
        transient: the exact prefix of rows of a settled causal product (None: the dtype's).
        rungs: the paths a run-time switch picks from (`AbstractKernel.settled_rung`).
    """

    method: str = "structured"
    checkpoint: bool = False
    shared_kernel: bool = False
    shared_slopes: bool = False
    settled: bool | None = False
    transient: int | None = None
    rungs: tuple["Path", ...] = ()


def resolve_method(method: str) -> str:
    """``auto`` -> ``structured``: every kernel type has a fast product; a one-line error for others."""
    if method not in METHODS:
        raise ConfigError(f"method: got {method!r}; allowed: one of {', '.join(METHODS)}")
    return "structured" if method == "auto" else method


def check_length(model, n: int | None) -> int:
    """The length a call runs at (default ``model.sequence_length``), checked against the kernel."""
    n = model.sequence_length if n is None else check_positive_int("n", n)
    model.kernel.check_length(n)
    return n


def plan(model, n: int, method: str = "auto") -> Path:
    """The `Path` `jaxroll.influence` takes for `model` at length n (n already checked).

    ``dense``: the plain scan with each layer's ``(n, n)`` kernel, checkpointed;
    otherwise the kernel's own choice (`AbstractKernel.plan`): for ALiBi +
    content (`jaxroll.engine.alibi.AlibiKernel`) one shared dense kernel at small
    N, layer 0's slopes hoisted, and the settled prefix of its causal products.
    """
    method = resolve_method(method)
    if method == "dense":
        return Path(method="dense", checkpoint=True)
    return model.kernel.plan(n, method, jnp.result_type(float))
