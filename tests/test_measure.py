"""jaxroll.measure on tiny random Hugging Face models, against independent oracles.

Every model here is built from a config object with a fixed seed, in float64
where tolerances are tight, and never downloaded. The oracles are plain
NumPy float64 formulas written in this file (ALiBi softmax, q.k means,
finite differences), closed forms (uniform attention, the lambda scaling
law) or properties the theory proves (causality, the one-layer rollout).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import ConfigError  # noqa: E402
from jaxroll.measure import measure, influence_gradients, write_measurement  # noqa: E402
from jaxroll.measure.hooks import Hooks  # noqa: E402
from jaxroll.measure.layer_maps import resolve  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

VOCAB = 64
HEADS = 4


def _config(family, layers=2, heads=HEADS, hidden=32, **extra):
    if family == "bloom":
        return transformers.BloomConfig(n_layer=layers, n_head=heads, hidden_size=hidden, vocab_size=VOCAB, **extra)
    if family == "mpt":
        return transformers.MptConfig(n_layers=layers, n_heads=heads, d_model=hidden, vocab_size=VOCAB,
                                      max_seq_len=64, **extra)
    if family == "falcon":
        options = dict(alibi=True, parallel_attn=False, new_decoder_architecture=False, multi_query=False, bias=True)
        return transformers.FalconConfig(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden,
                                         vocab_size=VOCAB, **(options | extra))
    if family == "gpt2":
        return transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=hidden, vocab_size=VOCAB,
                                       n_positions=64, bos_token_id=0, eos_token_id=0, **extra)
    classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config}
    return classes[family](num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                           hidden_size=hidden, intermediate_size=2 * hidden, vocab_size=VOCAB, **extra)


def tiny(family, *, seed=0, implementation="eager", **kwargs):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family, **kwargs),
                                                          attn_implementation=implementation)
    return model.double().eval()


def token_ids(count, length, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (count, length))


def softmax_rows(scores):
    """Causal row softmax in float64 (the oracle): -inf above the diagonal."""
    n = scores.shape[-1]
    scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)


def standard_slopes(heads):
    # Press et al. (2022) for a power of two: 2^(-8 (h + 1) / H), exact in bfloat16.
    return 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)


# Where the residual stream after the attention add enters a norm (sequential blocks):
POST_ATTENTION_NORM = {"bloom": "post_attention_layernorm", "mpt": "norm_2", "falcon": "post_attention_layernorm",
                       "gpt2": "ln_2", "llama": "post_attention_layernorm", "mistral": "post_attention_layernorm",
                       "qwen2": "post_attention_layernorm"}
FAMILIES = tuple(POST_ATTENTION_NORM)


# ---------------------------------------------------------------- lambda


@pytest.mark.parametrize("family", FAMILIES)
def test_lambda_in_unit_interval_and_influence_normalised(family):
    model = tiny(family)
    stats = ("lambda", "influence") if family in ("llama", "mistral", "qwen2") else ("lambda", "content", "influence")
    result = measure(model, token_ids(3, 10), stats=stats)
    assert result.lambdas.shape == (2,) and result.lambdas_per_sequence.shape == (3, 2)
    assert np.all((result.lambdas_per_sequence >= 0) & (result.lambdas_per_sequence <= 1))
    # Mean and std across sequences, recomputed from the per-sequence values.
    np.testing.assert_allclose(result.lambdas, result.lambdas_per_sequence.mean(0), rtol=0, atol=1e-15)
    np.testing.assert_allclose(result.lambdas_std, result.lambdas_per_sequence.std(0), rtol=0, atol=1e-15)
    assert np.all(np.isfinite(result.influence)) and np.all(result.influence >= 0)
    assert abs(result.influence.sum() - 1.0) < 1e-12


def _store(store, key, tensor):
    # A hook that returns None leaves the module's input and output alone.
    store.setdefault(key, tensor.detach().clone())


def _layer0_norms(model, ids):
    """||x||, ||a|| per token at layer 0, read by this test's own hooks."""
    resolved = resolve(model)
    seen = {}
    handles = [
        resolved.blocks[0].register_forward_pre_hook(
            lambda module, args, kwargs: _store(seen, "x", args[0] if args else kwargs["hidden_states"]),
            with_kwargs=True),
        resolved.output_projections[0].register_forward_hook(
            lambda module, args, output: _store(seen, "a", output)),
    ]
    with torch.no_grad(), full_precision(model):  # float64 throughout, as measure runs a float64 model
        model(torch.as_tensor(ids)[None], use_cache=False)
    for handle in handles:
        handle.remove()
    return seen["x"][0].norm(dim=-1).numpy(), seen["a"][0].norm(dim=-1).numpy()


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_lambda_scales_with_the_output_projection_as_the_formula_says(family):
    ids = token_ids(1, 12)
    model = tiny(family)
    x_norm, a_norm = _layer0_norms(model, ids[0])
    projection = resolve(model).output_projections[0]
    for factor in (0.25, 3.0):
        scaled = tiny(family)
        target = resolve(scaled).output_projections[0]
        with torch.no_grad():
            target.weight.copy_(projection.weight * factor)
            if target.bias is not None:
                target.bias.copy_(projection.bias * factor)
        measured = measure(scaled, ids, stats=("lambda",)).lambdas[0]
        # Layer 0's input does not depend on the projection, so per token
        # lambda = c||a|| / (||x|| + c||a||), averaged over the positions.
        expected = np.mean(factor * a_norm / (x_norm + factor * a_norm))
        assert abs(measured - expected) < 1e-13


