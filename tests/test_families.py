"""Every family of `jaxroll.measure.families`: each statistic against a hook-free recomputation.

Each family is a tiny random-init model built from its config class (float64,
eager attention). The oracle reads only what the model returns without
hooks (``output_hidden_states``, ``output_attentions``) and its weights:

- the attention output ``a`` is recomputed from the returned probabilities,
  the value vectors (the value module called as a plain function on the
  block's input norm) and W_O (then the post-attention norm where a family
  has one); ``lambda_t = mean_i ||a_i|| / (||x_i|| + ||a_i||)``;
- the MLP update ``m = x_{t+1} - x_t - a`` (every family's block ends with
  ``+ m``, sequential or parallel), on the layers whose output is returned
  before the final norm;
- the influence by plain autograd on the input embeddings;
- content (learned and ALiBi positions) from the projections; the logit is
  checked by reproducing the model's probabilities from it.

float64 on both sides, the same modules: agreement to 1e-9 relative (rounding
of a different summation order only).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxroll import ConfigError  # noqa: E402
from jaxroll.measure import measure  # noqa: E402
from jaxroll.measure.families import FAMILIES, REFUSED  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402
from jaxroll.measure.refinements import measure_refinements  # noqa: E402
from leaf_gradients import leaf_gradient_share  # noqa: E402

VOCAB, HEADS, HIDDEN, N = 61, 4, 16, 8
ROTARY = dict(num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2, hidden_size=HIDDEN,
              intermediate_size=24, vocab_size=VOCAB, max_position_embeddings=32)


def _config(family):
    T = transformers
    configs = {
        "gpt2": lambda: T.GPT2Config(n_layer=2, n_head=HEADS, n_embd=HIDDEN, vocab_size=VOCAB, n_positions=32),
        "opt": lambda: T.OPTConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN, ffn_dim=24,
                                   vocab_size=VOCAB, max_position_embeddings=32, word_embed_proj_dim=HIDDEN),
        "bloom": lambda: T.BloomConfig(n_layer=2, n_head=HEADS, hidden_size=HIDDEN, vocab_size=VOCAB),
        "mpt": lambda: T.MptConfig(n_layers=2, n_heads=HEADS, d_model=HIDDEN, vocab_size=VOCAB, max_seq_len=32),
        "falcon": lambda: T.FalconConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN,
                                         vocab_size=VOCAB, alibi=True, parallel_attn=True, bias=True,
                                         new_decoder_architecture=False, multi_query=False),
        "falcon_rope": lambda: T.FalconConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN,
                                              vocab_size=VOCAB, alibi=False, parallel_attn=False, bias=False,
                                              new_decoder_architecture=False, multi_query=True),
        "gpt_neox": lambda: T.GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN,
                                            intermediate_size=24, vocab_size=VOCAB, rotary_pct=0.5,
                                            max_position_embeddings=32),
        "gptj": lambda: T.GPTJConfig(n_layer=2, n_head=HEADS, n_embd=HIDDEN, rotary_dim=2, vocab_size=VOCAB,
                                     n_positions=32),
        "llama": lambda: T.LlamaConfig(**ROTARY),
        "mistral": lambda: T.MistralConfig(**ROTARY, sliding_window=3),
        "mixtral": lambda: T.MixtralConfig(**ROTARY, num_local_experts=2, num_experts_per_tok=1),
        "qwen2": lambda: T.Qwen2Config(**ROTARY),
        "qwen3": lambda: T.Qwen3Config(**ROTARY, head_dim=HIDDEN // HEADS),
        "gemma2": lambda: T.Gemma2Config(**ROTARY, head_dim=HIDDEN // HEADS, sliding_window=3,
                                         query_pre_attn_scalar=HIDDEN // HEADS),
        "gemma3_text": lambda: T.Gemma3TextConfig(**ROTARY, head_dim=HIDDEN // HEADS, sliding_window=3,
                                                  query_pre_attn_scalar=HIDDEN // HEADS, sliding_window_pattern=2,
                                                  layer_types=["sliding_attention", "full_attention"]),
        "phi3": lambda: T.Phi3Config(**ROTARY, pad_token_id=0),
        "olmo2": lambda: T.Olmo2Config(**ROTARY),
        "stablelm": lambda: T.StableLmConfig(**ROTARY, partial_rotary_factor=0.5),
        "starcoder2": lambda: T.Starcoder2Config(**ROTARY, sliding_window=3),
    }
    return configs[family]()


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def tiny(family, seed=0):
    torch.manual_seed(seed)
    config = _config(family)
    config.pad_token_id = None if family != "phi3" else 0
    # Mixtral's default grouped-matmul experts take no float64 on the CPU: its plain loop does.
    experts = {"experts_implementation": "eager"} if family == "mixtral" else {}
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          **experts).double().eval()
    with torch.no_grad():  # larger weights than the init: lambda and the refinements well away from 0
        for parameter in model.parameters():
            parameter.mul_(8.0) if parameter.ndim == 2 else parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _module(root, path):
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _np(tensor):
    return tensor.detach().double().numpy()


# Per family, independently of jaxroll's layer maps: the block list, the attention's input norm(s),
# the value module and how its output holds (N, H, d), W_O, and the norm after W_O (or None).
ORACLE = {
    "gpt2": ("transformer.h", "ln_1", "attn.c_attn", "chunks", "attn.c_proj", None),
    "opt": ("model.decoder.layers", "self_attn_layer_norm", "self_attn.v_proj", "separate", "self_attn.out_proj", None),
    "bloom": ("transformer.h", "input_layernorm", "self_attention.query_key_value", "interleaved",
              "self_attention.dense", None),
    "mpt": ("transformer.blocks", "norm_1", "attn.Wqkv", "chunks", "attn.out_proj", None),
    "falcon": ("transformer.h", "input_layernorm", "self_attention.query_key_value", "falcon",
               "self_attention.dense", None),
    "gpt_neox": ("gpt_neox.layers", "input_layernorm", "attention.query_key_value", "interleaved",
                 "attention.dense", None),
    "gptj": ("transformer.h", "ln_1", "attn.v_proj", "separate", "attn.out_proj", None),
    "phi3": ("model.layers", "input_layernorm", "self_attn.qkv_proj", "phi3", "self_attn.o_proj", None),
    "olmo2": ("model.layers", None, "self_attn.v_proj", "separate", "self_attn.o_proj", "post_attention_layernorm"),
    **{name: ("model.layers", "input_layernorm", "self_attn.v_proj", "separate", "self_attn.o_proj",
              "post_attention_layernorm" if name.startswith("gemma") else None)
       for name in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma2", "gemma3_text", "stablelm",
                    "starcoder2")},
}


def _values(kind, output, heads, d):
    n = output.shape[0]
    if kind == "falcon" and output.shape[1] == (heads + 2) * d:  # multi-query: (H queries, 1 key, 1 value)
        return np.repeat(output.reshape(n, heads + 2, d)[:, -1:], heads, axis=1)
    if kind == "chunks":  # (3, H, d)
        return output[:, 2 * heads * d:].reshape(n, heads, d)
    if kind in ("interleaved", "falcon"):  # (H, 3, d)
        return output.reshape(n, heads, 3, d)[:, :, 2]
    if kind == "phi3":  # (H d | KV d | KV d)
        kv = (output.shape[1] - heads * d) // 2
        output = output[:, heads * d + kv:]
    values = output.reshape(n, -1, d)
    return np.repeat(values, heads // values.shape[1], axis=1)


def _call(module, array):
    with torch.no_grad(), full_precision(module):
        return _np(module(torch.as_tensor(array)[None])[0])


def oracle(model, ids):
    """Per sequence, the statistics of one row of token ids, from what the model returns without hooks."""
    family = model.config.model_type
    blocks_path, norm, value, kind, w_out, post = ORACLE[family]
    blocks = _module(model, blocks_path)
    d = HIDDEN // HEADS
    with torch.no_grad(), full_precision(model):  # float64 throughout, as measure runs it
        out = model(input_ids=torch.as_tensor(ids)[None], output_hidden_states=True, output_attentions=True,
                    use_cache=False)
    rows = {key: [] for key in ("lambda", "a", "x", "m", "attention", "norm_kernels", "head_norms")}
    for t, block in enumerate(blocks):
        x = _np(out.hidden_states[t][0])
        alpha = _np(out.attentions[t][0])
        normed = _call(_module(block, norm), x) if norm else x
        v = _values(kind, _call(_module(block, value), normed), HEADS, d)
        projection = _module(block, w_out)
        weight = _np(projection.weight)
        weight = weight.T if type(projection).__name__ == "Conv1D" else weight
        bias = _np(projection.bias) if getattr(projection, "bias", None) is not None else 0.0
        context = np.einsum("hij,jhd->ihd", alpha, v)
        a = context.reshape(len(x), HIDDEN) @ weight.T + bias
        per_head = weight.reshape(HIDDEN, HEADS, d)
        scale = np.ones(len(x))
        if post:  # an RMSNorm after W_O: a = g o / r, r = sqrt(mean(o^2) + eps) per token, g by the family's rule
            norm_weight = _np(_module(block, post).weight)
            gain = norm_weight if family == "olmo2" else 1.0 + norm_weight  # Gemma: (1 + weight)
            scale = np.sqrt((a * a).mean(-1) + model.config.rms_norm_eps)
            np.testing.assert_allclose(gain * a / scale[:, None], _call(_module(block, post), a), rtol=1e-12)
            a = gain * a / scale[:, None]
            per_head = gain[:, None, None] * per_head
        value_norms = np.stack([np.linalg.norm(v[:, h] @ per_head[:, h].T, axis=-1) for h in range(HEADS)])
        weighted = alpha * value_norms[:, None, :]
        xn, an = np.linalg.norm(x, axis=-1), np.linalg.norm(a, axis=-1)
        rows["lambda"].append(an / (xn + an))
        rows["x"].append(xn)
        rows["a"].append(an)
        rows["attention"].append(alpha)
        rows["norm_kernels"].append(weighted / weighted.sum(-1, keepdims=True))
        rows["head_norms"].append([(np.linalg.norm(context[:, h] @ per_head[:, h].T, axis=-1) / scale).mean()
                                   for h in range(HEADS)])
        if t + 1 < len(blocks):  # the last returned state has the final norm applied
            rows["m"].append(np.linalg.norm(_np(out.hidden_states[t + 1][0]) - x - a, axis=-1))
    return {key: np.asarray(value) for key, value in rows.items()}


def influence_oracle(model, ids):
    embeddings = model.get_input_embeddings()(torch.as_tensor(ids)[None]).detach().requires_grad_(True)
    with full_precision(model):
        logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, -1]
        (grad,) = torch.autograd.grad(torch.softmax(logits, -1).max(), embeddings)
    return _np(grad[0]).__pow__(2).sum(-1) ** 0.5


# Falcon's eager path adds its ALiBi bias twice: measured as the model computes it ("doubled").
VARIANT = {"falcon_alibi": "doubled"}


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["falcon_rope"])
def test_every_statistic_matches_a_hook_free_recomputation(family):
    model = tiny(family)
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, N))
    layer_map = FAMILIES[model.config.model_type]
    position = "rope" if family == "falcon_rope" else layer_map.position
    stats = ["lambda", "influence", "attention"] + (["content", "qk"] if position != "rope" else [])
    result = measure(model, ids, stats=",".join(stats), **VARIANT)
    assert result.metadata["position_encoding"] == position
    rows = [oracle(model, row) for row in ids]
    mean = {key: np.mean([row[key] for row in rows], axis=0) for key in rows[0]}
    np.testing.assert_allclose(result.lambdas, mean["lambda"].mean(-1), rtol=1e-9, err_msg="lambda")
    assert np.all(result.lambdas > 1e-3)  # something measured, not a vanishing attention path
    np.testing.assert_allclose(result.attention_mean, mean["attention"].mean(1), rtol=0, atol=1e-12)
    raw = np.mean([influence_oracle(model, row) for row in ids], axis=0)
    np.testing.assert_allclose(result.influence, raw / raw.sum(), rtol=1e-9, err_msg="influence")
    # The refinement ingredients of every switch this family allows.
    switches = ("position", "mlp", "norm", "heads")  # every family, post-norms included
    got = measure_refinements(model, ids, ingredients=switches).mean()
    np.testing.assert_allclose(got["lambda_positions"], mean["lambda"], rtol=1e-9, err_msg="lambda_positions")
    last = len(mean["m"])  # layers whose m the oracle has
    np.testing.assert_allclose(got["lambda_mlp_positions"][:last],
                               np.mean([r["a"][:last] / (r["x"][:last] + r["a"][:last] + r["m"]) for r in rows], 0),
                               rtol=1e-7, err_msg="lambda_mlp")  # m is a difference of states: 1e-7
    np.testing.assert_allclose(got["norm_kernels"], mean["norm_kernels"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["head_norms"], mean["head_norms"], rtol=1e-9)
    if "content" in stats:
        _check_content(model, ids, result)


def _check_content(model, ids, result):
    # The logit the family declares, logit_scale * q.k + bias_scale * m_h * j, reproduces the model's
    # own probabilities (one sequence: qk_mean is its q.k); the diagonal and base follow from qk.
    single = measure(model, ids[:1], stats="qk,attention", **VARIANT)
    with torch.no_grad():
        probabilities = _np(torch.stack(model(input_ids=torch.as_tensor(ids[:1]), output_attentions=True,
                                              use_cache=False).attentions)[:, 0])
    scores = float(single.logit_scale) * single.qk_mean
    scores = scores + single.alibi_slopes_logit[None, :, None, None] * np.arange(N)
    scores = np.where(np.tril(np.ones((N, N), bool)), scores, -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    tolerance = 1e-6  # several families take the softmax in float32 inside; a wrong scale misses by ~1e-1
    np.testing.assert_allclose(expected, probabilities, rtol=0, atol=tolerance)
    both = measure(model, ids, stats="qk", **VARIANT)
    low = np.tril(np.ones((N, N), bool), -1)
    np.testing.assert_allclose(result.content_base, both.qk_mean[..., low].mean(-1), rtol=1e-9)
    np.testing.assert_allclose(result.content_diagonal + result.content_base,
                               np.diagonal(both.qk_mean, axis1=-2, axis2=-1).mean(-1), rtol=1e-9)


@pytest.mark.parametrize("family", ["gptj", "gpt_neox", "falcon"])
def test_parallel_blocks_add_attention_and_mlp_read_from_the_same_input(family):
    """lambda_t in a parallel block: x_{t+1} = x + a(LN(x)) + m(LN'(x)), with m reading x, not x + a."""
    model = tiny(family)
    ids = np.random.default_rng(2).integers(0, VOCAB, (1, N))
    block = _module(model, ORACLE[family][0])[0]
    mlp_norm = {"gptj": "ln_1", "gpt_neox": "post_attention_layernorm", "falcon": "input_layernorm"}[family]
    with torch.no_grad(), full_precision(model):
        out = model(input_ids=torch.as_tensor(ids), output_hidden_states=True, output_attentions=True)
    x = _np(out.hidden_states[0][0])
    m = _call(block.mlp, _call(_module(block, mlp_norm), x))
    row = oracle(model, ids[0])
    a = _np(out.hidden_states[1][0]) - x - m
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), row["a"][0], rtol=1e-9)
    result = measure(model, ids, stats="lambda", **VARIANT)
    assert result.metadata["parallel_block"] is True
    np.testing.assert_allclose(result.lambdas[0], (row["a"][0] / (row["x"][0] + row["a"][0])).mean(), rtol=1e-9)


