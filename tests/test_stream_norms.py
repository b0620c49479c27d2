"""The residual stream's norms and the branch scale's stream rule (`jaxroll.interventions.BranchScale`).

Oracles: a NumPy float64 loop written here (the stream grown layer by layer,
each scaled branch adding ``(gamma^2 - 1) ||a_s||^2``), the plain formula
``gamma lambda / (gamma lambda + 1 - lambda)`` where the stream cannot have
changed (the first layer, gamma = 1, no norms), central differences, and the
norms of the model's own ``output_hidden_states`` recomputed here.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import ConfigError
from jaxroll.interventions import BranchScale
from jaxroll.interventions.mixing import stream_growth


def grown_lambdas(gammas, lambdas, norms):
    """The oracle: walk the layers, keep the stream's squared norm, read each lambda at it."""
    squared = norms[0] ** 2
    out, streams = [], []
    for t, (gamma, lam) in enumerate(zip(gammas, lambdas)):
        if t > 0:
            # the measured growth from layer t-1 to t, plus what the scaled branch t-1 added on top
            branch = lambdas[t - 1] / (1 - lambdas[t - 1]) * norms[t - 1]
            squared += norms[t] ** 2 - norms[t - 1] ** 2 + (gammas[t - 1] ** 2 - 1) * branch**2
        stream = np.sqrt(squared)
        branch = gamma * lam / (1 - lam) * norms[t]  # ||a_t|| scaled; lambda = ||a|| / (||x|| + ||a||)
        out.append(branch / (stream + branch))
        streams.append(stream)
    return np.array(out), np.array(streams)


def model_with(lambdas, norms):
    return jaxroll.RolloutModel.create(num_layers=len(lambdas), num_heads=2, lambdas=lambdas, stream_norms=norms,
                                       sequence_length=16)


@pytest.mark.parametrize("seed", range(4))
def test_the_stream_rule_matches_the_layer_by_layer_oracle(seed):
    rng = np.random.default_rng(seed)
    layers = 6
    lambdas, norms = rng.uniform(0.05, 0.6, layers), rng.uniform(0.5, 5.0, layers)
    gammas = rng.uniform(0.2, 3.0, layers)
    expected, streams = grown_lambdas(gammas, lambdas, norms)
    changed = BranchScale(gammas).apply(model_with(lambdas, norms))
    # float64 arithmetic on both sides, a few operations per layer: 1e-12 relative.
    np.testing.assert_allclose(np.asarray(changed.lambdas), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(changed.stream_norms), streams, rtol=1e-12)


def test_neutral_first_layer_and_no_norms_are_the_plain_formula():
    lambdas, norms = np.array([0.25, 0.3, 0.2, 0.4]), np.array([1.0, 2.0, 2.5, 4.0])
    model = model_with(lambdas, norms)
    np.testing.assert_allclose(np.asarray(BranchScale(1.0).apply(model).lambdas), lambdas, rtol=1e-12)
    plain = 2.0 * lambdas / (2.0 * lambdas + 1.0 - lambdas)
    scaled = np.asarray(BranchScale(2.0).apply(model).lambdas)
    assert scaled[0] == pytest.approx(plain[0], rel=1e-12)  # nothing before layer 0 has grown its stream
    assert np.all(scaled[1:] < plain[1:])  # a stronger branch before: a larger stream, a smaller share
    no_norms = dataclasses.replace(model, stream_norms=None)
    np.testing.assert_allclose(np.asarray(BranchScale(2.0).apply(no_norms).lambdas), plain, rtol=1e-12)


def test_two_scales_compose_as_their_product():
    model = model_with(np.array([0.2, 0.35, 0.3, 0.25, 0.4]), np.array([1.0, 1.5, 1.7, 2.5, 3.0]))
    twice = BranchScale(1.5).apply(BranchScale(np.array([0.5, 2.0, 1.0, 3.0, 0.7])).apply(model))
    once = BranchScale(1.5 * np.array([0.5, 2.0, 1.0, 3.0, 0.7])).apply(model)
    np.testing.assert_allclose(np.asarray(twice.lambdas), np.asarray(once.lambdas), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(twice.stream_norms), np.asarray(once.stream_norms), rtol=1e-12)


def test_gradient_in_gamma_matches_central_differences():
    lambdas, norms = jnp.array([0.2, 0.35, 0.3, 0.25]), jnp.array([1.0, 1.5, 1.7, 2.5])
    model = model_with(np.asarray(lambdas), np.asarray(norms))

    def middle(gamma):
        profile = jaxroll.influence(BranchScale(gamma).apply(model))
        return profile[4:12].sum()

    gamma = jnp.array([0.7, 1.3, 1.1, 0.9])
    grad = jax.grad(middle)(gamma)
    step = 1e-6
    for t in range(4):
        e = jnp.zeros(4).at[t].set(step)
        central = (middle(gamma + e) - middle(gamma - e)) / (2 * step)
        # float64; central differences of O(step^2) = 1e-12 against a derivative of order 1e-2.
        assert float(grad[t]) == pytest.approx(float(central), rel=1e-6, abs=1e-10)
    rho = jax.jacfwd(lambda g: stream_growth(g, lambdas, norms))(gamma)
    assert np.allclose(np.triu(np.asarray(rho)), 0.0)  # rho_t reads the branches before t only


