"""Configurations and profiles: every published file loads, round trips are exact,
and every bad input is one line naming the field."""

import numpy as np
import pytest
import yaml

import jaxroll
from jaxroll import ConfigError

from conftest import ROLLOUT_CONFIGS

import oracle


def test_all_33_reference_configs_are_found():
    assert len(ROLLOUT_CONFIGS) == 33


@pytest.mark.parametrize("path", ROLLOUT_CONFIGS, ids=lambda p: str(p).split("rollout/")[-1])
def test_reference_config_loads_with_the_schema_meaning(path):
    """The arrays equal a reading of the file by PyYAML + NumPy broadcasting (oracle)."""
    model = jaxroll.load_config(path)
    expected = oracle.config_arrays(oracle.read_config(path))
    np.testing.assert_array_equal(model.lambdas, expected["lambdas"])
    np.testing.assert_array_equal(model.alibi_slopes, expected["slopes"])
    np.testing.assert_array_equal(model.diagonal_scores, expected["diagonal"])
    np.testing.assert_array_equal(model.base_scores, expected["base"])
    weights = np.asarray(model.head_weights)
    np.testing.assert_allclose(weights / weights.sum(1, keepdims=True),
                               expected["weights"] / expected["weights"].sum(1, keepdims=True),
                               rtol=1e-13)  # 1/H summed H times: a few ulps
    assert model.mask == "causal" and model.window is None
    assert model.sequence_length == oracle.read_config(path)["sequence_length"]


@pytest.mark.parametrize("path", ROLLOUT_CONFIGS[::4], ids=lambda p: p.name)
def test_save_then_load_is_exact(path, tmp_path):
    model = jaxroll.load_config(path)
    saved = jaxroll.save_config(model, tmp_path / "config.yaml")
    again = jaxroll.load_config(saved)
    for field in ("lambdas", "alibi_slopes", "diagonal_scores", "base_scores", "head_weights", "temperature"):
        np.testing.assert_array_equal(getattr(again, field), getattr(model, field), err_msg=field)
    # The written numbers are the file's numbers, not float32 roundings of them.
    original = oracle.read_config(path)
    written = yaml.safe_load(saved.read_text())
    assert written["attention_config"]["alibi_slopes"][0] == original["attention_config"]["alibi_slopes"][0]


def test_save_round_trips_sliding_full_power_decay_and_weights(tmp_path):
    model = jaxroll.RolloutModel.create(
        num_layers=3, num_heads=2, lambdas=jaxroll.schedules.power_decay(0.7, 1.3, 3),
        alibi_slopes=[[0.1, 0.2]], diagonal_scores=[[1.0], [2.0], [3.0]], head_weights=[1.0, 3.0],
        temperature=0.5, mask="sliding", window=4, sequence_length=17)
    again = jaxroll.load_config(jaxroll.save_config(model, tmp_path / "c.yaml"))
    assert (again.mask, again.window, again.sequence_length) == ("sliding", 4, 17)
    for field in ("lambdas", "alibi_slopes", "diagonal_scores", "head_weights", "temperature"):
        np.testing.assert_array_equal(getattr(again, field), getattr(model, field), err_msg=field)


def test_save_refuses_to_overwrite(tmp_path):
    model = jaxroll.presets.get("mpt-7b")
    path = jaxroll.save_config(model, tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="exists"):
        jaxroll.save_config(model, path)
    jaxroll.save_config(model, path, overwrite=True)


def test_profile_round_trip_is_exact(tmp_path):
    profile = np.random.default_rng(0).dirichlet(np.ones(50))
    path = jaxroll.write_profile(profile, tmp_path / "p.csv")
    assert path.read_text().splitlines()[0] == "token_position,probability"
    np.testing.assert_array_equal(jaxroll.read_profile(path), profile)


def test_a_float32_profile_is_written_in_float64_summing_to_one(tmp_path):
    exact = np.random.default_rng(1).dirichlet(np.ones(3000))
    rounded = exact.astype(np.float32)
    assert abs(float(rounded.astype(np.float64).sum()) - 1) > 1e-11  # float32 rounding moves the sum off 1
    written = jaxroll.read_profile(jaxroll.write_profile(rounded, tmp_path / "p.csv"))
    assert written.dtype == np.float64 and abs(float(np.sum(written)) - 1) < 1e-12
    assert abs(float(sum(written.tolist())) - 1) < 1e-12  # summed left to right too, not only pairwise
    np.testing.assert_allclose(written, exact, rtol=1e-6)


