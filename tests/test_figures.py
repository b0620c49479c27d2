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
    assert "residual-aware rollout" in legend_labels(left)
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
    rungs = [label for label in legend_labels(linear) if label.startswith("+ ")]
    for label, name in zip(rungs, ("residual", "alibi", "content"), strict=True):
        assert label.startswith(plot.FORCE_LABELS[name])
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


# ------------------------------------------------- issue 32: each figure says what was computed


def labelled_ticks(axes) -> list[tuple[float, str]]:
    """(value, text) of the labelled major y ticks inside the axes' limits (after a draw)."""
    low, high = axes.get_ylim()
    return [(tick.get_loc(), tick.label1.get_text()) for tick in axes.yaxis.get_major_ticks()
            if tick.label1.get_visible() and tick.label1.get_text()
            and low * (1 - 1e-9) <= tick.get_loc() <= high * (1 + 1e-9)]


def span_of(axes, prefix: str) -> tuple[float, float]:
    """The x range of the shaded span whose legend label starts with `prefix`."""
    for patch in axes.patches:
        if patch.get_label().startswith(prefix):
            x = patch.get_xy()[:, 0] if hasattr(patch.get_xy(), "shape") else \
                np.array([patch.get_x(), patch.get_x() + patch.get_width()])
            return float(np.min(x)), float(np.max(x))
    raise AssertionError(f"no span labelled {prefix!r}: {[p.get_label() for p in axes.patches]}")


def covered(span, n) -> np.ndarray:
    """The integer positions 0..n-1 a span covers (its edges sit at half-integers)."""
    positions = np.arange(n)
    return positions[(positions > span[0]) & (positions < span[1])]


@pytest.mark.parametrize("low, high", [(3e-3, 4.5e-3), (2.2e-3, 6.9e-2), (1e-9, 0.5), (0.0303, 0.0304),
                                       (0.03, 0.03), (0.0099, 0.0101)])
def test_a_log_axis_has_two_labelled_ticks_whatever_its_span(low, high):
    """The loss of a fit may change by a factor 1.5 or by nine decades: either way
    the log axis labels at least two ticks inside its range, each label the
    plain-text value of its tick."""
    figure, ((axes,),) = plot._figure(5, 4)
    axes.plot([0, 1], [low, high])
    plot._log_axis(axes, low, high)
    figure.canvas.draw()
    ticks = labelled_ticks(axes)
    assert len(ticks) >= 2, ticks
    for value, text in ticks:
        assert float(text) == pytest.approx(value, rel=1e-9)
    bottom, top = axes.get_ylim()
    assert bottom <= low and top >= high  # the data stay inside


def test_fit_figure_starts_at_the_printed_before_and_labels_its_log_axis(tmp_path, capsys, figures):
    """The loss panel's first point is the loss of the model given: the summary's
    "loss: before", and (an independent oracle) a NumPy W1/(N-1) of the initial and
    target columns of fit.csv. Then the optimiser's curve, from x = 1."""
    n = 24
    start = jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.2, diagonal_scores=0.5,
                                        sequence_length=n)
    other = jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.7, diagonal_scores=-1.0,
                                        sequence_length=n)
    config = jaxroll.save_config(start, tmp_path / "start.yaml")
    target = jaxroll.write_profile(np.asarray(jaxroll.influence(other), np.float64), tmp_path / "target.csv")
    out = tmp_path / "out"
    printed = run(["fit", config, target, "--steps", "5", "--optimizer", "adam", "--search", "0", "--out", out,
                   "--float64"], capsys)
    with open(out / "fit.csv", newline="", encoding="utf-8") as handle:
        table = np.array([[float(x) for x in row[1:]] for row in list(csv.reader(handle))[1:]])
    before = float(np.abs(np.cumsum(table[:, 1] - table[:, 0])[:-1]).sum() / (n - 1))
    printed_before = float(printed.split("loss: before ")[1].split(",")[0])
    assert printed_before == pytest.approx(before, rel=1e-5)  # printed to 6 digits
    profiles, losses = figures["fit.png"].axes[:2]
    first = next(line for line in losses.get_lines() if line.get_label().startswith("before:"))
    assert first.get_xdata()[0] == 0 and first.get_ydata()[0] == pytest.approx(before, rel=1e-12)
    curve = next(line for line in losses.get_lines() if line.get_label().startswith("optimiser steps"))
    assert curve.get_xdata()[0] == 1
    assert losses.get_yscale() == "log" and len(labelled_ticks(losses)) >= 2  # W1 > 0 throughout
    fitted = next(line for line in profiles.get_lines() if line.get_label() == "fitted")
    np.testing.assert_allclose(fitted.get_ydata(), profile_csv(out / "fitted.csv"), rtol=1e-12)


