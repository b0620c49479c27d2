"""jaxroll.sweep and ``jaxroll sweep``, against the NumPy float64 oracle.

Tolerances: float64 throughout (conftest). Every profile is compared with
`tests/oracle.py` (dense kernels, row products in NumPy) at 1e-12 absolute:
profiles are probabilities of at most 1 after at most 6 layers, and the
structured products agree with the dense oracle to ~1e-15 (README,
Accuracy). Sharded and unsharded sweeps run the same float64 program on
different devices: 1e-12 as well.
"""

import dataclasses
import importlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxroll
from jaxroll import cli

import oracle
from sweep_models import content_model, uniform_model

sweep_module = importlib.import_module("jaxroll.sweeps")
evaluate_module = importlib.import_module("jaxroll.sweeps.evaluate")
plan_module = importlib.import_module("jaxroll.sweeps.plan")
ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("sweep_worker.py")
TOLERANCE = 1e-12


def arrays(model):
    """A RolloutModel as the oracle's plain arrays."""
    return {"lambdas": np.asarray(model.lambdas, np.float64),
            "slopes": np.asarray(model.alibi_slopes, np.float64),
            "diagonal": np.asarray(model.diagonal_scores, np.float64),
            "base": np.asarray(model.base_scores, np.float64),
            "weights": np.asarray(model.head_weights, np.float64),
            "temperature": float(model.temperature), "mask": model.mask, "window": model.window}


def expected(model, n, **fields):
    point = dataclasses.replace(model, **{k: np.asarray(v, np.float64) for k, v in fields.items()})
    row = oracle.influence(arrays(point), n)
    return row / row.sum()


def power_decay(lambda_0, beta, layers):
    """The oracle's schedule; no clipping (a sweep refuses lambda_0 > 1)."""
    return lambda_0 / (np.arange(layers) + 1.0) ** beta


def test_vmap_path_matches_oracle_on_a_grid():
    model = content_model()
    temperatures, scales = [0.5, 1.0, 3.0], [0.0, 1.0, 2.5]
    diagonals = [[0.0], [[3.0, -2.0]]]
    result = jaxroll.sweep(model, temperature=temperatures, slope_scale=scales, diagonal_scores=diagonals,
                           progress=False)
    assert result.method == "vmap" and result.profiles.shape == (3, 3, 2, 24)
    for i, tau in enumerate(temperatures):
        for j, scale in enumerate(scales):
            for k, diagonal in enumerate(diagonals):
                want = expected(model, 24, temperature=tau,
                                alibi_slopes=np.asarray(model.alibi_slopes) * scale,
                                diagonal_scores=np.broadcast_to(np.asarray(diagonal, float), (3, 2)))
                np.testing.assert_allclose(result.profiles[i, j, k], want, rtol=0, atol=TOLERANCE)