@pytest.mark.parametrize("family, expected", [("mistral", [3, 3]), ("gemma2", [3, None]),
                                              ("gemma3_text", [3, None]), ("starcoder2", [3, 3]),
                                              ("llama", [None, None])])
def test_sliding_windows_reach_the_measured_configuration(family, expected):
    model = tiny(family)
    result = measure(model, np.random.default_rng(3).integers(0, VOCAB, (1, N)), stats="lambda,attention")
    assert result.metadata["attention_windows"] == expected
    i, j = np.indices((N, N))
    for layer, window in enumerate(expected):
        outside = (j > i) | ((i - j >= window) if window else False)
        assert np.all(result.attention_mean[layer][outside] == 0)
        if window:  # the window is what the model used: inside it, weight
            assert np.all(result.attention_mean[layer][(i - j < window) & (j <= i)] > 0)
    kernels = np.asarray(result.to_rollout_model().kernel.kernels)  # the measured kernel carries the window
    if expected[0]:
        assert np.all(kernels[0][(i - j >= expected[0]) | (j > i)] == 0)


def test_refused_families_say_why_in_one_line():
    from jaxroll.measure.layer_maps import layer_map_for

    for model_type, reason in REFUSED.items():
        config = type("Config", (), {"model_type": model_type})()
        with pytest.raises(ConfigError, match="not supported") as error:
            layer_map_for(type("Model", (), {"config": config})())
        assert "\n" not in str(error.value) and reason in str(error.value)


