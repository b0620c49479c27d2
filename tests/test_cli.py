"""The `jaxroll` command, run as a subprocess the way a user runs it."""

import subprocess
import sys

import numpy as np
import pytest

import jaxroll
import oracle
from jaxroll.cli import main
from conftest import REFERENCE_CONFIGS


def run(*arguments, cwd=None):
    return subprocess.run([sys.executable, "-m", "jaxroll", *map(str, arguments)],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def run_here(capsys, *arguments):
    """In-process (no interpreter start-up): the exit status and captured output."""
    status = main([str(a) for a in arguments])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(arguments, status, captured.out, captured.err)


def test_rollout_of_a_reference_config_matches_the_oracle(tmp_path, capsys):
    path = REFERENCE_CONFIGS / "rollout/alibi/mean_content/fineweb-edu/mpt-7b.yaml"
    result = run_here(capsys, "rollout", path, "--length", 64, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    config = oracle.read_config(path)
    expected = oracle.influence(oracle.config_arrays(config), 64)
    written = jaxroll.read_profile(tmp_path / "out/profile.csv")
    # float32 by default: 1e-6 absolute on values of at most 1 after 32 layers.
    np.testing.assert_allclose(written, expected, rtol=0, atol=1e-6)
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"profile.csv", "profile.png", "config.yaml"}
    rerun = jaxroll.load_config(tmp_path / "out/config.yaml")
    assert rerun.sequence_length == 64
    for line in ("N = 64, T = 32, H = 32", "argmin =", "p[0] =", "first_mass / middle_mass / last_mass"):
        assert line in result.stdout


def test_rollout_default_preset_float64(tmp_path):
    result = run("rollout", "--out", "results", "--float64", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    model = jaxroll.presets.get("bloom-176b")
    arrays = {"lambdas": np.asarray(model.lambdas), "slopes": np.asarray(model.alibi_slopes),
              "diagonal": np.asarray(model.diagonal_scores), "base": np.asarray(model.base_scores),
              "weights": np.asarray(model.head_weights), "temperature": 1.0, "mask": "causal", "window": None}
    expected = oracle.influence(arrays, 256)
    np.testing.assert_allclose(jaxroll.read_profile(tmp_path / "results/profile.csv"), expected, rtol=0, atol=1e-12)


def test_rollout_of_a_published_model_matches_the_oracle_on_its_file(tmp_path, capsys):
    result = run_here(capsys, "rollout", "--published", "bloom-7b1", "--content", "all", "--dataset", "dclm",
                      "--length", 48, "--out", tmp_path / "out", "--float64")
    assert result.returncode == 0, result.stderr
    path = REFERENCE_CONFIGS / "rollout/alibi/all_content/dclm/bloom-7b1.yaml"
    expected = oracle.influence(oracle.config_arrays(oracle.read_config(path)), 48)
    np.testing.assert_allclose(jaxroll.read_profile(tmp_path / "out/profile.csv"), expected, rtol=0, atol=1e-12)
    assert "published bloom-7b1 (all content, dclm)" in result.stdout


def test_rollout_of_a_published_model_without_residual_collapses(tmp_path, capsys):
    result = run_here(capsys, "rollout", "--published", "mpt-30b", "--no-residual", "--length", 64,
                      "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    # lambda = 1: the attention-only rollout of earlier theory collapses onto token 0.
    assert jaxroll.read_profile(tmp_path / "out/profile.csv")[0] > 0.99


def test_presets_and_version(capsys):
    listing = run_here(capsys, "presets")
    assert listing.returncode == 0
    for name in jaxroll.presets.names() + jaxroll.published.names():
        assert name in listing.stdout
    assert "power-decay" in listing.stdout and "measured" in listing.stdout
    version = run("--version")  # a real process: --version answers before JAX loads
    assert version.returncode == 0 and "jaxroll" in version.stdout


@pytest.mark.parametrize("command", [["--help"], ["rollout", "--help"], ["presets", "--help"]])
def test_help(command):
    result = run(*command)
    assert result.returncode == 0 and "usage" in result.stdout


BAD = {
    "custom lambda > 1": ("sequence_length: 8\nnum_layers: 1\nattention_config: {num_heads: 1, alibi_slopes: [[0.5]]}\n"
                          "lambda_schedule_config: {schedule_type: custom, lambdas_custom: [1.5]}\n", "lambdas_custom"),
    "negative slope": ("sequence_length: 8\nnum_layers: 1\nattention_config: {num_heads: 1, alibi_slopes: [[-0.5]]}\n"
                       "lambda_schedule_config: {schedule_type: constant, lambda_const: 0.5}\n", "alibi_slopes"),
    "malformed": ("sequence_length: [8\n", "malformed YAML"),
    "unknown key": ("sequence_length: 8\nnum_layers: 1\nmodel: x\n", "unknown key 'model'"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_config_exits_2_with_one_line_and_writes_nothing(case, tmp_path, capsys):
    text, message = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = run_here(capsys, "rollout", path, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arguments, message", [
    (["rollout", "--length", "0"], "--length"),
    (["rollout", "--length", "many"], "--length"),
    (["rollout", "--preset", "gpt-5"], "--preset"),
    (["rollout", "absent.yaml"], "no such file"),
    (["rollout", "."], "is a directory"),
    (["rollout", "--preset"], "expected one argument"),
    (["rollout", "absent.yaml", "--preset", "mpt-7b"], "give one of CONFIG, --preset, --published; got CONFIG and --preset"),
    (["rollout", "--preset", "mpt-7b", "--published", "mpt-7b"], "got --preset and --published"),
    (["rollout", "--published", "gpt-5"], "--published: invalid choice: 'gpt-5'"),
    (["rollout", "--published", "mpt-7b", "--content", "some"], "--content: invalid choice"),
    (["rollout", "--published", "mpt-7b", "--dataset", "c4"], "--dataset: invalid choice"),
    (["rollout", "--published", "mpt-7b", "--content", "mean", "--dataset", "dclm"],
     "dataset: got 'dclm' with content='mean'"),
    (["rollout", "--content", "all"], "--content: applies to --published only"),
    (["forces", "--no-residual"], "--no-residual: applies to --published only"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_bad_arguments_exit_2_with_one_line(arguments, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_here(capsys, *arguments, "--out", tmp_path / "out") if arguments else run_here(capsys)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "out").exists()


def test_existing_output_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    result = run_here(capsys, "rollout", "--preset", "mpt-7b", "--length", 16, "--out", out)
    assert result.returncode == 2 and "--force" in result.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    forced = run_here(capsys, "rollout", "--preset", "mpt-7b", "--length", 16, "--out", out, "--force")
    assert forced.returncode == 0 and (out / "mine.txt").read_text() == "keep me"
    assert (out / "profile.csv").exists()


def _present(platform):
    import jax

    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def test_rollout_device_cpu_gives_the_same_profile(tmp_path, capsys):
    path = REFERENCE_CONFIGS / "rollout/alibi/mean_content/fineweb-edu/mpt-7b.yaml"
    profiles = {}
    for device in ("auto", "cpu"):
        out = tmp_path / device
        result = run_here(capsys, "rollout", path, "--length", 64, "--float64", "--no-figure", "--device", device,
                          "--out", out)
        assert result.returncode == 0, result.stderr
        profiles[device] = jaxroll.read_profile(out / "profile.csv")
    expected = oracle.influence(oracle.config_arrays(oracle.read_config(path)), 64)
    np.testing.assert_allclose(profiles["cpu"], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(profiles["cpu"], profiles["auto"], rtol=0, atol=1e-12)
    # From the command line --device cpu limits JAX to the CPU: no accelerator is started.
    code = ("import sys, json, jax; from jaxroll.cli import main; "
            f"sys.argv = ['jaxroll', 'rollout', {str(path)!r}, '--length', '64', '--float64', '--no-figure', "
            f"'--device', 'cpu', '--out', {str(tmp_path / 'command')!r}]; status = main(); "
            "print(json.dumps([status, jax.config.jax_platforms, sorted({d.platform for d in jax.devices()})]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == '[0, "cpu", ["cpu"]]'
    np.testing.assert_allclose(jaxroll.read_profile(tmp_path / "command/profile.csv"), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_rollout_device_not_present_exits_2_and_creates_nothing(platform, tmp_path, capsys):
    if _present(platform):
        pytest.skip(f"a {platform} is present here")
    result = run_here(capsys, "rollout", "--preset", "mpt-7b", "--length", 16, "--device", platform,
                      "--out", tmp_path / "new" / "out")
    assert result.returncode == 2
    present = ", ".join(p for p in ("cpu", "gpu", "tpu") if _present(p))
    assert result.stderr == (f"jaxroll: error: --device {platform}: no {platform} device here (platforms present: "
                             f"{present}); allowed: auto, {present}\n")
    assert not (tmp_path / "new").exists()
    bad = run_here(capsys, "rollout", "--device", "npu", "--out", tmp_path / "new" / "out")
    assert bad.returncode == 2 and "--device: invalid choice: 'npu'" in bad.stderr
    assert not (tmp_path / "new").exists()
