"""Property-based hostile inputs: generated configurations and profiles, valid and
mutated, through `load_config`, `read_profile` and the command line in-process.

The property: every input ends either in a `ConfigError` whose message is one
non-empty line, or in a valid profile (finite, >= 0, summing to 1 within
1e-12 in float64). No other exception type, and on failure no file written.
"""

import math
import tempfile
from pathlib import Path

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import jaxroll
from jaxroll import ConfigError
from jaxroll.cli import main

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Small shapes only: each distinct (N, T, H) compiles once, and the point is
# the checking, not the arithmetic.
LENGTHS, LAYERS, HEADS = (1, 5, 8), (1, 2, 3), (1, 2)

finite = st.floats(-20, 20, allow_nan=False)
unit = st.floats(0, 1, allow_nan=False)
hostile_numbers = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 1.5, -1e300, 1e300, 0.0])
hostile_values = st.one_of(
    hostile_numbers, st.text(max_size=5), st.none(), st.just([]), st.just([[]]), st.just({}),
    st.lists(finite, min_size=0, max_size=4), st.booleans(), st.integers(-3, 10**13))


@st.composite
def nested(draw, layers, heads, values=finite):
    outer = draw(st.sampled_from([1, layers]))
    inner = draw(st.sampled_from([1, heads]))
    return [[draw(values) for _ in range(inner)] for _ in range(outer)]


@st.composite
def valid_configs(draw):
    layers, heads, n = draw(st.sampled_from(LAYERS)), draw(st.sampled_from(HEADS)), draw(st.sampled_from(LENGTHS))
    mask = draw(st.sampled_from(["causal", "full", "sliding_window"]))
    kind = draw(st.sampled_from(["constant", "power_decay", "custom"]))
    schedule = {
        "constant": lambda: {"schedule_type": "constant", "lambda_const": draw(unit)},
        "power_decay": lambda: {"schedule_type": "power_decay", "lambda_0": draw(st.floats(0.01, 1)),
                                "beta": draw(st.floats(0, 3))},
        "custom": lambda: {"schedule_type": "custom", "lambdas_custom": [draw(unit) for _ in range(layers)]},
    }[kind]()
    return {
        "sequence_length": n,
        "num_layers": layers,
        "mask_config": {"mask_type": mask, "window_size": draw(st.integers(1, 4)) if mask == "sliding_window" else None},
        "attention_config": {
            "num_heads": heads,
            "alibi_slopes": draw(nested(layers, heads, st.floats(0, 5))),
            "head_weights": draw(st.one_of(st.none(), nested(layers, heads, st.floats(0.1, 2)))),
            "softmax_temperature": draw(st.floats(0.1, 10)),
        },
        "content_config": {"diagonal_scores": draw(nested(layers, heads)),
                           "base_scores": draw(nested(layers, heads))},
        "lambda_schedule_config": schedule,
        "save_dir": "./results",
    }


def _paths(config: dict) -> list[tuple[str, ...]]:
    found = []
    for key, value in config.items():
        found.append((key,))
        if isinstance(value, dict):
            found += [(key, *rest) for rest in _paths(value)]
    return found


@st.composite
def mutated_configs(draw):
    """A valid configuration with one thing broken, as text."""
    config = draw(valid_configs())
    how = draw(st.sampled_from(["replace", "delete", "unknown key", "truncate", "binary"]))
    if how in ("replace", "delete"):
        path = draw(st.sampled_from(_paths(config)))
        holder = config
        for key in path[:-1]:
            holder = holder[key]
        if how == "delete":
            del holder[path[-1]]
        else:
            holder[path[-1]] = draw(hostile_values)
    if how == "unknown key":
        config[draw(st.sampled_from(["model", "layers", "Sequence_Length"]))] = 1
    text = yaml.safe_dump(config, sort_keys=False)
    if how == "truncate":
        text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if how == "binary":
        return bytes(draw(st.lists(st.integers(128, 255), min_size=1, max_size=64)))
    return text.encode("utf-8")


