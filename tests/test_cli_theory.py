"""`jaxroll compare` and `jaxroll forces`: outputs against scipy / NumPy, one-line errors, exit 2."""

import csv

import numpy as np
import pytest
import scipy.stats

import jaxroll
from jaxroll import cli, theory
from conftest import REFERENCE_CONFIGS

EXAMPLE = REFERENCE_CONFIGS / "rollout" / "example.yaml"


def _write(path, values):
    jaxroll.write_profile(np.asarray(values, dtype=np.float64), path)
    return str(path)


def _error_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jaxroll: error: ")
    return err


def test_compare_prints_scipy_values(tmp_path, capsys):
    rng = np.random.default_rng(0)
    p, q = rng.random(40), rng.random(40)
    p, q = p / p.sum(), q / q.sum()
    assert cli.main(["compare", _write(tmp_path / "a.csv", p), _write(tmp_path / "b.csv", q)]) == 0
    out = capsys.readouterr().out
    values = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:6]}
    positions = np.arange(40)
    # printed with 9 significant digits: compare at 1e-8 relative
    assert float(values["wasserstein"]) == pytest.approx(
        scipy.stats.wasserstein_distance(positions, positions, p, q) / 39, rel=1e-8)
    assert float(values["kl(A"]) == pytest.approx(scipy.stats.entropy(p, q), rel=1e-8)
    assert float(values["spearman"]) == pytest.approx(scipy.stats.spearmanr(p, q).statistic, rel=1e-8)
    assert f"argmin" in out and str(int(np.argmin(p))) in out


@pytest.mark.parametrize("values, other, message", [
    ([0.2, 0.2, 0.2], [1 / 3] * 3, "a.csv: sums to 0.6"),
    ([0.0, 0.0], [0.5, 0.5], "a.csv: total mass is 0"),
    ([0.5, 0.5], [1 / 3] * 3, "b.csv: length 3 differs from p's length 2"),
])
def test_compare_bad_profiles_exit_2(tmp_path, capsys, values, other, message):
    code = cli.main(["compare", _write(tmp_path / "a.csv", values), _write(tmp_path / "b.csv", other)])
    assert code == 2
    assert message in _error_line(capsys)


def test_compare_normalize_and_missing_file(tmp_path, capsys):
    a = _write(tmp_path / "a.csv", [1.0, 2.0, 1.0])
    b = _write(tmp_path / "b.csv", [0.25, 0.5, 0.25])
    assert cli.main(["compare", a, b, "--normalize"]) == 0
    out = capsys.readouterr().out
    assert "total_variation" in out and float(out.splitlines()[5].split()[-1]) == 0.0
    assert cli.main(["compare", a, str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in _error_line(capsys)
    assert cli.main(["compare", a, b, "--fraction", "0.7"]) == 2
    assert "--fraction" in _error_line(capsys)


def test_forces_writes_csv_png_and_table(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["forces", str(EXAMPLE), "--out", str(out), "--float64", "--length", "32"]) == 0
    printed = capsys.readouterr().out
    assert (out / "forces.png").stat().st_size > 0
    with open(out / "forces.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["token_position", "causal", "residual", "alibi", "content"]
    table = np.array(rows[1:], dtype=np.float64)
    assert table.shape == (32, 5) and np.all(table[:, 0] == np.arange(32))
    model = jaxroll.load_config(EXAMPLE)
    expected = np.asarray(theory.forces(model, 32).profiles).T
    np.testing.assert_allclose(table[:, 1:], expected, rtol=0, atol=1e-15)  # %.17g: exact
    assert np.all(np.abs(table[:, 1:].sum(axis=0) - 1) < 1e-12)
    for name in ("+causal", "+residual", "+alibi", "+content"):
        assert name in printed
    # A second run must not overwrite without --force.
    assert cli.main(["forces", str(EXAMPLE), "--out", str(out)]) == 2
    assert "--force" in _error_line(capsys)
    assert cli.main(["forces", str(EXAMPLE), "--out", str(out), "--force", "--length", "16"]) == 0


def test_forces_bad_input_exit_2(tmp_path, capsys):
    assert cli.main(["forces", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in _error_line(capsys)
    assert cli.main(["forces", str(EXAMPLE), "--length", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--length" in _error_line(capsys)
