"""Extending a series (issue 56, items 1-2): `measure --resume` and `jaxroll.track` refuse a run measured otherwise.

A series compares its steps with one another, so each step must be measured
alike. The oracle here is the property stated in docs/training.md: a
refusal is one line naming the option with this run's value and the
series', exit status 2 on the command line, and the series folder
byte-identical afterwards (every file compared as bytes, nothing added). A
matching run is accepted (so the checks do not refuse everything), and a
failing write leaves series.csv and series.npz as they were.

Tiny BLOOMs built from config objects, a word-level tokenizer, no network.
"""

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxroll  # noqa: E402
import jaxroll.measure.series  # noqa: E402
from jaxroll.cli import main  # noqa: E402
from jaxroll.errors import ConfigError  # noqa: E402
from tiny_tokenizer import save_tiny, word_texts  # noqa: E402

VOCAB, N, S = 64, 12, 4


def _bloom(layers=2):
    return transformers.BloomConfig(n_layer=layers, n_head=4, hidden_size=32, vocab_size=VOCAB)


def _snapshot(folder):
    """Every file under `folder` as bytes, by relative path: the folder's state, to compare before and after."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return word_texts(tmp_path_factory.mktemp("texts") / "docs.txt", (20, 3, 15, 18, 25))


@pytest.fixture(scope="module")
def models(tmp_path_factory, one_torch_thread):
    """Model folders: step 5 and step 10 of one run, a 3-layer BLOOM as step 10, and step 3."""
    root = tmp_path_factory.mktemp("models")
    save_tiny(root / "five" / "checkpoint-5", _bloom())
    shutil.copytree(root / "five" / "checkpoint-5", root / "next" / "checkpoint-5")
    save_tiny(root / "next" / "checkpoint-10", _bloom())
    save_tiny(root / "deeper" / "checkpoint-10", _bloom(layers=3))
    shutil.copytree(root / "five" / "checkpoint-5", root / "earlier" / "checkpoint-3")
    return root


def _measure(model, out, texts, *extra):
    arguments = ["measure", *(model if isinstance(model, list) else [model]), "--texts", texts, "--length", N,
                 "--samples", S, "--out", out, "--dtype", "float64", "--quiet", *extra]
    return main([str(item) for item in arguments])


@pytest.fixture(scope="module")
def measured(models, texts, tmp_path_factory):
    """A series of one step (5), measured at N = 12, S = 4, float64, the default statistics."""
    out = tmp_path_factory.mktemp("series") / "out"
    assert _measure(models / "five", out, texts) == 0
    return out


@pytest.fixture
def series(measured, tmp_path, capsys):
    out = tmp_path / "series"
    shutil.copytree(measured, out)
    capsys.readouterr()
    return out


RESUMED = {
    "length": (["--length", 8], "--length: N = 8; allowed: N = 12, as the series in"),
    "samples": (["--samples", 3], "--samples: S = 3; allowed: S = 4, as the series in"),
    "texts": ("other texts", "--texts: token ids "),
    "stats": (["--stats", "lambda,influence"], "--stats: lambda,influence; allowed: lambda,content,influence,attention_gains,attention_distances,paths, as"),
    "dtype": (["--dtype", "float32"], "--dtype: dtype float32; allowed: dtype float64, as the series in"),
    "architecture": ("deeper", "model: bloom, 3 layers, 4 heads; allowed: bloom, 2 layers, 4 heads, as the series"),
    "step order": ("earlier", "model: step 3; allowed: steps after 5, the last step of the series in"),
    "negative step": ("checkpoint--2", "no step in its name 'checkpoint--2'"),
}


@pytest.mark.parametrize("case", sorted(RESUMED))
def test_measure_resume_refuses_a_run_measured_otherwise_and_changes_nothing(case, series, models, texts,
                                                                             tmp_path, capsys):
    before = _snapshot(series)
    extra, expected = RESUMED[case]
    model, given = models / "next", texts
    if case == "texts":
        given, extra = word_texts(tmp_path / "other.txt", (20, 3, 15, 18, 25), seed=7), []
    elif case in ("architecture", "step order"):
        model, extra = models / extra, []
    elif case == "negative step":  # a folder cannot name a negative step: refused as a folder without one
        shutil.copytree(models / "five" / "checkpoint-5", tmp_path / "checkpoint--2")
        model, extra = [models / "next" / "checkpoint-5", tmp_path / "checkpoint--2"], []
    code = _measure(model, series, given, *extra, "--resume")
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("jaxroll: error: "), err
    assert expected in err, err
    if case == "texts":  # both fingerprints named, and they differ
        this, theirs = err.split("--texts: token ids ")[1].split("; allowed: token ids ")
        assert this != theirs.split(",")[0]
    assert _snapshot(series) == before


def test_measure_resume_with_the_same_options_adds_the_new_step(series, models, texts):
    before = _snapshot(series / "checkpoint-5")
    assert _measure(models / "next", series, texts, "--resume") == 0
    assert jaxroll.measure.read_series(series)["columns"]["step"] == [5, 10]
    assert _snapshot(series / "checkpoint-5") == before


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, one_torch_thread):
    """A series of one step (4) written by `jaxroll.track`: N = 12, S = 3, float32, the default statistics."""
    out = tmp_path_factory.mktemp("tracked") / "out"
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(3, N))
    assert jaxroll.track(_model(), 4, token_ids=ids, out=out, every=1) is not None
    return out, ids


def _model(layers=2):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(_bloom(layers))


TRACKED = {
    "length": ({"token_ids": lambda ids: ids[:, :8]}, "token_ids: N = 8; allowed: N = 12, as the series in"),
    "samples": ({"token_ids": lambda ids: ids[:2]}, "token_ids: S = 2; allowed: S = 3, as the series in"),
    "token ids": ({"token_ids": lambda ids: (ids + 1) % VOCAB}, "token_ids: token ids "),
    "stats": ({"stats": ("lambda", "influence")}, "stats: lambda,influence; allowed: lambda,content,influence,attention_gains,attention_distances,paths, as"),
    "dtype": ({"model": lambda: _model().double()}, "model: dtype float64; allowed: dtype float32, as the series"),
    "architecture": ({"model": lambda: _model(3)}, "model: bloom, 3 layers, 4 heads; allowed: bloom, 2 layers"),
    "step order": ({"step": 2}, "step: step 2; allowed: steps after 4, the last step of the series in"),
    "negative step": ({"step": -2}, "step: got -2; allowed: an integer >= 0"),
}


@pytest.mark.parametrize("case", sorted(TRACKED))
def test_track_refuses_a_series_measured_otherwise_and_writes_nothing(case, tracked, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tracked[0], out)
    before = _snapshot(out)
    change, expected = TRACKED[case]
    ids = change["token_ids"](tracked[1]) if "token_ids" in change else tracked[1]
    model = change["model"]() if "model" in change else _model()
    with pytest.raises(ConfigError) as refused:
        jaxroll.track(model, change.get("step", 8), token_ids=ids, out=out, every=1, stats=change.get("stats"))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(expected), message
    assert _snapshot(out) == before


def test_track_accepts_the_next_step_measured_alike(tracked, tmp_path, one_torch_thread):
    out = tmp_path / "out"
    shutil.copytree(tracked[0], out)
    assert jaxroll.track(_model(), 8, token_ids=tracked[1], out=out, every=1) is not None
    assert jaxroll.measure.read_series(out)["columns"]["step"] == [4, 8]


def test_a_failing_write_leaves_the_series_files_as_they_were(tracked, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(tracked[0], out)
    before = _snapshot(out)

    def failing(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(jaxroll.measure.series.np, "savez", failing)
    with pytest.raises(OSError, match="disk full"):
        # 10 resamples (not 1000): another p_value, so a series.csv unlike the one there, ready before
        # series.npz fails.
        jaxroll.measure.series.update_series(out, [4], resamples=10)
    assert _snapshot(out) == before  # no .tmp left either


def test_a_step_of_another_length_in_the_folder_is_refused_before_any_write(tracked, tmp_path, one_torch_thread):
    out = tmp_path / "out"
    shutil.copytree(tracked[0], out)
    other = tmp_path / "other"
    assert jaxroll.track(_model(), 9, token_ids=tracked[1][:, :8], out=other, every=1) is not None
    shutil.copytree(other / "checkpoint-9", out / "checkpoint-9")  # put there by hand, past every check
    before = _snapshot(out)
    with pytest.raises(ConfigError, match=r"checkpoint-9: measured of shape \(8,\); allowed: \(12,\)") as refused:
        jaxroll.measure.series.update_series(out)
    assert "\n" not in str(refused.value)
    assert _snapshot(out) == before
