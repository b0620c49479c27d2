"""`RotaryRescale` and `SinkTokens` against a NumPy float64 oracle written here.

The oracle forms every head's scores from the definitions: a relative kernel
``s_{t,h}(i, j) = f_{t,h}(i - j)`` for i > j and ``d_{t,h}`` on the diagonal
(the power form ``f(x) = -m x^alpha``; a table read by `numpy.interp`, which
holds its end values), ALiBi + content for the sinks (Press et al. 2022). It
softmaxes the causal rows, mixes the heads, multiplies the transitions
``P_T = R_T ... R_1`` with ``R_t = (1 - lambda_t) I + lambda_t A_t``
(arXiv 2602.16837) as dense matrices and reads the last row. Profiles agree
to 1e-12 (float64), gradients with central differences of the oracle to 1e-7
relative (step 1e-5; truncation O(h^2), rounding ~1e-16 / h), identities
exactly.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import jaxroll
from jaxroll import interventions as iv

import oracle

T, H, N = 3, 4, 40
K = 50  # table offsets: more than N - 1, so ratios down to (N - 1) / K are defined
RNG = np.random.default_rng(47)
LAMBDAS = RNG.uniform(0.2, 0.9, T)
SLOPES = RNG.uniform(0.05, 0.6, (T, H))
ALPHA = RNG.uniform(0.4, 1.4, (T, H))
CONTENT = RNG.normal(0.0, 1.5, (T, H))
WEIGHTS = RNG.uniform(0.2, 1.0, (T, H))
TABLE = -np.cumsum(RNG.uniform(0.0, 0.4, (T, H, K)), axis=-1) + RNG.normal(0.0, 0.3, (T, H, K))
RATIO = RNG.uniform(1.1, 2.5, (T, H))


def _power_model(n=N):
    kernel = jaxroll.PowerKernel.create(num_layers=T, num_heads=H, slopes=SLOPES, exponents=ALPHA,
                                        diagonal_scores=CONTENT, head_weights=WEIGHTS)
    return jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=n)


def _table_model(n=N):
    kernel = jaxroll.TableKernel.create(num_layers=T, num_heads=H, offset_scores=TABLE, diagonal_scores=CONTENT,
                                        head_weights=WEIGHTS)
    return jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=n)


def _power_f(t, h, x):
    return -SLOPES[t, h] * x ** ALPHA[t, h]


def _table_f(t, h, x):
    return np.interp(x, np.arange(1.0, K + 1), TABLE[t, h])


def _kernels(scores, n):
    """Head-weighted causal softmax rows from ``scores(t, h) -> (n, n)``: ``(T, n, n)``."""
    return oracle.mixed_kernels(scores, WEIGHTS, n)


def _rollout_profile(kernels, lambdas=LAMBDAS):
    """Row n - 1 of ``P_T = R_T ... R_1``, normalised."""
    return oracle.last_row(kernels, lambdas)


def _relative_scores(f, n, ratio=None):
    """Scores of the relative kernel ``f`` at distances ``(i - j) / r_{t,h}``, content on the diagonal."""
    distance = (np.arange(n)[:, None] - np.arange(n)[None, :]).astype(float)

    def scores(t, h):
        r = 1.0 if ratio is None else np.broadcast_to(ratio, (T, H))[t, h]
        return np.where(distance == 0, CONTENT[t, h], f(t, h, np.maximum(distance, 1.0) / r))
    return scores


def _oracle(f, ratio, n=N):
    return _rollout_profile(_kernels(_relative_scores(f, n, ratio), n))


MODELS = {"power": (_power_model, _power_f), "table": (_table_model, _table_f)}
RATIOS = {"scalar": 1.7, "per head": RATIO[0], "per layer": RATIO[:, :1], "per layer and head": RATIO,
          "stretching": (N - 1) / K + 0.05}


@pytest.mark.parametrize("family", MODELS)
@pytest.mark.parametrize("shape", RATIOS)
def test_rotary_rescale_reads_the_kernel_at_distance_over_ratio(family, shape):
    build, f = MODELS[family]
    ratio = RATIOS[shape]
    changed = iv.RotaryRescale(ratio).apply(build())
    assert type(changed.kernel) is type(build().kernel)
    got = np.asarray(jaxroll.influence(changed))
    np.testing.assert_allclose(got, _oracle(f, np.asarray(ratio)), rtol=0, atol=1e-12)


def test_rotary_rescale_of_a_power_kernel_is_the_power_kernel_with_slopes_times_r_to_minus_alpha():
    changed = iv.RotaryRescale(RATIO).apply(_power_model()).kernel
    np.testing.assert_allclose(np.asarray(changed.slopes), SLOPES * RATIO ** -ALPHA, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(np.asarray(changed.exponents), ALPHA)
    np.testing.assert_array_equal(np.asarray(changed.diagonal_scores), CONTENT)


def test_the_table_is_interpolated_between_integer_distances_and_held_outside():
    table = jnp.array([[0.0, -1.0, -3.0, -6.0]])
    got = iv.table_at_distances(table, jnp.array([0.25, 1.0, 1.5, 2.75, 4.0, 9.0]))
    np.testing.assert_allclose(np.asarray(got), [[0.0, 0.0, -0.5, -2.5, -6.0, -6.0]], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(np.asarray(iv.table_at_distances(table, jnp.arange(1.0, 5.0))), table)


@pytest.mark.parametrize("family", MODELS)
def test_ratio_one_and_no_sinks_change_nothing_exactly(family):
    model = MODELS[family][0]()
    for identity in (iv.RotaryRescale(1.0), iv.RotaryRescale(np.ones((T, H))), iv.SinkTokens(0)):
        changed = identity.apply(model)
        assert changed.sequence_length == model.sequence_length
        for before, after in zip(jax.tree.leaves(model), jax.tree.leaves(changed)):
            np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
    profile = jaxroll.influence(model)
    mass, same = iv.SinkTokens(0).split(profile)
    assert float(mass) == 0.0
    np.testing.assert_array_equal(np.asarray(same), np.asarray(profile))


def _middle(p):
    edge = int(np.ceil(0.1 * p.size))
    return p[edge:p.size - edge].sum()


def _nearest_kink(ratio, n=N):
    """The distance from `ratio` to the nearest r where some k / r (k < n) is an integer: the table's kinks."""
    return min(abs(ratio - k / j) for k in range(1, n) for j in range(1, k + 1))


