"""`jaxroll.measure.uncertainty` against independent oracles.

Oracles: a plain NumPy/SciPy bootstrap loop written here (its own resamples
from another seed, `scipy.stats.spearmanr`), `jaxroll.metrics` (the JAX
distances), the coverage and width of a percentile interval for a mean
(in a regime where W1 is exactly a mean over sequences), and the closed form
of the expected split-half W1 for sampling without replacement.
"""

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from jaxroll.measure.uncertainty import profile_from_rows, score, split_half_floor, wasserstein

N = 16


def zero_sum_rows(count, length, scale, seed, base=None):
    """Rows ``q + e_s`` that each sum to 1, ``e_s`` Gaussian with the mean removed (so the mean profile is a plain mean)."""
    rng = np.random.default_rng(seed)
    base = np.full(length, 1.0 / length) if base is None else base
    noise = rng.normal(0.0, scale, (count, length))
    rows = base + noise - noise.mean(axis=1, keepdims=True)
    assert np.all(rows > 0)
    return rows


def u_shape(length):
    x = np.linspace(-1, 1, length)
    p = 1 + 3 * x ** 2
    return p / p.sum()


def test_point_estimates_equal_jaxroll_metrics():
    from jaxroll import metrics

    rows = np.random.default_rng(0).gamma(2.0, size=(30, N))
    predicted = u_shape(N)
    result = score(predicted, rows, B=50, splits=10)
    measured = rows.mean(0) / rows.mean(0).sum()
    reference = metrics.compare(measured, predicted)  # kl(measured || predicted), computed in float64
    assert result.w1 == pytest.approx(float(reference.wasserstein), rel=1e-12)
    assert result.spearman == pytest.approx(float(reference.spearman), rel=1e-12)
    assert result.kl == pytest.approx(float(reference.kl), rel=1e-10)
    assert result.ratio == pytest.approx(result.w1 / result.floor, rel=1e-15)
    assert result.floor == pytest.approx(float(np.median(result.floor_samples)), rel=1e-15)


def test_intervals_agree_with_a_plain_numpy_bootstrap():
    rows = np.random.default_rng(1).gamma(2.0, size=(60, 32))
    predicted = u_shape(32)
    resamples = 4000
    result = score(predicted, rows, B=resamples, seed=0, splits=10, resample_splits=1)
    # The oracle: a loop with its own generator and seed, scipy's Spearman.
    rng = np.random.default_rng(123)
    draws = {"w1": [], "spearman": [], "kl": []}
    for _ in range(resamples):
        mean = rows[rng.choice(60, 60, replace=True)].mean(axis=0)
        profile = mean / mean.sum()
        draws["w1"].append(np.abs(np.cumsum(predicted - profile)[:-1]).sum() / 31)
        draws["spearman"].append(stats.spearmanr(predicted, profile).statistic)
        draws["kl"].append(float(np.sum(profile * np.log(profile / predicted))))
    for name, values in draws.items():
        values = np.asarray(values)
        low, high = np.quantile(values, [0.025, 0.975])
        got = getattr(result, f"{name}_interval")
        # Two independent Monte Carlo estimates of a 2.5 % quantile with B = 4000 differ by about
        # 0.06 bootstrap standard deviations; allow 0.25 (four of those).
        tolerance = 0.25 * values.std()
        assert abs(got[0] - low) < tolerance and abs(got[1] - high) < tolerance, (name, got, (low, high))


def test_interval_coverage_and_width_match_the_theory_of_a_mean():
    # With p a point mass at position 0, F_p = 1 >= F_m everywhere, so W1(p, m) = sum_j (1 - F_m(j)) / (N - 1)
    # is linear in m: exactly the mean over sequences of w_s = sum_j (1 - F_{r_s}(j)) / (N - 1). Its percentile
    # interval should cover the population value in ~95 % of datasets and be 2 * 1.96 * sd(w) / sqrt(S) wide.
    predicted = np.zeros(N)
    predicted[0] = 1.0
    count, scale, replicates = 40, 0.005, 300
    truth = float(np.sum(1 - np.cumsum(np.full(N, 1.0 / N))[:-1]) / (N - 1))
    # sd(w_s) from the noise model: w_s - truth = -sum_j E_s(j) / (N - 1), E_s the cumulative zero-sum noise.
    centred = np.eye(N) - 1.0 / N
    weights = -np.cumsum(centred, axis=0)[:-1].sum(axis=0) / (N - 1)  # w_s - truth = weights . noise
    sd_w = scale * float(np.linalg.norm(weights))
    covered, widths = 0, []
    for replicate in range(replicates):
        rows = zero_sum_rows(count, N, scale, seed=1000 + replicate)
        result = score(predicted, rows, B=400, seed=replicate, splits=1, resample_splits=1)
        low, high = result.w1_interval
        covered += low <= truth <= high
        widths.append(high - low)
    coverage = covered / replicates
    # Binomial sd of the coverage at n = 300 is 0.0126; the percentile interval of a mean
    # undercovers slightly (sqrt((S - 1) / S)): accept 0.90..0.99.
    assert 0.90 <= coverage <= 0.99, coverage
    expected_width = 2 * 1.959964 * sd_w / math.sqrt(count)
    assert np.mean(widths) == pytest.approx(expected_width, rel=0.05)


