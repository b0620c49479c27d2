"""Per-sequence influence, attention sinks, the statistics registry, shards, progress, config-only checks.

Oracles: the model's own attention probabilities (``output_attentions``)
and hidden states recomputed in NumPy float64 here, `influence_gradients`
(one sequence at a time), the closed form of uniform causal attention, and
the single-process run for sharded ones.
"""

import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import ConfigError  # noqa: E402
from jaxroll.cli import main  # noqa: E402
from jaxroll.measure import measure, influence_gradients  # noqa: E402
from jaxroll.measure import measure as _function  # noqa: E402,F401
from jaxroll.measure.precision import full_precision  # noqa: E402
from jaxroll.measure.progress import Progress  # noqa: E402

import importlib  # noqa: E402

registry = importlib.import_module("jaxroll.measure.registry")
VOCAB = 64


def tiny(family="bloom", layers=2, heads=4, hidden=32, seed=0):
    configs = {
        "bloom": lambda: transformers.BloomConfig(n_layer=layers, n_head=heads, hidden_size=hidden, vocab_size=VOCAB),
        "llama": lambda: transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=heads,
                                                  num_key_value_heads=heads // 2, hidden_size=hidden,
                                                  intermediate_size=2 * hidden, vocab_size=VOCAB),
    }
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs[family](), attn_implementation="eager")
    return model.double().eval()


def token_ids(count, length, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (count, length))


# ---------------------------------------------------------------- per-sequence influence


def test_per_sequence_influence_rows_are_each_sequences_gradient_norms():
    model = tiny()
    ids = token_ids(4, 10)
    result = measure(model, ids, stats=("influence",))
    assert result.influence_per_sequence.shape == (4, 10)
    for row, sequence in zip(result.influence_per_sequence, ids):
        np.testing.assert_allclose(row, influence_gradients(model, sequence), rtol=1e-12, atol=0)
    np.testing.assert_allclose(result.influence_per_sequence.mean(0), result.influence_raw, rtol=1e-14, atol=0)
    assert "influence_per_sequence" in result.arrays()


# ---------------------------------------------------------------- attention sinks


def _sink_oracle(model, ids, epsilon=0.3):
    """Gu et al.'s alpha, rate, first-k share and its boost, from output_attentions, in NumPy float64."""
    received, share, rate_first = [], [], []
    for sequence in ids:
        with torch.no_grad(), full_precision(model):  # float64 throughout, as measure runs it
            attentions = model(torch.as_tensor(sequence)[None], use_cache=False, output_attentions=True).attentions
        a = np.stack([layer[0].numpy() for layer in attentions])  # (L, H, N, N)
        n = a.shape[-1]
        alpha = np.zeros(a.shape[:2] + (n,))
        for k in range(n):
            alpha[..., k] = a[..., k:, k].sum(-1) / (n - k)
        received.append(alpha)
        first = np.zeros(n)
        for k in range(1, n + 1):
            first[k - 1] = a[..., :, :k].sum(-1).mean()
        share.append(first)
        rate_first.append(np.mean(alpha[..., 0] > epsilon))
    received, share = np.mean(received, axis=0), np.mean(share, axis=0)
    n = ids.shape[1]
    uniform = np.array([np.mean([min(k, i + 1) / (i + 1) for i in range(n)]) for k in range(1, n + 1)])
    return {"sink_received": received, "sink_rate": (received > epsilon).mean(axis=(0, 1)),
            "sink_first_share": share, "sink_first_boost": share / uniform,
            "sink_rate_first_per_sequence": np.asarray(rate_first)}


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_sinks_equal_a_numpy_recomputation_from_the_models_attention(family):
    model = tiny(family)
    with torch.no_grad():  # a visible sink: large first-token keys make some heads pile onto token 0
        model.get_input_embeddings().weight[:5] *= 4.0
    ids = token_ids(3, 12)
    ids[:, 0] = 1
    result = measure(model, ids, stats=("influence", "sinks"))
    oracle = _sink_oracle(model, ids)
    for name, expected in oracle.items():
        np.testing.assert_allclose(result.extra[name], expected, rtol=1e-12, atol=1e-14, err_msg=name)
    assert result.extra["sink_received"].shape == (2, 4, 12) and result.extra["sink_rate"].shape == (12,)
    # Every row sums to 1 (BLOOM's softmax runs in float32 inside a float64 model: ~4e-10).
    np.testing.assert_allclose(result.extra["sink_first_share"][-1], 1.0, rtol=0, atol=1e-8)
    assert "sinks (eps 0.3)" in registry.summary_lines(result)[0]


