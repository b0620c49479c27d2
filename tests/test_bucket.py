"""Compiling less (jaxroll.bucket): identity layers and zero-weight heads pad
models to shared shapes, exactly; the 33 published configurations then
compile a handful of programs.

Oracles: the unpadded rollout (padding must not change it) and the plain
NumPy float64 rollout of tests/oracle.py. Tolerance 1e-12 (float64): padding
adds exact zeros to the head sums and identity layers, so the profiles agree
to rounding of O(T) operations on values <= 1.
"""

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxroll
import oracle
from jaxroll import bucket

COMPILE = "/jax/core/compile/backend_compile_duration"  # one per XLA compilation (or persistent-cache look-up)


def test_the_ladder_is_the_smallest_power_of_two_or_one_and_a_half_times_one():
    ladder = sorted({2 ** k for k in range(12)} | {3 * 2 ** k for k in range(11)})
    for size in range(1, 1025):
        assert bucket.bucket(size) == min(x for x in ladder if x >= size)
    assert [bucket.bucket(s) for s in (30, 32, 36, 48, 64, 70, 112)] == [32, 32, 48, 48, 64, 96, 128]
    with pytest.raises(ValueError):
        bucket.bucket(0)


def random_model(rng, layers, heads, mask="causal", window=None):
    return jaxroll.RolloutModel.create(
        num_layers=layers, num_heads=heads, lambdas=rng.uniform(0, 1, layers),
        alibi_slopes=rng.uniform(0, 0.5, (layers, heads)), diagonal_scores=rng.normal(0, 3, (layers, heads)),
        base_scores=rng.normal(0, 1, (layers, heads)), head_weights=rng.uniform(0.1, 1, (layers, heads)),
        temperature=rng.uniform(0.5, 2), mask=mask, window=window, sequence_length=40)


def oracle_arrays(model):
    return {"lambdas": np.asarray(model.lambdas), "slopes": np.asarray(model.alibi_slopes),
            "diagonal": np.asarray(model.diagonal_scores), "base": np.asarray(model.base_scores),
            "weights": np.asarray(model.head_weights), "temperature": float(model.temperature),
            "mask": model.mask, "window": model.window}


@pytest.mark.parametrize("mask, window", [("causal", None), ("sliding", 7), ("full", None)])
@pytest.mark.parametrize("layers, heads", [(5, 3), (7, 1), (13, 5)])
def test_padding_leaves_the_profile_unchanged(layers, heads, mask, window, method="structured"):
    rng = np.random.default_rng(layers * 100 + heads)
    model = random_model(rng, layers, heads, mask, window)
    padded = bucket.pad(model)
    assert (padded.num_layers, padded.num_heads) == (bucket.bucket(layers), bucket.bucket(heads))
    expected = oracle.influence(oracle_arrays(model), 40)
    expected /= expected.sum()
    for method in ("structured", "dense"):
        unpadded = np.asarray(jaxroll.influence(model, method=method))
        np.testing.assert_allclose(np.asarray(jaxroll.influence(padded, method=method)), unpadded, rtol=0, atol=1e-12)
        np.testing.assert_allclose(unpadded, expected, rtol=0, atol=1e-12)
    p, mass = bucket.influence_with_mass(model)
    np.testing.assert_allclose(np.asarray(p), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(float(mass), 1.0, rtol=0, atol=1e-12)


def test_padding_to_an_explicit_shape_and_refusing_a_smaller_one():
    model = random_model(np.random.default_rng(0), 3, 2)
    padded = bucket.pad(model, 10, 9)
    assert padded.lambdas.shape == (10,) and padded.head_weights.shape == (10, 9)
    assert np.all(np.asarray(padded.lambdas)[3:] == 0) and np.all(np.asarray(padded.head_weights)[:, 2:] == 0)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(padded)), np.asarray(jaxroll.influence(model)),
                               rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        bucket.pad(model, 2, 2)


@pytest.mark.slow  # 33 + 6 compilations' worth; benchmarks/process.py runs the 33 and counts compilations
def test_the_33_published_configurations_compile_four_programs_and_match_unpadded():
    files = jaxroll.published.rollout_files()
    models = [jaxroll.load_config(path) for path in files]
    assert len(models) == 33
    shapes = {(bucket.bucket(m.num_layers), bucket.bucket(m.num_heads), m.sequence_length) for m in models}
    assert len(shapes) == 4  # (32, 32, 256), (48, 64, 256), (96, 128, 256), (64, 1, 64)
    events = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(lambda event, duration, **_: events.update([event]))
    jax.clear_caches()  # count from an empty in-memory cache, whatever ran before in this process
    padded = [np.asarray(bucket.influence_with_mass(model)[0]) for model in models]
    compiled = events[COMPILE]
    assert compiled == len(shapes), compiled
    for model, profile in zip(models, padded):
        np.testing.assert_allclose(profile, np.asarray(jaxroll.influence(model)), rtol=0, atol=1e-12)
    # Models that differ only in values share a program: all of them again compile nothing.
    before = events[COMPILE]
    for model in models:
        bucket.influence_with_mass(model)
    assert events[COMPILE] == before


def test_the_batch_command_writes_each_config_and_compiles_a_handful(tmp_path):
    root = jaxroll.published.ROOT / "rollout"
    files = [root / "example.yaml", root / "alibi/no_content/mpt-7b.yaml", root / "alibi/no_content/bloom-7b1.yaml",
             root / "alibi/all_content/dclm/bloom-7b1.yaml"]
    environment = {**os.environ, "JAXROLL_NO_CACHE": "1"}  # count compilations, not cache hits
    result = subprocess.run([sys.executable, str(Path(__file__).parent / "cache_worker.py"), "rollout",
                             *map(str, files), "--float64", "--no-figure", "--out", str(tmp_path / "out")],
                            env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    events = json.loads(result.stdout.strip().splitlines()[-1])["events"]
    # (64, 1, 64) for example.yaml and (32, 32, 256) for the three others, whose T are 32, 30, 30:
    # two programs; the command itself may compile a few small helpers besides.
    names = {"example", "alibi-no_content-mpt-7b", "alibi-no_content-bloom-7b1", "alibi-all_content-dclm-bloom-7b1"}
    assert {p.name for p in (tmp_path / "out").iterdir()} == names
    assert events.get(COMPILE, 0) <= 4, events
    for path in files:
        name = "-".join(path.relative_to(root).with_suffix("").parts)
        assert {p.name for p in (tmp_path / "out" / name).iterdir()} == {"profile.csv", "config.yaml"}  # --no-figure
        written = jaxroll.read_profile(tmp_path / "out" / name / "profile.csv")
        assert len(written) == jaxroll.load_config(path).sequence_length
        expected = oracle.influence(oracle.config_arrays(oracle.read_config(path)), len(written))
        # float64 written with repr: the oracle's 1e-12.
        np.testing.assert_allclose(written, expected / expected.sum(), rtol=0, atol=1e-12)


def test_the_batch_command_refuses_before_writing(tmp_path, capsys):
    from jaxroll.cli import main

    root = jaxroll.published.ROOT / "rollout"
    out = tmp_path / "out"
    assert main(["rollout", str(root / "example.yaml"), str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert main(["rollout", str(root / "example.yaml"), str(root / "example.yaml"), "--out", str(out)]) == 2
    assert main(["rollout", str(root / "example.yaml"), str(root / "example.yaml"), "--published", "mpt-7b",
                 "--out", str(out)]) == 2
    assert not out.exists()
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 3 and all(line.startswith("jaxroll: error: ") for line in errors)
