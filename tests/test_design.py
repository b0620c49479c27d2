"""jaxroll.design / ``jaxroll design`` and intervention axes of jaxroll.sweep, against NumPy oracles.

Oracles (written here, sharing no code with jaxroll): dense ALiBi + content logits of every head,
divided by tau, plus kappa ln(1 + (i - j)), masked causally and softmaxed in NumPy float64, mixed
by the head weights; the rollout as row-vector products; gamma through
``lambda' = gamma lambda / (gamma lambda + 1 - lambda)``; the middle mass, U-index and argmin from
their definitions; the kernel KL as the mean over rows of ``sum_j A' log(A' / A)``.

Tolerances (float64, conftest): profiles 1e-12 (at most 3 layers of probabilities <= 1);
recovered parameters 1e-4 relative (the brief's; the KL loss floors at 10 eps, where the
parameters are known to ~sqrt(eps) ~ 1e-7 relative); the KL budget holds to 1e-9 relative (the
design is bisected back within it in float64) and binds to 1e-3.

Identifiability of the synthetic truth: per-layer tau with a global gamma on a model whose layers
have different kernels. Per-layer gamma on a model whose layers share one kernel is NOT
identifiable: the layers' transitions commute, so the profile depends on the multiset of
lambda'_t only (permuting layers gives the same profile); docs/design-interventions.md says so.
"""

import dataclasses
import io
import json
import re
import sys

import numpy as np
import pytest
import yaml

import jaxroll
from jaxroll import cli
from jaxroll import interventions as iv
from jaxroll.designs import parameters as design_parameters

T, H, N = 3, 2, 32
SLOPES = np.array([[0.5, 0.1], [0.3, 0.05], [0.2, 0.4]])
DIAGONAL = np.array([[0.5, -0.3], [1.0, 0.2], [0.0, 0.4]])
WEIGHTS = np.array([[0.7, 0.3], [0.5, 0.5], [0.2, 0.8]])
LAMBDAS = np.array([0.6, 0.4, 0.5])


def small_model(n=N):
    """Three layers with different kernels (so per-layer parameters are identifiable)."""
    return jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=LAMBDAS, alibi_slopes=SLOPES,
                                       diagonal_scores=DIAGONAL, head_weights=WEIGHTS, sequence_length=n)


# --- NumPy float64 oracles ------------------------------------------------------------------------------

def numpy_kernels(n, tau=1.0, kappa=0.0, scale=1.0, slopes=SLOPES, diagonal=DIAGONAL, weights=WEIGHTS):
    """``(T, n, n)``: sum_h w_h softmax_j((-s m (i - j) + d [i = j]) / tau + kappa ln(1 + i - j)), causal."""
    layers = slopes.shape[0]
    tau = np.broadcast_to(np.asarray(tau, np.float64), (layers, slopes.shape[1]))  # a number or (T, 1)
    kappa = np.broadcast_to(kappa, (layers, slopes.shape[1]))
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    distance = i - j
    kernels = np.zeros((layers, n, n))
    for t in range(layers):
        for h in range(slopes.shape[1]):
            scores = (-scale * slopes[t, h] * distance + diagonal[t, h] * (distance == 0)) / tau[t, h]
            scores = scores + kappa[t, h] * np.log1p(np.maximum(distance, 0))
            scores = np.where(distance >= 0, scores, -np.inf)
            scores = scores - scores.max(axis=1, keepdims=True)
            head = np.exp(scores)
            kernels[t] += weights[t, h] / weights[t].sum() * head / head.sum(axis=1, keepdims=True)
    return kernels


def numpy_profile(kernels, lambdas):
    row = np.zeros(kernels.shape[-1])
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        row = (1 - lambdas[t]) * row + lambdas[t] * (row @ kernels[t])
    return row


def branch_scaled(lambdas, gamma):
    return gamma * lambdas / (gamma * lambdas + 1 - lambdas)


def numpy_kl(changed, original):
    """Per layer: the mean over rows of sum_j A'[i, j] log(A'[i, j] / A[i, j]) (0 log 0 = 0)."""
    positive = changed > 0
    terms = np.where(positive, changed * (np.log(np.where(positive, changed, 1.0)) - np.log(
        np.where(positive, original, 1.0))), 0.0)
    return terms.sum(axis=-1).mean(axis=-1)