def test_zeroed_output_projection_gives_lambda_zero():
    model = tiny("mpt")
    for projection in resolve(model).output_projections:
        with torch.no_grad():
            projection.weight.zero_()
    result = measure(model, token_ids(2, 8), stats=("lambda",))
    assert np.all(result.lambdas == 0.0) and np.all(result.lambdas_std == 0.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_hooked_attention_output_is_the_residual_difference(family):
    model = tiny(family)
    resolved = resolve(model)
    hooked_x, hooked_a, after = {}, {}, {}
    handles = [getattr(block, POST_ATTENTION_NORM[family]).register_forward_pre_hook(
        lambda module, args, layer=layer: _store(after, layer, args[0]))
        for layer, block in enumerate(resolved.blocks)]
    with Hooks(resolved, model.config, on_block_input=lambda t, x: hooked_x.setdefault(t, x),
               on_attention_output=lambda t, a: hooked_a.setdefault(t, a)), torch.no_grad():
        model(torch.as_tensor(token_ids(1, 9)), use_cache=False)
    for handle in handles:
        handle.remove()
    for layer in range(2):
        # Residual stream after the attention add = x + a (dropout is off in eval).
        np.testing.assert_allclose(after[layer].numpy(), (hooked_x[layer] + hooked_a[layer]).numpy(),
                                   rtol=0, atol=1e-12)


# ---------------------------------------------------------------- attention and content


def _split(family, fused, heads):
    """q, k (N, H, d) from the fused projection output (N, 3D), per the model sources."""
    n, width = fused.shape
    if family == "falcon-mq":  # (heads + 2, d): the queries, one key, one value
        view = fused.reshape(n, heads + 2, -1)
        return view[:, :heads], np.repeat(view[:, heads:heads + 1], heads, axis=1)
    d = width // (3 * heads)
    if family in ("bloom", "falcon"):  # (heads, 3, d)
        view = fused.reshape(n, heads, 3, d)
        return view[:, :, 0], view[:, :, 1]
    return fused[:, : heads * d].reshape(n, heads, d), fused[:, heads * d: 2 * heads * d].reshape(n, heads, d)


def _qkv_outputs(model, family, ids):
    """Fused QKV outputs per layer, read by this test's own hooks."""
    modules = [block.self_attention.query_key_value if family.startswith(("bloom", "falcon")) else block.attn.Wqkv
               for block in resolve(model).blocks]
    outputs = {}
    handles = [module.register_forward_hook(lambda m, a, out, t=t: _store(outputs, t, out[0]))
               for t, module in enumerate(modules)]
    return outputs, handles


def _oracle_attention(family, q, k, heads, head_dim, doubled=False):
    """Per-head probabilities (H, N, N) from q, k (N, H, d): the architectures' logits."""
    n = q.shape[0]
    qk = np.einsum("ihd,jhd->hij", q, k)
    m = standard_slopes(heads)[:, None, None]
    j = np.arange(n)[None, None, :]
    if family.startswith("falcon"):
        scores = (qk + (2.0 if doubled else 1.0) * m * j) / math.sqrt(head_dim)
    else:  # BLOOM and MPT: the scaled product plus m j (MPT's offset is constant per row)
        scores = qk / math.sqrt(head_dim) + m * j
    return softmax_rows(scores)


@pytest.mark.parametrize("family,doubled", [("bloom", False), ("mpt", False), ("falcon", False), ("falcon", True),
                                            ("falcon-mq", False)])
def test_attention_from_hooked_q_k_and_slopes_equals_the_model(family, doubled):
    model = tiny("falcon", multi_query=True) if family == "falcon-mq" else tiny(family)
    ids = token_ids(1, 11)
    outputs, handles = _qkv_outputs(model, family, ids)
    # Falcon: the model's eager path is the doubled formula; the intended
    # (single) one is what measure's hook gives on the same path.
    falcon_once = family.startswith("falcon") and not doubled
    with Hooks(resolve(model), model.config, zero_falcon_alibi=falcon_once), torch.no_grad():
        attentions = model(torch.as_tensor(ids), use_cache=False, output_attentions=True).attentions
    for handle in handles:
        handle.remove()
    for layer in range(2):
        q, k = _split(family, outputs[layer].numpy(), HEADS)
        expected = _oracle_attention(family, q, k, HEADS, 32 // HEADS, doubled)
        # The models take their softmax in float32: 1e-6 covers its rounding.
        np.testing.assert_allclose(attentions[layer][0].numpy(), expected, rtol=0, atol=1e-6)


def _zero_queries(model, family):
    for block in resolve(model).blocks:
        projection = block.self_attention.query_key_value if family in ("bloom", "falcon") else block.attn.Wqkv
        with torch.no_grad():
            out_features = projection.weight.shape[0]
            if family in ("bloom", "falcon"):
                rows = torch.arange(out_features).reshape(HEADS, 3, -1)[:, 0].reshape(-1)
            else:
                rows = torch.arange(out_features // 3)
            projection.weight[rows] = 0.0
            if projection.bias is not None:
                projection.bias[rows] = 0.0


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_zeroed_queries_give_the_pure_alibi_softmax(family):
    model = tiny(family)
    _zero_queries(model, family)
    n = 10
    with torch.no_grad():
        attentions = model(torch.as_tensor(token_ids(1, n)), use_cache=False, output_attentions=True).attentions
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    expected = softmax_rows(-standard_slopes(HEADS)[:, None, None] * (i - j))
    for layer in range(2):
        np.testing.assert_allclose(attentions[layer][0].numpy(), expected, rtol=0, atol=1e-6)


def test_zeroed_queries_and_zero_slopes_give_uniform_attention(monkeypatch):
    from transformers.models.bloom import modeling_bloom

    monkeypatch.setattr(modeling_bloom, "_get_alibi_slopes",
                        lambda num_heads, device: torch.zeros(num_heads, device=device))
    model = tiny("bloom")
    _zero_queries(model, "bloom")
    n = 7
    result = measure(model, token_ids(2, n), stats=("lambda", "attention"))
    expected = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]  # A[i, j] = 1 / (i + 1)
    np.testing.assert_allclose(result.attention_mean, np.broadcast_to(expected, (2, n, n)), rtol=0, atol=1e-6)
    assert np.all(result.alibi_slopes == 0.0)  # read from the (patched) builder


@pytest.mark.parametrize("family", ["bloom", "mpt", "falcon", "falcon-mq"])
def test_content_scores_equal_the_mean_q_dot_k_matrix(family):
    model = tiny("falcon", multi_query=True) if family == "falcon-mq" else tiny(family)
    sequences = token_ids(3, 9, seed=1)
    outputs_per_sequence = []
    for row in sequences:
        outputs, handles = _qkv_outputs(model, family, row)
        with torch.no_grad(), full_precision(model):
            model(torch.as_tensor(row)[None], use_cache=False)
        for handle in handles:
            handle.remove()
        outputs_per_sequence.append(outputs)
    # Oracle: the full N x N products, averaged over sequences, in NumPy float64.
    mean = np.mean([[np.einsum("ihd,jhd->hij", *_split(family, outputs[t].numpy(), HEADS)) for t in range(2)]
                    for outputs in outputs_per_sequence], axis=0)  # (L, H, N, N)
    n = mean.shape[-1]
    lower = np.tril(np.ones((n, n), dtype=bool), k=-1)
    base = mean[..., lower].mean(-1)
    diagonal = np.diagonal(mean, axis1=-2, axis2=-1).mean(-1) - base
    # The plain eager forward above is Falcon's doubled formula; measure the same.
    result = measure(model, sequences, stats=("content", "qk"), positions=2, falcon_alibi="doubled")
    np.testing.assert_allclose(result.content_base, base, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(result.content_diagonal, diagonal, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(result.qk_mean, mean[..., ::2, ::2], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(result.qk_positions, np.arange(0, n, 2))
    assert result.logit_scale == pytest.approx(1 / math.sqrt(32 // HEADS), rel=1e-15)


def test_slopes_come_from_the_model_builder_including_non_power_of_two_heads():
    model = tiny("bloom", layers=1, heads=112, hidden=224)
    result = measure(model, token_ids(1, 4), stats=("lambda",))
    # BLOOM's rule for 112 heads (n = 64): 2^(-8 (h+1)/64) for h < 64, then 2^(-4 (2k+1)/64).
    expected = np.concatenate([2.0 ** (-8.0 * np.arange(1, 65) / 64), 2.0 ** (-4.0 * np.arange(1, 97, 2) / 64)])
    np.testing.assert_allclose(result.alibi_slopes, expected, rtol=1e-6)  # float32 builder
    assert np.max(np.abs(result.alibi_slopes - 2.0 ** (-8.0 * np.arange(1, 113) / 112))) > 1e-2
    np.testing.assert_allclose(result.alibi_slopes, jaxroll.alibi_slopes(112), rtol=1e-6)


# ---------------------------------------------------------------- influence


def test_influence_matches_finite_differences():
    # GPT-2 computes its softmax in the model dtype (float64 here), so f is
    # smooth to float64 precision; BLOOM, MPT and Llama round it to float32.
    model = tiny("gpt2", hidden=16)
    ids = torch.as_tensor(token_ids(1, 5, seed=3))
    result = measure(model, ids.numpy(), stats=("influence",))
    embeddings = model.get_input_embeddings()(ids).detach()
    with torch.no_grad():
        base = torch.softmax(model(inputs_embeds=embeddings, use_cache=False).logits[0, -1], -1)
        token = int(torch.argmax(base))

        def f(e):
            return float(torch.softmax(model(inputs_embeds=e, use_cache=False).logits[0, -1], -1)[token])

        step = 1e-5
        gradient = np.zeros(embeddings.shape[1:])
        for j in range(embeddings.shape[1]):
            for c in range(embeddings.shape[2]):
                plus, minus = embeddings.clone(), embeddings.clone()
                plus[0, j, c] += step
                minus[0, j, c] -= step
                gradient[j, c] = (f(plus) - f(minus)) / (2 * step)
    norms = np.linalg.norm(gradient, axis=-1)
    # Central differences: truncation ~ step^2 * f''' ~ 1e-10, rounding ~ 1e-16 / step ~ 1e-11.
    np.testing.assert_allclose(result.influence_raw, norms, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(result.influence, norms / norms.sum(), rtol=1e-6, atol=1e-9)
    assert result.target_token[0] == token


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_influence_is_causal(family):
    model = tiny(family)
    long = token_ids(1, 14, seed=5)[0]
    n = 9
    short = influence_gradients(model, long[:n])
    within = influence_gradients(model, long, position=n - 1)
    # Tokens after position n-1 change nothing at or before it (causal masking).
    np.testing.assert_allclose(within[:n], short, rtol=1e-10, atol=1e-14)
    assert np.all(within[n:] == 0.0)


def test_one_layer_one_head_influence_is_the_last_attention_row():
    # Falcon: softmax in the model dtype (float64), no embedding LayerNorm.
    model = tiny("falcon", layers=1, heads=1, hidden=16)
    _zero_queries_single_head(model)
    n = 8
    ids = np.full((1, n), 7)  # identical tokens: every position sees the same Jacobian
    result = measure(model, ids, stats=("lambda", "influence"))
    slope = result.alibi_slopes_logit[0]  # m / sqrt(d), Falcon's intended logit
    assert slope == 2.0 ** -8 / math.sqrt(16)
    row = softmax_rows(-slope * (np.arange(n)[:, None] - np.arange(n)[None, :]))[-1]
    # For j < N-1 only the attention path reaches f: influence_j is proportional to A[N-1, j].
    head = result.influence[:-1] / result.influence[:-1].sum()
    np.testing.assert_allclose(head, row[:-1] / row[:-1].sum(), rtol=1e-11)
    # The one-layer rollout's last row, (1 - lambda) e_{N-1} + lambda A[N-1], has the same shape there.
    rollout = jaxroll.RolloutModel.create(num_layers=1, num_heads=1, lambdas=result.lambdas,
                                          alibi_slopes=[slope], sequence_length=n)
    predicted = np.asarray(jaxroll.influence(rollout))
    np.testing.assert_allclose(head, predicted[:-1] / predicted[:-1].sum(), rtol=1e-11)


def _zero_queries_single_head(model):
    projection = model.transformer.h[0].self_attention.query_key_value
    d = projection.weight.shape[0] // 3
    with torch.no_grad():
        projection.weight[:d] = 0.0  # layout (heads=1, 3, d): the first d rows are the queries
        projection.bias[:d] = 0.0


def test_bfloat16_agrees_with_float32_to_bfloat16_precision():
    ids = token_ids(2, 10)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny("bloom").to(dtype)
        results[dtype] = measure(model, ids, stats=("lambda", "content", "influence"))
    low, high = results[torch.bfloat16], results[torch.float32]
    for name in ("lambdas", "influence", "content_diagonal", "content_base"):
        assert np.all(np.isfinite(getattr(low, name)))
    # bfloat16 keeps 8 bits of mantissa (relative 2^-8 ~ 4e-3 per operation):
    # a few percent after two blocks, against the float32 run of the same weights.
    np.testing.assert_allclose(low.lambdas, high.lambdas, rtol=5e-2)
    np.testing.assert_allclose(low.influence, high.influence, rtol=0.2, atol=1e-3)
    assert abs(low.influence.sum() - 1.0) < 1e-12 and low.metadata["dtype"] == "bfloat16"


def test_activation_checkpointing_changes_nothing():
    model = tiny("falcon", layers=3)
    ids = token_ids(2, 10)
    with_checkpoints = measure(model, ids, stats=("lambda", "content", "influence"), checkpointing=True)
    without = measure(model, ids, stats=("lambda", "content", "influence"), checkpointing=False)
    # The recomputed forward passes must not be counted again.
    np.testing.assert_allclose(with_checkpoints.lambdas_per_sequence, without.lambdas_per_sequence, rtol=0, atol=1e-15)
    np.testing.assert_allclose(with_checkpoints.content_diagonal, without.content_diagonal, rtol=0, atol=1e-15)
    np.testing.assert_allclose(with_checkpoints.influence_raw, without.influence_raw, rtol=1e-12, atol=1e-16)


# ---------------------------------------------------------------- Falcon's two formulas


def test_falcon_once_is_the_sdpa_path_and_doubled_the_eager_path():
    ids = token_ids(2, 10, seed=2)
    eager = tiny("falcon")
    sdpa = tiny("falcon", implementation="sdpa")
    once = measure(eager, ids, stats=("influence",), falcon_alibi="once")
    doubled = measure(eager, ids, stats=("influence",), falcon_alibi="doubled")
    once_sdpa = measure(sdpa, ids, stats=("influence",), falcon_alibi="once")
    with torch.no_grad():
        references = {name: np.array([float(torch.softmax(model(torch.as_tensor(row)[None]).logits[0, -1], -1).max())
                                      for row in ids]) for name, model in (("eager", eager), ("sdpa", sdpa))}
    np.testing.assert_allclose(once.target_probability, references["sdpa"], rtol=1e-12)
    np.testing.assert_allclose(once_sdpa.target_probability, references["sdpa"], rtol=1e-12)
    np.testing.assert_allclose(doubled.target_probability, references["eager"], rtol=1e-12)
    np.testing.assert_allclose(once.influence_raw, once_sdpa.influence_raw, rtol=1e-9)
    assert once.metadata["falcon_alibi"] == "once" and doubled.metadata["falcon_alibi"] == "doubled"
    d = 32 // HEADS
    np.testing.assert_allclose(once.alibi_slopes_logit, standard_slopes(HEADS) / math.sqrt(d), rtol=1e-15)
    np.testing.assert_allclose(doubled.alibi_slopes_logit, 2 * standard_slopes(HEADS) / math.sqrt(d), rtol=1e-15)
    with pytest.raises(ConfigError, match="falcon_alibi"):
        measure(sdpa, ids, stats=("influence",), falcon_alibi="doubled")


# ---------------------------------------------------------------- outputs, resume, errors


def test_written_config_loads_and_equals_the_measurement(tmp_path):
    model = tiny("bloom")
    result = measure(model, token_ids(2, 8), stats=("lambda", "content", "influence"))
    write_measurement(result, tmp_path)
    loaded = jaxroll.load_config(tmp_path / "config.yaml")
    np.testing.assert_array_equal(np.asarray(loaded.lambdas), result.lambdas)
    np.testing.assert_array_equal(np.asarray(loaded.alibi_slopes), np.broadcast_to(result.alibi_slopes_logit, (2, HEADS)))
    np.testing.assert_array_equal(np.asarray(loaded.diagonal_scores), result.logit_scale * result.content_diagonal)
    np.testing.assert_array_equal(np.asarray(loaded.base_scores), result.logit_scale * result.content_base)
    assert loaded.sequence_length == 8
    profile = jaxroll.read_profile(tmp_path / "influence.csv")
    np.testing.assert_array_equal(profile, result.influence)
    with pytest.raises(ConfigError, match="exists"):
        write_measurement(result, tmp_path)


def test_resume_continues_from_the_last_completed_sequence(tmp_path):
    model = tiny("mpt")
    ids = token_ids(4, 8)
    stats = ("lambda", "content", "influence", "attention")
    reference = measure(model, ids, stats=stats)
    calls = []

    def crash(module, args, kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
    handle = model.register_forward_pre_hook(crash, with_kwargs=True)
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(KeyboardInterrupt):  # one sequence per pass: a checkpoint after each
        measure(model, ids, stats=stats, checkpoint_path=path, batch_size=1)
    handle.remove()
    with np.load(path) as saved:
        assert int(saved["count"]) == 2
    resumed = measure(model, ids, stats=stats, checkpoint_path=path, resume=True)
    for name in ("lambdas_per_sequence", "influence_raw", "content_diagonal", "content_base", "attention_mean"):
        np.testing.assert_allclose(getattr(resumed, name), getattr(reference, name), rtol=1e-13, atol=1e-16)
    with pytest.raises(ConfigError, match="other settings"):
        measure(model, ids[:, :7], stats=stats, checkpoint_path=path, resume=True)


def test_bad_input_gives_one_line_errors(tmp_path):
    model = tiny("bloom")
    cases = [
        lambda: measure(model, [[1, 2, 3], [1, 2]], stats=("lambda",)),
        lambda: measure(model, token_ids(1, 6), length=8, stats=("lambda",)),
        lambda: measure(model, token_ids(1, 6), stats=("lambda", "entropy")),
        lambda: measure(model, token_ids(1, 6), falcon_alibi="triple"),
        lambda: measure(tiny("llama"), token_ids(1, 6), stats=("content",)),
        lambda: measure(torch.nn.Linear(2, 2), token_ids(1, 6)),
        lambda: measure(_unknown_model(), token_ids(1, 6)),
        lambda: jaxroll.measure.load_model(tmp_path / "missing"),
        lambda: jaxroll.measure.read_texts(_empty(tmp_path)),
    ]
    for case in cases:
        with pytest.raises(ConfigError) as error:
            case()
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="no layer map"):
        measure(_unknown_model(), token_ids(1, 6))


def _unknown_model():
    # GPT-BigCode (multi-query, fused c_attn) has no entry in jaxroll.measure.families.
    config = transformers.GPTBigCodeConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=VOCAB, n_positions=32)
    return transformers.AutoModelForCausalLM.from_config(config)


def _empty(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n", encoding="utf-8")
    return path


def test_text_protocol_keeps_documents_in_order_with_enough_tokens(tmp_path):
    from jaxroll.measure import read_texts, select_sequences

    source = tmp_path / "docs.txt"
    source.write_text("a b c\n\nd e f g h\ni j\n\n\nk l m n o p\n", encoding="utf-8")
    documents = read_texts(source)
    assert documents == ["a b c", "d e f g h\ni j", "k l m n o p"]
    lines = tmp_path / "docs.jsonl"
    lines.write_text('{"text": "a b c"}\n{"text": "d e f g h i j"}\n', encoding="utf-8")
    assert read_texts(lines) == ["a b c", "d e f g h i j"]

    def tokenizer(text):  # one id per letter: an independent, exact tokenizer
        return {"input_ids": [ord(c) - ord("a") for c in text.split() for c in c]}
    ids, kept = select_sequences(documents, tokenizer, 5, 2)
    np.testing.assert_array_equal(kept, [1, 2])
    np.testing.assert_array_equal(ids, [[3, 4, 5, 6, 7], [10, 11, 12, 13, 14]])
    with pytest.raises(ConfigError, match="samples"):
        select_sequences(documents, tokenizer, 5, 3)
