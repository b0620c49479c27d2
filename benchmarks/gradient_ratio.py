"""grad of W1 / forward pass of `jaxroll.influence`, interleaved, least of R warm calls.

    PYTHONPATH=TREE python3 benchmarks/gradient_ratio.py [--presets bloom-176b] [--lengths 4096 65536]

Forward: ``jax.jit(lambda m: jaxroll.influence(m, n))``; gradient:
``jax.jit(jax.grad(lambda m: jaxroll.metrics.wasserstein(jaxroll.influence(m, n), uniform)))``
with respect to every model array; both compiled ahead of time, then
called alternately `--repeats` times (the least of each is printed, and
their ratio). The package comes from PYTHONPATH, so two trees (before and
after a change) can be compared by running this script on each in turn.
Never run in CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

import jaxroll


def compiled(function, *args):
    executable = jax.jit(function).lower(*args).compile()
    jax.block_until_ready(executable(*args))
    return executable


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["bloom-176b"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device.platform}:{device.device_kind}, "
          f"jax {jax.__version__}, jaxroll from {os.path.dirname(jaxroll.__file__)}, least of {arguments.repeats}")
    print("preset | N | forward s | grad W1 s | grad / forward | load")
    for name in arguments.presets:
        model = jaxroll.presets.get(name)
        for n in arguments.lengths:
            target = jnp.full(n, 1.0 / n)
            forward = compiled(lambda m: jaxroll.influence(m, n), model)
            gradient = compiled(jax.grad(lambda m: jaxroll.metrics.wasserstein(jaxroll.influence(m, n), target)),
                                model)
            times = {forward: [], gradient: []}
            for _ in range(arguments.repeats):
                for function, seconds in times.items():
                    start = time.perf_counter()
                    jax.block_until_ready(function(model))
                    seconds.append(time.perf_counter() - start)
            f, g = min(times[forward]), min(times[gradient])
            print(f"{name} | {n} | {f:.4f} | {g:.4f} | {g / f:.2f} | "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
