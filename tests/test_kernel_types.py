"""Every kernel type against a plain NumPy float64 dense oracle.

The oracle below builds each head's kernel literally, row by row, as the
masked softmax of the scores ``f_h(i - j)`` (relative kernels) or takes the
given matrices (dense), mixes heads, and multiplies the transitions
``R_t = (1 - lambda_t) I + lambda_t A_t`` in float64. It shares no code with
jaxroll. Tolerance 1e-12 (float64): the FFT products' rounding is of order
``eps log2(L) ||u|| ||g||`` (module docstring of jaxroll.engine.relative), a few
1e-15 at these sizes even with tables that rise by e^3 above f(1).
"""

import numpy as np
import pytest
import yaml
from hypothesis import given, settings, strategies as st

import jaxroll
from jaxroll import ConfigError, DenseKernel, KernelRolloutModel, PowerKernel, TableKernel
from jaxroll.cli import main

import oracle

TOL = 1e-12


# ---------------------------------------------------------------- the oracle


def oracle_relative_kernel(scores, weights):
    """scores (H, n): f_h(k) for k = 0..n-1. A[i, j] = sum_h w_h e^{f(i-j)} / sum_{k<=i} e^{f(k)}."""
    H, n = scores.shape
    kernel = np.zeros((n, n))
    for h in range(H):
        for i in range(n):
            row = np.array([scores[h, i - j] for j in range(i + 1)])
            row = np.exp(row - row.max())
            kernel[i, : i + 1] += weights[h] / weights.sum() * row / row.sum()
    return kernel


def oracle_power_scores(slopes, exponents, diagonal, n):
    k = np.arange(n, dtype=np.float64)
    scores = -slopes[:, None] * k[None, :] ** exponents[:, None]
    scores[:, 0] = diagonal
    return scores


def oracle_rollout(lambdas, kernels):
    n = kernels[0].shape[0]
    product = np.eye(n)
    for lam, kernel in zip(lambdas, kernels):
        product = ((1 - lam) * np.eye(n) + lam * kernel) @ product
    return product


def power_case(rng, T, H):
    return dict(slopes=rng.uniform(0.0, 2.0, (T, H)), exponents=rng.uniform(0.3, 2.0, (T, H)),
                diagonal=rng.uniform(-8.0, 8.0, (T, H)), weights=rng.uniform(0.1, 1.0, (T, H)),
                lambdas=rng.uniform(0.0, 1.0, T))


def power_model(case, n):
    T, H = case["slopes"].shape
    kernel = PowerKernel.create(num_layers=T, num_heads=H, slopes=case["slopes"], exponents=case["exponents"],
                                diagonal_scores=case["diagonal"], head_weights=case["weights"])
    return KernelRolloutModel.create(kernel=kernel, lambdas=case["lambdas"], sequence_length=n)


def power_oracle_kernels(case, n):
    return [oracle_relative_kernel(oracle_power_scores(case["slopes"][t], case["exponents"][t],
                                                       case["diagonal"][t], n), case["weights"][t])
            for t in range(len(case["lambdas"]))]


def table_case(rng, T, H, K):
    return dict(table=rng.uniform(-3.0, 3.0, (T, H, K)), diagonal=rng.uniform(-8.0, 8.0, (T, H)),
                weights=rng.uniform(0.1, 1.0, (T, H)), lambdas=rng.uniform(0.0, 1.0, T))


def table_model(case, n):
    T, H, _ = case["table"].shape
    kernel = TableKernel.create(num_layers=T, num_heads=H, offset_scores=case["table"],
                                diagonal_scores=case["diagonal"], head_weights=case["weights"])
    return KernelRolloutModel.create(kernel=kernel, lambdas=case["lambdas"], sequence_length=n)


def table_oracle_kernels(case, n):
    kernels = []
    for t in range(len(case["lambdas"])):
        scores = np.concatenate([case["diagonal"][t][:, None], case["table"][t][:, : n - 1]], axis=1)
        kernels.append(oracle_relative_kernel(scores, case["weights"][t]))
    return kernels


def dense_case(rng, T, n):
    raw = rng.exponential(size=(T, n, n)) * np.tril(np.ones((n, n)))
    return dict(kernels=raw / raw.sum(-1, keepdims=True), lambdas=rng.uniform(0.0, 1.0, T))


