"""Influence-profile timings: jaxroll structured vs jaxroll dense vs plain NumPy.

One run prints a table and writes it as CSV: for each case N, T, H, method,
seconds (median of repeats, after compilation; compile time separate), peak
resident memory of the process so far, and the speed-up against (a) a plain
NumPy float64 dense rollout written here (dense kernels, full matrices
multiplied layer by layer, as the paper's published code does; only where
it fits, N <= 2048) and (b) jaxroll's own dense method, both measured in the
same run. Gradient cases time ``jax.grad`` of a Wasserstein loss with respect
to every model array, relative to the forward pass. ``--accuracy N`` compares
structured float32 and float64 against the NumPy float64 dense rollout on
every reference configuration at length N.

``--small N`` (default 256) times the published BLOOM-176B at the authors'
length, float32, no content (one kernel in every layer) and all content
(per-layer kernels), against a dense rollout written here in PyTorch
(float32 and float64; head-mixed kernel built once and reused, or built per
layer) and against jaxroll's per-layer products (`rollout_row`, the path
of a model whose layers do not share one kernel), all in the same run.

To time the structured products of commit 9cef2d8 beside today's,
`git show 9cef2d8:benchmarks/_baseline_structured.py` restores that copy.

Never run in CI. JAX picks the device (a GPU if there is one).

    python3 benchmarks/influence.py --out benchmarks/influence.csv
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxroll
from _common import print_row, timed, timed_together  # noqa: E402  (benchmarks/ is on sys.path when a script runs)

REFERENCE_CONFIGS = jaxroll.published.ROOT  # the authors' configurations, shipped in the package


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def numpy_dense_rollout(model, n: int) -> np.ndarray:
    """The baseline: dense float64 kernels and full ``P_T = R_T ... R_1``."""
    product = np.eye(n)
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    keep = offsets >= 0 if model.mask == "causal" else np.ones((n, n), bool)
    if model.mask == "sliding":
        keep = (offsets >= 0) & (offsets < model.window)
    tau = float(model.temperature)
    for t in range(model.num_layers):
        weights = np.asarray(model.head_weights[t], np.float64)
        weights = weights / weights.sum()
        kernel = np.zeros((n, n))
        for h in range(model.num_heads):
            scores = (-float(model.alibi_slopes[t, h]) * offsets
                      + float(model.diagonal_scores[t, h]) * np.eye(n)) / tau
            scores = np.where(keep, scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            kernel += weights[h] * scores / scores.sum(axis=1, keepdims=True)
        lam = float(model.lambdas[t])
        product = ((1 - lam) * np.eye(n) + lam * kernel) @ product
    return product[-1]


@functools.partial(jax.jit, static_argnames=("n",))
def per_layer_influence(model, n: int):
    """The profile by the per-layer O(H N) products only (no shared dense kernel)."""
    row = jaxroll.rollout_row(model, jnp.zeros(n, dtype=jnp.result_type(float)).at[n - 1].set(1.0))
    return row / jnp.sum(row)


def torch_dense(model, n: int, dtype: str, once: bool):
    """A hand-written dense PyTorch rollout: head-mixed causal kernel, T vector-matrix products.

    ``once``: the kernel of layer 0 is built once and reused in every layer
    (right only when every layer has the same kernel); else built per layer.
    """
    import torch

    torch_dtype = getattr(torch, dtype)
    slopes = torch.tensor(np.asarray(model.alibi_slopes), dtype=torch_dtype)
    content = torch.tensor(np.asarray(model.diagonal_scores), dtype=torch_dtype)
    weights = torch.tensor(np.asarray(model.head_weights), dtype=torch_dtype)
    weights = weights / weights.sum(-1, keepdim=True)
    lambdas = torch.tensor(np.asarray(model.lambdas), dtype=torch_dtype)
    tau = float(model.temperature)
    offsets = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).to(torch_dtype)
    eye = torch.eye(n, dtype=torch_dtype)
    mask = offsets < 0

    def kernel(t):
        scores = (-slopes[t][:, None, None] * offsets + content[t][:, None, None] * eye) / tau
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.einsum("h,hij->ij", weights[t], torch.softmax(scores, dim=-1))

    def run():
        with torch.no_grad():
            row = torch.zeros(n, dtype=torch_dtype)
            row[-1] = 1.0
            shared = kernel(0) if once else None
            for t in reversed(range(len(lambdas))):
                a = shared if once else kernel(t)
                row = (1 - lambdas[t]) * row + lambdas[t] * (row @ a)
            return row / row.sum()

    return run


def small_n_cases(n: int, repeats: int):
    """BLOOM-176B at length n, float32: jaxroll now, jaxroll's per-layer path, torch dense."""
    import torch

    torch.set_num_threads(1)  # one thread: on the shared 2-core CPU two OpenMP threads competed with the load
    rows = []
    for content in (None, "all"):
        model = jax.tree.map(lambda x: jnp.asarray(np.asarray(x), jnp.float32),
                             jaxroll.published.load("bloom-176b", content=content))
        functions = {"jaxroll influence": lambda: jaxroll.influence(model, n),
                     "jaxroll per-layer products (before)": lambda: per_layer_influence(model, n)}
        for dtype in ("float32", "float64"):
            if content is None:
                functions[f"torch dense {dtype}, kernel once"] = torch_dense(model, n, dtype, True)
            functions[f"torch dense {dtype}, kernel per layer"] = torch_dense(model, n, dtype, False)
        times = timed_together(functions, repeats)
        reference = np.asarray(jaxroll.influence(model, n), np.float64)
        ours = times["jaxroll influence"]
        for name, seconds in times.items():
            result = np.asarray(functions[name](), np.float64)
            row = {"case": f"bloom-176b {content or 'no'} content", "N": n, "T": model.num_layers,
                   "H": model.num_heads, "method": name, "device": jax.devices()[0].platform,
                   "seconds": seconds, "repeats": repeats, "peak_rss_mib": peak_rss_mib(),
                   "ratio_to_jaxroll": seconds / ours,
                   "max_abs_diff_vs_jaxroll": float(np.max(np.abs(result - reference))), "load": load()}
            rows.append(row)
            print_row(row, COLUMNS)
    return rows