def test_the_sweep_path_reads_the_norms_in_float64():
    lambdas, norms = np.array([0.25, 0.3, 0.2]), np.array([1.0, 2.0, 2.5])
    gammas = np.array([[0.5], [2.0]])
    batched = BranchScale.mixed_lambdas(gammas, np.broadcast_to(lambdas, (2, 3)), np.broadcast_to(norms, (2, 3)))
    assert isinstance(batched, np.ndarray) and batched.dtype == np.float64
    for row, gamma in zip(batched, gammas[:, 0]):
        np.testing.assert_allclose(row, grown_lambdas(np.full(3, gamma), lambdas, norms)[0], rtol=1e-12)


@pytest.mark.parametrize("norms, message", [
    ([1.0, -2.0, 3.0], "stream_norms: got [1.0, -2.0, 3.0]; allowed: 3 (num_layers) finite numbers > 0"),
    ([1.0, 2.0], "stream_norms: got [1.0, 2.0]; allowed: 3 (num_layers)"),
    ([1.0, float("nan"), 1.0], "stream_norms: got [1.0, nan, 1.0]; allowed: 3"),
    ("fast", "stream_norms: got a string ('fast'); allowed: numbers"),
    ([1.0, True, 2.0], "stream_norms: got a boolean (True); allowed: numbers"),
])
def test_bad_norms_are_refused_in_one_line(norms, message):
    with pytest.raises(ConfigError) as error:
        model_with([0.2, 0.3, 0.4], norms)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_yaml_round_trip_keeps_the_norms(tmp_path):
    model = model_with([0.2, 0.3, 0.4], [1.0, 2.0, 3.5])
    jaxroll.save_config(model, tmp_path / "c.yaml")
    read = jaxroll.load_config(tmp_path / "c.yaml")
    np.testing.assert_array_equal(read.stream_norms, [1.0, 2.0, 3.5])
    text = (tmp_path / "c.yaml").read_text().replace("stream_norms: [1.0, 2.0, 3.5]", "stream_norms: fast")
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"stream_norms: got a string \('fast'\); allowed: numbers$"):
        jaxroll.load_config(tmp_path / "bad.yaml")


# ---------------------------------------------------------------- measured


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
VOCAB = 64


def tiny(family):
    configs = {
        "bloom": lambda: transformers.BloomConfig(n_layer=3, n_head=4, hidden_size=32, vocab_size=VOCAB),
        "llama": lambda: transformers.LlamaConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                  hidden_size=32, intermediate_size=64, vocab_size=VOCAB),
        "gpt2": lambda: transformers.GPT2Config(n_layer=3, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=64),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[family](), attn_implementation="eager")
    return model.double().eval()


@pytest.mark.parametrize("family", ["bloom", "llama", "gpt2"])
def test_measured_norms_are_the_rms_of_each_blocks_input(family, tmp_path):
    from jaxroll.measure import measure

    model = tiny(family)
    ids = np.random.default_rng(1).integers(0, VOCAB, (3, 12))
    result = measure(model, ids, stats=("lambda", "influence"))
    with torch.no_grad():
        states = model(torch.as_tensor(ids), output_hidden_states=True).hidden_states  # embeddings, then blocks
    expected = [np.sqrt(np.mean(np.sum(h.numpy() ** 2, axis=-1))) for h in states[:3]]
    # The measuring pass runs the blocks at another batch shape (and attention path) than this plain forward;
    # Llama's eager softmax is float32 even in a float64 model, so its hidden states agree to about 1e-9
    # (BLOOM, GPT-2: 1e-11): 1e-6 relative. The mean norm for the RMS is off by 1e-5 (BLOOM) to 1e-2,
    # a neighbouring layer's by 4e-4 (BLOOM) to 3e-2.
    np.testing.assert_allclose(result.extra["stream_norms"], expected, rtol=1e-6)
    model_norms = result.to_rollout_model().stream_norms
    np.testing.assert_allclose(model_norms, expected, rtol=1e-6)


def test_the_per_sequence_rows_route_reads_the_norms():
    from jaxroll.interventions import parse
    from jaxroll.measure.row_prediction import predict_rows

    model = tiny("bloom")
    ids = np.random.default_rng(2).integers(0, VOCAB, (2, 10))
    lambdas, norms = np.array([0.2, 0.3, 0.25]), np.array([1.0, 1.4, 2.0])
    prediction = predict_rows(model, ids, lambdas, parse("gamma=2"), batch_size=2, stream_norms=norms)
    np.testing.assert_allclose(prediction.lambdas, grown_lambdas(np.full(3, 2.0), lambdas, norms)[0], rtol=1e-12)
    plain = predict_rows(model, ids, lambdas, parse("gamma=2"), batch_size=2)
    np.testing.assert_allclose(plain.lambdas, 2 * lambdas / (2 * lambdas + 1 - lambdas), rtol=1e-12)


def test_a_sweep_over_gamma_reads_the_norms():
    model = model_with(np.array([0.2, 0.35, 0.3, 0.25]), np.array([1.0, 1.5, 1.7, 2.5]))
    gammas = [0.5, 2.0]
    result = jaxroll.sweep(model, gamma=gammas, progress=False)
    for row, gamma in zip(np.asarray(result.profiles), gammas):
        expected = np.asarray(jaxroll.influence(BranchScale(gamma).apply(model)))
        # the same rule on the Krylov path (float64 both): 1e-10
        np.testing.assert_allclose(row.reshape(-1), expected, rtol=1e-10, atol=1e-14)