@pytest.mark.parametrize("family", MODELS)
def test_gradients_with_respect_to_the_ratio_match_central_differences(family):
    """d middle_mass / d r through `apply` and the rollout, a global ratio and a per-head direction."""
    build, f = MODELS[family]
    model, step = build(), 1e-5
    r0 = 1.37
    assert _nearest_kink(r0) > 10 * step  # the table's interpolation is smooth on the stencil
    middle = lambda r: jaxroll.metrics.middle_mass(jaxroll.influence(iv.RotaryRescale(r).apply(model)))  # noqa: E731
    got = float(jax.grad(middle)(jnp.asarray(r0)))
    expected = (_middle(_oracle(f, r0 + step)) - _middle(_oracle(f, r0 - step))) / (2 * step)
    assert abs(got - expected) <= 1e-7 * abs(expected), (got, expected)
    assert abs(expected) > 1e-4  # the ratio moves the middle: the comparison means something

    heads = np.array([1.23, 1.61, 1.94, 2.29])  # per head
    assert min(_nearest_kink(r) for r in heads) > 10 * step
    direction = np.array([0.3, -1.0, 0.5, 0.8])
    gradient = np.asarray(jax.grad(middle)(jnp.asarray(heads)))
    expected = (_middle(_oracle(f, heads + step * direction))
                - _middle(_oracle(f, heads - step * direction))) / (2 * step)
    assert abs(gradient @ direction - expected) <= 1e-7 * abs(expected), (gradient @ direction, expected)


@pytest.mark.parametrize("family", MODELS)
def test_rotary_rescale_vmaps_over_ratios(family):
    build, f = MODELS[family]
    model = build()
    ratios = jnp.array([1.0, 1.5, 2.5, 4.0])
    batched = jax.vmap(lambda r: jaxroll.influence(iv.RotaryRescale(r).apply(model)))(ratios)
    for row, r in zip(np.asarray(batched), (1.0, 1.5, 2.5, 4.0)):
        np.testing.assert_allclose(row, _oracle(f, r), rtol=0, atol=1e-12)


