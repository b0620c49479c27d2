"""Rows of refined rollouts, per-position head weights and the input norm's gain (issue 43).

Oracles: a NumPy float64 rollout written here, each transition ``R_t`` built
row by row from the formulas of `jaxroll.theory.refinements` (its module
docstring), including the cap, and multiplied out densely (no scan, no
einsum); the plain `KernelRolloutModel` over a `DenseKernel` for the
unrefined rows; for the measurement, the gains and per-position head norms
recomputed in NumPy from the hidden states and attention probabilities that
transformers returns itself and the model's weights.

Tolerances: the rollouts are float64 products of T = 3 (or 2) small
matrices whose entries are at most 1, so the scan and the dense product
differ by a few ulps (~1e-16); 1e-12 leaves room for the reordering of
sums without hiding a wrong term (a wrong term moves entries by > 1e-3
here). The measured ingredients are float64 on both sides from the same
probabilities and states: 1e-10 relative covers the different summation
orders of norms and means over D = 24 features.
"""

import itertools

import numpy as np
import pytest

import jaxroll
from jaxroll.errors import ConfigError
from jaxroll.theory import refinements as R
from jaxroll.theory.rows import predicted_rows

NEW = ("head_positions", "input_norm")


def numpy_transition(lam, kernels, weights, gains):
    """``R_t`` (N, N) row by row: ``A[i] = sum_h w_h(i) K_h[i]``; with gains ``g = c / mean(c)``,
    ``s_i = A[i] . g``, row ``(1 - lam_i s_i) e_i + lam_i A[i] g`` unless ``lam_i s_i > 1`` (then ``A[i] g / s_i``)."""
    heads, n, _ = kernels.shape
    w = np.repeat(weights[:, None], n, axis=1) if weights.ndim == 1 else weights  # (H, N)
    transition = np.zeros((n, n))
    for i in range(n):
        shares = w[:, i] / w[:, i].sum()
        row = sum(shares[h] * kernels[h, i] / kernels[h, i].sum() for h in range(heads))
        if gains is None:
            transition[i] = lam[i] * row
            transition[i, i] += 1 - lam[i]
            continue
        g = gains / gains.mean()
        reach = float(row @ g)
        if lam[i] * reach <= 1:
            transition[i] = lam[i] * row * g
            transition[i, i] += 1 - lam[i] * reach
        else:  # the cap: identity share 0
            transition[i] = row * g / reach
    return transition


def numpy_rows(lambdas, kernels, weights, gains=None):
    """``P_T = R_T ... R_1`` (N, N), dense, float64; ``weights`` (T, H) or (T, H, N)."""
    n = kernels.shape[-1]
    product = np.eye(n)
    for t in range(kernels.shape[0]):  # layer 1 acts first
        product = numpy_transition(lambdas[t], kernels[t], weights[t], None if gains is None else gains[t]) @ product
    return product


def ingredients_for(seed, n=7, **scales):
    from test_refinements import random_ingredients

    ingredients = random_ingredients(seed, n=n)
    for key, scale in scales.items():
        ingredients[key] = ingredients[key] * scale
    return ingredients


def oracle(ingredients, switches):
    n = ingredients["attention_heads"].shape[-1]
    lam = {"gradient": "lambda_gradient", "mlp": "lambda_mlp_positions", "position": "lambda_positions"}
    key = next((lam[s] for s in ("gradient", "mlp", "position") if s in switches), "lambdas")
    lambdas = np.clip(ingredients[key], 0, 1)
    lambdas = np.repeat(lambdas[:, None], n, 1) if lambdas.ndim == 1 else lambdas
    if "position" not in switches:
        lambdas = np.repeat(lambdas.mean(-1, keepdims=True), n, 1)
    kernels = ingredients["norm_kernels" if "norm" in switches else "attention_heads"]
    weights = (ingredients["head_norms"] if "heads" in switches else ingredients["head_norms_positions"]
               if "head_positions" in switches else np.ones(kernels.shape[:2]))
    gains = ingredients["input_norm_gains"] if "input_norm" in switches else None
    return numpy_rows(lambdas, kernels, weights, gains)


