"""The one dialect of the command line: ``--json`` prints one JSON object holding the numbers of the
table (checked against the table's text and against the files written, by NumPy), the old spellings
are refused in one line naming the new one, and ``--intervene`` is given once."""

import json
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


def table_and_json(capsys, *arguments, writes=True):
    """The command's table (stdout) and its --json object, from two runs (into the same --out)."""
    assert main([str(a) for a in arguments]) == 0
    table = capsys.readouterr().out
    assert main([str(a) for a in arguments] + ["--force"] * writes + ["--json"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1  # one object, one line
    return table, json.loads(printed)


def numbers(pattern: str, text: str) -> list[float]:
    match = re.search(pattern, text)
    assert match is not None, (pattern, text)
    return [float(group) for group in match.groups()]


def shown(value: float, digits: int = 6) -> float:
    """`value` as the table prints it (``:.6g``)."""
    return float(f"{value:.{digits}g}")


@pytest.fixture
def config(tmp_path):
    model = jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.3, diagonal_scores=0.5,
                                        sequence_length=N)
    return jaxroll.save_config(model, tmp_path / "small.yaml")


def test_rollout_json_holds_the_tables_numbers_and_the_profiles(config, tmp_path, capsys):
    out = tmp_path / "r"
    table, result = table_and_json(capsys, "rollout", config, "--float64", "--no-figure", "--out", out,
                                   "--intervene", "tau=0.7,gamma=0.5")
    profile = np.loadtxt(out / "profile.csv", delimiter=",", skiprows=1)[:, 1]
    k = max(1, round(0.1 * N))
    assert result["N"] == N and result["T"] == 6 and result["H"] == 4 and result["edge"] == k
    assert result["interventions"] == {"tau": 0.7, "gamma": 0.5}
    assert result["first_mass"] == pytest.approx(profile[:k].sum(), abs=1e-15)
    assert result["middle_mass"] == pytest.approx(profile[k:N - k].sum(), abs=1e-15)
    assert result["last_mass"] == pytest.approx(profile[-k:].sum(), abs=1e-15)
    assert result["argmin"] == int(np.argmin(profile)) and result["p_first"] == profile[0]
    assert numbers(r"first_mass / middle_mass / last_mass = (\S+) / (\S+) / (\S+) ", table) == [
        shown(result[name]) for name in ("first_mass", "middle_mass", "last_mass")]
    assert numbers(r"p\[0\] = (\S+), p\[-1\] = (\S+), argmin = (\d+)", table) == [
        shown(result["p_first"]), shown(result["p_last"]), result["argmin"]]
    assert numbers(r"sum of lambdas = (\S+), mass before normalising = (\S+)", table) == [
        shown(result["lambda_sum"]), shown(result["mass"], 9)]
    # the branch scale: lambda' = gamma lambda / (1 - lambda + gamma lambda) in each of the 6 layers
    assert result["lambda_sum"] == pytest.approx(6 * 0.15 / (0.7 + 0.15), abs=1e-12)


def test_rollout_json_of_several_configs_is_one_object(config, tmp_path, capsys):
    other = jaxroll.save_config(jaxroll.RolloutModel.create(num_layers=2, num_heads=1, lambdas=0.5,
                                                            sequence_length=8), tmp_path / "other.yaml")
    assert main(["rollout", str(config), str(other), "--no-figure", "--json", "--out", str(tmp_path / "r")]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [run["N"] for run in runs] == [N, 8]


def test_forces_json_holds_the_tables_numbers(tmp_path, capsys):
    table, result = table_and_json(capsys, "forces", "--preset", "mpt-7b", "--length", "32", "--float64",
                                   "--out", tmp_path / "f")
    data = np.loadtxt(tmp_path / "f" / "forces.csv", delimiter=",", skiprows=1)
    rows = result["forces"]
    assert [row["name"] for row in rows] == (tmp_path / "f" / "forces.csv").read_text().split("\n")[0].split(",")[1:]
    for column, row in zip(data.T[1:], rows):
        assert row["center_of_mass"] == pytest.approx(np.arange(32) @ column / 31, abs=1e-12)
        printed = numbers(rf"\+{row['name']}\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", table)
        assert printed == [float(f"{row[key]:.4f}") for key in (
            "center_of_mass", "first_mass", "last_mass", "drift_center_of_mass", "drift_first", "drift_last")]


def test_kinetic_json_holds_the_tables_numbers(tmp_path, capsys):
    table, result = table_and_json(capsys, "kinetic", "--beta", "1", "--lambda", "1", "--depth", "2",
                                   "--length", "48", "--layers", "16", "--float64", "--out", tmp_path / "k")
    assert (result["beta"], result["lambda"], result["depth"], result["mode_width"]) == (1.0, 1.0, 2.0, 8.0)
    assert numbers(r"t_crit = (\S+), t / t_crit = (\S+):", table) == [
        shown(result["t_crit"], 9), shown(result["depth_over_t_crit"])]
    assert result["depth_over_t_crit"] == pytest.approx(2.0 / result["t_crit"], rel=1e-15)
    assert result["c"] == pytest.approx(result["a_eff"] * 2.0, rel=1e-15)
    rollout = np.loadtxt(tmp_path / "k" / "profile.csv", delimiter=",", skiprows=1)[:, 1]
    assert result["query_mass"] == rollout[-1]
    assert numbers(r"W1/\(N-1\) = (\S+), argmin rollout = (\d+), kinetic = (\d+)", table) == [
        shown(result["wasserstein_off_query"]), result["argmin_rollout"], result["argmin_kinetic"]]


def test_fit_json_holds_the_tables_numbers(config, tmp_path, capsys):
    other = jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.7, diagonal_scores=0.5,
                                        sequence_length=N)
    target = oracle.influence(oracle.config_arrays(oracle.read_config(
        jaxroll.save_config(other, tmp_path / "other.yaml"))), N)
    profile = jaxroll.write_profile(target, tmp_path / "target.csv")
    table, result = table_and_json(capsys, "fit", config, profile, "--schedule", "constant", "--steps", "30",
                                   "--search", "0", "--restarts", "1", "--float64", "--out", tmp_path / "fit")
    fitted = np.loadtxt(tmp_path / "fit" / "fit.csv", delimiter=",", skiprows=1)
    w1 = lambda p, q: float(np.abs(np.cumsum(p - q)[:-1]).sum() / (len(p) - 1))  # noqa: E731
    assert result["wasserstein_before"] == pytest.approx(w1(fitted[:, 2], fitted[:, 1]), abs=1e-12)
    assert result["wasserstein_after"] == pytest.approx(w1(fitted[:, 3], fitted[:, 1]), abs=1e-12)
    assert numbers(r"Wasserstein W1/\(N-1\): before (\S+), after (\S+)", table) == [
        shown(result["wasserstein_before"]), shown(result["wasserstein_after"])]
    assert numbers(r"loss: before (\S+), after (\S+); Spearman after (\S+)", table) == [
        shown(result[key]) for key in ("loss_before", "loss_after", "spearman_after")]
    assert result["schedule"] == "constant" and len(result["schedule_parameters"]) == 1


def test_fit_kernel_json_numbers_layers_from_0(tmp_path, capsys):
    table, result = table_and_json(capsys, "fit-kernel", "--published", "mpt-7b", "--length", "12", "--steps",
                                   "20", "--float64", "--out", tmp_path / "fk")
    csv = np.loadtxt(tmp_path / "fk" / "kernel_fit.csv", delimiter=",", skiprows=1)
    assert [layer["layer"] for layer in result["layers"]] == list(range(result["T"])) == list(csv[:, 0])
    assert result["kl_after"] == pytest.approx(csv[:, 1].mean(), rel=1e-15)
    assert "layer 0: slopes" in table and "layer 4:" not in table
    assert numbers(r"after (\S+); max abs kernel error (\S+)", table) == [
        shown(result["kl_after"]), shown(result["max_abs_error"], 3)]


def test_presets_json(capsys):
    table, result = table_and_json(capsys, "presets", writes=False)
    from jaxroll.presets import GEOMETRIES

    assert [row["name"] for row in result["presets"]] == list(GEOMETRIES)
    for row in result["presets"]:
        assert f"{row['lambda_0']:8.4f} {row['beta']:6.4f}" in table


@pytest.mark.parametrize("command, old, new", [
    (["kinetic", "--lam", "1"], "--lam", "--lambda"), (["kinetic", "--t", "1"], "--t", "--depth"),
    (["kinetic", "--M", "8"], "--M", "--mode-width"),
    (["fit", "P.csv", "--published-content", "mean"], "--published-content", "--content"),
    (["fit", "P.csv", "--content", "per_head"], "--content per_head", "--content-shape per_head"),
])
def test_an_old_spelling_is_refused_in_one_line_naming_the_new(command, old, new, tmp_path, capsys):
    out = tmp_path / "never"
    assert main([*command, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"jaxroll: error: {old}: ") and new in error
    assert not out.exists()


def test_intervene_given_twice_is_refused_not_replaced(config, tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["rollout", str(config), "--intervene", "tau=0.7", "--intervene", "gamma=0.5",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("jaxroll: error: --intervene: given twice; allowed: once (join the values: "
                                       "NAME=VALUE,NAME=VALUE, or one YAML file)\n")
    assert not out.exists()


@pytest.mark.parametrize("command", ["measure", "task"])
def test_intervene_given_twice_is_refused_on_the_torch_commands_before_any_work(command, tmp_path, capsys):
    # Refused while the arguments are read: no model folder, texts or torch are looked at.
    out = tmp_path / "never"
    assert main([command, str(tmp_path / "model"), "--intervene", "tau=0.7", "--intervene", "gamma=0.5",
                 "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("jaxroll: error: --intervene: given twice; allowed: once")
    assert not out.exists()


@pytest.mark.parametrize("change, message", [
    ("kappa=1,kappa_form=cubic", "--intervene kappa_form: got 'cubic'"),
    ("kappa=1,kappa_k=-1", "--intervene kappa_k: "),
])
def test_intervene_errors_name_what_was_typed(config, tmp_path, change, message, capsys):
    assert main(["rollout", str(config), "--intervene", change, "--out", str(tmp_path / "never")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"jaxroll: error: {message}"), error
