"""A series over training (issue 44): `jaxroll measure` over checkpoints, the series/ summary, `jaxroll series`.

Tiny BLOOMs built from config objects with different seeds stand for the
checkpoints of one run, saved with a word-level tokenizer as
``checkpoint-0`` and ``checkpoint-5`` (the Hugging Face Trainer's layout):
no network. The oracles are independent of the series code: a separate
``jaxroll measure`` per checkpoint, the NumPy float64 rollout of
tests/oracle.py on the written config.yaml, and the summary statistics
written out here in NumPy from their definitions.
"""

import csv
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import oracle  # noqa: E402
import transformers  # noqa: E402
from tiny_tokenizer import word_level_tokenizer, word_texts  # noqa: E402

import jaxroll.measure  # noqa: E402
from jaxroll.cli import main  # noqa: E402
from jaxroll.measure.uncertainty import score  # noqa: E402

VOCAB = 64
N, S = 12, 4
STEPS = (0, 5)


def _save(directory, config, seed):
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    word_level_tokenizer().save_pretrained(directory)


def _bloom():
    return transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_torch_thread):
    """A training output folder: checkpoint-0 and checkpoint-5 of a tiny BLOOM, and a runs/ folder to ignore."""
    folder = tmp_path_factory.mktemp("run")
    for step in STEPS:
        _save(folder / f"checkpoint-{step}", _bloom(), seed=step)
    (folder / "runs").mkdir()  # the Trainer's logging folder: not a checkpoint
    return folder


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return word_texts(tmp_path_factory.mktemp("texts") / "docs.txt", (20, 3, 15, 18, 25))


def _measure(model, out, texts, *extra):
    arguments = ["measure", *([model] if not isinstance(model, list) else model), "--texts", texts, "--length", N,
                 "--samples", S, "--out", out, "--dtype", "float64", "--quiet", *extra]
    return main([str(item) for item in arguments])


@pytest.fixture(scope="module")
def series_out(run, texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("series") / "out"
    assert _measure(run, out, texts, "--queries", 3) == 0
    return out


def _arrays(path):
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def test_the_series_of_two_checkpoints_equals_two_separate_measure_runs(run, texts, series_out, tmp_path):
    for step in STEPS:
        alone = tmp_path / f"alone-{step}"
        assert _measure(run / f"checkpoint-{step}", alone, texts, "--queries", 3) == 0
        expected = _arrays(alone / "measurement.npz")
        got = _arrays(series_out / f"checkpoint-{step}" / "measurement.npz")
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            if value.dtype.kind == "U":  # the names of the distance tables' forms
                assert np.array_equal(got[name], value), name
            else:
                np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-12, err_msg=name)
        assert (series_out / f"checkpoint-{step}" / "config.yaml").read_text() == (alone / "config.yaml").read_text()
    # The two checkpoints differ (different weights), so the comparison above can fail.
    first, last = (_arrays(series_out / f"checkpoint-{step}" / "measurement.npz") for step in STEPS)
    assert np.max(np.abs(first["influence"] - last["influence"])) > 1e-6


def _middle_mass(p):
    k = max(1, round(0.1 * p.size))
    return p[k:p.size - k].sum(), k