COMBINATIONS = [c for size in range(len(R.SWITCHES) + 1) for c in itertools.combinations(R.SWITCHES, size)
                if R.compatible(c) and set(c) & set(NEW)]


@pytest.mark.parametrize("switches", COMBINATIONS, ids="+".join)
def test_new_switches_match_the_numpy_rollout_on_every_row(switches):
    ingredients = ingredients_for(0)
    model = R.compose(ingredients, switches)
    expected = oracle(ingredients, switches)
    rows = np.asarray(R.refined_rows(model, np.eye(7)))
    np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(R.refined_influence(model)), expected[-1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(predicted_rows(model, [2, 4, 6]), expected[[2, 4, 6]], rtol=0, atol=1e-12)
    np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert rows.min() >= 0
    for t in range(3):  # the transitions themselves, as the oracle builds them
        lam = np.asarray(model.lambdas[t])
        gains = None if model.input_gains is None else np.asarray(model.input_gains[t])
        np.testing.assert_allclose(np.asarray(R.refined_transition(model, t)),
                                   numpy_transition(lam, np.asarray(model.head_kernels[t]),
                                                    np.asarray(model.head_weights[t]), gains), rtol=0, atol=1e-14)


def test_the_cap_keeps_rows_stochastic_and_non_negative():
    # lambda near 1 and gains from 0.05 to 8: some rows reach lambda s > 1 and are capped.
    ingredients = ingredients_for(1)
    ingredients["lambdas"] = np.array([0.97, 0.9, 0.95])
    gains = np.random.default_rng(9).uniform(0.05, 1.0, (3, 7))
    gains[:, :3] = 8.0  # the early positions: large relative gain
    ingredients["input_norm_gains"] = gains
    model = R.compose(ingredients, ("input_norm",))
    capped = 0
    for t in range(3):
        transition = np.asarray(R.refined_transition(model, t))
        kernel = np.asarray(R.refined_kernels(model))[t]
        reach = kernel @ (gains[t] / gains[t].mean())
        over = ingredients["lambdas"][t] * reach > 1
        capped += over.sum()
        assert transition.min() >= 0
        np.testing.assert_allclose(transition.sum(-1), 1.0, rtol=0, atol=1e-14)
        # capped rows: no identity share left beyond what attention puts on i itself
        idx = np.flatnonzero(over)
        np.testing.assert_allclose(np.diag(transition)[idx], (kernel[idx, idx] * gains[t][idx] / gains[t].mean())
                                   / reach[idx], rtol=1e-12)
    assert capped >= 3, capped  # the test exercises the cap
    np.testing.assert_allclose(np.asarray(R.refined_rows(model, np.eye(7))), oracle(ingredients, ("input_norm",)),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("switches", [(), ("position",), ("norm", "heads"), ("mlp", "head_positions"),
                                      ("gradient", "norm")], ids=lambda c: "+".join(c) or "none")
def test_constant_gains_are_todays_rollout(switches):
    ingredients = ingredients_for(2)
    ingredients["input_norm_gains"] = np.full((3, 7), 0.37)
    with_gains = R.compose(ingredients, (*switches, "input_norm"))
    without = R.compose(ingredients, switches)
    assert without.input_gains is None  # today's code path
    np.testing.assert_allclose(np.asarray(R.refined_rows(with_gains, np.eye(7))),
                               np.asarray(R.refined_rows(without, np.eye(7))), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(R.refined_influence(with_gains)), np.asarray(R.refined_influence(without)),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("others", [(), ("norm",), ("position", "input_norm"), ("gradient",)],
                         ids=lambda c: "+".join(c) or "none")
def test_head_weights_constant_over_positions_are_the_heads_rollout(others):
    ingredients = ingredients_for(3)
    ingredients["head_norms_positions"] = np.repeat(ingredients["head_norms"][..., None], 7, axis=-1) * 2.5
    per_position = R.compose(ingredients, (*others, "head_positions"))
    per_layer = R.compose(ingredients, (*others, "heads"))
    assert per_position.head_weights.shape == (3, 2, 7) and per_layer.head_weights.shape == (3, 2)
    np.testing.assert_allclose(np.asarray(R.refined_rows(per_position, np.eye(7))),
                               np.asarray(R.refined_rows(per_layer, np.eye(7))), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(R.refined_kernels(per_position)), np.asarray(R.refined_kernels(per_layer)),
                               rtol=0, atol=1e-14)


def test_rows_of_the_unrefined_rollout_are_the_plain_models_rows():
    ingredients = ingredients_for(4)
    refined = R.compose(ingredients, ())
    dense = jaxroll.KernelRolloutModel.create(
        kernel=jaxroll.kernel_types.DenseKernel.create(ingredients["attention_heads"].mean(1)),
        lambdas=ingredients["lambdas"])
    queries = [1, 3, 5, 6]
    got = predicted_rows(refined, queries)
    assert got.shape == (4, 7) and got.dtype == np.float64
    np.testing.assert_allclose(got, predicted_rows(dense, queries, 7), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[-1], np.asarray(R.refined_influence(refined)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(predicted_rows(refined, 3), predicted_rows(dense, 3, 7), rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="measured length 7") as error:
        predicted_rows(refined, 2, n=9)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("switches", [("heads", "head_positions"), ("input_norm", "position", "gradient")])
def test_incompatible_combinations_are_refused(switches):
    assert not R.compatible(switches)
    with pytest.raises(ConfigError, match="allowed") as error:
        R.compose(ingredients_for(0), switches)
    assert "\n" not in str(error.value)


def test_create_refuses_bad_gains_and_position_weights_in_one_line():
    ingredients = ingredients_for(0)
    base = dict(lambdas=ingredients["lambdas"], head_kernels=ingredients["attention_heads"])
    for extra, name in [({"input_gains": np.zeros((3, 7))}, "input_gains"),
                        ({"input_gains": np.ones((3, 6))}, "input_gains"),
                        ({"head_weights": np.ones((3, 2, 6))}, "head_weights"),
                        ({"head_weights": np.zeros((3, 2, 7))}, "head_weights")]:
        with pytest.raises(ConfigError, match=name) as error:
            R.RefinedRollout.create(**base, **extra)
        assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- measured on tiny models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_refinements import _np  # noqa: E402  (the refinement tests' tensor -> float64 NumPy)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def by_hand(model, ids):
    """One sequence's ``input_norm_gains (T, N)`` and ``head_norms_positions (T, H, N)`` in NumPy."""
    from jaxroll.measure.precision import full_precision

    bloom = model.config.model_type == "bloom"
    blocks = model.transformer.h if bloom else model.model.layers
    heads = 3
    with torch.no_grad(), full_precision(model):
        out = model(input_ids=torch.as_tensor(ids)[None], output_hidden_states=True, output_attentions=True)
    gains, outputs = [], []
    for t, block in enumerate(blocks):
        x = _np(out.hidden_states[t][0])  # the block input, which the input norm reads
        alpha = _np(out.attentions[t][0])
        n, hidden = x.shape
        d = hidden // heads
        norm = block.input_layernorm
        if bloom:
            sigma = np.sqrt(((x - x.mean(-1, keepdims=True)) ** 2).mean(-1) + norm.eps)
            y = (x - x.mean(-1, keepdims=True)) / sigma[:, None] * _np(norm.weight) + _np(norm.bias)
            attention = block.self_attention
            fused = y @ _np(attention.query_key_value.weight).T + _np(attention.query_key_value.bias)
            v = fused.reshape(n, heads, 3, d)[:, :, 2, :]
            w_o = _np(attention.dense.weight)
        else:
            sigma = np.sqrt((x * x).mean(-1) + norm.variance_epsilon)
            y = x / sigma[:, None] * _np(norm.weight)
            v = np.repeat((y @ _np(block.self_attn.v_proj.weight).T).reshape(n, 1, d), heads, axis=1)
            w_o = _np(block.self_attn.o_proj.weight)
        context = np.einsum("hij,jhd->ihd", alpha, v)
        gains.append(1.0 / sigma)
        outputs.append([np.linalg.norm(context[:, h] @ w_o[:, h * d:(h + 1) * d].T, axis=-1) for h in range(heads)])
    return np.asarray(gains), np.asarray(outputs)


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_measured_gains_and_position_head_norms_match_a_hand_computation(family, tmp_path):
    from test_refinements import tiny_model

    from jaxroll.measure import measure
    from jaxroll.measure.refinements import measure_refinements

    model = tiny_model(family, tmp_path)
    ids = np.random.default_rng(7).integers(0, 97, (3, 9))
    measured = measure_refinements(model, ids, ingredients=("heads", "head_positions", "input_norm")).mean()
    hand = [by_hand(model, row) for row in ids]
    gains = np.mean([g for g, _ in hand], axis=0)
    outputs = np.mean([o for _, o in hand], axis=0)
    assert measured["input_norm_gains"].shape == (2, 9) and measured["head_norms_positions"].shape == (2, 3, 9)
    np.testing.assert_allclose(measured["input_norm_gains"], gains, rtol=1e-10, atol=0)
    np.testing.assert_allclose(measured["head_norms_positions"], outputs, rtol=1e-10, atol=0)
    # head_norms is its mean over positions; the registered statistics write the same arrays.
    np.testing.assert_allclose(measured["head_norms_positions"].mean(-1), measured["head_norms"], rtol=1e-12)
    result = measure(model, ids, stats="lambda,head_norms_positions,input_norm_gains", batch_size=3)  # rows of a batch
    for name in ("input_norm_gains", "head_norms_positions"):
        np.testing.assert_allclose(result.extra[name], measured[name], rtol=1e-12, atol=0, err_msg=name)
    # Something to measure: the gains vary over positions, the head weights over queries.
    assert np.ptp(gains, axis=-1).min() > 1e-3
    shares = outputs / outputs.sum(1, keepdims=True)
    assert np.ptp(shares, axis=-1).max() > 1e-2


FAMILY_NAMES = ("gpt2", "opt", "bloom", "mpt", "falcon", "falcon_rope", "gpt_neox", "gptj", "llama", "mistral",
                "mixtral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "olmo2", "stablelm", "starcoder2")


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_input_norm_gains_of_every_family(family):
    """1 / sigma_t(j) at the norm test_families.ORACLE names (independently of jaxroll's table), from the
    returned block inputs; sigma is checked against the norm itself: ``(LN(x) - b) sigma / (x - mu)`` (LayerNorm)
    or ``LN(x) sigma / x`` (RMSNorm) is one gain per feature, the same at every position. OLMo 2's attention
    reads the block input without a norm: gain 1."""
    from test_families import ORACLE, _module, tiny

    from jaxroll.measure.precision import full_precision
    from jaxroll.measure.refinements import measure_refinements

    model = tiny(family)
    ids = np.random.default_rng(8).integers(0, 61, (2, 8))
    got = measure_refinements(model, ids, ingredients=("input_norm",)).mean()["input_norm_gains"]
    blocks_path, norm_path = ORACLE[family.replace("_rope", "")][:2]
    if norm_path is None:
        np.testing.assert_array_equal(got, np.ones((2, 8)))
        return
    expected = np.zeros((2, 8))
    for row in ids:
        with torch.no_grad(), full_precision(model):
            states = model(input_ids=torch.as_tensor(row)[None], output_hidden_states=True).hidden_states
        for t, block in enumerate(_module(model, blocks_path)):
            norm = _module(block, norm_path)
            x = _np(states[t][0])
            layer = isinstance(norm, torch.nn.LayerNorm)
            eps = norm.eps if hasattr(norm, "eps") else norm.variance_epsilon
            centred = x - x.mean(-1, keepdims=True) if layer else x
            sigma = np.sqrt((centred * centred).mean(-1) + eps)
            with torch.no_grad(), full_precision(norm):
                normed = _np(norm(torch.as_tensor(x)[None])[0])
            bias = _np(norm.bias) if getattr(norm, "bias", None) is not None else 0.0
            gain = (normed - bias) * sigma[:, None] / centred
            np.testing.assert_allclose(gain, np.broadcast_to(gain[0], gain.shape), rtol=1e-8, err_msg=f"layer {t}")
            expected[t] += 1.0 / sigma / len(ids)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=0)
    assert np.ptp(got, axis=-1).min() > 1e-6  # the gains vary over positions


def test_falcon_new_decoder_reads_ln_attn_and_post_ln_opt_is_refused():
    from test_families import HEADS, HIDDEN, VOCAB

    from jaxroll.measure.precision import full_precision
    from jaxroll.measure.refinements import measure_refinements

    config = transformers.FalconConfig(num_hidden_layers=2, num_attention_heads=HEADS, hidden_size=HIDDEN,
                                       vocab_size=VOCAB, alibi=False, new_decoder_architecture=True, num_kv_heads=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    ids = np.arange(7)[None] % VOCAB
    got = measure_refinements(model, ids, ingredients=("input_norm",)).mean()["input_norm_gains"]
    with torch.no_grad(), full_precision(model):
        states = model(input_ids=torch.as_tensor(ids), output_hidden_states=True).hidden_states
    for t, block in enumerate(model.transformer.h):
        assert hasattr(block, "ln_attn")  # the attention's own norm (ln_mlp is the MLP's)
        x = _np(states[t][0])
        sigma = np.sqrt(x.var(-1) + block.ln_attn.eps)
        np.testing.assert_allclose(got[t], 1.0 / sigma, rtol=1e-10)
    opt = transformers.OPTConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, ffn_dim=8, vocab_size=VOCAB,
                                 max_position_embeddings=16, word_embed_proj_dim=8, do_layer_norm_before=False)
    model = transformers.AutoModelForCausalLM.from_config(opt, attn_implementation="eager").double().eval()
    with pytest.raises(ConfigError, match="do_layer_norm_before") as error:
        measure_refinements(model, ids, ingredients=("input_norm",))
    assert "\n" not in str(error.value)


def test_measure_cli_writes_the_refined_rows(tmp_path, capsys):
    import json

    from test_refinements import _saved_llama

    from jaxroll.cli import main
    from jaxroll.io import read_profile
    from jaxroll.measure.outputs import read_measurement
    from jaxroll.measure.refinements import refined_rows_from_arrays

    directory, texts = _saved_llama(tmp_path, seed=2, words=20)
    out = tmp_path / "out"
    assert main(["measure", str(directory), "--texts", str(texts), "--length", "12", "--samples", "3", "--quiet",
                 "--out", str(out), "--dtype", "float64", "--refine", "input_norm", "--queries", "4"]) == 0
    capsys.readouterr()
    arrays, _ = read_measurement(out)
    rows = arrays["refined_rows"]
    assert rows.shape == (4, 12) and rows.dtype == np.float64
    assert arrays["query_positions"].tolist() == [3, 6, 8, 11]
    assert "input_norm_gains" in arrays
    np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=0, atol=1e-12)
    # The rows are those of the rollout composed from the written ingredients; the last is refined.csv.
    np.testing.assert_allclose(rows, refined_rows_from_arrays(arrays, ("input_norm",), [3, 6, 8, 11]),
                               rtol=0, atol=1e-15)
    np.testing.assert_allclose(rows[-1], np.asarray(read_profile(out / "refined.csv")), rtol=0, atol=1e-12)
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["refined"]["rows"] == "refined_rows in measurement.npz"
    # Without the gain the rows differ: the switch does something on this model.
    plain = refined_rows_from_arrays(arrays, (), [3, 6, 8, 11])
    assert np.max(np.abs(plain - rows)) > 1e-4
    # The new switches' refusals, in one line, before anything is created.
    base = ["measure", str(directory), "--texts", str(texts), "--length", "12", "--samples", "3", "--quiet"]
    for argv, expected in [(["--refine", "heads,head_positions"], "heads with head_positions"),
                           (["--refine", "input_norm", "--stats", "lambda,attention_heads"], "input_norm_gains")]:
        assert main([*base, "--out", str(tmp_path / "refused"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and expected in err, err
        assert not (tmp_path / "refused").exists()
