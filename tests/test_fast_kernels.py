"""The small-N paths of issue 24: a kernel shared by every layer formed once, densely.

Oracles: tests/oracle.py (dense masked softmax kernels and the layer-by-layer
rollout in NumPy float64, no jaxroll code) and central finite differences of
it. Tolerances: 1e-12 absolute in float64 (entries are at most 1, sums of at
most a few hundred non-negative terms).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll.engine.plan import plan
from jaxroll.engine import structured

import oracle


def _arrays(model):
    return {"lambdas": np.asarray(model.lambdas), "slopes": np.asarray(model.alibi_slopes),
            "diagonal": np.asarray(model.diagonal_scores), "base": np.asarray(model.base_scores),
            "weights": np.asarray(model.head_weights), "temperature": float(model.temperature),
            "mask": model.mask, "window": model.window}


@pytest.mark.parametrize("slopes, content, temperature", [
    ([0.5, 0.25, 1e-3], [0.0, 0.0, 0.0], 1.0),
    ([0.0, 10.0, 1e-9], [1000.0, -1000.0, 3.0], 0.1),
    ([10.0, 10.0, 0.0], [-1000.0, 0.0, 250.0], 10.0),
])
@pytest.mark.parametrize("n", [1, 2, 17, 300])
def test_dense_causal_kernel_matches_the_oracle(slopes, content, temperature, n):
    """The closed-form dense kernel (one matmul read along anti-diagonals)
    against the oracle's masked softmax; extremes of content, slope and
    temperature; N not a multiple of the table block. 1e-12 in float64."""
    weights = np.array([0.2, 0.5, 0.3])
    arrays = {"slopes": np.asarray(slopes)[None], "diagonal": np.asarray(content)[None],
              "base": np.zeros((1, 3)), "weights": weights[None], "temperature": temperature,
              "mask": "causal", "window": None}
    expected = oracle.layer_kernel(arrays, 0, n)
    got = structured.dense_causal_kernel(jnp.asarray(slopes) / temperature, jnp.asarray(content) / temperature,
                                         jnp.asarray(weights), n)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["bloom-176b", "mpt-7b"])
@pytest.mark.parametrize("n", [64, 256])
def test_published_no_content_takes_the_shared_path_and_matches_the_oracle(name, n):
    """No-content published configurations (one kernel in every layer) go
    through the shared dense path, all-content ones (per-layer kernels) do
    not; both agree with the oracle's rollout to 1e-12 in float64."""
    for content, shared in ((None, True), ("all", False)):
        model = jaxroll.published.load(name, content=content)
        assert bool(structured.shares_one_kernel(model.alibi_slopes, model.diagonal_scores,
                                                 model.head_weights)) is shared
        expected = oracle.influence(_arrays(model), n)
        np.testing.assert_allclose(jaxroll.influence(model, n), expected / expected.sum(), rtol=0, atol=1e-12)


def test_shared_path_under_float32(float32):
    """float32: finite, non-negative, mass 1 within 1e-6, and within 1e-6 of
    the float64 oracle (float32 epsilon 6e-8 times T = 70 layers of sums)."""
    model = jaxroll.published.load("bloom-176b")
    expected = oracle.influence(_arrays(model), 256)
    with float32:
        model32 = jax.tree.map(lambda x: jnp.asarray(np.asarray(x), jnp.float32), model)
        profile, mass = jaxroll.influence_with_mass(model32, 256)
        profile = np.asarray(profile)
    assert profile.dtype == np.float32 and np.all(np.isfinite(profile)) and np.all(profile >= 0)
    assert abs(float(mass) - 1.0) < 1e-6
    np.testing.assert_allclose(profile, expected / expected.sum(), rtol=0, atol=1e-6)


