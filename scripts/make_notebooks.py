"""Write the walk-through notebooks ``notebooks/*.ipynb`` from the cells below.

The notebooks are generated, not edited by hand, so that a review reads
this file and a diff of a notebook is a diff of its source. They are written
with their outputs stripped (CI executes them: ``tests/test_notebooks.py``;
``scripts/make_figures.py`` executes them to draw the README's figures).
Cell ids are derived from the notebook's name and the cell's index, so
running this script twice writes the same bytes.

    python3 scripts/make_notebooks.py [--check]

``--check`` writes nothing and exits 1 when a committed notebook differs
from what this script would write.

Each notebook uses only jaxroll's public API, draws with matplotlib directly
(linear axes where the U-shape is the point, log axes only for collapse), and
ends by asserting the paper claim it shows against a property computed in
plain NumPy in the notebook itself. Cells tagged ``figure:NAME`` are the
figures that `make_figures.py` copies into ``docs/figures/NAME.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from textwrap import dedent

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

# The kernel that `pip install -e '.[test]'` provides (ipykernel installs "python3").
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}

SETUP = """\
import numpy as np
import matplotlib.pyplot as plt

import jaxroll
from jaxroll import metrics

# White backgrounds: the figures are also shown in the README (dark themes too).
plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "savefig.facecolor": "white",
                     "axes.grid": True, "grid.alpha": 0.3})
