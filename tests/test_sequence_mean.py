"""The mean of per-sequence rollouts (jaxroll.theory.sequence_mean, jaxroll.measure.sequence_rollout).

Oracles: dense NumPy float64 transitions multiplied out per sequence (no
scan, no vmap); with one sequence, `jaxroll.theory.rows.predicted_rows` of
a dense-kernel model (and `refined_influence` for per-position mixing); for
the measurement, each sequence's rollout built in NumPy from the attentions
transformers returns itself (``output_attentions=True``) and norm ratios
recomputed from the weights and hidden states (``hook_free`` of tests/test_refinements.py, which checks
itself against the model's next hidden state).
"""

import numpy as np
import pytest

from jaxroll.errors import ConfigError
from jaxroll.theory import refinements as R
from jaxroll.theory.rows import predicted_rows, query_positions
from jaxroll.theory.sequence_mean import mean_of_rollouts


def random_sequences(seed, sequences=4, layers=3, n=7, per_position=False):
    generator = np.random.default_rng(seed)
    raw = generator.random((sequences, layers, n, n)) ** 3 * np.tril(np.ones((n, n)))
    kernels = raw / raw.sum(-1, keepdims=True)
    lambdas = generator.random((sequences, layers, n) if per_position else (sequences, layers))
    return lambdas, kernels


def dense_mean_rows(lambdas, kernels, positions):
    """mean_s e_q^T R_T^s ... R_1^s with every R_t^s formed and multiplied out, float64."""
    sequences, layers, n, _ = kernels.shape
    if lambdas.ndim == 2:
        lambdas = np.repeat(lambdas[..., None], n, axis=-1)
    total = np.zeros((len(positions), n))
    for s in range(sequences):
        product = np.eye(n)
        for t in range(layers):  # P_t = R_t P_{t-1}: layer 1 acts first
            transition = np.eye(n) - np.diag(lambdas[s, t]) + np.diag(lambdas[s, t]) @ kernels[s, t]
            product = transition @ product
        total += product[positions]
    return total / sequences