def test_ms_poe_ratios_are_their_linear_schedule_in_the_given_order():
    np.testing.assert_allclose(np.asarray(iv.ms_poe_ratios(4)), [1.2, 1.35, 1.5, 1.65], rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(iv.ms_poe_ratios(4, 1.0, 3.0, order=[2, 0, 3, 1])), [2.0, 1.0, 2.5, 1.5],
                               rtol=0, atol=1e-15)
    ratios = iv.ms_poe_ratios(H)
    got = np.asarray(jaxroll.influence(iv.RotaryRescale(ratios).apply(_table_model())))
    np.testing.assert_allclose(got, _oracle(_table_f, np.asarray(ratios)), rtol=0, atol=1e-12)


# Sinks: ALiBi + content (the kernel defined at every length), a table, and a measured dense kernel.

ALIBI_SLOPES = RNG.uniform(0.05, 0.6, (T, H))


def _alibi_model(n=N):
    return jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=LAMBDAS, alibi_slopes=ALIBI_SLOPES,
                                       diagonal_scores=CONTENT, head_weights=WEIGHTS, sequence_length=n)


def _alibi_scores(n, bias=None):
    distance = (np.arange(n)[:, None] - np.arange(n)[None, :]).astype(float)
    return lambda t, h: (-ALIBI_SLOPES[t, h] * distance + CONTENT[t, h] * np.eye(n)
                         + (0.0 if bias is None else bias(np.maximum(distance, 0.0))))


def _split_oracle(full, k):
    return full[:k].sum(), full[k:] / full[k:].sum()


@pytest.mark.parametrize("k", [1, 4, 9])
@pytest.mark.parametrize("family", ["alibi", "table"])
def test_sink_tokens_run_the_model_at_n_plus_k_and_split_off_the_sinks(family, k):
    model, scores = ((_alibi_model(), _alibi_scores(N + k)) if family == "alibi"
                     else (_table_model(), _relative_scores(_table_f, N + k)))
    sinks = iv.SinkTokens(k)
    changed = sinks.apply(model)
    assert changed.sequence_length == sinks.length(N) == N + k
    full = _rollout_profile(_kernels(scores, N + k))
    np.testing.assert_allclose(np.asarray(jaxroll.influence(changed)), full, rtol=0, atol=1e-12)
    mass, originals = sinks.split(jaxroll.influence(changed))
    expected_mass, expected = _split_oracle(full, k)
    assert originals.shape == (N,)
    assert abs(float(mass) - expected_mass) < 1e-12
    np.testing.assert_allclose(np.asarray(originals), expected, rtol=0, atol=1e-12)
    # The sinks take mass from the first tokens: the primacy end moves to them.
    baseline = np.asarray(jaxroll.influence(model))
    assert originals[0] < baseline[0]


def test_sink_tokens_on_a_measured_kernel_take_its_leading_block_and_split_batches():
    dense = _kernels(_alibi_scores(N), N)
    model = jaxroll.RolloutModel.create(kernel=jaxroll.DenseKernel.create(dense), lambdas=LAMBDAS,
                                        sequence_length=N - 6)
    changed = iv.SinkTokens(6).apply(model)
    full = _rollout_profile(dense)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(changed)), full, rtol=0, atol=1e-12)
    stacked = np.stack([full, full[::-1]])
    mass, originals = iv.SinkTokens(6).split(stacked)
    for row, (m, o) in enumerate(zip(np.asarray(mass), np.asarray(originals))):
        expected_mass, expected = _split_oracle(stacked[row], 6)
        assert abs(m - expected_mass) < 1e-15
        np.testing.assert_allclose(o, expected, rtol=0, atol=1e-15)
    with pytest.raises(jaxroll.ConfigError, match=r"^sinks: 7 sink tokens make the length 41; n: got 41; allowed: "
                                                  r"at most the dense kernels' N = 40 \(for n = 34: a baseline measured "
                                                  r"at N >= 41, then jaxroll rollout BASE/config\.yaml --length 34 "
                                                  r"--intervene sinks=7, or --length 33 or less with this one\)$"):
        iv.SinkTokens(7).apply(model)


def test_sinks_apply_first_so_kernel_changes_are_formed_at_n_plus_k():
    """``kappa=0.3,sinks=4`` (any order in the text): the distance bias is formed at N + 4, not N."""
    changed = iv.apply_all(_alibi_model(), iv.parse("kappa=0.3,sinks=4"))
    full = _rollout_profile(_kernels(_alibi_scores(N + 4, bias=lambda m: 0.3 * np.log1p(m)), N + 4))
    np.testing.assert_allclose(np.asarray(jaxroll.influence(changed)), full, rtol=0, atol=1e-12)


