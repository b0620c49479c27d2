"""`jaxroll.measure.uncertainty` against independent oracles.

Oracles: `scipy.stats.bootstrap` (its own resampling of sequence indices,
its basic interval, bootstrap distribution and standard error; for the
studentised interval its distribution of a pivot formed here) with the
measured profile formed here in plain NumPy; `jaxroll.metrics` (the JAX
distances); Kish's formula written out; central finite differences for W1's
linear terms; the spread of W1 over many plain-NumPy simulated measurements
for its standard error; a simulation with known truths (multinomial rows
around a known profile, written here independently of
benchmarks/uncertainty.py), whose rates are judged by their binomial
standard errors.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from jaxroll.measure.uncertainty import (JSON_FIELDS, bootstrap_interval, effective_sequences, profile_band,
                                         profile_from_rows, score, studentised_interval, w1_linear_terms,
                                         w1_standard_error, wasserstein)

N = 16


def u_shape(length):
    x = np.linspace(-1, 1, length)
    p = (1 + 3 * x ** 2) * np.exp(0.5 * x)
    return p / p.sum()


def plain_profile(rows):
    """The measured profile as `jaxroll.measure.measure` forms it: summed gradient norms, normalised."""
    total = rows.sum(axis=0)
    return total / total.sum()


def plain_w1(p, q):
    return float(np.abs(np.cumsum(p - q)[:-1]).sum() / (p.size - 1))


def plain_w1_standard_error(predicted, rows):
    """W1's delta-method standard error written from each row's own profile r_s: the direction W1 moves towards r_s.

    ``L_s = (w_s / mean(w)) sum_{j < N-1} sign(F_m - F_p)(j) (F_{r_s} - F_m)(j) / (N - 1)``,
    ``se^2 = sum L_s^2 / (S (S-1))``.
    """
    masses = rows.sum(axis=1)
    cumulative = np.cumsum(plain_profile(rows))
    sign = np.sign(cumulative - np.cumsum(predicted))[:-1]
    own = np.cumsum(rows / masses[:, None], axis=1)
    terms = masses / masses.mean() * ((own - cumulative)[:, :-1] @ sign) / (rows.shape[1] - 1)
    return math.sqrt(np.sum(terms ** 2) / (len(rows) * (len(rows) - 1)))


def multinomial_rows(mu, sequences, rng):
    """Rows of token counts ``~ Multinomial(T_s, mu)`` with ``T_s = 1 + Poisson(Gamma(1.5, 40))``: unequal masses."""
    totals = 1 + rng.poisson(rng.gamma(1.5, 40.0, size=sequences))
    return np.stack([rng.multinomial(total, mu) for total in totals]).astype(np.float64)


def test_point_estimates_equal_jaxroll_metrics():
    from jaxroll import metrics

    rows = np.random.default_rng(0).gamma(2.0, size=(30, N))
    predicted = u_shape(N)
    result = score(predicted, rows, B=50)
    reference = metrics.compare(plain_profile(rows), predicted)  # kl(measured || predicted), in float64
    assert result.w1 == pytest.approx(float(reference.wasserstein), rel=1e-12)
    assert result.spearman == pytest.approx(float(reference.spearman), rel=1e-12)
    assert result.kl == pytest.approx(float(reference.kl), rel=1e-10)
    assert result.ratio == pytest.approx(result.w1 / result.noise, rel=1e-15)
    assert result.ratio_interval == pytest.approx(tuple(v / result.noise for v in result.w1_interval), rel=1e-15)


def test_against_scipy_bootstrap():
    # scipy resamples the sequence indices itself; the statistic forms each resample's profile here.
    rng = np.random.default_rng(1)
    rows = rng.gamma(2.0, size=(60, 32)) * rng.gamma(1.5, size=(60, 1))
    predicted = u_shape(32)
    measured = plain_profile(rows)
    resamples = 4000
    result = score(predicted, rows, B=resamples, seed=0)
    statistics = {
        "w1": lambda index: plain_w1(predicted, plain_profile(rows[index])),
        "kl": lambda index: float(np.sum((q := plain_profile(rows[index])) * np.log(q / predicted))),
        "spearman": lambda index: stats.spearmanr(predicted, plain_profile(rows[index])).statistic,
        # The plug-in spread of a resampled mean is sqrt((S - 1) / S) of a sample mean's: scaled back.
        "noise": lambda index: plain_w1(plain_profile(rows[index]), measured) * math.sqrt(60 / 59),
    }
    draws = {}
    for name, statistic in statistics.items():
        reference = stats.bootstrap((np.arange(60),), statistic, vectorized=False, n_resamples=resamples,
                                    method="basic", random_state=np.random.default_rng(7))
        values = reference.bootstrap_distribution
        draws[name] = values
        # Two Monte Carlo estimates of a 2.5 % quantile from B = 4000 draws differ by about 0.06 bootstrap
        # standard deviations, of a mean by 0.02: allow 0.25 and 0.1.
        tolerance = 0.25 * values.std()
        if name == "noise":
            assert result.noise == pytest.approx(np.median(values), abs=tolerance)
            assert result.noise_q95 == pytest.approx(np.quantile(values, 0.95), abs=tolerance)
            continue
        estimate = getattr(result, name)
        low, high = np.quantile(values, [0.025, 0.975])
        basic = reference.confidence_interval
        hull = (min(basic.low, low), max(basic.high, high))
        if name == "w1":
            # The studentised interval: scipy's distribution of the pivot (W1* - W1) / se*, se* formed here.
            se_hat = plain_w1_standard_error(predicted, rows)
            pivots = stats.bootstrap((np.arange(60),), lambda index: (plain_w1(predicted, plain_profile(
                rows[index])) - estimate) / plain_w1_standard_error(predicted, rows[index]), vectorized=False,
                n_resamples=resamples, method="percentile", random_state=np.random.default_rng(8))
            t_low, t_high = np.quantile(pivots.bootstrap_distribution, [0.025, 0.975])
            hull = (min(hull[0], estimate - t_high * se_hat), max(hull[1], estimate - t_low * se_hat))
            assert result.w1_standard_error == pytest.approx(se_hat, rel=1e-12)
        bounds = {"w1": (0, 1), "kl": (0, np.inf), "spearman": (-1, 1)}[name]
        expected = tuple(float(np.clip(v, *bounds)) for v in hull)
        got = getattr(result, f"{name}_interval")
        if name in ("w1", "kl") and result.p_value > 0.025:
            expected = (0.0, expected[1])  # the one-sided test at 2.5 % keeps 0, and so does the interval
        assert got == pytest.approx(expected, abs=tolerance), (name, got, expected)
        assert getattr(result, f"{name}_bias_corrected") == pytest.approx(
            float(np.clip(2 * estimate - values.mean(), *bounds)), abs=0.1 * values.std())
    # The p-value: the share of W1(m*, m) at least W1(p, m), +1: a binomial share of 4000 (sd <= 0.008).
    expected_p = (1 + np.sum(draws["noise"] >= result.w1)) / (resamples + 1)
    assert result.p_value == pytest.approx(expected_p, abs=0.025)


def test_intervals_contain_their_estimate_and_respect_the_range():
    rng = np.random.default_rng(3)
    for replicate in range(20):
        mu = u_shape(N)
        rows = multinomial_rows(mu, 24, rng)
        for predicted in (mu, np.full(N, 1 / N), u_shape(N)[::-1].copy()):
            result = score(predicted, rows, B=100, seed=replicate)
            for name, (bottom, top) in (("w1", (0, 1)), ("spearman", (-1, 1)), ("kl", (0, np.inf))):
                low, high = getattr(result, f"{name}_interval")
                assert bottom <= low <= getattr(result, name) <= high <= top, (name, low, high)
    assert bootstrap_interval(np.inf, [1.0, np.inf], 0.95, (0, np.inf)) == (np.inf, np.inf)


def test_effective_sequences_is_kish():
    masses = np.array([1.0, 2.0, 3.0, 10.0])
    rows = masses[:, None] * np.full((4, N), 1.0 / N)
    assert effective_sequences(rows) == pytest.approx(16.0 ** 2 / (1 + 4 + 9 + 100), rel=1e-12)
    assert effective_sequences(np.ones((7, N))) == pytest.approx(7.0, rel=1e-12)
    assert score(u_shape(N), rows, B=10).n_eff == pytest.approx(256 / 114, rel=1e-12)


def tilted_far(mu, a=1.5):
    """``mu exp(a x)`` normalised: far enough from mu that F_m never crosses F_p (W1 is linear in m there)."""
    p = mu * np.exp(a * np.linspace(-1, 1, mu.size))
    return p / p.sum()


def test_w1_linear_terms_are_derivatives():
    # S times the derivative of W1(p, m(c)) in each count c_s, by central differences of the plain formula.
    rng = np.random.default_rng(6)
    rows = rng.gamma(2.0, size=(12, 10)) * rng.gamma(1.5, size=(12, 1))
    predicted = u_shape(10)
    counts = np.stack([np.ones(12), rng.multinomial(12, np.full(12, 1 / 12)).astype(float)])
    terms = w1_linear_terms(predicted, rows, counts)
    step = 1e-6
    for c, row in zip(counts, terms):
        derivative = [(plain_w1(predicted, (c + step * e) @ rows / ((c + step * e) @ rows).sum())
                       - plain_w1(predicted, (c - step * e) @ rows / ((c - step * e) @ rows).sum())) / (2 * step)
                      for e in np.eye(12)]
        np.testing.assert_allclose(row, 12 * np.asarray(derivative), rtol=1e-6, atol=1e-9)
        assert abs(c @ row) < 1e-12  # the terms of a mean sum to 0 under its own weights


def test_w1_standard_error_against_the_spread_over_measurements():
    # R plain-NumPy measurements (Dirichlet profiles, Gamma(1.5) masses) around mu, scored against a far tilt:
    # the variance of W1(p, m) over them is what the squared standard error estimates. Both sides are Monte Carlo
    # means: a sample variance has sd var sqrt((kurtosis - 1) / R), a mean of se^2 sd(se^2) / sqrt(R); allow 3.
    rng = np.random.default_rng(7)
    length, sequences, replicates = 16, 120, 4000
    mu, predicted = u_shape(length), tilted_far(u_shape(length))
    values, errors = np.empty(replicates), np.empty(replicates)
    for replicate in range(replicates):
        rows = rng.gamma(1.5, size=(sequences, 1)) * rng.dirichlet(2 * length * mu, size=sequences)
        values[replicate] = plain_w1(predicted, plain_profile(rows))
        errors[replicate] = w1_standard_error(predicted, rows)
    variance = values.var()
    kurtosis = np.mean((values - values.mean()) ** 4) / variance ** 2
    sd = math.sqrt(variance ** 2 * (kurtosis - 1) / replicates + np.var(errors ** 2) / replicates)
    assert np.mean(errors ** 2) == pytest.approx(variance, abs=3 * sd), (np.mean(errors ** 2) / variance, sd / variance)
    # The heavy-tailed masses make the standard error itself vary between measurements (what the studentised
    # interval allows for): check it is not a constant.
    assert np.std(errors) / np.mean(errors) > 0.05


def test_w1_standard_error_against_scipy_bootstrap():
    # On one measurement, scipy's bootstrap standard error (plug-in: sqrt((S - 1) / S) of the sample's) of W1
    # far from a crossing; the sd of 4000 resamples has a relative Monte Carlo sd of 1.1 %: allow 5 %.
    rng = np.random.default_rng(8)
    rows = rng.gamma(1.5, size=(80, 1)) * rng.dirichlet(np.full(20, 2.0), size=80)
    predicted = tilted_far(plain_profile(rows))
    reference = stats.bootstrap((np.arange(80),), lambda index: plain_w1(predicted, plain_profile(rows[index])),
                                vectorized=False, n_resamples=4000, random_state=np.random.default_rng(9))
    expected = reference.standard_error * math.sqrt(80 / 79)
    assert w1_standard_error(predicted, rows) == pytest.approx(expected, rel=0.05)
    counts = np.ones((3, 80))
    np.testing.assert_allclose(w1_standard_error(predicted, rows, counts), w1_standard_error(predicted, rows),
                               rtol=1e-12)


def test_studentised_interval_closed_forms():
    # Draws theta_hat + se*_b z_b with pivots z_b known: the interval is theta_hat - (q_hi, q_lo) se_hat.
    z = np.linspace(-3.0, 5.0, 801)  # quantiles of an evenly spaced grid: 2.5 % at -2.8, 97.5 % at 4.8
    errors = np.random.default_rng(10).uniform(0.5, 2.0, z.size)
    low, high = studentised_interval(1.0, 1.0 + errors * z, 0.1, errors, 0.95)
    assert (low, high) == pytest.approx((1.0 - 4.8 * 0.1, 1.0 + 2.8 * 0.1), abs=1e-12)
    assert studentised_interval(1.0, np.ones(5), 0.0, np.ones(5), 0.95) == (1.0, 1.0)
    assert studentised_interval(1.0, np.ones(5), 0.1, np.zeros(5), 0.95) == (1.0, 1.0)
    # A measurement without noise (every row the same profile): every resample is the measurement, and every
    # interval is the point.
    rows = np.outer(np.arange(1.0, 11.0), u_shape(N))
    result = score(np.full(N, 1 / N), rows, B=50)
    assert result.w1_standard_error == pytest.approx(0.0, abs=1e-15)
    assert result.w1_interval == pytest.approx((result.w1, result.w1), abs=1e-15)


def test_simulation_with_known_truths():
    # Multinomial rows around mu; predictions at 0, 2 and 4 times the noise of the mean (a tilt of mu, its size
    # chosen by bisection). Rates over R replicates have binomial sd sqrt(r (1 - r) / R).
    rng = np.random.default_rng(2026)
    length, sequences, resamples = 24, 40, 200
    mu = u_shape(length)
    noise_true = np.median([wasserstein(plain_profile(multinomial_rows(mu, sequences, rng)), mu)
                            for _ in range(400)])
    x = np.linspace(-1, 1, length)

    def tilted(a):
        p = mu * np.exp(a * x)
        return p / p.sum()

    def bisect(k):
        low, high = 0.0, 4.0
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if plain_w1(tilted(middle), mu) < k * noise_true else (low, middle)
        return low

    predictions = {0: mu, 2: tilted(bisect(2)), 4: tilted(bisect(4))}
    replicates = {0: 300, 2: 300, 4: 600}
    outcomes = {k: [] for k in predictions}
    for replicate in range(max(replicates.values())):
        rows = multinomial_rows(mu, sequences, rng)
        for k, p in predictions.items():
            if replicate >= replicates[k]:
                continue
            result = score(p, rows, B=resamples, seed=replicate)
            w1_truth, kl_truth = plain_w1(p, mu), float(np.sum(mu * np.log(mu / p)))
            outcomes[k].append((result.p_value <= 0.05, result.ratio,
                                result.w1_interval[0] <= w1_truth <= result.w1_interval[1],
                                result.kl_interval[0] <= kl_truth <= result.kl_interval[1]))
    null, near, far = (np.asarray(outcomes[k], dtype=float) for k in (0, 2, 4))
    # False positives at alpha = 0.05: target 2.5-8 %; sd at 300 replicates about 0.013, allow one either side.
    assert 0.012 <= null[:, 0].mean() <= 0.093, null[:, 0].mean()
    # Power at 4x the noise: target >= 90 %; sd at 600 replicates about 0.012, allow 2 below.
    assert far[:, 0].mean() >= 0.875, far[:, 0].mean()
    # A perfect prediction scores W1 / noise about 1 (median over replicates).
    assert 0.8 <= np.median(null[:, 1]) <= 1.25, np.median(null[:, 1])
    # 95 % intervals at their nominal level: a coverage of 0.95 over R replicates has sd sqrt(0.0475 / R)
    # (0.0126 at 300, 0.0089 at 600); allow 2.5 sd below and, as the W1 interval is a hull of three (it may
    # over-cover a little), 3 above. KL's interval reaches down to its tiny truth: at least nominal.
    for table in (null, near, far):
        sd = math.sqrt(0.95 * 0.05 / len(table))
        assert 0.95 - 2.5 * sd <= table[:, 2].mean() <= 0.95 + 3 * sd, (len(table), table[:, 2].mean())
        assert table[:, 3].mean() >= 0.95 - 2.5 * sd, table[:, 3].mean()


def test_profile_band_matches_a_plain_loop():
    rng = np.random.default_rng(4)
    rows = rng.gamma(2.0, size=(40, N)) * rng.gamma(2.0, size=(40, 1))
    band = profile_band(rows, resamples=4000, seed=0)
    loop_rng = np.random.default_rng(99)
    profiles = np.stack([plain_profile(rows[loop_rng.integers(0, 40, 40)]) for _ in range(4000)])
    expected = np.quantile(profiles, [0.025, 0.975], axis=0)
    # MC error of a 2.5 % quantile at B = 4000: about 0.06 sd per position; allow 0.25 sd.
    assert np.all(np.abs(band - expected) < 0.25 * profiles.std(axis=0))
    measured = plain_profile(rows)
    assert np.all((band[0] <= measured) & (measured <= band[1]))


def test_same_seed_same_numbers_and_bad_input():
    rows = np.random.default_rng(2).gamma(2.0, size=(10, N))
    profiles = profile_from_rows(np.eye(10), rows)
    np.testing.assert_allclose(profiles.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    first, second = score(u_shape(N), rows, B=20, seed=5), score(u_shape(N), rows, B=20, seed=5)
    assert first.as_dict() == second.as_dict()
    assert tuple(first.as_dict()) == JSON_FIELDS
    with pytest.raises(ValueError, match="predicted"):
        score(u_shape(N + 1), rows)
    with pytest.raises(ValueError, match="measured_per_sequence"):
        score(u_shape(N), rows[:1])


def test_imports_without_torch():
    code = ("import sys; import jaxroll.measure.uncertainty, jaxroll.measure.progress; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _inputs(tmp_path):
    rows = np.random.default_rng(4).gamma(2.0, size=(20, N))
    measured = tmp_path / "measured"
    measured.mkdir()
    np.savez(measured / "measurement.npz", influence_per_sequence=rows)
    predicted = tmp_path / "predicted.csv"
    profile = u_shape(N)
    predicted.write_text("token_position,probability\n"
                         + "".join(f"{j},{float(value)!r}\n" for j, value in enumerate(profile)))
    return rows, measured, predicted, profile


def test_score_command_json_has_the_stable_fields(tmp_path, capsys):
    from jaxroll.cli import main

    rows, measured, predicted, profile = _inputs(tmp_path)
    argv = ["score", str(predicted), "--measured", str(measured), "--resamples", "200", "--seed", "3"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    required = {"w1", "w1_bias_corrected", "w1_interval", "noise", "noise_q95", "ratio", "ratio_interval",
                "p_value", "n_eff", "spearman", "spearman_interval", "kl", "kl_bias_corrected", "kl_interval",
                "level", "resamples", "seed"}
    assert required <= set(printed)
    assert printed == json.loads(json.dumps(score(profile, rows, B=200, seed=3).as_dict()))
    assert printed["w1"] == pytest.approx(plain_w1(profile, plain_profile(rows)), rel=1e-12)
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line.split()[0] for line in lines[2:5]]
    assert table == ["W1/(N-1)", "spearman", "kl(measured"], lines  # W1 leads
    assert "p = " in lines[-1] and "drawn around the prediction" in lines[-1]


def test_score_command_plot_and_refusals(tmp_path, capsys):
    from jaxroll.cli import main

    rows, measured, predicted, profile = _inputs(tmp_path)
    figure = tmp_path / "figure" / "score.png"
    argv = ["score", str(predicted), "--measured", str(measured), "--resamples", "50", "--out", str(figure.parent)]
    assert main(argv) == 0 and figure.stat().st_size > 0
    capsys.readouterr()
    before = figure.read_bytes()
    assert main(argv) == 2 and "--force" in capsys.readouterr().err
    assert figure.read_bytes() == before
    assert main([*argv, "--force"]) == 0
    for retired, new in (("--plot", "--out DIR"), ("--rows-out", "--out DIR")):
        assert main(["score", str(predicted), "--measured", str(measured), retired, "x"]) == 2
        err = capsys.readouterr().err
        assert f"{retired}: retired; use {new}" in err and err.count("\n") == 1
    assert main(["score", str(predicted), "--measured", str(measured), "--overwrite"]) == 2
    assert "--overwrite: retired; use --force" in capsys.readouterr().err
    short = tmp_path / "short.csv"
    short.write_text("token_position,probability\n0,0.5\n1,0.5\n")
    old = tmp_path / "old"
    old.mkdir()
    np.savez(old / "measurement.npz", influence=profile)
    for bad, message in (([str(short), "--measured", str(measured)], "N = 2"),
                         ([str(predicted), "--measured", str(old)], "influence_per_sequence"),
                         ([str(predicted), "--measured", str(tmp_path / "none")], "no measurement.npz"),
                         ([str(predicted), "--measured", str(measured), "--level", "1.5"], "--level")):
        assert main(["score", *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert math.isfinite(score(profile, rows, B=20).p_value)


def test_figures_draw_the_band_they_are_given(monkeypatch, tmp_path):
    from matplotlib.collections import PolyCollection

    from jaxroll import plot

    figures = []
    monkeypatch.setattr(plot, "_save", lambda figure, path: figures.append(figure) or path)
    rows = np.random.default_rng(5).gamma(2.0, size=(30, N))
    measured, band = plain_profile(rows), profile_band(rows, resamples=200)
    plot.plot_measured_influence(tmp_path / "influence.png", measured, band=band)
    plot.plot_prediction_against_measurement(tmp_path / "score.png", measured, u_shape(N), band=band)
    for figure in figures:
        axes = figure.axes[0]
        shaded = [c for c in axes.collections if isinstance(c, PolyCollection) and "band" in c.get_label()]
        assert len(shaded) == 1
        heights = shaded[0].get_paths()[0].vertices[:, 1]
        # fill_between's polygon runs along the upper edge and back along the lower one.
        assert heights.min() == pytest.approx(band[0].min()) and heights.max() == pytest.approx(band[1].max())
