"""`AnchoredTableKernel`: an ALiBi model's measured tables moving its analytic kernel.

Oracles, NumPy float64 written here: the ALiBi + content rows ``softmax(-m_h (i - j) + d_h [i = j])``, the
anchored layer of the module docstring (``renorm(T_g K_an / K1)``, then the closed-ratio layer with the
probability path) rolled out row by row, the tables of the analytic kernel's own rows (then every change is
exact), and central differences for gradients. Tolerances: 1e-12 for float64 rollouts of a few products of
10 x 10 row-stochastic matrices (rounding ~1e-15); 1e-7 for central differences at step 1e-5.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import yaml

import jaxroll
from jaxroll import interventions
from jaxroll.errors import ConfigError
from jaxroll.kernel_types import AlibiKernel, AnchoredTableKernel, GainTableKernel

GRID = (0.5, 1.0, 2.0)
T, S, H, N = 2, 4, 3, 10
LAMBDAS = np.array([0.35, 0.6])
SHARES = np.array([0.25, 0.4])
SLOPES = np.array([[0.5, 0.25, 0.125], [0.3, 0.2, 0.1]])
CONTENT = np.array([[1.0, -0.5, 0.3], [0.2, 0.8, -1.0]])
CAUSAL = np.tril(np.ones((N, N), bool))


def _softmax(logits):
    x = np.where(CAUSAL, logits, -np.inf)
    w = np.exp(x - x.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def _alibi_logits(slopes, content):
    """``(..., H, N, N)``: ``-m_h (i - j) + d_h [i = j]``."""
    offsets = np.arange(N)[:, None] - np.arange(N)[None, :]
    return -slopes[..., None, None] * offsets + content[..., None, None] * np.eye(N)


def _analytic(slopes=SLOPES, content=CONTENT, weights=None):
    """``(T, N, N)``: the head-weighted ALiBi + content rows."""
    weights = np.full(slopes.shape, 1.0 / slopes.shape[-1]) if weights is None else weights
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return np.einsum("th,thij->tij", weights, _softmax(_alibi_logits(slopes, content)))


def _path_weights(a):
    return a * np.sqrt(np.clip(1.0 - 2.0 * a + (a * a).sum(axis=-1, keepdims=True), 0.0, None))


def _tables(logits):
    """Mean rows and path weights over sequences and heads at the grid gains, ``(T, G, N, N)`` each."""
    rows = np.stack([_softmax(g * logits).mean(axis=(1, 2)) for g in GRID], axis=1)
    weights = np.stack([_path_weights(_softmax(g * logits)).mean(axis=(1, 2)) for g in GRID], axis=1)
    return rows, weights


@pytest.fixture(scope="module")
def measured_logits():
    """Sequences' logits: the ALiBi bias plus content that varies by sequence (T, S, H, N, N)."""
    content = 1.5 * np.random.default_rng(0).normal(size=(T, S, H, N, N))
    return _alibi_logits(SLOPES[:, None], np.zeros((T, 1, H))) + content


def _anchor():
    return AlibiKernel.create(num_layers=T, num_heads=H, alibi_slopes=SLOPES, diagonal_scores=CONTENT)


def _model(tables, shares=SHARES):
    kernel = AnchoredTableKernel.create(*tables, GRID, anchor=_anchor())
    return jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, probability_shares=shares)


def _renorm(x):
    return x / x.sum(axis=-1, keepdims=True)


def _oracle(tables, gain, analytic, shares=SHARES):
    """The anchored closed-ratio layer at a grid gain (the same in every row), rolled out: the last row."""
    rows, weights = tables
    g, one = GRID.index(gain), GRID.index(1.0)
    row = np.eye(N)[-1]
    for t in reversed(range(T)):  # e_N^T R_T ... R_1
        anchor = np.where(rows[t, one] > 0, analytic[t] / np.where(rows[t, one] > 0, rows[t, one], 1.0), 0.0)
        kernel = _renorm(rows[t, g] * anchor)
        ratio = np.where(weights[t, one] > 0, weights[t, g] / np.where(weights[t, one] > 0, weights[t, one], 1), 1)
        path = _renorm(rows[t, one] * anchor * ratio)
        branch = (1 - shares[t]) * kernel + shares[t] * gain * path
        total = 1 - shares[t] + shares[t] * gain
        mix = LAMBDAS[t] * total / (1 - LAMBDAS[t] + LAMBDAS[t] * total)  # row i's own lambda
        layer = (1 - mix) * np.eye(N) + mix * branch / total
        row = row @ layer
    return row