@pytest.mark.parametrize("text, message", [
    ("position,prob\n0,1\n", "header"),
    ("token_position,probability\n0,0.5\n2,0.5\n", "position 2"),
    ("token_position,probability\n0,abc\n", "line 2"),
    ("token_position,probability\n0,-0.5\n", "probability"),
    ("token_position,probability\n0,nan\n", "probability"),
    ("token_position,probability\n", "no profile rows"),
    ("", "header"),
])
def test_malformed_profiles(tmp_path, text, message):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        jaxroll.read_profile(path)
    assert "\n" not in str(error.value)


BASE = {
    "sequence_length": 8,
    "num_layers": 2,
    "mask_config": {"mask_type": "causal", "window_size": None},
    "attention_config": {"num_heads": 2, "alibi_slopes": [[0.5, 0.25]], "head_weights": None,
                         "softmax_temperature": 1.0},
    "content_config": {"diagonal_scores": [[0.0]], "base_scores": [[0.0]]},
    "lambda_schedule_config": {"schedule_type": "custom", "lambdas_custom": [0.5, 0.25]},
    "save_dir": "./ignored",
}


def _with(path, value):
    config = yaml.safe_load(yaml.safe_dump(BASE))
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return config


_DELETE = object()

BAD_CONFIGS = [
    ("lambda_schedule_config.lambdas_custom", [0.5, 1.5], r"lambdas_custom.*1\.5.*\[0, 1\]"),
    ("lambda_schedule_config.lambdas_custom", [0.5, -0.1], r"lambdas_custom.*-0\.1"),
    ("lambda_schedule_config.lambdas_custom", [0.5, float("nan")], r"lambdas_custom.*nan.*finite"),
    ("lambda_schedule_config.lambdas_custom", [0.5], r"lambdas_custom.*length 1.*num_layers \(2\)"),
    ("lambda_schedule_config.schedule_type", "linear", r"schedule_type.*'linear'"),
    ("lambda_schedule_config", {"schedule_type": "constant", "lambda_const": float("inf")}, r"lambda_const.*finite"),
    ("lambda_schedule_config", {"schedule_type": "power_decay", "lambda_0": 0.5, "beta": -1.0}, r"beta.*-1\.0"),
    ("lambda_schedule_config", {"schedule_type": "constant", "lambda_const": 0.5, "x": 1}, r"unknown key 'x'"),
    # Refused, not clipped (issue 32): a schedule outside [0, 1] is a mistake in the file.
    ("lambda_schedule_config", {"schedule_type": "constant", "lambda_const": 1.5},
     r"lambda_schedule_config\.lambda_const: value 1\.5 is outside the allowed range \[0, 1\]$"),
    ("lambda_schedule_config", {"schedule_type": "constant", "lambda_const": -0.2}, r"lambda_const.*-0\.2.*\[0, 1\]"),
    ("lambda_schedule_config", {"schedule_type": "power_decay", "lambda_0": 1.5, "beta": 0.5},
     r"lambda_0.*1\.5.*\(0, 1\]"),
    ("attention_config.alibi_slopes", [[0.5, -0.25]], r"alibi_slopes.*-0\.25.*\[0, inf\)"),
    ("attention_config.alibi_slopes", [[0.5, float("nan")]], r"alibi_slopes.*finite"),
    ("attention_config.alibi_slopes", [[0.5, 0.25, 0.1]], r"alibi_slopes.*inner list length 3.*num_heads \(2\)"),
    ("attention_config.alibi_slopes", [[0.5], [0.5], [0.5]], r"alibi_slopes.*outer list length 3.*num_layers \(2\)"),
    ("attention_config.alibi_slopes", [[0.5, 0.2], [0.5]], r"alibi_slopes.*lengths"),
    ("attention_config.head_weights", [[0.0, 0.0]], r"head_weights.*all-zero"),
    ("attention_config.head_weights", [[1.0, -1.0]], r"head_weights.*-1\.0"),
    ("attention_config.softmax_temperature", 0.0, r"softmax_temperature.*\(0, inf\)"),
    ("attention_config.softmax_temperature", -2.0, r"softmax_temperature"),
    ("attention_config.num_heads", 0, r"num_heads.*>= 1"),
    ("attention_config.colour", "red", r"unknown key 'colour'"),
    ("content_config.diagonal_scores", [[float("inf")]], r"diagonal_scores.*finite"),
    ("content_config.base_scores", [[1.0], [1.0], [1.0]], r"base_scores.*outer"),
    ("mask_config.mask_type", "banded", r"mask_type.*'banded'.*causal"),
    ("mask_config.mask_type", [], r"mask_type: got \[\]; allowed: one of causal"),  # unhashable (hypothesis)
    ("mask_config", {"mask_type": "sliding_window", "window_size": None}, r"window_size"),
    ("mask_config", {"mask_type": "sliding_window", "window_size": 0}, r"window_size.*>= 1"),
    ("sequence_length", 0, r"sequence_length.*>= 1"),
    ("num_layers", 0, r"num_layers.*>= 1"),
    ("num_layers", _DELETE, r"num_layers.*missing"),
    ("extra", 1, r"unknown key 'extra'"),
]


