"""Crash safety: `jaxroll measure` killed with SIGKILL midway (a real subprocess),
then `--resume`: the results equal an uninterrupted run and no output file is
ever half-written."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

from jaxroll.cli import main  # noqa: E402

# One sequence per pass: a checkpoint after every sequence, so the kill lands mid-run (a batch
# sized from free memory would measure all 48 in one pass).
ARGUMENTS = ["--length", "24", "--samples", "48", "--stats", "lambda,content,influence", "--batch-size", "1"]


@pytest.fixture(scope="module")
def model_and_texts(tmp_path_factory):
    tokenizer = word_level_tokenizer()
    directory = tmp_path_factory.mktemp("bloom")
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    rng = np.random.default_rng(0)
    texts = tmp_path_factory.mktemp("texts") / "docs.txt"
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=30)) for _ in range(48)) + "\n")
    return directory, texts


def _complete_files_only(directory) -> None:
    """Every file under its final name reads back whole (temporaries may remain)."""
    for path in directory.iterdir():
        if path.suffix == ".tmp":
            continue
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                for name in data.files:
                    data[name]  # a truncated archive fails here
        else:
            assert path.stat().st_size > 0, path


def test_measure_killed_midway_resumes_to_the_uninterrupted_result(model_and_texts, tmp_path, capsys):
    model, texts = model_and_texts
    full, out = tmp_path / "full", tmp_path / "out"
    assert main(["measure", str(model), "--texts", str(texts), *ARGUMENTS, "--out", str(full)]) == 0
    capsys.readouterr()

    process = subprocess.Popen(
        [sys.executable, "-m", "jaxroll", "measure", str(model), "--texts", str(texts), *ARGUMENTS,
         "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    checkpoint = out / "checkpoint.npz"
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # let it get a few sequences further, into the middle of a write or not
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed midway"
    assert checkpoint.exists() and not (out / "measurement.npz").exists()
    _complete_files_only(out)

    assert main(["measure", str(model), "--texts", str(texts), *ARGUMENTS, "--out", str(out), "--resume"]) == 0
    assert not checkpoint.exists()
    _complete_files_only(out)
    with np.load(out / "measurement.npz") as resumed, np.load(full / "measurement.npz") as reference:
        assert resumed["lambdas_per_sequence"].shape == (48, 2)
        for name in ("lambdas_per_sequence", "influence", "content_diagonal", "content_base", "token_ids"):
            # The same sequences summed in the same order: equal up to float32 rounding of the model.
            np.testing.assert_allclose(resumed[name], reference[name], rtol=1e-6, atol=1e-12)
    assert sorted(os.listdir(out)) == sorted(os.listdir(full))


SPEC = ("base: {preset: mpt-7b, sequence_length: 64}\n"
        "axes: {temperature: [0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], slope_scale: [0.5, 1.0, 2.0, 4.0]}\n"
        "batch_size: 1\n")


def test_sweep_killed_midway_resumes_to_the_uninterrupted_result(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    full, out = tmp_path / "full", tmp_path / "out"
    # float64 in every run: the suite's process has it on, and a checkpoint
    # written in float32 is (rightly) refused by a float64 resume.
    assert main(["sweep", str(spec), "--out", str(full), "--float64"]) == 0
    capsys.readouterr()

    process = subprocess.Popen([sys.executable, "-m", "jaxroll", "sweep", str(spec), "--out", str(out), "--float64"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    partial = out / ".partial"
    while process.poll() is None and time.monotonic() < deadline and not (
            partial.is_dir() and any(p.suffix == ".npy" for p in partial.iterdir())):  # final names only
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL, "the sweep ended before it could be killed midway"
    assert not (out / "sweep.csv").exists() and not (out / "profiles.npz").exists()
    chunks = sorted(p for p in partial.iterdir() if p.suffix == ".npy")
    assert 0 < len(chunks) < 32
    for chunk in chunks:
        np.load(chunk, allow_pickle=False)  # whole, or not there under this name

    assert main(["sweep", str(spec), "--out", str(out), "--resume", "--float64"]) == 0
    assert not partial.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in full.iterdir())
    assert (out / "sweep.csv").read_text() == (full / "sweep.csv").read_text()
    with np.load(out / "profiles.npz") as resumed, np.load(full / "profiles.npz") as reference:
        assert resumed.files == reference.files
        for name in reference.files:
            np.testing.assert_array_equal(resumed[name], reference[name])


def test_a_garbage_checkpoint_is_refused_in_one_line(model_and_texts, tmp_path, capsys):
    model, texts = model_and_texts
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.npz").write_bytes(b"\x00\xffnot a zip" * 10)
    status = main(["measure", str(model), "--texts", str(texts), *ARGUMENTS, "--out", str(out), "--resume"])
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1 and "not a checkpoint of jaxroll measure" in error


def test_a_garbage_sweep_chunk_is_refused_in_one_line(tmp_path):
    import jaxroll

    model = jaxroll.presets.get("mpt-7b", sequence_length=16)
    checkpoint = tmp_path / "chunks"
    jaxroll.sweep(model, temperature=[0.5, 1.0, 2.0], batch_size=1, progress=False, checkpoint=checkpoint)
    (checkpoint / "chunk_000001.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(jaxroll.ConfigError) as error:
        jaxroll.sweep(model, temperature=[0.5, 1.0, 2.0], batch_size=1, progress=False, checkpoint=checkpoint)
    assert "chunk 1 is not a readable .npy" in str(error.value) and "\n" not in str(error.value)


def test_attention_means_that_cannot_fit_are_refused_before_out_is_created(model_and_texts, tmp_path, capsys):
    model, _ = model_and_texts
    texts = tmp_path / "long.txt"
    n = 40000  # 2 layers x 40000^2 float64 = 25.6 GB of (L, N, N) means: more than the machine has
    texts.write_text(" ".join(WORDS[k % len(WORDS)] for k in range(n + 10)) + "\n")
    out = tmp_path / "out"
    status = main(["measure", str(model), "--texts", str(texts), "--length", str(n), "--samples", "1",
                   "--stats", "lambda,attention", "--out", str(out)])
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1, error
    assert error.removeprefix("jaxroll: error: ").startswith("--length: got 40000 ") and "allowed: --length " in error
    assert not out.exists()