def test_unchanged_it_is_the_analytic_model(measured_logits):
    tables = _tables(measured_logits)
    analytic = jaxroll.RolloutModel.create(kernel=_anchor(), lambdas=LAMBDAS, probability_shares=SHARES,
                                             sequence_length=N)
    np.testing.assert_allclose(jaxroll.influence(_model(tables)), jaxroll.influence(analytic), rtol=0, atol=1e-12)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_a_temperature_reads_the_tables_and_moves_the_anchor(measured_logits, tau):
    tables = _tables(measured_logits)
    model = interventions.Temperature(tau).apply(_model(tables))
    assert np.array_equal(np.asarray(model.kernel.anchor.alibi_slopes), SLOPES)  # shared by the heads: no move
    np.testing.assert_allclose(jaxroll.influence(model), _oracle(tables, 1.0 / tau, _analytic()),
                               rtol=0, atol=1e-12)


def test_on_the_analytic_kernels_own_rows_every_change_is_exact():
    own = _alibi_logits(SLOPES, CONTENT)[:, None]  # one "sequence": the analytic heads themselves
    tables = _tables(own)
    no_path = np.zeros(T)
    model = _model(tables, shares=no_path)
    for change, tempered in ((interventions.Temperature(0.5), _analytic(SLOPES * 2, CONTENT * 2)),
                             (interventions.SlopeScale(0.4), _analytic(SLOPES * 0.4))):
        plain = jaxroll.RolloutModel.create(kernel=jaxroll.DenseKernel.create(tempered), lambdas=LAMBDAS)
        np.testing.assert_allclose(jaxroll.influence(change.apply(model)), jaxroll.influence(plain),
                                   rtol=0, atol=1e-12)


def test_a_slope_scale_moves_the_anchor_alone(measured_logits):
    tables = _tables(measured_logits)
    moved = interventions.SlopeScale(1.7).apply(_model(tables, shares=np.zeros(T)))
    rows = tables[0][:, GRID.index(1.0)]
    expected = np.where(rows > 0, _analytic(SLOPES * 1.7), 0.0)  # renorm(K1 K_an(s) / K1)
    for t in range(T):
        np.testing.assert_allclose(moved.kernel.layer(t).dense(N), _renorm(expected[t]), rtol=0, atol=1e-12)


def test_a_temperature_per_head_splits_into_the_mean_gain_and_the_heads_relative_gains(measured_logits):
    tau = np.array([0.7, 1.0, 1.4])
    kernel = _model(_tables(measured_logits)).kernel.temper(tau)
    gain = (1.0 / tau).mean()  # uniform head weights
    relative = 1.0 / (tau * gain)
    np.testing.assert_allclose(kernel.row_gains, np.full((T, N), gain), rtol=0, atol=1e-15)
    np.testing.assert_allclose(kernel.anchor.alibi_slopes, SLOPES * relative, rtol=1e-15)
    np.testing.assert_allclose(kernel.anchor.head_weights, (1 - SHARES[:, None] + SHARES[:, None] * relative) / H,
                               rtol=1e-15)
    assert abs(relative.mean() - 1.0) < 1e-15


def test_the_yaml_form_round_trips(measured_logits, tmp_path):
    model = _model(_tables(measured_logits))
    jaxroll.save_config(model, tmp_path / "config.yaml")
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["kernel_config"]["kernel_type"] == "anchored_gain_table" and "alibi_slopes" in config["attention_config"]
    loaded = jaxroll.load_config(tmp_path / "config.yaml")
    assert isinstance(loaded.kernel, AnchoredTableKernel)
    change = interventions.parse("tau=0.8,slope_scale=1.3,kappa=-0.4")
    np.testing.assert_allclose(jaxroll.influence(interventions.apply_all(loaded, change)),
                               jaxroll.influence(interventions.apply_all(model, change)), rtol=0, atol=1e-12)


def test_gradients_match_central_differences(measured_logits):
    model = _model(_tables(measured_logits))

    def middle(params):
        scale, kappa = params
        changed = interventions.DistanceBias(kappa).apply(interventions.SlopeScale(scale).apply(model))
        return jaxroll.influence(changed)[N // 2 - 2:N // 2 + 2].sum()

    at = np.array([1.2, -0.3])
    grad = np.asarray(jax.grad(middle)(at))
    step = 1e-5
    for k in range(2):
        e = np.eye(2)[k] * step
        np.testing.assert_allclose(grad[k], (middle(at + e) - middle(at - e)) / (2 * step), rtol=0, atol=1e-7)


def test_bad_anchors_are_refused_in_one_line(measured_logits):
    rows, weights = _tables(measured_logits)
    sliding = AlibiKernel.create(num_layers=T, num_heads=H, mask="sliding", window=3)
    wrong = AlibiKernel.create(num_layers=T + 1, num_heads=H)
    for anchor, message in ((None, "anchor: got 'NoneType'"), (sliding, "anchor: got 'sliding'"),
                            (wrong, "the tables' 2")):
        with pytest.raises(ConfigError) as error:
            AnchoredTableKernel.create(rows, weights, GRID, anchor=anchor)
        assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="rows"):
        AnchoredTableKernel.create(rows[:, :, :, :-1], weights, GRID, anchor=_anchor())
    assert not isinstance(GainTableKernel.create(rows, weights, GRID), AnchoredTableKernel)


