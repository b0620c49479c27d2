"""`jaxroll.influence` of a concrete preset (the CLI's path), least of R warm calls.

    PYTHONPATH=TREE python3 benchmarks/concrete_forward.py [--presets bloom-176b mpt-7b] [--lengths 8192 65536 262144]

The model's arrays are concrete, so `influence` makes its static choices
(the shared kernel, slopes read outside the scan, the shortest settled
prefix) before compiling; `benchmarks/gradient_ratio.py` times the traced
path (under `jit`). The package comes from PYTHONPATH: run it on two trees
in turn to compare them. Never run in CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

import jaxroll


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["bloom-176b", "mpt-7b"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536, 262144])
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device.platform}:{device.device_kind}, "
          f"jax {jax.__version__}, jaxroll from {os.path.dirname(jaxroll.__file__)}, least of {arguments.repeats}")
    print("preset | N | forward ms | load")
    for name in arguments.presets:
        for n in arguments.lengths:
            model = jaxroll.presets.get(name, n)
            jax.block_until_ready(jaxroll.influence(model, n))
            times = []
            for _ in range(arguments.repeats):
                start = time.perf_counter()
                jax.block_until_ready(jaxroll.influence(model, n))
                times.append(time.perf_counter() - start)
            print(f"{name} | {n} | {min(times) * 1e3:.1f} | {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