def test_krylov_path_matches_oracle_for_every_kind_of_schedule():
    model = uniform_model()
    custom = [0.9, 0.0, 0.3, 1.0, 0.2, 0.6]
    schedules = [(0.5, 1.0), {"lambda_0": 0.9, "beta": 0.5}, 0.25, custom, np.ones(6)]
    result = jaxroll.sweep(model, lambdas=schedules, progress=False)
    assert result.method == "krylov" and result.profiles.shape == (5, 24)
    wanted = [power_decay(0.5, 1.0, 6), power_decay(0.9, 0.5, 6), np.full(6, 0.25), custom, np.ones(6)]
    for profile, lambdas in zip(result.profiles, wanted):
        np.testing.assert_allclose(profile, expected(model, 24, lambdas=lambdas), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(result.table["total_mixing"], [np.sum(x) for x in wanted], rtol=1e-15)


def test_schedules_given_only_as_mappings_match_the_oracle():
    """Every value a ``{lambda_0, beta}`` mapping (issue 32: all dicts crashed the table)."""
    model = uniform_model()
    pairs = [(0.5, 0.5), (0.9, 1.5), (1.0, 0.0)]
    result = jaxroll.sweep(model, lambdas=[{"lambda_0": a, "beta": b} for a, b in pairs], progress=False)
    assert result.profiles.shape == (3, 24)
    for profile, (lambda_0, beta) in zip(result.profiles, pairs):
        np.testing.assert_allclose(profile, expected(model, 24, lambdas=power_decay(lambda_0, beta, 6)),
                                   rtol=0, atol=TOLERANCE)
    np.testing.assert_array_equal(result.table["lambda_0"], [a for a, _ in pairs])
    np.testing.assert_array_equal(result.table["beta"], [b for _, b in pairs])


def test_mapping_schedules_in_a_spec_run_from_the_cli(tmp_path, capsys):
    text = ("base: {preset: mpt-7b, sequence_length: 16}\n"
            "axes: {lambdas: [{lambda_0: 0.5, beta: 0.5}, {lambda_0: 0.8, beta: 1.0}]}\n")
    status, output = run(["sweep", spec_file(tmp_path, text), "--out", tmp_path / "out"], capsys)
    assert status == 0, output.err
    rows = np.genfromtxt(tmp_path / "out" / "sweep.csv", delimiter=",", names=True)
    np.testing.assert_array_equal(rows["lambda_0"], [0.5, 0.8])
    model = dataclasses.replace(jaxroll.presets.get("mpt-7b"), sequence_length=16)
    want = expected(model, 16, lambdas=power_decay(0.8, 1.0, model.num_layers))
    np.testing.assert_allclose(np.load(tmp_path / "out" / "profiles.npz")["profiles"][1], want, rtol=0, atol=1e-12)
    status, output = run(["sweep", spec_file(tmp_path, text), "--out", tmp_path / "out", "--force", "--json"], capsys)
    assert status == 0, output.err
    record = json.loads(output.out)  # one object: the table's numbers, not its rounding
    assert record["profiles"] == 2 and record["grid"] == [2]
    assert record["ranges"]["last"]["max"] == pytest.approx(max(float(rows["last"].max()), want[-1]), rel=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"lambdas": [0.5, 1.5]}, r"^lambdas\[1\]: value 1\.5 is outside the allowed range \[0, 1\]$"),
    ({"lambdas": [-0.2]}, r"^lambdas\[0\]: value -0\.2 is outside the allowed range \[0, 1\]$"),
    ({"lambda_0": [0.5, 1.5], "beta": [1.0]}, r"^lambda_0\[1\]: value 1\.5 is outside the allowed range \(0, 1\]$"),
    ({"lambdas": [{"lambda_0": 1.5, "beta": 0.5}]}, r"^lambdas\[0\]: lambda_0: value 1\.5 is outside the allowed range \(0, 1\]$"),
    ({"lambdas": [(0.5, 0.5), (0.0, 1.0)]}, r"^lambdas\[1\]: lambda_0: value 0\.0 is outside the allowed range \(0, 1\]$"),
])
def test_values_outside_the_range_are_refused_not_clipped(kwargs, message):
    """``RolloutModel.create(lambdas=1.5)`` refuses 1.5; so does a sweep, naming the axis and the index."""
    for model in (content_model(), uniform_model()):
        with pytest.raises(jaxroll.ConfigError, match=message):
            jaxroll.sweep(model, progress=False, **kwargs)


def test_power_decay_grid_with_lengths_matches_oracle_and_is_zero_beyond_each_length():
    model = uniform_model()
    lengths = [5, 13, 24]
    result = jaxroll.sweep(model, lambda_0=[0.3, 0.8], beta=[0.5, 2.0, 1.0], lengths=lengths, progress=False)
    assert result.profiles.shape == (2, 3, 3, 24) and result.lengths == tuple(lengths)
    for i, lambda_0 in enumerate([0.3, 0.8]):
        for j, beta in enumerate([0.5, 2.0, 1.0]):
            for k, n in enumerate(lengths):
                want = expected(model, n, lambdas=power_decay(lambda_0, beta, 6))
                np.testing.assert_allclose(result.profiles[i, j, k, :n], want, rtol=0, atol=TOLERANCE)
                assert np.all(result.profiles[i, j, k, n:] == 0)
    rows = result.table
    assert list(rows["length"][:3]) == lengths and rows["lambda_0"][0] == 0.3 and rows["beta"][3] == 2.0
    # total_mixing is lambda_0 sum_t (t + 1)^-beta per beta value, not a sum of formed schedules: the oracle sums them.
    mixing = [power_decay(a, b, 6).sum() for a in (0.3, 0.8) for b in (0.5, 2.0, 1.0) for _ in lengths]
    np.testing.assert_allclose(rows["total_mixing"], mixing, rtol=1e-14, atol=0)


