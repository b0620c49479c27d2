# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · The four forces and the sign of content
#
# At finite depth four forces shape the profile (arXiv 2602.16837, for
# stochastically monotone kernels): **causal masking** drifts mass toward
# early positions (primacy), the **residual** identity path keeps it at late
# positions (recency), **ALiBi** adds recency, and **diagonal content**
# $d$ adds recency when positive and primacy when negative. Head $h$ of layer $t$
# scores $s(i, j) = -m (i - j) + d\,[i = j]$ on the allowed entries $j \le i$.
#
# `jaxroll.theory.forces` builds a ladder, each rung adding one force:
# causal masking alone ($\lambda = 1$, no slopes, no content), + residuals
# (the measured lambdas), + ALiBi (the slopes), + content (the measured
# per-head diagonal scores, `content="all"`, FineWeb-Edu). The drift of a
# force is the change in centre of mass $\sum_j j\, p(j) / (N - 1)$ (0 = first
# token, 1 = last) that it adds; the ladder starts from $e_{N-1}$ (centre 1).

# %%
import numpy as np
import matplotlib.pyplot as plt

import jaxroll
from jaxroll import metrics

# White backgrounds: the figures are also shown in the README (dark themes too).
plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "savefig.facecolor": "white",
                     "axes.grid": True, "grid.alpha": 0.3})

# %%
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

# %% tags=["figure:four_forces"]
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

# %% [markdown]
# ## The content sign
#
# One model's measured lambdas and slopes (MPT-7B), with the same diagonal
# content `d` in every head and layer: `d > 0` (tokens read themselves more)
# pushes influence to late positions, `d < 0` to early ones. Linear axes.

# %% tags=["figure:content_sign"]
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

# %% [markdown]
# **The claims, checked in plain NumPy.** On every model causal masking has
# drift < 0, residuals and ALiBi > 0. The content sign: the profiles' CDFs
# $F(j) = \sum_{k \le j} p(k)$ are ordered, $F_{+2} \le F_0 \le F_{-2}$ at every $j$
# (stochastic dominance, which the theory proves for these monotone kernels),
# within 1e-5 for float32 rounding of a 256-term cumulative sum, and the
# centres of mass strictly so.

# %%
for name in names:
    causal, residual, alibi, content = drifts[name]
    assert causal < 0 and residual > 0 and alibi > 0, (name, drifts[name])
negative, zero, positive = (np.cumsum(signed[d]) for d in scores)
assert np.all(positive <= zero + 1e-5) and np.all(zero <= negative + 1e-5)
assert center_of_mass(signed[2.0]) > center_of_mass(signed[0.0]) > center_of_mass(signed[-2.0])
print("forces have the stated signs; positive content adds recency, negative adds primacy")