def test_the_summary_agrees_with_independent_oracles(series_out):
    arrays = _arrays(series_out / "series" / "series.npz")
    with open(series_out / "series" / "series.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(STEPS) and arrays["steps"].tolist() == list(STEPS)
    assert arrays["measured"].shape == (2, N) and arrays["predicted"].shape == (2, N)
    assert arrays["lambdas"].shape == (2, 2)
    for c, step in enumerate(STEPS):
        folder = series_out / f"checkpoint-{step}"
        measurement = _arrays(folder / "measurement.npz")
        np.testing.assert_array_equal(arrays["measured"][c], measurement["influence"])
        np.testing.assert_array_equal(arrays["lambdas"][c], measurement["lambdas"])
        # The rollout of the written config.yaml, by the NumPy float64 oracle (no jaxroll code).
        predicted = oracle.influence(oracle.config_arrays(oracle.read_config(folder / "config.yaml")), N)
        np.testing.assert_allclose(arrays["predicted"][c], predicted, rtol=0, atol=1e-12)
        row = rows[c]
        m = measurement["influence"]
        w1 = np.abs(np.cumsum(predicted - m)[:-1]).sum() / (N - 1)
        assert float(row["w1"]) == pytest.approx(w1, rel=1e-10, abs=1e-15)
        reference = score(predicted, measurement["influence_per_sequence"])
        assert float(row["noise"]) == pytest.approx(reference.noise, rel=1e-10)
        assert float(row["w1_over_noise"]) == pytest.approx(w1 / reference.noise, rel=1e-9)
        assert float(row["p_value"]) == pytest.approx(reference.p_value, rel=1e-12)
        for profile, kind in ((m, "measured"), (predicted, "predicted")):
            middle, k = _middle_mass(profile)
            assert float(row[f"middle_mass_{kind}"]) == pytest.approx(middle, rel=1e-10, abs=1e-15)
            edges = min(profile[:k].mean(), profile[-k:].mean())
            assert float(row[f"u_index_{kind}"]) == pytest.approx(edges / profile[k:N - k].mean() - 1, rel=1e-9)
            assert int(row[f"argmin_{kind}"]) == int(np.argmin(profile))
        assert float(row["lambda_mean"]) == pytest.approx(measurement["lambdas"].mean(), rel=1e-12)
        # Rows were measured (--queries 3): the by-distance exponents are reported.
        assert np.isfinite(float(row["distance_exponent_measured"]))
        assert np.isfinite(float(row["distance_exponent_predicted"]))


def test_without_queries_the_series_has_no_exponent_columns(run, texts, tmp_path):
    out = tmp_path / "out"
    assert _measure([run / "checkpoint-0", run / "checkpoint-5"], out, texts) == 0  # several folders
    header = (out / "series" / "series.csv").read_text().splitlines()[0].split(",")
    assert header == list(jaxroll.measure.series.SCALARS)


def test_resuming_a_half_finished_series_measures_only_the_missing_checkpoint(run, texts, series_out, tmp_path,
                                                                              monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(series_out, out)
    kept = {path.name: path.stat().st_mtime_ns for path in (out / "checkpoint-0").iterdir()}
    before = _arrays(out / "checkpoint-5" / "measurement.npz")
    shutil.rmtree(out / "checkpoint-5")  # interrupted before step 5 finished
    (out / "checkpoint-5").mkdir()
    (out / "checkpoint-5" / "measurement.npz").write_bytes(b"partial")  # a half-written folder is not finished
    calls = []
    original = jaxroll.measure.measure

    def counting(model, *args, **kwargs):
        calls.append(kwargs.get("source"))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(jaxroll.measure, "measure", counting)
    assert _measure(run, out, texts, "--queries", 3, "--resume") == 0
    assert calls == [str(run / "checkpoint-5")]
    assert {path.name: path.stat().st_mtime_ns for path in (out / "checkpoint-0").iterdir()} == kept
    after = _arrays(out / "checkpoint-5" / "measurement.npz")
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    assert _arrays(out / "series" / "series.npz")["steps"].tolist() == list(STEPS)
    calls.clear()
    assert _measure(run, out, texts, "--queries", 3, "--resume") == 0  # nothing left to measure
    assert calls == []


def _refused(capsys, code):
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("jaxroll: error: "), err
    return err


def test_a_folder_with_no_checkpoints_is_refused_and_nothing_created(texts, tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    out = tmp_path / "out"
    err = _refused(capsys, _measure(empty, out, texts))
    assert "no config.json and no checkpoint-STEP/" in err
    assert not out.exists()


def test_checkpoints_of_different_architectures_are_refused_and_nothing_created(run, texts, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    shutil.copytree(run / "checkpoint-0", mixed / "checkpoint-0")
    _save(mixed / "checkpoint-10", transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=VOCAB), seed=0)
    capsys.readouterr()  # save_pretrained's progress bar
    out = tmp_path / "out"
    err = _refused(capsys, _measure(mixed, out, texts))
    assert "checkpoint-10" in err and "one architecture" in err
    assert not out.exists()


@pytest.mark.parametrize("case", ["no step in the name", "no lambda", "one sample", "non-empty out"])
def test_other_bad_series_inputs_are_one_line_each(run, texts, tmp_path, capsys, case):
    out = tmp_path / "out"
    if case == "no step in the name":
        shutil.copytree(run / "checkpoint-0", tmp_path / "final")
        capsys.readouterr()
        code = _measure([run / "checkpoint-0", tmp_path / "final"], out, texts)
    elif case == "no lambda":
        code = _measure(run, out, texts, "--stats", "influence")
    elif case == "one sample":
        code = main([str(item) for item in ["measure", run, "--texts", texts, "--length", N, "--samples", 1,
                                            "--out", out, "--quiet"]])
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        code = _measure(run, out, texts)
    err = _refused(capsys, code)
    assert {"no step in the name": "no step in its name", "no lambda": "no lambda", "one sample": "--samples: 1",
            "non-empty out": "not empty"}[case] in err
    assert not out.exists() or sorted(path.name for path in out.iterdir()) == ["notes.txt"]


def test_jaxroll_series_redraws_the_figure_from_the_files(series_out, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(series_out, out)
    (out / "series" / "series.png").unlink()
    assert main(["series", "--measured", str(out)]) == 0
    assert (out / "series" / "series.png").read_bytes().startswith(b"\x89PNG")
    assert "2 steps (0 .. 5)" in capsys.readouterr().out
    before = (out / "series" / "series.png").read_bytes()
    _refused(capsys, main(["series", "--measured", str(out)]))  # series.png exists: --force replaces it
    assert (out / "series" / "series.png").read_bytes() == before
    assert main(["series", "--measured", str(out), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [0, 5]
    assert main(["series", "--measured", str(out), "--out", str(tmp_path / "figures")]) == 0
    assert (tmp_path / "figures" / "series.png").read_bytes().startswith(b"\x89PNG")
    capsys.readouterr()
    _refused(capsys, main(["series", "--measured", str(tmp_path / "nowhere")]))
    _refused(capsys, main(["series", str(out)]))  # the positional folder is retired, in one line


def test_the_series_figure_has_its_three_panels():
    from jaxroll.plot import series_figure

    steps = np.array([0, 1, 2, 4, 8])
    measured = np.random.default_rng(0).dirichlet(np.ones(N), size=5)
    figure = series_figure(steps, measured, np.full((5, 3), 0.3), np.array([0.9, 2.0, 5.0, np.nan, 1.5]),
                           title="t")
    heat, lines, agreement = figure.axes[:3]
    assert heat.get_ylabel().startswith("input position") and "step" in heat.get_xlabel()
    assert [tick.get_text() for tick in heat.get_xticklabels()] == ["0", "1", "2", "4", "8"]
    assert len(lines.get_lines()) == 3 and lines.get_legend() is not None
    assert [text.get_text() for text in lines.get_legend().get_texts()] == ["layer 0", "layer 1", "layer 2"]
    assert agreement.get_yscale() == "log" and agreement.get_legend() is not None
