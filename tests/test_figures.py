"""Each command's figures say what was computed (issue 19).

The commands run in-process with `jaxroll.plot._save` wrapped, so every
figure is inspected as a matplotlib Figure before it is written: titles,
legend labels and drawn data are compared with the command's own output files
and with quantities recomputed here (the attention-only profile, the collapse
criterion ``p[0] > 0.5``, the log panels' floor). Float tolerances: the CSVs
hold 17 significant digits, the figures the same float64 arrays, so equality
is checked at 1e-12 relative.
"""

import csv

import numpy as np
import pytest

import jaxroll
from jaxroll import plot
from jaxroll.cli import main


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved during the test, by file name (the figure is kept open)."""
    captured = {}
    original = plot._save

    def keep(figure, path):
        captured[path.name] = figure
        figure.canvas.draw()  # legends and limits as written
        figure.savefig(path, dpi=50, format="png")
        return path

    monkeypatch.setattr(plot, "_save", keep)
    yield captured
    for figure in captured.values():
        figure.clear()  # no pyplot: nothing else holds the figure
    assert original is not None


def legend_labels(axes) -> list[str]:
    legend = axes.get_legend()
    return [text.get_text() for text in legend.get_texts()] if legend else []


def run(arguments, capsys):
    status = main([str(a) for a in arguments])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out


def profile_csv(path) -> np.ndarray:
    with open(path, newline="", encoding="utf-8") as handle:
        return np.array([float(row[1]) for row in list(csv.reader(handle))[1:]])


def check_floor(axes) -> None:
    """No line on a log panel draws a value below the panel's floor (they are masked instead)."""
    bottom = axes.get_ylim()[0]
    for line in axes.get_lines():
        y = np.ma.masked_invalid(np.ma.asarray(line.get_ydata(), dtype=np.float64))
        if y.count():
            assert y.min() >= bottom * (1 - 1e-12), (line.get_label(), y.min(), bottom)


def write_config(path, *, slopes, lambda_const, layers=1, length=16):
    path.write_text(
        f"sequence_length: {length}\nnum_layers: {layers}\n"
        f"attention_config: {{num_heads: 1, alibi_slopes: [[{slopes}]]}}\n"
        f"lambda_schedule_config: {{schedule_type: constant, lambda_const: {lambda_const}}}\n")
    return path


@pytest.mark.parametrize("slopes, layers, expect_collapse", [(0.0, 6, True), (2.0, 1, False)])
def test_rollout_contrast_is_titled_a_collapse_only_when_p0_exceeds_one_half(
        tmp_path, capsys, figures, slopes, layers, expect_collapse):
    config = write_config(tmp_path / "model.yaml", slopes=slopes, lambda_const=0.5, layers=layers)
    out = tmp_path / "out"
    run(["rollout", config, "--out", out, "--float64"], capsys)
    figure = figures["profile.png"]
    left, right = figure.axes[:2]
    profile = profile_csv(out / "profile.csv")
    attention_only = np.asarray(jaxroll.influence(jaxroll.RolloutModel.create(
        num_layers=layers, num_heads=1, lambdas=1.0, alibi_slopes=slopes, sequence_length=16)), np.float64)
    assert (attention_only[0] > 0.5) == expect_collapse  # the case is what it claims to be
    assert left.get_title() == "residual-aware rollout (linear axes)"
    assert legend_labels(left)[1] == "residual-aware rollout"
    np.testing.assert_allclose(left.get_lines()[0].get_ydata(), profile, rtol=1e-12)
    assert ("collapse (p[0] > 0.5)" in right.get_title()) == expect_collapse
    assert ("no collapse (p[0] <= 0.5)" in right.get_title()) == (not expect_collapse)
    labels = legend_labels(right)
    assert labels[0].startswith("residual-aware rollout")
    assert labels[1].startswith(f"attention only (lambda = 1): p[0] = {attention_only[0]:.4g}")
    drawn = np.ma.asarray(right.get_lines()[1].get_ydata())
    hidden = int(np.sum(attention_only < right.get_ylim()[0]))
    assert int(np.ma.count_masked(drawn)) == hidden
    assert (f"{hidden} value" in labels[1]) == (hidden > 0)
    check_floor(right)