def run_cases(lengths, presets, repeats_for, dense_max, numpy_max):
    rows = []
    for name in presets:
        model = jaxroll.presets.get(name)
        for n in lengths:
            repeats = repeats_for(n)
            structured, compile_s = timed(lambda: jaxroll.influence(model, n, method="structured"), repeats)
            row = {"case": name, "N": n, "T": model.num_layers, "H": model.num_heads,
                   "method": "structured", "device": jax.devices()[0].platform,
                   "seconds": structured, "compile_seconds": compile_s, "repeats": repeats,
                   "peak_rss_mib": peak_rss_mib(), "speedup_vs_numpy": "", "speedup_vs_dense": ""}
            if n <= dense_max:
                dense, _ = timed(lambda: jaxroll.influence(model, n, method="dense"), 1)
                row["speedup_vs_dense"] = dense / structured
                rows.append({**row, "method": "jaxroll dense", "seconds": dense, "compile_seconds": "",
                             "repeats": 1, "speedup_vs_numpy": "", "speedup_vs_dense": ""})
            if n <= numpy_max:
                start = time.perf_counter()
                numpy_dense_rollout(model, n)
                baseline = time.perf_counter() - start
                row["speedup_vs_numpy"] = baseline / structured
                rows.append({**row, "method": "numpy dense (baseline)", "seconds": baseline,
                             "compile_seconds": "", "repeats": 1, "speedup_vs_numpy": 1.0,
                             "speedup_vs_dense": ""})
            rows.append(row)
            print_row(row, COLUMNS)
    return rows


def _compiled(function, *args):
    """Compiled ahead of time: the executable no longer depends on JAX's caches or module flags."""
    return jax.jit(function).lower(*args).compile()


def _autodiff_product():
    """The causal product with an autodiff VJP: its backward re-runs the branch under `jax.vjp`.

    The same forward as `structured_adjoint._causal_product` (the stationary
    split where it is exact, else head chunks); only the reverse mode
    differs, so the hand-written adjoint is timed against the VJP it replaced.
    """
    from jaxroll.engine import structured_adjoint, structured_products

    @functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
    def product(v, a, c, weights, prefix, head_chunk, block, settled=False):
        return structured_adjoint._causal_product(v, a, c, weights, prefix, head_chunk, block, settled)

    def backward(prefix, head_chunk, block, settled, inputs, cotangent):
        v, a, c, weights = inputs
        n = v.shape[-1]

        def pull(function):
            return lambda: jax.vjp(function, *inputs)[1](cotangent)

        split = pull(lambda *x: structured_products._causal_mixture(*x, min(prefix, n), block))
        if n <= prefix or settled:
            return split()
        exact = pull(lambda *x: structured_products._chunked_product(*x, "causal", None, head_chunk, block))
        return jax.lax.cond(structured_adjoint._settled(a, weights, prefix), split, exact)

    product.defvjp(structured_adjoint._causal_product_forward, backward)
    return product


