"""Every row scored (`jaxroll.measure.row_scores`), the by-distance buffer, and the commands that use them.

Oracles: a plain NumPy bootstrap of each row written here (the same
``default_rng(seed).multinomial`` draws), Holm's rule worked by hand, a
NumPy loop for `by_distance`'s buffer, `fit_power_law` for the vectorised
refits, and a known exponent for the bootstrap interval.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxroll.errors import ConfigError
from jaxroll.measure.row_scores import _distance_curves, _fit_exponents, distance_exponent, holm, score_rows
from jaxroll.theory.baselines import by_distance, fit_power_law
from tiny_tokenizer import run_cli


def _power_rows(queries, length, exponent, floor=0.002):
    """(K, N) causal rows ``floor + (q - j + 1)^-exponent`` on 0..q, each normalised."""
    rows = np.zeros((len(queries), length))
    for k, q in enumerate(queries):
        rows[k, : q + 1] = floor + (q - np.arange(q + 1) + 1.0) ** -exponent
    return rows / rows.sum(axis=1, keepdims=True)


def _measured(truth, sequences, seed=0):
    """(S, K, N) gradient norms around `truth`: per-position and per-sequence gamma noise."""
    rng = np.random.default_rng(seed)
    return (truth[None] * rng.gamma(2.0, 0.5, (sequences, *truth.shape))
            * rng.gamma(5.0, 0.2, (sequences, 1, 1)))


QUERIES = np.array([7, 15, 23, 31])


def test_each_row_is_a_plain_numpy_bootstrap_on_positions_0_to_q():
    truth = _power_rows(QUERIES, 32, 0.8)
    predicted = _power_rows(QUERIES, 32, 0.7)
    rows = _measured(truth, 12)
    resamples, seed = 200, 5
    result = score_rows(predicted, rows, QUERIES, B=resamples, seed=seed)
    for k, q in enumerate(QUERIES):
        g = rows[:, k, : q + 1]
        p = predicted[k, : q + 1] / predicted[k, : q + 1].sum()
        m = g.sum(axis=0) / g.sum()
        counts = np.random.default_rng(seed).multinomial(12, [1 / 12] * 12, size=resamples)
        noise_draws = np.empty(resamples)
        for b in range(resamples):
            drawn = counts[b] @ g
            drawn = drawn / drawn.sum()
            noise_draws[b] = np.abs(np.cumsum(drawn - m)[:-1]).sum() / q * math.sqrt(12 / 11)
        w1 = np.abs(np.cumsum(p - m)[:-1]).sum() / q
        noise = np.median(noise_draws)
        assert result.queries[k] == q
        np.testing.assert_allclose(result.w1[k], w1, rtol=1e-12, atol=0)
        np.testing.assert_allclose(result.noise[k], noise, rtol=1e-12, atol=0)
        np.testing.assert_allclose(result.ratio[k], w1 / noise, rtol=1e-12, atol=0)
        assert result.p_value[k] == (1 + np.sum(noise_draws >= w1)) / (resamples + 1)
    summary = result.summary()
    assert summary["rows"] == 4 and summary["ratio_max"] == result.ratio.max()
    assert summary["ratio_median"] == pytest.approx(np.median(result.ratio), abs=0)
    document = json.loads(json.dumps(result.as_dict()))
    assert [row["query"] for row in document["rows"]] == QUERIES.tolist()
    assert document["summary"]["holm_rejected"] == int(result.holm_rejected.sum())
    with pytest.raises(ValueError):
        result.ratio[0] = 0.0  # the arrays are read-only


def test_holm_against_a_hand_worked_example():
    # Sorted: 0.005 * 4 = 0.02 <= 0.05 (reject), 0.01 * 3 = 0.03 (reject), 0.03 * 2 = 0.06 > 0.05: stop there,
    # so 0.04 is kept too although 0.04 * 1 <= 0.05 (step-down, not each on its own).
    rejected, adjusted = holm([0.01, 0.04, 0.03, 0.005], 0.05)
    assert rejected.tolist() == [True, False, False, True]
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02], rtol=1e-15)
    rejected, adjusted = holm([0.2, 0.001], 0.05)
    assert rejected.tolist() == [False, True] and adjusted.tolist() == [0.2, 0.002]
    assert holm([0.9, 0.8])[1].tolist() == [1.0, 1.0]  # 2 * 0.8 capped at 1; then max(1, 0.9)


def test_a_wrong_row_is_rejected_and_a_right_one_kept():
    truth = _power_rows(QUERIES, 32, 0.8)
    predicted = truth.copy()
    predicted[2] = _power_rows(QUERIES[2:3], 32, 0.1)[0]  # one row far off
    result = score_rows(predicted, _measured(truth, 40, seed=1), QUERIES, B=199)
    assert result.holm_rejected.tolist() == [False, False, True, False]
    assert result.summary()["holm_rejected"] == 1 and result.summary()["ratio_max_query"] == QUERIES[2]
    assert result.summary()["holm_can_reject"]  # 1/200 <= 0.05/4


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_by_distance_buffer_against_a_loop(statistic):
    rng = np.random.default_rng(3)
    queries = np.array([4, 9, 17, 30])
    rows = rng.random((4, 31))
    reduce = np.mean if statistic == "mean" else np.median
    for buffer in (0, 1, 3):
        expected = []
        for d in range(queries.max() - buffer + 1):
            expected.append(reduce([rows[k, q - d] for k, q in enumerate(queries) if q - d >= buffer]))
        r, values = by_distance(rows, queries, statistic, buffer=buffer)
        np.testing.assert_array_equal(r, np.arange(queries.max() - buffer + 1))
        np.testing.assert_allclose(values, expected, rtol=1e-15, atol=0)
        batched = _distance_curves(np.stack([rows, rows[::-1] * 0 + rows]), queries, statistic, buffer)
        np.testing.assert_allclose(batched[0], expected, rtol=1e-13, atol=0)
    np.testing.assert_array_equal(by_distance(rows, queries, statistic)[1],
                                  by_distance(rows, queries, statistic, buffer=0)[1])
    for bad in (-1, 31, 1.5):
        with pytest.raises(ConfigError, match="buffer"):
            by_distance(rows, queries, statistic, buffer=bad)


def test_vectorised_refits_agree_with_fit_power_law():
    rng = np.random.default_rng(4)
    r = np.arange(1, 60.0)
    curves = 0.01 + 0.5 * (r + 1) ** -0.8 + rng.normal(0, 0.003, (6, r.size))
    curves[0] = 0.3 * (r + 1) ** -2.5  # a steep, noiseless one
    exponents = _fit_exponents(r + 1, curves)
    expected = [fit_power_law(r, curve).p for curve in curves]
    np.testing.assert_allclose(exponents, expected, rtol=1e-6)


def test_the_bootstrap_interval_covers_the_truth_and_is_wider_than_the_fit():
    queries = np.array([31, 47, 63, 79, 95, 111, 127])
    truth_rows = _power_rows(queries, 128, 0.8)
    truth = distance_exponent(truth_rows, queries)  # the curve the sequences are drawn around
    assert truth["interval_kind"] == "fit" and truth["p_interval"] == truth["fit_p_interval"]
    assert truth["resamples"] is None and "no sequences" in truth["note"]
    measured = distance_exponent(_measured(truth_rows, 48, seed=2), queries, B=1000, seed=0)
    assert measured["interval_kind"] == "bootstrap" and measured["resamples"] == 1000
    low, high = measured["p_interval"]
    assert low < truth["p"] < high
    fit_low, fit_high = measured["fit_p_interval"]
    assert high - low > 2 * (fit_high - fit_low)
    assert measured["draws_at_bound"] == 0 and len(measured["curve"]) == 127
    buffered = distance_exponent(_measured(truth_rows, 48, seed=2), queries, B=50, buffer=4, statistic="mean")
    assert buffered["buffer"] == 4 and buffered["distances"][-1] == 127 - 4


@pytest.mark.parametrize("change, message", [
    (lambda p, g, q: (p[:-1], g, q[:-1]), "rows_per_sequence: got shape"),
    (lambda p, g, q: (p, g[:, :, :-1], q), "rows_per_sequence: got shape"),
    (lambda p, g, q: (p, np.where(g > 0.01, np.nan, g), q), "NaN"),
    (lambda p, g, q: (p, -g, q), "negative"),
    (lambda p, g, q: (p * 1.1, g, q), "sums to"),
    (lambda p, g, q: (p, g, q + 20), "queries: position"),
    (lambda p, g, q: (p, g, q[:2]), "queries: got shape"),
    (lambda p, g, q: (p, g[:1], q), "S >= 2"),
])
def test_bad_input_is_one_line(change, message):
    truth = _power_rows(QUERIES, 32, 0.8)
    predicted, rows, queries = change(truth, _measured(truth, 6), QUERIES)
    with pytest.raises(ConfigError, match=message) as error:
        score_rows(predicted, rows, queries, B=10)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError):
        distance_exponent(np.zeros((3, 4, 5, 6)), QUERIES)


@pytest.fixture(scope="module")
def measurement(tmp_path_factory):
    """A measurement folder with rows (drawn around the rows of mpt-7b at N = 32) and its config.yaml."""
    import jax

    from jaxroll import io, presets
    from jaxroll.theory.rows import predicted_rows, query_positions

    folder = tmp_path_factory.mktemp("measured")
    model = presets.get("mpt-7b", 32)
    io.save_config(model, folder / "config.yaml")
    queries = query_positions(32, 4)
    with jax.enable_x64(True):
        truth = predicted_rows(model, queries)
    rows = _measured(truth, 16)
    np.savez(folder / "measurement.npz", influence_rows_per_sequence=rows, query_positions=queries,
             influence_per_sequence=rows[:, -1])
    io.write_profile(truth[-1], folder / "predicted.csv")
    old = tmp_path_factory.mktemp("old")
    np.savez(old / "measurement.npz", influence_per_sequence=rows[:, -1])
    return folder, old


def test_score_and_compare_score_every_row(measurement, tmp_path, capsys):
    folder, _ = measurement
    code, out, err = run_cli(["score", folder / "predicted.csv", "--measured", folder, "--rows-config",
                              folder / "config.yaml", "--out", tmp_path / "rows", "--resamples", 50], capsys)
    assert code == 0, err
    assert "W1/noise over rows" in out and "Holm" in out and "by distance, measured" in out
    document = json.loads((tmp_path / "rows" / "rows.json").read_text())
    assert [row["query"] for row in document["rows"]] == [8, 16, 23, 31]  # query_positions(32, 4)
    assert document["distance"]["measured"]["interval_kind"] == "bootstrap"
    assert (tmp_path / "rows" / "rows.png").stat().st_size > 0
    code, out, err = run_cli(["compare", folder / "predicted.csv", folder / "predicted.csv", "--measured", "-",
                              "--measured", folder,
                              "--rows-config", folder / "config.yaml", "--out", tmp_path / "compare",
                              "--resamples", 50], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "compare" / "rows.json").read_text())["rows"] == document["rows"]


def test_row_options_refused_in_one_line(measurement, tmp_path, capsys):
    folder, old = measurement
    csv, config = folder / "predicted.csv", folder / "config.yaml"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "rows.json").write_text("{}")
    for argv, message in (
            (["score", csv, "--measured", old, "--rows-config", config, "--out", tmp_path / "a"],
             "influence_rows_per_sequence"),
            (["score", "--measured", folder, "--rows-config", tmp_path / "none.yaml"], "no such file"),
            (["score", "--measured", folder], "give PREDICTED.csv"),
            (["score", csv, "--measured", folder, "--buffer", "2"], "applies to --rows-config only"),
            (["score", csv, "--measured", folder, "--rows-config", config, "--out", tmp_path / "taken"],
             "rows.json exists"),
            (["compare", csv, csv, "--rows-config", config], "exactly one --measured DIR")):
        code, _, err = run_cli(argv, capsys)
        assert code == 2, argv
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "a").exists()


def test_score_rows_config_refined_scores_the_measurements_own_refined_rows(measurement, tmp_path, capsys):
    """``--rows-config refined`` reads ``refined_rows`` (what ``measure --refine S --queries K`` writes) beside the
    measured rows; each row's W1 is checked against a plain NumPy W1 on positions 0..q (1e-12: same float64 sums)."""
    source, _ = measurement
    folder = tmp_path / "refined"
    folder.mkdir()
    with np.load(source / "measurement.npz") as data:
        arrays = dict(data)
    rows, queries = arrays["influence_rows_per_sequence"], arrays["query_positions"]
    refined = np.linspace(1.0, 2.0, rows.shape[2])[None, :] * (np.arange(rows.shape[2]) <= queries[:, None])
    refined /= refined.sum(-1, keepdims=True)
    np.savez(folder / "measurement.npz", **arrays, refined_rows=refined)
    (folder / "metadata.json").write_text(json.dumps({"refined": {"switches": ["heads"]}}))
    code, out, err = run_cli(["score", "--measured", folder, "--rows-config", "refined", "--out",
                              tmp_path / "out", "--resamples", 50], capsys)
    assert code == 0, err
    document = json.loads((tmp_path / "out" / "rows.json").read_text())
    measured = rows.mean(0) / rows.mean(0).sum(-1, keepdims=True)
    for k, q in enumerate(queries):
        p, m = refined[k, : q + 1] / refined[k, : q + 1].sum(), measured[k, : q + 1]
        expected = np.abs(np.cumsum(p - m))[:-1].sum() / q
        assert abs(document["rows"][k]["w1"] - expected) < 1e-12
    # Without refined rows in the measurement: one line, exit 2.
    code, _, err = run_cli(["score", "--measured", source, "--rows-config", "refined", "--out",
                            tmp_path / "none"], capsys)
    assert code == 2 and "no refined_rows" in err and len(err.strip().splitlines()) == 1
