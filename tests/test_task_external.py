"""`jaxroll compare-task --accuracy`: an external accuracy table against the rollout's span mass.

Oracles written here: the span mass as a NumPy sum over the record's
positions (the positions of a fractional span found by interval overlap,
not by the reader's floor/ceil); the link's maximum-likelihood property by
finite differences of a binomial log-likelihood written here, its recovery
of the parameters that generated noiseless data, its closed-form constant
when the slope is pinned at 0; Spearman against scipy; Wilson's interval
against its textbook value. Refusals: one line, exit 2, before --out exists.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxroll import ConfigError
from jaxroll.task import external
from tiny_tokenizer import run_cli as _run

HEADER = "setting,length,start,end,accuracy,n_cases,floor,ceiling\n"


def _write(tmp_path, text, name="table.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _profile(length, seed):
    p = np.random.default_rng(seed).uniform(0.01, 1.0, length)
    return p / p.sum()


def _oracle_mass(profile, start, end):
    return float(np.sum([profile[j] for j in range(start, end)]))


def test_span_mass_is_the_numpy_sum_over_the_records_positions(tmp_path):
    rows = [("a", 40, 0, 4), ("a", 40, 17, 23), ("a", 40, 39, 40), ("b", 64, 5, 64), ("b", 64, 31, 32)]
    text = HEADER + "".join(f"{s},{n},{a},{b},0.5,10,0,1\n" for s, n, a, b in rows)
    table = external.read_accuracy_table(_write(tmp_path, text))
    profiles = {40: _profile(40, 0), 64: _profile(64, 1)}
    masses = external.span_masses(table, profiles)
    expected = [_oracle_mass(profiles[n], a, b) for _, n, a, b in rows]
    np.testing.assert_allclose(masses, expected, rtol=0, atol=1e-12)
    # The comparison carries the same masses (profile_at called once per length).
    calls = []
    result = external.compare_accuracy_table(table, lambda n: calls.append(n) or profiles[n], fit_settings=["a"],
                                             resamples=50)
    np.testing.assert_allclose(result.masses, expected, rtol=0, atol=1e-12)
    assert sorted(calls) == [40, 64]


def test_a_fractional_span_covers_every_token_its_interval_touches(tmp_path):
    spans = [(0.0, 0.1), (0.25, 0.3), (0.33, 0.34), (0.9, 1.0), (0.5, 0.5001)]
    text = "length,start_fraction,end_fraction,accuracy,n_cases\n" + "".join(
        f"37,{a},{b},0.5,3\n" for a, b in spans)
    table = external.read_accuracy_table(_write(tmp_path, text))
    profile = _profile(37, 2)
    masses = external.span_masses(table, {37: profile})
    for (a, b), mass in zip(spans, masses):
        touched = [j for j in range(37) if j < b * 37 and j + 1 > a * 37]  # [j, j + 1) meets [a L, b L)
        assert abs(mass - float(np.sum(profile[touched]))) <= 1e-12, (a, b)
    assert table.settings == ("L=37",) * 5  # no setting column: the length names the setting


def _log_likelihood(a, b, x, y, n, floor, ceiling):
    pi = floor + (ceiling - floor) / (1 + np.exp(-(a + b * np.log(x))))
    return float(np.sum(n * (y * np.log(pi) + (1 - y) * np.log(1 - pi))))


def test_the_link_is_monotone_within_floor_and_ceiling_and_the_likelihoods_maximum():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.001, 0.2, 12)
    n = rng.integers(20, 200, 12).astype(float)
    floor, ceiling = 0.3, 0.85
    truth = floor + (ceiling - floor) / (1 + np.exp(-(4.0 + 1.5 * np.log(x))))
    y = rng.binomial(n.astype(int), truth) / n
    link = external.fit_link(x, y, n, floor, ceiling)
    assert link.b > 0
    grid = np.logspace(-30, 0, 400)
    values = link(grid, floor, ceiling)
    assert np.all(np.diff(values) >= 0)
    assert np.all(values >= floor) and np.all(values <= ceiling)
    h = 1e-5  # the gradient of the log-likelihood vanishes at the fit (central differences)
    for da, db in ((h, 0), (0, h)):
        slope = (_log_likelihood(link.a + da, link.b + db, x, y, n, floor, ceiling)
                 - _log_likelihood(link.a - da, link.b - db, x, y, n, floor, ceiling)) / (2 * h)
        assert abs(slope) < 1e-4 * n.sum()


def test_the_link_recovers_the_parameters_of_noiseless_data_and_is_flat_when_accuracy_falls():
    x = np.logspace(-3, -0.5, 9)
    floor, ceiling = np.full(9, 0.1), np.full(9, 0.9)
    y = floor + (ceiling - floor) / (1 + np.exp(-(2.0 + 0.8 * np.log(x))))
    link = external.fit_link(x, y, np.full(9, 100.0), floor, ceiling)
    assert abs(link.a - 2.0) < 1e-6 and abs(link.b - 0.8) < 1e-6
    # Accuracy falling with mass: the best non-decreasing link is flat, at the maximum-likelihood constant,
    # the n-weighted mean accuracy (inside the floor and ceiling here).
    n = np.arange(1, 10) * 10.0
    falling = np.linspace(0.8, 0.2, 9)
    flat = external.fit_link(x, falling, n, 0.0, 1.0)
    assert flat.b == 0.0
    np.testing.assert_allclose(flat(x), np.average(falling, weights=n), rtol=0, atol=1e-9)


def test_spearman_and_wilson_against_their_oracles():
    from scipy import stats

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=15), rng.integers(0, 5, 15).astype(float)  # ties in y
    assert abs(external.spearman(x, y) - stats.spearmanr(x, y).statistic) < 1e-12
    assert math.isnan(external.spearman(x, np.ones(15)))
    low, high = external.wilson_interval(0.5, 100)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 100 + z * z / 40000) / (1 + z * z / 100)
    assert abs(low - (0.5 - half)) < 1e-12 and abs(high - (0.5 + half)) < 1e-12


def test_the_noise_ceiling_is_the_expected_spearman_of_the_true_accuracies_by_enumeration():
    """Every outcome of three rows of 4 cases (5^3) with its binomial probability, scipy's Spearman each: the
    exact expectation. 20,000 draws: the Monte-Carlo standard error is below sd / sqrt(20000) < 0.008."""
    import itertools

    from scipy import stats

    y, n = np.array([0.25, 0.5, 0.75]), np.array([4, 4, 4])
    p, shrink = external.true_accuracies(y, n)
    # by hand: var(y) = 1/16; noise = mean(y (1 - y) / 3) = (3/16 + 1/4 + 3/16) / 9 = 5/72
    assert shrink == 0.0 and np.all(p == 0.5)  # the spread is within the noise: nothing to rank
    assert math.isnan(external.noise_ceiling(y, n, resamples=50, rng=0)["spearman_ceiling"])
    y, n = np.array([0.1, 0.5, 0.9]), np.array([4, 4, 4])
    p, shrink = external.true_accuracies(y, n)
    spread, noise = 0.16, (0.09 + 0.25 + 0.09) / 3 / 3
    assert abs(shrink - math.sqrt((spread - noise) / spread)) < 1e-12
    np.testing.assert_allclose(p, 0.5 + shrink * (y - 0.5), rtol=0, atol=1e-15)
    expected, weight = 0.0, 0.0
    for k in itertools.product(range(5), repeat=3):
        chance = math.prod(stats.binom.pmf(ki, 4, pi) for ki, pi in zip(k, p))
        if len(set(k)) > 1:  # a constant draw has no Spearman and is left out
            expected += chance * stats.spearmanr(p, k).statistic
            weight += chance
    ceiling = external.noise_ceiling(y, n, resamples=20_000, rng=1)
    assert abs(ceiling["spearman_ceiling"] - expected / weight) < 0.02, (ceiling, expected / weight)
    low, high = ceiling["spearman_ceiling_interval"]
    assert -1 <= low < ceiling["spearman_ceiling"] < high <= 1


def test_the_noise_ceiling_rises_with_the_cases_a_row_towards_one():
    y = np.linspace(0.1, 0.6, 8)
    ceilings = [external.noise_ceiling(y, np.full(8, k), resamples=500, rng=2)["spearman_ceiling"]
                for k in (20, 200, 20_000)]
    assert ceilings[0] < ceilings[1] < ceilings[2] and ceilings[2] > 0.99, ceilings


def _two_settings(tmp_path):
    lines = []
    for setting, length, docs in (("docs=5", 50, 5), ("docs=10", 100, 10)):
        for i in range(docs):
            a, b = i * length // docs, (i + 1) * length // docs
            accuracy = 0.8 - 0.3 * math.sin(math.pi * (i + 0.5) / docs)
            lines.append(f"{setting},{length},{a},{b},{accuracy:.3f},{40 + i},0.2,0.9\n")
    return _write(tmp_path, HEADER + "".join(lines))


def test_the_link_is_fitted_on_the_named_settings_and_tested_on_the_others(tmp_path):
    from scipy import stats

    table = external.read_accuracy_table(_two_settings(tmp_path))
    profiles = {50: _profile(50, 5), 100: _profile(100, 6)}
    result = external.compare_accuracy_table(table, profiles.__getitem__, fit_settings=["docs=5"], resamples=200)
    fit = np.array([s == "docs=5" for s in table.settings])
    assert result.fit_settings == ["docs=5"] and result.held_settings == ["docs=10"]
    np.testing.assert_array_equal(result.fitted, fit)
    by_hand = external.fit_link(result.masses[fit], table.accuracy[fit], table.n_cases[fit], 0.2, 0.9)
    assert (by_hand.a, by_hand.b) == (result.link.a, result.link.b)
    held = result.scores["held out"]
    y, n, p = table.accuracy[~fit], table.n_cases[~fit], result.predicted[~fit]
    assert abs(held["spearman"] - stats.spearmanr(result.masses[~fit], y).statistic) < 1e-12
    assert abs(held["rmse"] - math.sqrt(np.sum(n * (y - p) ** 2) / n.sum())) < 1e-12
    constant = np.average(table.accuracy[fit], weights=table.n_cases[fit])
    assert abs(held["rmse_constant"] - math.sqrt(np.sum(n * (y - constant) ** 2) / n.sum())) < 1e-12
    low, high = held["spearman_interval"]
    assert -1 <= low <= high <= 1
    assert np.all((result.predicted >= 0.2) & (result.predicted <= 0.9))
    assert any("Held out" in line and "noise ceiling" in line for line in result.statement())
    assert -1 <= held["spearman_ceiling_interval"][0] <= held["spearman_ceiling"] <= 1


def test_compare_task_accuracy_end_to_end(tmp_path, capsys):
    path = _two_settings(tmp_path)
    out = tmp_path / "compare"
    code, stdout, stderr = _run(["compare-task", "--accuracy", path, "--preset", "mpt-7b", "--fit-settings", "docs=5",
                                 "--resamples", 100, "--out", out], capsys)
    assert code == 0, stderr
    assert "Held out" in stdout
    for name in ("compare.csv", "compare.json", "compare.txt", "compare.png"):
        assert (out / name).is_file()
    summary = json.loads((out / "compare.json").read_text())
    assert summary["fit_settings"] == ["docs=5"] and summary["held_settings"] == ["docs=10"]
    import jaxroll  # the masses are sums of the preset's profile over each span

    for row in summary["rows"]:
        model = jaxroll.presets.get("mpt-7b")
        profile = np.asarray(jaxroll.influence(model, row["length"]), dtype=np.float64)
        assert abs(row["mass"] - _oracle_mass(profile, row["start"], row["end"])) < 1e-6  # float32 profile
    code, stdout, _ = _run(["compare-task", "--accuracy", path, "--preset", "mpt-7b", "--resamples", 20,
                            "--out", out, "--force", "--json"], capsys)
    assert code == 0 and json.loads(stdout)["fit_settings"] == ["docs=5"]


@pytest.mark.parametrize("text, message", [
    ("setting,length,start,end,n_cases\nx,10,0,2,5\nx,10,2,4,5\n", "missing column 'accuracy'"),
    ("length,start,end,accuracy\n10,0,2,0.5\n10,2,4,0.5\n", "missing column 'n_cases'"),
    ("length,accuracy,n_cases\n10,0.5,5\n10,0.4,5\n", "no span in the columns"),
    ("length,start,end,accuracy,n_cases,depth\n10,0,2,0.5,5,1\n10,2,4,0.5,5,1\n", "unknown column 'depth'"),
    ("length,start,end,accuracy,n_cases\n10,0,2,1.2,5\n10,2,4,0.5,5\n",
     "line 2: accuracy 1.2; allowed: a number in [0, 1]"),
    ("length,start,end,accuracy,n_cases\n10,0,2,0.5,5\n10,6,4,0.5,5\n", "line 3: start 6 >= end 4"),
    ("length,start,end,accuracy,n_cases\n10,0,2,0.5,5\n10,8,12,0.5,5\n", "line 3: span [8, 12) outside the context"),
    ("length,start_fraction,end_fraction,accuracy,n_cases\n10,0,0.5,0.5,5\n10,0.5,1.1,0.5,5\n",
     "span [0.5, 1.1) outside the context"),
    ("length,start,end,accuracy,n_cases\n10,0,2,0.5,0\n10,2,4,0.5,5\n", "line 2: n_cases 0; allowed: an integer >= 1"),
    ("length,start,end,accuracy,n_cases\n10,0,2,nan,5\n10,2,4,0.5,5\n", "line 2: accuracy nan; allowed: a finite"),
    ("length,start,end,accuracy,n_cases\n10,0,2,0.5,5\n10,2,4,0.5,5\n10,0,2,0.6,7\n",
     "line 4: the row of line 2 again"),
    ("length,start,end,accuracy,n_cases,floor,ceiling\n10,0,2,0.5,5,0.6,0.4\n10,2,4,0.5,5,0,1\n",
     "floor 0.6, ceiling 0.4"),
    ("start,end,accuracy,n_cases\n0,2,0.5,5\n2,4,0.5,5\n", "line 2: length None; allowed: a length column"),
    ("length,start,end,accuracy,n_cases\n10,0,2,0.5,5\n", "1 rows; allowed: at least 2"),
])
def test_malformed_tables_are_refused_in_one_line_with_exit_2_before_out(tmp_path, capsys, text, message):
    path = _write(tmp_path, text + "# a comment line, skipped\n")
    out = tmp_path / "out"
    code, _, stderr = _run(["compare-task", "--accuracy", path, "--out", out], capsys)
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and not out.exists()
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        external.read_accuracy_table(path)


@pytest.mark.parametrize("argv, message", [
    (["--fit-settings", "docs=7"], "--fit-settings: got 'docs=7'"),
    (["--fit-settings", "docs=5,docs=10"], "--fit-settings: names every setting"),
    (["--task", "kv"], "--task: applies to TASK_DIR only"),
    (["--score", "logprob"], "--score: applies to TASK_DIR only"),
])
def test_bad_flags_with_accuracy_are_refused_before_out(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    code, _, stderr = _run(["compare-task", "--accuracy", _two_settings(tmp_path), *argv, "--out", out], capsys)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_task_dir_and_accuracy_one_of_them(tmp_path, capsys):
    code, _, stderr = _run(["compare-task", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "give TASK_DIR or --accuracy" in stderr
    code, _, stderr = _run(["compare-task", tmp_path, "--fit-settings", "a", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "--fit-settings: applies to --accuracy only" in stderr


def test_a_byte_order_mark_and_comments_are_not_data(tmp_path):
    text = ("\ufeff# from a spreadsheet\nlength,start,end,accuracy,n_cases\n# between rows\n"
            "10,0,2,0.5,5\n10,2,4,0.25,4\n")
    table = external.read_accuracy_table(_write(tmp_path, text))
    assert table.lines.tolist() == [4, 5] and table.accuracy.tolist() == [0.5, 0.25]


def test_the_figure_says_what_was_fitted_and_what_held_out(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxroll.plot import accuracy_table_figure

    table = external.read_accuracy_table(_two_settings(tmp_path))
    profiles = {50: _profile(50, 5), 100: _profile(100, 6)}
    result = external.compare_accuracy_table(table, profiles.__getitem__, fit_settings=["docs=5"], resamples=20)
    figure = accuracy_table_figure(result, level=0.95)
    fitted, held = figure.axes[:2]
    assert fitted.get_title().startswith("docs=5: fit") and held.get_title().startswith("docs=10: held out")
    assert fitted.get_ylabel() == "accuracy" and "context length" in held.get_xlabel()
    # The predicted line of the held-out panel is the link at the held-out rows, by depth.
    line = next(item for item in held.get_lines() if item.get_label() == "predicted: link(span mass)")
    rows = sorted((r for r in result.rows() if r["setting"] == "docs=10"), key=lambda r: r["depth_fraction"])
    np.testing.assert_allclose(line.get_ydata(), [r["predicted"] for r in rows], rtol=0, atol=1e-12)


def test_one_setting_is_fitted_and_says_nothing_is_held_out(tmp_path):
    text = HEADER + "".join(f"a,30,{3 * i},{3 * i + 3},{0.3 + 0.05 * i:.2f},20,0,1\n" for i in range(6))
    table = external.read_accuracy_table(_write(tmp_path, text))
    result = external.compare_accuracy_table(table, lambda n: _profile(n, 7), resamples=20)
    assert list(result.scores) == ["fitted"] and result.held_settings == []
    assert any("no out-of-sample test" in line for line in result.statement())


def test_with_accuracy_the_one_positional_is_the_rollout_config(tmp_path, capsys):
    import jaxroll

    config = tmp_path / "rollout.yaml"
    jaxroll.io.save_config(jaxroll.presets.get("bloom-7b1"), config)
    out = tmp_path / "compare"
    code, _, stderr = _run(["compare-task", "--accuracy", _two_settings(tmp_path), config, "--resamples", 20,
                            "--out", out], capsys)
    assert code == 0, stderr
    assert json.loads((out / "compare.json").read_text())["source"] == str(config)