def gradient_cases(lengths, presets, repeats: int = 3):
    """grad of W1 / forward, with the hand-written adjoint and with the autodiff VJP before it, interleaved.

    The autodiff VJP (`_autodiff_product`, re-running the
    forward under `jax.vjp`) is put in place of `structured._causal_product`
    while its gradient is traced (the library has no switch for it); both
    gradients are compiled ahead of time, so they are timed round by round
    in one run.
    """
    from jaxroll.engine import structured

    autodiff = _autodiff_product()

    rows = []
    for name in presets:
        model = jaxroll.presets.get(name)
        for n in lengths:
            target = jnp.full(n, 1.0 / n)

            def loss(m):
                return jaxroll.metrics.wasserstein(jaxroll.influence(m, n, method="structured"), target)

            functions = {"forward": _compiled(lambda m: jaxroll.influence(m, n, method="structured"), model)}
            adjoint = structured._causal_product
            for label, product in (("grad W1, autodiff VJP (before)", autodiff),
                                   ("grad W1, hand-written adjoint", adjoint)):
                structured._causal_product = product
                jax.clear_caches()
                try:
                    functions[label] = _compiled(jax.grad(loss), model)
                finally:
                    structured._causal_product = adjoint
            jax.clear_caches()
            times = timed_together({k: functools.partial(f, model) for k, f in functions.items()}, repeats)
            for label, seconds in times.items():
                row = {"case": name, "N": n, "T": model.num_layers, "H": model.num_heads,
                       "method": label, "device": jax.devices()[0].platform, "seconds": seconds,
                       "repeats": repeats, "peak_rss_mib": peak_rss_mib(),
                       "grad_over_forward": seconds / times["forward"], "load": load()}
                rows.append(row)
                print_row(row, COLUMNS)
    return rows


def load() -> str:
    """The 1-, 5- and 15-minute load averages (as `uptime` prints them)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def accuracy(n: int) -> None:
    """Structured float32/float64 vs the NumPy float64 dense rollout, every reference config."""
    worst32 = worst64 = 0.0
    for path in sorted((REFERENCE_CONFIGS / "rollout").rglob("*.yaml")):
        model = jaxroll.load_config(path)
        expected = numpy_dense_rollout(model, n)
        with jax.enable_x64(True):
            model64 = jax.tree.map(lambda x: jnp.asarray(np.asarray(x), jnp.float64), model)
            error64 = float(np.max(np.abs(np.asarray(jaxroll.influence(model64, n)) - expected)))
        error32 = float(np.max(np.abs(np.asarray(jaxroll.influence(model, n)) - expected)))
        worst32, worst64 = max(worst32, error32), max(worst64, error64)
        print(f"  {path.relative_to(REFERENCE_CONFIGS)}: float32 {error32:.2e}, float64 {error64:.2e}", flush=True)
    print(f"accuracy at N = {n}: max abs error float32 {worst32:.2e}, float64 {worst64:.2e}")


COLUMNS = ["case", "N", "T", "H", "method", "device", "seconds", "compile_seconds", "repeats",
           "peak_rss_mib", "speedup_vs_numpy", "speedup_vs_dense", "ratio_to_jaxroll",
           "max_abs_diff_vs_jaxroll", "grad_over_forward", "load"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[256, 2048, 65536, 1048576])
    parser.add_argument("--presets", nargs="+", default=["bloom-176b", "mpt-7b"])
    parser.add_argument("--gradient-lengths", type=int, nargs="*", default=[4096, 65536])
    parser.add_argument("--dense-max", type=int, default=2048, help="largest N for jaxroll dense")
    parser.add_argument("--numpy-max", type=int, default=2048, help="largest N for the NumPy baseline")
    parser.add_argument("--small", type=int, default=256, metavar="N",
                        help="length of the small-N comparison with torch (0: skip)")
    parser.add_argument("--small-repeats", type=int, default=9)
    parser.add_argument("--gradient-repeats", type=int, default=3)
    parser.add_argument("--accuracy", type=int, default=None, metavar="N",
                        help="also check every reference config at length N")
    parser.add_argument("--out", type=Path, default=Path("influence.csv"))
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    arguments = parser.parse_args(argv)
    if arguments.out.exists() and not arguments.force:
        print(f"influence.py: error: {arguments.out} exists; pass --force to overwrite", file=sys.stderr)
        return 2
    print(f"devices: {jax.devices()}; load average {load()}")
    print(" | ".join(COLUMNS))
    rows = small_n_cases(arguments.small, arguments.small_repeats) if arguments.small else []
    rows += run_cases(arguments.lengths, arguments.presets,
                      lambda n: 1 if n >= 2**20 else (2 if n >= 2**17 else 5),
                      arguments.dense_max, arguments.numpy_max)
    rows += gradient_cases(arguments.gradient_lengths, arguments.presets, arguments.gradient_repeats)
    with open(arguments.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {arguments.out}")
    if arguments.accuracy:
        accuracy(arguments.accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
