"""The Toeplitz summary (mean attention by offset) and its rollout, against NumPy oracles.

Oracles: the offsets of the measured dense mean attention read in NumPy
(linear, so the per-head summary averaged over heads equals the offsets of
the head-averaged ``attention_mean``: 1e-12 in float64); sdpa against eager
(both recompute their rows from q, k since issue 55; the model's own eager
probabilities are the oracle of tests/test_chunked_stats.py); the
rollout against a NumPy float64 rollout with the kernel written out,
``K[i, j] = mean_h a_h(i - j) / sum_{o <= i} a_h(o)`` (1e-5, float32 JAX).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jaxroll  # noqa: E402
from jaxroll.measure import measure  # noqa: E402
from jaxroll.measure.offsets import offset_rollout_model  # noqa: E402
from test_measure import tiny, token_ids  # noqa: E402

N = 12


def _numpy_offsets(attention):
    # (L, N, N) -> (L, N): mean over i >= o of A[i, i - o]
    n = attention.shape[-1]
    return np.stack([[np.mean([layer[i, i - o] for i in range(o, n)]) for o in range(n)] for layer in attention])


def _numpy_rollout(offsets, lambdas):
    layers, heads, n = offsets.shape
    product = np.eye(n)
    for t in range(layers):
        kernel = np.zeros((n, n))
        for h in range(heads):
            for i in range(n):
                row = offsets[t, h, i - np.arange(i + 1)]
                kernel[i, : i + 1] += row / row.sum() / heads
        product = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * kernel) @ product
    return product[-1]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_offsets_equal_the_dense_mean_attention_read_by_offset_and_sdpa_equals_eager(family):
    ids = token_ids(4, N, seed=2)
    stats = ("lambda", "influence", "attention", "attention_offsets")
    eager = measure(tiny(family), ids, stats=stats, batch_size=3)
    offsets = eager.extra["attention_offsets"]
    assert offsets.shape == (2, 4, N)
    np.testing.assert_allclose(offsets.mean(axis=1), _numpy_offsets(eager.attention_mean), rtol=0, atol=1e-12)
    sdpa = measure(tiny(family, implementation="sdpa"), ids, stats=stats, batch_size=2)
    assert sdpa.metadata["attention_rows"]
    np.testing.assert_allclose(sdpa.extra["attention_offsets"], offsets, rtol=0, atol=1e-6)


def test_offset_rollout_is_the_toeplitz_kernel_rollout_and_near_the_dense_one():
    ids = token_ids(6, N, seed=3)
    result = measure(tiny("llama"), ids, stats=("lambda", "influence", "attention", "attention_offsets"))
    offsets, lambdas = result.extra["attention_offsets"], result.lambdas
    profile = np.asarray(jaxroll.influence(offset_rollout_model(offsets, lambdas)), dtype=np.float64)
    np.testing.assert_allclose(profile, _numpy_rollout(offsets, np.clip(lambdas, 0, 1)), rtol=0, atol=1e-5)
    assert abs(profile.sum() - 1) < 1e-5
    dense = np.asarray(jaxroll.influence(result.to_rollout_model()), dtype=np.float64)
    # Reported, not a property: a random tiny model's attention is nearly a function of the offset.
    distance = 0.5 * np.abs(profile - dense).sum()
    print(f"total variation, offset vs dense measured-kernel rollout at N = {N}: {distance:.3g}")
    assert distance < 0.1
