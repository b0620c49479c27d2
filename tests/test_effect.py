"""`jaxroll.measure.effect` and `jaxroll effect`: a predicted change scored against two measurements.

Oracles: the distances and shape statistics are recomputed here in NumPy
float64 from their definitions (scipy's `wasserstein_distance` on the
positions for W1, explicit sums for the masses) and compared at 1e-12; the
statistics are checked on synthetic per-sequence influence whose effect is
known by construction (no change, a shift, a small change hidden by the
texts' own spread unless paired, a prediction equal to the true mean).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats

from jaxroll import metrics
from jaxroll.cli import main
from jaxroll.measure import effect as effect_module
from jaxroll.measure.effect import center_of_mass, effect, middle_mass, pairing
from jaxroll.measure.uncertainty import score

S, N, B = 48, 24, 200
X = np.linspace(-1.0, 1.0, N)


def u_shape(tilt: float = 0.0):
    """A U-shaped profile tilted by ``exp(tilt x)``, normalised."""
    profile = (1 + 3 * X**2) * np.exp(tilt * X)
    return profile / profile.sum()


def draw(profile, rng, sequences: int = S, concentration: float = 2.0):
    """``(S, N)`` rows ``w_s r_s``: ``r_s ~ Dirichlet(c N profile)``, masses ``w_s ~ Gamma(1.5)``."""
    return rng.dirichlet(concentration * N * profile, size=sequences) * rng.gamma(1.5, size=(sequences, 1))


def w1_oracle(p, q):
    """W1/(N-1) between two profiles on positions 0..N-1, by scipy."""
    positions = np.arange(len(p), dtype=np.float64)
    return scipy.stats.wasserstein_distance(positions, positions, p, q) / (len(p) - 1)


def mean_oracle(rows):
    return rows.sum(axis=0) / rows.sum()


def middle_oracle(p, fraction=0.1):
    k = max(1, int(np.floor(fraction * len(p) + 0.5)))  # round half up; no tie at N = 24, 32
    return sum(p[j] for j in range(k, len(p) - k))


def center_oracle(p):
    return sum(j * p[j] for j in range(len(p))) / (len(p) - 1)


# --- numbers against independent oracles ---------------------------------------------------------------------


def test_numbers_match_numpy_oracles():
    rng = np.random.default_rng(0)
    baseline, intervened = draw(u_shape(), rng), draw(u_shape(0.5), rng)
    predicted, predicted_baseline = u_shape(0.4), u_shape(0.05)
    result = effect(baseline, intervened, predicted, predicted_baseline=predicted_baseline, B=B, seed=3)
    m_b, m_i = mean_oracle(baseline), mean_oracle(intervened)
    assert result.effect_w1 == pytest.approx(w1_oracle(m_i, m_b), abs=1e-12)
    assert result.prediction.w1 == pytest.approx(w1_oracle(predicted, m_i), abs=1e-12)
    assert result.advantage == pytest.approx(w1_oracle(m_b, m_i) - w1_oracle(predicted, m_i), abs=1e-12)
    for name, oracle in (("middle_mass", middle_oracle), ("center_of_mass", center_oracle)):
        change = result.changes[name]
        assert change.measured_baseline == pytest.approx(oracle(m_b), abs=1e-12)
        assert change.measured_intervened == pytest.approx(oracle(m_i), abs=1e-12)
        assert change.measured == pytest.approx(oracle(m_i) - oracle(m_b), abs=1e-12)
        assert change.reference == "predicted baseline"
        assert change.predicted == pytest.approx(oracle(predicted) - oracle(predicted_baseline), abs=1e-12)
        assert change.predicted_interval == (change.predicted, change.predicted)  # no sampling noise
        assert change.miss == pytest.approx(change.measured - change.predicted, abs=1e-15)
        assert change.measured_interval[0] <= change.measured <= change.measured_interval[1]
    # Against the measured baseline instead: f(p_I) - f(m_B), with an interval from the baseline's noise.
    change = effect(baseline, intervened, predicted, B=B, seed=3).changes["middle_mass"]
    assert change.reference == "measured baseline"
    assert change.predicted == pytest.approx(middle_oracle(predicted) - middle_oracle(m_b), abs=1e-12)
    assert change.predicted_interval[0] < change.predicted < change.predicted_interval[1]


def test_the_anchored_prediction_carries_the_predicted_ratio_onto_the_measured_baseline():
    """a_I = m_B p_I / p_B renormalised, against a loop over positions; a rollout that is wrong in the
    baseline's shape (p_B = p_I / tilt) but right in the change it predicts gives a_I = m_I exactly."""
    rng = np.random.default_rng(5)
    baseline = draw(u_shape(), rng)
    m_b = mean_oracle(baseline)
    predicted, predicted_baseline = u_shape(0.4), u_shape(0.05)
    expected = np.array([m_b[j] * predicted[j] / predicted_baseline[j] for j in range(N)])
    expected /= expected.sum()
    np.testing.assert_allclose(effect_module.anchored_profile(m_b, predicted_baseline, predicted), expected,
                               rtol=0, atol=1e-15)
    # The rollout's baseline is off (flat), its ratio is the true one: the anchored profile is m_B x ratio.
    ratio = np.exp(0.5 * X)
    flat = np.full(N, 1.0 / N)
    truth = m_b * ratio / (m_b * ratio).sum()
    np.testing.assert_allclose(effect_module.anchored_profile(m_b, flat, flat * ratio / (flat * ratio).sum()),
                               truth, rtol=0, atol=1e-15)
    intervened = draw(u_shape(0.5), rng)
    result = effect(baseline, intervened, predicted, predicted_baseline=predicted_baseline, B=B, seed=3)
    # m_B from the effect's own mean differs from mean_oracle's in the last bits only.
    oracle = score(expected, intervened, B=B, seed=3)
    assert result.anchored.w1 == pytest.approx(oracle.w1, abs=1e-12)
    assert result.anchored.ratio == pytest.approx(oracle.ratio, rel=1e-10)
    assert result.anchored.p_value == oracle.p_value
    assert effect(baseline, intervened, predicted, B=B, seed=3).anchored is None


