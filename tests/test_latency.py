"""One-off calls answered without JAX where they can be (issue 55, item 5).

- `jaxroll.numpy_rollout` (the small-N NumPy float64 rollout) equals the JAX
  engine in float64 to 1e-12 on the 33 published rollout configurations, and
  takes no file that `jaxroll.io.load_config` refuses;
- `jaxroll rollout` on a small ALiBi file, `jaxroll effect` and `jaxroll score`
  run in processes that never import JAX or torch, and write what the JAX path
  writes;
- every command refuses a bad argument (unknown flag, bad value, missing file)
  in one line, exit status 2, before JAX or torch is imported; ``--help`` too.

Oracles: the JAX engine in float64 (`jaxroll.influence_with_mass`, the
structured products: another algorithm), a NumPy rollout written here from
the definition, ``sys.modules`` of a fresh process.
"""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "jaxroll" / "data" / "published" / "rollout"
EXAMPLE = PUBLISHED / "example.yaml"
# The 33 published rollout configurations at N = 256 (the authors' rollout.sh, and their example).
CONFIGS = sorted(path for path in PUBLISHED.rglob("*.yaml") if "_2048" not in str(path))
HEAVY = ("jax", "torch", "equinox", "transformers")


def test_there_are_33_published_configurations():
    assert len(CONFIGS) == 33


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: str(path.relative_to(PUBLISHED)))
def test_the_numpy_rollout_equals_the_jax_engine_in_float64(path):
    """Profile and mass at N = 32 (the published kernels, shortened: seconds a file) to 1e-12 of the profile's
    largest entry; the JAX side is the structured O(H N) products, not a dense matrix."""
    import jax

    import jaxroll
    from jaxroll import numpy_rollout

    small = numpy_rollout.read_config(path)
    assert small is not None and small.kind == "alibi"
    profile, mass = numpy_rollout.influence_with_mass(small, 32)
    with jax.enable_x64(True):
        model = dataclasses.replace(jaxroll.load_config(path), sequence_length=32)
        expected, expected_mass = (np.asarray(x, dtype=np.float64) for x in jaxroll.influence_with_mass(model))
    assert profile.dtype == np.float64 and profile.shape == (32,)
    np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-12 * expected.max())
    assert mass == pytest.approx(float(expected_mass), abs=1e-12)


