"""Draw the Closed-form baselines page's figure: ``docs/figures/baselines.png``.

Left: the Cesàro rollout (uniform causal attention, alpha = 0.15, T = 32) at
N = 256 and 2048, as ``(N + 1) p(j)`` against ``x = (j + 1)/(N + 1)``, with
the continuum density g(x) (`theory.cesaro_density`) and the atom of the last
token. Right: MPT-7B's published rollout (N = 256, no content and all
content), the median influence by distance over the rows i = 16, 24, ..., 248
(`theory.by_distance`), with the fitted ``gamma + beta (r + 1)^-p``
(`theory.fit_power_law`).

    python3 scripts/make_baselines_figure.py [--out docs/figures]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import theory  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main(out: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    alpha, layers = 0.15, 32
    for n, style in ((256, "o"), (2048, "-")):
        p = np.asarray(theory.cesaro_profile(n, alpha, layers))
        x = np.arange(1, n + 1) / (n + 1)
        left.plot(x[:-1], (n + 1) * p[:-1], style, ms=2, label=f"exact (N + 1) p(j), N = {n}")
    x = np.geomspace(1e-4, 1, 400)
    left.plot(x, np.asarray(theory.cesaro_density(x, alpha, layers)), "k--", lw=1, label="continuum g(x)")
    atom = float(theory.cesaro_atom(alpha, layers))
    left.set_yscale("log")
    left.set_xlabel("position x = (j + 1) / (N + 1)")
    left.set_ylabel("(N + 1) p(j)   (density of influence)")
    left.set_title(f"Cesàro rollout, alpha = {alpha}, T = {layers}\n(last token's atom {atom:.4f} not drawn)")
    left.legend(fontsize=8)

    queries = np.arange(16, 256, 8)
    for content, colour in ((None, "C0"), ("all", "C3")):
        rows = np.asarray(jaxroll.rollout_matrix(jaxroll.published.load("mpt-7b", content)))
        r, median = theory.by_distance(rows[queries], queries, "median")
        keep = r <= 127
        fit = theory.fit_power_law(r[keep], median[keep])
        label = "no content" if content is None else "all content"
        right.plot(r[keep] + 1, median[keep], ".", color=colour, ms=3, label=f"rollout, {label}")
        low, high = fit.interval[2]
        right.plot(r[keep] + 1, np.asarray(theory.power_law(r[keep], *fit.parameters)), "-", color=colour, lw=1,
                   label=f"fit: p = {fit.p:.2f} [{low:.2f}, {high:.2f}]")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("distance r + 1 = i - j + 1")
    right.set_ylabel("median influence over query rows i")
    right.set_title("MPT-7B (published, N = 256): influence by distance\nand gamma + beta (r + 1)^-p")
    right.legend(fontsize=8)
    figure.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "baselines.png", dpi=110)
    print(f"wrote {out / 'baselines.png'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    main(parser.parse_args().out)