@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("queries", [3, [0, 2, 6], 6])
def test_mean_of_rollouts_matches_dense_products(per_position, queries):
    lambdas, kernels = random_sequences(0, per_position=per_position)
    rows = mean_of_rollouts(lambdas, kernels, queries)
    positions = query_positions(7, queries)
    assert rows.dtype == np.float64 and rows.shape == (positions.size, 7)
    np.testing.assert_allclose(rows, dense_mean_rows(lambdas, kernels, positions), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert np.all(rows >= 0)
    # Causal kernels: row q puts no weight after q.
    for row, q in zip(rows, positions):
        assert np.all(row[q + 1:] == 0)


def plain_rows(lambdas, kernels, queries):
    """Rows of the plain rollout P_T = R_T ... R_1 (lambdas (T,), kernels (T, N, N)): `predicted_rows`."""
    import jaxroll

    dense = jaxroll.KernelRolloutModel.create(kernel=jaxroll.kernel_types.DenseKernel.create(kernels),
                                              lambdas=lambdas)
    return predicted_rows(dense, queries, n=kernels.shape[-1])


def test_one_sequence_is_the_plain_rollout():
    lambdas, kernels = random_sequences(1, sequences=1)
    np.testing.assert_allclose(mean_of_rollouts(lambdas, kernels, 4), plain_rows(lambdas[0], kernels[0], 4),
                               rtol=0, atol=1e-12)
    # Per-position mixing: the last row is the refined rollout's profile.
    lambdas, kernels = random_sequences(1, sequences=1, per_position=True)
    refined = R.RefinedRollout.create(lambdas[0], kernels[0][:, None])  # one head per layer
    np.testing.assert_allclose(mean_of_rollouts(lambdas, kernels, [6])[0], np.asarray(R.refined_influence(refined)),
                               rtol=0, atol=1e-12)


def test_the_mean_of_rollouts_differs_from_the_rollout_of_the_mean():
    # What issue 43 asks: averaging before or after the products is not the same thing.
    lambdas, kernels = random_sequences(2, sequences=6)
    of_the_mean = plain_rows(lambdas.mean(0), kernels.mean(0), 4)
    assert np.max(np.abs(mean_of_rollouts(lambdas, kernels, 4) - of_the_mean)) > 1e-3
    # Identical sequences: the two agree.
    same_lambdas, same_kernels = np.repeat(lambdas[:1], 5, 0), np.repeat(kernels[:1], 5, 0)
    np.testing.assert_allclose(mean_of_rollouts(same_lambdas, same_kernels, 4),
                               plain_rows(lambdas[0], kernels[0], 4), rtol=0, atol=1e-12)


def _bad(field, value):
    lambdas, kernels = random_sequences(3, sequences=2)
    return {"lambdas": lambdas, "kernels": kernels} | {field: value(lambdas, kernels)}


@pytest.mark.parametrize("bad,match", [
    (_bad("lambdas", lambda l, k: l * 0 + 1.5), "lambdas: outside"),
    (_bad("lambdas", lambda l, k: np.where(l > 0.5, np.nan, l)), "lambdas: outside"),
    (_bad("lambdas", lambda l, k: l[:, :2]), "lambdas: got shape"),
    (_bad("kernels", lambda l, k: k[0]), "kernels: got shape"),
    (_bad("kernels", lambda l, k: k[..., :6]), "kernels: got shape"),
    (_bad("kernels", lambda l, k: k * 1.01), "kernels: a row sums to"),
    (_bad("kernels", lambda l, k: np.where(k > 0.9, np.nan, k)), "kernels: negative or non-finite"),
    (_bad("kernels", lambda l, k: k - 0.5 * np.eye(7) + 0.5 * np.eye(7, k=-1)), "kernels: negative"),
])
def test_mean_of_rollouts_refuses_bad_input_in_one_line(bad, match):
    with pytest.raises(ConfigError, match=match) as error:
        mean_of_rollouts(bad["lambdas"], bad["kernels"], 3)
    assert "\n" not in str(error.value) and "allowed" in str(error.value)


def test_mean_of_rollouts_refuses_bad_queries():
    lambdas, kernels = random_sequences(4)
    with pytest.raises(ConfigError, match="queries"):
        mean_of_rollouts(lambdas, kernels, [7])


# ----------------------------------------------------------------------------- measurement on HF models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_refinements import hook_free, tiny_model  # noqa: E402  (the refinement tests' tiny models and oracle)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def hand_read_rows(model, ids, positions):
    """Per sequence: A_t^s from output_attentions (mean over heads), lambda_t^s from hook-free norms; dense
    products in NumPy, then the mean over sequences."""
    from jaxroll.measure.precision import full_precision

    lambdas, kernels = [], []
    for row in ids:
        with torch.no_grad(), full_precision(model):
            attentions = model(input_ids=torch.as_tensor(row)[None], output_attentions=True).attentions
        kernels.append(np.stack([a[0].double().numpy().mean(0) for a in attentions]))
        lambdas.append(hook_free(model, row)["lambda_positions"].mean(-1))
    return dense_mean_rows(np.asarray(lambdas), np.asarray(kernels), positions), np.asarray(lambdas), \
        np.asarray(kernels)


@pytest.fixture(scope="module", params=["bloom", "llama"])
def family_model(request, tmp_path_factory):
    return request.param, tiny_model(request.param, tmp_path_factory.mktemp(request.param))


def test_sequence_rollout_rows_match_each_sequence_read_by_hand(family_model):
    from jaxroll.measure.sequence_rollout import sequence_rollout_rows

    _, model = family_model
    ids = np.random.default_rng(7).integers(0, 97, (5, 9))
    rows, positions = sequence_rollout_rows(model, ids, 4, batch_size=2)
    expected, lambdas, kernels = hand_read_rows(model, ids, positions)
    assert positions.tolist() == query_positions(9, 4).tolist() and rows.shape == (4, 9)
    # float64 on both sides, the same probabilities: rounding only.
    np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(rows, mean_of_rollouts(lambdas, kernels, 4), rtol=0, atol=1e-10)
    # The batch size changes nothing but the model's own rounding (batched matrix products).
    np.testing.assert_allclose(sequence_rollout_rows(model, ids, 4, batch_size=5)[0], rows, rtol=0, atol=1e-14)
    # Something to see: not the rollout of the mean.
    of_the_mean = plain_rows(lambdas.mean(0), kernels.mean(0), 4)
    assert np.max(np.abs(rows - of_the_mean)) > 1e-6


def test_the_registered_statistic_is_the_last_row(family_model):
    from jaxroll.measure import measure, statistic_names
    from jaxroll.measure.sequence_rollout import sequence_rollout_rows

    _, model = family_model
    assert "sequence_rollout" in statistic_names()
    ids = np.random.default_rng(8).integers(0, 97, (3, 8))
    arrays = measure(model, ids, stats="lambda,sequence_rollout", batch_size=2).arrays()
    rows, _ = sequence_rollout_rows(model, ids, [7])
    np.testing.assert_allclose(arrays["sequence_rollout"], rows[0], rtol=0, atol=1e-12)
    assert arrays["sequence_rollout_per_sequence"].shape == (3, 8)
    np.testing.assert_allclose(arrays["sequence_rollout_per_sequence"].mean(0), rows[0], rtol=0, atol=1e-12)
    for s in range(3):
        np.testing.assert_allclose(arrays["sequence_rollout_per_sequence"][s],
                                   sequence_rollout_rows(model, ids[s:s + 1], [7])[0][0], rtol=0, atol=1e-12)


def test_the_statistic_under_recomputed_rows_equals_eager(tmp_path):
    # A model without eager attention: alpha comes from rows recomputed from q and k.
    from jaxroll.measure import measure

    eager = tiny_model("llama", tmp_path)
    sdpa = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64,
                                                             attn_implementation="sdpa").eval()
    ids = np.random.default_rng(9).integers(0, 97, (2, 8))
    expected = measure(eager, ids, stats="sequence_rollout").extra["sequence_rollout"]
    result = measure(sdpa, ids, stats="sequence_rollout")
    assert result.metadata["attention_rows"] is not None
    np.testing.assert_allclose(result.extra["sequence_rollout"], expected, rtol=0, atol=1e-10)