@pytest.mark.parametrize("field, value, message", BAD_CONFIGS, ids=[f"{f}={v!r:.20}" for f, v, _ in BAD_CONFIGS])
def test_bad_config_gives_one_line_naming_the_field(field, value, message, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_with(field, value)))
    with pytest.raises(ConfigError, match=message) as error:
        jaxroll.load_config(path)
    assert "\n" not in str(error.value)
    assert isinstance(error.value, ValueError)


def test_the_base_config_is_good(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert jaxroll.load_config(path).num_heads == 2


@pytest.mark.parametrize("text, message", [
    ("sequence_length: [1, 2\n", "malformed YAML"),
    ("- 1\n- 2\n", "mapping"),
    ("", "mapping"),
])
def test_malformed_yaml(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        jaxroll.load_config(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        jaxroll.load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        jaxroll.load_config(tmp_path)


def _pyyaml(text):
    """The oracle: PyYAML alone (libyaml's parser), tabs read as spaces as read_yaml's second try does."""
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return yaml.load(text.replace("\t", " "), Loader=yaml.CSafeLoader)


def _long(item: str, count: int = 300) -> str:
    return ", ".join([item] * count)


@pytest.mark.parametrize("value", [
    f"[[{_long('0.25')}], [{_long('-1.5e-07')}]]",           # floats: the fast path
    f"[{_long('1.0')}, 2, -0, +3., .5, 4.5e+3]",              # ints among floats keep their type
    f"[[{_long('1.0')}], [{_long('1.0', 7)}]]",                # ragged: left for the schema to refuse
    f"[[{_long('1.0')}, 1e5, -.5]]",                          # strings in YAML 1.1, not numbers
    f"[[{_long('1.0')}, 010, 1_000]]",                        # octal and underscores: PyYAML's reading
    f"[[{_long('1.0')}, true, .nan, '2.0']]",                 # booleans, NaN, quoted numbers
    f"[[[{_long('1.0')}]]]",                                  # three levels: not a schema list
    f"[[{_long('1.0')}\t, 2.0\t]]",                           # the published files' tabs
    f"[[{_long('1.0')}]]  # a comment",
])
def test_long_number_lists_read_as_pyyaml_reads_them(value):
    text = f"sequence_length: 8\nattention_config:\n  num_heads: 1\n  alibi_slopes: {value}\nnum_layers: 2\n"
    expected = _pyyaml(text)
    assert jaxroll.io._parse_yaml(text) == expected
    assert repr(jaxroll.io._parse_yaml(text.replace("\t", " "))) == repr(_pyyaml(text.replace("\t", " ")))


@pytest.mark.parametrize("text", [
    f"note: |\n  alibi_slopes: [[{_long('1.0')}]]\n",             # inside a block string: stays text
    f"a: [[{_long('1.0')}]]\na: [[{_long('2.0')}]]\n",           # a key given twice: the last wins
    f"a: {{\n  b: [[{_long('1.0')}]]\n  }}\n",                    # a flow mapping over lines
    f"a: [\n  b: [[{_long('1.0')}]]\n  ]\n",                      # a mapping inside a flow list
    f"a: __jaxroll_list_0__\nb: [[{_long('1.0')}]]\n",           # the placeholder's own name
    f"true: [[{_long('1.0')}]]\n",                                # a key YAML reads as a boolean
])
def test_long_lists_in_unusual_places_read_as_pyyaml_reads_them(text):
    assert repr(jaxroll.io._parse_yaml(text)) == repr(_pyyaml(text))


def test_every_published_file_reads_as_pyyaml_reads_it():
    for path in ROLLOUT_CONFIGS:
        text = path.read_text(encoding="utf-8")
        assert repr(jaxroll.io._parse_yaml(text)) == repr(_pyyaml(text)), path


@pytest.mark.parametrize("value", [[[0.1 * k for k in range(300)]], [float(k) for k in range(250)],
                                   [[1e-05, 1e16, -2.5e-300, 0.0, -0.0, 3.0] * 50, [7.0] * 300]])
def test_long_lists_are_written_so_pyyaml_reads_the_same_values(value):
    config = {"a": 1, "b": {"c": value, "d": "x"}, "e": [[0.5, 2.0]]}
    text = jaxroll.io._dump_yaml(config)
    assert yaml.safe_load(text) == config  # PyYAML (the oracle) reads back every value exactly
    assert jaxroll.io._parse_yaml(text) == config
    assert max(len(line) for line in text.splitlines()) > 1000  # written on one line, by hand
