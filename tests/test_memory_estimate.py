"""The peak-memory estimate of `jaxroll measure` (`jaxroll.measure.batching.measure_peak`) and its refusals.

Oracles: each term's closed form written out here in plain Python (the
module docstring's formulas, with the CPU's ``a, b = 20, 7``); the resident
set read from /proc/self/status here; the float64 sums counted from the
arrays' shapes. The refusals run the command with the free memory and the
resident set pinned (monkeypatched), so nothing large runs: a case that
passes the memory check stops at the texts (too short for N), before the
weights load.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_tokenizer import run_cli, save_tiny, word_texts  # noqa: E402

from jaxroll import memory  # noqa: E402
from jaxroll.measure import batching  # noqa: E402
from jaxroll.measure.attention_rows import CHUNK_BYTES  # noqa: E402

MIB, GIB = 2**20, 2**30
RESIDENT = 500 * MIB  # pinned resident set at the decision


def _vm_rss() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:"))


def _sequence(n, *, layers=2, hidden=32, heads=4, intermediate=64, s=4, eager=False, checkpointing=True,
              influence=True, a=20, b=7):
    block = n * (a * hidden + b * intermediate) * s
    scores = heads * n * n * (3 * s + 4) + n * n * s if eager else 0
    if checkpointing:
        graph = layers * n * hidden * s + block + scores
    elif influence:
        graph = layers * (block + scores)
    else:
        graph = block + scores
    return graph + 4 * n * hidden * 8


def _chunks(n, batch, heads=4):
    rows = max(1, min(n, CHUNK_BYTES // (8 * batch * heads * n)))
    return 5 * 8 * batch * heads * rows * n


def _llama_config(layers=2, hidden=32, heads=4, n=32768):
    import transformers

    return transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                                    hidden_size=hidden, intermediate_size=2 * hidden, vocab_size=64,
                                    max_position_embeddings=n)


def _weights(config, itemsize):
    import transformers

    return itemsize * sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())


def test_resident_bytes_is_this_process_resident_set_with_and_without_psutil(monkeypatch):
    assert abs(memory.resident_bytes() - _vm_rss()) < 64 * MIB
    monkeypatch.setitem(__import__("sys").modules, "psutil", None)  # import psutil now fails
    assert abs(memory.resident_bytes() - _vm_rss()) < 64 * MIB


def test_sequence_bytes_is_the_closed_form():
    for n, eager, checkpointing, stats in ((16, False, True, ("influence",)), (100, True, True, ("influence",)),
                                           (4096, False, False, ("influence",)), (300, True, False, ("lambda",))):
        expected = _sequence(n, eager=eager, checkpointing=checkpointing, influence="influence" in stats)
        assert batching.sequence_bytes(layers=2, hidden=32, heads=4, intermediate=64, length=n, itemsize=4,
                                       eager=eager, checkpointing=checkpointing, stats=stats) == expected
    # On a GPU one block holds 8 D + 3 I per token.
    assert batching.sequence_bytes(layers=2, hidden=32, heads=4, intermediate=64, length=64, itemsize=2, eager=False,
                                   checkpointing=True, device="cuda") == _sequence(64, s=2, a=8, b=3)


def test_the_rows_chunks_are_bounded_whatever_n():
    for n, batch in ((512, 1), (4096, 4), (32768, 1), (10**6, 2)):
        got = batching.chunk_bytes(heads=4, length=n, batch=batch, stats=("lambda", "attention_offsets"))
        assert got == _chunks(n, batch)
        # A bounded number of chunk buffers: at most 5 x CHUNK_BYTES, or 5 single rows when a row is larger.
        assert got <= 5 * max(CHUNK_BYTES, 8 * batch * 4 * n)
    assert batching.chunk_bytes(heads=4, length=4096, batch=1, stats=("lambda", "influence")) == 0


def test_eager_probabilities_read_whole_cost_float64_copies():
    n, batch, heads = 1024, 2, 4
    offsets = batching.chunk_bytes(heads=heads, length=n, batch=batch, stats=("attention_offsets",), recompute=False)
    assert offsets == 3 * 8 * heads * n * n
    both = batching.chunk_bytes(heads=heads, length=n, batch=batch, stats=("attention", "sinks"), recompute=False)
    assert both == 3 * 8 * heads * n * n + 8 * batch * heads * n * n
    # ... and the checkpointed forward then holds the eager scores and probabilities beside them.
    seq = _sequence(n, eager=True)
    forward = 2 * n * 32 * 4 + 4 * n * 32 * 8 + heads * n * n * (4 + 4) + n * n * 4
    assert batching.pass_bytes(layers=2, hidden=32, heads=heads, length=n, batch=1, itemsize=4, per_sequence=seq,
                               checkpointing=True, stats=("attention_offsets",), eager=True,
                               recompute=False) == max(seq, forward + offsets)


def test_rows_are_recomputed_for_statistics_that_read_them_on_sdpa():
    config = _llama_config()
    assert batching.rows_recomputed(config, "sdpa", ("lambda", "influence", "attention_offsets"))
    assert batching.rows_recomputed(config, "sdpa", ("lambda", "attention"))
    assert not batching.rows_recomputed(config, "sdpa", ("lambda", "influence"))
    # The caller's config is not changed.
    assert getattr(_llama_config(), "_attn_implementation", None) == getattr(config, "_attn_implementation", None)


def test_pass_bytes_is_the_larger_phase_plus_attention_sums():
    n, layers, hidden = 4096, 2, 32
    seq = _sequence(n)
    forward = layers * n * hidden * 4 + 4 * n * hidden * 8
    for batch, stats in ((1, ("influence",)), (4, ("influence", "attention_offsets")), (2, ("influence", "attention"))):
        held = layers * n * n * 8 if "attention" in stats else 0
        chunks = _chunks(n, batch) if len(stats) > 1 else 0
        expected = max(batch * seq, batch * forward + chunks) + held
        assert batching.pass_bytes(layers=layers, hidden=hidden, heads=4, length=n, batch=batch, itemsize=4,
                                   per_sequence=seq, checkpointing=True, stats=stats) == expected


def test_measure_peak_adds_the_terms_of_the_module_docstring():
    n, samples, layers, heads = 32768, 3, 2, 4
    config = _llama_config(n=n)
    weights = _weights(config, 4)
    seq = _sequence(n)
    for stats, sums, finish, pass_ in (
            (("lambda", "influence"), 8 * samples * layers + 8 * (samples * n + n + 2 * samples), 0, seq),
            (("lambda", "influence", "attention_offsets"),
             8 * samples * layers + 8 * (samples * n + n + 2 * samples) + 8 * layers * heads * n, 0,
             max(seq, layers * n * 32 * 4 + 4 * n * 32 * 8 + _chunks(n, 1))),
            (("lambda", "influence", "attention"),
             8 * samples * layers + 8 * (samples * n + n + 2 * samples) + 8 * layers * n * n, 2 * layers * n * n * 8,
             max(seq, layers * n * 32 * 4 + 4 * n * 32 * 8 + _chunks(n, 1)) + layers * n * n * 8)):
        peak = batching.measure_peak(config, stats=stats, length=n, batch=1, samples=samples, itemsize=4,
                                     eager=False, checkpointing=True, resident=RESIDENT)
        assert (peak.weights, peak.sums, peak.finish, peak.per_pass) == (weights, sums, finish, pass_)
        assert peak.total == RESIDENT + batching.LATER_LIBRARIES + weights + sums + max(pass_, finish)
        assert peak.growth == peak.total - RESIDENT
    # --queries K: the rows (S, K, N) and their mean, float64.
    with_rows = batching.measure_peak(config, stats=("influence",), length=n, batch=1, samples=samples, itemsize=4,
                                      eager=False, checkpointing=True, queries=5, resident=RESIDENT)
    plain = batching.measure_peak(config, stats=("influence",), length=n, batch=1, samples=samples, itemsize=4,
                                  eager=False, checkpointing=True, resident=RESIDENT)
    assert with_rows.sums - plain.sums == 8 * (samples + 1) * 5 * n
    # On a GPU: the device's share only (the sums stay in RAM, no resident set).
    gpu = batching.measure_peak(config, stats=("influence",), length=n, batch=2, samples=samples, itemsize=4,
                                eager=False, checkpointing=True, device="cuda")
    assert gpu.total == weights + 2 * _sequence(n, a=8, b=3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate")
    # Texts of 40 words: any N above that stops at the texts, after the memory check, before the weights load.
    return {"llama": save_tiny(root / "llama", _llama_config()), "texts": word_texts(root / "docs.txt", [40] * 3)}


def _pin(monkeypatch, free):
    monkeypatch.setattr(batching, "free_bytes", lambda device: free)
    monkeypatch.setattr(memory, "resident_bytes", lambda: RESIDENT)


def _measure(saved, tmp_path, capsys, *extra):
    return run_cli(["measure", saved["llama"], "--texts", saved["texts"], "--samples", "1", "--out", tmp_path / "out",
                    "--quiet", *extra], capsys)


def test_the_issue_case_fits_where_the_benchmark_ran_it(saved, tmp_path, capsys, monkeypatch):
    # 2-layer Llama, hidden 32, N = 32768: benchmarks/memory.py measured lambda,influence and
    # lambda,influence,attention_offsets under 1 GiB of peak RSS; today's free memory of the machine it ran on.
    _pin(monkeypatch, 20 * GIB)
    for stats in ("lambda,influence", "lambda,influence,attention_offsets"):
        code, _, err = _measure(saved, tmp_path, capsys, "--length", "32768", "--stats", stats)
        assert code == 2 and "needs about" not in err and "peaks at" not in err, err
        assert "texts" in err.lower() or "document" in err.lower(), err  # stopped at the texts, not the memory
    _pin(monkeypatch, 1 * GIB)  # one sequence's growth (under 0.5 GiB) still fits
    code, _, err = _measure(saved, tmp_path, capsys, "--length", "32768", "--stats", "lambda,influence")
    assert "peaks at" not in err, err


def test_a_refusal_names_the_field_the_value_and_the_longest_that_fits(saved, tmp_path, capsys, monkeypatch):
    free = 20 * GIB
    _pin(monkeypatch, free)
    config = _llama_config()
    weights = _weights(config, 4)
    stats = ("lambda", "influence", "attention")
    code, _, err = _measure(saved, tmp_path, capsys, "--length", "32768", "--stats", ",".join(stats))
    line = err.strip().removeprefix("jaxroll: error: ")
    assert code == 2 and len(line.splitlines()) == 1 and not (tmp_path / "out").exists(), err
    assert line.startswith("--length: got 32768 ") and "allowed: --length " in line, line
    longest = int(line.split("allowed: --length ")[1].split()[0])

    def growth(n):  # batch 1, samples 1, checkpointed, sdpa: the closed forms above
        sums = 8 * 2 + 8 * (n + n + 2) + 8 * 2 * n * n
        forward = 2 * n * 32 * 4 + 4 * n * 32 * 8 + _chunks(n, 1)
        pass_ = max(_sequence(n), forward) + 2 * n * n * 8
        return batching.LATER_LIBRARIES + weights + sums + max(pass_, 2 * 2 * n * n * 8)
    assert growth(longest) <= free < growth(longest + 1)


def test_a_batch_that_cannot_fit_names_the_largest_batch(saved, tmp_path, capsys, monkeypatch):
    free = 2 * GIB
    _pin(monkeypatch, free)
    n = 32768
    code, _, err = _measure(saved, tmp_path, capsys, "--length", str(n), "--stats", "lambda,influence",
                            "--batch-size", "1000")
    assert code == 2 and err.strip().removeprefix("jaxroll: error: ").startswith("--batch-size: got 1000 "), err
    batch = int(err.split("allowed: --batch-size ")[1].split()[0])
    weights = _weights(_llama_config(), 4)

    def growth(b):  # samples 1: the sums of one sequence
        return batching.LATER_LIBRARIES + weights + 8 * 2 + 8 * (n + n + 2) + b * _sequence(n)
    assert growth(batch) <= free < growth(batch + 1)


def test_choose_batch_size_fits_the_pass_in_a_share_of_free_memory():
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(_llama_config(), attn_implementation="sdpa")
    n = 4096
    seq, forward = _sequence(n), 2 * n * 32 * 4 + 4 * n * 32 * 8
    stats = ("lambda", "influence", "attention_offsets")

    def pass_(b):
        return max(b * seq, b * forward + _chunks(n, b))
    for free in (GIB, 4 * GIB):
        batch = batching.choose_batch_size(model, n, stats, 64, free=free)
        assert pass_(batch) <= 0.5 * free < pass_(batch + 1) or batch == 64
    assert np.isclose(batching.SAFETY, 0.5)