@pytest.mark.parametrize("n", [7, 24, 32, 50])
def test_the_numpy_shape_statistics_are_jaxroll_metrics(n):
    profile = np.random.default_rng(n).dirichlet(np.ones(n))
    assert middle_mass(profile) == pytest.approx(float(metrics.middle_mass(profile)), abs=1e-12)
    assert center_of_mass(profile) == pytest.approx(float(metrics.center_of_mass(profile)), abs=1e-12)
    assert middle_mass(profile, 0.2) == pytest.approx(float(metrics.middle_mass(profile, 0.2)), abs=1e-12)


def test_the_prediction_is_scored_by_uncertainty_score():
    rng = np.random.default_rng(1)
    baseline, intervened = draw(u_shape(), rng), draw(u_shape(0.5), rng)
    result = effect(baseline, intervened, u_shape(0.5), B=B, seed=7)
    assert result.prediction.as_dict() == score(u_shape(0.5), intervened, B=B, seed=7).as_dict()


# --- (a) no effect ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("paired", [True, False])
def test_identical_measurements_show_no_effect(paired):
    rows = draw(u_shape(), np.random.default_rng(2))
    result = effect(rows, rows.copy(), u_shape(), paired=paired, B=B)
    assert result.effect_w1 == 0.0 and result.effect_ratio == 0.0
    assert result.effect_p_value == 1.0
    assert not result.beats_no_change  # "no change" is exact here


@pytest.mark.parametrize("paired", [False, True])
def test_no_effect_is_calibrated_over_replicates(paired):
    """No change, unpaired (two measurements drawn around one profile) and paired (the same texts, each model
    its own small noise): W1 / noise about 1, p-values about uniform, about 5 % rejected at 0.05."""
    ratios, p_values = [], []
    for replicate in range(80):
        rng = np.random.default_rng(100 + replicate)
        baseline, intervened = (paired_texts(100 + replicate, tilt=0.0) if paired
                                else (draw(u_shape(), rng), draw(u_shape(), rng)))
        result = effect(baseline, intervened, u_shape(), paired=paired, B=B, seed=replicate)
        ratios.append(result.effect_ratio)
        p_values.append(result.effect_p_value)
    assert 0.75 <= np.median(ratios) <= 1.35
    assert 0.38 <= np.mean(p_values) <= 0.62  # uniform: 0.5, sd 0.032 at 80 replicates
    assert np.mean(np.array(p_values) <= 0.05) <= 0.15  # binomial sd at 5 %, 80 replicates: 2.4 points


