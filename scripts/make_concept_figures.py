"""Draw the Concepts page's figures, one per force: ``docs/figures/force_*.png``.

MPT-7B's published configuration (N = 256, measured lambdas, standard ALiBi
slopes, no content) taken apart by `jaxroll.theory.ladder`: causal masking
alone, + residuals, + ALiBi, then diagonal content d = -2, 0, +2 added to
every head. Each figure shows the rung that adds the force beside the rung
before it, with the centre of mass (the drift `theory.forces` reports).

    python3 scripts/make_concept_figures.py [--out docs/figures]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import metrics, theory  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 150_000


def _profile(model) -> np.ndarray:
    return np.asarray(jaxroll.influence(model), dtype=np.float64)


def _label(name: str, p: np.ndarray) -> str:
    return f"{name} (centre of mass {float(metrics.center_of_mass(jnp.asarray(p))):.3f})"


def _figure(title: str, curves, log: bool = False):
    figure, axes = plt.subplots(figsize=(7, 3.2), dpi=90)
    for name, p, style in curves:
        axes.plot(np.arange(p.size), p, style, label=_label(name, p), linewidth=1.4)
    if log:
        axes.set_yscale("log")
    axes.set_xlabel("token position j")
    axes.set_ylabel("influence p[j]" + " (log axis)" * log)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    model = jaxroll.published.load("mpt-7b")
    causal, residual, alibi, _ = (_profile(rung) for rung in theory.ladder(model))
    content = {d: _profile(dataclasses.replace(model, diagonal_scores=jnp.full_like(model.diagonal_scores, d)))
               for d in (-2.0, 0.0, 2.0)}
    start = np.zeros_like(causal)
    start[-1] = 1.0
    figures = {
        "force_causal": _figure(
            "MPT-7B, causal masking alone (lambda = 1, no ALiBi): collapse onto token 0",
            [("causal masking alone", causal, "C3-")], log=True),
        "force_residual": _figure(
            f"MPT-7B: + residuals (measured lambdas); causal alone has p[0] = {causal[0]:.3f}",
            [("causal + residuals", residual, "C0-")]),
        "force_alibi": _figure(
            "MPT-7B: + ALiBi (standard slopes) moves influence toward the end",
            [("causal + residuals", residual, "C0--"), ("causal + residuals + ALiBi", alibi, "C2-")]),
        "force_content": _figure(
            "MPT-7B with ALiBi: diagonal content d added to every head",
            [("d = -2", content[-2.0], "C3-"), ("d = 0", content[0.0], "k--"), ("d = +2", content[2.0], "C0-")]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name, figure in figures.items():
        path = args.out / f"{name}.png"
        figure.savefig(path, facecolor="white")
        plt.close(figure)
        size = path.stat().st_size
        if size > MAX_BYTES:
            print(f"{path}: {size} bytes, over {MAX_BYTES}", file=sys.stderr)
            return 1
        print(f"wrote {path.relative_to(ROOT)} ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