"""


def md(text):
    return ("markdown", dedent(text).strip(), ())


def code(*parts, tags=()):
    """A code cell from one or more source blocks (each dedented on its own)."""
    return ("code", "\n\n".join(dedent(part).strip() for part in parts), tuple(tags))


# -- 01: the U-shape --------------------------------------------------------

U_SHAPE = [
    md("""
    # 01 · The U-shape: residual-aware vs attention-only rollout

    The controlled rollout of *A Residual-Aware Theory of Position Bias in
    Transformers* (Herasimchyk, Labryga, Prusina, Laue, arXiv 2602.16837). Each
    layer mixes the identity and an attention kernel,

    $$R_t = (1 - \\lambda_t)\\, I + \\lambda_t A_t, \\qquad P_T = R_T \\cdots R_1,
    \\qquad p_T(j) = P_T[N-1, j],$$

    where `A[i, j]` is the weight with which token i reads token j (causal ALiBi
    softmax, Press et al. 2022). `p_T` is the predicted influence of input
    position j on the last position.

    We load the five models' published configurations (lambdas measured by the
    authors on FineWeb-Edu, standard ALiBi slopes, no content; N = 256) and
    compare them with the attention-only rollout of earlier theory
    (`lambda_t = 1`, Abnar & Zuidema 2020; Wu et al. 2025), which collapses onto
    the first token.
    """),
    code(SETUP),
    code("""
    names = jaxroll.published.names()
    residual_aware, attention_only, models = {}, {}, {}
    for name in names:
        models[name] = jaxroll.published.load(name)
        residual_aware[name] = np.asarray(jaxroll.influence(models[name]), dtype=np.float64)
        attention_only[name] = np.asarray(
            jaxroll.influence(jaxroll.published.load(name, residual=False)), dtype=np.float64)
    N = residual_aware[names[0]].size

    print(f"{'model':<14}{'T':>4}{'H':>5}{'sum lambda':>12}{'p[0]':>9}{'p[-1]':>9}{'argmin':>8}"
          f"{'u_index':>9}{'attention-only p[0]':>21}")
    for name in names:
        p, model = residual_aware[name], models[name]
        print(f"{name:<14}{model.num_layers:>4}{model.num_heads:>5}{float(np.sum(model.lambdas)):>12.3f}"
              f"{p[0]:>9.4f}{p[-1]:>9.4f}{int(np.argmin(p)):>8}{float(metrics.u_index(p)):>9.3f}"
              f"{attention_only[name][0]:>21.6f}")
    """),
    md("""
    Linear axes: the U is the point. Each model's profile is high at the first
    tokens (causal masking drifts mass to the start), high at the last tokens
    (the residual path keeps it there, helped by ALiBi), and lowest in the
    middle ("lost in the middle"). The last panel shows, on a log axis, what
    the attention-only rollout does with the same kernels: nearly all
    influence on token 0.
    """),
    code("""
    positions = np.arange(N)
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), constrained_layout=True)
    for k, (ax, name) in enumerate(zip(axes.flat, names)):
        p = residual_aware[name]
        lowest = int(np.argmin(p))
        ax.plot(positions, p, color=f"C{k}", label="residual-aware")
        ax.axhline(1 / N, color="0.5", linestyle=":", linewidth=1, label="uniform 1/N")
        ax.plot([lowest], [p[lowest]], "ko", markersize=4, label=f"minimum at j = {lowest}")
        ax.set_ylim(0, 1.1 * p.max())
        ax.set_title(f"{name} (T = {models[name].num_layers}, measured lambdas)", fontsize=10)
        ax.set_xlabel("input position j (tokens)")
        ax.set_ylabel("influence p_T(j) (probability)")
        ax.legend(fontsize=8, loc="upper center")
    ax = axes.flat[-1]
    for k, name in enumerate(names):
        ax.plot(positions, np.maximum(attention_only[name], 1e-30), color=f"C{k}", linestyle="--",
                label=f"{name}: p[0] = {attention_only[name][0]:.4f}")
    ax.set_yscale("log")
    ax.set_ylim(1e-30, 2)
    ax.set_title("attention-only rollout (lambda = 1)\\ncollapses onto token 0", fontsize=10)
    ax.set_xlabel("input position j (tokens)")
    ax.set_ylabel("influence p_T(j) (log scale)")
    ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Influence of each input position on the last one, N = {N} (arXiv 2602.16837)");
    """, tags=["figure:u_shape"]),
    md("""
    **The claims, checked in plain NumPy.** Attention-only: `p[0] > 0.99` for
    every model. Residual-aware: the minimum lies strictly inside, both ends
    are above it, and the first and last tenth carry more mass per position
    than the middle. (float32 profiles: they sum to 1 within 1e-4.)
    """),
    code("""
    k = round(0.1 * N)
    for name in names:
        p, q = residual_aware[name], attention_only[name]
        assert abs(p.sum() - 1) < 1e-4 and abs(q.sum() - 1) < 1e-4, name
        assert q[0] > 0.99, (name, q[0])
        lowest = int(np.argmin(p))
        assert 0 < lowest < N - 1 and p[0] > p[lowest] and p[-1] > p[lowest], name
        middle = p[k:N - k].mean()
        assert p[:k].mean() > middle and p[-k:].mean() > middle, name
    print("attention-only collapses and residual-aware is U-shaped for all", len(names), "models")
    """),
]


# -- 02: the four forces ----------------------------------------------------

FOUR_FORCES = [
    md("""
    # 02 · The four forces and the sign of content

    At finite depth four forces shape the profile (arXiv 2602.16837, for
    stochastically monotone kernels): **causal masking** drifts mass toward
    early positions (primacy), the **residual** identity path keeps it at late
    positions (recency), **ALiBi** adds recency, and **diagonal content**
    `d` adds recency when positive and primacy when negative. Head h of layer t
    scores `s(i, j) = -m (i - j) + d [i == j]` on the allowed entries j <= i.

    `jaxroll.theory.forces` builds a ladder, each rung adding one force:
    causal masking alone (`lambda = 1`, no slopes, no content), + residuals
    (the measured lambdas), + ALiBi (the slopes), + content (the measured
    per-head diagonal scores, `content="all"`, FineWeb-Edu). The drift of a
    force is the change in centre of mass `sum_j j p(j) / (N - 1)` (0 = first
    token, 1 = last) that it adds; the ladder starts from `e_{N-1}` (centre 1).
    """),
    code(SETUP),
    code("""
    from jaxroll import theory

    names = jaxroll.published.names()
    ladders = {name: theory.forces(jaxroll.published.load(name, content="all")) for name in names}
    FORCES = theory.FORCES
    N = ladders[names[0]].profiles.shape[-1]

    def center_of_mass(p):
        # Computed here in NumPy, independently of jaxroll.metrics.
        p = np.asarray(p, dtype=np.float64)
        return (p * np.arange(p.shape[-1])).sum(-1) / (p.shape[-1] - 1)

    drifts = {name: np.diff(center_of_mass(ladders[name].profiles), prepend=1.0) for name in names}
    print(f"{'model':<14}" + "".join(f"{force:>11}" for force in FORCES))
    for name in names:
        print(f"{name:<14}" + "".join(f"{value:>+11.4f}" for value in drifts[name]))
    """),
    code("""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    name = "mpt-7b"
    positions = np.arange(N)
    labels = ["+ residual (measured lambdas)", "+ ALiBi", "+ content (measured, per head)"]
    for k, (profile, label) in enumerate(zip(np.asarray(ladders[name].profiles)[1:], labels), start=1):
        left.plot(positions, profile, color=f"C{k}", label=label)
    left.set_ylim(0, 0.06)
    left.set_title(f"{name}: the force ladder, N = {N} (causal-only rung: p[0] = "
                   f"{float(ladders[name].profiles[0, 0]):.3f}, off scale)", fontsize=10)
    left.set_xlabel("input position j (tokens)")
    left.set_ylabel("influence p_T(j) (probability)")
    left.legend(fontsize=8)

    width = 0.8 / len(FORCES)
    x = np.arange(len(names))
    for k, force in enumerate(FORCES):
        right.bar(x + (k - 1.5) * width, [drifts[name][k] for name in names], width, color=f"C{k}",
                  label=force if k == 0 else f"+ {force}")
    right.axhline(0, color="k", linewidth=0.8)
    right.set_xticks(x, names, fontsize=9)
    right.set_ylabel("drift of the centre of mass (fraction of N)")
    right.set_title("What each force adds (negative: primacy, positive: recency)", fontsize=10)
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle("The four forces on the five published models (arXiv 2602.16837)");
    """, tags=["figure:four_forces"]),
    md("""
    ## The content sign

    One model's measured lambdas and slopes (MPT-7B), with the same diagonal
    content `d` in every head and layer: `d > 0` (tokens read themselves more)
    pushes influence to late positions, `d < 0` to early ones. Linear axes.
    """),
    code("""
    base = jaxroll.published.load("mpt-7b")
    scores = (-2.0, 0.0, 2.0)
    signed = {d: np.asarray(jaxroll.influence(jaxroll.RolloutModel.create(
        num_layers=base.num_layers, num_heads=base.num_heads, lambdas=base.lambdas,
        alibi_slopes=base.alibi_slopes, diagonal_scores=d)), dtype=np.float64) for d in scores}

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for d, color in zip(scores, ("C3", "0.3", "C0")):
        ax.plot(np.arange(N), signed[d], color=color,
                label=f"d = {d:+.0f}: centre of mass {center_of_mass(signed[d]):.3f}")
    ax.set_xlabel("input position j (tokens)")
    ax.set_ylabel("influence p_T(j) (probability)")
    ax.set_ylim(0, None)
    ax.set_title("mpt-7b: diagonal content d in every head (N = 256)", fontsize=10)
    ax.legend(fontsize=9);
    """, tags=["figure:content_sign"]),
    md("""
    **The claims, checked in plain NumPy.** On every model causal masking has
    drift < 0, residuals and ALiBi > 0. The content sign: the profiles' CDFs
    `F(j) = sum_{k <= j} p(k)` are ordered, `F_{+2} <= F_0 <= F_{-2}` at every j
    (stochastic dominance, which the theory proves for these monotone kernels),
    within 1e-5 for float32 rounding of a 256-term cumulative sum, and the
    centres of mass strictly so.
    """),
    code("""
    for name in names:
        causal, residual, alibi, content = drifts[name]
        assert causal < 0 and residual > 0 and alibi > 0, (name, drifts[name])
    negative, zero, positive = (np.cumsum(signed[d]) for d in scores)
    assert np.all(positive <= zero + 1e-5) and np.all(zero <= negative + 1e-5)
    assert center_of_mass(signed[2.0]) > center_of_mass(signed[0.0]) > center_of_mass(signed[-2.0])
    print("forces have the stated signs; positive content adds recency, negative adds primacy")
    """),
]


# -- 03: the depth dichotomy ------------------------------------------------

DEPTH = [
    md("""
    # 03 · Depth: finite vs infinite total mixing

    Under causal masking `P_T` is lower triangular, so its diagonal is a
    product of scalars,

    $$P_T[i, i] = \\prod_t \\bigl(1 - \\lambda_t + \\lambda_t A_t[i, i]\\bigr).$$

    For a token i > 0 with `A_t[i, i] <= 1 - delta` this stays bounded away
    from 0 **iff** the total mixing `sum_t lambda_t` is finite: finite total
    mixing, no collapse; infinite total mixing, all influence collapses onto
    token 0 (arXiv 2602.16837). With the power-decay schedule
    `lambda_t = lambda_0 / (t + 1)^beta`, `beta > 1` is finite and
    `beta <= 1` infinite.

    One kernel in every layer (MPT-7B's first layer, n = 32 tokens),
    `lambda_0 = 0.5`, depths up to 10^5 layers, by `jaxroll.theory.depth_profile`
    (one `lax.scan`). float64, since the diagonal falls below 1e-100.
    """),
    code("""
    import jax

    jax.config.update("jax_enable_x64", True)
    """, SETUP),
    code("""
    from jaxroll import schedules, theory

    n, lambda_0, betas = 32, 0.5, (0.5, 1.0, 1.5, 2.0)
    kernel = np.asarray(jaxroll.attention_kernel(jaxroll.published.load("mpt-7b"), layer=0, n=n))
    depths = np.unique(np.round(np.logspace(0, 5, 41)).astype(np.int64))
    results = {beta: theory.depth_profile(kernel, schedules.power_decay(lambda_0, beta, int(depths[-1])), depths)
               for beta in betas}
    delta = 1 - np.diag(kernel).min()   # max_i (1 - A[i, i]), in NumPy
    print(f"delta = {delta:.4f}")
    print(f"{'beta':>5}{'T':>8}{'sum lambda':>12}{'min_i P[i,i]':>14}{'collapse mass':>15}")
    for beta in betas:
        r = results[beta]
        for index in (np.searchsorted(depths, 100), len(depths) - 1):
            print(f"{beta:>5}{int(depths[index]):>8}{float(r.total_mixing[index]):>12.4g}"
                  f"{float(r.diagonal_min[index]):>14.3e}{float(r.collapse_mass[index]):>15.6f}")
    """),
    md("""
    Left: the total mixing grows without bound for `beta <= 1`. Middle: the
    smallest diagonal entry `min_i P_T[i, i]` against depth, with the bound
    `exp(-delta sum_t lambda_t)` dashed: it levels off for `beta > 1` and falls
    to 0 for `beta <= 1`. Right: `collapse_mass = min_i P_T[i, 0]`, the least
    influence of token 0 on any token (linear axis), rises to 1 only when the
    total mixing diverges (for `beta = 1` only logarithmically slowly).
    """),
    code("""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), constrained_layout=True)
    for k, beta in enumerate(betas):
        r = results[beta]
        style = dict(color=f"C{k}", label=f"beta = {beta}" + (" (finite)" if beta > 1 else " (infinite)"))
        axes[0].loglog(depths, np.asarray(r.total_mixing), **style)
        axes[1].loglog(depths, np.asarray(r.diagonal_min), **style)
        axes[1].loglog(depths, np.exp(-delta * np.asarray(r.total_mixing)), color=f"C{k}", linestyle=":")
        axes[2].semilogx(depths, np.asarray(r.collapse_mass), **style)
    axes[0].set_ylabel("total mixing sum_t lambda_t")
    axes[1].set_ylabel("min_i P_T[i, i]")
    axes[1].set_ylim(1e-130, 2)
    axes[2].set_ylabel("collapse mass min_i P_T[i, 0]")
    axes[2].set_ylim(0, 1.02)
    titles = ("total mixing", "smallest diagonal (dotted: exp(-delta sum lambda))", "collapse onto token 0")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("depth T (layers)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"Depth dichotomy: mpt-7b layer-1 kernel, n = {n}, lambda_t = {lambda_0} / (t + 1)^beta");
    """, tags=["figure:depth_dichotomy"]),
    md("""
    **The claims, checked in plain NumPy.** With one kernel in every layer,
    `min_i P_T[i, i]` equals the product bound `prod_t (1 - lambda_t delta)`,
    recomputed here from `delta` and the schedule (relative 1e-9: a log-sum of
    up to 10^5 float64 terms). For `beta > 1` the diagonal levels off (it
    loses less than 10 % between 10^4 and 10^5 layers); for `beta <= 1` it
    keeps falling, and for `beta = 0.5` the collapse mass exceeds 0.99 at
    10^5 layers. The collapse mass never decreases with depth.
    """),
    code("""
    for beta in betas:
        r = results[beta]
        lambdas = lambda_0 / np.arange(1, depths[-1] + 1) ** beta
        bound = np.exp(np.cumsum(np.log1p(-lambdas * delta)))[depths - 1]
        assert np.allclose(np.asarray(r.diagonal_min), bound, rtol=1e-9, atol=0), beta
        collapse = np.asarray(r.collapse_mass)
        assert np.all(np.diff(collapse) >= -1e-12), beta
        at_1e4, at_1e5 = np.asarray(r.diagonal_min)[np.searchsorted(depths, [10_000, 100_000])]
        if beta > 1:
            assert at_1e5 > 0.9 * at_1e4, beta
        else:
            assert at_1e5 < 0.9 * at_1e4, beta
    assert float(results[0.5].collapse_mass[-1]) > 0.99
    print("finite total mixing keeps the diagonal, infinite total mixing collapses onto token 0")
    """),
]


# -- 04: fitting ------------------------------------------------------------

FIT = [
    md("""
    # 04 · Fitting a no-content model to a profile, and what it cannot tell

    `jaxroll.fit` adjusts a model's parameters so that its influence profile
    `p_T(j) = (e_{N-1}^T R_T ... R_1)_j` matches a target, by optax Adam in one
    compiled `lax.scan` (loss: `W1(p, q) / (N - 1)`, `jaxroll.metrics.wasserstein`).

    **The target.** The package ships the authors' published *configurations*,
    not measured influence profiles, so the target here is the profile of
    MPT-7B's `all_content` configuration (its measured lambdas and its measured
    per-head diagonal content, FineWeb-Edu). We fit a model **without content**
    to it, starting from the `mpt-7b` preset (a power-decay schedule): can the
    residual path alone, by its lambdas, absorb what content does? N = 128
    (under causal masking a profile at length 128 is exactly the first 128
    tokens' part of the model). float32, jaxroll's default, and the
    structured O(T H N) products (`method="structured"`), which are the fast
    path for gradients.
    """),
    code(SETUP),
    code("""
    N, STEPS, METHOD = 128, 100, "structured"
    target = np.asarray(jaxroll.influence(jaxroll.published.load("mpt-7b", content="all"), N))
    start = jaxroll.presets.get("mpt-7b")
    fits = {
        "power decay (2 parameters)": jaxroll.fit(start, target, fit="lambdas", schedule="power_decay",
                                                  steps=STEPS, n=N, method=METHOD),
        f"free schedule ({start.num_layers} lambdas)": jaxroll.fit(start, target, fit="lambdas", schedule="free",
                                                                   steps=STEPS, n=N, method=METHOD),
    }
    initial = np.asarray(jaxroll.influence(start, N))
    for label, result in fits.items():
        print(f"{label:<28} W1/(N-1): {result.initial_loss:.4f} -> {result.final_loss:.4f}   "
              f"Spearman {result.metrics.spearman:.3f}   {result.schedule_parameters or ''}")
    """),
    code("""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    positions = np.arange(N)
    left.plot(positions, target, color="k", linewidth=2.5, alpha=0.4, label="target: mpt-7b with measured content")
    left.plot(positions, initial, color="0.5", linestyle=":", label="start: mpt-7b preset, no content")
    for k, (label, result) in enumerate(fits.items()):
        left.plot(positions, result.profile, color=f"C{k}", label=f"fitted, {label}")
        right.semilogy(result.losses, color=f"C{k}", label=label)
    left.set_ylim(0, None)
    left.set_xlabel("input position j (tokens)")
    left.set_ylabel("influence p_T(j) (probability)")
    left.set_title(f"mpt-7b, N = {N}: no-content fits to a profile with content", fontsize=10)
    left.legend(fontsize=8)
    right.set_xlabel("Adam step")
    right.set_ylabel("loss W1(p, q) / (N - 1)")
    right.set_title("loss during the fit", fontsize=10)
    right.legend(fontsize=8);
    """, tags=["figure:fit"]),
    md("""
    ## The identifiability caveat

    A profile of N numbers does not pin T per-layer parameters. The Jacobian
    `d p_T / d lambda` of the profile with respect to the 32 measured lambdas
    (reverse-mode `jax.jacrev` through `jaxroll.influence`, whose structured products define a custom VJP) has singular values
    that fall by many decades: only a few combinations of the lambdas are
    determined by the profile; the rest can move with almost no effect (from
    about the 13th on they sit at float64 rounding, ~1e-17). Two
    free-schedule fits from different starts show it: nearly the same profile,
    different schedules, with similar total mixing `sum_t lambda_t`. A power-decay schedule (two parameters) is
    identifiable; per-layer values are not, however small the fit's loss.
    """),
    code("""
    import dataclasses
    import jax
    import jax.numpy as jnp

    measured = jaxroll.published.load("mpt-7b")     # measured lambdas, no content
    def profile_of(lambdas):
        return jaxroll.influence(dataclasses.replace(measured, lambdas=lambdas), N)
    # float64 for the Jacobian alone: its small singular values lie far below float32 rounding.
    with jax.enable_x64(True):
        jacobian = np.asarray(jax.jacrev(profile_of)(jnp.asarray(measured.lambdas, dtype=jnp.float64)))
    singular = np.linalg.svd(jacobian, compute_uv=False)
    print(f"singular values of d p / d lambda: {singular[0]:.3g} ... {singular[-1]:.3g} "
          f"({np.log10(singular[0] / singular[-1]):.1f} decades)")

    flat = jaxroll.RolloutModel.create(num_layers=start.num_layers, num_heads=start.num_heads, lambdas=0.15,
                                       alibi_slopes=start.alibi_slopes)
    free = {"from the preset": fits[f"free schedule ({start.num_layers} lambdas)"],
            "from constant lambda = 0.15": jaxroll.fit(flat, target, fit="lambdas", schedule="free",
                                                       steps=STEPS, n=N, method=METHOD)}
    (a, b) = free.values()
    schedule_gap = float(np.abs(np.asarray(a.model.lambdas) - np.asarray(b.model.lambdas)).max())
    profile_gap = float(metrics.wasserstein(a.profile, b.profile))
    for label, result in free.items():
        print(f"{label:<28} W1/(N-1) to target {result.final_loss:.4f}, "
              f"sum lambda {float(np.sum(result.model.lambdas)):.3f}")
    print(f"between the two fits: max |lambda difference| {schedule_gap:.3f}, W1/(N-1) of profiles {profile_gap:.4f}")
    """),
    code("""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    left.semilogy(np.arange(1, singular.size + 1), singular, "o-")
    left.set_xlabel("singular value index")
    left.set_ylabel("singular value of d p_T / d lambda (log scale)")
    left.set_title(f"mpt-7b, N = {N}: what a profile pins of 32 lambdas", fontsize=10)
    layers = np.arange(1, start.num_layers + 1)
    right.plot(layers, np.asarray(measured.lambdas), "k.-", alpha=0.5,
               label=f"measured (no-content config), sum lambda {float(np.sum(measured.lambdas)):.2f}")
    for k, (label, result) in enumerate(free.items()):
        right.plot(layers, np.asarray(result.model.lambdas), "o-", color=f"C{k}", markersize=3,
                   label=f"fitted {label}: W1 {result.final_loss:.4f}, "
                         f"sum lambda {float(np.sum(result.model.lambdas)):.2f}")
    right.set_xlabel("layer t")
    right.set_ylabel("lambda_t")
    right.set_ylim(0, None)
    right.set_title("two free fits: similar profiles, different schedules", fontsize=10)
    right.legend(fontsize=8);
    """, tags=["figure:identifiability"]),
    md("""
    **Checked.** Both fits lower the loss at least fivefold. The two free fits
    end within W1/(N-1) 0.01 of each other while their schedules differ by
    more than 0.05 in some layer, and the Jacobian's fifth singular value is
    more than four decades below its first (computed in float64, whose
    rounding is ~1e-16 of the largest).
    """),
    code("""
    for label, result in fits.items():
        assert result.final_loss < result.initial_loss / 5, label
    assert profile_gap < 0.01 and schedule_gap > 0.05, (profile_gap, schedule_gap)
    assert singular[4] < 1e-4 * singular[0]
    print("fits reproduce the profile; the per-layer schedule is not identifiable from it")
    """),
]


# -- 05: measuring ----------------------------------------------------------

MEASURE = [
    md("""
    # 05 · Measuring a model, then predicting its profile

    `jaxroll.measure` (PyTorch, the optional extra `jaxroll[measure]`) measures
    the theory's parameters on a Hugging Face causal LM, one forward and one
    backward pass per sequence:

    - `lambda_t = mean ||a|| / (||x|| + ||a||)` per block (`x` the residual
      stream entering it, `a` its attention output);
    - per layer and head the diagonal content score from the mean of `q_i . k_j`,
      in logit units;
    - the gradient influence `||d f / d e_j||` of each token embedding on the
      top next-token probability `f` at the last position, normalised to sum 1.

    No download: a tiny BLOOM (8 layers, 4 heads, hidden size 64, random
    weights with initialiser scale 0.1, so that attention contributes
    `lambda ~ 0.15`) is built here from `transformers.BloomConfig` and measured
    on 16 random token sequences of 128 tokens. Then the rollout of the
    measured lambdas, ALiBi slopes and content predicts the influence profile,
    which we compare with the measured one.
    """),
    code(SETUP, """
    import torch
    import transformers

    from jaxroll.measure import measure

    torch.set_num_threads(1)
    """),
    code("""
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=8, n_head=4, hidden_size=64, vocab_size=256, initializer_range=0.1)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    token_ids = np.random.default_rng(0).integers(0, config.vocab_size, (16, 128))

    measurement = measure(model, token_ids)     # lambda, content, influence
    rollout_model = measurement.to_rollout_model()
    predicted = np.asarray(jaxroll.influence(rollout_model), dtype=np.float64)
    attention_only = np.asarray(jaxroll.influence(jaxroll.RolloutModel.create(
        num_layers=rollout_model.num_layers, num_heads=rollout_model.num_heads, lambdas=1.0,
        alibi_slopes=rollout_model.alibi_slopes, diagonal_scores=rollout_model.diagonal_scores,
        sequence_length=rollout_model.sequence_length)), dtype=np.float64)
    measured = measurement.influence
    N = measured.size

    print("lambda_t:", np.round(measurement.lambdas, 3))
    print("ALiBi slopes (logit units):", measurement.alibi_slopes_logit)
    print("mean |diagonal content| (logit units):",
          round(float(np.abs(np.asarray(rollout_model.diagonal_scores)).mean()), 3))
    comparison = metrics.compare(predicted, measured)
    print(f"predicted vs measured: W1/(N-1) {comparison.wasserstein:.4f}, Spearman {comparison.spearman:.3f}")
    print(f"attention-only vs measured: W1/(N-1) {float(metrics.wasserstein(attention_only, measured)):.4f}")
    """),
    code("""
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4), constrained_layout=True)
    layers = np.arange(1, measurement.num_layers + 1)
    left.errorbar(layers, measurement.lambdas, yerr=measurement.lambdas_std, fmt="o-", capsize=3)
    left.set_xlabel("layer t")
    left.set_ylabel("lambda_t (mean +- sd over sequences)")
    left.set_ylim(0, None)
    left.set_title("tiny BLOOM: measured mixing lambda_t", fontsize=10)
    positions = np.arange(N)
    for ax in (middle, right):
        ax.plot(positions, measured, color="k", alpha=0.6, label="measured gradient influence")
        ax.plot(positions, predicted, color="C0", label=f"rollout prediction (W1 {comparison.wasserstein:.3f})")
        ax.set_xlabel("input position j (tokens)")
    # Linear axis for the shape; the last token (p[-1] ~ 0.3) is off this scale.
    middle.set_ylim(0, 3 * np.median(measured))
    middle.set_ylabel("influence on the last position (probability)")
    middle.set_title(f"measured vs predicted, N = {N} (last token: {measured[-1]:.2f} vs {predicted[-1]:.2f})",
                     fontsize=10)
    middle.legend(fontsize=8, loc="upper left")
    right.plot(positions, attention_only, color="C3", linestyle="--", label="attention-only rollout (lambda = 1)")
    right.set_yscale("log")
    right.set_ylabel("influence (log scale)")
    right.set_title("against the attention-only rollout", fontsize=10)
    right.legend(fontsize=8, loc="lower left")
    fig.suptitle("Measured on a tiny random BLOOM (8 layers, 4 heads, 16 sequences), then predicted by jaxroll");
    """, tags=["figure:measure"]),
    md("""
    **Checked.** The measured lambdas lie in (0, 1), both profiles sum to 1
    (1e-9, float64 measurement; 1e-4 for the float32 rollout), and the
    residual-aware prediction is closer to the measured profile (W1) than the
    attention-only rollout of the same kernels.
    """),
    code("""
    assert np.all((measurement.lambdas > 0) & (measurement.lambdas < 1))
    assert abs(measured.sum() - 1) < 1e-9 and abs(predicted.sum() - 1) < 1e-4
    assert comparison.wasserstein < float(metrics.wasserstein(attention_only, measured))
    print("the residual-aware rollout predicts the measured profile better than attention-only")
    """),
]


NOTEBOOK_CELLS = {
    "01_u_shape": U_SHAPE,
    "02_four_forces": FOUR_FORCES,
    "03_depth_dichotomy": DEPTH,
    "04_fit": FIT,
    "05_measure": MEASURE,
}


def build(name: str, cells) -> nbformat.NotebookNode:
    """One notebook, outputs stripped, with deterministic cell ids."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    for index, (kind, source, tags) in enumerate(cells):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(source, id=f"{name[:2]}-{index:02d}")
        if tags:
            cell.metadata["tags"] = list(tags)
        notebook.cells.append(cell)
    nbformat.validate(notebook)
    return notebook


def render(name: str) -> str:
    return nbformat.writes(build(name, NOTEBOOK_CELLS[name])) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a notebook is stale")
    args = parser.parse_args(argv)
    stale = []
    NOTEBOOKS.mkdir(exist_ok=True)
    for name in NOTEBOOK_CELLS:
        path = NOTEBOOKS / f"{name}.ipynb"
        text = render(name)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale notebooks (run python3 scripts/make_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
