"""Every row of P_T: predicted rows against a NumPy float64 oracle, measured rows against one-at-a-time autograd."""

import numpy as np
import pytest

import jaxroll
from jaxroll import ConfigError
from jaxroll.theory.rows import normalised_rows, predicted_rows, query_positions

import oracle


def _config(n=24, layers=3, heads=2):
    return {"sequence_length": n, "num_layers": layers,
            "attention_config": {"num_heads": heads, "alibi_slopes": [[0.3, 0.05], [0.2, 0.1], [0.0, 0.4]],
                                 "softmax_temperature": 1.0},
            "content_config": {"diagonal_scores": [[0.5, -0.2]], "base_scores": [[0.0]]},
            "lambda_schedule_config": {"schedule_type": "custom", "lambdas_custom": [0.9, 0.5, 0.7]}}


def test_query_positions_end_at_the_last_token_and_refuse_bad_input():
    assert query_positions(10, 3).tolist() == [3, 6, 9]
    assert query_positions(256, 1).tolist() == [255]
    assert query_positions(10, "2,5") .tolist() == [2, 5]
    assert query_positions(10, [7, 2]).tolist() == [2, 7]
    for bad in (0, 10, [10], [-1], "x"):
        with pytest.raises(ConfigError, match="queries"):
            query_positions(10, bad)


def test_predicted_rows_equal_the_dense_numpy_rollout():
    import jax

    with jax.enable_x64(True):
        config = _config()
        model = jaxroll.RolloutModel.create(
            num_layers=3, num_heads=2, lambdas=[0.9, 0.5, 0.7],
            alibi_slopes=np.array(config["attention_config"]["alibi_slopes"]),
            diagonal_scores=[[0.5, -0.2]], sequence_length=24)
        positions = query_positions(24, 5)
        rows = predicted_rows(model, 5)
    expected = oracle.rollout_matrix(oracle.config_arrays(config), 24)[positions]
    # float64 throughout: the structured products agree with the dense oracle to rounding.
    np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-12)
    # Row i is the last-row profile at length i + 1 (causal), zeros after i.
    short = jaxroll.RolloutModel.create(num_layers=3, num_heads=2, lambdas=[0.9, 0.5, 0.7],
                                        alibi_slopes=np.array(config["attention_config"]["alibi_slopes"]),
                                        diagonal_scores=[[0.5, -0.2]], sequence_length=int(positions[0]) + 1)
    with jax.enable_x64(True):
        np.testing.assert_allclose(rows[0, : positions[0] + 1], np.asarray(jaxroll.influence(short)), atol=1e-12)
    assert np.all(rows[0, positions[0] + 1:] == 0)


def test_predicted_rows_of_a_kernel_model_equal_its_dense_rollout_matrix():
    import jax

    from jaxroll.kernel_types import PowerKernel
    from jaxroll.rollout import rollout_matrix

    with jax.enable_x64(True):
        model = jaxroll.KernelRolloutModel.create(
            kernel=PowerKernel.create(num_layers=3, num_heads=2, slopes=[[0.4, 0.1]], exponents=[[0.8, 1.3]]),
            lambdas=[0.9, 0.5, 0.7], sequence_length=20)
        rows = predicted_rows(model, 4)
        # The oracle: the dense product of (n, n) kernels, then its rows (rollout_row never forms P_T).
        expected = np.asarray(rollout_matrix(model))[query_positions(20, 4)]
    np.testing.assert_allclose(rows, expected / expected.sum(axis=1, keepdims=True), rtol=0, atol=1e-12)


def test_normalised_rows_weigh_sequences_by_gradient_mass():
    rows = np.array([[[1.0, 3.0]], [[3.0, 1.0]], [[0.0, 4.0]]])  # (S=3, K=1, N=2)
    np.testing.assert_allclose(normalised_rows(rows), [[4 / 12, 8 / 12]])
    with pytest.raises(ConfigError, match="rows"):
        normalised_rows(np.zeros((2, 1, 3)))


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_measure import tiny, token_ids  # noqa: E402

from jaxroll.measure import influence_gradients, measure  # noqa: E402
from jaxroll.measure.rows import influence_rows  # noqa: E402


@pytest.mark.parametrize("family", ["bloom", "llama", "gpt2"])
def test_measured_rows_equal_one_query_and_one_sequence_at_a_time(family):
    model = tiny(family)
    ids = token_ids(5, 12, seed=3)
    rows, positions = influence_rows(model, ids, 4, batch_size=2)  # S = 5: the last batch is short
    assert rows.shape == (5, 4, 12) and positions.tolist() == [3, 6, 8, 11]
    for s in range(5):
        for k, q in enumerate(positions):
            # The oracle: one sequence, full logits, the target at q alone.
            expected = influence_gradients(model, ids[s], position=int(q))
            # float64 model: batched and single passes differ only by summation order.
            np.testing.assert_allclose(rows[s, k], expected, rtol=1e-10, atol=1e-14)
        assert np.all(rows[s, :, :][np.arange(12)[None, :] > positions[:, None]] == 0)
    # The last query is measure's influence_per_sequence.
    result = measure(model, ids, stats=("influence",))
    np.testing.assert_allclose(rows[:, -1], result.influence_per_sequence, rtol=1e-10, atol=1e-14)


def test_cli_queries_write_rows_that_match_the_library(tmp_path, capsys):
    import transformers
    from tiny_tokenizer import WORDS, word_level_tokenizer

    from jaxroll.cli import main
    from jaxroll.measure import read_measurement

    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    transformers.AutoModelForCausalLM.from_config(
        transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=64)).save_pretrained(model_dir)
    word_level_tokenizer().save_pretrained(model_dir)
    texts = tmp_path / "docs.txt"
    rng = np.random.default_rng(0)
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=20)) for _ in range(3)) + "\n", encoding="utf-8")
    base = ["measure", model_dir, "--texts", texts, "--length", 16, "--samples", 3, "--quiet",
            "--dtype", "float64"]
    assert main([str(x) for x in base + ["--out", tmp_path / "bad", "--queries", "16"]]) == 2
    assert "queries" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main([str(x) for x in base + ["--out", tmp_path / "out", "--queries", "3"]]) == 0
    arrays, metadata = read_measurement(tmp_path / "out")
    assert arrays["query_positions"].tolist() == metadata["queries"] == [5, 10, 15]
    rows = arrays["influence_rows_per_sequence"]
    assert rows.shape == (3, 3, 16)
    np.testing.assert_allclose(rows[:, -1], arrays["influence_per_sequence"], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(arrays["influence_rows"].sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(arrays["influence_rows"][-1], arrays["influence"], rtol=1e-10)