def test_fit_figure_clips_a_last_token_spike_and_says_so():
    """A spike at the last token would flatten the fitted profile: the y range ends
    at CLIP_FACTOR times the largest value before it, and each clipped last value
    is marked at the top edge with its value in the legend."""
    n = 40
    body = 1.0 + 0.5 * np.cos(np.linspace(0, np.pi, n))
    target = np.r_[body[:-1], 60.0]
    fitted = np.r_[body[:-1] * 1.02, 55.0]
    initial = np.full(n, 1.0)
    target, fitted, initial = (x / x.sum() for x in (target, fitted, initial))
    figure = plot.fit_figure(target, initial, fitted, [1e-2, 1e-3], initial_loss=2e-2)
    axes = figure.axes[0]
    top = plot.CLIP_FACTOR * max(target[:-1].max(), fitted[:-1].max(), initial[:-1].max())
    assert axes.get_ylim()[1] == pytest.approx(top, rel=1e-12) and top < fitted[-1]
    figure.canvas.draw()
    labels = legend_labels(axes)
    assert any(label.startswith(f"target at j = {n - 1}: {target[-1]:.3g}") for label in labels), labels
    assert any(label.startswith(f"fitted at j = {n - 1}: {fitted[-1]:.3g}") for label in labels), labels
    assert not any(label.startswith("initial at j") for label in labels)  # not clipped
    assert "clipped" in axes.get_title()
    line = next(line for line in axes.get_lines() if line.get_label() == "fitted")
    np.testing.assert_array_equal(line.get_ydata(), fitted)
    # Unclipped, the fitted body would fill under 3% of the height; clipped, over 40%.
    assert fitted[:-1].max() < 0.03 * fitted[-1] and fitted[:-1].max() >= 0.4 * axes.get_ylim()[1]


@pytest.mark.parametrize("length", [16, 25, 256])
def test_profile_shades_exactly_the_positions_middle_mass_sums(tmp_path, capsys, figures, length):
    """The shaded middle covers the positions whose sum is the printed
    middle_mass (jaxroll.metrics: p[k:N-k], k = max(1, round(N / 10))), and the
    edges the first and last k."""
    config = write_config(tmp_path / "model.yaml", slopes=0.3, lambda_const=0.5, layers=2, length=length)
    out = tmp_path / "out"
    printed = run(["rollout", config, "--out", out, "--float64"], capsys)
    first, middle, last = (float(x) for x in printed.split("first_mass / middle_mass / last_mass = ")[1]
                           .split(" (")[0].split(" / "))
    profile = profile_csv(out / "profile.csv")
    axes = figures["profile.png"].axes[0]
    k = max(1, round(0.1 * length))
    shaded = covered(span_of(axes, "middle"), length)
    np.testing.assert_array_equal(shaded, np.arange(k, length - k))
    assert profile[shaded].sum() == pytest.approx(middle, rel=1e-5)  # printed to 6 digits
    edges = [patch for patch in axes.patches if patch.get_facecolor() == axes.patches[0].get_facecolor()]
    left, right = (covered(span_of_patch(p), length) for p in edges[:2])
    assert profile[left].sum() == pytest.approx(first, rel=1e-5)
    assert profile[right].sum() == pytest.approx(last, rel=1e-5)
    assert any(label == f"middle, j = {k}..{length - k - 1} (middle_mass)" for label in legend_labels(axes))


def span_of_patch(patch) -> tuple[float, float]:
    x = patch.get_xy()[:, 0] if hasattr(patch.get_xy(), "shape") else \
        np.array([patch.get_x(), patch.get_x() + patch.get_width()])
    return float(np.min(x)), float(np.max(x))


