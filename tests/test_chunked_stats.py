"""Statistics of attention rows recomputed in chunks from q and k, against a dense computation in the test.

The oracle is each model's own eager attention: a float64 model run under
`full_precision` (float64 end to end, its softmax included) with
``output_attentions=True``, its ``(S, H, N, N)`` probabilities per layer
turned into every statistic by the NumPy formulas below (mean attention,
mean attention by offset, attention sinks, per-head kernels, norm kernels).
`measure` never forms those arrays on the families whose logit it states
exactly: it recomputes rows from the hooked q and k, eager and sdpa alike,
in chunks. Tolerance 1e-10 (float64 on both sides, different summation
orders). The chunk size (1, 3, N rows) does not change the results (1e-13).
Where the rows cannot be recomputed exactly (Qwen3's QK-norm family has no
named rotary module) the hooked eager probabilities are read, and the
same oracle holds.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxroll.interventions import parse  # noqa: E402
from jaxroll.measure import attention_rows, measure  # noqa: E402
from jaxroll.measure.patching import patch  # noqa: E402
from jaxroll.measure.layer_maps import resolve  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

VOCAB, HEADS, HIDDEN, N, S = 64, 4, 32, 11, 3
ROTARY = dict(num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2, hidden_size=HIDDEN,
              intermediate_size=48, vocab_size=VOCAB, max_position_embeddings=64)


def _config(family):
    T = transformers
    return {
        "llama": lambda: T.LlamaConfig(**ROTARY),
        "gpt2": lambda: T.GPT2Config(n_layer=2, n_head=HEADS, n_embd=HIDDEN, vocab_size=VOCAB, n_positions=64),
        "opt": lambda: T.OPTConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN, ffn_dim=48,
                                   vocab_size=VOCAB, max_position_embeddings=64, word_embed_proj_dim=HIDDEN),
        "gpt_neox": lambda: T.GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN,
                                            intermediate_size=48, vocab_size=VOCAB, rotary_pct=0.5,
                                            max_position_embeddings=64),
        "mistral": lambda: T.MistralConfig(**ROTARY, sliding_window=4),
        # Sliding from layer 1 on (layer_types): each layer its own window.
        "qwen2": lambda: T.Qwen2Config(**ROTARY, use_sliding_window=True, sliding_window=4, max_window_layers=1),
        "bloom": lambda: T.BloomConfig(n_layer=2, n_head=HEADS, hidden_size=HIDDEN, vocab_size=VOCAB),
        "mpt": lambda: T.MptConfig(n_layers=2, n_heads=HEADS, d_model=HIDDEN, vocab_size=VOCAB, max_seq_len=64),
        "qwen3": lambda: T.Qwen3Config(**ROTARY, head_dim=HIDDEN // HEADS),
    }[family]()


def tiny(family, implementation="eager", seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=implementation)
    # Larger weights than the default init: attention far from uniform, so the statistics differ by offset.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "proj" in name or "attn" in name or "query_key_value" in name or "Wqkv" in name:
                parameter.mul_(4.0)
    return model.double().eval()


def ids(seed=5):
    return np.random.default_rng(seed).integers(0, VOCAB, (S, N))


def dense_probabilities(model, token_ids, interventions=()):
    """The model's own eager probabilities, float64 end to end: (L, S, H, N, N) NumPy."""
    changes = list(interventions)
    with torch.no_grad(), full_precision(model):
        if changes:
            with patch(model, changes, resolve(model)):
                out = model(torch.as_tensor(token_ids), output_attentions=True, use_cache=False)
        else:
            out = model(torch.as_tensor(token_ids), output_attentions=True, use_cache=False)
    return np.stack([a.numpy() for a in out.attentions])


def dense_statistics(p):
    """Every statistic from the dense (L, S, H, N, N) probabilities, in NumPy float64 loops and means."""
    layers, sequences, heads, n, _ = p.shape
    offsets = np.zeros((layers, heads, n))
    for o in range(n):
        offsets[:, :, o] = np.mean([p[:, :, :, i, i - o] for i in range(o, n)], axis=0).mean(axis=1)
    received = p.sum(axis=3) / np.arange(n, 0, -1)  # (L, S, H, N): sum_i A[i, k] / (N - k)
    return {"attention_mean": p.mean(axis=(1, 2)), "attention_offsets": offsets,
            "attention_heads": p.mean(axis=1), "sink_received": received.mean(axis=1),
            "sink_first_share": np.cumsum(p, axis=-1).mean(axis=(0, 2, 3, 1))}


STATS = ("lambda", "influence", "attention", "attention_offsets", "sinks", "attention_heads")


def _check(result, expected):
    measured = {"attention_mean": result.attention_mean} | {name: result.extra[name] for name in expected
                                                              if name != "attention_mean"}
    for name, value in expected.items():
        np.testing.assert_allclose(measured[name], value, rtol=0, atol=1e-10, err_msg=name)