def dense_oracle(slopes, diagonal, weights, lambdas, n, tau=1.0, starts=None):
    """Rows ``e_q^T R_T ... R_1`` from the definition (NumPy float64): per head ``rowsoftmax((-m (i - j) + d [i = j])
    / tau)`` on j <= i, heads weighted by ``w / sum w``, ``R_t = (1 - lambda_t) I + lambda_t A_t``."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    product = np.eye(n)
    for t, lam in enumerate(lambdas):
        kernel = np.zeros((n, n))
        for m, d, w in zip(slopes[t], diagonal[t], weights[t] / weights[t].sum()):
            scores = np.where(j <= i, (-m * (i - j) + d * (i == j)) / tau, -np.inf)
            e = np.exp(scores - scores.max(axis=1, keepdims=True))
            kernel += w * e / e.sum(axis=1, keepdims=True)
        product = ((1 - lam) * np.eye(n) + lam * kernel) @ product  # layer t acts after layers < t
    return product if starts is None else product[starts]


def test_the_numpy_rollout_equals_the_definition_per_layer_and_head():
    from jaxroll import numpy_rollout

    rng = np.random.default_rng(0)
    slopes, diagonal = rng.uniform(0, 1, (3, 2)), rng.normal(0, 1, (3, 2))
    weights, lambdas = rng.uniform(0.1, 1, (3, 2)), np.array([0.3, 0.9, 0.5])
    model = numpy_rollout.SmallModel(lambdas=lambdas, sequence_length=12, kind="alibi", alibi_slopes=slopes,
                                     diagonal_scores=diagonal, base_scores=np.zeros((3, 2)), head_weights=weights,
                                     temperature=0.8)
    rows = numpy_rollout.rollout_rows(model, np.eye(12)[[4, 11]])
    np.testing.assert_allclose(rows, dense_oracle(slopes, diagonal, weights, lambdas, 12, 0.8, [4, 11]), atol=1e-14)
    profile, mass = numpy_rollout.influence_with_mass(model)
    np.testing.assert_allclose(profile * mass, rows[1], atol=1e-15)
    assert numpy_rollout.is_small(model) and not numpy_rollout.is_small(model, 4096)


def _variants():
    """Configurations `load_config` refuses, each a change of the example (name, change)."""
    def set_(path, value):
        def change(config):
            *parents, key = path.split(".")
            node = config
            for parent in parents:
                node = node[parent]
            if value is KeyError:
                del node[key]
            else:
                node[key] = value
        return change

    return {
        "unknown key": set_("extra", 1), "missing layers": set_("num_layers", KeyError),
        "zero layers": set_("num_layers", 0), "boolean layers": set_("num_layers", True),
        "null length": set_("sequence_length", None), "zero length": set_("sequence_length", 0),
        "negative slope": set_("attention_config.alibi_slopes", [[-1.0]]),
        "string slope": set_("attention_config.alibi_slopes", [["1.0"]]),
        "ragged slopes": set_("attention_config.alibi_slopes", [[1.0], [1.0, 2.0]]),
        "too many heads": set_("attention_config.alibi_slopes", [[1.0, 2.0]]),
        "too many layers": set_("content_config.diagonal_scores", [[0.0]] * 3),
        "nan content": set_("content_config.base_scores", [[float("nan")]]),
        "zero temperature": set_("attention_config.softmax_temperature", 0.0),
        "listed temperature": set_("attention_config.softmax_temperature", [1.0]),
        "zero weights": set_("attention_config.head_weights", [[0.0]]),
        "unknown mask": set_("mask_config.mask_type", "banded"),
        "window missing": set_("mask_config.mask_type", "sliding_window"),
        "lambda above 1": set_("lambda_schedule_config.lambda_const", 1.5),
        "unknown schedule": set_("lambda_schedule_config.schedule_type", "linear"),
        "schedule key": set_("lambda_schedule_config.lambda_0", 0.5),
        "power lambda 0": set_("lambda_schedule_config", {"schedule_type": "power_decay", "lambda_0": 0.0, "beta": 1}),
        "negative beta": set_("lambda_schedule_config", {"schedule_type": "power_decay", "lambda_0": 0.5, "beta": -1}),
        "custom length": set_("lambda_schedule_config", {"schedule_type": "custom", "lambdas_custom": [0.5]}),
        "missing attention": set_("attention_config", KeyError),
        "num_heads zero": set_("attention_config.num_heads", 0),
        "section not a mapping": set_("content_config", [1]),
        "kernel and sections": set_("kernel_config", {"kernel_type": "dense", "file": "k.npz"}),
    }


@pytest.mark.parametrize("name", sorted(_variants()))
def test_a_file_load_config_refuses_is_never_read_in_numpy(name, tmp_path):
    import jaxroll
    from jaxroll import numpy_rollout

    config = yaml.safe_load(EXAMPLE.read_text())
    config["num_layers"] = 2
    _variants()[name](config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(jaxroll.ConfigError):
        jaxroll.load_config(path)
    assert numpy_rollout.read_config(path) is None


def test_a_dense_kernel_file_is_rolled_out_as_the_engine_does(tmp_path):
    import jax

    import jaxroll
    from jaxroll import numpy_rollout

    rng = np.random.default_rng(1)
    kernels = np.tril(rng.uniform(0.1, 1, (3, 10, 10)))
    kernels /= kernels.sum(axis=-1, keepdims=True)
    model = jaxroll.RolloutModel.create(kernel=jaxroll.DenseKernel.create(kernels), lambdas=[0.2, 0.7, 0.5])
    jaxroll.save_config(model, tmp_path / "config.yaml")
    small = numpy_rollout.read_config(tmp_path / "config.yaml")
    assert small.kind == "dense" and small.check_length(7) and not small.check_length(11)
    from jaxroll.engine import dense

    assert numpy_rollout._DENSE_TOLERANCE == dense.ROW_SUM_TOLERANCE  # the same rows refused
    with jax.enable_x64(True):
        expected = np.asarray(jaxroll.influence_with_mass(dataclasses.replace(model, sequence_length=7))[0])
    np.testing.assert_allclose(numpy_rollout.influence_with_mass(small, 7)[0], expected, atol=1e-14)


def _fresh(code: str, *arguments, cwd=None) -> subprocess.CompletedProcess:
    """`code` in a fresh Python process (this checkout first on the path); it prints what it must."""
    environment = {"PYTHONPATH": str(ROOT), "JAXROLL_NO_CACHE": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code, *map(str, arguments)], capture_output=True, text=True,
                          cwd=cwd, env=environment, timeout=300)


_MAIN = """
import sys
from jaxroll.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "heavy": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""".replace("import sys", "import json, sys") % (HEAVY,)


def _run_fresh(*arguments, cwd=None):
    process = _fresh(_MAIN, *arguments, cwd=cwd)
    *lines, last = process.stderr.strip().splitlines()
    return json.loads(last), process.stdout, lines


def test_a_small_rollout_imports_no_jax_and_writes_what_the_jax_path_writes(tmp_path):
    """The example (N = 64, T = 64): profile.csv within 1e-12 of ``--float64 --method dense`` (the JAX path),
    config.yaml the same text, the summary's numbers the same; profile.png drawn."""
    run, out, _ = _run_fresh("rollout", EXAMPLE, "--out", tmp_path / "numpy", "--json")
    assert run == {"status": 0, "heavy": []}
    fast = json.loads(out)
    run, out, _ = _run_fresh("rollout", EXAMPLE, "--out", tmp_path / "jax", "--json", "--float64", "--method", "dense")
    assert run["status"] == 0 and "jax" in run["heavy"]
    slow = json.loads(out)
    numbers = [key for key, value in slow.items() if isinstance(value, float)]
    assert {key: fast[key] for key in fast if key not in numbers + ["out"]} == {
        key: slow[key] for key in slow if key not in numbers + ["out"]}
    for key in numbers:
        assert fast[key] == pytest.approx(slow[key], rel=1e-12, abs=1e-15), key
    read = {name: np.loadtxt(tmp_path / name / "profile.csv", delimiter=",", skiprows=1)[:, 1] for name in ("numpy", "jax")}
    np.testing.assert_allclose(read["numpy"], read["jax"], rtol=0, atol=1e-12 * read["jax"].max())
    assert (tmp_path / "numpy" / "config.yaml").read_text() == (tmp_path / "jax" / "config.yaml").read_text()
    assert (tmp_path / "numpy" / "profile.png").stat().st_size > 0


