"""The composition exponent q (`RolloutModel.composition`, `jaxroll.fitting.fit_composition`).

Oracles: a NumPy float64 rollout written here (ALiBi + content softmax rows,
each transition raised elementwise to q, the last row's q-th root at the end),
the plain rollout (q = 1 is the paper's product, exactly), a property of the
form (one layer: the profile is the transition's last row whatever q), central
differences, and a W1 written here for the fit's minimality.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxroll
from jaxroll import ConfigError
from jaxroll.fitting import fit_composition
from jaxroll.model import checked_composition

N = 24
SLOPES = np.array([[0.5, 0.05], [0.25, 0.1], [0.8, 0.02]])
DIAGONAL = np.array([[1.0, -0.5], [0.3, 0.0], [-1.0, 2.0]])
LAMBDAS = np.array([0.3, 0.55, 0.2])


def model(q=None, lambdas=LAMBDAS, n=N):
    return jaxroll.RolloutModel.create(num_layers=len(lambdas), num_heads=2, lambdas=lambdas,
                                       alibi_slopes=SLOPES[:len(lambdas)], diagonal_scores=DIAGONAL[:len(lambdas)],
                                       sequence_length=n, composition=q)


def oracle_transitions(lambdas=LAMBDAS, n=N):
    """``R_t = (1 - lambda_t) I + lambda_t A_t``, ``A_t`` the head mean of causal softmax rows of
    ``-m (i - j) + d [i == j]``, in NumPy float64."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    out = []
    for t, lam in enumerate(lambdas):
        heads = []
        for m, d in zip(SLOPES[t], DIAGONAL[t]):
            scores = np.where(j <= i, -m * (i - j) + d * (i == j), -np.inf)
            rows = np.exp(scores - scores.max(axis=1, keepdims=True))
            heads.append(rows / rows.sum(axis=1, keepdims=True))
        out.append((1 - lam) * np.eye(n) + lam * np.mean(heads, axis=0))
    return out


def oracle_profile(q, lambdas=LAMBDAS, n=N):
    row = np.zeros(n)
    row[-1] = 1.0
    for transition in oracle_transitions(lambdas, n)[::-1]:
        row = row @ np.abs(transition) ** q
    profile = row ** (1.0 / q)
    return profile / profile.sum()


def w1(p, q):
    """W1 over positions / (N - 1), as `jaxroll.metrics.wasserstein` defines it, in NumPy."""
    return float(np.abs(np.cumsum(p - q)[:-1]).sum() / (len(p) - 1))


@pytest.mark.parametrize("q", [1.0, 1.15, 1.5, 2.0])
def test_the_powered_rollout_matches_the_numpy_oracle(q):
    profile = np.asarray(jaxroll.influence(model(q)))
    # float64 on both sides, T = 3 products of 24 x 24 and one root: 1e-12.
    np.testing.assert_allclose(profile, oracle_profile(q), atol=1e-12)
    assert abs(profile.sum() - 1.0) < 1e-12


def test_q_one_is_the_plain_rollout_on_every_kernel_kind():
    plain = model()
    extended = jaxroll.model.with_probability_path(plain, [0.2, 0.4, 0.1])
    dense = jaxroll.model.as_dense_model(plain)
    for base in (plain, extended, dense):
        composed = dataclasses.replace(base, composition=checked_composition(1.0))
        np.testing.assert_allclose(np.asarray(jaxroll.influence(composed)), np.asarray(jaxroll.influence(base)),
                                   atol=1e-12)
    # and q moves the profile: the test above cannot pass by ignoring it
    assert np.abs(np.asarray(jaxroll.influence(model(1.5))) - np.asarray(jaxroll.influence(plain))).max() > 1e-3