# Bad input: one line naming the field.

@pytest.mark.parametrize("build, message", [
    (lambda: iv.RotaryRescale(0.0), r"^rotary_ratio: value 0\.0 is outside the allowed range \(0, inf\)$"),
    (lambda: iv.RotaryRescale([1.5, -2.0]), r"^rotary_ratio: value -2\.0 at index 1 is outside the allowed range"),
    (lambda: iv.RotaryRescale(float("nan")), r"^rotary_ratio: .*not finite"),
    (lambda: iv.RotaryRescale(np.ones(5)).apply(_table_model()),
     r"^rotary_ratio: inner list length 5; allowed: 1 or num_heads \(4\)$"),
    (lambda: iv.RotaryRescale(2.0).apply(_alibi_model()),
     r"^rotary_ratio: a rotary rescale on an ALiBi model; allowed: a rotary model's measured offset kernel "
     r"\(PowerKernel or TableKernel\)$"),
    (lambda: iv.RotaryRescale(2.0).apply(jaxroll.RolloutModel.create(
        kernel=jaxroll.DenseKernel.create(_kernels(_alibi_scores(8), 8)), lambdas=LAMBDAS)),
     r"^rotary_ratio: a DenseKernel is not a function of distance; allowed: a rotary model's"),
    (lambda: iv.RotaryRescale(0.5).apply(_table_model()),
     r"^rotary_ratio: ratio 0\.5 reads distance \(n - 1\) / r = 78 at length 40, beyond the table's 50 offsets; "
     r"allowed: ratio >= 0\.78 here$"),
    (lambda: iv.SinkTokens(2.5), r"^sinks: got 2\.5; allowed: an integer >= 0$"),
    (lambda: iv.SinkTokens(-1), r"^sinks: got -1; allowed: an integer >= 0$"),
    (lambda: iv.SinkTokens(True), r"^sinks: got True; allowed: an integer >= 0$"),
    (lambda: iv.SinkTokens("4"), r"^sinks: got '4'; allowed: an integer >= 0$"),
    (lambda: iv.SinkTokens(3).split(np.ones(3) / 3), r"^profile: got shape \(3,\); allowed: a last axis longer"),
    (lambda: iv.ms_poe_ratios(4, order=[0, 1, 1, 3]), r"^order: got \[0, 1, 1, 3\]; allowed: a permutation of 0\.\.3$"),
    (lambda: iv.ms_poe_ratios(4, 1.8, 1.2), r"^high: value 1\.2 is outside the allowed range \[1\.8, inf\)$"),
    (lambda: iv.parse("sinks=2.5"), r"^sinks: got 2\.5; allowed: an integer >= 0$"),
    (lambda: iv.parse("sinks=-3"), r"^sinks: got -3; allowed: an integer >= 0$"),
    (lambda: iv.parse("rotary_ratio=-2"), r"^rotary_ratio: value -2\.0 is outside the allowed range \(0, inf\)$"),
    (lambda: iv.parse("rotary_ratio=x"), r"^--intervene rotary_ratio: got 'x'; allowed: a number$"),
    (lambda: iv.from_mapping({"sinks": [1, 2]}), r"^sinks: got \[1, 2\]; allowed: an integer >= 0$"),
])
def test_bad_input_is_one_line_naming_the_field(build, message):
    with pytest.raises(jaxroll.ConfigError, match=message) as error:
        build()
    assert "\n" not in str(error.value)


def test_text_specifications_order_round_trip_and_read_yaml(tmp_path):
    parsed = iv.parse("gamma=0.5,rotary_ratio=2,tau=0.7,sinks=3")
    assert [type(x).__name__ for x in parsed] == ["SinkTokens", "RotaryRescale", "Temperature", "BranchScale"]
    record = iv.describe(parsed)
    assert record == {"sinks": 3, "rotary_ratio": 2.0, "tau": 0.7, "gamma": 0.5}
    assert list(iv.NAMES[:2]) == ["sinks", "rotary_ratio"]
    model = _power_model()
    again = iv.from_mapping(yaml.safe_load(yaml.safe_dump(record)))
    np.testing.assert_array_equal(np.asarray(jaxroll.influence(iv.apply_all(model, again))),
                                  np.asarray(jaxroll.influence(iv.apply_all(model, parsed))))
    path = tmp_path / "change.yaml"
    path.write_text(f"rotary_ratio: {RATIO[0].tolist()}\nsinks: 2\n")
    from_file = iv.parse(str(path))
    assert iv.describe(from_file) == {"sinks": 2, "rotary_ratio": RATIO[0].tolist()}
    got = np.asarray(jaxroll.influence(iv.apply_all(_table_model(), from_file)))
    mass, originals = from_file[0].split(got)
    expected = _rollout_profile(_kernels(_relative_scores(_table_f, N + 2, RATIO[0]), N + 2))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(originals), _split_oracle(expected, 2)[1], rtol=0, atol=1e-12)


