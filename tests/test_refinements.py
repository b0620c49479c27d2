"""Refined rollouts (jaxroll.theory.refinements) and their measured ingredients (jaxroll.measure.refinements).

Oracles: a plain NumPy float64 rollout written here (dense transitions
multiplied out, no scan, no einsum over heads); the existing
`jaxroll.influence` of a `DenseKernel` model for the unrefined case; and,
for the measurement, a hook-free recomputation in NumPy from the model's
weights and the hidden states / attention probabilities that transformers
returns itself (``output_hidden_states``, ``output_attentions``).
"""

import itertools

import numpy as np
import pytest

import jaxroll
from jaxroll.theory import refinements as R
from jaxroll.errors import ConfigError
from leaf_gradients import leaf_gradient_share


def random_ingredients(seed, layers=3, heads=2, n=7):
    generator = np.random.default_rng(seed)

    def kernels():
        raw = generator.random((layers, heads, n, n)) ** 3 * np.tril(np.ones((n, n)))
        return raw / raw.sum(-1, keepdims=True)

    positions = generator.random((layers, n))
    ingredients = {"attention_heads": kernels(), "norm_kernels": kernels(), "lambda_positions": positions,
                   "lambda_mlp_positions": positions * generator.random((layers, n)), "lambdas": positions.mean(-1),
                   "head_norms": generator.random((layers, heads)) + 0.1, "lambda_gradient": generator.random(layers)}
    # The two switches of issue 43 (drawn after the others, which keep their values).
    ingredients["head_norms_positions"] = generator.random((layers, heads, n)) + 0.1
    ingredients["input_norm_gains"] = generator.uniform(0.2, 3.0, (layers, n))
    return ingredients


def numpy_rollout(lambdas, kernels, weights):
    """e_{N-1}^T R_T ... R_1 with R_t = I - diag(l_t) + diag(l_t) sum_h w_h K_h, dense, float64."""
    layers, heads, n, _ = kernels.shape
    product = np.eye(n)
    for t in range(layers):  # P_t = R_t P_{t-1}: layer 1 acts first
        mixture = sum(weights[t, h] / weights[t].sum() * kernels[t, h] for h in range(heads))
        transition = np.eye(n) - np.diag(lambdas[t]) + np.diag(lambdas[t]) @ mixture
        product = transition @ product
    return product[-1]


def oracle_for(ingredients, switches):
    n = ingredients["attention_heads"].shape[-1]
    if "gradient" in switches:
        lam = np.repeat(ingredients["lambda_gradient"][:, None], n, axis=1)
    elif "mlp" in switches:
        lam = ingredients["lambda_mlp_positions"]
    elif "position" in switches:
        lam = ingredients["lambda_positions"]
    else:
        lam = np.repeat(ingredients["lambdas"][:, None], n, axis=1)
    if "position" not in switches:
        lam = np.repeat(lam.mean(-1, keepdims=True), n, axis=1)
    kernels = ingredients["norm_kernels" if "norm" in switches else "attention_heads"]
    layers, heads = kernels.shape[:2]
    weights = ingredients["head_norms"] if "heads" in switches else np.ones((layers, heads))
    if {"head_positions", "input_norm"} & set(switches):  # tests/test_refinements_rows.py: R_t built row by row
        from test_refinements_rows import numpy_rows

        weights = ingredients["head_norms_positions"] if "head_positions" in switches else weights
        gains = ingredients["input_norm_gains"] if "input_norm" in switches else None
        return numpy_rows(lam, kernels, weights, gains)[-1]
    return numpy_rollout(lam, kernels, weights)


COMBINATIONS = [c for size in range(len(R.SWITCHES) + 1) for c in itertools.combinations(R.SWITCHES, size)
                if R.compatible(c)]


@pytest.mark.parametrize("switches", COMBINATIONS, ids=lambda c: "+".join(c) or "none")
def test_every_variant_matches_the_numpy_rollout(switches):
    ingredients = random_ingredients(0)
    p = np.asarray(R.refined_influence(R.compose(ingredients, switches)))
    # float64 throughout; T = 3 products of 7 x 7 matrices: rounding ~1e-16.
    np.testing.assert_allclose(p, oracle_for(ingredients, switches), rtol=0, atol=1e-10)
    assert np.all(p >= 0) and abs(p.sum() - 1) < 1e-12