def test_sequence_rollout_rows_refuse_bad_input(family_model):
    from jaxroll.measure.sequence_rollout import sequence_rollout_rows

    _, model = family_model
    with pytest.raises(ConfigError, match="token_ids"):
        sequence_rollout_rows(model, np.zeros((3,), dtype=np.int64), 2)
    with pytest.raises(ConfigError, match="batch_size"):
        sequence_rollout_rows(model, np.zeros((2, 5), dtype=np.int64), 2, batch_size=0)
    with pytest.raises(ConfigError, match="queries"):
        sequence_rollout_rows(model, np.zeros((2, 5), dtype=np.int64), [5])


def test_measure_cli_writes_the_statistic_into_measurement_npz(tmp_path, capsys):
    # `jaxroll measure --stats ...,sequence_rollout`: the last row, on the token ids the run wrote.
    from test_refinements import _saved_llama

    from jaxroll.cli import main
    from jaxroll.measure.sequence_rollout import sequence_rollout_rows

    directory, texts = _saved_llama(tmp_path, seed=0, words=20)
    out = tmp_path / "out"
    assert main(["measure", str(directory), "--texts", str(texts), "--length", "12", "--samples", "3", "--quiet",
                 "--out", str(out), "--dtype", "float64", "--stats", "lambda,sequence_rollout"]) == 0
    capsys.readouterr()
    arrays = np.load(out / "measurement.npz")
    assert arrays["sequence_rollout"].shape == (12,) and arrays["sequence_rollout_per_sequence"].shape == (3, 12)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64,
                                                              attn_implementation="eager").eval()
    rows, _ = sequence_rollout_rows(model, arrays["token_ids"], [11])
    np.testing.assert_allclose(arrays["sequence_rollout"], rows[0], rtol=0, atol=1e-12)
