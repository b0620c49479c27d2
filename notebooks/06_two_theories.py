# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Two theories on one geometry: the kinetic closed form beside the rollout
#
# The kinetic theory (Duerinckx, Geshkovski, Rossi, arXiv 2605.09213) gives the
# lost-in-the-middle profile in closed form,
# $S_t(s) = \sum_n \omega_n\, g_{a_n}(t; s)$, with $a_n = n^2 I_n(\beta)$. Each mode
# $g(c; s)$ is the off-diagonal last row of $\exp(c K)$ for the continuum causal
# ALiBi operator $K$, and a rollout with one ALiBi head of slope $\lambda / N$ and a
# constant schedule $c / T$ tends to it: $N e^c P_T[N-1, j] \to g(c; j/N)$.
# This notebook shows the two side by side, the convergence, the threshold
# $t_{\mathrm{crit}}$, and both theories fitted to the five published models' profiles.

# %%
import os

import jax

jax.config.update("jax_enable_x64", True)

import matplotlib.pyplot as plt
import numpy as np

import jaxroll
from jaxroll.theory import two_theories
from jaxroll.theory import bridge, kinetic

plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "axes.grid": True, "grid.alpha": 0.3})

# %% [markdown]
# ## Side by side on one geometry
#
# beta = 1, lambda = 1, M = 8 (the reference point). Below `t_crit` the
# profile rises into the query (an interior minimum); above it, it does not.
# The matching rollout has N = 256 positions, T = 64 layers, slope
# $m = \lambda / N$ and total mixing $c = a_{\mathrm{eff}} t$, so its threshold is the
# same. Its query position carries the identity mass $e^{-c}$, which the
# kinetic profile has no counterpart for: both are compared on $j < N - 1$.

# %%
t_crit = float(kinetic.critical_time(1.0, 1.0, 8.0))
print(f"t_crit = {t_crit:.6f}")
n, layers = 256, 64
figure, axes = plt.subplots(1, 3, figsize=(14, 3.8))
for ax, t in zip(axes, (0.5 * t_crit, t_crit, 2 * t_crit)):
    model = kinetic.KineticModel.create(beta=1.0, lam=1.0, t=t, M=8.0)
    p_kinetic = np.asarray(two_theories.to_distribution(model, n))[:-1]
    p_rollout = np.asarray(jaxroll.influence(bridge.matching_rollout(model, n, layers)))[:-1]
    ax.plot(p_kinetic / p_kinetic.sum(), label="kinetic S_t(s_j), normalised")
    ax.plot(p_rollout / p_rollout.sum(), "--", label="matching rollout (j < N-1)")
    ax.set_title(f"t = {t / t_crit:.1f} t_crit")
    ax.set_xlabel("input position j")
axes[0].set_ylabel("probability")
axes[0].legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# ## Convergence of the rollout to a mode
#
# The error $\max_s \lvert N e^c P_T[N-1, j] - g(c; j/N) \rvert / g$ over $s \in [0.05, 0.95]$
# for the first mode of $\beta = 2$, $t = 1$ ($c = a_1 = I_1(2)$), with $N = 4 T$. It
# halves when T doubles: first order, the binomial-vs-Poisson path-length gap.

# %%
c = float(kinetic.rates(2.0, n_max=1)[0])
errors = []
for T in (25, 50, 100, 200):
    p = jaxroll.influence(bridge.mode_rollout(c, 1.0, 4 * T, T))
    s, scaled = bridge.mode_from_rollout(p, c)
    g = kinetic.mode(c, s, 1.0)
    keep = (np.asarray(s) >= 0.05) & (np.asarray(s) <= 0.95)
    errors.append(float(np.max(np.abs(np.asarray(scaled - g))[keep] / np.asarray(g)[keep])))
    print(f"T = {T:4d}, N = {4 * T:4d}: max relative error {errors[-1]:.3e}")
orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
print("observed orders:", np.round(orders, 3))

# %% [markdown]
# ## The threshold: t_crit is where the end slope changes sign
#
# $\partial S / \partial s$ at $s = 1$ (by autodiff) against $t$, for three $\beta$; the zero is $t_{\mathrm{crit}}$.

# %%
slope = jax.vmap(jax.grad(lambda s, t, beta: kinetic.profile(s, t, beta, 1.0, 8.0)), in_axes=(None, 0, None))
figure, ax = plt.subplots(figsize=(6, 3.5))
for beta in (1.0, 2.0, 3.0):
    tc = float(kinetic.critical_time(beta, 1.0, 8.0))
    ts = np.linspace(0.05, 2.5, 120) * tc
    ax.plot(ts / tc, np.asarray(slope(1.0, ts, beta)) / np.asarray(kinetic.profile(1.0, ts, beta, 1.0, 8.0)),
            label=f"beta = {beta:g} (t_crit = {tc:.3f})")
ax.axhline(0, color="k", lw=0.8)
ax.axvline(1, color="k", lw=0.8, ls=":")
ax.set_xlabel("t / t_crit")
ax.set_ylabel("(dS/ds) / S at s = 1")
ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# ## Both theories fitted to the five published models
#
# The target is each published configuration's rollout profile
# (`jaxroll.published.load(name)`, `jaxroll.influence`). The kinetic theory
# with one head has 4 parameters (beta, lambda, t, M); the rollout on the
# model's own heads has 3 (lambda_0, the power-decay exponent, a slope scale).
# A short run here (100 Adam steps); `benchmarks/kinetic.py` runs the full
# table of docs/kinetic.md (two kinetic head counts, 300 steps).

# %%
# tests/test_notebooks.py sets JAXROLL_NOTEBOOK_SMOKE=1: 20 steps, the same checks.
STEPS = 20 if os.environ.get("JAXROLL_NOTEBOOK_SMOKE") == "1" else 100
rows = []
figure, axes = plt.subplots(1, 5, figsize=(18, 3.3))
for ax, name in zip(axes, jaxroll.published.names()):
    model = jaxroll.published.load(name)
    q = np.asarray(jaxroll.influence(model))
    fits = two_theories.compare_theories(q, model, heads=(1,), steps=STEPS)
    ax.plot(q, color="k", lw=2, label="published rollout")
    for label, fit in fits.items():
        ax.plot(fit.profile, "--", label=f"{label}: W1 {fit.wasserstein:.4f}")
        rows.append((name, label, fit.wasserstein, fit.num_parameters))
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("input position j")
    ax.legend(fontsize=7)
plt.tight_layout()
print(f"{'model':14} {'theory':18} {'W1/(N-1)':>10} {'params':>6}")
for name, label, w1, k in rows:
    print(f"{name:14} {label:18} {w1:10.5f} {k:6d}")

# %% [markdown]
# Checks: the rollout converges at first order, and every fit is a finite
# distribution.

# %%
assert np.all((orders > 0.9) & (orders < 1.1)), orders
assert all(np.isfinite(w1) and w1 < 0.05 for _, _, w1, _ in rows)