def test_switches_change_the_profile():
    # Each switch is one idea that does something: it must move the profile.
    ingredients = random_ingredients(1)
    base = np.asarray(R.refined_influence(R.compose(ingredients, ())))
    for switch in R.SWITCHES:
        assert np.max(np.abs(np.asarray(R.refined_influence(R.compose(ingredients, (switch,)))) - base)) > 1e-6


@pytest.mark.parametrize("seed,switches", [(0, ("position", "mlp", "norm", "heads")),
                                           (1, ("norm", "heads", "gradient")), (2, ("position", "mlp", "norm", "heads"))])
def test_transitions_are_row_stochastic_and_non_negative(seed, switches):
    ingredients = random_ingredients(seed)
    model = R.compose(ingredients, switches)
    for t in range(3):
        transition = np.asarray(R.refined_transition(model, t))
        assert transition.min() >= 0
        np.testing.assert_allclose(transition.sum(-1), 1.0, rtol=0, atol=1e-14)
        # Causal kernels keep it lower triangular.
        assert np.all(np.triu(transition, 1) == 0)
    kernels = np.asarray(R.refined_kernels(model))
    np.testing.assert_allclose(kernels.sum(-1), 1.0, rtol=0, atol=1e-14)


def test_without_switches_it_is_jaxrolls_dense_rollout():
    ingredients = random_ingredients(2)
    mean_kernel = ingredients["attention_heads"].mean(1)
    dense = jaxroll.KernelRolloutModel.create(kernel=jaxroll.kernel_types.DenseKernel.create(mean_kernel),
                                              lambdas=ingredients["lambdas"])
    np.testing.assert_allclose(np.asarray(R.refined_influence(R.compose(ingredients, ()))),
                               np.asarray(jaxroll.influence(dense, 7)), rtol=0, atol=1e-12)


def test_last_entry_is_the_diagonal_closed_form():
    # Lower-triangular transitions: P_T[N-1, N-1] = prod_t (1 - l_t(N-1) + l_t(N-1) A_t[N-1, N-1]).
    ingredients = random_ingredients(3)
    model = R.compose(ingredients, ("position", "norm", "heads"))
    kernels = np.asarray(R.refined_kernels(model))
    lam = np.asarray(model.lambdas)[:, -1]
    expected = np.prod(1 - lam + lam * kernels[:, -1, -1])
    assert float(R.refined_influence(model)[-1]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", [
    {"lambdas": np.full(3, 1.5)},
    {"head_kernels": -np.ones((3, 2, 7, 7))},
    {"head_kernels": np.ones((3, 2, 7, 7))},  # rows sum to 7
    {"head_weights": np.zeros((3, 2))},
    {"lambdas": np.full((3, 5), 0.5)},
])
def test_create_refuses_bad_input_in_one_line(bad):
    ingredients = random_ingredients(4)
    arguments = {"lambdas": ingredients["lambdas"], "head_kernels": ingredients["attention_heads"],
                 "head_weights": None} | bad
    with pytest.raises(ConfigError) as error:
        R.RefinedRollout.create(**arguments)
    assert "\n" not in str(error.value)


def test_compose_refuses_an_unknown_switch():
    with pytest.raises(ConfigError, match="allowed"):
        R.compose(random_ingredients(0), ("gain",))


@pytest.mark.parametrize("switches", [("gradient", "position"), ("mlp", "gradient", "norm")])
def test_gradient_does_not_combine_with_the_forward_lambdas(switches):
    assert not R.compatible(switches)
    with pytest.raises(ConfigError, match="gradient") as error:
        R.compose(random_ingredients(0), switches)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("switch", R.SWITCHES)
def test_compose_names_the_missing_statistic(switch):
    ingredients = random_ingredients(0)
    ingredients.pop({"position": "lambda_positions", "mlp": "lambda_mlp_positions"}.get(switch, "x"), None)
    ingredients.pop({"norm": "norm_kernels", "heads": "head_norms", "gradient": "lambda_gradient"}.get(switch, "x"),
                    None)
    ingredients.pop({"head_positions": "head_norms_positions", "input_norm": "input_norm_gains"}.get(switch, "x"),
                    None)
    with pytest.raises(ConfigError, match=R.STATS_FOR[switch]):
        R.compose(ingredients, (switch,))


