"""Where one layer's causal product and its hand-written adjoint spend their time, part by part.

    python3 benchmarks/adjoint_parts.py [--lengths 4096 65536] [--preset bloom-176b]

One layer of the preset (its first layer's slopes, content 0, equal head
weights), float32, compiled ahead of time, least of 7 warm calls. The forward
product (`structured._causal_product`) is the unit: every row gives
``seconds / forward``. Parts of the forward pass: the normaliser tables of the
first P rows (`_causal_tables`), the per-head prefix sums (`_prefix_mixture`),
the head-mixed sums beyond P (`_mixture_reverse_cumsum`). Parts of the
adjoint: the exact rows (`_exact_adjoint`: tables, their slope derivatives,
per-head forward sums F and dF/da), and beyond P the head-mixed forward sums
(the cotangent of v) with the per-head bilinear forms and their slope
derivatives (`_stationary_sums`, one pass).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jaxroll  # noqa: E402
from jaxroll import structured_adjoint as adjoint  # noqa: E402
from jaxroll import structured_products as products  # noqa: E402


def least(function, *args, repeats: int = 7) -> float:
    compiled = jax.jit(function).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def parts(n: int, preset: str) -> list[tuple[str, float]]:
    model = jaxroll.presets.get(preset)
    a = jnp.asarray(np.asarray(model.alibi_slopes)[0], jnp.float32)
    heads = a.shape[0]
    c, w = jnp.zeros(heads, jnp.float32), jnp.full(heads, 1.0 / heads, jnp.float32)
    rng = np.random.default_rng(0)
    v, g = (jnp.asarray(rng.random(n), jnp.float32) for _ in range(2))
    prefix = min(adjoint._prefix_length(jnp.float32), n)
    block = products.BLOCK
    tables = products._causal_tables(a, c, prefix, block)
    carried = jnp.zeros_like(a)
    rows = [
        ("forward product", least(lambda v, a, c, w: adjoint._causal_product(v, a, c, w, prefix, 16, block), v, a, c, w)),
        ("  tables of the first P rows", least(lambda a, c: products._causal_tables(a, c, prefix, block), a, c)),
        ("  per-head prefix sums", least(lambda v, s: products._prefix_mixture(v[:prefix], a, w, s, carried,
                                                                                 adjoint._PREFIX_BLOCK), v, tables[1])),
        ("adjoint", least(lambda v, g, a, c, w: adjoint._causal_adjoint(v, g, a, c, w, prefix, 16, block), v, g, a, c, w)),
        ("  exact rows (tables, F, dF/da)", least(lambda v, g: adjoint._exact_adjoint(v[:prefix], g[:prefix], a, c, w,
                                                                                      adjoint._PREFIX_BLOCK), v, g)),
    ]
    if prefix < n:
        rows[3:3] = [("  head-mixed sums beyond P", least(
            lambda v: products._mixture_reverse_cumsum(v[prefix:], a, w, block), v))]
        rows += [("  beyond P: mixed forward sums, bilinear forms, d/da", least(
            lambda v, g: adjoint._stationary_sums(v[prefix:], g[prefix:], a, w, carried, carried, block), v, g))]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--preset", default="bloom-176b")
    arguments = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device.platform}:{device.device_kind}, "
          f"jax {jax.__version__}, {arguments.preset} layer 0, float32, least of 7; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("N | part | ms | / forward product")
    for n in arguments.lengths:
        table = parts(n, arguments.preset)
        unit = table[0][1]
        for name, seconds in table:
            print(f"{n} | {name} | {seconds * 1e3:.3f} | {seconds / unit:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