def check_model(model, kernels, n):
    """influence (both methods), rollout_matrix and attention_kernel against the oracle."""
    expected = oracle_rollout(np.asarray(model.lambdas), kernels)
    for method in ("auto", "dense"):
        np.testing.assert_allclose(jaxroll.influence(model, n, method=method), expected[-1], rtol=0, atol=TOL)
    np.testing.assert_allclose(jaxroll.rollout_matrix(model, n), expected, rtol=0, atol=TOL)
    for t, kernel in enumerate(kernels):
        np.testing.assert_allclose(jaxroll.attention_kernel(model, t, n), kernel, rtol=0, atol=TOL)


# ---------------------------------------------------------------- accuracy


# A few shapes only (each new shape compiles); the parameters are what hypothesis varies.
LENGTHS = st.sampled_from([1, 2, 33])
HEADS = st.just(3)  # one head is the H = 1 case of the fit and file tests


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), H=HEADS, n=LENGTHS)
def test_power_kernel_against_the_oracle(seed, H, n):
    T = 2
    case = power_case(np.random.default_rng(seed), T, H)
    check_model(power_model(case, n), power_oracle_kernels(case, n), n)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), H=HEADS, n=LENGTHS, longer=st.booleans())
def test_table_kernel_against_the_oracle(seed, H, n, longer):
    T = 2
    case = table_case(np.random.default_rng(seed), T, H, max(n - 1, 1) + 7 * longer)
    check_model(table_model(case, n), table_oracle_kernels(case, n), n)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 9, 30]))
def test_dense_kernel_against_the_oracle_at_any_causal_prefix(seed, n):
    case = dense_case(np.random.default_rng(seed), 2, 30)
    model = KernelRolloutModel.create(kernel=DenseKernel.create(case["kernels"]), lambdas=case["lambdas"])
    # Causal: the top-left n x n block is the kernel at length n.
    check_model(model, [kernel[:n, :n] for kernel in case["kernels"]], n)


def test_alibi_kernel_and_power_alpha_one_equal_the_rollout_model():
    rng = np.random.default_rng(3)
    T, H, n = 2, 3, 24
    reference = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=rng.uniform(0, 1, T),
                                            alibi_slopes=rng.uniform(0, 1, (T, H)),
                                            diagonal_scores=rng.uniform(-5, 5, (T, H)),
                                            head_weights=rng.uniform(0.1, 1, (T, H)), sequence_length=n)
    arrays = oracle.config_arrays(yaml.safe_load(yaml.safe_dump(jaxroll.schema.config_from_model(reference))))
    kernels = [oracle.layer_kernel(arrays, t, n) for t in range(T)]
    alibi = KernelRolloutModel.create(kernel=reference.kernel, lambdas=reference.lambdas,
                                      sequence_length=n)
    check_model(alibi, kernels, n)
    power = KernelRolloutModel.create(
        kernel=PowerKernel.create(num_layers=T, num_heads=H, slopes=reference.alibi_slopes,
                                  diagonal_scores=reference.diagonal_scores, head_weights=reference.head_weights),
        lambdas=reference.lambdas, sequence_length=n)
    check_model(power, kernels, n)


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("diagonal", [-250.0, 0.0, 250.0])
def test_relative_products_are_non_negative_and_keep_row_sums(diagonal):
    """v^T A for v >= 0 is >= 0 exactly (FFT rounding clipped), and (1^T ... ) row sums: A 1 = 1."""
    n, H = 4096, 3
    kernel = PowerKernel.create(num_layers=1, num_heads=H, slopes=[[0.0, 0.5, 10.0]],
                                exponents=[[1.0, 0.5, 1.5]], diagonal_scores=diagonal).layer(0)
    last = np.zeros(n)
    last[-1] = 1.0
    for v in (last, np.random.default_rng(0).uniform(0, 1, n)):
        product = np.asarray(kernel.row_times_kernel(v))
        assert np.all(product >= 0)
        # Column sums of v^T A equal sum(v) because A is row-stochastic.
        assert abs(product.sum() - v.sum()) < 1e-10 * v.sum()
    dense = np.asarray(kernel.dense(256))
    np.testing.assert_allclose(dense.sum(-1), 1.0, rtol=0, atol=1e-13)
    assert np.all(dense >= 0) and not np.triu(dense, 1).any()


