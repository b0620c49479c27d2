"""`jaxroll effect` and `jaxroll score` as a user runs them once (issue 55, item 5: under 1 s with their figures).

- the processes load neither JAX nor torch nor pyplot (nor SciPy or pandas),
  and run on one BLAS thread unless the user set a count;
- one BLAS thread gives the numbers that two give, bit for bit (the oracle:
  the same command on two threads);

Speed itself is measured by benchmarks/latency.py, never asserted here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_LOADED = ("jax", "jaxlib", "torch", "transformers", "equinox", "matplotlib.pyplot", "scipy", "pandas")

# The command line as `python -m jaxroll ARGS` runs it (sys.argv set before jaxroll.cli is imported), then a
# report of the process on stderr.
_COMMAND_LINE = """
import json, os, runpy, sys
sys.argv = ["jaxroll", *sys.argv[1:]]
try:
    runpy.run_module("jaxroll", run_name="__main__", alter_sys=True)
except SystemExit as exit:
    status = exit.code
print(json.dumps({"status": status, "loaded": [m for m in %r if m in sys.modules],
                  "blas": os.environ.get("OPENBLAS_NUM_THREADS")}),
      file=sys.stderr)
""" % (NOT_LOADED,)


def _command_line(*arguments, environment=None):
    """``jaxroll ARGUMENTS`` in a fresh process: (its report, its stdout)."""
    env = {"PYTHONPATH": str(ROOT), "JAXROLL_NO_CACHE": "1", "PATH": "/usr/bin:/bin", **(environment or {})}
    process = subprocess.run([sys.executable, "-c", _COMMAND_LINE, *map(str, arguments)], capture_output=True,
                             text=True, env=env, timeout=300)
    *_, last = process.stderr.strip().splitlines()
    return json.loads(last), process.stdout


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A baseline (with an ALiBi config.yaml) and an intervened measurement of S = 10 sequences at N = 20, and a
    predicted profile: the arguments of effect and score."""
    root = tmp_path_factory.mktemp("figure-latency")
    rng = np.random.default_rng(5)
    n, s = 20, 10
    shape = np.exp(-np.linspace(0, 3, n)) + np.exp(np.linspace(-3, 0, n))
    tokens = rng.integers(0, 1000, size=(s, n))
    folders = []
    for name, profile, change in (("b", shape, None), ("i", shape[::-1], {"tau": 0.7})):
        folder = root / name
        folder.mkdir()
        np.savez(folder / "measurement.npz", influence_per_sequence=rng.dirichlet(profile * 30, size=s),
                 token_ids=tokens)
        (folder / "metadata.json").write_text(json.dumps({"model": "tiny", "num_layers": 2, "num_heads": 2,
                                                          "interventions": change}))
        folders.append(folder)
    (folders[0] / "config.yaml").write_text(
        f"sequence_length: {n}\nnum_layers: 2\n"
        "attention_config: {num_heads: 2, alibi_slopes: [[0.5, 0.125]], head_weights: null, softmax_temperature: 1.0}\n"
        "content_config: {diagonal_scores: [[1.5]], base_scores: [[0.0]]}\n"
        "lambda_schedule_config: {schedule_type: custom, lambdas_custom: [0.6, 0.4]}\n")
    predicted = root / "p.csv"
    predicted.write_text("token_position,probability\n" + "".join(
        f"{j},{float(v)!r}\n" for j, v in enumerate(shape / shape.sum())))
    effect = ["effect", "--measured", folders[0], "--measured", folders[1], "--predicted", predicted,
              "--resamples", 200]
    score = ["score", predicted, "--measured", folders[1], "--resamples", 200]
    return root, effect, score


def test_effect_and_score_with_figures_load_no_jax_torch_pyplot_scipy_or_pandas(measured):
    root, effect, score = measured
    for name, arguments in (("effect", [*effect, "--out", root / "effect"]),
                            ("score", [*score, "--out", root / "score"])):
        report, _ = _command_line(*arguments)
        assert report == {"status": 0, "loaded": [], "blas": "1"}, name
        assert (root / name / f"{name}.png").stat().st_size > 0


def test_a_blas_thread_count_the_user_set_is_kept(measured):
    _, _, score = measured
    report, _ = _command_line(*score, environment={"OPENBLAS_NUM_THREADS": "2"})
    assert report["status"] == 0 and report["blas"] == "2"
    report, _ = _command_line("design", "--help")  # not a NumPy command: left alone
    assert report["status"] == 0 and report["blas"] is None


def test_one_blas_thread_gives_the_numbers_of_two(measured):
    root, effect, score = measured
    for arguments in ([*effect, "--out", root / "effect-json", "--force", "--json"], [*score, "--json"]):
        outputs = []
        for threads in ("2", None):
            report, out = _command_line(*arguments, environment={"OPENBLAS_NUM_THREADS": threads} if threads else {})
            assert report["status"] == 0 and report["blas"] == (threads or "1")
            outputs.append(json.loads(out))
        assert outputs[0] == outputs[1]


_DRAW = """
import sys
if sys.argv[1] == "usual":  # matplotlib loaded before jaxroll.plot: its own docstrings, as usual
    import matplotlib.backends.backend_agg, matplotlib.figure
import numpy as np
from jaxroll.plot import plot_effect, plot_prediction_against_measurement
from matplotlib.lines import Line2D
n = 30
x = np.linspace(0, 1, n)
base, changed = np.exp(-6 * x) + np.exp(6 * (x - 1)) + 0.1, np.exp(-3 * x) + 2 * np.exp(6 * (x - 1)) + 0.1
base, changed = base / base.sum(), changed / changed.sum()
band = np.stack([0.8 * base, 1.2 * base])
plot_effect(sys.argv[2] + "/effect.png", base, changed, 0.5 * (base + changed), predicted_baseline=base,
            bands=(band, None), change_band=np.stack([changed - base - 0.01, changed - base + 0.01]),
            name="tau=0.7", sequences=(12, 12), title="first line\\nsecond line")
plot_prediction_against_measurement(sys.argv[2] + "/score.png", changed, base, band=band, title="a score")
print("Properties:" in (Line2D.set.__doc__ or ""))
"""
