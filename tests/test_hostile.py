"""Hostile inputs: binary files, plain-number messages, memory-sized refusals.

Each refusal is one line naming the field and the value, exit status 2 from
the command line, and nothing created.
"""

from pathlib import Path

import argparse
import numpy as np
import pytest

import jaxroll
from jaxroll import ConfigError, memory, schedules
from jaxroll.cli import main

BINARY = bytes(range(256)) * 4  # 0x80.. are never valid UTF-8 lead bytes here


def one_line_error(call) -> str:
    with pytest.raises(ConfigError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    return message


def test_binary_config_is_not_a_utf8_yaml_file(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_bytes(BINARY)
    assert one_line_error(lambda: jaxroll.load_config(path)).startswith(f"{path}: not a UTF-8 YAML file")


def test_binary_profile_is_not_a_utf8_csv_file(tmp_path):
    path = tmp_path / "profile.csv"
    path.write_bytes(b"token_position,probability\n0,\xff\xfe\n")
    assert one_line_error(lambda: jaxroll.read_profile(path)).startswith(f"{path}: not a UTF-8 CSV file")


@pytest.mark.parametrize("arguments", [["rollout", "{bad}"], ["forces", "{bad}"], ["compare", "{bad}", "{bad}"]])
def test_binary_file_on_the_command_line_exits_2_with_nothing_written(arguments, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(BINARY)
    out = tmp_path / "out"
    extra = [] if arguments[0] == "compare" else ["--out", str(out)]
    status = main([a.format(bad=bad) for a in arguments] + extra)
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1 and "not a UTF-8" in error
    assert not out.exists()


def test_measure_texts_refuse_binary_files(tmp_path):
    pytest.importorskip("torch")
    from jaxroll.measure import read_texts

    for name in ("docs.txt", "docs.jsonl"):
        path = tmp_path / name
        path.write_bytes(BINARY)
        assert "not a UTF-8" in one_line_error(lambda: read_texts(path))


@pytest.mark.parametrize("call, message", [
    (lambda: jaxroll.RolloutModel.create(num_layers=2, num_heads=1, lambdas=0.5, temperature=0.0),
     "temperature: value 0.0 is outside the allowed range (0, inf)"),
    (lambda: jaxroll.RolloutModel.create(num_layers=2, num_heads=1, lambdas=[0.5, 1.5]),
     "lambdas: value 1.5 at index 1 is outside the allowed range [0, 1]"),
    (lambda: jaxroll.RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.5, alibi_slopes=[[1, -2], [1, 1]]),
     "alibi_slopes: value -2.0 at index [0, 1] is outside the allowed range [0, inf)"),
    (lambda: jaxroll.RolloutModel.create(num_layers=1, num_heads=1, lambdas=0.5, diagonal_scores=np.nan),
     "diagonal_scores: value nan at index [0, 0] is not finite"),
    (lambda: schedules.power_decay(0.5, -1.0, 4), "beta: value -1.0 is outside the allowed range [0, inf)"),
])
def test_messages_show_plain_numbers_and_no_index_for_scalars(call, message):
    text = one_line_error(call)
    assert text == message or text.startswith(message + ";")
    assert "np.float64" not in text


def test_power_decay_with_beta_zero_is_the_constant_schedule():
    np.testing.assert_array_equal(schedules.power_decay(0.3, 0.0, 5), np.full(5, 0.3))
    np.testing.assert_array_equal(schedules.power_decay(0.3, 0, 5), schedules.constant(0.3, 5))


CONFIG = ("sequence_length: {n}\nnum_layers: 2\nattention_config: {{num_heads: 2, alibi_slopes: [[0.5]]}}\n"
          "lambda_schedule_config: {{schedule_type: constant, lambda_const: 0.5}}\n")


@pytest.mark.parametrize("arguments, message", [
    (["rollout", "{config}"], "rollout: N = 1000000000000: needs about"),
    (["forces", "{config}"], "forces: N = 1000000000000: needs about"),
    (["rollout", "--length", "1000000000"], "rollout: N = 1000000000: needs about"),
    (["rollout", "--length", "100000", "--method", "dense"], "rollout: N = 100000: needs about"),
    (["rollout", "--length", "65536", "--max-memory", "1M"], "--max-memory allows 1 MiB"),
    (["rollout", "--max-memory", "lots"], "--max-memory: got 'lots'"),
])
def test_runs_that_cannot_fit_are_refused_before_anything_is_created(arguments, message, tmp_path, capsys):
    config = tmp_path / "huge.yaml"
    config.write_text(CONFIG.format(n=10**12))
    out = tmp_path / "out"
    status = main([a.format(config=config) for a in arguments] + ["--out", str(out)])
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1 and message in error, error
    assert not out.exists()


def test_memory_estimates_scale_as_the_algorithms_do():
    # Structured products are O(n), dense kernels O(H n^2).
    assert memory.influence_bytes(2 * 4096, 32, "structured") == 2 * memory.influence_bytes(4096, 32, "structured")
    assert memory.influence_bytes(2 * 4096, 32, "dense") == 4 * memory.influence_bytes(4096, 32, "dense")
    assert memory.influence_bytes(4096, 32, "dense", 8) == 2 * memory.influence_bytes(4096, 32, "dense", 4)
    assert memory.parse_size("8G") == 8 * 2**30 and memory.parse_size("512m") == 512 * 2**20
    assert memory.parse_size("1.5KiB") == 1536 and memory.parse_size("1000") == 1000
    assert 0 < memory.available_bytes()


# ---------------------------------------------------------------- issue 19: the front door


def refused(arguments, capsys, out=None) -> str:
    """Run in-process; assert exit 2, one line on stderr, `out` not created; return the line."""
    status = main([str(a) for a in arguments])
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1 and error.startswith("jaxroll: error: "), error
    assert "Traceback" not in error
    if out is not None:
        assert not Path(out).exists()
    return error


@pytest.mark.parametrize("target, message", [
    ("{file}/sub", "is a file, not a directory"),
    ("{file}", "exists and is not a directory"),
    ("/proc/nope", "cannot create it (/proc is not writable)"),
    ("/proc/nope/deeper", "cannot create it (/proc is not writable)"),
])
@pytest.mark.parametrize("command", [["rollout", "--length", "8"], ["forces", "--length", "8"]])
def test_out_targets_that_cannot_be_directories_are_one_line(command, target, message, tmp_path, capsys):
    existing = tmp_path / "some_file.csv"
    existing.write_text("token_position,probability\n0,1.0\n")
    out = Path(target.format(file=existing))
    error = refused(command + ["--out", out], capsys)
    assert f"--out {out}" in error and message in error
    assert existing.read_text() == "token_position,probability\n0,1.0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["some_file.csv"]


def test_out_in_an_unwritable_directory_is_one_line(tmp_path, capsys, monkeypatch):
    import jaxroll.io

    locked = tmp_path / "locked"
    locked.mkdir()
    # Root may write anywhere, so the permission is simulated where it is asked.
    monkeypatch.setattr(jaxroll.io.os, "access", lambda path, mode: Path(path) != locked)
    error = refused(["rollout", "--length", "8", "--out", locked / "out"], capsys, locked / "out")
    assert "is not writable" in error


def test_broken_pipe_exits_quietly(tmp_path):
    import subprocess
    import sys

    profile = tmp_path / "p.csv"
    profile.write_text("token_position,probability\n" + "".join(f"{k},0.125\n" for k in range(8)))
    process = subprocess.Popen([sys.executable, "-m", "jaxroll", "compare", str(profile), str(profile)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the first line is written (as `| head -0`)
    with process.stderr:
        error = process.stderr.read().decode()
    status = process.wait(timeout=120)
    assert status == 1 and error == "", error  # Python's documented SIGPIPE convention


def test_broken_pipe_in_process(tmp_path, monkeypatch):
    import sys

    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    profile = tmp_path / "p.csv"
    profile.write_text("token_position,probability\n0,1.0\n")
    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["compare", str(profile), str(profile)]) == 1


@pytest.mark.parametrize("loader", ["C", "Python"])
@pytest.mark.parametrize("text", [
    "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "".join(" " * i + "k:\n" for i in range(5000)),
    "sequence_length: 8\nnum_layers: 1\nattention_config: {num_heads: 1, alibi_slopes: "
    + "[" * 5000 + "0.5" + "]" * 5000 + "}\nlambda_schedule_config: {schedule_type: constant, lambda_const: 0.5}\n",
])
def test_yaml_nested_5000_levels_is_one_line(text, loader, tmp_path, capsys, monkeypatch):
    import yaml

    import jaxroll.io

    if loader == "Python":  # the pure-Python parser recurses once per level
        monkeypatch.setattr(jaxroll.io, "_LOADER", yaml.SafeLoader)
    config = tmp_path / "deep.yaml"
    config.write_text(text)
    refused(["rollout", config, "--out", tmp_path / "out"], capsys, tmp_path / "out")


def test_ragged_alibi_slopes_name_the_field():
    message = one_line_error(lambda: jaxroll.RolloutModel.create(
        num_layers=2, num_heads=2, lambdas=0.5, alibi_slopes=[[0.5], [0.5, 0.25]]))
    assert message.startswith("alibi_slopes: got ragged lists (lists of lengths [1, 2]")


TYPED = ("sequence_length: 8\nnum_layers: 2\nattention_config: {{num_heads: 1, alibi_slopes: {slopes}, "
         "softmax_temperature: {temperature}}}\nlambda_schedule_config: {{schedule_type: constant, "
         "lambda_const: {lambda_const}}}\n")


@pytest.mark.parametrize("fields, message", [
    ({"lambda_const": "true"}, "lambda_schedule_config.lambda_const: got a boolean (True)"),
    ({"temperature": "true"}, "attention_config.softmax_temperature: got a boolean (True)"),
    ({"slopes": "[[true]]"}, "attention_config.alibi_slopes: got a boolean (True)"),
    ({"slopes": "[[0.5, false]]"}, "attention_config.alibi_slopes: got a boolean (False)"),
    ({"lambda_const": '"0.2"'}, "lambda_schedule_config.lambda_const: got a quoted number ('0.2'"),
    ({"temperature": "'2'"}, "attention_config.softmax_temperature: got a quoted number ('2'"),
    ({"slopes": '[["0.5"]]'}, "attention_config.alibi_slopes: got a quoted number ('0.5'"),
    ({"slopes": "[[0.5], [0.5, 0.25]]"}, "attention_config.alibi_slopes: inner lists have lengths [1, 2]"),
])
def test_booleans_and_quoted_numbers_are_errors_naming_the_field(fields, message, tmp_path):
    values = {"slopes": "[[0.5]]", "temperature": "1.0", "lambda_const": "0.5"} | fields
    path = tmp_path / "typed.yaml"
    path.write_text(TYPED.format(**values))
    assert one_line_error(lambda: jaxroll.load_config(path)) .startswith(f"{path}: {message}")


def test_compare_of_one_position_profiles_prints_no_nan_or_inf(tmp_path, capsys):
    profile = tmp_path / "one.csv"
    profile.write_text("token_position,probability\n0,1.0\n")
    assert main(["compare", str(profile), str(profile)]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "inf" not in out.lower()
    assert "spearman               undefined (A and B constant" in out
    assert "u_index                     undefined      undefined (no middle: N = 1 <= 2k, k = 1 edge position)" in out


def test_profiles_with_a_utf8_byte_order_mark_are_read(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbftoken_position,probability\r\n0,0.25\r\n1,0.75\r\n")
    np.testing.assert_array_equal(jaxroll.read_profile(path), [0.25, 0.75])


def test_usage_errors_have_one_prefix(capsys):
    error = refused(["rollout", "--length", "x"], capsys)
    assert error == "jaxroll: error: rollout: argument --length: 'x' is not an integer"


def test_every_command_defaults_to_its_own_out_folder():
    from jaxroll.cli import _build_parser

    parser = _build_parser()
    for command in ("rollout", "forces", "fit", "fit-kernel", "sweep"):
        extra = {"fit": ["c.yaml", "p.csv"], "fit-kernel": ["k.npz"], "sweep": ["s.yaml"]}.get(command, [])
        arguments = parser.parse_args([command, *extra])
        assert arguments.out == Path("results") / command
    assert parser.parse_args(["rollout", "--out", "results"]).out == Path("results")  # the README's command


@pytest.mark.parametrize("width", [40, 57, 80, 123])
def test_help_never_breaks_a_word(width, monkeypatch):
    import re

    from jaxroll.cli import _build_parser

    monkeypatch.setenv("COLUMNS", str(width))
    parser = _build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, command in commands.items():
        text = command.format_help()
        joined = re.sub(r"\s+", " ", text)
        sources = [command.description or ""] + [action.help or "" for action in command._actions
                                                   if action.help != argparse.SUPPRESS]  # retired: no help
        for word in {w for source in sources for w in re.findall(r"[A-Za-z_]{8,}", source)}:
            if "%" not in word:
                assert word in joined, (name, word)


def test_presets_help_names_both_lists(capsys):
    from jaxroll.cli import _build_parser

    commands = _build_parser()._subparsers._group_actions[0].choices
    text = commands["presets"].format_help()
    assert "presets" in text and "published" in text


def test_length_one_summary_is_grammatical(tmp_path, capsys):
    assert main(["rollout", "--length", "1", "--out", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert "(positions: first 1, middle 0, last 1)" in out and "1 positions" not in out


@pytest.mark.parametrize("content", [BINARY, b"\x89PNG\r\n\x1a\n" + bytes(64), b"tau: 0.7\n\xff\n"],
                         ids=["bytes", "png", "one bad byte"])
@pytest.mark.parametrize("command", ["rollout", "measure", "task"])
def test_a_binary_intervention_file_is_one_line(command, content, tmp_path, capsys):
    """A .yaml given to --intervene that is not UTF-8 text (a PNG renamed, stray bytes): exit 2, one line
    naming the flag, the file and the byte, nothing created (issue 56: a UnicodeDecodeError traceback)."""
    path = tmp_path / "changes.yaml"
    path.write_bytes(content)
    model = tmp_path / "model"  # measure and task read --intervene against config.json, before torch loads
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bloom", "n_head": 2, "n_layer": 2, "hidden_size": 8}')
    argv = {"rollout": ["rollout", "--preset", "bloom-7b1", "--length", "8"],
            "measure": ["measure", str(model), "--texts", str(path), "--length", "8", "--samples", "2"],
            "task": ["task", str(model)]}[command]
    out = tmp_path / "out"
    assert main([*argv, "--intervene", str(path), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    byte = content.decode("utf-8", errors="replace").index("\ufffd")  # Python's decoder as the oracle
    assert error == (f"jaxroll: error: --intervene {path}: not a UTF-8 YAML file (byte {byte} cannot be decoded: a "
                     "binary file?); allowed: a UTF-8 YAML file of interventions, a mapping such as 'tau: 0.7'\n")
    assert not out.exists()


def test_sequence_length_null_is_refused_naming_the_field(tmp_path, capsys):
    """``sequence_length: null`` is not a default length (it ran silently at 256 before): one line naming
    the field, from load_config and from the command line; 256 written out runs."""
    text = ("sequence_length: {n}\nnum_layers: 2\nmask_config: {{mask_type: causal}}\nattention_config: "
            "{{num_heads: 2, alibi_slopes: [[0.5, 0.25]], softmax_temperature: 1.0}}\ncontent_config: "
            "{{diagonal_scores: [[1.0]], base_scores: [[0.0]]}}\nlambda_schedule_config: {{schedule_type: constant, "
            "lambda_const: 0.5}}\n")
    path = tmp_path / "null.yaml"
    path.write_text(text.format(n="null"))
    message = one_line_error(lambda: jaxroll.load_config(path))
    assert message.startswith(f"{path}: sequence_length: got None; allowed: an integer >= 1")
    out = tmp_path / "out"
    assert main(["rollout", str(path), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"jaxroll: error: {message}\n" and not out.exists()
    path.write_text(text.format(n=256))
    assert jaxroll.load_config(path).sequence_length == 256
