"""`jaxroll measure` end to end on tiny locally saved models of each family.

Models and tokenizers are built here from config objects and a word-level
vocabulary, saved with ``save_pretrained`` into temporary directories and
loaded back with ``local_files_only=True``: no network.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll.cli import main  # noqa: E402
from tiny_tokenizer import run_cli as _run  # noqa: E402

VOCAB = 64


def _config(family):
    if family == "bloom":
        return transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=VOCAB)
    if family == "mpt":
        return transformers.MptConfig(n_layers=2, n_heads=4, d_model=32, vocab_size=VOCAB, max_seq_len=64)
    if family == "falcon":
        return transformers.FalconConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32,
                                         vocab_size=VOCAB, alibi=True, parallel_attn=False,
                                         new_decoder_architecture=False, multi_query=False, bias=True)
    if family == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)
    if family == "llama":
        return transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        hidden_size=32, intermediate_size=64, vocab_size=VOCAB)
    if family == "opt":  # an architecture without a layer map (the key predates OPT's support)
        return transformers.GPTBigCodeConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=VOCAB, n_positions=32)
    raise AssertionError(family)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A directory per family with a tiny model and a word-level tokenizer."""
    tokenizer = word_level_tokenizer()
    directories = {}
    for family in ("bloom", "mpt", "falcon", "gpt2", "llama", "opt"):
        torch.manual_seed(0)
        directory = tmp_path_factory.mktemp(family)
        transformers.AutoModelForCausalLM.from_config(_config(family)).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories[family] = directory
    return directories


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = [4, 20, 3, 18, 25, 16, 2, 30]  # documents 1, 3, 4, 5, 7 reach 16 tokens
    path = tmp_path_factory.mktemp("texts") / "docs.txt"
    path.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=n)) for n in lengths) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("family", ["bloom", "mpt", "falcon", "gpt2", "llama"])
def test_measure_end_to_end(family, saved, texts, tmp_path, capsys):
    out = tmp_path / "out"
    stats = "lambda,influence,attention" if family == "llama" else "lambda,content,influence,attention,qk"
    code, stdout, stderr = _run(["measure", saved[family], "--texts", texts, "--length", 16, "--samples", 3,
                                 "--out", out, "--stats", stats, "--positions", 4], capsys)
    assert code == 0, stderr
    for name in ("measurement.npz", "metadata.json", "config.yaml", "influence.csv", "lambdas.png", "influence.png"):
        assert (out / name).is_file(), name
    assert not (out / "checkpoint.npz").exists()
    with np.load(out / "measurement.npz") as data:
        arrays = {name: data[name] for name in data.files}
    assert arrays["lambdas"].shape == arrays["lambdas_std"].shape == (2,)
    assert arrays["lambdas_per_sequence"].shape == (3, 2)
    assert arrays["token_ids"].shape == (3, 16)
    np.testing.assert_array_equal(arrays["document_indices"], [1, 3, 4])  # the paper's protocol
    assert arrays["influence"].shape == (16,) and abs(arrays["influence"].sum() - 1) < 1e-12
    assert arrays["alibi_slopes"].shape == (4,) and arrays["logit_scale"].shape == ()
    assert arrays["attention_mean"].shape == (2, 16, 16)
    np.testing.assert_allclose(arrays["attention_mean"].sum(-1), 1.0, atol=1e-6)  # float32 model
    if family != "llama":
        assert arrays["content_diagonal"].shape == arrays["content_base"].shape == (2, 4)
        assert arrays["qk_mean"].shape == (2, 4, 4, 4)
    for values in arrays.values():
        assert np.all(np.isfinite(values))
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["dtype"] == "float32" and metadata["versions"]["transformers"] == transformers.__version__
    assert metadata["falcon_alibi"] == ("once" if family == "falcon" else None)
    assert metadata["protocol"]["length"] == 16
    # The config is a rollout config with the measured values, and `jaxroll rollout` reads it.
    loaded = jaxroll.load_config(out / "config.yaml")
    np.testing.assert_array_equal(np.asarray(loaded.lambdas), arrays["lambdas"])
    if family in ("gpt2", "llama"):  # no ALiBi: the measured attention is the kernel (config.kernels.npz)
        np.testing.assert_array_equal(np.asarray(loaded.kernel.kernels), arrays["attention_mean"])
    else:
        np.testing.assert_array_equal(np.asarray(loaded.alibi_slopes)[0], arrays["alibi_slopes_logit"])
    if family not in ("gpt2", "llama"):
        np.testing.assert_array_equal(np.asarray(loaded.diagonal_scores),
                                      arrays["logit_scale"] * arrays["content_diagonal"])
    code, _, stderr = _run(["rollout", out / "config.yaml", "--out", tmp_path / "rollout", "--float64"], capsys)
    assert code == 0, stderr
    assert "jaxroll measure" in stdout