def test_no_residual_is_labelled_attention_only_with_no_contrast_panel(tmp_path, capsys, figures):
    run(["rollout", "--published", "falcon-rw-7b", "--no-residual", "--length", "16", "--out", tmp_path / "o"],
        capsys)
    figure = figures["profile.png"]
    assert len(figure.axes) == 1
    assert figure.axes[0].get_title() == "attention-only rollout (every lambda = 1) (linear axes)"
    assert "attention-only rollout (every lambda = 1)" in legend_labels(figure.axes[0])
    assert not any("residual-aware" in label for label in legend_labels(figure.axes[0]))


def test_forces_explains_causal_masking_and_draws_no_floor_as_data(tmp_path, capsys, figures):
    out = tmp_path / "forces"
    run(["forces", "--preset", "mpt-7b", "--length", "32", "--out", out, "--float64"], capsys)
    table = np.loadtxt(out / "forces.csv", delimiter=",", skiprows=1)
    causal = table[:, 1]
    linear, logarithmic = figures["forces.png"].axes[:2]
    labels = legend_labels(logarithmic)
    assert labels[0].startswith(f"{plot.FORCE_LABELS['causal']}: p[0] = {causal[0]:.4g}")
    for label, name in zip(labels[1:], ("residual", "alibi", "content"), strict=True):
        assert label.startswith(plot.FORCE_LABELS[name])
    floor = logarithmic.get_ylim()[0]
    assert np.isclose(floor, plot._log_floor(table[:, 2:].T), rtol=1e-12)
    hidden = int(np.sum(causal < floor))
    assert hidden > 0 and f"{hidden} values < {floor:.1e} not drawn" in labels[0]
    assert f"values < {floor:.1e} not drawn" in logarithmic.get_title()
    check_floor(logarithmic)
    # The linear panel: the residual-aware rungs only, each drawn as computed.
    assert legend_labels(linear)[1:] == [plot.FORCE_LABELS[n] for n in ("residual", "alibi", "content")]
    for line, column in zip(linear.get_lines(), (2, 3, 4)):
        np.testing.assert_allclose(line.get_ydata(), table[:, column], rtol=1e-12)


def test_sweep_draws_every_length_and_places_values_by_value(tmp_path, capsys, figures):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {preset: mpt-7b, sequence_length: 16}\n"
                    "axes: {lambda_0: [0.2, 0.8], beta: [0.5, 1.0, 3.0]}\nlengths: [8, 16]\n")
    run(["sweep", spec, "--out", tmp_path / "grid"], capsys)
    with open(tmp_path / "grid" / "sweep.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    figure = figures["heatmap_center_of_mass.png"]
    panels = [axes for axes in figure.axes if axes.get_title().startswith("N = ")]
    assert [axes.get_title() for axes in panels] == ["N = 8", "N = 16"]
    for axes, n in zip(panels, (8, 16)):
        expected = np.array([[float(r["center_of_mass"]) for r in rows
                              if int(r["length"]) == n and int(r["lambda_0_index"]) == i] for i in range(2)])
        np.testing.assert_allclose(axes.get_images()[0].get_array(), expected, rtol=1e-12)
        assert axes.get_ylabel() == "lambda_0" and axes.get_xlabel() == "beta"

    line_spec = tmp_path / "line.yaml"
    temperatures = [0.5, 0.75, 1, 1.5, 2, 3]
    line_spec.write_text(f"base: {{preset: mpt-7b, sequence_length: 16}}\naxes: {{temperature: {temperatures}}}\n")
    run(["sweep", line_spec, "--out", tmp_path / "line"], capsys)
    axes = figures["line_first.png"].axes[0]
    np.testing.assert_array_equal(axes.get_lines()[0].get_xdata(), temperatures)
    assert axes.get_xlabel() == "temperature (placed by value)"


def test_collapse_criterion():
    assert plot.collapsed([0.51, 0.49]) and not plot.collapsed([0.5, 0.5]) and not plot.collapsed([0.1, 0.9])
