"""What `jaxroll measure` knows before loading: attention implementation, weights, the pass's memory.

Oracles: the parameters of the built tiny model counted directly; the
estimate formula of `jaxroll.measure.batching` written out here in plain
Python; the refusal's named N or batch checked to fit while one more does
not. Free memory is pinned (monkeypatched) so that the numbers do not depend
on the machine.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

from jaxroll.cli import main  # noqa: E402
from jaxroll import memory  # noqa: E402
from jaxroll.measure import batching  # noqa: E402
from jaxroll.measure.loading import attention_implementation  # noqa: E402
from test_measure import tiny  # noqa: E402

FREE = 256 * 2**20  # bytes of pinned free memory (beyond the resident set, pinned to 0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tokenizer = word_level_tokenizer()
    directories = {}
    for family in ("llama", "bloom"):
        directory = tmp_path_factory.mktemp(family)
        tiny(family).float().save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories[family] = directory
    rng = np.random.default_rng(0)
    texts = tmp_path_factory.mktemp("texts") / "docs.txt"
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=40)) for _ in range(6)) + "\n", encoding="utf-8")
    directories["texts"] = texts
    return directories


def _oracle_sequence_bytes(n, layers=2, hidden=32, heads=4, intermediate=64, itemsize=4, eager=False):
    # batching's module docstring, checkpointed influence pass, no probability statistics, on the CPU.
    block = n * (20 * hidden + 7 * intermediate) * itemsize
    scores = heads * n * n * (3 * itemsize + 4) + n * n * itemsize if eager else 0
    return layers * n * hidden * itemsize + block + scores + 4 * n * hidden * 8


def _pin(monkeypatch):
    # The free memory and the resident set at the decision: the refusal's growth is what must fit.
    monkeypatch.setattr(batching, "free_bytes", lambda device: FREE)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)


def test_attention_implementation_is_sdpa_unless_probabilities_are_read():
    llama, bloom, gpt2 = (tiny(name).config for name in ("llama", "bloom", "gpt2"))
    assert attention_implementation(llama, ("lambda", "influence")) == "sdpa"
    assert attention_implementation(gpt2, ("lambda", "content", "influence", "qk")) == "sdpa"
    # Every shipped statistic that reads probabilities recomputes its rows from q, k (attention_rows).
    assert attention_implementation(llama, ("lambda", "sinks", "attention", "attention_offsets",
                                            "attention_heads", "norm_kernels")) == "sdpa"
    assert attention_implementation(bloom, ("lambda",)) == "eager"  # no SDPA path in transformers
    falcon = tiny("falcon").config
    assert attention_implementation(falcon, ("lambda",)) == "sdpa"
    assert attention_implementation(falcon, ("lambda",), "doubled") == "eager"


def test_weight_bytes_count_the_parameters_without_building_weights():
    for family in ("llama", "bloom", "gpt2"):
        model = tiny(family)
        count = sum(parameter.numel() for parameter in model.parameters())
        assert batching.weight_bytes(model.config, 2) == 2 * count


def test_sequence_bytes_is_the_documented_formula():
    for n, eager in ((16, False), (100, True), (4096, False)):
        assert batching.sequence_bytes(layers=2, hidden=32, heads=4, intermediate=64, length=n, itemsize=4,
                                       eager=eager, checkpointing=True,
                                       stats=("lambda", "influence")) == _oracle_sequence_bytes(n, eager=eager)


def _measure(saved, family, tmp_path, *extra):
    out = tmp_path / "out"
    argv = ["measure", saved[family], "--texts", saved["texts"], "--samples", "3", "--out", out, "--quiet",
            *extra]
    return main([str(item) for item in argv]), out


def test_a_length_that_cannot_fit_is_refused_naming_the_longest_that_fits(saved, tmp_path, capsys, monkeypatch):
    _pin(monkeypatch)
    weights = batching.weight_bytes(tiny("llama").config, 4)
    code, out = _measure(saved, "llama", tmp_path, "--length", "1000000", "--stats", "lambda,influence")
    stderr = capsys.readouterr().err.strip()
    assert code == 2 and len(stderr.splitlines()) == 1 and not out.exists(), stderr
    longest = int(stderr.split("allowed: --length ")[1].split()[0])

    def total(n):  # + the libraries still to load, the float64 sums: lambda (S, L), influence (S, N) + (N,) + 2 S
        return batching.LATER_LIBRARIES + weights + _oracle_sequence_bytes(n) + 8 * (3 * 2) + 8 * (3 * n + n + 2 * 3)
    assert total(longest) <= FREE < total(longest + 1)


def test_a_batch_that_cannot_fit_is_refused_naming_the_largest_that_fits(saved, tmp_path, capsys, monkeypatch):
    _pin(monkeypatch)
    weights = batching.weight_bytes(tiny("llama").config, 4)
    n = 8192
    code, out = _measure(saved, "llama", tmp_path, "--length", str(n), "--stats", "lambda,influence",
                         "--batch-size", "1000")
    stderr = capsys.readouterr().err.strip()
    assert code == 2 and "--batch-size" in stderr and not out.exists(), stderr
    batch = int(stderr.split("allowed: --batch-size ")[1].split()[0])
    per, sums = _oracle_sequence_bytes(n), batching.LATER_LIBRARIES + 8 * (3 * 2) + 8 * (3 * n + n + 2 * 3)
    assert weights + batch * per + sums <= FREE < weights + (batch + 1) * per + sums


def test_default_statistics_and_those_reading_rows_run_on_sdpa(saved, tmp_path, capsys):
    code, out = _measure(saved, "llama", tmp_path, "--length", "12", "--batch-size", "2")
    assert code == 0, capsys.readouterr().err
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["attn_implementation"] == "sdpa" and metadata["batch_size"] == 2
    code, out = _measure(saved, "llama", tmp_path / "sinks", "--length", "12", "--stats", "lambda,sinks")
    assert code == 0, capsys.readouterr().err
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["attn_implementation"] == "sdpa" and metadata["attention_rows"]
    code, out = _measure(saved, "bloom", tmp_path / "bloom", "--length", "12", "--stats", "lambda,attention_heads")
    assert code == 0, capsys.readouterr().err
    # BLOOM: transformers has only its eager attention.
    assert json.loads((out / "metadata.json").read_text())["attn_implementation"] == "eager"