def test_uniform_causal_attention_has_boost_one_and_the_closed_form_alpha():
    model = tiny("llama")
    for block in model.model.layers:  # q = 0: every score 0, rows uniform over the visible keys
        with torch.no_grad():
            block.self_attn.q_proj.weight.zero_()
    n = 9
    result = measure(model, token_ids(2, n), stats=("sinks",))
    # Eager Llama takes its softmax in float32 (then casts to float64): 1e-6 allows a few float32 ulps.
    np.testing.assert_allclose(result.extra["sink_first_boost"], 1.0, rtol=0, atol=1e-6)
    # alpha(k) = (1 / (N - k)) sum_{i >= k} 1 / (i + 1)
    alpha = np.array([sum(1 / (i + 1) for i in range(k, n)) / (n - k) for k in range(n)])
    np.testing.assert_allclose(result.extra["sink_received"], np.broadcast_to(alpha, (2, 4, n)), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(result.extra["sink_rate"], (alpha > 0.3).astype(float))


# ---------------------------------------------------------------- registry


def test_a_registered_statistic_is_computed_checkpointed_and_merged(monkeypatch, tmp_path):
    from jaxroll.measure.registry import Statistic

    def observe(state, kind, layer, x):
        state[layer] = float(x[0].double().norm(dim=-1).mean())

    def accumulate(sums, state, index):
        values = [state[layer] for layer in sorted(state)]
        sums["x_norm_sum"] += values
        sums["x_norm_per_sequence"][index] = values

    statistic = Statistic(
        name="x_norm", hooks=("block_input",),
        allocate=lambda shape: {"x_norm_sum": np.zeros(shape.layers),
                                "x_norm_per_sequence": np.full((shape.sequences, shape.layers), np.nan)},
        observe=observe, accumulate=accumulate,
        finish=lambda sums, count, shape: {"x_norm": sums["x_norm_sum"] / count,
                                           "x_norm_per_sequence": sums["x_norm_per_sequence"]},
        per_sequence=("x_norm_per_sequence",))
    monkeypatch.setitem(registry.registered(), "x_norm", statistic)
    model = tiny("llama")
    ids = token_ids(3, 8)
    result = measure(model, ids, stats=("x_norm",))
    # Oracle: the hidden states entering blocks 0 and 1.
    expected = []
    for sequence in ids:
        with torch.no_grad(), full_precision(model):  # float64 throughout, as measure runs it
            states = model(torch.as_tensor(sequence)[None], output_hidden_states=True, use_cache=False).hidden_states
        expected.append([np.linalg.norm(states[t][0].numpy(), axis=-1).mean() for t in range(2)])
    np.testing.assert_allclose(result.extra["x_norm_per_sequence"], expected, rtol=1e-13)
    np.testing.assert_allclose(result.extra["x_norm"], np.mean(expected, axis=0), rtol=1e-13)
    with pytest.raises(ConfigError, match="hook"):
        registry.register_statistic(Statistic("bad", ("logits",), *([lambda *a: None] * 4)))


# ---------------------------------------------------------------- shards


STATS = ("lambda", "content", "influence", "attention", "sinks")


def test_shards_merge_exactly_into_the_single_process_result(tmp_path):
    model = tiny("bloom")
    ids = token_ids(5, 10)
    full = measure(model, ids, stats=STATS)
    parts = {}

    def keep(sums):
        parts["first"] = sums.state()
        return None
    assert measure(model, ids, stats=STATS, shard=(0, 2), reduce=keep) is None
    assert int(parts["first"]["count"]) == 3  # array_split: blocks of 3 and 2
    merged = measure(model, ids, stats=STATS, shard=(1, 2), reduce=lambda sums: sums.merge([parts["first"]]))
    # Sums added in another order: float64 reassociation, a few 1e-16 relative.
    for name, value in full.arrays().items():
        np.testing.assert_allclose(merged.arrays()[name], value, rtol=1e-12, atol=1e-15, err_msg=name)
    assert merged.metadata["timing"]["sequences_per_process"] == [2, 3]


def test_a_shard_resumes_from_its_own_checkpoint(tmp_path):
    model = tiny("bloom")
    ids = token_ids(6, 8)
    reference = measure(model, ids, stats=("lambda", "influence"), shard=(1, 2), reduce=lambda sums: sums)
    calls = []

    def crash(module, args, kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
    handle = model.register_forward_pre_hook(crash, with_kwargs=True)
    path = tmp_path / "checkpoint.rank1-of-2.npz"
    with pytest.raises(KeyboardInterrupt):
        measure(model, ids, stats=("lambda", "influence"), shard=(1, 2), checkpoint_path=path,
                reduce=lambda sums: sums, batch_size=1)
    handle.remove()
    resumed = measure(model, ids, stats=("lambda", "influence"), shard=(1, 2), checkpoint_path=path, resume=True,
                      reduce=lambda sums: sums)
    np.testing.assert_allclose(resumed.influence_per_sequence, reference.influence_per_sequence, rtol=1e-13)
    assert np.all(np.isnan(resumed.influence_per_sequence[:3]))  # rank 0's rows are not this shard's
    with pytest.raises(ConfigError, match="other settings"):  # another rank's checkpoint is refused
        measure(model, ids, stats=("lambda", "influence"), shard=(0, 2), checkpoint_path=path, resume=True)


# ---------------------------------------------------------------- progress


class FakeClock:
    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        return self.now


def test_progress_lines_every_few_percent_with_rate_and_eta():
    stream, clock = io.StringIO(), FakeClock(0.5)
    progress = Progress(40, stream=stream, every_percent=10, every_seconds=1e9, min_seconds=0, clock=clock)
    assert progress.bar is None  # a StringIO is not a terminal
    for _ in range(40):
        clock.now += 0.5
        progress.update(1)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10  # 10 %, 20 %, ... 90 % and the closing line
    assert lines[2] == "jaxroll measure: 12/40 sequences (30%), 2 sequence/s, elapsed 6 s, ETA 14 s"
    assert lines[-1] == "jaxroll measure: 40/40 sequences (100%), 2 sequence/s, elapsed 20 s"


def test_progress_lines_every_n_seconds_and_an_honest_rate_after_resume():
    stream, clock = io.StringIO(), FakeClock(1.0)
    progress = Progress(1000, initial=500, stream=stream, every_percent=50, every_seconds=3, min_seconds=0, clock=clock)
    for _ in range(7):
        clock.now += 1.0
        progress.update(1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # at 3 s and 6 s
    # 3 sequences in 3 s after the resume: 1 sequence/s, 497 left.
    assert lines[0] == "jaxroll measure: 503/1000 sequences (50%), 1 sequence/s, elapsed 3 s, ETA 8 min 17 s"


def test_progress_is_a_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stream = Terminal()
    with Progress(5, stream=stream) as progress:
        assert progress.bar is not None
        progress.update(5)
    assert "5/5" in stream.getvalue()


# ---------------------------------------------------------------- the command: check first, load later


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A llama and a bloom directory; a llama config without weights (anything that loads them fails)."""
    tokenizer = word_level_tokenizer()
    directories = {}
    for family in ("llama", "bloom"):
        directory = tmp_path_factory.mktemp(family)
        tiny(family).float().save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories[family] = directory
    hollow = tmp_path_factory.mktemp("hollow")
    tiny("llama").config.save_pretrained(hollow)
    tokenizer.save_pretrained(hollow)
    directories["hollow"] = hollow
    rng = np.random.default_rng(0)
    texts = tmp_path_factory.mktemp("texts") / "docs.txt"
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=20)) for _ in range(4)) + "\n", encoding="utf-8")
    directories["texts"] = texts
    return directories


def test_refusals_from_the_config_come_before_the_weights_and_create_nothing(saved, tmp_path, capsys):
    base = ["measure", saved["hollow"], "--texts", saved["texts"], "--samples", "2"]
    cases = {
        "rotary": [*base, "--length", "8", "--stats", "lambda,content"],
        "the run peaks at about": [*base, "--length", "10000000", "--stats", "attention"],  # the memory estimate
        "no layer map": None,
    }
    for expected, argv in cases.items():
        if argv is None:
            continue
        out = tmp_path / expected.replace(" ", "_")
        code = main([str(item) for item in [*argv, "--out", out]])
        stderr = capsys.readouterr().err
        assert code == 2 and expected in stderr and len(stderr.strip().splitlines()) == 1, stderr
        assert not out.exists()
    # The same directory passes every config check; only loading the (missing) weights fails.
    out = tmp_path / "load"
    code = main([str(item) for item in [*base, "--length", "8", "--out", out, "--quiet"]])
    assert code == 2 and "cannot load" in capsys.readouterr().err


def test_default_stats_fit_the_architecture_and_progress_goes_to_stderr(saved, tmp_path, capsys):
    out = tmp_path / "llama"
    code = main([str(item) for item in ["measure", saved["llama"], "--texts", saved["texts"], "--length", "8",
                                        "--samples", "3", "--out", out]])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    import json

    assert json.loads((out / "metadata.json").read_text())["stats"] == ["lambda", "influence", "attention",
                                                                         "attention_gains", "attention_distances", "paths"]
    # A rotary model's default config is its measured kernel, not a flat ALiBi kernel (issue 46): at this size the
    # mean rows tabulated over the logit gain (issue 53), whose rows at gain 1 are the measured mean attention.
    config = (out / "config.yaml").read_text()
    assert "kernel_type: gain_table" in config and "alibi_slopes" not in config
    kernel = jaxroll.load_config(out / "config.yaml").kernel
    assert kernel.rows.shape == (2, 8, 8, 8)
    with np.load(out / "measurement.npz") as data:
        np.testing.assert_allclose(np.asarray(kernel.rows)[:, kernel.grid.index(1.0)], data["attention_mean"],
                                   rtol=0, atol=1e-12)
    assert "jaxroll measure: 3/3 sequences (100%)" in captured.err
    with np.load(out / "measurement.npz") as data:
        assert data["influence_per_sequence"].shape == (3, 8)
    code = main([str(item) for item in ["measure", saved["bloom"], "--texts", saved["texts"], "--length", "8",
                                        "--samples", "2", "--out", tmp_path / "bloom", "--quiet",
                                        "--stats", "lambda,influence,sinks"]])
    captured = capsys.readouterr()
    assert code == 0 and captured.err == "" and "sinks (eps 0.3)" in captured.out
    with np.load(tmp_path / "bloom" / "measurement.npz") as data:
        assert data["sink_rate"].shape == (8,)


# ---------------------------------------------------------------- devices


def test_activation_checkpointing_restores_an_instance_forward_it_found():
    # accelerate's device-map dispatch sets block.forward on the instance; measuring must leave it in place.
    model = tiny("bloom")
    block = model.transformer.h[0]
    calls = []
    original = block.forward

    def wrapped(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    block.forward = wrapped
    ids = token_ids(2, 6)
    result = measure(model, ids, stats=("influence",), checkpointing=True)
    assert block.__dict__["forward"] is wrapped and calls  # still there, and it ran
    reference = measure(tiny("bloom"), ids, stats=("influence",), checkpointing=False)
    np.testing.assert_allclose(result.influence, reference.influence, rtol=1e-12)


def test_device_map_auto_on_the_cpu_measures_what_a_plain_load_measures(saved):
    pytest.importorskip("accelerate")
    from jaxroll.measure import load_model

    ids = token_ids(2, 8)
    plain = measure(load_model(saved["bloom"], dtype="float64"), ids, stats=("lambda", "influence"))
    mapped_model = load_model(saved["bloom"], dtype="float64", device_map="auto")
    mapped = measure(mapped_model, ids, stats=("lambda", "influence"))
    np.testing.assert_allclose(mapped.influence_per_sequence, plain.influence_per_sequence, rtol=1e-12)
    np.testing.assert_allclose(mapped.lambdas, plain.lambdas, rtol=1e-12)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_device_cuda_without_cuda_is_refused_before_loading(saved, tmp_path, capsys):
    out = tmp_path / "cuda"
    code = main([str(item) for item in ["measure", saved["hollow"], "--texts", saved["texts"], "--length", "8",
                                        "--samples", "2", "--out", out, "--device", "cuda"]])
    stderr = capsys.readouterr().err
    assert code == 2 and "no CUDA device" in stderr and not out.exists()


def test_statistics_that_read_probabilities_refuse_a_non_eager_model_before_measuring(monkeypatch):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      hidden_size=8, intermediate_size=16, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    # The shipped statistics recompute their rows from q, k (attention_rows); one that only
    # hooks the probabilities (no observe_rows) needs eager attention.
    statistic = registry.Statistic(name="raw_p", hooks=("probabilities",), allocate=lambda shape: {},
                                   observe=lambda *a: None, accumulate=lambda *a: None, finish=lambda *a: {},
                                   needs_eager=True)
    monkeypatch.setitem(registry.registered(), "raw_p", statistic)
    with pytest.raises(ConfigError, match="raw_p read the attention probabilities"):
        measure(model, token_ids(1, 4), stats=("lambda", "sinks", "norm_kernels", "raw_p"))


def test_an_alibi_models_default_config_moves_its_analytic_kernel_by_its_tables(saved, tmp_path):
    """Issue 53: an ALiBi model measures the gain and distance tables by default (where small), and its config
    is an `AnchoredTableKernel`: unchanged, the ALiBi + content model's rollout; its tables at gain 1 are the
    mean attention the ``attention`` statistic measures (the ALiBi bias inside the rows)."""
    out = tmp_path / "bloom"
    argv = ["measure", saved["bloom"], "--texts", saved["texts"], "--length", "8", "--samples", "2", "--quiet"]
    assert main([str(item) for item in [*argv, "--out", out]]) == 0
    import json

    stats = json.loads((out / "metadata.json").read_text())["stats"]
    assert stats == ["lambda", "content", "influence", "attention_gains", "attention_distances", "paths"]
    model = jaxroll.load_config(out / "config.yaml")
    assert isinstance(model.kernel, jaxroll.AnchoredTableKernel)
    analytic = jaxroll.RolloutModel.create(kernel=model.kernel.anchor, lambdas=model.lambdas, sequence_length=8,
                                          probability_shares=model.kernel.probability_shares)
    np.testing.assert_allclose(jaxroll.influence(model), jaxroll.influence(analytic), rtol=0, atol=1e-12)
    both = tmp_path / "both"
    assert main([str(item) for item in [*argv, "--stats", "lambda,attention,attention_gains", "--out", both]]) == 0
    with np.load(both / "measurement.npz") as data:
        one = list(data["gain_grid"]).index(1.0)
        np.testing.assert_allclose(data["gain_rows"][:, one], data["attention_mean"], rtol=0, atol=1e-12)