def numpy_middle_mass(p, fraction=0.1):
    k = max(1, round(fraction * p.size))
    return float(p[k:p.size - k].sum())


def numpy_u_index(p, fraction=0.1):
    k = max(1, round(fraction * p.size))
    return min(p[:k].mean(), p[-k:].mean()) / p[k:p.size - k].mean() - 1


# --- item 1: design ------------------------------------------------------------------------------------

TRUE_TAU = np.array([[0.8], [1.3], [1.1]])
TRUE_GAMMA = 0.7


def synthetic_target():
    return numpy_profile(numpy_kernels(N, tau=TRUE_TAU), branch_scaled(LAMBDAS, TRUE_GAMMA))


def test_the_oracle_agrees_with_the_interventions():
    """The oracle and jaxroll's transforms describe the same change (so the truth below is the truth)."""
    changed = iv.apply_all(small_model(), [iv.Temperature(TRUE_TAU), iv.DistanceBias(0.3), iv.BranchScale(0.7)])
    expected = numpy_profile(numpy_kernels(N, tau=TRUE_TAU, kappa=0.3), branch_scaled(LAMBDAS, 0.7))
    assert np.max(np.abs(np.asarray(jaxroll.influence(changed)) - expected)) < 1e-12


@pytest.fixture(scope="module")
def recovered():
    return jaxroll.design(small_model(), "tau=per_layer,gamma=global", target=synthetic_target(), loss="kl")


def test_synthetic_truth_is_recovered(recovered):
    assert recovered.converged, recovered.stop_reason
    np.testing.assert_allclose(recovered.values["tau"], TRUE_TAU, rtol=1e-4)
    np.testing.assert_allclose(recovered.values["gamma"], TRUE_GAMMA, rtol=1e-4)
    assert recovered.at_bounds == {} and recovered.warnings == ()
    assert recovered.identifiability is not None and bool(np.all(recovered.identifiability.determined))
    # The result's own numbers against the oracle at the recovered values.
    expected = numpy_profile(numpy_kernels(N, tau=recovered.values["tau"]),
                             branch_scaled(LAMBDAS, recovered.values["gamma"]))
    assert np.max(np.abs(recovered.after - expected)) < 1e-12
    assert abs(recovered.middle_mass[1] - numpy_middle_mass(expected)) < 1e-12
    assert abs(recovered.u_index[1] - numpy_u_index(expected)) < 1e-10
    # The record reads back into the same interventions (interventions.yaml).
    again = iv.from_mapping(yaml.safe_load(yaml.safe_dump(recovered.record)))
    assert np.max(np.abs(np.asarray(jaxroll.influence(iv.apply_all(small_model(), again))) - recovered.after)) < 1e-14


def test_a_wrong_truth_is_not_recovered(recovered):
    """The recovery test can fail: a target from other parameters gives other values."""
    other = numpy_profile(numpy_kernels(N, tau=np.array([[1.2], [0.9], [1.0]])), branch_scaled(LAMBDAS, 0.5))
    result = jaxroll.design(small_model(), "tau=per_layer,gamma=global", target=other, loss="kl")
    assert not np.allclose(result.values["tau"], recovered.values["tau"], rtol=1e-2)
    np.testing.assert_allclose(result.values["gamma"], 0.5, rtol=1e-4)


BUDGET = 0.02


@pytest.fixture(scope="module")
def budgeted():
    return jaxroll.design(small_model(), "tau=global,kappa=global,gamma=global", goal="middle_mass",
                          kl_budget=BUDGET, bounds="gamma=0.5:2")


def test_a_budgeted_design_reports_its_outer_iterations(capsys):
    """progress=True (the command's default): the closing line counts the augmented-Lagrangian iterations
    on stderr, and the design is the same as without it."""
    capsys.readouterr()
    quiet = jaxroll.design(small_model(), "tau=global", goal="middle_mass", kl_budget=BUDGET, search=0)
    assert capsys.readouterr().err == ""  # progress=False (the default): nothing at all
    shown = jaxroll.design(small_model(), "tau=global", goal="middle_mass", kl_budget=BUDGET, search=0,
                           progress=True)
    err = capsys.readouterr().err
    assert err.startswith("jaxroll design: ") and "outer iterations" in err and "stop=" in err
    assert "\r" not in err  # lines in a log, never a carriage return
    assert shown.values["tau"] == quiet.values["tau"] and shown.outer_iterations == quiet.outer_iterations