def test_forces_rungs_have_distinct_styles_and_coinciding_rungs_say_so(tmp_path, capsys, figures):
    """No rung hides under another: every pair differs in line style or width,
    and a rung equal to an earlier one (here + content on a model without
    content, checked from forces.csv) says so in the legend."""
    out = tmp_path / "forces"
    printed = run(["forces", "--published", "bloom-7b1", "--length", "24", "--out", out, "--float64"], capsys)
    assert "(no content, fineweb-edu)" in printed and "none content" not in printed
    table = np.loadtxt(out / "forces.csv", delimiter=",", skiprows=1)
    figure = figures["forces.png"]
    assert "(no content, fineweb-edu)" in figure._suptitle.get_text()
    for axes in figure.axes[:2]:
        rungs = [line for line in axes.get_lines() if line.get_label().startswith(("+ ", "causal"))]
        styles = [(line.get_linestyle(), line.get_linewidth()) for line in rungs]
        assert len(set(styles)) == len(styles), styles
    alibi, content = table[:, 3], table[:, 4]
    coincide = np.max(np.abs(content - alibi)) <= 1e-6 * np.max(alibi)
    assert coincide  # no content: the case is what it claims to be
    label = [text for text in legend_labels(figure.axes[0]) if text.startswith(plot.FORCE_LABELS["content"])][0]
    assert label.endswith(f"(coincides with {plot.FORCE_LABELS['alibi']})")
    other = [text for text in legend_labels(figure.axes[0]) if text.startswith(plot.FORCE_LABELS["alibi"])][0]
    assert "coincides" not in other


@pytest.mark.parametrize("layers", [3, 7, 70])
def test_lambdas_figure_has_integer_layer_ticks(tmp_path, figures, layers):
    lambdas = np.linspace(0.6, 0.1, layers)
    plot.plot_lambdas(tmp_path / "lambdas.png", lambdas, np.full(layers, 0.01), title="t")
    axes = figures["lambdas.png"].axes[0]
    low, high = axes.get_xlim()
    ticks = [t for t in axes.get_xticks() if low <= t <= high]
    assert len(ticks) >= 2
    assert all(float(t).is_integer() and 0 <= t <= layers - 1 for t in ticks), ticks  # layers from 0
    np.testing.assert_array_equal(axes.lines[0].get_xdata(), np.arange(layers))


# ------------------------------------------------- issue 46: peaked profiles, the sweep's N and base point


def test_a_peaked_profile_gets_a_log_panel_where_the_measured_curve_and_band_show():
    """A spike at the last positions: on the linear axis the rest is a flat line
    under it, so score/compare and measure's influence figure add a log-y panel
    with the measured curve and its band above the panel's bottom."""
    from jaxroll.plot.measured import measured_influence_figure, peaked, two_profiles_figure

    n = 64
    measured = np.full(n, 0.003)
    measured[-1] = 0.6
    measured /= measured.sum()
    band = np.stack([0.8 * measured, 1.2 * measured])
    predicted = np.roll(measured, 0) * np.linspace(0.9, 1.1, n)
    predicted /= predicted.sum()
    assert peaked(measured) and not peaked(np.full(n, 1.0 / n))
    for figure in (measured_influence_figure(measured, band=band, title="t"),
                   two_profiles_figure(measured, predicted, labels=("measured", "prediction"), bands=(band, None),
                                       title="t")):
        figure.canvas.draw()
        logs = [axes for axes in figure.axes if axes.get_yscale() == "log"]
        assert len(logs) == 1
        (axes,) = logs
        bottom = axes.get_ylim()[0]
        measured_line = axes.get_lines()[0]
        assert np.all(np.asarray(measured_line.get_ydata()) > bottom)  # visible, not under the prediction's spike
        assert axes.collections  # the band is drawn there
        figure.clear()
    flat = measured_influence_figure(np.full(n, 1.0 / n))
    assert [axes.get_yscale() for axes in flat.axes] == ["linear"]
    flat.clear()


def test_sweep_heatmap_title_carries_n_and_marks_the_base_point():
    from jaxroll.plot.sweep import sweep_figures

    figures = sweep_figures({"center_of_mass": np.arange(6.0).reshape(2, 3)},
                            [("lambda_0", [0.2, 0.8]), ("beta", [0.5, 1.0, 3.0])], title="spec.yaml",
                            sequence_length=256, base={"lambda_0": 0.5, "beta": 2.0})
    figure = figures["heatmap_center_of_mass.png"]
    assert "N = 256" in figure.get_suptitle()
    (axes,) = [a for a in figure.axes if a.get_images()]
    (star,) = axes.get_lines()
    np.testing.assert_allclose([star.get_xdata()[0], star.get_ydata()[0]], [1.5, 0.5])
    assert any("base point: lambda_0 = 0.5, beta = 2" in label for label in legend_labels(axes))
    figure.clear()