def _measurement(directory: Path, rows, tokens, interventions=None) -> Path:
    directory.mkdir()
    np.savez(directory / "measurement.npz", influence_per_sequence=rows, token_ids=tokens)
    (directory / "metadata.json").write_text(json.dumps({"model": "tiny", "num_layers": 3, "num_heads": 2,
                                                         "interventions": interventions}))
    return directory


@pytest.fixture
def measured(tmp_path):
    """A baseline (with an ALiBi config.yaml) and an intervened measurement of S = 12 sequences at N = 24."""
    import jaxroll

    rng = np.random.default_rng(3)
    n, s = 24, 12
    tokens = rng.integers(0, 1000, size=(s, n))
    shape = np.exp(-np.linspace(0, 4, n)) + np.exp(np.linspace(-4, 0, n))
    baseline = _measurement(tmp_path / "b", rng.dirichlet(shape * 40, size=s), tokens)
    intervened = _measurement(tmp_path / "i", rng.dirichlet(shape[::-1] * 40, size=s), tokens, {"tau": 0.7})
    jaxroll.save_config(jaxroll.RolloutModel.create(num_layers=3, num_heads=2, alibi_slopes=[0.5, 0.125],
                                                    diagonal_scores=1.5, lambdas=[0.6, 0.4, 0.7],
                                                    sequence_length=n), baseline / "config.yaml")
    predicted = tmp_path / "p.csv"
    profile = shape / shape.sum()
    predicted.write_text("token_position,probability\n" + "".join(f"{j},{float(v)!r}\n" for j, v in enumerate(profile)))
    return tmp_path, baseline, intervened, predicted