def test_the_library_call_writes_what_the_command_writes(saved, texts, tmp_path, capsys):
    """`jaxroll.measure.measure` (rows and refinement included) and `write_measurement` give the command's files:
    every array of measurement.npz, refined.csv and metadata.json (but for its timing) equal, and `--json`
    prints that metadata."""
    from jaxroll.measure import load_model, load_tokenizer, measure, read_texts, select_sequences, write_measurement
    from jaxroll.theory.rows import query_positions

    folder, out = saved["llama"], tmp_path / "command"
    code, stdout, stderr = _run(["measure", folder, "--texts", texts, "--length", 16, "--samples", 3, "--dtype",
                                 "float64", "--quiet", "--out", out, "--queries", 2, "--refine", "heads",
                                 "--json"], capsys)
    assert code == 0, stderr
    printed = json.loads(stdout)
    documents = read_texts(texts)
    token_ids, indices = select_sequences(documents, load_tokenizer(folder), 16, 3)
    model = load_model(folder, dtype="float64", attn_implementation=printed["metadata"]["attn_implementation"])
    stats = tuple(printed["metadata"]["stats"])
    result = measure(model, token_ids, stats=stats, source=str(folder), queries=query_positions(16, 2),
                     batch_size=printed["metadata"]["batch_size"],
                     refine=("heads",), document_indices=indices,
                     record={key: printed["metadata"][key] for key in ("processes", "device", "protocol")})
    library = tmp_path / "library"
    library.mkdir()
    written = write_measurement(result, library)
    assert sorted(path.name for path in written) == sorted(printed["written"])
    with np.load(out / "measurement.npz") as a, np.load(library / "measurement.npz") as b:
        assert sorted(a.files) == sorted(b.files) and "refined_rows" in a.files
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert (out / "refined.csv").read_text() == (library / "refined.csv").read_text()
    ours, theirs = (json.loads((folder / "metadata.json").read_text()) for folder in (out, library))
    for record in (ours, theirs, printed["metadata"]):
        record.pop("timing")
    assert list(ours) == list(theirs) and ours == theirs == printed["metadata"]


def test_falcon_doubled_option_is_recorded(saved, texts, tmp_path, capsys):
    code, _, stderr = _run(["measure", saved["falcon"], "--texts", texts, "--length", 16, "--samples", 2,
                            "--out", tmp_path, "--falcon-alibi", "doubled", "--stats", "lambda"], capsys)
    assert code == 0, stderr
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert metadata["falcon_alibi"] == "doubled" and metadata["logit_formula"].endswith("c = 2")