def test_an_intervened_profile_draws_the_baseline_and_the_difference(tmp_path, capsys, figures):
    """rollout --intervene: the left panel holds the baseline (the profile.csv of a run without the change)
    and the changed profile (this run's profile.csv), labelled so; the right panel their difference."""
    config = write_config(tmp_path / "model.yaml", slopes=0.3, lambda_const=0.5, layers=3)
    run(["rollout", config, "--out", tmp_path / "base", "--float64", "--no-figure"], capsys)
    run(["rollout", config, "--intervene", "tau=0.7", "--out", tmp_path / "changed", "--float64"], capsys)
    baseline, changed = profile_csv(tmp_path / "base" / "profile.csv"), profile_csv(tmp_path / "changed" / "profile.csv")
    assert np.max(np.abs(changed - baseline)) > 1e-3  # the change is visible
    left, right = figures["profile.png"].axes[:2]
    labels = legend_labels(left)
    k = 2  # edge_count(16): the summary's middle
    assert f"baseline (no intervention): middle mass {baseline[k:16 - k].sum():.4g}" in labels
    assert f"with tau=0.7 (predicted): middle mass {changed[k:16 - k].sum():.4g}" in labels
    lines = {line.get_label(): np.asarray(line.get_ydata()) for line in left.get_lines()}
    np.testing.assert_allclose(lines[[x for x in labels if x.startswith("baseline")][0]], baseline, rtol=1e-12)
    np.testing.assert_allclose(lines[[x for x in labels if x.startswith("with tau")][0]], changed, rtol=1e-12)
    assert right.get_title().startswith("difference: middle mass ")
    assert "with tau=0.7 minus baseline" in legend_labels(right)
    np.testing.assert_allclose(right.get_lines()[0].get_ydata(), changed - baseline, atol=1e-15)
    assert right.get_ylabel() == "change of p_T(j) (changed - baseline)"


def test_design_figure_shows_the_designed_values(tmp_path, capsys, figures):
    """design.png's box holds every designed value as interventions.yaml records it (4 significant
    digits) and the largest kernel KL of design.json."""
    import json

    import yaml

    config = write_config(tmp_path / "model.yaml", slopes=0.3, lambda_const=0.5, layers=2)
    out = tmp_path / "design"
    run(["design", config, "--free", "tau=per_layer,gamma=global", "--target", "flat", "--search", "0",
         "--steps", "20", "--float64", "--out", out], capsys)
    record = yaml.safe_load((out / "interventions.yaml").read_text())
    summary = json.loads((out / "design.json").read_text())
    texts = [text.get_text() for axes in figures["design.png"].axes for text in axes.texts]
    box = [text for text in texts if text.startswith("designed (interventions.yaml):")]
    assert len(box) == 1
    tau = np.ravel(record["tau"])
    assert f"tau (2 values) = {tau[0]:.4g}, {tau[1]:.4g}" in box[0].splitlines()
    assert f"gamma = {float(record['gamma']):.4g}" in box[0].splitlines()
    assert f"kernel KL, largest layer: {max(summary['kl']):.4g}" in box[0].splitlines()


def test_design_box_counts_the_values_it_does_not_write():
    from jaxroll.plot.design import designed_text

    text = designed_text({"tau": np.arange(1.0, 11.0)}, kl=[0.01, 0.02], kl_budget=0.05).splitlines()
    assert text[1] == "tau (10 values) = 1, 2, 3, 4, 5, 6, 7, 8, ... (2 more)"
    assert text[2] == "kernel KL, largest layer: 0.02 (budget 0.05)"


def test_series_colour_scale_is_set_without_the_last_token_and_says_so():
    """The last position holds most of the mass; the colour scale spans positions 0..N-2 (an oracle
    computed here), the last is clipped to the top colour, and the colour bar's label says both."""
    from jaxroll.plot.series import series_figure

    rng = np.random.default_rng(0)
    count, n = 4, 12
    body = rng.uniform(0.02, 0.06, size=(count, n - 1))
    measured = np.column_stack([body, np.full(count, 0.6)])
    figure = series_figure([0, 1, 2, 4], measured, rng.uniform(0.2, 0.8, size=(count, 2)), np.ones(count))
    heat = [axes for axes in figure.axes if axes.get_title() == "measured profile by step"][0]
    norm = heat.images[0].norm
    assert norm.vmin == body.min() and norm.vmax == body.max()
    labels = [axes.get_ylabel() for axes in figure.axes if axes.get_ylabel().startswith("measured influence")]
    assert labels == [f"measured influence m(j) (log colour)\nscale from j = 0..{n - 2}; "
                      f"j = {n - 1}, above it: top colour"]
    figure.clear()