def test_effect_and_score_import_neither_jax_nor_torch(measured):
    root, baseline, intervened, predicted = measured
    run, _, err = _run_fresh("effect", "--measured", baseline, "--measured", intervened, "--predicted", predicted,
                             "--out", root / "effect", "--resamples", 50)
    assert run == {"status": 0, "heavy": []}, err
    assert (root / "effect" / "effect.png").is_file()
    run, _, err = _run_fresh("score", predicted, "--measured", intervened, "--out", root / "score", "--resamples", 50)
    assert run == {"status": 0, "heavy": []}, err
    assert (root / "score" / "score.png").is_file()


def test_effects_baseline_rollout_equals_the_jax_rollout_in_float64(measured):
    """`baseline_prediction` (now NumPy) against the JAX float64 rollout of the same config.yaml: 1e-12."""
    import jax

    import jaxroll
    from jaxroll.measure.effect import baseline_prediction

    _, baseline, _, _ = measured
    profile = baseline_prediction(baseline, 24)
    with jax.enable_x64(True):
        expected = np.asarray(jaxroll.influence(jaxroll.load_config(baseline / "config.yaml")), dtype=np.float64)
    np.testing.assert_allclose(profile, expected / expected.sum(), rtol=0, atol=1e-12 * expected.max())
    slopes, diagonal = np.array([[0.5, 0.125]] * 3), np.full((3, 2), 1.5)
    oracle = dense_oracle(slopes, diagonal, np.ones((3, 2)), [0.6, 0.4, 0.7], 24, starts=[23])[0]
    np.testing.assert_allclose(profile, oracle / oracle.sum(), atol=1e-14)


MISSING = "/nonexistent/missing"
BAD_ARGUMENTS = {
    # command: (a bad value, a missing file or folder)
    "rollout": (["--length", "0"], [MISSING + ".yaml"]),
    "presets": (["--json", "extra"], None),
    "measure": (["--texts", "t", "--length", "0", "--samples", "1", "--out", "o", "m"],
                [MISSING, "--texts", str(ROOT / "README.md"), "--length", "8", "--samples", "1", "--out", "o"]),
    "compare": (["a.csv", "b.csv", "--fraction", "x"], [MISSING + "a.csv", MISSING + "b.csv"]),
    "forces": (["--preset", "gpt"], [MISSING + ".yaml"]),
    "fit": (["--steps", "0", "p.csv"], [MISSING + ".yaml", MISSING + ".csv"]),
    "fit-kernel": (["--family", "cubic"], [MISSING + ".yaml"]),
    "design": (["--free", "bogus=global", "--target", "flat"], [MISSING + ".yaml", "--free", "tau=global",
                                                                "--target", "flat"]),
    "sweep": (["s.yaml", "--out"], [MISSING + ".yaml"]),
    "kinetic": (["--beta", "x"], None),
    "score": (["p.csv", "--measured", "m", "--resamples", "0"], [MISSING + ".csv", "--measured", MISSING]),
    "effect": (["--measured", "a", "--measured", "b", "--predicted", "p.csv", "--level", "x"],
               ["--measured", MISSING, "--measured", MISSING + "2", "--predicted", MISSING + ".csv"]),
    "cache": (["sideways"], None),
    "task": (["m", "--out", "o", "--dtype", "int8"], [MISSING, "--out", "o"]),
    "compare-task": (["t", "--score", "guess"], [MISSING]),
    "series": (["--measured", "m", "--title"], ["--measured", MISSING]),
    "predict-rows": (["--measured", "m", "--intervene", "tau=2", "--batch-size", "0"],
                     ["--measured", MISSING, "--intervene", "tau=2"]),
}
"""Per command, a bad value and (where it reads files before loading a model) a missing input; measure and task
refuse a missing MODEL_DIR before torch loads (`_common.check_model_folder`, the loader's words)."""

