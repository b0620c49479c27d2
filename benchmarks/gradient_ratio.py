"""grad of W1 / forward pass of `jaxroll.influence`, interleaved, least of R warm calls.

    PYTHONPATH=TREE python3 benchmarks/gradient_ratio.py [--presets bloom-176b] [--lengths 4096 65536]

Forward: ``jax.jit(lambda m: jaxroll.influence(m, n))``; gradient:
``jax.jit(jax.grad(lambda m: jaxroll.metrics.wasserstein(jaxroll.influence(m, n), uniform)))``
with respect to every model array; both compiled ahead of time, then
called alternately `--repeats` times (the least of each is printed, and
their ratio). The package comes from PYTHONPATH, so two trees (before and
after a change) can be compared by running this script on each in turn.

``--branches`` compares, in one process and interleaved, where a traced
model's causal products decide between the stationary split and the exact
per-head path beyond row P: one `lax.cond` per product and per adjoint
(``per-layer``), one `lax.switch` around the whole rollout (``one``, what
`influence` does for traced arrays: `jaxroll.engine.structured.settled_rung`),
and none (``none``, what it does for concrete
arrays that passed `jaxroll.engine.structured.causal_settled`).
Never run in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp

import jaxroll
from jaxroll.engine.plan import plan


def _with_settled(path, settled):
    """`path` with its run-time branch forced: per product (False), one switch (None), none (True)."""
    if settled is None:
        return path
    return dataclasses.replace(path, settled=settled, rungs=())


def compiled(function, *args):
    executable = jax.jit(function).lower(*args).compile()
    jax.block_until_ready(executable(*args))
    return executable


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["bloom-176b"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--branches", action="store_true",
                        help="compare per-layer, one and no run-time branch in one process")
    arguments = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device.platform}:{device.device_kind}, "
          f"jax {jax.__version__}, jaxroll from {os.path.dirname(jaxroll.__file__)}, least of {arguments.repeats}")
    print("preset | N | branch | forward s | grad W1 s | grad / forward | load")
    # The planner's `settled`: False (a branch per product), None (one lax.switch), True.
    variants = {"per-layer": False, "one": None, "none": True} if arguments.branches else {"-": "influence"}
    for name in arguments.presets:
        model = jaxroll.presets.get(name)
        for n in arguments.lengths:
            target = jnp.full(n, 1.0 / n)
            functions = {}
            for label, settled in variants.items():
                if settled == "influence":
                    profile = lambda m: jaxroll.influence(m, n)  # noqa: E731
                else:
                    profile = lambda m, s=settled: jaxroll.rollout.influence_on_path(  # noqa: E731
                        m, n, _with_settled(plan(m, n), s))[0]
                functions[label, "forward"] = compiled(profile, model)
                functions[label, "grad"] = compiled(
                    jax.grad(lambda m, p=profile: jaxroll.metrics.wasserstein(p(m), target)), model)
            times = {key: [] for key in functions}
            for _ in range(arguments.repeats):
                for key, function in functions.items():
                    start = time.perf_counter()
                    jax.block_until_ready(function(model))
                    times[key].append(time.perf_counter() - start)
            for label in variants:
                f, g = min(times[label, "forward"]), min(times[label, "grad"])
                print(f"{name} | {n} | {label} | {f:.4f} | {g:.4f} | {g / f:.2f} | "
                      f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