def test_a_sweep_over_the_slope_scale_and_tau_is_each_points_rollout(measured_logits):
    model = _model(_tables(measured_logits))
    result = jaxroll.sweep(model, slope_scale=[0.5, 2.0], tau=[0.7, 1.0], progress=False)
    for a, scale in enumerate((0.5, 2.0)):
        for b, tau in enumerate((0.7, 1.0)):
            point = interventions.Temperature(tau).apply(interventions.SlopeScale(scale).apply(model))
            np.testing.assert_allclose(np.asarray(result.profiles)[a, b], jaxroll.influence(point),
                                       rtol=0, atol=1e-12)


def test_a_config_with_a_mask_other_than_causal_is_refused_in_one_line(measured_logits, tmp_path):
    jaxroll.save_config(_model(_tables(measured_logits)), tmp_path / "config.yaml")
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["mask_config"] = {"mask_type": "full", "window_size": None}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as error:
        jaxroll.load_config(tmp_path / "config.yaml")
    assert "mask_config.mask_type: got 'full'" in str(error.value) and "\n" not in str(error.value)


def test_forces_read_a_measured_alibi_configs_analytic_kernel(measured_logits, tmp_path):
    from jaxroll.cli import main

    jaxroll.save_config(_model(_tables(measured_logits)), tmp_path / "config.yaml")
    assert main(["forces", str(tmp_path / "config.yaml"), "--out", str(tmp_path / "forces")]) == 0
    analytic = jaxroll.RolloutModel.create(kernel=_anchor(), lambdas=LAMBDAS, sequence_length=N)
    full = np.loadtxt(tmp_path / "forces" / "forces.csv", delimiter=",", skiprows=1)[:, -1]  # every force on
    np.testing.assert_allclose(full, jaxroll.influence(analytic), rtol=0, atol=1e-6)  # float32 by default


def test_the_models_alibi_fields_read_its_analytic_kernel(measured_logits):
    model = _model(_tables(measured_logits))
    np.testing.assert_array_equal(model.alibi_slopes, SLOPES)
    np.testing.assert_array_equal(model.diagonal_scores, CONTENT)


def test_per_head_values_the_tables_cannot_hold_are_refused_in_one_line(measured_logits):
    model = _model(_tables(measured_logits))
    assert model.num_heads == H
    same = interventions.DistanceBias(np.full((T, H), -0.3)).apply(model)  # a per-layer value at full shape
    np.testing.assert_allclose(jaxroll.influence(same), jaxroll.influence(interventions.DistanceBias(-0.3).apply(model)),
                               rtol=0, atol=1e-12)
    with pytest.raises(ConfigError) as error:
        interventions.DistanceBias(np.array([[-0.3, 0.0, 0.3]] * T)).apply(model)
    assert "kappa: got" in str(error.value) and "heads' mean rows" in str(error.value)
    assert "\n" not in str(error.value)


def test_sinks_beyond_the_tables_read_the_analytic_kernel_while_the_tables_move_nothing(measured_logits):
    model = _model(_tables(measured_logits))
    analytic = jaxroll.RolloutModel.create(kernel=_anchor(), lambdas=LAMBDAS, probability_shares=SHARES,
                                          sequence_length=N)
    sinks = interventions.SinkTokens(3)
    np.testing.assert_allclose(jaxroll.influence(sinks.apply(model)), jaxroll.influence(sinks.apply(analytic)),
                               rtol=0, atol=1e-12)
    shorter = interventions.SinkTokens(3).apply(dataclasses.replace(model, sequence_length=N - 3))  # within N
    np.testing.assert_allclose(jaxroll.influence(shorter), jaxroll.influence(
        sinks.apply(dataclasses.replace(analytic, sequence_length=N - 3))), rtol=0, atol=1e-12)
    tempered = interventions.Temperature(0.7).apply(model)
    with pytest.raises(ConfigError) as error:  # the tables moved: they hold N positions only
        sinks.apply(tempered)
    assert "sinks" in str(error.value) and "\n" not in str(error.value)


def test_a_length_beyond_the_tables_is_refused_in_one_line_naming_the_way_out(measured_logits):
    with pytest.raises(ConfigError) as error:
        dataclasses.replace(_model(_tables(measured_logits)), sequence_length=N + 1).kernel.check_length(N + 1)
    assert f"n: got {N + 1}" in str(error.value) and "--stats lambda,content,influence,paths" in str(error.value)
    assert "\n" not in str(error.value)