_REFUSALS = """
import contextlib, io, json, sys
from jaxroll.cli import main
cases = json.loads(sys.argv[1])
results = []
for argv in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit:  # --help
            status = exit.code
    results.append([argv, status, err.getvalue(), [m for m in %r if m in sys.modules]])
print(json.dumps(results))
""" % (HEAVY,)


def test_every_command_refuses_bad_arguments_before_jax_or_torch(tmp_path):
    """Unknown flag, bad value, missing file: one line, exit status 2, nothing heavy imported, for every command
    (and ``--help``, exit 0); one process runs them in turn, so the first heavy import fails every case after it."""
    from jaxroll.cli import _build_parser

    commands = sorted(_build_parser()._subparsers._group_actions[0].choices)
    assert sorted(BAD_ARGUMENTS) == commands
    cases = []
    for command, (bad_value, missing) in BAD_ARGUMENTS.items():
        cases += [[command, "--no-such-flag"], [command, *bad_value]] + ([[command, *missing]] if missing else [])
    cases += [[command, "--help"] for command in commands]
    process = _fresh(_REFUSALS, json.dumps(cases), cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    for argv, status, err, heavy in json.loads(process.stdout):
        assert heavy == [], (argv, heavy)
        if argv[-1] == "--help":
            assert status == 0, argv
            continue
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and lines[0].startswith("jaxroll: error:"), (argv, status, err)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_built_in_names_are_the_registrys():
    from jaxroll import interventions
    from jaxroll.cli import _names

    assert _names.INTERVENTIONS == tuple((kind.name, tuple(kind.options)) for kind in interventions.intervention_types())
    assert _names.DESIGNABLE == tuple((kind.name, tuple(float(x) for x in kind.box))
                                      for kind in interventions.designable())


@pytest.mark.parametrize("n", [1, 4, 5, 9, 10, 15, 25, 64, 256, 1001])
def test_the_jax_free_edge_counts_are_metrics_edge_count(n):
    from jaxroll import metrics
    from jaxroll.plot._canvas import edge_count

    assert edge_count(n) == metrics.edge_count(n) and edge_count(n, 0.25) == metrics.edge_count(n, 0.25)
    assert max(1, round(0.1 * n)) == metrics.edge_count(n)  # jaxroll/cli/rollout.py's summary


def test_the_cache_is_enabled_without_importing_jax(tmp_path):
    """Before JAX loads, `jaxroll.cache.enable` sets JAX's environment variables; JAX then reads them."""
    code = """
import sys
from jaxroll import cache
folder = cache.enable(sys.argv[1])
assert "jax" not in sys.modules
import jax
print(jax.config.jax_compilation_cache_dir == str(folder), jax.config.jax_persistent_cache_min_compile_time_secs,
      jax.config.jax_persistent_cache_min_entry_size_bytes)
"""
    process = _fresh(code, tmp_path / "cache")
    assert process.stdout.split() == ["True", "0.0", "-1"], process.stderr


def test_a_large_file_takes_the_jax_path():
    """BLOOM-176B with per-head content at N = 256 forms 7,840 head kernels: not small; JAX runs it."""
    from jaxroll import numpy_rollout

    small = numpy_rollout.read_config(PUBLISHED / "alibi" / "all_content" / "fineweb-edu" / "bloom.yaml")
    assert small is not None and not numpy_rollout.is_small(small)