def test_cli_names_match_the_library():
    # jaxroll.cli._names repeats the refinement names so that the parser answers before JAX loads.
    from jaxroll.cli import _names
    from jaxroll.measure import refinements as measured
    from jaxroll.measure.registry import statistic_names

    assert _names.REFINEMENT_SWITCHES == R.SWITCHES
    assert _names.REFINEMENT_STAT_FOR == R.STATS_FOR
    assert _names.REFINEMENT_STATS == tuple(measured.STATISTICS)
    assert set(_names.REFINEMENT_STATS) <= set(statistic_names())
    assert set(R.STATS_FOR.values()) <= set(measured.STATISTICS)


# ----------------------------------------------------------------------------- measurement on HF models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def tiny_model(family, tmp_path):
    import transformers

    common = dict(vocab_size=97, hidden_size=24, num_attention_heads=3)
    if family == "bloom":
        config = transformers.BloomConfig(n_layer=2, n_head=3, hidden_size=24, vocab_size=97)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=2, intermediate_size=40, num_key_value_heads=1,
                                          max_position_embeddings=32, **common)
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # a less symmetric start than the init: larger weights spread the norms
        for parameter in model.parameters():
            parameter.mul_(4.0) if parameter.ndim == 2 else parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path)
    return transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64,
                                                             attn_implementation="eager").eval()


def _np(tensor):
    return tensor.detach().double().numpy()


def hook_free(model, ids):
    """Per sequence, every ingredient from the weights, the hidden states and the attentions, in NumPy."""
    bloom = model.config.model_type == "bloom"
    blocks = model.transformer.h if bloom else model.model.layers
    heads = 3
    from jaxroll.measure.precision import full_precision

    with torch.no_grad(), full_precision(model):  # float64 throughout (no float32 RMSNorm, softmax), as measured
        out = model(input_ids=torch.as_tensor(ids)[None], output_hidden_states=True, output_attentions=True)
    rows = {"attention_heads": [], "lambda_positions": [], "lambda_mlp_positions": [], "norm_kernels": [],
            "head_norms": []}
    for t, block in enumerate(blocks):
        x = _np(out.hidden_states[t][0])
        alpha = _np(out.attentions[t][0])  # (H, N, N)
        n, hidden = x.shape
        d = hidden // heads
        if bloom:
            def norm(y, module):
                mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
                return (y - mean) / np.sqrt(var + module.eps) * _np(module.weight) + _np(module.bias)

            attention = block.self_attention
            fused = norm(x, block.input_layernorm) @ _np(attention.query_key_value.weight).T \
                + _np(attention.query_key_value.bias)
            v = fused.reshape(n, heads, 3, d)[:, :, 2, :]
            w_o, b_o = _np(attention.dense.weight), _np(attention.dense.bias)
        else:
            def norm(y, module):
                # RMSNorm; measure runs a float64 model in float64 (transformers' own norm is float32 inside).
                return _np(module.weight) * y / np.sqrt((y * y).mean(-1, keepdims=True) + module.variance_epsilon)

            attention = block.self_attn
            v = (norm(x, block.input_layernorm) @ _np(attention.v_proj.weight).T).reshape(n, 1, d)
            v = np.repeat(v, heads, axis=1)
            w_o, b_o = _np(attention.o_proj.weight), 0.0
        context = np.einsum("hij,jhd->ihd", alpha, v)
        a = context.reshape(n, hidden) @ w_o.T + b_o
        y = norm(x + a, block.post_attention_layernorm)
        if bloom:
            mlp = block.mlp
            up = y @ _np(mlp.dense_h_to_4h.weight).T + _np(mlp.dense_h_to_4h.bias)
            gelu = up * 0.5 * (1.0 + np.tanh(0.79788456 * up * (1 + 0.044715 * up * up)))
            m = gelu @ _np(mlp.dense_4h_to_h.weight).T + _np(mlp.dense_4h_to_h.bias)
        else:
            mlp = block.mlp
            gate = y @ _np(mlp.gate_proj.weight).T
            m = ((gate / (1 + np.exp(-gate))) * (y @ _np(mlp.up_proj.weight).T)) @ _np(mlp.down_proj.weight).T
        # The oracle's own check: its block output is the model's next hidden state.
        if t + 1 < len(blocks):
            np.testing.assert_allclose(x + a + m, _np(out.hidden_states[t + 1][0]), rtol=0, atol=1e-10)
        xn, an, mn = (np.linalg.norm(z, axis=-1) for z in (x, a, m))
        per_head_w = w_o.reshape(hidden, heads, d)
        value_norms = np.stack([np.linalg.norm(v[:, h] @ per_head_w[:, h].T, axis=-1) for h in range(heads)])
        weighted = alpha * value_norms[:, None, :]
        rows["attention_heads"].append(alpha)
        rows["lambda_positions"].append(an / (xn + an))
        rows["lambda_mlp_positions"].append(an / (xn + an + mn))
        rows["norm_kernels"].append(weighted / weighted.sum(-1, keepdims=True))
        rows["head_norms"].append([np.linalg.norm(context[:, h] @ per_head_w[:, h].T, axis=-1).mean()
                                   for h in range(heads)])
    return {key: np.asarray(value) for key, value in rows.items()}


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_measured_ingredients_match_a_hook_free_recomputation(family, tmp_path):
    from jaxroll.measure import measure
    from jaxroll.measure.refinements import measure_refinements

    model = tiny_model(family, tmp_path)
    ids = np.random.default_rng(5).integers(0, 97, (4, 9))
    groups = np.array([0, 1, 1, 0])
    measured = measure_refinements(model, ids, groups=groups)
    oracle = [hook_free(model, row) for row in ids]
    assert measured.counts.tolist() == [2, 2]
    for key in oracle[0]:
        for g in (0, 1):
            expected = sum(oracle[i][key] for i in np.flatnonzero(groups == g))
            # float64 both ways; BLOOM takes its softmax in float32 inside, but both
            # sides read the same probabilities, so only float64 rounding remains.
            np.testing.assert_allclose(getattr(measured, key)[g], expected, rtol=1e-10, atol=1e-12, err_msg=key)
    means = measured.mean()
    # The per-position lambda averages to the lambda_t of `jaxroll.measure.measure`.
    result = measure(model, ids, stats="lambda,attention")
    np.testing.assert_allclose(means["lambda_positions"].mean(-1), result.lambdas, rtol=0, atol=1e-12)
    np.testing.assert_allclose(means["attention_heads"].mean(1), result.attention_mean, rtol=0, atol=1e-12)
    # Something to measure: the refinements are not trivially equal to the plain ingredients.
    assert np.max(np.abs(means["norm_kernels"] - means["attention_heads"])) > 1e-3
    assert np.max(np.abs(means["lambda_mlp_positions"] - means["lambda_positions"])) > 1e-3