def test_one_layer_is_its_transitions_last_row_whatever_q():
    """A single layer's path from j to the output is one entry of R: (R_ij^q)^(1/q) = R_ij."""
    one = np.array([0.4])
    expected = oracle_transitions(one)[0][-1]
    for q in (1.0, 1.3, 2.0):
        np.testing.assert_allclose(np.asarray(jaxroll.influence(model(q, lambdas=one))), expected, atol=1e-12)


def test_the_rollout_matrix_and_rows_compose_the_same_way():
    q = 1.4
    matrix = np.asarray(jaxroll.rollout_matrix(model(q)))
    powered = np.eye(N)
    for transition in oracle_transitions():
        powered = np.abs(transition) ** q @ powered
    np.testing.assert_allclose(matrix, powered ** (1 / q), atol=1e-12)
    start = np.zeros(N)
    start[10] = 1.0
    np.testing.assert_allclose(np.asarray(jaxroll.rollout_row(model(q), jnp.asarray(start))), matrix[10],
                               atol=1e-12)


def test_gradients_in_q_and_lambda_match_central_differences():
    def middle(q, lambdas):
        composed = dataclasses.replace(model(1.0), composition=q, lambdas=lambdas)
        return jaxroll.metrics.middle_mass(jaxroll.influence(composed))

    q, lambdas = jnp.asarray(1.3), jnp.asarray(LAMBDAS)
    grad_q, grad_lambdas = jax.grad(middle, argnums=(0, 1))(q, lambdas)
    h = 1e-6
    # central differences of a smooth float64 function: error O(h^2) plus rounding ~1e-10.
    assert abs(float(grad_q) - (middle(q + h, lambdas) - middle(q - h, lambdas)) / (2 * h)) < 1e-7
    for t in range(len(LAMBDAS)):
        step = jnp.zeros(len(LAMBDAS)).at[t].set(h)
        expected = (middle(q, lambdas + step) - middle(q, lambdas - step)) / (2 * h)
        assert abs(float(grad_lambdas[t]) - float(expected)) < 1e-7
    assert np.all(np.isfinite(np.asarray(grad_lambdas)))  # the masked (zero) entries give no NaN


def test_a_sweep_of_a_composed_model_equals_its_points():
    base = model(1.3)
    result = jaxroll.sweep(base, lambdas=[[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]], progress=False)
    for row, lambdas in zip(np.asarray(result.profiles), ([0.1, 0.2, 0.3], [0.5, 0.5, 0.5])):
        np.testing.assert_allclose(row.reshape(-1), oracle_profile(1.3, np.array(lambdas)), atol=1e-12)


@pytest.mark.parametrize("value", [0.5, 2.5, float("nan"), float("inf"), [1.2, 1.3], True, "1.5"])
def test_bad_exponents_are_refused_in_one_line(value):
    with pytest.raises(ConfigError) as caught:
        model(value)
    message = str(caught.value)
    assert message.startswith("composition: ") and "\n" not in message


def test_the_structured_method_is_refused_and_auto_takes_the_dense_path():
    with pytest.raises(ConfigError, match=r"^method: got 'structured'; allowed: 'dense' or 'auto'"):
        jaxroll.influence(model(1.2), method="structured")
    np.testing.assert_allclose(np.asarray(jaxroll.influence(model(1.2), method="dense")),
                               np.asarray(jaxroll.influence(model(1.2))), atol=1e-15)


def test_the_yaml_round_trip_keeps_the_exponent(tmp_path):
    jaxroll.save_config(model(1.25), tmp_path / "c.yaml")
    text = (tmp_path / "c.yaml").read_text()
    assert "composition: 1.25" in text
    assert float(jaxroll.load_config(tmp_path / "c.yaml").composition) == 1.25
    jaxroll.save_config(model(), tmp_path / "plain.yaml")
    assert "composition" not in (tmp_path / "plain.yaml").read_text()
    (tmp_path / "bad.yaml").write_text(text.replace("composition: 1.25", "composition: 3"))
    with pytest.raises(ConfigError, match=r"bad.yaml: composition: got 3; allowed: a number in \[1, 2\]"):
        jaxroll.load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("truth", [1.0, 1.37, 1.9])