# The command line.

def _rotary_config(tmp_path, family):
    section = {"kernel_type": "relative", "family": family, "num_heads": H, "diagonal_scores": CONTENT.tolist(),
               "head_weights": WEIGHTS.tolist()}
    if family == "power":
        section |= {"slopes": SLOPES.tolist(), "exponents": ALPHA.tolist()}
    else:
        section["offset_scores"] = TABLE.tolist()
    config = {"sequence_length": N, "num_layers": T, "kernel_config": section,
              "lambda_schedule_config": {"schedule_type": "custom", "lambdas_custom": LAMBDAS.tolist()}}
    path = tmp_path / f"{family}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("family", ["power", "table"])
def test_rollout_intervene_rotary_ratio_on_a_rotary_config(family, tmp_path, capsys):
    from jaxroll.cli import main

    path, out = _rotary_config(tmp_path, family), tmp_path / "out"
    assert main(["rollout", str(path), "--intervene", "rotary_ratio=2", "--out", str(out), "--no-figure"]) == 0
    assert "intervened: rotary_ratio=2.0" in capsys.readouterr().out
    expected = _oracle(MODELS[family][1], 2.0)
    np.testing.assert_allclose(jaxroll.read_profile(out / "profile.csv"), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(jaxroll.load_config(out / "config.yaml"))), expected,
                               rtol=0, atol=1e-12)
    assert yaml.safe_load((out / "interventions.yaml").read_text()) == {"rotary_ratio": 2.0}


def test_rollout_intervene_sinks_writes_the_original_positions_and_the_sink_mass(tmp_path, capsys):
    from jaxroll.cli import main

    path, out = _rotary_config(tmp_path, "power"), tmp_path / "out"
    assert main(["rollout", str(path), "--intervene", "sinks=4", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    full = _rollout_profile(_kernels(_relative_scores(_power_f, N + 4), N + 4))
    mass, expected = _split_oracle(full, 4)
    profile = jaxroll.read_profile(out / "profile.csv")
    assert profile.shape == (N,)
    np.testing.assert_allclose(profile, expected, rtol=0, atol=1e-12)
    record = yaml.safe_load((out / "sinks.yaml").read_text())
    assert record["sinks"] == 4 and record["length_with_sinks"] == N + 4
    assert abs(record["sink_mass"] - mass) < 1e-12
    assert f"sinks: 4 tokens in front (the model runs at N = {N + 4}); their mass = {mass:.6g}" in stdout
    assert f"N = {N}, T = {T}" in stdout and (out / "profile.png").is_file()
    # config.yaml is the changed model: the same kernel at N + 4, whose profile splits as above.
    np.testing.assert_allclose(np.asarray(jaxroll.influence(jaxroll.load_config(out / "config.yaml"))), full,
                               rtol=0, atol=1e-12)


def test_rollout_refuses_a_rotary_rescale_of_an_alibi_model_before_writing(tmp_path, capsys):
    from jaxroll.cli import main

    out = tmp_path / "out"
    assert main(["rollout", "--published", "mpt-7b", "--intervene", "rotary_ratio=2", "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    assert "rotary_ratio: a rotary rescale on an ALiBi model" in stderr and stderr.count("\n") == 1
    assert not out.exists()


def test_sink_tokens_is_a_static_count_and_leaves_the_model_arrays_alone():
    model = _power_model()
    changed = iv.SinkTokens(5).apply(model)
    assert changed.sequence_length == N + 5
    for before, after in zip(jax.tree.leaves(model), jax.tree.leaves(changed), strict=True):
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
    assert jax.tree.leaves(iv.SinkTokens(5)) == []