def test_design_progress_names_its_stage_before_the_first_compiled_call_returns(monkeypatch):
    """The first line comes before the first compiled call (the original kernels of a budgeted design)
    returns, and the local stage is announced before its call: each patched stage reads what stderr
    held when it was entered (a slow compilation would sit between the two)."""
    from jaxroll.designs import optimise

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    seen = {}

    def entered(name, function):
        def wrapper(*args, **kwargs):
            seen.setdefault(name, stream.getvalue())
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(optimise, "_reference", entered("reference", optimise._reference))
    monkeypatch.setattr(optimise, "_run_starts", entered("local", optimise._run_starts))
    jaxroll.design(small_model(), "tau=global", goal="middle_mass", kl_budget=BUDGET, search=0, progress=True)
    assert seen["reference"].startswith("jaxroll design: n = 32, 1 free scalar, ")
    assert "compiling the original kernels" in seen["reference"]
    assert seen["local"].splitlines()[-1].startswith("jaxroll design: outer iteration 1 (at most 30): ")
    err = stream.getvalue()
    restarts = int(re.search(r"outer iteration 1 \(at most 30\): (\d+) restarts", err).group(1))
    # The compiled loop counted every restart of the first iteration (host callbacks), the first apart.
    assert f"restart 1 of {restarts} ended" in err
    assert f"jaxroll design, outer iteration 1: {restarts}/{restarts} restarts (100%)" in err
    assert err.splitlines()[-1].startswith("jaxroll design: done: ") and "\r" not in err


def test_the_eta_counts_the_restarts_after_the_compiled_first_one():
    """A fake clock: the first restart takes 100 s (compilation), each later one 1 s. The ETA of every
    line is then (restarts left) x 1 s, not the first restart's 100 s (the issue's "1 h 04 min")."""
    from jaxroll.designs.progress import DesignProgress

    now = [0.0]
    stream = io.StringIO()
    report = DesignProgress(True, stream=stream, clock=lambda: now[0])
    report.begin_outer(1, 8, 30, compiling=True)
    for seconds in [100.0] + [1.0] * 7:
        now[0] += seconds
        report.restart_ended()
    report.end_outer(8, 0)
    lines = [line for line in stream.getvalue().splitlines() if "ETA" in line]
    assert lines and "compilation included" in stream.getvalue()
    for line in lines:
        done = int(re.search(r"(\d+)/8 restarts", line).group(1))
        assert line.split("ETA ")[1].startswith(f"{8 - done} s")


def test_the_kl_budget_holds_at_the_optimum(budgeted):
    values = budgeted.values
    original = numpy_kernels(N)
    changed = numpy_kernels(N, tau=values["tau"], kappa=values["kappa"])
    kl = numpy_kl(changed, original)
    assert np.max(kl) <= BUDGET * (1 + 1e-9)
    assert np.max(kl) >= BUDGET * (1 - 1e-3)  # the budget binds: more KL would buy more middle
    np.testing.assert_allclose(budgeted.kl, kl, rtol=1e-9, atol=1e-15)
    after = numpy_profile(changed, branch_scaled(LAMBDAS, values["gamma"]))
    before = numpy_profile(original, LAMBDAS)
    assert abs(budgeted.middle_mass[0] - numpy_middle_mass(before)) < 1e-12
    assert abs(budgeted.middle_mass[1] - numpy_middle_mass(after)) < 1e-12
    assert budgeted.middle_mass[1] > budgeted.middle_mass[0] + 0.05
    assert budgeted.final_value <= budgeted.initial_value and budgeted.converged, budgeted.stop_reason


def test_a_parameter_at_its_bound_is_reported(budgeted):
    assert list(budgeted.at_bounds) == ["gamma"]
    assert budgeted.values["gamma"] == pytest.approx(2.0, abs=2e-3 * 1.5)
    assert any("at a bound" in warning and "gamma" in warning for warning in budgeted.warnings)
    assert any("upper bound 2" in line for line in budgeted.summary())


