"""`GainTableKernel`: measured rows tabulated over the logit gain, read at each row's gain.

Oracles, all NumPy float64 written here: the per-sequence rows themselves (``mean_s softmax(g z_s)`` at a grid
gain is what the table holds, so a temperature or SSMax at grid gains must give exactly the mean of the changed
rows), the closed-ratio layer of docs/design.md written out row by row, the table read between grid gains
(linear in ln g), and central differences for the gradient. Tolerances: 1e-12 for float64 rollouts of a
dozen products of 9 x 9 row-stochastic matrices (rounding ~1e-15); 1e-7 for central differences at step 1e-5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import interventions
from jaxroll.errors import ConfigError
from jaxroll.kernel_types import DenseKernel, GainTableKernel

GRID = tuple(float(2.0 ** (k / 2)) for k in range(-3, 5))
T, S, H, N = 3, 5, 2, 9
LAMBDAS = np.array([0.3, 0.55, 0.7])
SHARES = np.array([0.2, 0.45, 0.3])


def _softmax_rows(logits, gain):
    """Causal softmax rows of ``gain * logits`` (..., N, N); `gain` a number or ``(N,)`` per row."""
    gain = np.broadcast_to(np.asarray(gain, dtype=np.float64), (N,))[:, None]
    mask = np.tril(np.ones((N, N), bool))
    x = np.where(mask, gain * logits, -np.inf)
    x = x - x.max(axis=-1, keepdims=True)
    w = np.exp(x)
    return w / w.sum(axis=-1, keepdims=True)


def _path_weights(a):
    return a * np.sqrt(np.clip(1.0 - 2.0 * a + (a * a).sum(axis=-1, keepdims=True), 0.0, None))


@pytest.fixture(scope="module")
def logits():
    return 2.5 * np.random.default_rng(0).normal(size=(T, S, H, N, N))


def _tables(logits):
    rows = np.stack([_softmax_rows(logits, g).mean(axis=(1, 2)) for g in GRID], axis=1)
    weights = np.stack([_path_weights(_softmax_rows(logits, g)).mean(axis=(1, 2)) for g in GRID], axis=1)
    return rows, weights


def _model(logits, shares=SHARES):
    rows, weights = _tables(logits)
    kernel = GainTableKernel.create(rows, weights, GRID, probability_shares=shares)
    return jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS)


def _closed_ratio_rollout(kernels, weights, weights0, kernels0, gains, shares=SHARES, lambdas=LAMBDAS):
    """docs/design.md's closed-ratio layer from given (changed) rows and weights, row by row, then the rollout."""
    row = np.zeros(N)
    row[-1] = 1.0
    for t in reversed(range(T)):
        layer = np.zeros((N, N))
        for i in range(N):
            ratio = np.where(weights0[t, i] > 0, weights[t, i] / np.where(weights0[t, i] > 0, weights0[t, i], 1), 1)
            shape = kernels0[t, i] * ratio
            shape = shape / shape.sum()
            branch = (1 - shares[t]) * kernels[t, i] + shares[t] * gains[t, i] * shape
            total = branch.sum()
            layer[i] = ((1 - lambdas[t]) * np.eye(N)[i] + lambdas[t] * branch) / (1 - lambdas[t] + lambdas[t] * total)
        row = row @ layer
    return row / row.sum()