@pytest.mark.parametrize("build, mask, window", [
    (content_model, "causal", None), (uniform_model, "sliding", 4),
    (content_model, "full", None), (uniform_model, "full", None)])
def test_lengths_under_every_mask(build, mask, window):
    """Causal and sliding: start rows at N_max; full: one call per length. Both equal the oracle."""
    model = build(mask, window)
    lengths = [24, 10, 3, 10] if mask != "full" else [24, 10, 10]
    result = jaxroll.sweep(model, temperature=[0.7, 1.3], lengths=lengths, progress=False)
    for j, tau in enumerate([0.7, 1.3]):
        for k, n in enumerate(lengths):
            np.testing.assert_allclose(result.profiles[j, k, :n], expected(model, n, temperature=tau),
                                       rtol=0, atol=TOLERANCE)
            assert np.all(result.profiles[j, k, n:] == 0)


@pytest.mark.parametrize("mask, window", [("sliding", 5), ("full", None)])
def test_krylov_lengths_under_sliding_and_full_masks(mask, window):
    model = uniform_model(mask, window)
    lengths = [24, 10, 3]
    result = jaxroll.sweep(model, lambdas=[0.3, (0.5, 1.0)], lengths=lengths, progress=False)
    assert result.method == "krylov"
    for j, lambdas in enumerate([np.full(6, 0.3), power_decay(0.5, 1.0, 6)]):
        for k, n in enumerate(lengths):
            np.testing.assert_allclose(result.profiles[j, k, :n], expected(model, n, lambdas=lambdas),
                                       rtol=0, atol=TOLERANCE)
            assert np.all(result.profiles[j, k, n:] == 0)