def test_the_design_is_no_worse_than_nearby_feasible_points(budgeted):
    """A local optimum: moving tau or kappa a little, within the budget, does not raise the middle mass."""
    values = budgeted.values
    best = budgeted.middle_mass[1]
    for tau, kappa in ((1.001, 1.0), (0.999, 1.0), (1.0, 1.001), (1.0, 0.999)):
        trial_tau, trial_kappa = values["tau"] * tau, values["kappa"] * kappa
        changed = numpy_kernels(N, tau=trial_tau, kappa=trial_kappa)
        if np.max(numpy_kl(changed, numpy_kernels(N))) > BUDGET:
            continue
        assert numpy_middle_mass(numpy_profile(changed, branch_scaled(LAMBDAS, values["gamma"]))) <= best + 1e-9


def test_bounds_of_a_box_are_found_from_values():
    parameters = design_parameters._Parameters(
        (design_parameters._Free("tau", "per_layer", 0.25, 4.0), design_parameters._Free("gamma", "global", 0.0, 4.0)),
        T, H)
    found = parameters.at_bounds({"tau": np.array([[0.2501], [1.0], [3.9999]]), "gamma": np.array(2.0)})
    assert list(found) == ["tau[0]", "tau[2]"] and "lower bound 0.25" in found["tau[0]"]


@pytest.mark.parametrize("arguments, message", [
    (dict(free="foo=global", target="flat"), "free foo: unknown parameter"),
    (dict(free="tau=sideways", target="flat"), "shape 'sideways'"),
    (dict(free="gamma=per_head", target="flat"), "free gamma: shape 'per_head'"),
    (dict(free="tau=global", goal="middle_mass", kl_budget=-0.1), "kl_budget: got -0.1"),
    (dict(free="tau=global", goal="middle_mass", kl_budget=0.0), "kl_budget: got 0.0"),
    (dict(free="tau=global", goal="middle_mass"), "kl_budget: missing"),
    (dict(free="tau=global", target="flat", kl_budget=0.1), "kl_budget: applies to a goal"),
    (dict(free="tau=global", target="flat", goal="middle_mass", kl_budget=0.1), "both a target and a goal"),
    (dict(free="tau=global"), "no objective"),
    (dict(free="tau=global", target="flat", bounds="tau=2:1"), "bounds tau: got 2:1"),
    (dict(free="tau=global", target="flat", bounds="tau=0:1"), "bounds tau: low 0"),
    (dict(free="tau=global", target="flat", bounds="gamma=0:1"), "bounds gamma: not a free parameter"),
    (dict(free="tau=global", target=np.full(N - 1, 1.0 / (N - 1))), "target: length 31"),
    (dict(free="tau=global", target=np.full(N, 2.0 / N)), "target: sums to 2"),
    (dict(free="tau=global", goal="sideways", kl_budget=0.1), "goal: got 'sideways'"),
])
def test_bad_arguments_are_refused_in_one_line(arguments, message):
    free = arguments.pop("free")
    with pytest.raises(jaxroll.ConfigError, match=message) as caught:
        jaxroll.design(small_model(), free, **arguments)
    assert "\n" not in str(caught.value)


def test_an_intervention_the_kernel_cannot_take_is_refused():
    full = dataclasses.replace(small_model(), kernel=dataclasses.replace(small_model().kernel, mask="full"))
    with pytest.raises(jaxroll.ConfigError, match="kappa: a distance bias on a 'full' mask"):
        jaxroll.design(full, "kappa=global", target="flat")


def test_the_command_line_names_equal_the_package_names():
    from jaxroll import designs
    from jaxroll.cli import design as command

    assert command.PARAMETERS == designs.PARAMETERS and command.SHAPES == designs.SHAPES
    assert command.GOALS == designs.GOALS


# --- the command line ----------------------------------------------------------------------------------

def _write_target(path, profile):
    jaxroll.write_profile(profile, path)
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("design") / "small.yaml"
    jaxroll.save_config(small_model(), path)
    return path