def test_shared_path_gradients_match_finite_differences_and_forward_mode():
    """``jax.grad`` of the Wasserstein loss through the shared path (lambdas,
    the common slopes and content) against central differences of the oracle
    (step 1e-6: truncation ~1e-12, rounding ~1e-10; 1e-7 absolute), and
    `jax.jvp` of `shared_kernel_rollout_row` (plain JAX, so forward mode
    works) against the same differences along one direction."""
    rng = np.random.default_rng(3)
    T, H, n = 4, 3, 40
    model = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=rng.uniform(0.2, 0.9, T),
                                        alibi_slopes=rng.uniform(0.05, 1, H), diagonal_scores=rng.normal(0, 2, H),
                                        head_weights=rng.uniform(0.2, 1, H), temperature=0.8, sequence_length=n)
    target = rng.dirichlet(np.ones(n))

    def oracle_loss(m):
        p = oracle.influence(_arrays(m), n)
        p = p / p.sum()
        return np.sum(np.abs(np.cumsum(p - target)[:-1])) / (n - 1)

    def loss(m):
        return jaxroll.metrics.wasserstein(jaxroll.influence(m), jnp.asarray(target))

    gradient = jax.grad(loss)(model)
    step = 1e-6
    for field in ("lambdas", "alibi_slopes", "diagonal_scores"):
        values = np.asarray(getattr(model, field), dtype=np.float64)
        got = np.asarray(getattr(gradient, field))
        # One head changed in every layer at once keeps the kernel shared: compare the summed gradient.
        columns = [slice(None)] if values.ndim == 1 else [(slice(None), h) for h in range(H)]
        for column in columns:
            up, down = values.copy(), values.copy()
            up[column] += step
            down[column] -= step
            difference = (oracle_loss(dataclasses.replace(model, **{field: up}))
                          - oracle_loss(dataclasses.replace(model, **{field: down}))) / (2 * step)
            assert abs(np.sum(got[column]) - difference) < 1e-7, (field, column)

    direction = rng.normal(0, 1, H)
    last = jnp.zeros(n).at[-1].set(1.0)

    def row(slopes):
        return structured.shared_kernel_rollout_row(last, model.lambdas, slopes, model.diagonal_scores[0],
                                                    model.head_weights[0], model.temperature)

    _, tangent = jax.jvp(row, (model.alibi_slopes[0],), (jnp.asarray(direction),))
    arrays = _arrays(model)

    def oracle_row(slopes):
        return oracle.influence(dict(arrays, slopes=np.broadcast_to(slopes, (T, H))), n)

    slopes = np.asarray(model.alibi_slopes[0])
    expected = (oracle_row(slopes + step * direction) - oracle_row(slopes - step * direction)) / (2 * step)
    np.testing.assert_allclose(tangent, expected, rtol=0, atol=1e-8)


@pytest.mark.parametrize("mask, window", [("causal", None), ("sliding", 5), ("full", None)])
def test_shared_slopes_with_per_layer_content_matches_the_oracle(mask, window):
    """Equal slopes in every layer, content per layer and head (the all-content files): the product
    reads layer 0's slopes from outside the scan (issue 33). Oracle: the NumPy float64 rollout, 1e-12."""
    rng = np.random.default_rng(5)
    T, H, n = 5, 3, 37
    model = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=rng.uniform(0.2, 0.9, T),
                                        alibi_slopes=rng.uniform(0.05, 1, H), diagonal_scores=rng.normal(0, 2, (T, H)),
                                        head_weights=rng.uniform(0.2, 1, (T, H)), temperature=0.7, mask=mask,
                                        window=window, sequence_length=n)
    path = plan(model, n, "structured")
    assert path.shared_slopes and not path.shared_kernel
    want = oracle.influence(_arrays(model), n)
    np.testing.assert_allclose(jaxroll.influence(model), want / want.sum(), rtol=0, atol=1e-12)


def test_shared_slopes_gradient_reaches_every_layer():
    """Under `jax.grad` the slopes are traced and every layer keeps its own: the gradient of each
    layer's slope against central differences of the oracle (step 1e-6; 1e-7 absolute)."""
    rng = np.random.default_rng(6)
    T, H, n = 3, 2, 24
    model = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=rng.uniform(0.2, 0.9, T),
                                        alibi_slopes=rng.uniform(0.05, 1, H), diagonal_scores=rng.normal(0, 2, (T, H)),
                                        temperature=0.9, sequence_length=n)
    target = rng.dirichlet(np.ones(n))

    def oracle_loss(slopes):
        p = oracle.influence(dict(_arrays(model), slopes=slopes), n)
        p = p / p.sum()
        return np.sum(np.abs(np.cumsum(p - target)[:-1])) / (n - 1)

    gradient = jax.grad(lambda m: jaxroll.metrics.wasserstein(jaxroll.influence(m), jnp.asarray(target)))(model)
    slopes, step = np.asarray(model.alibi_slopes, np.float64), 1e-6
    for t in range(T):
        for h in range(H):
            up, down = slopes.copy(), slopes.copy()
            up[t, h] += step
            down[t, h] -= step
            difference = (oracle_loss(up) - oracle_loss(down)) / (2 * step)
            assert abs(float(gradient.alibi_slopes[t, h]) - difference) < 1e-7, (t, h)