def test_the_fit_recovers_the_exponent_of_a_rollout_profile(truth):
    target = oracle_profile(truth)
    q, distance = fit_composition(model(), target)
    # Brent's tolerance is 1e-3 in q; the profile moves smoothly with q, so its error is of that order.
    assert abs(q - truth) < 3e-3
    assert distance < 1e-4
    if truth == 1.0:
        assert q == 1.0  # the plain rollout, exactly, so a measured config keeps the fast path


def test_the_fitted_exponent_is_no_worse_than_any_grid_point():
    rng = np.random.default_rng(0)
    target = oracle_profile(1.2) * rng.uniform(0.8, 1.2, N)  # a profile no q reproduces
    target /= target.sum()
    q, distance = fit_composition(model(), target)
    assert abs(distance - w1(oracle_profile(q), target)) < 1e-12
    assert all(distance <= w1(oracle_profile(grid), target) + 1e-12 for grid in np.linspace(1, 2, 41))


# ---------------------------------------------------------------- measured


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_a_measured_config_composes_with_the_fitted_exponent():
    from jaxroll.measure import measure

    torch.manual_seed(1)  # a tiny BLOOM whose best exponent is inside (1, 2] (1.05); seeds 0 and 2 give q = 1
    config = transformers.BloomConfig(n_layer=4, n_head=4, hidden_size=32, vocab_size=64)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    ids = np.random.default_rng(1).integers(0, 64, (4, 16))
    result = measure(hf, ids, stats=("lambda", "content", "influence"))
    composed = result.to_rollout_model()
    measured = np.asarray(result.influence, dtype=np.float64)
    plain = dataclasses.replace(composed, composition=None)
    assert composed.composition is not None
    q = float(composed.composition)
    assert 1.0 < q <= 2.0
    profile = lambda exponent: np.asarray(jaxroll.influence(  # noqa: E731
        dataclasses.replace(plain, composition=checked_composition(exponent))))
    # the config's exponent is no farther from the measured profile than q = 1 or any grid point
    assert all(w1(profile(q), measured) <= w1(profile(grid), measured) + 1e-12 for grid in np.linspace(1, 2, 11))


@pytest.mark.parametrize("q", [1.0, 1.5, 2.0])
def test_the_composition_test_adds_paths_in_the_same_q_norm(q):
    """validation/composition.py composes measured local norms with `compose_in_power`; on row-stochastic
    transitions its normalised row is this file's oracle (float64, three 24 x 24 products: 1e-12), and q = 1 is
    its plain product of norms."""
    from validation_scripts import load

    composition = load("composition")
    layers = np.stack(oracle_transitions())
    row = composition.compose_in_power(layers, q)
    np.testing.assert_allclose(row / row.sum(), oracle_profile(q), atol=1e-12)
    np.testing.assert_allclose(composition.compose_in_power(layers, 1.0), composition.compose_last_row(layers),
                               atol=1e-15)


@pytest.mark.parametrize("q", [1.0, 1.5, 2.0])
def test_the_diagonal_closed_form_and_so_the_collapse_theorem_hold_for_every_q(q):
    """Under a causal mask each R_t is lower triangular, so the powered product's diagonal is
    ``prod_t R_t[i, i]^q`` and its q-th root is the paper's ``P_T[i, i]``: the composed matrix keeps the closed-form
    diagonal (`jaxroll.theory.diagonal`), and with it the finite-mixing theorem. Oracle: the product of the NumPy
    transitions' diagonals (float64, three factors: 1e-12)."""
    from jaxroll.theory import diagonal

    expected = np.prod([np.diag(transition) for transition in oracle_transitions()], axis=0)
    matrix = np.asarray(jaxroll.rollout_matrix(model(q)))
    np.testing.assert_allclose(np.diag(matrix), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(diagonal(model(q))), expected, rtol=0, atol=1e-12)