def test_table_statistics_equal_numpy_formulas():
    model = content_model()
    result = jaxroll.sweep(model, temperature=[0.5, 2.0], slope_scale=[0.0, 1.0, 4.0], lengths=[12, 24],
                           progress=False)
    profiles = result.profiles.reshape(-1, 2, 24)
    table = result.table
    assert len(table["length"]) == 12
    for row in range(12):
        point, position = divmod(row, 2)
        n = (12, 24)[position]
        p = profiles[point, position, :n]
        k = max(1, round(0.1 * n))
        assert table["length"][row] == n
        assert table["temperature"][row] == [0.5, 2.0][point // 3]
        assert table["slope_scale"][row] == [0.0, 1.0, 4.0][point % 3]
        assert table["slope_scale_index"][row] == point % 3
        assert table["argmin"][row] == int(np.argmin(p))
        np.testing.assert_allclose(
            [table[c][row] for c in ("first", "last", "center_of_mass", "first_mass", "middle_mass",
                                     "last_mass", "u_index")],
            [p[0], p[-1], np.dot(np.arange(n), p) / (n - 1), p[:k].sum(), p[k:n - k].sum(), p[-k:].sum(),
             min(p[:k].mean(), p[-k:].mean()) / p[k:n - k].mean() - 1], rtol=1e-13, atol=1e-15)


def test_zip_takes_axes_side_by_side():
    model = content_model()
    result = jaxroll.sweep(model, zip=True, temperature=[0.5, 1.0, 2.0],
                           head_weights=[[1.0, 1.0], [1.0, 0.0], [[0.2, 0.8]]], progress=False)
    assert result.profiles.shape == (3, 24)
    weights = [[1.0, 1.0], [1.0, 0.0], [0.2, 0.8]]
    for k, tau in enumerate([0.5, 1.0, 2.0]):
        want = expected(model, 24, temperature=tau, head_weights=np.broadcast_to(weights[k], (3, 2)))
        np.testing.assert_allclose(result.profiles[k], want, rtol=0, atol=TOLERANCE)


def test_chunks_and_batch_size_do_not_change_the_profiles():
    model = content_model()
    whole = jaxroll.sweep(model, temperature=[0.5, 1.0, 2.0, 4.0, 8.0], progress=False)
    chunked = jaxroll.sweep(model, temperature=[0.5, 1.0, 2.0, 4.0, 8.0], batch_size=2, progress=False)
    assert chunked.batch_size == 2
    np.testing.assert_array_equal(whole.profiles, chunked.profiles)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": []}, r"^temperature: the axis is empty"),
    ({"slopes": [1.0]}, r"^axis 'slopes': not a field of a AlibiKernel model; allowed: lambdas, lambda_0, beta, alibi_slopes, "),
    ({"bogus": [1.0]}, r"^axis 'bogus': unknown field; allowed: one of lambdas, "),
    ({"temperature": [1.0, True]}, r"^temperature\[1\]: got True; allowed: a number \(not a boolean or a string\)$"),
    ({"slope_scale": ["2"]}, r"^slope_scale\[0\]: got '2'; allowed: a number"),
    ({"lambdas": [0.5, "0.5"]}, r"^lambdas\[1\]: got a quoted number \('0.5'"),
    ({"diagonal_scores": [[[True, 0.0]]]}, r"^diagonal_scores\[0\]: got a boolean \(True\)"),
    ({"temperature": [1.0, 0.0]}, r"^temperature\[1\]: value 0\.0 is outside the allowed range \(0, inf\)$"),
    ({"lambdas": [0.5, [0.1, 0.2, 1.5]]}, r"^lambdas\[1\]: value 1\.5 at index 2 is outside the allowed range \[0, 1\]"),
    ({"lambdas": [(0.5, -1.0)]}, r"^lambdas\[0\]: beta: value -1\.0"),
    ({"diagonal_scores": [0.0, [1.0, 2.0, 3.0]]}, r"^diagonal_scores\[1\]: inner list length 3; allowed: 1 or num_heads \(2\)"),
    ({"head_weights": [[0.0, 0.0]]}, r"^head_weights\[0\]: layer 0 has all-zero weights; allowed: >= 0 with a positive sum$"),
    ({"lambda_0": [0.5]}, r"^beta: the lambda_0 axis needs a beta axis"),
    ({"lambdas": [0.5], "beta": [1.0], "lambda_0": [1.0]}, r"^lambdas: give a lambdas axis or lambda_0 and beta"),
    ({"temperature": [1.0, 2.0], "slope_scale": [1.0], "zip": True}, r"^zip: axes have lengths temperature 2, slope_scale 1"),
    ({"temperature": [1.0], "mesh": 99}, r"^mesh: got 99; allowed: 1 to 1 devices"),
    ({"temperature": [1.0], "lengths": [4, 0]}, r"^lengths\[1\]: got 0; allowed: an integer >= 1"),
    ({"temperature": [1.0], "batch_size": 0}, r"^batch_size: got 0"),
    ({"temperature": [1.0], "lengths": [2**34]}, r"^sweep: 1 points x 1 lengths x N = 17179869184: needs about "),
])
def test_bad_input_is_one_line_naming_axis_and_index(kwargs, message):
    with pytest.raises(jaxroll.ConfigError, match=message) as error:
        jaxroll.sweep(content_model(), progress=False, **kwargs)
    assert "\n" not in str(error.value)


def test_no_recompilation_for_new_values():
    model, uniform = content_model(), uniform_model()
    jaxroll.sweep(model, temperature=[0.5, 1.0], slope_scale=[1.0, 2.0], lengths=[8, 24], progress=False)
    jaxroll.sweep(uniform, lambda_0=[0.5, 1.0], beta=[1.0, 2.0], lengths=[8, 24], progress=False)
    functions = [evaluate_module._vmapped_profiles, evaluate_module._combine, evaluate_module._krylov]
    before = [f._cache_size() for f in functions]
    jaxroll.sweep(model, temperature=[0.7, 3.0], slope_scale=[0.1, 5.0], lengths=[8, 24], progress=False)
    jaxroll.sweep(uniform, lambda_0=[0.2, 0.9], beta=[0.3, 1.7], lengths=[8, 24], progress=False)
    assert [f._cache_size() for f in functions] == before


def test_checkpoint_resumes_and_refuses_another_sweep(tmp_path, monkeypatch):
    model = content_model()
    axes = {"temperature": [0.5, 1.0, 2.0, 4.0, 8.0]}
    whole = jaxroll.sweep(model, **axes, batch_size=2, progress=False, checkpoint=tmp_path / "c")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "chunk_000000.npy", "chunk_000001.npy", "chunk_000002.npy", "fingerprint.txt"]
    calls = []
    monkeypatch.setattr(sweep_module._Evaluator, "host_chunk", lambda self, k: calls.append(k))
    again = jaxroll.sweep(model, **axes, batch_size=2, progress=False, checkpoint=tmp_path / "c")
    assert calls == [] and np.array_equal(again.profiles, whole.profiles)
    with pytest.raises(jaxroll.ConfigError, match="written by a different sweep"):
        jaxroll.sweep(model, temperature=[9.0], batch_size=2, progress=False, checkpoint=tmp_path / "c")