def test_gradients_match_finite_differences_of_the_oracle():
    rng = np.random.default_rng(5)
    T, H, n = 2, 2, 12
    case = power_case(rng, T, H)
    table = table_case(rng, T, H, n - 1)

    def oracle_loss_power(c):
        return oracle_rollout(c["lambdas"], power_oracle_kernels(c, n))[-1] @ np.linspace(0, 1, n)

    def oracle_loss_table(c):
        return oracle_rollout(c["lambdas"], table_oracle_kernels(c, n))[-1] @ np.linspace(0, 1, n)

    import jax

    def loss(model):
        return jaxroll.influence(model, n) @ np.linspace(0, 1, n)

    power_grad = jax.grad(loss)(power_model(case, n))
    table_grad = jax.grad(loss)(table_model(table, n))
    checks = [(case, oracle_loss_power, "slopes", power_grad.kernel.slopes),
              (case, oracle_loss_power, "exponents", power_grad.kernel.exponents),
              (case, oracle_loss_power, "diagonal", power_grad.kernel.diagonal_scores),
              (case, oracle_loss_power, "lambdas", power_grad.lambdas),
              (table, oracle_loss_table, "table", table_grad.kernel.offset_scores),
              (table, oracle_loss_table, "diagonal", table_grad.kernel.diagonal_scores)]
    step = 1e-6
    for values, function, name, gradient in checks:
        gradient = np.asarray(gradient)
        for index in [(0,) * gradient.ndim, tuple(s - 1 for s in gradient.shape)]:
            up = {k: v.copy() for k, v in values.items()}
            down = {k: v.copy() for k, v in values.items()}
            up[name][index] += step
            down[name][index] -= step
            estimate = (function(up) - function(down)) / (2 * step)
            # Central differences: truncation O(step^2) and rounding O(eps / step) ~ 1e-10.
            assert abs(gradient[index] - estimate) < 1e-8, (name, index, gradient[index], estimate)


# ---------------------------------------------------------------- files


def test_kernel_configs_round_trip_exactly(tmp_path):
    rng = np.random.default_rng(1)
    models = {
        "power": power_model(power_case(rng, 3, 2), 64),
        "alibi": KernelRolloutModel.create(kernel=PowerKernel.create(num_layers=2, num_heads=3,
                                                                     slopes=rng.uniform(0, 1, 3)), lambdas=0.3),
        "table": table_model(table_case(rng, 2, 2, 40), 41),
        "dense": KernelRolloutModel.create(kernel=DenseKernel.create(dense_case(rng, 2, 9)["kernels"]),
                                           lambdas=[0.1, 0.9]),
    }
    import jax

    for name, model in models.items():
        path = jaxroll.save_config(model, tmp_path / f"{name}.yaml")
        loaded = jaxroll.load_config(path)
        assert type(loaded.kernel) is type(model.kernel) and loaded.sequence_length == model.sequence_length
        for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(loaded)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        config = yaml.safe_load(path.read_text())
        assert config["kernel_config"]["kernel_type"] == ("dense" if name == "dense" else "relative")
        assert (tmp_path / f"{name}.kernels.npz").is_file() == (name in ("dense", "table"))
    assert yaml.safe_load((tmp_path / "alibi.yaml").read_text())["kernel_config"]["family"] == "alibi"
    with pytest.raises(ConfigError, match="exists"):
        jaxroll.save_config(models["dense"], tmp_path / "dense.yaml")


def _dense_config(directory, kernels, *, sequence_length=None, num_layers=None):
    np.savez(directory / "k.npz", kernels=kernels)
    config = {"sequence_length": sequence_length or kernels.shape[-1], "num_layers": num_layers or kernels.shape[0],
              "kernel_config": {"kernel_type": "dense", "file": "k.npz"},
              "lambda_schedule_config": {"schedule_type": "constant", "lambda_const": 0.5}}
    path = directory / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _bad_dense(kind):
    kernels = dense_case(np.random.default_rng(0), 2, 8)["kernels"]
    if kind == "row sum":
        kernels[1, 3] *= 1.001
    elif kind == "negative":
        kernels[0, 5, 0] = -1e-3
        kernels[0, 5, 1] += 1e-3
    elif kind == "nan":
        kernels[0, 2, 1] = np.nan
    elif kind == "shape":
        kernels = kernels[:, :, :7]
    return kernels