def _check_message(error: ConfigError) -> None:
    message = str(error)
    assert message and "\n" not in message and "Traceback" not in message


def _check_profile(profile) -> None:
    profile = np.asarray(profile, dtype=np.float64)
    assert np.all(np.isfinite(profile)) and np.all(profile >= 0)
    assert abs(profile.sum() - 1) < 1e-12  # float64: T <= 3 layers of row-stochastic products


def _load_and_roll_out(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_bytes(data)
        try:
            model = jaxroll.load_config(path)
        except ConfigError as error:
            _check_message(error)
            return
        _check_profile(jaxroll.influence(model))


@SETTINGS
@given(valid_configs())
def test_valid_configurations_give_valid_profiles(config):
    # No ConfigError allowed here: a valid configuration must load.
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        _check_profile(jaxroll.influence(jaxroll.load_config(path)))


@SETTINGS
@given(mutated_configs())
def test_mutated_configurations_give_one_line_or_a_valid_profile(data):
    _load_and_roll_out(data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_command_line_exits_0_with_files_or_2_with_nothing_written(data):
    with tempfile.TemporaryDirectory() as directory:
        path, out = Path(directory) / "config.yaml", Path(directory) / "out"
        path.write_bytes(data)
        status = main(["rollout", str(path), "--out", str(out), "--float64"])
        assert status in (0, 2)
        if status == 2:
            assert not out.exists()
        else:
            _check_profile(jaxroll.read_profile(out / "profile.csv"))


rows = st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12)
cells = st.one_of(hostile_numbers.map(repr), st.text(max_size=4), st.just(""), st.integers(-2, 20).map(str))


@st.composite
def profile_texts(draw):
    values = draw(rows)
    lines = ["token_position,probability"] + [f"{k},{v!r}" for k, v in enumerate(values)]
    how = draw(st.sampled_from(["valid", "header", "cell", "truncate", "binary", "drop row"]))
    if how == "header":
        lines[0] = draw(st.sampled_from(["position,probability", "", "token_position", "a,b,c"]))
    if how == "cell":
        row = draw(st.integers(1, len(lines) - 1))
        column = draw(st.integers(0, 1))
        parts = lines[row].split(",")
        parts[column] = draw(cells)
        lines[row] = ",".join(parts)
    if how == "drop row" and len(lines) > 2:
        del lines[draw(st.integers(1, len(lines) - 2))]
    text = "\n".join(lines) + "\n"
    if how == "truncate":
        text = text[: draw(st.integers(0, len(text) - 1))]
    if how == "binary":
        return b"token_position,probability\n0," + bytes(draw(st.lists(st.integers(128, 255), min_size=1, max_size=8)))
    return text.encode()


@SETTINGS
@given(profile_texts())
def test_profiles_read_as_valid_arrays_or_one_line(data):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "profile.csv"
        path.write_bytes(data)
        try:
            profile = jaxroll.read_profile(path)
        except ConfigError as error:
            _check_message(error)
            return
        assert profile.ndim == 1 and profile.size >= 1
        assert np.all(np.isfinite(profile)) and np.all(profile >= 0)


# ---------------------------------------------------------------- issue 19: types, nesting, file-system targets

NUMERIC_KEYS = {"sequence_length", "num_layers", "num_heads", "window_size", "alibi_slopes", "head_weights",
                "softmax_temperature", "diagonal_scores", "base_scores", "lambda_const", "lambda_0", "beta",
                "lambdas_custom"}
NESTED_KEYS = {"alibi_slopes", "head_weights", "diagonal_scores", "base_scores"}


def _numeric_paths(config: dict) -> list[tuple[str, ...]]:
    return [path for path in _paths(config) if path[-1] in NUMERIC_KEYS
            and not (path[-1] == "window_size" and config["mask_config"]["mask_type"] != "sliding_window")]


def _set(config: dict, path, value) -> None:
    holder = config
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value


def _get(config: dict, path):
    for key in path:
        config = config[key]
    return config


@st.composite
def mistyped_configs(draw):
    """A valid configuration with one numeric field made a boolean, a quoted number, a ragged
    list or a deeper nesting: ``(text, field)``; every one of them must be refused naming the field."""
    config = draw(valid_configs())
    path = draw(st.sampled_from(_numeric_paths(config)))
    value = _get(config, path)
    how = draw(st.sampled_from(["boolean", "quoted", "boolean inside", "quoted inside", "ragged", "deeper"]))
    if how in ("boolean inside", "quoted inside", "ragged") and not isinstance(value, list):
        how = "boolean"
    if how == "boolean":
        value = draw(st.booleans())
    elif how == "quoted":
        value = str(draw(st.one_of(st.floats(0.01, 1), st.integers(1, 4))))
    elif how in ("boolean inside", "quoted inside"):
        flat = value if not isinstance(value[0], list) else value[draw(st.integers(0, len(value) - 1))]
        k = draw(st.integers(0, len(flat) - 1))
        flat[k] = draw(st.booleans()) if how == "boolean inside" else repr(float(flat[k]))
    elif how == "ragged":
        row = value[0] if isinstance(value[0], list) else value
        value = [row, row + [0.5]] if isinstance(value[0], list) else [row, 0.5]
    else:
        depth = draw(st.integers(1, 200))
        for _ in range(depth if path[-1] in NESTED_KEYS else max(depth, 1)):
            value = [value]
        if path[-1] == "lambdas_custom" and depth == 1 and len(_get(config, path)) == 1:
            value = [value, value]  # [[x]] would be 2-D anyway; keep it ragged-free but 2-D
    if how not in ("boolean inside", "quoted inside"):
        _set(config, path, value)
    return yaml.safe_dump(config, sort_keys=False), path[-1], how


@SETTINGS
@given(mistyped_configs())
def test_booleans_quoted_numbers_ragged_and_deeper_lists_are_refused_naming_the_field(case):
    text, field, how = case
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_text(text)
        try:
            model = jaxroll.load_config(path)
        except ConfigError as error:
            _check_message(error)
            assert field in str(error), (how, str(error))
            return
        raise AssertionError(f"{how} in {field} loaded silently: {model}")


SMALL_CONFIG = ("sequence_length: 4\nnum_layers: 1\nattention_config: {num_heads: 1, alibi_slopes: [[0.5]]}\n"
                "lambda_schedule_config: {schedule_type: constant, lambda_const: 0.5}\n")


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@st.composite
def file_system_targets(draw):
    """Where CONFIG and --out point: files, directories, missing paths, paths through files, /proc."""
    config = draw(st.sampled_from(["config.yaml", "missing.yaml", "folder", "file.csv/config.yaml"]))
    out = draw(st.sampled_from(["new", "new/deeper", "file.csv", "file.csv/sub", "file.csv/sub/deeper",
                                "folder", "empty", "/proc/jaxroll-nope", "/proc/self/nope", "config.yaml"]))
    return config, out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(file_system_targets())
def test_file_system_targets_write_or_refuse_in_one_line_changing_nothing(targets):
    import contextlib
    import io

    config, out = targets
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "config.yaml").write_text(SMALL_CONFIG)
        (root / "file.csv").write_text("token_position,probability\n0,1.0\n")
        (root / "folder").mkdir()
        (root / "folder" / "mine.txt").write_text("keep")
        (root / "empty").mkdir()
        before = _tree(root)
        out_path = Path(out) if out.startswith("/") else root / out
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            status = main(["rollout", str(root / config), "--out", str(out_path)])
        message = stderr.getvalue().strip()
        if status == 0:
            assert config == "config.yaml" and (out_path / "profile.csv").is_file()
            _check_profile(jaxroll.read_profile(out_path / "profile.csv"))
        else:
            assert status == 2 and len(message.splitlines()) == 1 and message.startswith("jaxroll: error: ")
            assert _tree(root) == before, message  # nothing created, nothing changed