def _environment():
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), environment.get("PYTHONPATH", "")])
    environment.pop("XLA_FLAGS", None)
    return environment


def test_sharded_equals_unsharded_on_four_fake_devices(tmp_path):
    out = tmp_path / "devices.json"
    subprocess.run([sys.executable, str(WORKER), "devices", str(out)], env=_environment(), check=True,
                   timeout=300, cwd=tmp_path)
    results = json.loads(out.read_text())
    assert results["device_count"] == 4
    for name in ("vmap", "krylov"):
        result = results[name]
        assert result["method"] == name
        assert result["difference"] <= TOLERANCE
        assert result["mesh_devices"] == 4 and result["mesh_axes"] == ["batch"]
        assert result["spec_is_batch"] and result["equivalent"]
        assert all(count == 0 for count in result["recompiled"].values()), result["recompiled"]
    # Meshes built the standard ways: jax.make_mesh (Explicit axes), Auto axes, two axes, a plain
    # Mesh, and an ambient jax.set_mesh; each sweep equals the one-device sweep.
    meshes = results["meshes"]
    assert len(meshes) == 10
    for label, found in meshes.items():
        assert "error" not in found, (label, found)
        assert found["devices"] == 4 and found["difference"] <= TOLERANCE, (label, found)
        assert found["method"] == label.split("/")[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_gather_the_single_process_sweep(tmp_path):
    """jax.distributed on loopback: 2 processes x 2 CPU devices each; process 0 writes."""
    out, port = tmp_path / "multihost.npz", _free_port()
    workers = [subprocess.Popen([sys.executable, str(WORKER), "multihost", str(i), str(port), str(out)],
                                env=_environment(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for i in range(2)]
    try:
        logs = [worker.communicate(timeout=240)[0].decode(errors="replace") for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert all(worker.returncode == 0 for worker in workers), logs
    written = np.load(out)
    assert int(written["processes"]) == 2 and int(written["devices"]) == 4
    vmapped = jaxroll.sweep(content_model(), temperature=[0.5, 1.0, 2.0], slope_scale=[0.5, 2.0],
                            lengths=[7, 24], progress=False)
    krylov = jaxroll.sweep(uniform_model(), lambda_0=[0.2, 0.5, 0.9], beta=[0.5, 1.5], progress=False)
    np.testing.assert_allclose(written["vmap"], vmapped.profiles, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(written["krylov"], krylov.profiles, rtol=0, atol=TOLERANCE)


# ------------------------------------------------------------------ the command


def readme_spec() -> str:
    text = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    section = text[text.index("\n## `jaxroll sweep`"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def run(argv, capsys):
    status = cli.main([str(a) for a in argv])
    return status, capsys.readouterr()


def test_readme_spec_runs_as_written(tmp_path, capsys):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(readme_spec(), encoding="utf-8")
    status, output = run(["sweep", spec, "--out", tmp_path / "out"], capsys)
    assert status == 0, output.err
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"sweep.csv", "profiles.npz", "heatmap_u_index.png", "heatmap_center_of_mass.png"} <= names
    assert not any(name.endswith(".tmp") or name.startswith(".") for name in names)
    saved = np.load(tmp_path / "out" / "profiles.npz")
    rows = np.genfromtxt(tmp_path / "out" / "sweep.csv", delimiter=",", names=True)
    assert rows.size == saved["profiles"][..., 0].size
    np.testing.assert_allclose(rows["first"], saved["profiles"][..., 0].ravel(), rtol=1e-15)


def spec_file(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


GRID = "base: {preset: mpt-7b, sequence_length: 32}\naxes: {temperature: [0.5, 1.0, 2.0], slope_scale: [1.0, 2.0]}\n"


@pytest.mark.parametrize("text, message", [
    (GRID + "colour: red\n", "unknown key 'colour'"),
    ("base: {preset: mpt-7b, colour: 1}\naxes: {temperature: [1.0]}\n", "base: unknown key 'colour'"),
    ("base: {preset: mpt-7b}\naxes: {temperature: []}\n", "temperature: the axis is empty"),
    ("base: {preset: mpt-7b}\naxes: {temperature: [1.0, -2.0]}\n", r"temperature[1]: value -2.0"),
    ("base: {preset: mpt-7b}\naxes: {lambdas: [0.5, {lambda_0: 0.5}]}\n", "lambdas[1]: got keys ['lambda_0']"),
    (GRID + "mesh: 64\n", "mesh: got 64; allowed: 1 to 1 devices"),
    ("base: {preset: mpt-7b, config: x.yaml}\naxes: {temperature: [1.0]}\n", "base: got ['preset', 'config']"),
    ("axes: {temperature: [1.0]}\n", "base: missing"),
])
def test_bad_spec_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, text, message):
    out = tmp_path / "out"
    status, output = run(["sweep", spec_file(tmp_path, text), "--out", out], capsys)
    assert status == 2 and message in output.err and output.err.count("\n") == 1, output.err
    assert not out.exists()


def test_sweep_refuses_a_non_empty_out_without_force(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    status, output = run(["sweep", spec_file(tmp_path, GRID), "--out", out], capsys)
    assert status == 2 and "--force" in output.err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_interrupted_sweep_resumes_from_the_last_finished_chunk(tmp_path, capsys, monkeypatch):
    spec = spec_file(tmp_path, GRID + "batch_size: 2\n")
    status, _ = run(["sweep", spec, "--out", tmp_path / "whole"], capsys)
    assert status == 0
    original, calls = sweep_module._Evaluator.host_chunk, []

    def interrupted(self, k):
        calls.append(k)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, k)

    monkeypatch.setattr(sweep_module._Evaluator, "host_chunk", interrupted)
    out = tmp_path / "out"
    status, output = run(["sweep", spec, "--out", out], capsys)
    assert status == 130 and "--resume" in output.err and output.err.startswith("jaxroll: interrupted: ")
    assert sorted(p.name for p in (out / ".partial").iterdir()) == ["chunk_000000.npy", "fingerprint.txt"]
    assert not (out / "sweep.csv").exists()
    # Rerun without --resume: told to resume (not to --force, which discards the finished chunks).
    status, output = run(["sweep", spec, "--out", out], capsys)
    assert status == 2 and "pass --resume to continue it" in output.err
    calls.clear()
    monkeypatch.setattr(sweep_module._Evaluator, "host_chunk",
                        lambda self, k: (calls.append(k), original(self, k))[1])
    status, output = run(["sweep", spec, "--out", out, "--resume"], capsys)
    assert status == 0, output.err
    assert calls == [1, 2] and not (out / ".partial").exists()
    assert (out / "sweep.csv").read_text() == (tmp_path / "whole" / "sweep.csv").read_text()
    np.testing.assert_array_equal(np.load(out / "profiles.npz")["profiles"],
                                  np.load(tmp_path / "whole" / "profiles.npz")["profiles"])


def test_resume_needs_an_interrupted_sweep(tmp_path, capsys):
    status, output = run(["sweep", spec_file(tmp_path, GRID), "--out", tmp_path / "out", "--resume"], capsys)
    assert status == 2 and "no .partial/" in output.err and not (tmp_path / "out").exists()


def test_parquet_is_the_csv_table_when_pyarrow_is_installed(tmp_path, capsys):
    parquet = pytest.importorskip("pyarrow.parquet")
    status, output = run(["sweep", spec_file(tmp_path, GRID), "--out", tmp_path / "out"], capsys)
    assert status == 0, output.err
    table = parquet.read_table(tmp_path / "out" / "sweep.parquet").to_pydict()
    rows = np.genfromtxt(tmp_path / "out" / "sweep.csv", delimiter=",", names=True)
    assert list(table) == list(rows.dtype.names)
    for name in table:
        np.testing.assert_array_equal(np.asarray(table[name], np.float64), rows[name])


def test_config_base_relative_to_the_spec_and_one_axis_line_plots(tmp_path, capsys):
    """A config file beside the spec; one axis: line_<statistic>.png; equal to the Python sweep."""
    model = content_model()
    jaxroll.save_config(model, tmp_path / "base.yaml")
    spec = spec_file(tmp_path, "base: {config: base.yaml}\naxes:\n  temperature: [0.5, 1.0, 2.0]\n")
    status, output = run(["sweep", spec, "--out", tmp_path / "out"], capsys)
    assert status == 0, output.err
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"line_u_index.png", "line_first.png", "sweep.csv", "profiles.npz"} <= names
    assert not any(name.startswith("heatmap_") for name in names)
    saved = np.load(tmp_path / "out" / "profiles.npz")
    assert list(saved["axis_names"]) == ["temperature"]
    np.testing.assert_array_equal(saved["axis_temperature"], [0.5, 1.0, 2.0])
    expected_profiles = jaxroll.sweep(model, temperature=[0.5, 1.0, 2.0], progress=False).profiles
    np.testing.assert_allclose(saved["profiles"], expected_profiles, rtol=0, atol=TOLERANCE)


# ---------------------------------------------------------------- kernel models (issue 19)


def numpy_relative_profile(lambdas, scores, weights, n):
    """NumPy float64 oracle of a relative-position rollout: ``scores (T, H, n)`` = f_h(k), k = 0..n-1."""
    row = np.zeros(n)
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        kernel = np.zeros((n, n))
        w = weights[t] / weights[t].sum()
        for h in range(len(w)):
            for i in range(n):
                logits = scores[t, h, i - np.arange(i + 1)]
                e = np.exp(logits - logits.max())
                kernel[i, : i + 1] += w[h] * e / e.sum()
        row = (1 - lambdas[t]) * row + lambdas[t] * row @ kernel
    return row / row.sum()


def power_scores(slopes, exponents, diagonal, n):
    k = np.arange(n, dtype=np.float64)
    scores = -slopes[..., None] * np.maximum(k, 1.0) ** exponents[..., None]
    scores[..., 0] = diagonal
    return scores


def test_power_kernel_sweep_over_slopes_and_exponents_matches_numpy():
    from jaxroll.kernel_types import PowerKernel

    diagonal = np.array([[0.3, -0.2]] * 3)
    kernel = PowerKernel.create(num_layers=3, num_heads=2, slopes=[0.5, 0.1], exponents=1.0, diagonal_scores=diagonal)
    model = jaxroll.KernelRolloutModel.create(kernel=kernel, lambdas=[0.3, 0.5, 0.7], sequence_length=12)
    slopes, exponents = [0.2, [[1.0, 0.05]]], [0.5, [[1.0, 0.7]]]
    result = jaxroll.sweep(model, slopes=slopes, exponents=exponents, lengths=[5, 12], progress=False)
    assert result.method == "vmap" and result.profiles.shape == (2, 2, 2, 12)
    weights = np.full((3, 2), 0.5)
    for i, s in enumerate(slopes):
        for j, e in enumerate(exponents):
            s_array = np.broadcast_to(np.asarray(s, np.float64), (3, 2))
            e_array = np.broadcast_to(np.asarray(e, np.float64), (3, 2))
            for position, n in enumerate((5, 12)):
                want = numpy_relative_profile([0.3, 0.5, 0.7], power_scores(s_array, e_array, diagonal, n), weights, n)
                np.testing.assert_allclose(result.profiles[i, j, position, :n], want, atol=TOLERANCE, rtol=0)
                assert np.all(result.profiles[i, j, position, n:] == 0.0)
    scaled = jaxroll.sweep(model, slope_scale=[0.0, 2.0], progress=False)
    want = numpy_relative_profile([0.3, 0.5, 0.7], power_scores(np.full((3, 2), [1.0, 0.2]), np.ones((3, 2)),
                                                               diagonal, 12), weights, 12)
    np.testing.assert_allclose(scaled.profiles[1], want, atol=TOLERANCE, rtol=0)


def test_schedule_sweep_over_measured_dense_kernels_matches_numpy():
    from jaxroll.kernel_types import DenseKernel

    rng = np.random.default_rng(3)
    layers = [np.tril(rng.random((10, 10))) for _ in range(2)]
    layers = [a / a.sum(axis=1, keepdims=True) for a in layers]
    for stacked, method in ((np.stack([layers[0]] * 3), "krylov"), (np.stack(layers + layers[:1]), "vmap")):
        model = jaxroll.KernelRolloutModel.create(kernel=DenseKernel.create(stacked), lambdas=0.5)
        result = jaxroll.sweep(model, lambda_0=[0.3, 0.9], beta=[0.5, 2.0], progress=False)
        assert result.method == method
        for i, lambda_0 in enumerate([0.3, 0.9]):
            for j, beta in enumerate([0.5, 2.0]):
                row = np.eye(10)[-1]
                lambdas = power_decay(lambda_0, beta, 3)
                for t in reversed(range(3)):
                    row = (1 - lambdas[t]) * row + lambdas[t] * row @ stacked[t]
                np.testing.assert_allclose(result.profiles[i, j], row / row.sum(), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("axes, message", [
    ({"slopes": [1.0]}, "axis 'slopes': not a field of a DenseKernel model"),
    ({"temperature": [1.0]}, "axis 'temperature': not a field of a DenseKernel model"),
])
def test_kernel_sweep_refuses_fields_the_kernel_lacks(axes, message):
    from jaxroll.kernel_types import DenseKernel

    model = jaxroll.KernelRolloutModel.create(kernel=DenseKernel.create(np.eye(4)[None]), lambdas=0.5)
    with pytest.raises(jaxroll.ConfigError, match=message):
        jaxroll.sweep(model, **axes, progress=False)


def test_memory_estimate_counts_the_fft_path():
    from jaxroll import memory
    from jaxroll.kernel_types import PowerKernel

    # n = 5: L = 2^ceil(log2(9)) = 16; H (6 n + 3 L) + 128 n elements.
    assert memory.influence_bytes(5, 2, "fft", 8) == (2 * (30 + 48) + 640) * 8
    model = jaxroll.KernelRolloutModel.create(
        kernel=PowerKernel.create(num_layers=2, num_heads=3, slopes=0.5), lambdas=0.5, sequence_length=64)
    assert memory.model_influence_bytes(model, 64) == memory.influence_bytes(64, 3, "fft")
    assert memory.model_influence_bytes(model, 64) > memory.influence_bytes(64, 3, "structured")
    per_point = plan_module._per_point_bytes("vmap", model, (64,), 64)
    assert per_point >= memory.influence_bytes(64, 3, "fft", 8)


def test_ctrl_c_exits_130_and_names_resume(tmp_path):
    """A real SIGINT to a running ``jaxroll sweep``: exit 130, one line naming --resume, chunks kept."""
    import signal
    import time

    spec = tmp_path / "spec.yaml"
    # Long enough that the interrupt lands mid-sweep: device-side chunks of one point at N = 64 ran
    # all 40 points before the signal arrived; 2000 points at N = 512 with a warm compile cache once
    # finished (6 s) before a loaded machine's poll saw the first chunk, so 8000.
    spec.write_text("base: {preset: mpt-7b, sequence_length: 512}\n"
                    f"axes: {{temperature: {[round(0.5 + 0.0001 * k, 4) for k in range(8000)]}}}\nbatch_size: 1\n")
    out = tmp_path / "out"
    # A user's Ctrl-C reaches a jaxroll started the usual way, with Python's KeyboardInterrupt handler. A suite
    # started in the background (`pytest ... &` in a shell without job control) hands its children SIGINT
    # ignored, and Python keeps an inherited SIG_IGN: the sweep then ran to exit 0 (reproduced by running this
    # test under a parent that ignores SIGINT). So the child sets the handler a terminal's Python starts with.
    # (Not preexec_fn: it forces a fork, which JAX warns against, an error here.)
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "runpy.run_module('jaxroll', run_name='__main__', alter_sys=True)")
    process = subprocess.Popen([sys.executable, "-c", start, "sweep", str(spec), "--out", str(out)],
                               env=_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = out / ".partial" / "chunk_000000.npy"
    deadline = time.monotonic() + 240
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "the sweep finished before its first chunk was seen: make it longer"
    process.send_signal(signal.SIGINT)
    with process.stderr:
        error = process.stderr.read().decode()
    assert process.wait(timeout=120) == 130, error
    # Progress lines ("jaxroll sweep: 4/2000 chunks ...") appear once the sweep has run 2 s on a busy
    # machine; the error lines are those of the "jaxroll: " prefix, and there is exactly one.
    last = [line for line in error.splitlines() if line.startswith("jaxroll:")]
    assert len(last) == 1 and last[0].startswith("jaxroll: interrupted: sweep:"), error
    assert "--resume" in last[0] and first.exists() and not (out / "sweep.csv").exists()