@pytest.mark.parametrize("kind, message", [
    ("row sum", "kernel_config.file (k.npz): layer 1 row 3 sums to"),
    ("negative", "kernel_config.file (k.npz): value -0.001 at index [0, 5, 0] is outside the allowed range [0, inf)"),
    ("nan", "nan at index [0, 2, 1] is not finite"),
    ("shape", "kernel_config.file (k.npz): got shape (2, 8, 7); allowed: (num_layers, N, N)"),
])
def test_bad_dense_kernels_are_one_line_errors_and_exit_2(kind, message, tmp_path, capsys):
    path = _dense_config(tmp_path, _bad_dense(kind))
    with pytest.raises(ConfigError) as error:
        jaxroll.load_config(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    out = tmp_path / "out"
    assert main(["rollout", str(path), "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and message in stderr
    assert not out.exists()  # nothing written


def test_lengths_beyond_a_kernel_are_refused(tmp_path, capsys):
    kernels = dense_case(np.random.default_rng(0), 2, 8)["kernels"]
    path = _dense_config(tmp_path, kernels)
    assert main(["rollout", str(path), "--length", "9", "--out", str(tmp_path / "out")]) == 2
    assert "--length 9: got 9; allowed: at most the dense kernels' N = 8" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="sequence_length: got 9; allowed: at most"):
        jaxroll.load_config(_dense_config(tmp_path, kernels, sequence_length=9))
    with pytest.raises(ConfigError, match=r"holds 2 layers; allowed: num_layers \(3\)"):
        jaxroll.load_config(_dense_config(tmp_path, kernels, num_layers=3))
    table = {"sequence_length": 10, "num_layers": 1,
             "kernel_config": {"kernel_type": "relative", "family": "table", "num_heads": 1,
                               "offset_scores": [[[0.0] * 8]]},
             "lambda_schedule_config": {"schedule_type": "constant", "lambda_const": 0.5}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(table))
    with pytest.raises(ConfigError, match="kernel_config.offset_scores: a table of 8 offsets; allowed at length 10: "
                                          "at least n - 1 = 9 offsets"):
        jaxroll.load_config(tmp_path / "t.yaml")
    with pytest.raises(ConfigError, match="offset_scores"):
        jaxroll.influence(table_model(table_case(np.random.default_rng(0), 1, 1, 8), 9), 10)


@pytest.mark.parametrize("change, message", [
    ({"family": "cosine"}, "kernel_config.family: got 'cosine'; allowed: one of alibi, power, table"),
    ({"slopes": [[-0.5]]}, "kernel_config.slopes: value -0.5 at index [0, 0] is outside the allowed range [0, inf)"),
    ({"exponents": [[0.0]]}, "kernel_config.exponents: value 0.0 at index [0, 0] is outside the allowed range (0, inf)"),
    ({"exponents": None}, "kernel_config.exponents: missing"),
    ({"offset_scores": [[[1.0]]]}, "kernel_config.offset_scores: not used by the power family"),
    ({"kernel_type": "sparse"}, "kernel_config.kernel_type: got 'sparse'; allowed: one of anchored_gain_table, dense, gain_table, relative"),
    ({"kernel_type": ["relative"]}, "kernel_config.kernel_type: got ['relative']; allowed: one of anchored_gain_table, dense, gain_table, relative"),
    ({"family": {"power": 1}}, "kernel_config.family: got {'power': 1}; allowed: one of alibi, power, table"),
])
def test_bad_relative_configs_name_the_field(change, message, tmp_path):
    section = {"kernel_type": "relative", "family": "power", "num_heads": 1, "slopes": [[0.5]], "exponents": [[1.0]]}
    section.update(change)
    section = {k: v for k, v in section.items() if v is not None}
    config = {"sequence_length": 16, "num_layers": 2, "kernel_config": section,
              "lambda_schedule_config": {"schedule_type": "constant", "lambda_const": 0.5}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as error:
        jaxroll.load_config(tmp_path / "c.yaml")
    assert message in str(error.value) and "\n" not in str(error.value)


# ---------------------------------------------------------------- fitting


def test_fit_kernel_recovers_a_power_kernel_and_extrapolates():
    from jaxroll.fitting.kernel_fit import fit_kernel

    truth = PowerKernel.create(num_layers=3, num_heads=1, slopes=[[0.3], [0.1], [0.05]],
                               exponents=[[0.7], [1.0], [1.3]], diagonal_scores=[[1.0], [-1.0], [0.5]])
    n = 32
    kernels = np.stack([oracle_relative_kernel(oracle_power_scores(np.asarray(truth.slopes[t]),
                                                                   np.asarray(truth.exponents[t]),
                                                                   np.asarray(truth.diagonal_scores[t]), n),
                                               np.ones(1)) for t in range(3)])
    measured = KernelRolloutModel.create(kernel=DenseKernel.create(kernels), lambdas=[0.2, 0.5, 0.8])
    result = fit_kernel(measured, family="power", steps=1500)
    fitted = result.model.kernel
    # Identifiable from a noiseless kernel; Adam stops at ~1e-3 relative after 1500 steps.
    np.testing.assert_allclose(fitted.slopes, truth.slopes, rtol=2e-3)
    np.testing.assert_allclose(fitted.exponents, truth.exponents, rtol=2e-3)
    np.testing.assert_allclose(fitted.diagonal_scores, truth.diagonal_scores, atol=2e-3)
    assert np.all(result.max_abs_error < 1e-3) and result.losses[-1] < 1e-3 * result.losses[0]
    # Extrapolation: the fitted model runs at 4N, close to the truth's rollout there.
    truth_model = KernelRolloutModel.create(kernel=truth, lambdas=[0.2, 0.5, 0.8], sequence_length=4 * n)
    far = jaxroll.influence(result.model, 4 * n)
    assert float(jaxroll.metrics.total_variation(far, jaxroll.influence(truth_model))) < 1e-3


# ---------------------------------------------------------------- tables that rise (issue 19)


@pytest.mark.parametrize("rise", [0.0, 10.0, 20.0, 30.0, 40.0, 60.0, 800.0])
def test_rising_tables_are_exact(rise):
    """The table of issue 19: ``f(1) = 0``, -3 up to offset 32, then ``rise``,
    two layers, N = 64. The FFT alone loses digits by ``e^{rise}`` (1e-12 at
    10, 1e-8 at 20, 12 at 40: asserted below, so the test can fail); the
    product that `influence` takes must agree with the literal oracle to
    1e-10 in float64 at every rise (observed ~1e-16: the direct path sums
    non-negative terms)."""
    n = 64
    table = np.full(n - 1, -3.0)
    table[0] = 0.0
    table[32:] = rise
    lambdas = np.array([0.7, 0.9])
    kernel = TableKernel.create(num_layers=2, num_heads=1, offset_scores=table)
    model = KernelRolloutModel.create(kernel=kernel, lambdas=lambdas, sequence_length=n)
    scores = np.concatenate([[0.0], table])[None]
    dense = oracle_relative_kernel(scores, np.ones(1))
    expected = oracle_rollout(lambdas, [dense, dense])[-1]
    profile = np.asarray(jaxroll.influence(model))
    np.testing.assert_allclose(profile, expected / expected.sum(), rtol=0, atol=1e-10)
    v = np.random.default_rng(2).uniform(0, 1, n)
    import jax.numpy as jnp
    exact = np.asarray(jaxroll.engine.relative.row_times_kernel(jnp.asarray(v), jnp.asarray(scores), jnp.ones(1)))
    np.testing.assert_allclose(exact, v @ dense, rtol=0, atol=1e-10)
    alpha = float(jaxroll.engine.relative.amplification(jnp.asarray(scores)))
    if 20.0 <= rise <= 60.0:  # the FFT alone would be wrong here: the fallback matters
        assert alpha > jaxroll.engine.relative.MAX_AMPLIFICATION
        fft = np.asarray(jaxroll.engine.relative.fft_row_times_kernel(jnp.asarray(v), jnp.asarray(scores), jnp.ones(1)))
        assert np.max(np.abs(fft - v @ dense)) > 1e-9
    if rise == 0.0:
        assert alpha <= 1.0


def test_direct_product_matches_the_oracle_for_random_tables():
    """`direct_row_times_kernel` (the exact path) on random tables of 3 heads,
    N = 1..300 with blocks of rows that do not divide N: 1e-12 in float64."""
    import jax.numpy as jnp
    rng = np.random.default_rng(11)
    for n in (1, 2, 37, 300):
        scores = rng.uniform(-30, 30, (3, n))
        weights = rng.uniform(0.1, 1, 3)
        v = rng.uniform(0, 1, n)
        got = np.asarray(jaxroll.engine.relative.direct_row_times_kernel(
            jnp.asarray(v), jnp.asarray(scores), jnp.asarray(weights)))
        np.testing.assert_allclose(got, v @ oracle_relative_kernel(scores, weights), rtol=0, atol=1e-12)
