"""Tests of ``jaxroll fit``, run in-process through `jaxroll.cli.main`.

The written files are checked against the NumPy oracle (tests/oracle.py):
the ``initial`` and ``fitted`` columns of fit.csv are the oracle's profiles
of the input config and of fitted.yaml, and the printed Wasserstein numbers
are a plain NumPy W1 of those columns. Bad input exits 2 with one line on
stderr and creates nothing.
"""

import csv
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxroll
from jaxroll.cli import main

sys.path.insert(0, str(Path(__file__).parent))
import oracle  # noqa: E402

N = 24
# Tolerance of the oracle comparisons: the suite runs in float64 and both
# sides are T = 6 products of 24 x 24 row-stochastic matrices, rounding
# ~1e-15; the CSV stores repr() of float64, exact.
TOL = 1e-12


def w1(p, q):
    return float(np.abs(np.cumsum(p - q)[:-1]).sum() / (len(p) - 1))


@pytest.fixture
def files(tmp_path):
    """A small start config (T = 6, H = 4) and the profile of another model."""
    start = jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.2,
                                        diagonal_scores=0.5, sequence_length=N)
    other = jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.7,
                                        diagonal_scores=-1.0, sequence_length=N)
    config = jaxroll.save_config(start, tmp_path / "start.yaml")
    target = oracle.influence(oracle.config_arrays(oracle.read_config(
        jaxroll.save_config(other, tmp_path / "other.yaml"))), N)
    profile = jaxroll.write_profile(target, tmp_path / "target.csv")
    return config, profile, target