# --- (b) a shifted profile ----------------------------------------------------------------------------------------


def test_a_shifted_profile_is_a_large_effect():
    rng = np.random.default_rng(3)
    result = effect(draw(u_shape(), rng), draw(u_shape(0.8), rng), u_shape(0.8), B=B)
    assert result.effect_ratio > 8
    assert result.effect_p_value == 1 / (B + 1)  # no permutation reaches the observed distance
    assert result.beats_no_change and result.advantage_interval[0] > 0
    assert "rejected at alpha = 0.05: the intervention changed the measured profile" in result.verdict()


# --- (c) pairing ---------------------------------------------------------------------------------------------------


def paired_texts(seed: int, tilt: float = 0.03):
    """Each text its own profile (a wide spread between texts), read by both models; the intervention tilts
    every text's profile by ``exp(tilt x)``, a change far below the spread between texts."""
    rng = np.random.default_rng(seed)
    texts = rng.dirichlet(np.ones(N), size=S)
    masses = rng.gamma(2.0, size=(S, 1))
    tilted = texts * np.exp(tilt * X)
    tilted /= tilted.sum(axis=1, keepdims=True)
    noise = lambda: rng.lognormal(0.0, 0.02, size=(S, N))  # noqa: E731  (each model's own small noise)
    return texts * masses * noise(), tilted * masses * noise()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairing_detects_a_small_effect_that_unpaired_does_not(seed):
    baseline, intervened = paired_texts(seed)
    together = effect(baseline, intervened, u_shape(), paired=True, B=B, seed=seed)
    apart = effect(baseline, intervened, u_shape(), paired=False, B=B, seed=seed)
    assert together.effect_w1 == apart.effect_w1  # the same means; only the noise differs
    assert together.effect_ratio > 5 and together.effect_p_value <= 2 / (B + 1)
    assert apart.effect_ratio < 1 and apart.effect_p_value > 0.2
    assert together.effect_noise < apart.effect_noise / 10


def test_pairing_reads_the_token_ids():
    tokens = np.arange(12).reshape(3, 4)
    assert pairing(tokens, tokens.copy()) == (True, "paired: the same 3 texts (equal token_ids)")
    other = tokens.copy()
    other[1, 2] += 1
    assert pairing(tokens, other) == (False, "unpaired: the token_ids differ in 1 of 3 sequences")
    assert pairing(tokens, tokens[:2])[0] is False
    assert pairing(None, tokens) == (False, "unpaired: a measurement records no token_ids")


# --- (d) a perfect prediction -------------------------------------------------------------------------------------


def test_a_perfect_prediction_scores_at_the_noise_and_its_change_intervals_cover():
    truth_baseline, truth_intervened = u_shape(), u_shape(0.5)
    covered = {name: [] for name in ("middle_mass", "center_of_mass")}
    ratios, rejected = [], []
    for replicate in range(60):
        rng = np.random.default_rng(500 + replicate)
        result = effect(draw(truth_baseline, rng), draw(truth_intervened, rng), truth_intervened, B=B,
                        seed=replicate)
        ratios.append(result.prediction.ratio)
        rejected.append(result.prediction.p_value <= 0.05)
        for name, oracle in (("middle_mass", middle_oracle), ("center_of_mass", center_oracle)):
            truth = oracle(truth_intervened) - oracle(truth_baseline)
            change = result.changes[name]
            covered[name].append(change.predicted_interval[0] <= truth <= change.predicted_interval[1]
                                 and change.measured_interval[0] <= truth <= change.measured_interval[1])
    assert 0.7 <= np.median(ratios) <= 1.4  # a perfect prediction sits about one noise unit away
    assert np.mean(rejected) <= 0.15
    for name, hits in covered.items():
        assert np.mean(hits) >= 0.85, name  # nominal 95 % each; sd 2.8 points at 60 replicates


def test_predicting_no_change_does_not_beat_no_change():
    rng = np.random.default_rng(4)
    baseline, intervened = draw(u_shape(), rng), draw(u_shape(0.8), rng)
    result = effect(baseline, intervened, mean_oracle(baseline), B=B)
    assert result.advantage == pytest.approx(0.0, abs=1e-12)
    assert not result.beats_no_change


