"""Interventions' rollout transforms against a NumPy float64 oracle written here.

The oracle forms every head's logits ``s_{t,h}(i, j)`` densely from the
definitions (ALiBi + content, Press et al. 2022 and arXiv 2602.16837; the power
kernel ``-m k^alpha``), applies the intervention to the logits (or, for the
measured-kernel and mixing transforms, to what their docstrings state),
softmaxes the causal rows, mixes the heads and multiplies the transitions
``R_t = (1 - lambda_t) I + lambda_t A_t``. Profiles agree to 1e-12 (float64;
sums of at most a few hundred positive terms, FFT paths included), gradients
with central differences of the oracle to 1e-7 (step 1e-5: truncation
O(h^2) ~ 1e-10 times the third derivative, rounding ~1e-16 / h).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import jaxroll
from jaxroll import interventions as iv

import oracle

T, H, N = 3, 4, 40
RNG = np.random.default_rng(11)
LAMBDAS = RNG.uniform(0.2, 0.9, T)
SLOPES = RNG.uniform(0.05, 0.6, (T, H))
CONTENT = RNG.normal(0.0, 1.5, (T, H))
BASE = RNG.normal(0.0, 1.0, (T, H))
WEIGHTS = RNG.uniform(0.2, 1.0, (T, H))
TAU0 = 0.8


def _alibi_model(lambdas=LAMBDAS):
    return jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=lambdas, alibi_slopes=SLOPES,
                                       diagonal_scores=CONTENT, base_scores=BASE, head_weights=WEIGHTS,
                                       temperature=TAU0, sequence_length=N)


def _alibi_logits(t, h, slopes=SLOPES, content=CONTENT):
    offsets = (np.arange(N)[:, None] - np.arange(N)[None, :]).astype(float)
    return (-slopes[t, h] * offsets + content[t, h] * np.eye(N) + BASE[t, h]) / TAU0


def _profile(kernels, lambdas=LAMBDAS):
    """Last row of ``R_T ... R_1`` from dense layer kernels ``(T, N, N)``, normalised."""
    return oracle.last_row(kernels, lambdas)


def _mixed(logits_of):
    """Layer kernels from per-head logits, head-weighted."""
    return oracle.mixed_kernels(logits_of, WEIGHTS, N)


def _distance():
    return np.maximum(np.arange(N)[:, None] - np.arange(N)[None, :], 0).astype(float)


def _unsquash(m, k):
    return gammaln(m + 1 / k) - gammaln(m + 1) - gammaln(1 / k)


TAU = RNG.uniform(0.5, 2.0, (T, H))
SCALE = RNG.uniform(0.3, 3.0, (T, H))
KAPPA = RNG.normal(0.0, 0.7, (T, H))

CASES = {
    "temperature": (iv.Temperature(TAU), lambda t, h: _alibi_logits(t, h) / TAU[t, h]),
    "temperature per layer": (iv.Temperature(TAU[:, :1]), lambda t, h: _alibi_logits(t, h) / TAU[t, 0]),
    "slope scale": (iv.SlopeScale(SCALE), lambda t, h: _alibi_logits(t, h, slopes=SLOPES * SCALE)),
    "slope scale per head": (iv.SlopeScale(SCALE[0]), lambda t, h: _alibi_logits(t, h, slopes=SLOPES * SCALE[0])),
    "ssmax": (iv.LengthScaledLogits(SCALE), lambda t, h: _alibi_logits(t, h) * SCALE[t, h] * np.log(np.arange(N) + 1.0)[:, None]),
    "distance bias log1p": (iv.DistanceBias(KAPPA), lambda t, h: _alibi_logits(t, h) + KAPPA[t, h] * np.log1p(_distance())),
    "distance bias unsquash k=3": (iv.DistanceBias(KAPPA, "unsquash", k=3.0),
                                   lambda t, h: _alibi_logits(t, h) + KAPPA[t, h] * _unsquash(_distance(), 3.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_logit_interventions_on_alibi_are_exact(name):
    intervention, logits = CASES[name]
    got = np.asarray(jaxroll.influence(intervention.apply(_alibi_model())))
    np.testing.assert_allclose(got, _profile(_mixed(logits)), rtol=0, atol=1e-12)
    assert abs(got.sum() - 1.0) < 1e-12


def test_logit_interventions_on_a_power_kernel_are_exact():
    alpha = RNG.uniform(0.5, 1.5, (T, H))
    kernel = jaxroll.PowerKernel.create(num_layers=T, num_heads=H, slopes=SLOPES, exponents=alpha,
                                        diagonal_scores=CONTENT, head_weights=WEIGHTS)
    model = jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=N)

    def logits(t, h, slopes=SLOPES):
        k = _distance()
        return np.where(k == 0, CONTENT[t, h], -slopes[t, h] * k ** alpha[t, h])

    for intervention, changed in ((iv.Temperature(TAU), lambda t, h: logits(t, h) / TAU[t, h]),
                                  (iv.SlopeScale(SCALE), lambda t, h: logits(t, h, SLOPES * SCALE)),
                                  (iv.DistanceBias(KAPPA), lambda t, h: logits(t, h) + KAPPA[t, h] * np.log1p(_distance())),
                                  (iv.LengthScaledLogits(SCALE),
                                   lambda t, h: logits(t, h) * SCALE[t, h] * np.log(np.arange(N) + 1.0)[:, None])):
        got = np.asarray(jaxroll.influence(intervention.apply(model)))
        np.testing.assert_allclose(got, _profile(_mixed(changed)), rtol=0, atol=1e-12)


def test_measured_kernels_are_tempered_and_reweighted_as_stated():
    """On a `DenseKernel` the transforms are the stated approximations: ``A^(1/tau)`` and
    ``A e^(kappa g)``, each renormalised per row (per layer parameters)."""
    kernels = _mixed(_alibi_logits)
    model = jaxroll.RolloutModel.create(kernel=jaxroll.DenseKernel.create(kernels), lambdas=LAMBDAS)
    tau, kappa = TAU[:, 0], KAPPA[:, 0]
    tempered = kernels ** (1 / tau[:, None, None])
    tempered /= tempered.sum(axis=2, keepdims=True)
    biased = kernels * np.exp(kappa[:, None, None] * np.log1p(_distance()))
    biased /= biased.sum(axis=2, keepdims=True)
    for intervention, expected in ((iv.Temperature(tau), tempered), (iv.DistanceBias(kappa[:, None]), biased)):
        got = np.asarray(jaxroll.influence(intervention.apply(model)))
        np.testing.assert_allclose(got, _profile(expected), rtol=0, atol=1e-12)
    with pytest.raises(jaxroll.ConfigError, match=r"^tau: got shape \(3, 4\); allowed for a measured DenseKernel"):
        iv.Temperature(TAU).apply(model)
    with pytest.raises(jaxroll.ConfigError, match=r"^ssmax_scale: a DenseKernel has no logits to scale"):
        iv.LengthScaledLogits(0.5).apply(model)


def test_branch_scale_moves_lambda_by_the_first_order_formula():
    gamma = np.array([0.5, 2.0, 0.0])
    expected = gamma * LAMBDAS / (gamma * LAMBDAS + 1 - LAMBDAS)
    changed = iv.BranchScale(gamma).apply(_alibi_model())
    np.testing.assert_allclose(np.asarray(changed.lambdas), expected, rtol=0, atol=1e-15)
    got = np.asarray(jaxroll.influence(changed))
    np.testing.assert_allclose(got, _profile(_mixed(_alibi_logits), expected), rtol=0, atol=1e-12)
    removed = iv.BranchScale(0.0).apply(_alibi_model(lambdas=np.ones(T)))  # 0 / 0: no mixing, not NaN
    np.testing.assert_array_equal(np.asarray(removed.lambdas), np.zeros(T))


@pytest.mark.parametrize("identity", [iv.Temperature(1.0), iv.SlopeScale(1.0), iv.BranchScale(1.0),
                                      iv.DistanceBias(0.0), iv.DistanceBias(0.0, "unsquash")],
                         ids=["tau=1", "s=1", "gamma=1", "kappa=0", "kappa=0 unsquash"])
def test_the_identity_intervention_changes_nothing(identity):
    model = _alibi_model()
    np.testing.assert_allclose(np.asarray(jaxroll.influence(identity.apply(model))),
                               np.asarray(jaxroll.influence(model)), rtol=0, atol=1e-13)


def test_several_interventions_apply_in_order():
    both = iv.apply_all(_alibi_model(), [iv.SlopeScale(SCALE), iv.Temperature(TAU)])
    expected = _profile(_mixed(lambda t, h: _alibi_logits(t, h, slopes=SLOPES * SCALE) / TAU[t, h]))
    np.testing.assert_allclose(np.asarray(jaxroll.influence(both)), expected, rtol=0, atol=1e-12)


GRADIENT_CASES = {
    "ssmax scale": (lambda x: iv.LengthScaledLogits(x), 0.8,
                    lambda x: _mixed(lambda t, h: _alibi_logits(t, h) * x * np.log(np.arange(N) + 1.0)[:, None]),
                    LAMBDAS),
    "tau": (lambda x: iv.Temperature(x), 1.3,
            lambda x: _mixed(lambda t, h: _alibi_logits(t, h) / x), LAMBDAS),
    "slope scale": (lambda x: iv.SlopeScale(x), 1.7,
                    lambda x: _mixed(lambda t, h: _alibi_logits(t, h, slopes=SLOPES * x)), LAMBDAS),
    "kappa": (lambda x: iv.DistanceBias(x), 0.4,
              lambda x: _mixed(lambda t, h: _alibi_logits(t, h) + x * np.log1p(_distance())), LAMBDAS),
}


@pytest.mark.parametrize("name", [*GRADIENT_CASES, "gamma"])
def test_gradients_of_the_middle_mass_match_central_differences(name):
    """d middle_mass / d parameter by `jax.grad` through ``apply`` and the rollout, against the oracle."""
    def middle(p):
        edge = int(np.ceil(0.1 * N))
        return p[edge:N - edge].sum()

    if name == "gamma":
        build, x0 = (lambda x: iv.BranchScale(x)), 0.6

        def oracle(x):
            lambdas = x * LAMBDAS / (x * LAMBDAS + 1 - LAMBDAS)
            return middle(_profile(_mixed(_alibi_logits), lambdas))
    else:
        build, x0, kernels_of, lambdas = GRADIENT_CASES[name]

        def oracle(x):
            return middle(_profile(kernels_of(x), lambdas))

    model = _alibi_model()
    got = jax.grad(lambda x: jaxroll.metrics.middle_mass(jaxroll.influence(build(x).apply(model))))(jnp.asarray(x0))
    step = 1e-5
    expected = (oracle(x0 + step) - oracle(x0 - step)) / (2 * step)
    assert abs(float(got) - expected) < 1e-7, (float(got), expected)
    assert abs(float(jaxroll.metrics.middle_mass(jaxroll.influence(build(x0).apply(model)))) - oracle(x0)) < 1e-12


def test_interventions_vmap_over_their_parameters():
    model = _alibi_model()
    taus = jnp.array([0.5, 1.0, 2.0])
    batched = jax.vmap(lambda tau: jaxroll.influence(iv.Temperature(tau).apply(model)))(taus)
    for k, tau in enumerate((0.5, 1.0, 2.0)):
        np.testing.assert_allclose(np.asarray(batched[k]), _profile(_mixed(lambda t, h: _alibi_logits(t, h) / tau)),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("build, message", [
    (lambda: iv.Temperature(0.0), r"^tau: value 0\.0 is outside the allowed range \(0, inf\)"),
    (lambda: iv.Temperature(float("nan")), r"^tau: .*not finite"),
    (lambda: iv.BranchScale(-0.5), r"^gamma: value -0\.5 is outside the allowed range \[0, inf\)"),
    (lambda: iv.SlopeScale([[[1.0]]]), r"^slope_scale: got shape \(1, 1, 1\); allowed: a number"),
    (lambda: iv.DistanceBias(0.1, "cubic"), r"^form: got 'cubic'; allowed: one of log1p, unsquash$"),
    (lambda: iv.LengthScaledLogits(0.0), r"^ssmax_scale: value 0\.0 is outside the allowed range \(0, inf\)"),
    (lambda: iv.DistanceBias(0.1, "unsquash", k=0), r"^k: got 0; allowed: a number > 0$"),
])
def test_bad_parameters_are_one_line(build, message):
    with pytest.raises(jaxroll.ConfigError, match=message) as error:
        build()
    assert "\n" not in str(error.value)


def test_a_slope_scale_on_a_model_without_slopes_is_refused():
    table = jaxroll.TableKernel.create(num_layers=T, num_heads=1, offset_scores=-np.arange(1.0, N))
    model = jaxroll.RolloutModel.create(kernel=table, lambdas=0.5, sequence_length=N)
    with pytest.raises(jaxroll.ConfigError, match=r"^slope_scale: a TableKernel has no ALiBi slopes; allowed: "):
        iv.SlopeScale(2.0).apply(model)
    with pytest.raises(jaxroll.ConfigError, match=r"^slope_scale: outer list length 2; allowed: 1 or num_layers"):
        iv.SlopeScale(np.ones((2, 4))).apply(_alibi_model())
    sliding = dataclasses.replace(_alibi_model(), mask="sliding", window=8)
    with pytest.raises(jaxroll.ConfigError, match=r"^kappa: a distance bias on a 'sliding' mask"):
        iv.DistanceBias(0.1).apply(sliding)


def test_text_specifications_parse_in_a_fixed_order_and_round_trip(tmp_path):
    parsed = iv.parse("gamma=0.5, tau=0.7,kappa=-0.2,kappa_form=unsquash,kappa_k=3")
    assert [type(x).__name__ for x in parsed] == ["Temperature", "DistanceBias", "BranchScale"]
    record = iv.describe(parsed)
    assert record == {"tau": 0.7, "kappa": -0.2, "kappa_form": "unsquash", "kappa_k": 3.0, "gamma": 0.5}
    again = iv.from_mapping(record)
    model = _alibi_model()
    np.testing.assert_array_equal(np.asarray(jaxroll.influence(iv.apply_all(model, again))),
                                  np.asarray(jaxroll.influence(iv.apply_all(model, parsed))))
    path = tmp_path / "change.yaml"
    path.write_text("tau: [[0.5, 1.0, 1.5, 2.0]]\nslope_scale: 0.5\n")
    from_file = iv.parse(str(path))
    expected = _profile(_mixed(lambda t, h: _alibi_logits(t, h, slopes=SLOPES * 0.5) / [0.5, 1.0, 1.5, 2.0][h]))
    np.testing.assert_allclose(np.asarray(jaxroll.influence(iv.apply_all(model, from_file))), expected, rtol=0,
                               atol=1e-12)


@pytest.mark.parametrize("text, message", [
    ("temp=0.7", r"^--intervene temp: unknown intervention; allowed: one of sinks, rotary_ratio, tau, slope_scale, "),
    ("tau", r"^--intervene: got 'tau'; allowed: NAME=VALUE with NAME one of "),
    ("tau=abc", r"^--intervene tau: got 'abc'; allowed: a number$"),
    ("tau=inf", r"^--intervene tau: got 'inf'; allowed: a finite number$"),
    ("tau=0.5,tau=2", r"^--intervene tau: given twice; allowed: each name once$"),
    ("tau=-1", r"^tau: value -1\.0 is outside the allowed range \(0, inf\)"),
    ("kappa_form=unsquash", r"^--intervene kappa_form/kappa_k: .* allowed only with kappa$"),
    (",", r"^--intervene: got ','; allowed: NAME=VALUE"),
])
def test_bad_specifications_are_one_line(text, message):
    with pytest.raises(jaxroll.ConfigError, match=message) as error:
        iv.parse(text)
    assert "\n" not in str(error.value)


def test_a_bad_yaml_file_of_interventions_is_one_line_naming_it(tmp_path):
    for content, message in (("[1, 2]", "got a list"), ("tau: [0.5\n", "not valid YAML"),
                             ("kappa: 0.1\nkappa_k: two\n", "kappa_k: got 'two'")):
        path = tmp_path / "change.yaml"
        path.write_text(content)
        with pytest.raises(jaxroll.ConfigError, match=message) as error:
            iv.parse(str(path))
        assert "\n" not in str(error.value)
    with pytest.raises(jaxroll.ConfigError, match=r"missing\.yaml: no such file"):
        iv.parse(str(tmp_path / "missing.yaml"))


def test_rollout_intervene_writes_the_changed_model_and_the_record(tmp_path, capsys):
    """`jaxroll rollout --intervene`: profile.csv is the changed model's profile, config.yaml the changed
    model (read back: the same profile), interventions.yaml the record; a bad change creates nothing."""
    import yaml

    from jaxroll.cli import main

    out = tmp_path / "out"
    assert main(["rollout", "--published", "mpt-7b", "--intervene", "kappa=0.3,gamma=0.5", "--out", str(out),
                 "--no-figure"]) == 0
    assert "intervened: kappa=0.3, kappa_form=log1p, kappa_k=2.0, gamma=0.5" in capsys.readouterr().out
    changed = iv.apply_all(jaxroll.published.load("mpt-7b"), [iv.DistanceBias(0.3), iv.BranchScale(0.5)])
    expected = np.asarray(jaxroll.influence(changed))
    np.testing.assert_allclose(jaxroll.read_profile(out / "profile.csv"), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(jaxroll.load_config(out / "config.yaml"))), expected,
                               rtol=0, atol=1e-12)
    assert yaml.safe_load((out / "interventions.yaml").read_text())["gamma"] == 0.5
    bad = tmp_path / "bad"
    assert main(["rollout", "--published", "mpt-7b", "--intervene", "slope_scale=-1", "--out", str(bad)]) == 2
    assert "slope_scale: value -1.0 is outside the allowed range" in capsys.readouterr().err and not bad.exists()
