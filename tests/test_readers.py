"""Every file a command reads back is refused in one line naming the file when it is corrupt, truncated or of
the wrong kind: measurement.npz (and metadata.json), a config's kernel npz, a measure checkpoint, cases.jsonl,
task.json, the sweep YAML, profile CSVs and configuration YAML.

Each reader first reads the good file (so the refusal below is the spoiled bytes', not the reader's), then the
same file spoiled three ways: bytes overwritten in its middle, cut in half, or replaced by a file of another
kind. The message must be one line that names the file and says what is allowed.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import yaml

import jaxroll
from jaxroll.cli import main
from jaxroll.errors import ConfigError

SPOILS = ("corrupt", "truncated", "pickle", "npy", "text", "png", "empty")


def _spoil(path, how: str) -> None:
    data = path.read_bytes()
    if how == "corrupt":  # garbage over a run of bytes in the middle (inside the data, not the headers)
        middle = len(data) // 2
        data = data[:middle] + bytes(range(128, 192)) + data[middle + 64:]
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "pickle":
        data = pickle.dumps({"influence_per_sequence": [1.0, 2.0]})
    elif how == "npy":
        path.unlink()
        np.save(path.with_suffix(".tmp.npy"), np.ones((4, 8)))
        data = path.with_suffix(".tmp.npy").read_bytes()
    elif how == "text":
        data = b"token_position,probability\n0,1.0\n"
    elif how == "png":
        data = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    elif how == "empty":
        data = b""
    path.write_bytes(data)


def _one_line(call, *names) -> str:
    with pytest.raises(ConfigError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message, message
    for name in names:
        assert str(name) in message, (name, message)
    return message


def _cli_one_line(argv, capsys, *names) -> str:
    assert main([str(item) for item in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jaxroll: error:"), err
    for name in names:
        assert str(name) in err, (name, err)
    return err


# -- measurement.npz (score/compare --measured, read_measurement) ----------------------------------------------


def _measured(tmp_path, size=64, sequences=6):
    rng = np.random.default_rng(0)
    rows = rng.random((sequences, size)) + 0.1
    rows /= rows.sum(axis=1, keepdims=True)
    directory = tmp_path / "measured"
    directory.mkdir()
    np.savez(directory / "measurement.npz", influence_per_sequence=rows, influence=rows.mean(axis=0))
    (directory / "metadata.json").write_text(json.dumps({"model": "m", "num_sequences": sequences}))
    profile = tmp_path / "profile.csv"
    jaxroll.write_profile(rows.mean(axis=0)[::-1] / rows.mean(axis=0).sum(), profile)
    return directory, profile


@pytest.mark.parametrize("how", SPOILS)
def test_score_measured_refuses_a_spoiled_measurement_npz(how, tmp_path, capsys):
    directory, profile = _measured(tmp_path)
    assert main(["score", str(profile), "--measured", str(directory)]) == 0  # the good file is read
    capsys.readouterr()
    _spoil(directory / "measurement.npz", how)
    err = _cli_one_line(["score", profile, "--measured", directory], capsys, f"--measured {directory}",
                        "measurement.npz", "not a readable .npz", "allowed: the measurement.npz")
    assert "pickled" not in err  # NumPy's several-line pickle refusal is not passed on


@pytest.mark.parametrize("how", SPOILS)
def test_read_measurement_refuses_spoiled_files(how, tmp_path):
    from jaxroll.measure.outputs import read_measurement

    directory, _ = _measured(tmp_path)
    arrays, metadata = read_measurement(directory)
    assert arrays["influence_per_sequence"].shape == (6, 64) and metadata["model"] == "m"
    _spoil(directory / "measurement.npz", how)
    _one_line(lambda: read_measurement(directory), directory / "measurement.npz", "allowed")


@pytest.mark.parametrize("how", ["corrupt", "truncated", "png", "empty"])
def test_read_measurement_refuses_a_spoiled_metadata_json(how, tmp_path):
    from jaxroll.measure.outputs import read_measurement

    directory, _ = _measured(tmp_path)
    (directory / "metadata.json").write_text(json.dumps({"model": "m", "notes": "x" * 200}))
    _spoil(directory / "metadata.json", how)
    _one_line(lambda: read_measurement(directory), directory / "metadata.json", "allowed")


# -- a config's kernel npz and the measure checkpoint ------------------------------------------------------------


@pytest.mark.parametrize("how", SPOILS)
def test_a_spoiled_kernel_npz_is_refused_naming_it(how, tmp_path, capsys):
    n = 16
    kernels = np.tril(np.ones((2, n, n)))
    kernels /= kernels.sum(axis=-1, keepdims=True)
    np.savez(tmp_path / "k.npz", kernels=kernels)
    config = {"sequence_length": n, "num_layers": 2, "kernel_config": {"kernel_type": "dense", "file": "k.npz"},
              "lambda_schedule_config": {"schedule_type": "constant", "lambda_const": 0.5}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert jaxroll.load_config(path).sequence_length == n
    _spoil(tmp_path / "k.npz", how)
    _one_line(lambda: jaxroll.load_config(path), "kernel_config.file", tmp_path / "k.npz", "allowed")
    _cli_one_line(["rollout", path, "--out", tmp_path / "out"], capsys, "k.npz")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", SPOILS)
def test_a_spoiled_measure_checkpoint_is_refused_naming_it(how, tmp_path):
    from jaxroll.measure.partial_sums import PartialSums

    path = tmp_path / "checkpoint.npz"
    sums = PartialSums.__new__(PartialSums)
    sums.arrays, sums.count = {"lambda_sum": np.arange(4000.0)}, 3
    sums.save(path, "fingerprint")
    sums.arrays["lambda_sum"] = np.zeros(4000)
    sums.load(path, "fingerprint")
    np.testing.assert_array_equal(sums.arrays["lambda_sum"], np.arange(4000.0))
    _spoil(path, how)
    _one_line(lambda: sums.load(path, "fingerprint"), f"--resume {path}", "allowed")


# -- the task files: cases.jsonl and task.json --------------------------------------------------------------------


def _row(index: int) -> dict:
    return {"task": "kv", "length": 64, "depth": index, "prompt_ids": [1, 2, 3], "answer_ids": [4, 5],
            "logprob": -1.5, "exact": True, "correct": 2, "depth_fraction": index / 10, "sample": 0, "seed": 0,
            "record_length": 3, "key": f"kv/64/{index}/0"}


@pytest.mark.parametrize("how, line", [("corrupt", None), ("png", None), ("npy", None), ("pickle", None),
                                       ("array", 2), ("text", 1), ("missing field", 2), ("wrong type", 3)])
def test_a_spoiled_cases_jsonl_is_refused_naming_it_and_the_line(how, line, tmp_path):
    from jaxroll.task import grid

    path = tmp_path / "cases.jsonl"
    lines = [json.dumps(_row(index)) for index in range(8)]
    path.write_text("\n".join(lines) + "\n")
    assert [row["depth"] for row in grid.read_rows(path)] == list(range(8))
    if how == "array":
        lines[1] = "[1, 2, 3]"
    elif how == "missing field":
        lines[1] = json.dumps({key: value for key, value in _row(1).items() if key != "answer_ids"})
    elif how == "wrong type":
        lines[2] = json.dumps({**_row(2), "length": "64"})
    if how in ("array", "missing field", "wrong type"):
        path.write_text("\n".join(lines) + "\n")
    else:
        _spoil(path, how)
    binary = how in ("corrupt", "png", "npy", "pickle")  # refused as not UTF-8, before any line is read
    _one_line(lambda: grid.read_rows(path), path,
              *(["not a UTF-8", "allowed"] if binary else [f"line {line}", "allowed: the cases.jsonl of jaxroll task"]))


def test_a_cases_jsonl_cut_mid_line_drops_only_the_torn_line(tmp_path):
    from jaxroll.task import grid

    path = tmp_path / "cases.jsonl"
    text = "".join(json.dumps(_row(index)) + "\n" for index in range(8))
    path.write_text(text[: len(text) // 2])
    complete = text[: len(text) // 2].count("\n")
    assert [row["depth"] for row in grid.read_rows(path)] == list(range(complete))


@pytest.mark.parametrize("how", ["corrupt", "truncated", "png", "npy", "empty", "list"])
def test_a_spoiled_task_json_is_refused_on_resume(how, tmp_path):
    from jaxroll.task import grid

    settings = {"model": "m", "vocabulary": 64, "seed": 0, "lengths": [64], "depths": [0.5], "tasks": ["kv"],
                "notes": "x" * 300}
    grid.check_settings(tmp_path, settings, resume=False)
    grid.check_settings(tmp_path, settings, resume=True)  # the good file is read back and matches
    path = tmp_path / grid.SETTINGS_FILE
    if how == "list":
        path.write_text("[1, 2]\n")
    else:
        _spoil(path, how)
    _one_line(lambda: grid.check_settings(tmp_path, settings, resume=True), path, "allowed: the task.json")


# -- YAML (configs and sweeps) and profile CSVs -------------------------------------------------------------------

CONFIG = ("sequence_length: 16\nnum_layers: 2\nattention_config: {num_heads: 2, alibi_slopes: [[0.5, 0.25]]}\n"
          "lambda_schedule_config: {schedule_type: constant, lambda_const: 0.5}\n")
YAML_SPOILS = ("corrupt", "truncated", "pickle", "npy", "png", "nul", "huge integer", "list")


def _spoil_yaml(path, how: str) -> None:
    if how == "nul":
        path.write_bytes(path.read_bytes().replace(b"\n", b"\n\x00", 1))
    elif how == "huge integer":
        path.write_text(path.read_text().replace(": 16", ": 1" + "0" * 5000, 1))
    elif how == "list":
        path.write_text("- 1\n- 2\n")
    else:
        _spoil(path, how)


@pytest.mark.parametrize("how", YAML_SPOILS)
def test_a_spoiled_config_yaml_is_refused_naming_it(how, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    assert jaxroll.load_config(path).num_layers == 2
    _spoil_yaml(path, how)
    assert path.read_text(errors="replace") != CONFIG
    _one_line(lambda: jaxroll.load_config(path), path)
    _cli_one_line(["rollout", path, "--out", tmp_path / "out"], capsys, path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", YAML_SPOILS)
def test_a_spoiled_sweep_yaml_is_refused_naming_it(how, tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text("base: {preset: bloom-7b1, sequence_length: 16}\naxes:\n  lambda_0: [0.2, 0.4]\n")
    before = path.read_bytes()
    _spoil_yaml(path, how)
    assert path.read_bytes() != before
    _cli_one_line(["sweep", path, "--out", tmp_path / "out"], capsys, path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["corrupt", "pickle", "npy", "png", "empty", "nul", "huge field", "cut mid-line"])
def test_a_spoiled_profile_csv_is_refused_naming_it(how, tmp_path, capsys):
    path = tmp_path / "p.csv"
    jaxroll.write_profile(np.full(200, 1 / 200), path)
    assert jaxroll.read_profile(path).size == 200
    if how == "nul":
        path.write_bytes(path.read_bytes().replace(b"\n7,", b"\n7\x00,"))
    elif how == "huge field":
        path.write_text('token_position,probability\n0,"' + "1" * 200_000 + '"\n')
    elif how == "cut mid-line":
        text = path.read_text()
        path.write_text(text[: text.index("\n150,") + 5])  # "150," with no probability
    else:
        _spoil(path, how)
    _one_line(lambda: jaxroll.read_profile(path), path, "allowed")
    _cli_one_line(["compare", path, path], capsys, path)
