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
# # 05 · Measuring a model, then predicting its profile
#
# `jaxroll.measure` (PyTorch, the optional extra `jaxroll[measure]`) measures
# the theory's parameters on a Hugging Face causal LM, one forward and one
# backward pass per sequence:
#
# - $\lambda_t = \operatorname{mean} \lVert a \rVert / (\lVert x \rVert + \lVert a \rVert)$ per block ($x$ the residual
#   stream entering it, $a$ its attention output);
# - per layer and head the diagonal content score from the mean of $q_i \cdot k_j$,
#   in logit units;
# - the gradient influence $\lVert \partial f / \partial e_j \rVert$ of each token embedding on the
#   top next-token probability $f$ at the last position, normalised to sum 1.
#
# No download: a tiny BLOOM (8 layers, 4 heads, hidden size 64, random
# weights with initialiser scale 0.1, so that attention contributes
# $\lambda \approx 0.15$) is built here from `transformers.BloomConfig` and measured
# on 16 random token sequences of 128 tokens. Then the rollout of the
# measured lambdas, ALiBi slopes and content predicts the influence profile,
# which we compare with the measured one.

# %%
import os

import numpy as np
import matplotlib.pyplot as plt

import jaxroll
from jaxroll import metrics

# White backgrounds: the figures are also shown in the README (dark themes too).
plt.rcParams.update({"figure.dpi": 90, "figure.facecolor": "white", "savefig.facecolor": "white",
                     "axes.grid": True, "grid.alpha": 0.3})

import torch
import transformers

from jaxroll.measure import measure

torch.set_num_threads(1)

# %%
torch.manual_seed(0)
config = transformers.BloomConfig(n_layer=8, n_head=4, hidden_size=64, vocab_size=256, initializer_range=0.1)
model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
# tests/test_notebooks.py sets JAXROLL_NOTEBOOK_SMOKE=1: 8 sequences of 64 tokens, the same checks.
SEQUENCES, LENGTH = (8, 64) if os.environ.get("JAXROLL_NOTEBOOK_SMOKE") == "1" else (16, 128)
token_ids = np.random.default_rng(0).integers(0, config.vocab_size, (SEQUENCES, LENGTH))

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
# `measure` fits the exponent with which the rollout composes paths to this measured profile (docs/design.md,
# "How paths compose"): 1 adds them linearly as the paper does, 2 in quadrature.
q = 1.0 if rollout_model.composition is None else float(rollout_model.composition)
print(f"paths composed with q = {q:.3f}")
print(f"predicted vs measured: W1/(N-1) {comparison.wasserstein:.4f}, Spearman {comparison.spearman:.3f}")
print(f"attention-only vs measured: W1/(N-1) {float(metrics.wasserstein(attention_only, measured)):.4f}")

# %% tags=["figure:measure"]
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
    ax.plot(positions, predicted, color="C0", label=f"rollout prediction, q = {q:.2f} (W1 {comparison.wasserstein:.3f})")
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
fig.suptitle(f"Measured on a tiny random BLOOM (8 layers, 4 heads, {SEQUENCES} sequences), then predicted by jaxroll");

# %% [markdown]
# **Checked.** The measured lambdas lie in (0, 1), both profiles sum to 1
# (1e-9, float64 measurement; 1e-4 for the float32 rollout), and the
# residual-aware prediction is closer to the measured profile (W1) than the
# attention-only rollout of the same kernels.

# %%
assert np.all((measurement.lambdas > 0) & (measurement.lambdas < 1))
assert abs(measured.sum() - 1) < 1e-9 and abs(predicted.sum() - 1) < 1e-4
assert comparison.wasserstein < float(metrics.wasserstein(attention_only, measured))
print("the residual-aware rollout predicts the measured profile better than attention-only")
