"""The distance tables of a `GainTableKernel`: mean rows under a distance score, read at any kappa.

Oracles, NumPy float64 written here: the per-sequence rows themselves (``mean_s softmax(z_s + kappa g)`` at a
grid kappa is what the table holds, so a distance score there must give exactly the mean of the changed rows),
the blend between grid kappas written out again, the plain reweighting where no table holds the form, the
closed-ratio layer of test_gain_table for a temperature together with a score, and central differences for
the gradient. Tolerances: 1e-12 for float64 rollouts of a dozen products of 9 x 9 stochastic matrices; 1e-7
for central differences at step 1e-5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import interventions
from jaxroll.errors import ConfigError
from jaxroll.kernel_types import GainTableKernel

from test_gain_table import GRID, LAMBDAS, SHARES, N, T, _closed_ratio_rollout, _path_weights, _softmax_rows

KAPPAS = (-1.0, -0.5, 0.5, 1.0)
OFFSETS = np.maximum(np.arange(N)[:, None] - np.arange(N)[None, :], 0)
LOG1P = np.log1p(np.arange(N, dtype=np.float64))
SQRT = np.sqrt(np.arange(N, dtype=np.float64))  # a second form, tabulated in one test


@pytest.fixture(scope="module")
def logits():
    return 2.5 * np.random.default_rng(1).normal(size=(T, 5, 2, N, N))


def _rows(logits, gain=1.0, kappa=0.0, score=LOG1P):
    """``mean_{s,h} softmax(gain z + kappa g(i - j))``, ``(T, N, N)``."""
    return _softmax_rows(logits + kappa / gain * score[OFFSETS], gain).mean(axis=(1, 2))


def _model(logits, scores=(LOG1P,), keys=("log1p",), shares=SHARES):
    rows = np.stack([_rows(logits, g) for g in GRID], axis=1)
    weights = np.stack([_path_weights(_softmax_rows(logits, g)).mean(axis=(1, 2)) for g in GRID], axis=1)
    tables = np.stack([np.stack([_rows(logits, 1.0, k, score) for k in KAPPAS], axis=1) for score in scores], axis=1)
    kernel = GainTableKernel.create(rows, weights, GRID, probability_shares=shares,
                                    distances={"rows": tables, "scores": np.stack(scores), "grid": KAPPAS,
                                               "keys": keys})
    return jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS)


def _plain(kernels):
    row = np.zeros(N)
    row[-1] = 1.0
    for t in reversed(range(T)):
        row = row @ ((1 - LAMBDAS[t]) * np.eye(N) + LAMBDAS[t] * kernels[t])
    return row / row.sum()


def _reweighted(rows, delta, score=LOG1P):
    out = rows * np.exp(delta * score[OFFSETS])
    return np.tril(out) / np.tril(out).sum(axis=-1, keepdims=True)


def _influence(model, spec):
    return np.asarray(jaxroll.influence(interventions.apply_all(model, interventions.parse(spec))))


@pytest.mark.parametrize("kappa", KAPPAS)
def test_a_grid_kappa_is_the_mean_of_the_changed_sequence_rows(logits, kappa):
    expected = _plain(_rows(logits, 1.0, kappa))
    np.testing.assert_allclose(_influence(_model(logits), f"kappa={kappa}"), expected, rtol=0, atol=1e-12)
    moved = _plain(_reweighted(_rows(logits), kappa))  # today's route, the mean reweighted: not the same
    assert np.abs(expected - moved).max() > 1e-3


@pytest.mark.parametrize("kappa", [-0.7, 0.2, -1.6, 1.8])
def test_between_and_beyond_the_grid_the_neighbours_blend(logits, kappa):
    grid = (-1.0, -0.5, 0.0, 0.5, 1.0)
    tables = [_rows(logits, 1.0, k) for k in grid]
    k = int(np.clip(np.searchsorted(grid, kappa, side="right") - 1, 0, len(grid) - 2))
    w = float(np.clip((kappa - grid[k]) / (grid[k + 1] - grid[k]), 0.0, 1.0))
    kernels = ((1 - w) * _reweighted(tables[k], kappa - grid[k])
               + w * _reweighted(tables[k + 1], kappa - grid[k + 1]))
    np.testing.assert_allclose(_influence(_model(logits), f"kappa={kappa}"), _plain(kernels), rtol=0, atol=1e-12)


def test_neutral_and_untabulated_forms_are_todays_route(logits):
    plain = _model(logits)
    bare = jaxroll.RolloutModel.create(kernel=GainTableKernel.create(plain.kernel.rows, plain.kernel.weights, GRID,
                                                                     probability_shares=SHARES), lambdas=LAMBDAS)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(plain)), np.asarray(jaxroll.influence(bare)),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(_influence(plain, "kappa=0"), _influence(bare, "kappa=0"), rtol=0, atol=1e-12)
    # unsquash is not tabulated here: the rows are reweighted, as without tables
    spec = "kappa=0.8,kappa_form=unsquash"
    np.testing.assert_allclose(_influence(plain, spec), _influence(bare, spec), rtol=0, atol=1e-12)


def test_a_temperature_and_a_score_multiply_the_tables_ratio(logits):
    # tau = 0.5 (gain 2, a grid gain) with kappa = -0.5 (a grid kappa): every gain's rows times T(kappa) / K1
    gain, kappa = 2.0, -0.5
    base = _rows(logits)
    ratio = _rows(logits, 1.0, kappa) / np.where(base > 0, base, 1.0)
    kernels = _rows(logits, gain) * ratio
    kernels /= kernels.sum(axis=-1, keepdims=True)
    weights = _path_weights(_softmax_rows(logits, gain)).mean(axis=(1, 2))
    weights0 = _path_weights(_softmax_rows(logits, 1.0)).mean(axis=(1, 2))
    shape0 = base * ratio
    shape0 /= shape0.sum(axis=-1, keepdims=True)
    expected = _closed_ratio_rollout(kernels, weights, weights0, shape0, np.full((T, N), gain))
    got = _influence(_model(logits), f"tau=0.5,kappa={kappa}")
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_two_forms_each_read_from_their_own_table(logits):
    model = _model(logits, scores=(LOG1P, SQRT), keys=("log1p", "sqrt"))
    np.testing.assert_allclose(_influence(model, "kappa=0.5"), _plain(_rows(logits, 1.0, 0.5)), rtol=0, atol=1e-12)
    # a DistanceScore names its form; a table under another name is read only for that name
    score = interventions.DistanceScore("log1p")
    changed = model.kernel.add_distance_score(jnp.asarray(-0.5), score, N)
    assert np.asarray(changed.distance_kappas).tolist() == [[-0.5, 0.0]] * T


def test_the_kappa_gradient_matches_central_differences(logits):
    model = _model(logits)

    def middle(kappa):
        return jnp.sum(jaxroll.influence(interventions.apply_all(model, [interventions.DistanceBias(kappa)]))[2:7])

    for kappa in (-0.3, 0.7):  # inside grid cells
        gradient = float(jax.grad(middle)(jnp.asarray(kappa)))
        step = 1e-5
        numeric = (float(middle(kappa + step)) - float(middle(kappa - step))) / (2 * step)
        assert abs(gradient - numeric) < 1e-7
        assert abs(gradient) > 1e-4
    batched = jax.vmap(middle)(jnp.asarray([-0.3, 0.2, 0.7]))
    assert float(batched[2]) == pytest.approx(float(middle(0.7)), abs=1e-12)


def test_the_yaml_form_round_trips_with_the_tables(logits, tmp_path):
    model = interventions.apply_all(_model(logits), interventions.parse("kappa=-0.3"))
    path = tmp_path / "config.yaml"
    jaxroll.save_config(model, path)
    again = jaxroll.load_config(path)
    assert again.kernel.distance_keys == ("log1p",)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(again)), np.asarray(jaxroll.influence(model)),
                               rtol=0, atol=1e-15)
    # an archive with part of the tables is refused in one line
    arrays = dict(np.load(tmp_path / "config.kernels.npz"))
    del arrays["distance_grid"]
    np.savez(tmp_path / "config.kernels.npz", **arrays)
    refusal = r"config.yaml: kernel_config.file .*without 'distance_grid'; allowed: all of"
    with pytest.raises(ConfigError, match=refusal):
        jaxroll.load_config(path)


def test_refusals_name_the_field(logits):
    model = _model(logits)
    kernel = model.kernel
    base = {"rows": np.asarray(kernel.distance_rows), "scores": LOG1P[None], "grid": KAPPAS, "keys": ("log1p",)}
    cases = [({"grid": (-1.0, 0.0, 0.5, 1.0)}, r"distances.grid.*nonzero"),
             ({"grid": (1.0, -0.5, 0.5, 1.0)}, r"distances.grid.*increasing"),
             ({"keys": ("a", "a")}, r"distances.keys.*distinct"),
             ({"rows": np.asarray(kernel.distance_rows)[:, :, :2]}, r"distances.rows: .*shape"),
             ({"rows": 1.01 * np.asarray(kernel.distance_rows)}, r"distances.rows: .*causal row-stochastic"),
             ({"scores": np.full((1, N), np.nan)}, r"distances.scores"),
             ({"scores": LOG1P[None, :4]}, r"distances.scores: .*shape")]
    for change, message in cases:
        with pytest.raises(ConfigError, match=message):
            GainTableKernel.create(kernel.rows, kernel.weights, GRID, distances=base | change)
    with pytest.raises(ConfigError, match=r"^kappa_form: got 'cubic'; allowed: log1p or unsquash$"):
        interventions.DistanceScore("cubic")