def test_at_the_measured_gain_it_is_the_dense_rollout_of_the_mean_rows(logits):
    mean = _softmax_rows(logits, 1.0).mean(axis=(1, 2))
    dense = jaxroll.RolloutModel.create(kernel=DenseKernel.create(mean), lambdas=LAMBDAS)
    for shares in (0.0, SHARES):
        got = np.asarray(jaxroll.influence(_model(logits, shares)))
        np.testing.assert_allclose(got, np.asarray(jaxroll.influence(dense)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("tau", [GRID[5] ** -1, GRID[2] ** -1, 0.5])
def test_a_temperature_at_a_grid_gain_is_the_mean_of_the_tempered_sequence_rows(logits, tau):
    gain = 1.0 / tau
    changed = interventions.apply_all(_model(logits), interventions.parse(f"tau={tau!r}"))
    got = np.asarray(jaxroll.influence(changed))
    kernels = _softmax_rows(logits, gain).mean(axis=(1, 2))
    weights = _path_weights(_softmax_rows(logits, gain)).mean(axis=(1, 2))
    weights0 = _path_weights(_softmax_rows(logits, 1.0)).mean(axis=(1, 2))
    kernels0 = _softmax_rows(logits, 1.0).mean(axis=(1, 2))
    expected = _closed_ratio_rollout(kernels, weights, weights0, kernels0, np.full((T, N), gain))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def _read(table, gains, at_zero):
    """The table (T, G, N, N) read at row gains (T, N): linear in ln g inside the grid, linear in g below it
    toward `at_zero` (N, N) at g = 0, the last gain's row above it."""
    out = np.zeros((T, N, N))
    logs = np.log(GRID)
    for t in range(T):
        for i in range(N):
            g = gains[t, i]
            if g < GRID[0]:
                out[t, i] = g / GRID[0] * table[t, 0, i] + (1 - g / GRID[0]) * at_zero[i]
                continue
            k = min(max(np.searchsorted(logs, np.log(g), side="right") - 1, 0), len(GRID) - 2)
            w = min(max((np.log(g) - logs[k]) / (logs[k + 1] - logs[k]), 0.0), 1.0)
            out[t, i] = (1 - w) * table[t, k, i] + w * table[t, k + 1, i]
    return out


@pytest.mark.parametrize("scale", [0.3, 2.0])
def test_ssmax_reads_each_row_at_its_own_gain(logits, scale):
    rows, weights = _tables(logits)
    # s = 0.3: rows 1 and 2 below the grid (gains 0.21, 0.33 < 0.354; a row of two keys has equal path weights,
    # so row 2 is the one whose shape the g = 0 limit moves); s = 2: rows 7 and 8 above it (4.16, 4.39 > 4)
    gains = np.broadcast_to(scale * np.log(np.arange(1, N + 1)), (T, N))
    changed = interventions.apply_all(_model(logits), interventions.parse(f"ssmax_scale={scale}"))
    got = np.asarray(jaxroll.influence(changed))
    keys = np.arange(1, N + 1)[:, None]
    uniform_rows = np.tril(np.ones((N, N))) / keys  # every row's limit at g = 0
    uniform_weights = np.tril(np.ones((N, N))) * np.sqrt(1 - 1 / keys) / keys  # _path_weights of uniform_rows
    kernels = _read(rows, gains, uniform_rows)
    expected = _closed_ratio_rollout(kernels / kernels.sum(-1, keepdims=True), _read(weights, gains, uniform_weights),
                                     weights[:, 3], rows[:, 3], gains)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert GRID[3] == 1.0


def test_a_distance_score_reweights_the_rows_as_the_dense_kernel_does(logits):
    rows, _ = _tables(logits)
    spec = interventions.parse("kappa=-0.4")
    dense = jaxroll.RolloutModel.create(kernel=DenseKernel.create(rows[:, 3]), lambdas=LAMBDAS)
    expected = np.asarray(jaxroll.influence(interventions.apply_all(dense, spec)))
    got = np.asarray(jaxroll.influence(interventions.apply_all(_model(logits, 0.0), spec)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_temperature_gradient_matches_central_differences(logits):
    model = _model(logits)

    def middle(tau):
        changed = interventions.apply_all(model, [interventions.Temperature(tau)])
        profile = jaxroll.influence(changed)
        return jnp.sum(profile[2:7])

    tau = 0.8  # gain 1.25, inside a grid cell
    gradient = float(jax.grad(middle)(jnp.asarray(tau)))
    step = 1e-5
    numeric = (float(middle(tau + step)) - float(middle(tau - step))) / (2 * step)
    assert abs(gradient - numeric) < 1e-7
    assert abs(gradient) > 1e-4  # the change moves the middle: the comparison is not 0 = 0
    batched = jax.vmap(middle)(jnp.asarray([0.7, tau, 1.3]))
    assert float(batched[1]) == pytest.approx(float(middle(tau)), abs=1e-12)


def test_the_yaml_form_round_trips(logits, tmp_path):
    model = interventions.apply_all(_model(logits), interventions.parse("tau=0.8"))
    path = tmp_path / "config.yaml"
    jaxroll.save_config(model, path)
    again = jaxroll.load_config(path)
    assert type(again.kernel).__name__ == "GainTableKernel"
    np.testing.assert_allclose(np.asarray(jaxroll.influence(again)), np.asarray(jaxroll.influence(model)),
                               rtol=0, atol=1e-15)


def test_refusals_name_the_field(logits):
    rows, weights = _tables(logits)
    with pytest.raises(ConfigError, match=r"rows.grid.*1 among them"):
        GainTableKernel.create(rows, weights, [g * 1.1 for g in GRID])
    with pytest.raises(ConfigError, match=r"rows: .*shape"):
        GainTableKernel.create(rows[:, :3], weights[:, :3], GRID)
    with pytest.raises(ConfigError, match=r"rows: .*row-stochastic"):
        GainTableKernel.create(rows * 1.01, weights, GRID)
    with pytest.raises(ConfigError, match=r"row_gains"):
        GainTableKernel.create(rows, weights, GRID, row_gains=-np.ones((T, N)))
    with pytest.raises(ConfigError, match=r"tau: got shape .*GainTableKernel .one head-averaged kernel per layer"):
        interventions.apply_all(_model(logits), [interventions.Temperature(np.ones((T, 2)))])