CASES = [("llama", "eager"), ("llama", "sdpa"), ("gpt2", "eager"), ("gpt2", "sdpa"), ("opt", "eager"),
         ("gpt_neox", "eager"), ("gpt_neox", "sdpa"), ("mistral", "eager"), ("mistral", "sdpa"),
         ("qwen2", "eager"), ("qwen2", "sdpa"), ("bloom", "eager"), ("mpt", "eager")]


@pytest.mark.parametrize("family,implementation", CASES)
def test_chunked_statistics_equal_the_dense_computation(family, implementation, monkeypatch):
    # Chunks of 3 rows (batch 2: 8 B H N bytes per row): N = 11 leaves a last chunk of 2.
    monkeypatch.setattr(attention_rows, "CHUNK_BYTES", 8 * 2 * HEADS * N * 3)
    model = tiny(family, implementation)
    result = measure(model, ids(), stats=STATS, batch_size=2)
    assert result.metadata["attention_rows"] == "recomputed from q, k in chunks"
    oracle = dense_probabilities(tiny(family, "eager"), ids())
    _check(result, dense_statistics(oracle))


def test_the_hooked_probabilities_stay_where_rows_are_not_recomputable():
    model = tiny("qwen3")
    assert not attention_rows.recomputable(resolve(model).layer_map)
    result = measure(model, ids(), stats=STATS, batch_size=2)
    assert result.metadata["attention_rows"] is None
    _check(result, dense_statistics(dense_probabilities(model, ids())))


@pytest.mark.parametrize("family", ["llama", "bloom"])
def test_the_chunk_size_does_not_change_the_results(family, monkeypatch):
    results = []
    for rows in (1, 3, N):
        monkeypatch.setattr(attention_rows, "CHUNK_BYTES", 8 * 2 * HEADS * N * rows)
        assert attention_rows.chunk_rows(2, HEADS, N) == rows
        results.append(measure(tiny(family), ids(), stats=STATS, batch_size=2))
    oracle = dense_statistics(dense_probabilities(tiny(family), ids()))
    for result in results:
        _check(result, oracle)
        for name in ("attention_offsets", "sink_received", "sink_first_share", "attention_heads"):
            np.testing.assert_allclose(result.extra[name], results[-1].extra[name], rtol=0, atol=1e-13)
        np.testing.assert_allclose(result.attention_mean, results[-1].attention_mean, rtol=0, atol=1e-13)


@pytest.mark.parametrize("family,spec", [("bloom", "tau=0.7,slope_scale=0.5"), ("llama", "tau=1.5,kappa=0.5")])
def test_an_intervened_eager_model_is_recomputed_with_its_change(family, spec, monkeypatch):
    monkeypatch.setattr(attention_rows, "CHUNK_BYTES", 8 * 2 * HEADS * N * 4)
    changes = parse(spec)
    result = measure(tiny(family), ids(), stats=STATS, batch_size=2, interventions=changes)
    assert result.metadata["attention_rows"]
    _check(result, dense_statistics(dense_probabilities(tiny(family), ids(), changes)))


def _value_norms(model, token_ids):
    """Llama: n_h(j) = ||W_O^h v_h(j)|| (S, L, H, N), from the value projection's output, in NumPy."""
    values = {}
    handles = [layer.self_attn.v_proj.register_forward_hook(
        lambda module, args, out, t=t: values.__setitem__(t, out.detach().numpy()))
        for t, layer in enumerate(model.model.layers)]
    try:
        dense_probabilities(model, token_ids)
    finally:
        for handle in handles:
            handle.remove()
    head_dim, groups = HIDDEN // HEADS, HEADS // 2
    norms = []
    for t, layer in enumerate(model.model.layers):
        v = values[t].reshape(S, N, HEADS // groups, head_dim).repeat(groups, axis=2)  # grouped keys repeat
        w = layer.self_attn.o_proj.weight.detach().numpy()  # (D, H d)
        norms.append(np.stack([np.linalg.norm(v[:, :, h] @ w[:, h * head_dim:(h + 1) * head_dim].T, axis=-1)
                               for h in range(HEADS)], axis=1))  # (S, H, N)
    return np.stack(norms)  # (L, S, H, N)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_norm_kernels_from_chunked_rows_equal_the_dense_weighting(implementation):
    model = tiny("llama", implementation)
    result = measure(model, ids(), stats=("lambda", "norm_kernels"), batch_size=2)
    twin = tiny("llama")
    p = dense_probabilities(twin, ids())
    weighted = p * _value_norms(twin, ids())[:, :, :, None, :]
    expected = (weighted / weighted.sum(axis=-1, keepdims=True)).mean(axis=1)
    np.testing.assert_allclose(result.extra["norm_kernels"], expected, rtol=0, atol=1e-10)
