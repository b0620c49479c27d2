"""`jaxroll compare` and `jaxroll forces`: outputs against scipy / NumPy, one-line errors, exit 2."""

import csv

import json

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
    assert cli.main(["compare", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)  # one object, the same numbers unrounded
    assert record["wasserstein"] == pytest.approx(
        scipy.stats.wasserstein_distance(positions, positions, p, q) / 39, rel=1e-12)
    assert record["kl"] == pytest.approx(scipy.stats.entropy(p, q), rel=1e-12)
    assert record["shape"]["A"]["argmin"] == int(np.argmin(p)) and record["N"] == 40


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



def _measurement(directory, rows):
    """A `jaxroll measure --out` directory as compare reads it: rows, and influence.csv their normalised mean."""
    directory.mkdir()
    np.savez(directory / "measurement.npz", influence_per_sequence=rows)
    total = rows.sum(axis=0)
    return _write(directory / "influence.csv", total / total.sum())


def _plain_band(rows, resamples, seed):
    """Pointwise 2.5 / 97.5 % quantiles of bootstrap means, one resample at a time (same seed, same draws)."""
    count = rows.shape[0]
    draws = np.random.default_rng(seed).multinomial(count, np.full(count, 1.0 / count), size=resamples)
    means = []
    for counts in draws:
        total = np.zeros(rows.shape[1])
        for s in range(count):
            total += counts[s] * rows[s]
        means.append(total / total.sum())
    return np.percentile(np.array(means), [2.5, 97.5], axis=0)


def _polygon_ends(collection, size):
    """Lowest and highest y of a fill_between polygon at each x = 0..size-1."""
    vertices = collection.get_paths()[0].vertices
    return np.array([[vertices[vertices[:, 0] == j, 1].min() for j in range(size)],
                     [vertices[vertices[:, 0] == j, 1].max() for j in range(size)]])


def test_compare_plot_draws_each_measured_profile_with_its_bootstrap_band(tmp_path, capsys, monkeypatch):
    from matplotlib.collections import PolyCollection

    from jaxroll import plot

    n, rng = 24, np.random.default_rng(7)
    x = np.linspace(-1, 1, n)
    rows_a = rng.gamma(1.5, size=(30, 1)) * rng.dirichlet(40 * (1 + 3 * x ** 2), size=30)
    rows_b = rng.gamma(1.5, size=(12, 1)) * rng.dirichlet(40 * (1 + 3 * x ** 2) * np.exp(x), size=12)
    a, b = _measurement(tmp_path / "ma", rows_a), _measurement(tmp_path / "mb", rows_b)
    figure_path = tmp_path / "fig" / "compare.png"
    argv = ["compare", a, b, "--out", str(figure_path.parent), "--measured", str(tmp_path / "ma"),
            "--measured", str(tmp_path / "mb"), "--resamples", "300", "--seed", "4"]
    assert cli.main(argv) == 0
    assert figure_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {figure_path}" in capsys.readouterr().out

    figures = []
    monkeypatch.setattr(plot, "_save", lambda figure, path: figures.append(figure) or path)
    assert cli.main([*argv, "--force"]) == 0
    axes = figures[0].axes[0]
    bands = {c.get_label()[0]: c for c in axes.collections if isinstance(c, PolyCollection) and "band" in c.get_label()}
    assert sorted(bands) == ["A", "B"]
    for name, rows in (("A", rows_a), ("B", rows_b)):
        label = bands[name].get_label()
        assert f"pointwise 95% bootstrap band (300 resamples of the {rows.shape[0]} sequences, seed 4)" in label
        drawn = _polygon_ends(bands[name], n)
        np.testing.assert_allclose(drawn, _plain_band(rows, 300, 4), rtol=1e-12, atol=0)
        mean = rows.sum(axis=0) / rows.sum()
        assert np.all((drawn[0] <= mean) & (mean <= drawn[1]))  # the band lies around the measured mean
    lines = {line.get_label()[:2]: line for line in axes.lines}
    np.testing.assert_allclose(lines["A:"].get_ydata(), rows_a.sum(axis=0) / rows_a.sum(), rtol=1e-15)
    np.testing.assert_allclose(lines["B:"].get_ydata(), rows_b.sum(axis=0) / rows_b.sum(), rtol=1e-15)
    assert "measured mean of 30 sequences" in lines["A:"].get_label()
    title = axes.get_title()
    p, q = (rows.sum(axis=0) / rows.sum() for rows in (rows_a, rows_b))
    w1 = scipy.stats.wasserstein_distance(np.arange(n), np.arange(n), p, q) / (n - 1)
    assert title.startswith(f"W1/(N-1) = {w1:.3g}, KL(A || B) = {scipy.stats.entropy(p, q):.3g}")

    # One measured profile: one band; none: no band, both curves drawn as read.
    figures.clear()
    assert cli.main(["compare", a, b, "--out", str(figure_path.parent), "--force", "--measured", "-", "--measured",
                     str(tmp_path / "mb")]) == 0
    assert cli.main(["compare", a, b, "--out", str(figure_path.parent), "--force"]) == 0
    for figure, expected in zip(figures, (["B"], [])):
        labels = [c.get_label()[0] for c in figure.axes[0].collections
                  if isinstance(c, PolyCollection) and "band" in c.get_label()]
        assert labels == expected
    assert [line.get_label() for line in figures[1].axes[0].lines if line.get_label()[:2] in ("A:", "B:")] == [
        f"A: {a}", f"B: {b}"]


def test_compare_plot_refusals_create_nothing(tmp_path, capsys):
    rng = np.random.default_rng(3)
    rows = rng.gamma(2.0, size=(10, 8))
    a = _measurement(tmp_path / "ma", rows)
    other = _write(tmp_path / "other.csv", np.full(8, 1 / 8))
    longer = _measurement(tmp_path / "long", rng.gamma(2.0, size=(10, 9)))
    (tmp_path / "old").mkdir()
    np.savez(tmp_path / "old" / "measurement.npz", influence=rows[0])
    (tmp_path / "nan").mkdir()
    np.savez(tmp_path / "nan" / "measurement.npz", influence_per_sequence=np.where(rows > 1, np.nan, rows))
    out = tmp_path / "fig"
    figure = out / "compare.png"
    (tmp_path / "file.txt").write_text("not a folder")
    for extra, message in (
            (["--measured", str(tmp_path / "ma")], "--measured " + str(tmp_path / "ma") + ": draws a band"),
            (["--out", str(out), "--measured", "-", "--measured", str(tmp_path / "long")], "--measured"),
            (["--out", str(out), "--measured", "-", "--measured", str(tmp_path / "ma")], "differs from"),
            (["--out", str(out), "--measured", str(tmp_path / "old")], "no influence_per_sequence"),
            (["--out", str(out), "--measured", str(tmp_path / "nan")], "not finite"),
            (["--out", str(out), "--measured", str(tmp_path / "none")], "no measurement.npz"),
            (["--out", str(tmp_path / "file.txt")], "not a folder"),
            (["--out", str(out), "--measured", "-", "--measured", "-", "--measured", "-"], "at most twice"),
            (["--plot", str(figure)], "--plot: retired; use --out DIR"),
            (["--measured-a", str(tmp_path / "ma")], "--measured-a: retired; use --measured DIR"),
            (["--out", str(out), "--resamples", "1"], "--resamples")):
        assert cli.main(["compare", a, other, *extra]) == 2, extra
        assert message in _error_line(capsys), extra
        assert not out.exists()
    assert cli.main(["compare", a, other, "--out", str(out), "--measured", "-", "--measured",
                     str(tmp_path / "long")]) == 2
    assert "N = 9 positions per sequence; allowed: N = 8" in _error_line(capsys)
    assert cli.main(["compare", a, other, "--out", str(out)]) == 0
    capsys.readouterr()
    before = figure.read_bytes()
    assert cli.main(["compare", a, other, "--out", str(out)]) == 2
    assert "--force" in _error_line(capsys) and figure.read_bytes() == before


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
