"""Hostile inputs: binary files, plain-number messages, memory-sized refusals.

Each refusal is one line naming the field and the value, exit status 2 from
the command line, and nothing created.
"""

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