# --- refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    (dict(intervened_per_sequence=np.ones((S, N + 1))), "intervened_per_sequence: N = 25"),
    (dict(predicted=np.full(N - 1, 1 / (N - 1))), "predicted: shape (23,)"),
    (dict(predicted=np.full(N, 2 / N)), "predicted: allowed: a finite, non-negative profile that sums to 1"),
    (dict(predicted_baseline=np.full(N, 0.5 / N)), "predicted_baseline: allowed"),
    (dict(intervened_per_sequence=np.ones((S - 1, N)), paired=True), "paired: S = 48 and 47"),
    (dict(baseline_per_sequence=-np.ones((S, N))), "measured_per_sequence: a value is not finite"),
])
def test_bad_arguments_are_refused_in_one_line(change, message):
    arguments = dict(baseline_per_sequence=np.ones((S, N)), intervened_per_sequence=np.ones((S, N)),
                     predicted=np.full(N, 1 / N), B=B) | change
    with pytest.raises(ValueError) as error:
        effect(**arguments)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# --- the command ----------------------------------------------------------------------------------------------------


TINY = {"model": "tiny", "model_class": "BloomForCausalLM", "model_type": "bloom", "layer_map": "bloom",
        "num_layers": 3, "num_heads": 2, "head_dim": 8, "position_encoding": "alibi", "attention_windows": None,
        "parallel_block": False, "sequence_length": N, "interventions": None}
"""metadata.json of a tiny measurement, as `jaxroll.measure.pass_setup.run_metadata` writes its model record."""


def write_measurement(directory, rows, tokens=None, metadata=None):
    """A measurement folder: measurement.npz (influence_per_sequence, token_ids) and metadata.json (`TINY`
    updated by `metadata`; ``metadata=False``: none)."""
    directory.mkdir()
    arrays = {"influence_per_sequence": rows} | ({} if tokens is None else {"token_ids": tokens})
    np.savez(directory / "measurement.npz", **arrays)
    if metadata is not False:
        (directory / "metadata.json").write_text(json.dumps(TINY | (metadata or {})))
    return directory


def write_profile(path, profile):
    path.write_text("token_position,probability\n" + "".join(f"{j},{float(v)!r}\n" for j, v in enumerate(profile)))
    return path


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 50_000, size=(S, N))
    baseline = write_measurement(tmp_path / "baseline", draw(u_shape(), rng), tokens)
    intervened = write_measurement(tmp_path / "intervened", draw(u_shape(0.6), rng), tokens,
                                   {"interventions": {"tau": 0.7}})
    return tmp_path, baseline, intervened, write_profile(tmp_path / "predicted.csv", u_shape(0.6))


def capture_figures(monkeypatch) -> list:
    """The Figures `jaxroll.plot` saves from now on, as they were drawn."""
    import jaxroll.plot

    figures, save = [], jaxroll.plot._save
    monkeypatch.setattr(jaxroll.plot, "_save", lambda figure, path: figures.append(figure) or save(figure, path))
    return figures