def test_measure_refinements_refuses_an_unknown_ingredient(tmp_path):
    from jaxroll.measure.refinements import measure_refinements

    model = tiny_model("llama", tmp_path)
    with pytest.raises(ConfigError, match="allowed"):
        measure_refinements(model, np.zeros((1, 4), dtype=np.int64), ingredients=("gain",))


def gradient_oracle(model, ids):
    """lambda_gradient of one sequence from leaf perturbations, no tensor hooks.

    A zero leaf ``d_x`` is added to every block's input and ``d_a`` to every
    attention output; ``df/dd_x = g_x`` and ``df/dd_a = g_a`` (autograd on
    leaves), then the ratio of the module docstring in NumPy float64.
    """
    bloom = model.config.model_type == "bloom"
    blocks = model.transformer.h if bloom else model.model.layers
    outputs = [block.self_attention.dense if bloom else block.self_attn.o_proj for block in blocks]
    return leaf_gradient_share(model, np.asarray(ids)[None], blocks, outputs)


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_gradient_share_matches_leaf_perturbations_and_the_registered_statistics(family, tmp_path):
    from jaxroll.measure import measure
    from jaxroll.measure.refinements import STATISTICS, measure_refinements

    model = tiny_model(family, tmp_path)
    ids = np.random.default_rng(6).integers(0, 97, (3, 8))
    measured = measure_refinements(model, ids, ingredients=("gradient",))
    expected = np.mean([gradient_oracle(model, row) for row in ids], axis=0)
    # float64 both ways, the same backward: rounding only.
    np.testing.assert_allclose(measured.mean()["lambda_gradient"], expected, rtol=1e-10, atol=0)
    # A share of the input gradient: below 1; this model's attention path adds to it (> 0).
    assert np.all((expected > 0) & (expected < 1))
    # `jaxroll measure --stats ...` registers every ingredient; with its activation
    # checkpointing the gradient hooks fire once, on the recorded forward's tensors.
    everything = measure_refinements(model, ids)
    result = measure(model, ids, stats=("lambda", "influence", *STATISTICS))
    for name, output in STATISTICS.items():
        np.testing.assert_allclose(result.extra[output], everything.mean()[output], rtol=0, atol=1e-12,
                                   err_msg=name)