def test_resume_after_interruption(saved, texts, tmp_path, capsys, monkeypatch):
    import importlib

    measure_module = importlib.import_module("jaxroll.measure.passes")

    out = tmp_path / "out"
    full = tmp_path / "full"
    arguments = ["--texts", texts, "--length", 16, "--samples", 4, "--stats", "lambda,content,influence",
                 "--batch-size", 1]  # a checkpoint after every sequence
    assert _run(["measure", saved["bloom"], *arguments, "--out", full], capsys)[0] == 0

    original = measure_module._forward_backward
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)
    monkeypatch.setattr(measure_module, "_forward_backward", interrupted)
    try:
        code = main([str(item) for item in ["measure", saved["bloom"], *arguments, "--out", out]])
    except KeyboardInterrupt:  # main() may turn it into exit status 130 itself
        code = 130
    stderr = capsys.readouterr().err
    assert code == 130 and "--resume" in stderr
    assert (out / "checkpoint.npz").is_file() and not (out / "measurement.npz").exists()
    monkeypatch.setattr(measure_module, "_forward_backward", original)
    code, _, stderr = _run(["measure", saved["bloom"], *arguments, "--out", out, "--resume"], capsys)
    assert code == 0, stderr
    with np.load(out / "measurement.npz") as resumed, np.load(full / "measurement.npz") as reference:
        for name in ("lambdas_per_sequence", "influence", "content_diagonal", "content_base"):
            np.testing.assert_allclose(resumed[name], reference[name], rtol=1e-6, atol=1e-12)  # float32 model


def test_bad_input_exits_2_with_one_line(saved, texts, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me", encoding="utf-8")
    base = ["--length", 16, "--samples", 2, "--out", tmp_path / "o"]
    cases = {
        "no such directory": ["measure", tmp_path / "missing", "--texts", texts, *base],
        "no layer map": ["measure", saved["opt"], "--texts", texts, *base],
        "empty": ["measure", saved["bloom"], "--texts", empty, *base],
        "documents have at least": ["measure", saved["bloom"], "--texts", texts, "--length", 26,
                                    "--samples", 2, "--out", tmp_path / "o2"],
        "not empty": ["measure", saved["bloom"], "--texts", texts, "--length", 16, "--samples", 2,
                      "--out", busy],
        "stats": ["measure", saved["bloom"], "--texts", texts, *base[:4], "--out", tmp_path / "o3",
                  "--stats", "lambda,entropy"],
        "rotary": ["measure", saved["llama"], "--texts", texts, *base[:4], "--out", tmp_path / "o4",
                   "--stats", "lambda,content"],
        "no checkpoint": ["measure", saved["bloom"], "--texts", texts, *base[:4], "--out", tmp_path / "o5",
                          "--resume"],
    }
    for expected, argv in cases.items():
        code, _, stderr = _run(argv, capsys)
        assert code == 2, (expected, stderr)
        assert len(stderr.strip().splitlines()) == 1 and expected in stderr, (expected, stderr)
    assert (busy / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize("files, names", [
    ({}, ["no tokenizer in the folder (none of its files)"]),
    ({"tokenizer_config.json": "{}"}, ["only tokenizer_config.json"]),
    ({"tokenizer.json": '{"version": "1.0", "trunc'}, ["cannot load it from tokenizer.json"]),
    ({"tokenizer.json": b"\x89PNG\r\n\x1a\n\x00"}, ["cannot load it from tokenizer.json"]),
])
def test_a_model_folder_without_a_usable_tokenizer_is_refused_naming_the_folder_and_the_files(
        files, names, texts, tmp_path, capsys):
    directory = tmp_path / "notok"
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(
        transformers.BloomConfig(n_layer=1, n_head=2, hidden_size=8, vocab_size=64)).save_pretrained(directory)
    for name, content in files.items():
        (directory / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    capsys.readouterr()  # save_pretrained's progress bar
    out = tmp_path / "out"
    for argv in (["measure", directory, "--texts", texts, "--length", 8, "--samples", 1, "--out", out],
                 ["task", directory, "--out", out]):
        assert main([str(item) for item in argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"jaxroll: error: tokenizer {directory}: "), err
        for name in [*names, "allowed: ", "tokenizer.json", "tokenizer_config.json", "merges.txt", "sentencepiece"]:
            assert name in err, (name, err)
        assert "()" not in err and "one of: )" not in err  # no empty list of files
        assert not out.exists()