def test_rotary_families_refuse_content_naming_the_rotation():
    model = tiny("qwen3")
    with pytest.raises(ConfigError, match="rotary") as error:
        measure(model, np.zeros((1, N), dtype=np.int64), stats="lambda,content")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gradient_share_matches_leaf_perturbations(family):
    """lambda_gradient = 1 - sum_j ||g_a(j)|| / sum_j ||g_x(j)||, g = df/d(leaf) with zero leaves added
    to each block's input and to each attention update a (plain autograd, no tensor hooks)."""
    model = tiny(family)
    ids = np.random.default_rng(4).integers(0, VOCAB, (1, N))
    blocks_path, _, _, _, w_out, post = ORACLE[family]
    blocks = _module(model, blocks_path)
    expected = leaf_gradient_share(model, ids, blocks, [_module(block, post or w_out) for block in blocks])
    got = measure_refinements(model, ids, ingredients=("gradient",)).mean()["lambda_gradient"]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    assert np.all(expected < 1)


def test_gemma2_head_norms_after_the_post_norm_match_a_manual_forward_of_the_layer():
    """Head h's share of a Gemma 2 attention update, g * W_O^h context_h(i) / r_i, from a forward written here.

    Layer 0 of the tiny Gemma 2 (float64, sliding window 3, soft-capped logits)
    from its weights: RMSNorm with (1 + weight), q/k/v, rotary tables from
    rope_theta in float64, logits q.k / sqrt(query_pre_attn_scalar) capped by
    c tanh(z / c), grouped heads; o = sum_h W_O^h context_h, r_i = sqrt(mean(o_i^2) + eps),
    g = 1 + weight of post_attention_layernorm; head_norms[0, h] = mean_i ||g * W_O^h context_h(i)|| / r_i.
    """
    model = tiny("gemma2")
    config, block = model.config, model.model.layers[0]
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, N))
    heads, kv, d, eps = HEADS, config.num_key_value_heads, HIDDEN // HEADS, config.rms_norm_eps
    attention = block.self_attn
    expected = []
    for row in ids:
        with torch.no_grad(), full_precision(model):
            x = model(input_ids=torch.as_tensor(row)[None], output_hidden_states=True).hidden_states[0][0]
        with torch.no_grad():
            h = x * (1.0 + block.input_layernorm.weight) / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
            q = (h @ attention.q_proj.weight.T).reshape(N, heads, d)
            k = (h @ attention.k_proj.weight.T).reshape(N, kv, d).repeat_interleave(heads // kv, dim=1)
            v = (h @ attention.v_proj.weight.T).reshape(N, kv, d).repeat_interleave(heads // kv, dim=1)
            inv_freq = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
            angles = torch.arange(N, dtype=torch.float64)[:, None] * inv_freq
            cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]
            q, k = (t * cos + torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1) * sin for t in (q, k))
            z = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(config.query_pre_attn_scalar)
            cap = config.attn_logit_softcapping
            z = cap * torch.tanh(z / cap)
            i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
            p = torch.softmax(z.masked_fill((j > i) | (i - j >= config.sliding_window), float("-inf")), -1)
            context = torch.einsum("hij,jhd->ihd", p, v)
            per_head = torch.einsum("ihd,ohd->hio", context, attention.o_proj.weight.reshape(HIDDEN, heads, d))
            o = per_head.sum(0)
            r = torch.sqrt((o * o).mean(-1) + eps)
            gain = 1.0 + block.post_attention_layernorm.weight
            # The model's own post-norm of this o is g o / r (the test's reading of the norm).
            with full_precision(model):
                torch.testing.assert_close(block.post_attention_layernorm(o), gain * o / r[:, None], rtol=1e-13,
                                           atol=0)
            expected.append(((gain * per_head).norm(dim=-1) / r).mean(-1).numpy())
    expected = np.mean(expected, axis=0)
    measured = measure(model, ids, stats="lambda,head_norms").extra["head_norms"]
    np.testing.assert_allclose(measured[0], expected, rtol=1e-12)
    refined = measure_refinements(model, ids, ingredients=("heads",)).mean()["head_norms"]
    np.testing.assert_allclose(refined[0], expected, rtol=1e-12)