def test_noise_floor_matches_the_split_half_closed_form():
    # Random halves of a fixed sample (without replacement): Var(F_A(j) - F_B(j)) = 4 s_j^2 / (S - 1), s_j^2 the
    # (1/S) variance of the rows' cumulative sums; for near-normal differences E|D| = sqrt(2 / pi) sd(D).
    count = 200
    rows = zero_sum_rows(count, N, 0.004, seed=7, base=u_shape(N))
    floor = split_half_floor(rows, splits=4000, seed=3)
    spread = np.cumsum(rows, axis=1)[:, :-1].std(axis=0)
    expected = np.sum(math.sqrt(2 / math.pi) * 2 * spread / math.sqrt(count - 1)) / (N - 1)
    assert floor.mean() == pytest.approx(expected, rel=0.03)
    # One split is one draw of this distribution: its spread is not negligible.
    assert np.quantile(floor, 0.975) / np.quantile(floor, 0.025) > 1.5


def test_a_prediction_far_from_the_data_has_a_ratio_interval_above_one_and_the_truth_near_it():
    rows = zero_sum_rows(100, N, 0.005, seed=11, base=u_shape(N))
    truth = score(u_shape(N), rows, B=500, seed=0, splits=200)
    uniform = score(np.full(N, 1.0 / N), rows, B=500, seed=0, splits=200)
    assert uniform.ratio_interval[0] > 1.0 and uniform.ratio > 10
    assert truth.ratio_interval[0] < 1.0
    assert truth.spearman_interval[0] > 0.5


def test_weighted_means_are_normalised_and_same_seed_same_numbers():
    rows = np.random.default_rng(2).gamma(2.0, size=(10, N))
    profiles = profile_from_rows(np.eye(10), rows)
    np.testing.assert_allclose(profiles.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    assert wasserstein(profiles[0], profiles[0]) == 0
    first, second = score(u_shape(N), rows, B=20, seed=5), score(u_shape(N), rows, B=20, seed=5)
    assert first.as_dict() == second.as_dict()
    with pytest.raises(ValueError, match="predicted"):
        score(u_shape(N + 1), rows)
    with pytest.raises(ValueError, match="measured_per_sequence"):
        score(u_shape(N), rows[:1])


def test_imports_without_torch():
    code = ("import sys; import jaxroll.measure.uncertainty, jaxroll.measure.progress; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_score_command_prints_the_function_s_numbers_and_refuses_mismatches(tmp_path, capsys):
    import json

    from jaxroll.cli import main

    rows = np.random.default_rng(4).gamma(2.0, size=(20, N))
    measured = tmp_path / "measured"
    measured.mkdir()
    np.savez(measured / "measurement.npz", influence_per_sequence=rows)
    predicted = tmp_path / "predicted.csv"
    profile = u_shape(N)
    predicted.write_text("token_position,probability\n" + "".join(f"{j},{float(value)!r}\n" for j, value in enumerate(profile)))
    argv = ["score", str(predicted), "--measured", str(measured), "--resamples", "200", "--splits", "50", "--seed", "3"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = score(profile, rows, B=200, splits=50, seed=3).as_dict()
    assert printed == json.loads(json.dumps(expected))
    assert main(argv) == 0
    assert "W1 / floor" in capsys.readouterr().out
    short = tmp_path / "short.csv"
    short.write_text("token_position,probability\n0,0.5\n1,0.5\n")
    np.savez(tmp_path / "old.npz", influence=profile)
    old = tmp_path / "old"
    old.mkdir()
    (tmp_path / "old.npz").rename(old / "measurement.npz")
    for bad, message in (([str(short), "--measured", str(measured)], "N = 2"),
                         ([str(predicted), "--measured", str(old)], "influence_per_sequence"),
                         ([str(predicted), "--measured", str(tmp_path / "none")], "no measurement.npz")):
        assert main(["score", *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