def test_design_command_writes_its_outputs_and_rollout_reads_the_design(config, tmp_path, capsys, recovered):
    target = _write_target(tmp_path / "target.csv", synthetic_target())
    out = tmp_path / "out"
    argv = [str(config), "--free", "tau=per_layer,gamma=global", "--target", str(target), "--loss", "kl",
            "--float64", "--out", str(out)]
    assert cli.main(["design", *argv]) == 0
    printed = capsys.readouterr().out
    assert "jaxroll design" in printed and "converged" in printed and "middle_mass: before" in printed
    assert sorted(p.name for p in out.iterdir()) == ["design.json", "design.png", "interventions.yaml",
                                                     "profiles.csv"]
    table = np.genfromtxt(out / "profiles.csv", delimiter=",", names=True)
    assert table.dtype.names == ("token_position", "before", "after", "target")
    np.testing.assert_allclose(table["after"], recovered.after, atol=1e-14)
    # jaxroll rollout --intervene DIR/interventions.yaml (the name and format rollout writes) predicts the
    # designed profile.
    assert cli.main(["rollout", str(config), "--intervene", str(out / "interventions.yaml"), "--no-figure",
                     "--float64", "--out", str(tmp_path / "rollout")]) == 0
    np.testing.assert_allclose(jaxroll.read_profile(tmp_path / "rollout" / "profile.csv"), table["after"],
                               atol=1e-13)
    assert (tmp_path / "rollout" / "interventions.yaml").read_text() == (out / "interventions.yaml").read_text()
    # design.json holds the summary's numbers: the middle mass the table prints, from the profiles written.
    saved = json.loads((out / "design.json").read_text())
    mass = re.search(r"middle_mass: before (\S+), after (\S+) ", printed)
    assert [float(x) for x in mass.groups()] == [float(f"{x:.6g}") for x in saved["middle_mass"]]
    assert saved["middle_mass"][1] == pytest.approx(numpy_middle_mass(table["after"]), abs=1e-12)
    assert saved["interventions"] == yaml.safe_load((out / "interventions.yaml").read_text())
    # Never overwritten without --force: exit 2, one line, the files as they were.
    before = (out / "interventions.yaml").read_bytes()
    capsys.readouterr()
    assert cli.main(["design", *argv]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--force" in error
    assert (out / "interventions.yaml").read_bytes() == before
    # --json: one object on stdout, the numbers design.json holds.
    assert cli.main(["design", *argv, "--force", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["middle_mass"] == saved["middle_mass"] and printed["kl"] == saved["kl"]
    assert printed["interventions"] == saved["interventions"]


@pytest.mark.parametrize("extra, message", [
    (["--free", "foo=global", "--target", "flat"], "error: --free foo: unknown parameter"),
    (["--free", "tau=global", "--goal", "middle_mass", "--kl-budget", "-1"], "error: --kl-budget: got -1"),
    (["--free", "tau=global", "--target", "BAD"], "header"),
    (["--free", "tau=global", "--kl-budget", "0.1", "--target", "flat"], "--kl-budget: applies to --goal"),
])
def test_design_command_refuses_bad_input_in_one_line_and_writes_nothing(config, tmp_path, capsys, extra, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("position,value\n0,1\n")
    extra = [str(bad) if item == "BAD" else item for item in extra]
    out = tmp_path / "out"
    assert cli.main(["design", str(config), *extra, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("jaxroll: error: ") and message in error
    assert not out.exists()


# --- item 2: intervention axes of a sweep --------------------------------------------------------------

def test_a_tau_gamma_grid_matches_the_oracle_and_the_statistics():
    taus, gammas = [0.5, 1.0, 2.0], [0.25, 1.0, 3.0]
    result = jaxroll.sweep(small_model(), tau=taus, gamma=gammas, progress=False)
    assert result.method == "vmap" and result.profiles.shape == (3, 3, N)
    row = 0
    for a, tau in enumerate(taus):
        for b, gamma in enumerate(gammas):
            expected = numpy_profile(numpy_kernels(N, tau=tau), branch_scaled(LAMBDAS, gamma))
            assert np.max(np.abs(result.profiles[a, b] - expected)) < 1e-12
            assert result.table["tau"][row] == tau and result.table["gamma"][row] == gamma
            assert abs(result.table["middle_mass"][row] - numpy_middle_mass(expected)) < 1e-12
            assert abs(result.table["u_index"][row] - numpy_u_index(expected)) < 1e-10
            assert result.table["argmin"][row] == int(np.argmin(expected))
            assert abs(result.table["total_mixing"][row] - branch_scaled(LAMBDAS, gamma).sum()) < 1e-12
            row += 1


def test_a_kappa_slope_scale_grid_matches_separate_calls_and_the_oracle():
    kappas, scales = [-0.5, 0.0, 0.8], [0.5, 2.0]
    result = jaxroll.sweep(small_model(), kappa=kappas, slope_scale=scales, progress=False)
    for a, kappa in enumerate(kappas):
        for b, scale in enumerate(scales):
            separate = jaxroll.influence(iv.apply_all(small_model(), iv.from_mapping(
                {"kappa": kappa, "slope_scale": scale})))
            expected = numpy_profile(numpy_kernels(N, kappa=kappa, scale=scale), LAMBDAS)
            assert np.max(np.abs(result.profiles[a, b] - np.asarray(separate))) < 1e-13
            assert np.max(np.abs(result.profiles[a, b] - expected)) < 1e-12
    middle = np.array([numpy_middle_mass(p) for p in result.profiles.reshape(-1, N)])
    assert np.max(np.abs(result.table["middle_mass"] - middle)) < 1e-12


def test_per_layer_tau_values_on_an_axis():
    values = [[[0.5], [1.0], [2.0]], [[2.0], [1.0], [0.5]]]
    result = jaxroll.sweep(small_model(), tau=values, progress=False)
    for k, value in enumerate(values):
        expected = numpy_profile(numpy_kernels(N, tau=np.asarray(value)), LAMBDAS)
        assert np.max(np.abs(result.profiles[k] - expected)) < 1e-12


def test_a_gamma_axis_keeps_the_krylov_path_of_a_shared_kernel():
    model = jaxroll.presets.get("mpt-7b", 48)
    gammas = [0.5, 1.0, 2.0]
    result = jaxroll.sweep(model, gamma=gammas, lambda_0=[0.3, 0.6], beta=[0.5], progress=False)
    assert result.method == "krylov"
    for a, gamma in enumerate(gammas):
        for b, lambda_0 in enumerate([0.3, 0.6]):
            point = dataclasses.replace(model, lambdas=jaxroll.schedules.power_decay(lambda_0, 0.5, 32))
            separate = np.asarray(jaxroll.influence(iv.BranchScale(gamma).apply(point)))
            assert np.max(np.abs(result.profiles[a, b, 0] - separate)) < 1e-12


@pytest.mark.parametrize("axes, message", [
    (dict(tau=[1.0, -1.0]), r"tau\[1\]: value -1.0 is outside the allowed range"),
    (dict(gamma=[[1.0, 2.0]]), r"gamma\[0\]"),
    (dict(tau=["a"]), r"tau\[0\]"),
])
def test_bad_intervention_axis_values_are_refused(axes, message):
    with pytest.raises(jaxroll.ConfigError, match=message):
        jaxroll.sweep(small_model(), progress=False, **axes)


def test_sweep_command_takes_intervention_axes(config, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": {"config": str(config)}, "axes": {"tau": [0.5, 1.0], "gamma": [0.5, 2.0]}},
                                   sort_keys=False))
    out = tmp_path / "out"
    assert cli.main(["sweep", str(spec), "--out", str(out), "--float64"]) == 0
    table = np.genfromtxt(out / "sweep.csv", delimiter=",", names=True)
    assert list(table["tau"]) == [0.5, 0.5, 1.0, 1.0] and list(table["gamma"]) == [0.5, 2.0, 0.5, 2.0]
    expected = [numpy_middle_mass(numpy_profile(numpy_kernels(N, tau=t), branch_scaled(LAMBDAS, g)))
                for t in (0.5, 1.0) for g in (0.5, 2.0)]
    np.testing.assert_allclose(table["middle_mass"], expected, atol=1e-12)
    assert (out / "heatmap_middle_mass.png").is_file() and (out / "heatmap_u_index.png").is_file()