def test_lambda_gradient_needs_the_influence_pass(tmp_path):
    from jaxroll.measure import measure

    model = tiny_model("llama", tmp_path)
    with pytest.raises(ConfigError, match="lambda_gradient needs influence"):
        measure(model, np.zeros((1, 4), dtype=np.int64), stats="lambda,lambda_gradient")


def test_measure_cli_writes_the_refined_profile(tmp_path, capsys):
    import json

    from jaxroll.cli import main
    from jaxroll.io import read_profile
    from jaxroll.measure.refinements import refined_profile

    directory, texts = _saved_llama(tmp_path, seed=0, words=20)
    out = tmp_path / "out"
    base = ["measure", str(directory), "--texts", str(texts), "--length", "12", "--samples", "3", "--quiet"]
    assert main([*base, "--out", str(out), "--dtype", "float64", "--refine", "norm,gradient"]) == 0
    capsys.readouterr()
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["refined"]["switches"] == ["norm", "gradient"]
    assert {"lambda_gradient", "norm_kernels", "influence"} <= set(metadata["stats"])
    written = np.asarray(read_profile(out / "refined.csv"))
    np.testing.assert_allclose(written, refined_profile(out, ("norm", "gradient")), rtol=0, atol=1e-15)
    assert abs(written.sum() - 1) < 1e-12 and written.min() >= 0
    # Refused in one line, before anything is created.
    for argv, expected in [(["--refine", "gradient,position"], "gradient with position"),
                           (["--refine", "gain"], "allowed"),
                           (["--refine", "heads", "--stats", "lambda,attention_heads"], "head_norms")]:
        assert main([*base, "--out", str(tmp_path / "refused"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and expected in err, err
        assert not (tmp_path / "refused").exists()


def test_refined_csv_is_float64_and_sums_to_one_and_the_summary_names_every_file(tmp_path, capsys, float32):
    """As from the command line (JAX in float32, the model in float32): refined.csv is still the float64 refined
    rollout, its sum 1 within 1e-12, and the summary's ``wrote`` line names exactly the files in --out."""
    import os

    from jaxroll.cli import main
    from jaxroll.io import read_profile
    from jaxroll.measure.refinements import refined_profile

    directory, texts = _saved_llama(tmp_path, seed=1, words=40)
    out = tmp_path / "out"
    with float32:  # JAX's default, as on the command line; the suite runs with float64 on
        assert main(["measure", str(directory), "--texts", str(texts), "--length", "24", "--samples", "3",
                     "--quiet", "--out", str(out), "--refine", "heads,gradient", "--queries", "2"]) == 0
    stdout = capsys.readouterr().out
    written = read_profile(out / "refined.csv")
    assert abs(written.sum() - 1) < 1e-12 and written.min() >= 0
    reference = refined_profile(out, ("heads", "gradient"))  # float64 on here: the float64 sums' rollout
    assert reference.dtype == np.float64
    np.testing.assert_allclose(written, reference, rtol=1e-13, atol=1e-16)
    from jaxroll.measure.outputs import read_measurement  # --queries 2: the refined rows, float64 too

    rows = read_measurement(out)[0]["refined_rows"]
    assert rows.shape == (2, 24) and rows.dtype == np.float64
    np.testing.assert_allclose(rows[-1], reference, rtol=0, atol=1e-12)
    line = next(text for text in stdout.splitlines() if text.strip().startswith("wrote "))
    named = {name.strip() for name in line.strip().removeprefix("wrote ").removeprefix(f"{out}/").split(",")}
    assert "refined.csv" in named
    assert named == set(os.listdir(out)), (named, sorted(os.listdir(out)))


def _saved_llama(tmp_path, *, seed: int, words: int):
    """A tiny Llama (2 layers, 4 heads) and its word-level tokenizer saved in tmp_path, and 3 texts."""
    from tiny_tokenizer import WORDS, word_level_tokenizer

    directory = tmp_path / "model"
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=32, intermediate_size=64, vocab_size=64)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    word_level_tokenizer().save_pretrained(directory)
    rng = np.random.default_rng(seed)
    texts = tmp_path / "docs.txt"
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=words)) for _ in range(3)) + "\n", encoding="utf-8")
    return directory, texts