def test_command_writes_the_table_the_json_and_the_figure(inputs, capsys, monkeypatch):
    tmp_path, baseline, intervened, predicted = inputs
    figures = capture_figures(monkeypatch)
    reference = write_profile(tmp_path / "predicted-baseline.csv", u_shape())
    out = tmp_path / "out"
    argv = ["effect", "--measured", str(baseline), "--measured", str(intervened), "--predicted", str(predicted),
            "--predicted-baseline", str(reference), "--out", str(out), "--resamples", str(B), "--seed", "2"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "intervention: tau=0.7" in table and "paired: the same 48 texts" in table
    assert "middle_mass" in table and "center_of_mass" in table and "beats 'no change'" in table
    assert "predicted change = rollout(intervened) - rollout(baseline), the headline" in table
    assert sorted(path.name for path in out.iterdir()) == ["effect.json", "effect.png"]
    assert (out / "effect.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((out / "effect.json").read_text())
    rows = [np.load(directory / "measurement.npz")["influence_per_sequence"] for directory in (baseline, intervened)]
    expected = effect(*rows, u_shape(0.6), predicted_baseline=u_shape(), paired=True, B=B, seed=2)
    assert record["effect_w1"] == pytest.approx(expected.effect_w1, abs=1e-15)
    assert record["effect_p_value"] == expected.effect_p_value and record["paired"] is True
    assert record["prediction"] == json.loads(json.dumps(expected.prediction.as_dict()))
    assert record["changes"]["middle_mass"]["reference"] == "predicted baseline"
    assert record["headline"] == "predicted change = rollout(intervened) - rollout(baseline)"
    assert record["intervention"] == "tau=0.7" and record["predicted_baseline"] == str(reference)
    assert record["predictor"] == "the rollout"
    (figure,) = figures
    linear, logarithmic, change = figure.axes
    assert (linear.get_yscale(), logarithmic.get_yscale(), change.get_yscale()) == ("linear", "log", "linear")
    for axes in figure.axes:
        assert axes.get_xlabel() and axes.get_ylabel()
    legend = [text.get_text() for text in linear.get_legend().get_texts()]
    for name in ("baseline, measured (mean of 48 sequences)", "tau=0.7, measured (mean of 48 sequences)",
                 "tau=0.7, predicted by the rollout", "baseline, predicted by the rollout",
                 "tau=0.7: 95% pointwise bootstrap band"):
        assert name in legend, (name, legend)
    assert set(legend[-4:]) <= {text.get_text() for text in logarithmic.get_legend().get_texts()}
    assert not any(str(tmp_path) in entry for axes in figure.axes for entry in
                   (text.get_text() for text in axes.get_legend().get_texts()))  # no folder names
    headline = "predicted change: rollout(tau=0.7) - rollout(baseline) (headline)"
    lines = {line.get_label(): line.get_ydata() for line in change.lines}
    np.testing.assert_allclose(lines[headline], u_shape(0.6) - u_shape(), rtol=0, atol=1e-15)
    np.testing.assert_allclose(lines["measured change: tau=0.7 - baseline"],
                               mean_oracle(rows[1]) - mean_oracle(rows[0]), rtol=0, atol=1e-15)
    assert figure._suptitle.get_text().startswith("the effect of tau=0.7 on tiny: measured W1/(N-1)")
    assert main([*argv, "--force", "--json"]) == 0  # --json: the effect.json record, one object on stdout
    assert json.loads(capsys.readouterr().out) == record


def rollout_oracle(slopes, diagonal, lambdas, n, tau=1.0):
    """The residual-aware rollout's last row, NumPy float64 from its definition (docs/design.md): per head
    ``rowsoftmax((-m_h (i - j) + d [i = j]) / tau)`` over ``j <= i``, heads averaged, ``R_t = (1 - lambda_t) I +
    lambda_t A``, ``P = R_T ... R_1``, its last row normalised."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    heads = []
    for slope in slopes:
        scores = np.where(j <= i, (-slope * (i - j) + diagonal * (i == j)) / tau, -np.inf)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append(weights / weights.sum(axis=1, keepdims=True))
    attention = np.mean(heads, axis=0)
    product = np.eye(n)
    for lam in lambdas:  # layer 1 acts first: P = R_T ... R_1
        product = ((1 - lam) * np.eye(n) + lam * attention) @ product
    return product[-1] / product[-1].sum()


def test_the_default_predicted_change_is_the_rollouts_own(tmp_path, capsys):
    """Without --predicted-baseline the baseline's prediction is its config.yaml rolled out: the predicted change
    is rollout(intervened) - rollout(baseline), computed here in NumPy, not f(p_I) - f(m_B), which the
    measurements are chosen to make of the other sign."""
    import jaxroll

    slopes, diagonal, lambdas = np.array([0.5, 0.125]), 1.5, np.array([0.6, 0.4, 0.7])
    p_b, p_i = (rollout_oracle(slopes, diagonal, lambdas, N, tau) for tau in (1.0, 0.7))
    rng = np.random.default_rng(8)
    tokens = rng.integers(0, 50_000, size=(S, N))
    peaked = np.exp(10 * X) / np.exp(10 * X).sum()  # the measured model reads its last tokens far more
    baseline = write_measurement(tmp_path / "baseline", draw(peaked, rng), tokens)
    jaxroll.save_config(jaxroll.RolloutModel.create(num_layers=3, num_heads=2, alibi_slopes=slopes,
                                                    diagonal_scores=diagonal, lambdas=lambdas, sequence_length=N),
                        baseline / "config.yaml")
    intervened = write_measurement(tmp_path / "intervened", draw(peaked, rng), tokens, {"interventions": {"tau": 0.7}})
    rollout_change = middle_oracle(p_i) - middle_oracle(p_b)
    m_b = mean_oracle(np.load(baseline / "measurement.npz")["influence_per_sequence"])
    assert np.sign(middle_oracle(p_i) - middle_oracle(m_b)) == -np.sign(rollout_change) != 0  # the old default's
    predicted = write_profile(tmp_path / "p.csv", p_i)
    assert main(["effect", "--measured", str(baseline), "--measured", str(intervened), "--predicted", str(predicted),
                 "--out", str(tmp_path / "out"), "--resamples", str(B)]) == 0
    assert f"rollout of {baseline / 'config.yaml'} at N = {N}" in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "effect.json").read_text())
    assert record["headline"] == "predicted change = rollout(intervened) - rollout(baseline)"
    change = record["changes"]["middle_mass"]
    assert change["reference"] == "predicted baseline" and np.sign(change["predicted"]) == np.sign(rollout_change)
    assert change["predicted"] == pytest.approx(rollout_change, abs=1e-6)  # the rollout runs in float32
    assert record["changes"]["center_of_mass"]["predicted"] == pytest.approx(
        center_oracle(p_i) - center_oracle(p_b), abs=1e-6)


def test_command_compares_other_texts_only_when_told(tmp_path, capsys):
    rng = np.random.default_rng(6)
    baseline = write_measurement(tmp_path / "b", draw(u_shape(), rng))
    intervened = write_measurement(tmp_path / "i", draw(u_shape(), rng), metadata={"interventions": {"tau": 0.7}})
    predicted = write_profile(tmp_path / "p.csv", u_shape())
    argv = ["effect", "--measured", str(baseline), "--measured", str(intervened), "--predicted", str(predicted),
            "--predicted-baseline", str(predicted), "--out", str(tmp_path / "out"), "--resamples", str(B)]
    assert main(argv) == 2
    assert "a measurement records no token_ids; allowed: the same texts" in capsys.readouterr().err
    assert main([*argv, "--unpaired"]) == 0
    assert "unpaired: a measurement records no token_ids" in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "effect.json").read_text())
    assert record["paired"] is False and record["intervention"] == "tau=0.7"


def test_check_pair_reads_two_spellings_of_one_model_as_one(tmp_path):
    from jaxroll.errors import ConfigError
    from jaxroll.measure.effect import check_pair
    from jaxroll.measure.outputs import SavedMeasurement

    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    tokens = np.arange(2 * N).reshape(2, N)
    arrays = {"influence_per_sequence": np.ones((2, N)), "token_ids": tokens}
    baseline = SavedMeasurement(arrays, TINY | {"model": str(tmp_path / "model")})
    intervened = SavedMeasurement(arrays, TINY | {"model": str(tmp_path / "elsewhere" / ".." / "model"),
                                                  "interventions": {"tau": 0.7}})
    folders = (tmp_path / "b", tmp_path / "i")
    assert check_pair(folders, baseline, intervened) == (True, "paired: the same 2 texts (equal token_ids)")
    other = SavedMeasurement(arrays, intervened.metadata | {"model": str(tmp_path / "elsewhere")})
    with pytest.raises(ConfigError, match="model '.*elsewhere' in metadata.json"):
        check_pair(folders, baseline, other)


def _bad_inputs(tmp_path, baseline, intervened, predicted):
    """``(name, argv, words)`` of refusals, each from its own broken input."""
    rng = np.random.default_rng(9)
    tokens = np.load(baseline / "measurement.npz")["token_ids"]
    rows = draw(u_shape(), rng)
    tau = {"interventions": {"tau": 0.7}}
    short = write_measurement(tmp_path / "short", np.ones((S, N - 2)), tokens[:, :N - 2], tau)
    llama = write_measurement(tmp_path / "llama", rows, tokens, tau | {"model_type": "llama", "layer_map": "llama"})
    other_model = write_measurement(tmp_path / "other-model", rows, tokens, tau | {"model": "elsewhere"})
    other_texts = write_measurement(tmp_path / "other-texts", rows, tokens[::-1], tau)
    fewer = write_measurement(tmp_path / "fewer", rows[:-1], tokens[:-1], tau)
    both = write_measurement(tmp_path / "both", rows, tokens, {"interventions": {"gamma": 0.5}})
    no_metadata = write_measurement(tmp_path / "no-metadata", rows, tokens, False)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "measurement.npz").write_bytes(b"PK\x03\x04 not really a zip archive")
    wrong_length = write_profile(tmp_path / "wrong-length.csv", np.full(N + 1, 1 / (N + 1)))
    unnormalised = write_profile(tmp_path / "unnormalised.csv", np.full(N, 2 / N))
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    reference = write_profile(tmp_path / "reference.csv", u_shape())
    args = lambda b, i, p, *more: ["effect", "--measured", str(b), "--measured", str(i),  # noqa: E731
                                   "--predicted", str(p), *(more or ["--predicted-baseline", str(reference)])]
    return [
        ("missing baseline", args(tmp_path / "nowhere", intervened, predicted), f"--measured {tmp_path / 'nowhere'}"),
        ("same folder", args(baseline, baseline, predicted), "the same folder twice"),
        ("same folder spelt twice", args(baseline, tmp_path / "full" / ".." / "baseline", predicted),
         "the same folder twice"),
        ("other architecture", args(baseline, llama, predicted),
         f"--measured {llama}: model_type 'llama' in metadata.json, the baseline --measured {baseline} has 'bloom'; "
         "allowed: two measurements of one model"),
        ("other model", args(baseline, other_model, predicted), "model 'elsewhere' in metadata.json"),
        ("mismatched N", args(baseline, short, predicted), f"--measured {short}: N = 22 positions per sequence; "
                                                           "allowed: N = 24, as the baseline"),
        ("other texts", args(baseline, other_texts, predicted), "token_ids differ in 48 of 48 sequences; allowed: "
                                                                "the same texts as the baseline"),
        ("fewer texts", args(baseline, fewer, predicted), "token_ids of shapes (48, 24) and (47, 24)"),
        ("swapped", args(intervened, baseline, predicted),
         f"--measured {intervened}: the baseline was measured under --intervene tau=0.7 and --measured {baseline} "
         "under none: swapped?"),
        ("intervened baseline", args(intervened, both, predicted),
         "the baseline was measured under --intervene tau=0.7; allowed: a baseline measured without --intervene"),
        ("no metadata", args(baseline, no_metadata, predicted), "metadata.json"),
        ("no predicted baseline", args(baseline, intervened, predicted, "--seed", "0"),
         f"--predicted-baseline: not given, and the baseline --measured {baseline} has no config.yaml"),
        ("positional folders", ["effect", str(baseline), str(intervened), "--predicted", str(predicted)],
         "positional measurement folders are retired; use --measured BASELINE --measured INTERVENED"),
        ("one measurement", ["effect", "--measured", str(baseline), "--predicted", str(predicted)],
         "--measured: given 1 times; allowed: twice"),
        ("corrupt npz", args(baseline, corrupt, predicted), "measurement.npz: not a readable .npz"),
        ("wrong length", args(baseline, intervened, wrong_length), "N = 24 positions per sequence"),
        ("not summing to 1", args(baseline, intervened, unnormalised), "probabilities sum to 2"),
        ("baseline profile length", args(baseline, intervened, predicted, "--predicted-baseline",
                                         str(wrong_length)), "--predicted-baseline"),
        ("level", args(baseline, intervened, predicted, "--predicted-baseline", str(reference), "--level", "1.5"),
         "--level"),
        ("non-empty out", args(baseline, intervened, predicted, "--out", str(full)), "not empty"),
    ]


def test_command_refuses_bad_input_in_one_line_and_writes_nothing(inputs, capsys):
    tmp_path, baseline, intervened, predicted = inputs
    for name, argv, words in _bad_inputs(tmp_path, baseline, intervened, predicted):
        out = tmp_path / "out"
        more = [] if "--out" in argv else ["--out", str(out)]
        assert main([*argv, *more, "--resamples", str(B)]) == 2, name
        captured = capsys.readouterr()
        assert captured.out == "", name
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jaxroll: error:") and words in lines[0], (name, lines)
        assert not out.exists(), name
    assert sorted(path.name for path in (tmp_path / "full").iterdir()) == ["keep.txt"]


def test_the_module_needs_no_jax():
    """Pure NumPy, as `jaxroll.measure.uncertainty`: the command sets ``uses_jax=False``."""
    import ast
    import inspect

    names = {alias.name for node in ast.walk(ast.parse(inspect.getsource(effect_module)))
             if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    modules = {node.module for node in ast.walk(ast.parse(inspect.getsource(effect_module)))
               if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith(("jax", "torch")) for name in names | modules)