def test_fit_writes_config_csv_and_figure(files, tmp_path, capsys):
    config, profile, target = files
    out = tmp_path / "out"
    code = main(["fit", str(config), str(profile), "--fit", "lambdas,diagonal_scores",
                 "--steps", "40", "--out", str(out), "--float64"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["fit.csv", "fit.png", "fitted.csv", "fitted.yaml"]
    assert (out / "fit.png").stat().st_size > 1000

    with open(out / "fit.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["token_position", "target", "initial", "fitted"]
    table = np.array(rows[1:], dtype=np.float64)
    np.testing.assert_array_equal(table[:, 0], np.arange(N))
    np.testing.assert_allclose(table[:, 1], target, rtol=0, atol=TOL)
    initial = oracle.influence(oracle.config_arrays(oracle.read_config(config)), N)
    fitted = oracle.influence(oracle.config_arrays(oracle.read_config(out / "fitted.yaml")), N)
    np.testing.assert_allclose(table[:, 2], initial, rtol=0, atol=TOL)
    np.testing.assert_allclose(table[:, 3], fitted, rtol=0, atol=TOL)
    # fitted.csv: the fitted profile in the format every command reads.
    np.testing.assert_array_equal(jaxroll.read_profile(out / "fitted.csv"), table[:, 3])

    captured = capsys.readouterr()
    printed = captured.out
    # 12 free parameters: Adam; 40 steps do not converge, the first line and
    # one warning line in the summary (stdout) say so, and the exit status is still 0.
    first = printed.splitlines()[0]
    assert first.startswith(f"jaxroll fit: {config} -> {profile}: not converged: stopped at the step limit 40")
    assert "optimizer = adam" in printed
    warnings = [line for line in printed.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "did not converge in 40 steps" in warnings[0]
    assert "warning:" not in captured.err and "steps = 40 of at most 40" in printed
    match = re.search(r"Wasserstein W1/\(N-1\): before (\S+), after (\S+)", printed)
    before, after = float(match.group(1)), float(match.group(2))
    # Printed with 6 significant digits.
    assert before == pytest.approx(w1(initial, target), rel=1e-5)
    assert after == pytest.approx(w1(fitted, target), rel=1e-5)
    assert after < before

    # fitted.yaml is a config that `jaxroll rollout` reads back.
    assert main(["rollout", str(out / "fitted.yaml"), "--out", str(tmp_path / "again"),
                 "--float64"]) == 0
    again = jaxroll.read_profile(tmp_path / "again" / "profile.csv")
    np.testing.assert_allclose(again, fitted, rtol=0, atol=TOL)


def test_power_decay_schedule_is_saved_as_power_decay(files, tmp_path, capsys):
    config, profile, _ = files
    assert main(["fit", str(config), str(profile), "--schedule", "power_decay", "--steps", "20",
                 "--out", str(tmp_path / "out"), "--float64"]) == 0
    printed = capsys.readouterr().out
    lambda_0 = float(re.search(r"lambda_0 = (\S+)", printed).group(1))
    beta = float(re.search(r"beta = (\S+)", printed).group(1))
    # What was fitted is what is saved: the schedule type and its two parameters.
    saved = oracle.read_config(tmp_path / "out" / "fitted.yaml")["lambda_schedule_config"]
    assert saved["schedule_type"] == "power_decay" and set(saved) == {"schedule_type", "lambda_0", "beta"}
    assert saved["lambda_0"] == pytest.approx(lambda_0, rel=1e-5) and saved["beta"] == pytest.approx(beta, rel=1e-5)
    fitted = jaxroll.load_config(tmp_path / "out" / "fitted.yaml")
    t = np.arange(6)
    np.testing.assert_allclose(fitted.lambdas, saved["lambda_0"] / (t + 1.0) ** saved["beta"], rtol=1e-15)


def test_a_degenerate_power_decay_fit_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    """Issue 46: a 6-layer power-decay fit to the attention-only profile of a
    12-layer model drives every lambda to its bound: the first line says "not
    converged", the summary holds exactly one warning line about it (on
    stdout, with the counts; nothing on stderr but progress), and the step
    count of the summary is the one the progress lines end at."""
    small = dict(num_heads=4, diagonal_scores=0.5, sequence_length=N)
    config = jaxroll.save_config(jaxroll.RolloutModel.create(num_layers=6, lambdas=0.3, **small),
                                 tmp_path / "start.yaml")
    deeper = jaxroll.RolloutModel.create(num_layers=12, lambdas=1.0, **small)
    profile = jaxroll.write_profile(np.asarray(jaxroll.influence(deeper), np.float64), tmp_path / "deeper.csv")
    from jaxroll import progress as progress_module

    made = []

    class Recorded(progress_module.Progress):
        def __init__(self, *args, **kwargs):
            kwargs["delay"] = 0.0
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(progress_module, "Progress", Recorded)
    assert main(["fit", str(config), str(profile), "--schedule", "power_decay", "--out", str(tmp_path / "out"),
                 "--float64"]) == 0
    captured = capsys.readouterr()
    first = captured.out.splitlines()[0]
    assert first.startswith(f"jaxroll fit: {config} -> {profile}: not converged: the fit is degenerate")
    warnings = [line for line in captured.out.splitlines() if line.startswith("warning: the fit is degenerate")]
    assert len(warnings) == 1
    assert "warning" not in captured.err
    # The counts agree: the progress count is the longest restart's, which the summary names.
    (bar,) = made
    longest = int(re.search(r"the longest took (\d+), the progress count", captured.out).group(1))
    assert bar.done == bar.total == longest
    assert f"{longest}/{longest} steps (100%)" in captured.err and "stop=not converged" in captured.err


def test_constant_fit_converges_and_saves_its_constant(tmp_path, capsys):
    """One parameter, an exact target (constant 0.7 from 0.2): L-BFGS converges,
    the first line says so, no warning, and fitted.yaml is a constant schedule
    at 0.7 (to 1e-6: the loss floor 10 eps of float64 pins it far closer)."""
    small = dict(num_layers=6, num_heads=4, sequence_length=N)
    config = jaxroll.save_config(jaxroll.RolloutModel.create(lambdas=0.2, **small), tmp_path / "start.yaml")
    truth = jaxroll.save_config(jaxroll.RolloutModel.create(lambdas=0.7, **small), tmp_path / "truth.yaml")
    profile = jaxroll.write_profile(oracle.influence(oracle.config_arrays(oracle.read_config(truth)), N),
                                    tmp_path / "target.csv")
    assert main(["fit", str(config), str(profile), "--schedule", "constant", "--out", str(tmp_path / "out"),
                 "--float64"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith(f"jaxroll fit: {config} -> {profile}: converged")
    assert "optimizer = lbfgs" in captured.out and "warning:" not in captured.out + captured.err
    saved = oracle.read_config(tmp_path / "out" / "fitted.yaml")["lambda_schedule_config"]
    assert saved["schedule_type"] == "constant" and abs(saved["lambda_const"] - 0.7) < 1e-6


def test_fit_from_a_preset_at_the_profile_length(tmp_path, capsys):
    """--preset gives the start (its geometry), --length the profile's length
    (without it a profile of another length is refused, as for a config file:
    tests/test_cli_front_door.py): the start's profile in fit.csv is the
    oracle's profile of the preset's arrays at that length."""
    n = 20
    preset = jaxroll.presets.get("mpt-7b")
    profile = jaxroll.write_profile(np.full(n, 1 / n), tmp_path / "flat.csv")
    out = tmp_path / "out"
    assert main(["fit", str(profile), "--preset", "mpt-7b", "--length", str(n), "--search", "0", "--steps", "3",
                 "--optimizer", "adam", "--out", str(out), "--float64"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"jaxroll fit: preset mpt-7b -> {profile}:") and f"N = {n}," in printed
    with open(out / "fit.csv", newline="") as handle:
        initial = np.array([row[2] for row in list(csv.reader(handle))[1:]], dtype=np.float64)
    arrays = oracle.config_arrays(oracle.read_config(jaxroll.save_config(preset, tmp_path / "p.yaml")))
    np.testing.assert_allclose(initial, oracle.influence(arrays, n), rtol=0, atol=TOL)


@pytest.mark.parametrize("extra,message", [
    ([], "fit: no starting model; allowed: CONFIG, --preset NAME or --published NAME"),
    (["--preset", "mpt-7b", "--content", "mean"], "--content: applies to --published only"),
])
def test_a_start_is_required(files, tmp_path, capsys, extra, message):
    _, profile, _ = files
    assert main(["fit", str(profile), "--out", str(tmp_path / "out")] + extra) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra,message", [
    (["--fit", "lambdas,slopes"], "error: --fit: unknown array 'slopes'"),
    (["--length", "32"], "target.csv: length 24 differs from n = 32"),
    (["--schedule", "linear"], "argument --schedule: invalid choice"),
    (["--steps", "0"], "argument --steps"),
    (["--loss-tolerance", "-1"], "--loss-tolerance: got -1.0; allowed: a finite number >= 0"),
    (["--schedule", "constant", "--fit", "temperature"], "error: --schedule: 'constant' parametrises lambdas"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(files, tmp_path, capsys, extra, message):
    config, profile, _ = files
    out = tmp_path / "out"
    assert main(["fit", str(config), str(profile), "--out", str(out)] + extra) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert not out.exists()


def test_a_profile_of_another_length_is_refused_unless_asked_for(files, tmp_path, capsys):
    config, _, _ = files
    model = jaxroll.load_config(config)
    short = tmp_path / "two.csv"
    short.write_text("token_position,probability\n0,0.25\n1,0.75\n")
    out = tmp_path / "out"
    assert main(["fit", str(config), str(short), "--out", str(out), "--steps", "2"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and not out.exists()
    assert f"2 positions, but {config} has sequence_length {model.sequence_length}" in error
    assert "--length 2" in error
    assert main(["fit", str(config), str(short), "--out", str(out), "--steps", "2", "--length", "2",
                 "--search", "0"]) == 0
    assert "N = 2" in capsys.readouterr().out


def test_bad_profile_and_occupied_out(files, tmp_path, capsys):
    config, _, _ = files
    bad = tmp_path / "bad.csv"
    bad.write_text("token_position,probability\n0,0.5\n1,-0.5\n")
    assert main(["fit", str(config), str(bad), "--out", str(tmp_path / "a")]) == 2
    assert "probability -0.5" in capsys.readouterr().err
    far = tmp_path / "far.csv"
    jaxroll.write_profile(np.full(N, 0.5), far)
    assert main(["fit", str(config), str(far), "--out", str(tmp_path / "b")]) == 2
    assert f"{far}: sums to 12" in capsys.readouterr().err
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep")
    assert main(["fit", str(config), str(files[1]), "--out", str(occupied)]) == 2
    assert "--force" in capsys.readouterr().err
    assert [p.name for p in occupied.iterdir()] == ["mine.txt"]


def test_summary_reports_identifiability_and_warns(tmp_path, capsys):
    """Slopes and temperature without content: scaling both by one factor leaves
    the profile unchanged (scores are -m (i - j) / tau), so the temperature is
    not determined, and the summary says so in one warning line. The singular
    values printed are those of the report (checked against finite
    differences in test_fit.py); the design size is printed."""
    start = jaxroll.RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.5, alibi_slopes=[0.3, 0.1],
                                        sequence_length=12)
    other = jaxroll.RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.5, alibi_slopes=[0.5, 0.05],
                                        sequence_length=12)
    config = jaxroll.save_config(start, tmp_path / "start.yaml")
    profile = jaxroll.write_profile(oracle.influence(oracle.config_arrays(oracle.read_config(
        jaxroll.save_config(other, tmp_path / "other.yaml"))), 12), tmp_path / "target.csv")
    assert main(["fit", str(config), str(profile), "--fit", "alibi_slopes,temperature", "--steps", "5",
                 "--out", str(tmp_path / "out"), "--float64"]) == 0
    printed = capsys.readouterr().out
    assert "global design = 128 points" in printed  # 5 parameters: the global stage is on
    assert re.search(r"identifiability: Jacobian dp/du of 5 parameter\(s\)", printed)
    values = [float(x) for x in re.search(r"singular values: (.*)", printed).group(1).split()]
    assert len(values) == 5 and values[-1] < 1e-10 * values[0]
    warnings = [line for line in printed.splitlines() if "warning: not determined" in line]
    assert len(warnings) == 1 and "temperature" in warnings[0]


def test_search_zero_turns_the_global_stage_off(files, tmp_path, capsys):
    config, profile, _ = files
    # --restarts 1: with more, search = 0 still draws restarts - 1 points over the box.
    assert main(["fit", str(config), str(profile), "--search", "0", "--steps", "5", "--restarts", "1",
                 "--out", str(tmp_path / "out"), "--float64"]) == 0
    assert "global design = 0 points" in capsys.readouterr().out
    assert main(["fit", str(config), str(profile), "--search", "-1", "--out", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "argument --search" in error
    assert not (tmp_path / "bad").exists()


def test_fit_kernel_from_published_kernels(tmp_path, capsys):
    """fit-kernel --published: the ALiBi model's own kernels at --length are the
    target (32 heads mixed per layer, which one power head cannot represent
    exactly, so recovery is tested in test_fit_recovery.py; here the
    plumbing): the family's parameters are written and read back, one row per
    layer in kernel_fit.csv with the steps taken, the first line says how
    the layers stopped, and a warning closes stdout when some did not converge."""
    out = tmp_path / "k"
    assert main(["fit-kernel", "--published", "mpt-7b", "--length", "12", "--steps", "50",
                 "--out", str(out), "--float64"]) == 0
    captured = capsys.readouterr()
    first = captured.out.splitlines()[0]
    assert first.startswith("jaxroll fit-kernel: published mpt-7b") and "layer" in first
    saved = oracle.read_config(out / "fitted.yaml")
    assert saved["kernel_config"]["kernel_type"] == "relative" and saved["kernel_config"]["family"] == "power"
    table = np.loadtxt(out / "kernel_fit.csv", delimiter=",", skiprows=1)
    assert table.shape == (32, 4) and np.all((table[:, 3] >= 1) & (table[:, 3] <= 50))
    model = jaxroll.load_config(out / "fitted.yaml")
    assert model.num_layers == 32 and np.all(np.asarray(model.kernel.slopes) > 0)
    # One place for a run's counts and warnings: stdout, after the summary (as `fit`).
    assert "warning:" not in captured.err
    assert ("warning:" in captured.out.splitlines()[-1]) == ("not converged" in first)
    assert main(["fit-kernel", "--published", "mpt-7b", "--length", "12", "--steps", "3",
                 "--out", str(tmp_path / "short"), "--float64"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith("warning: the kernel fit did not converge in 3 steps")
    assert "warning:" not in captured.err
