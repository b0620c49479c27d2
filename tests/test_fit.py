"""Tests of `jaxroll.fit`: recovery of known parameters, gradients against
finite differences of the NumPy oracle, the paper's variant ordering on the
five reference models, and one-line errors.

Oracles: `tests/oracle.py` (plain NumPy float64 rollout) and NumPy
re-implementations, written here, of the parametrisations (sigmoid,
softplus, softmax) and of the normalised W1. Nothing is compared with a value
that jaxroll computed itself, except where a property is checked (a fit never
ends above its start, a saved model reads back the same).

Cost: every fit here runs at n = 64 or less. Under a causal mask the first n
rows of P at any length are exactly P at length n (docs/design.md, "Lengths,
buckets and compilation"), so a profile at n = 64 is a legitimate target for
the same model; the dense path costs
O(T H n^2) per evaluation and BLOOM-176B (T = 70, H = 112) at n = 256 takes
~1 s per gradient, at n = 64 ~0.05 s.
"""

import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import jaxroll
from jaxroll import schedules
from jaxroll.errors import ConfigError
from jaxroll.fitting import BOX, GLOBAL_POINTS, halton, identifiability, objective

sys.path.insert(0, str(Path(__file__).parent))
import oracle  # noqa: E402
from conftest import REFERENCE_CONFIGS  # noqa: E402

N = 64
ALIBI = REFERENCE_CONFIGS / "rollout" / "alibi"
ALL_FIELDS = ("lambdas", "diagonal_scores", "alibi_slopes", "head_weights", "temperature")
MODELS = ["bloom", "bloom-7b1", "mpt-7b", "mpt-30b", "falcon-rw-7b"]


# -- independent helpers ------------------------------------------------------


def w1(p, q):
    """Normalised W1 in plain NumPy: sum_j |F_p(j) - F_q(j)| / (n - 1)."""
    return float(np.abs(np.cumsum(np.asarray(p) - np.asarray(q))[:-1]).sum() / (len(p) - 1))


def arrays_of(model):
    """A RolloutModel as the oracle's dict of (T,), (T, H) float64 arrays."""
    return {
        "lambdas": np.asarray(model.lambdas, dtype=np.float64),
        "slopes": np.asarray(model.alibi_slopes, dtype=np.float64),
        "diagonal": np.asarray(model.diagonal_scores, dtype=np.float64),
        "base": np.asarray(model.base_scores, dtype=np.float64),
        "weights": np.asarray(model.head_weights, dtype=np.float64),
        "temperature": float(model.temperature),
        "mask": model.mask,
        "window": model.window,
    }


def cdf_jacobian(profile_of, theta, h=1e-6):
    """d F / d theta by central differences of the oracle, F = cumsum(p)[:-1].

    h = 1e-6: truncation error O(h^2) = 1e-12, rounding ~1e-16 / h = 1e-10.
    """
    columns = []
    for k in range(theta.size):
        step = np.zeros_like(theta)
        step[k] = h
        columns.append((np.cumsum(profile_of(theta + step))[:-1]
                        - np.cumsum(profile_of(theta - step))[:-1]) / (2 * h))
    return np.stack(columns, axis=1)


def check_identified_directions(jacobian, error, distance, n, *, resolution):
    """Check the parameter error along the directions the profile determines.

    Linearised, ``F_fit - F_true = J delta``, and the normalised W1 is
    ``||F_fit - F_true||_1 / (n - 1) >= ||J delta||_2 / (n - 1)``. With
    ``J = U S V^T`` this bounds ``|v_k . delta| <= (n - 1) W1 / s_k`` for every
    right singular vector v_k. Directions whose bound is finer than
    `resolution` are identifiable at this W1; those are checked, with a factor
    2 for the second-order terms. Returns how many directions were checked.
    """
    _, singular, right = np.linalg.svd(jacobian, full_matrices=False)
    bounds = (n - 1) * distance / singular
    checked = bounds < resolution
    assert checked.any(), f"no direction identifiable: singular values {singular}"
    along = np.abs(right @ error)
    assert np.all(along[checked] <= 2 * bounds[checked] + 1e-9), (along[checked], bounds[checked])
    return int(checked.sum())


# -- recovery -----------------------------------------------------------------


def test_recovers_power_decay_on_mpt7b_geometry():
    """lambda_0 = 0.35, beta = 1.3 on MPT-7B's geometry (T = 32, H = 32, standard
    ALiBi slopes, no content), fitted from (0.6, 0.7).

    Both parameters are identifiable: the CDF Jacobian (oracle, finite
    differences) has singular values ~5.4 and ~0.08, so W1 < 1e-4 pins the
    weak direction to (n - 1) W1 / 0.08 < 0.08 and, observed, W1 ~ 1e-5 to
    ~1e-2; both parameters are checked through that bound and directly to 5e-3.
    """
    T, H = 32, 32
    truth = jaxroll.RolloutModel.create(num_layers=T, num_heads=H,
                                        lambdas=schedules.power_decay(0.35, 1.3, T))
    target = oracle.influence(arrays_of(truth), N)
    start = jaxroll.RolloutModel.create(num_layers=T, num_heads=H,
                                        lambdas=schedules.power_decay(0.6, 0.7, T))
    result = jaxroll.fit(start, target, schedule="power_decay", steps=600, n=N)

    fitted = result.schedule_parameters
    distance = w1(oracle.influence(arrays_of(result.model), N), target)
    assert distance < 1e-4
    assert abs(fitted["lambda_0"] - 0.35) < 5e-3 and abs(fitted["beta"] - 1.3) < 5e-3
    # The schedule written into the model is the power decay it reports.
    t = np.arange(T)
    np.testing.assert_allclose(result.model.lambdas, fitted["lambda_0"] / (t + 1) ** fitted["beta"],
                               rtol=1e-12)

    def profile_of(theta):
        arrays = arrays_of(truth)
        arrays["lambdas"] = theta[0] / (t + 1.0) ** theta[1]
        return oracle.influence(arrays, N)

    jacobian = cdf_jacobian(profile_of, np.array([0.35, 1.3]))
    error = np.array([fitted["lambda_0"] - 0.35, fitted["beta"] - 1.3])
    assert check_identified_directions(jacobian, error, distance, N, resolution=0.1) == 2


CONTENT = np.array([2.0, -1.5, 1.0, 3.0, -2.0, 0.5, 1.5, -1.0, 2.5, -0.5, 1.0, 0.0])


def test_recovers_per_layer_content_on_12_layers():
    """Per-layer diagonal content d_t (one per layer, shared by 8 heads) on a
    12-layer model with lambda = 0.6, fitted from d_t + 0.5 (+-, alternating).

    Per-layer content is not globally identifiable from one profile: the CDF
    Jacobian's singular values fall from 0.14 to 1e-8, and fits started from
    d = 0 reach W1 ~ 1e-5 several logits away from the truth, along the near
    null directions. Locally (a start within the linear regime, as here) the
    directions whose bound (n - 1) W1 / s_k is below 0.5 logit are pinned:
    the test checks those, and W1 < 1e-4.
    """
    T, H = 12, 8
    truth = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=0.6,
                                        diagonal_scores=CONTENT[:, None])
    target = oracle.influence(arrays_of(truth), N)
    shifted = CONTENT + 0.5 * (-1.0) ** np.arange(T)
    start = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=0.6,
                                        diagonal_scores=shifted[:, None])
    result = jaxroll.fit(start, target, fit=("diagonal_scores",), steps=1500, n=N)

    fitted = result.model.diagonal_scores
    np.testing.assert_array_equal(fitted, fitted[:, :1].repeat(H, axis=1))  # per layer
    distance = w1(oracle.influence(arrays_of(result.model), N), target)
    assert distance < 1e-4

    def profile_of(theta):
        arrays = arrays_of(truth)
        arrays["diagonal"] = np.repeat(theta[:, None], H, axis=1)
        return oracle.influence(arrays, N)

    # Only the best-determined combination v_1 . d is checked. Its linear
    # bound (n - 1) W1 / s_1 is ~0.005, but the errors left along the
    # unpinned directions (up to ~0.7 logit) couple into it at second order,
    # so the tolerance is 0.15 logit (observed 0.06), against 1.9 for the
    # start. A failure of the fit shows as W1 above 1e-4 first.
    jacobian = cdf_jacobian(profile_of, CONTENT)
    first = np.linalg.svd(jacobian, full_matrices=False)[2][0]
    assert abs(first @ (fitted[:, 0] - CONTENT)) < 0.15


LAMBDAS = np.array([0.9, 0.7, 0.5, 0.6, 0.3, 0.4, 0.2, 0.35, 0.15, 0.25, 0.1, 0.2, 0.05, 0.15, 0.1, 0.05])


def test_recovers_free_schedule_on_16_layers():
    """A free 16-layer schedule, fitted from lambda = 0.3 everywhere.

    The layers carry different (known, fixed) content d_t = linspace(-2, 3):
    with identical kernels the R_t commute, the profile depends only on the
    multiset of lambdas and a constant start could never break the symmetry.
    Even so the problem is ill-conditioned (singular values 2.6 ... 1e-10),
    which is why this fit uses optax.lbfgs on the smooth l2 loss rather than
    Adam; the test asks W1 < 1e-4, the total mixing sum_t lambda_t to the
    bound of its direction, and the identified directions (bound < 0.05).
    """
    T, H = 16, 8
    content = np.linspace(-2.0, 3.0, T)[:, None]
    truth = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=LAMBDAS,
                                        diagonal_scores=content)
    target = oracle.influence(arrays_of(truth), N)
    start = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=0.3,
                                        diagonal_scores=content)
    result = jaxroll.fit(start, target, fit="lambdas", loss="l2", optimizer=optax.lbfgs(),
                         steps=150, n=N)

    distance = w1(oracle.influence(arrays_of(result.model), N), target)
    assert distance < 1e-4

    def profile_of(theta):
        arrays = arrays_of(truth)
        arrays["lambdas"] = theta
        return oracle.influence(arrays, N)

    # As for content: the individual lambda_t are not pinned (errors of ~0.3
    # remain along near-null directions), the best-determined combination
    # v_1 . lambda is, to 0.02 (its linear bound (n - 1) W1 / s_1 is ~1e-4;
    # second-order coupling to the unpinned directions makes up the rest;
    # observed 0.005; the start is 0.22 off along v_1).
    jacobian = cdf_jacobian(profile_of, LAMBDAS)
    first = np.linalg.svd(jacobian, full_matrices=False)[2][0]
    assert abs(first @ (result.model.lambdas - LAMBDAS)) < 0.02


# -- gradients ----------------------------------------------------------------


def _sigmoid(u):
    return 1.0 / (1.0 + np.exp(-u))


def _softplus(u):
    return np.logaddexp(0.0, u)


def _softmax(u):
    e = np.exp(u - u.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _numpy_loss(raw, model, target, schedule, content):
    """The fit objective in NumPy: parametrisations of fit.py's docstring + oracle + W1."""
    arrays = arrays_of(model)
    T, H = arrays["slopes"].shape
    t = np.arange(T, dtype=np.float64)
    u = raw["lambdas"]
    arrays["lambdas"] = {"free": lambda: _sigmoid(u),
                         "constant": lambda: np.full(T, _sigmoid(u)),
                         "power_decay": lambda: _sigmoid(u[0]) / (t + 1) ** u[1] ** 2}[schedule]()
    arrays["diagonal"] = np.broadcast_to(raw["diagonal_scores"], (T, H))
    arrays["slopes"] = _softplus(raw["alibi_slopes"])
    arrays["weights"] = _softmax(raw["head_weights"])
    arrays["temperature"] = float(_softplus(raw["temperature"]))
    return w1(oracle.influence(arrays, len(target)), target)


@pytest.mark.parametrize("schedule,content", [("free", "per_head"), ("power_decay", "per_layer"),
                                              ("constant", "per_head")])
def test_gradient_matches_central_differences(schedule, content):
    """d loss / d u for every free array, jax.grad against central differences
    of the NumPy objective (float64, h = 1e-6: error O(h^2) plus rounding
    1e-16 / h, far below the tolerance 1e-6 relative + 1e-8). The point is away
    from the optimum, so no CDF gap crosses 0 within h (W1 has kinks there)."""
    n = 24
    model = jaxroll.RolloutModel.create(
        num_layers=5, num_heads=3, lambdas=[0.5, 0.4, 0.3, 0.2, 0.25],
        alibi_slopes=[0.5, 0.25, 0.125], diagonal_scores=[[1.0, -0.5, 0.2]],
        head_weights=[[0.2, 0.3, 0.5]], temperature=1.3)
    other = jaxroll.RolloutModel.create(num_layers=5, num_heads=3, lambdas=0.8,
                                        alibi_slopes=[0.3, 0.1, 0.05], diagonal_scores=2.0)
    target = oracle.influence(arrays_of(other), n)
    function, point = objective(model, target, fit=ALL_FIELDS, schedule=schedule, content=content, n=n)
    point = {name: np.asarray(u, dtype=np.float64) for name, u in point.items()}
    if schedule == "free" and content == "per_head":
        # The starting point represents the model: the parametrisations invert.
        assert _numpy_loss(point, model, target, schedule, content) == pytest.approx(
            w1(oracle.influence(arrays_of(model), n), target), rel=1e-9)
    gradient = jax.grad(function)(point)
    np.testing.assert_allclose(float(function(point)),
                               _numpy_loss(point, model, target, schedule, content), rtol=1e-10)
    h = 1e-6
    for name, u in point.items():
        numeric = np.zeros(u.shape)
        for index in np.ndindex(u.shape):
            plus = {k: v.copy() for k, v in point.items()}
            minus = {k: v.copy() for k, v in point.items()}
            plus[name][index] += h
            minus[name][index] -= h
            numeric[index] = (_numpy_loss(plus, model, target, schedule, content)
                              - _numpy_loss(minus, model, target, schedule, content)) / (2 * h)
        np.testing.assert_allclose(np.asarray(gradient[name]), numeric, rtol=1e-6, atol=1e-8,
                                   err_msg=name)


# -- the paper's ordering on the five reference models ------------------------


@pytest.mark.parametrize("name", MODELS)
def test_five_models_fit_lowers_wasserstein_and_attention_only_is_worst(name):
    """no_content/<model>.yaml fitted (free lambdas, 30 Adam steps) to the
    profile of all_content/fineweb-edu/<model>.yaml at n = 64 (the causal
    prefix of the n = 256 profile).

    The ordering of the paper: the fitted residual-aware rollout is closer to
    the content-aware profile than the unfitted one, and the attention-only
    rollout (no_content/<model>-noresidual.yaml, lambda = 1) is farther than
    both. 30 steps suffice (observed: W1 falls 0.09-0.45 -> < 0.05), all
    distances are the oracle's, and the margins are wide, so no tolerance is
    needed beyond strict inequality.
    """
    no_content = jaxroll.load_config(ALIBI / "no_content" / f"{name}.yaml")
    content = oracle.read_config(ALIBI / "all_content" / "fineweb-edu" / f"{name}.yaml")
    attention_only = oracle.read_config(ALIBI / "no_content" / f"{name}-noresidual.yaml")
    target = oracle.influence(oracle.config_arrays(content), N)

    result = jaxroll.fit(no_content, target, steps=30, n=N)

    before = w1(oracle.influence(arrays_of(no_content), N), target)
    after = w1(oracle.influence(arrays_of(result.model), N), target)
    worst = w1(oracle.influence(oracle.config_arrays(attention_only), N), target)
    assert after < before < worst
    np.testing.assert_allclose([result.initial_loss, result.final_loss], [before, after], rtol=1e-9)
    assert result.metrics.wasserstein == pytest.approx(after, rel=1e-9)


def test_compare_variants_orders_the_variants():
    """compare_variants on MPT-7B (n = 16, 30 steps): attention-only worst, and
    the content variant (which can also reach the no-content point) no
    worse than 1.05 x the no-content one; distances checked with the oracle."""
    n = 16
    model = jaxroll.load_config(ALIBI / "all_content" / "fineweb-edu" / "mpt-7b.yaml")
    target = oracle.influence(arrays_of(model), n)
    table = jaxroll.compare_variants(model, target, steps=30, n=n)
    assert list(table) == ["attention_only", "no_content", "content"]
    distances = {key: w1(oracle.influence(arrays_of(row.model), n), target) for key, row in table.items()}
    for key, row in table.items():
        assert row.final_loss == pytest.approx(distances[key], rel=1e-9)
        assert np.all(np.isfinite(row.profile)) and abs(row.profile.sum() - 1) < 1e-12
    assert distances["attention_only"] > max(distances["no_content"], distances["content"])
    assert np.all(table["attention_only"].model.lambdas == 1.0)
    assert np.all(table["no_content"].model.diagonal_scores == 0.0)


# -- properties -----------------------------------------------------------------


def test_fitted_model_is_numpy_float64_and_round_trips(tmp_path):
    small = dict(num_layers=6, num_heads=4, sequence_length=16)
    model = jaxroll.RolloutModel.create(lambdas=0.3, **small)
    target = oracle.influence(arrays_of(jaxroll.RolloutModel.create(lambdas=0.7, **small)), 16)
    result = jaxroll.fit(model, target, fit="lambdas,head_weights,temperature", steps=20,
                         restarts=3, key=jax.random.PRNGKey(1))
    fitted = result.model
    for name in ("lambdas", "alibi_slopes", "diagonal_scores", "head_weights", "temperature"):
        value = getattr(fitted, name)
        assert isinstance(value, np.ndarray) and value.dtype == np.float64, name
    path = jaxroll.save_config(fitted, tmp_path / "fitted.yaml")
    again = jaxroll.load_config(path)
    for name in ("lambdas", "alibi_slopes", "head_weights", "temperature"):
        np.testing.assert_array_equal(getattr(again, name), getattr(fitted, name))
    np.testing.assert_allclose(fitted.head_weights.sum(axis=1), 1.0, rtol=1e-12)
    # Three restarts; the first starts at the model, and the best is kept.
    assert result.restart_losses.shape == (3,)
    assert result.final_loss == pytest.approx(result.restart_losses.min(), rel=1e-9)
    assert result.final_loss <= result.initial_loss
    assert 1 <= result.steps <= 20 and result.max_steps == 20 and result.optimizer == "adam"
    assert result.losses.shape == (result.steps + 1,) and np.all(np.isfinite(result.losses))
    assert result.losses[0] == pytest.approx(result.initial_loss, rel=1e-9) or \
        result.restart_losses.argmin() != 0


def test_float32_fit_is_finite_and_normalised(float32):
    """The float32 default: finite losses and a profile summing to 1 within 1e-6."""
    with float32:
        small = dict(num_layers=8, num_heads=4, sequence_length=32)
        model = jaxroll.RolloutModel.create(lambdas=0.2, **small)
        target = oracle.influence(arrays_of(jaxroll.RolloutModel.create(lambdas=0.6, **small)), 32)
        result = jaxroll.fit(model, target, fit="lambdas,diagonal_scores", steps=20)
    assert np.all(np.isfinite(result.losses))
    assert abs(result.profile.sum() - 1.0) < 1e-6
    assert result.final_loss < result.initial_loss


def test_progress_chunks_give_the_same_fit():
    """Chunked steps (the progress bar) run the same optimisation as one scan."""
    small = dict(num_layers=8, num_heads=4, sequence_length=16)
    model = jaxroll.RolloutModel.create(lambdas=0.2, **small)
    target = oracle.influence(arrays_of(jaxroll.RolloutModel.create(lambdas=0.6, **small)), 16)
    whole = jaxroll.fit(model, target, steps=120)
    chunked = jaxroll.fit(model, target, steps=120, progress=True)
    np.testing.assert_allclose(chunked.losses, whole.losses, rtol=1e-12)
    np.testing.assert_array_equal(chunked.model.lambdas, whole.model.lambdas)


# -- bad input ------------------------------------------------------------------


def _one_line_error(match, **kwargs):
    model = jaxroll.presets.get("mpt-7b", 8)
    target = np.full(8, 1 / 8)
    arguments = {"target": target, "steps": 5} | kwargs
    target = arguments.pop("target")
    with pytest.raises(ConfigError, match=match) as info:
        jaxroll.fit(model, target, **arguments)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("target,match", [
    (np.r_[np.full(7, 1 / 7), np.nan], "target: value nan at index 7 is not finite"),
    (np.r_[-0.1, np.full(7, 1.1 / 7)], "target: value -0.1 at index 0 is negative"),
    (np.full(8, 0.25), "target: sums to 2; allowed"),
    (np.full(16, 1 / 16), "target: length 16 differs from n = 8"),
    (np.full((2, 4), 1 / 8), r"target: got shape \(2, 4\)"),
])
def test_bad_target(target, match):
    _one_line_error(match, target=target)


@pytest.mark.parametrize("kwargs,match", [
    ({"fit": ("lambdas", "slopes")}, "fit: unknown array 'slopes'; allowed: any of lambdas"),
    ({"fit": ()}, "fit: got an empty list"),
    ({"steps": 0}, "steps: got 0; allowed: an integer >= 1"),
    ({"restarts": 0}, "restarts: got 0"),
    ({"schedule": "linear"}, "schedule: got 'linear'; allowed: one of free, power_decay, constant"),
    ({"schedule": "constant", "fit": "temperature"}, "schedule: 'constant' parametrises lambdas"),
    ({"content": "global"}, "content: got 'global'"),
    ({"loss": "mse"}, "loss: got 'mse'; allowed: one of wasserstein, kl, l2"),
    ({"method": "fast"}, "method: got 'fast'"),
])
def test_bad_arguments(kwargs, match):
    _one_line_error(match, **kwargs)


# -- the global stage -------------------------------------------------------------


def _recovery(start, num_heads, n):
    """Issue 13's recovery problem on 32 layers with the standard ALiBi slopes of
    `num_heads` heads and no content: target the oracle's profile of
    power_decay(0.35, 1.3) at length n, start from constant(start), default
    loss (W1). Returns the fit and the fit of the same scan without the global
    stage (search = 0), or None for that when start is not 0.1."""
    def model(lambdas):
        return jaxroll.RolloutModel.create(num_layers=32, num_heads=num_heads, lambdas=lambdas,
                                           sequence_length=n)

    target = oracle.influence(arrays_of(model(schedules.power_decay(0.35, 1.3, 32))), n)
    arguments = dict(schedule="power_decay", steps=60, optimizer=LBFGS, method="structured")
    result = jaxroll.fit(model(schedules.constant(start, 32)), target, **arguments)
    assert result.search_points == GLOBAL_POINTS  # two parameters: the global stage is on
    fitted = result.schedule_parameters
    assert w1(oracle.influence(arrays_of(result.model), n), target) < 1e-4
    assert abs(fitted["lambda_0"] - 0.35) < 1e-2 and abs(fitted["beta"] - 1.3) < 1e-2
    assert result.identifiability.undetermined == ()
    if start == 0.1:  # the same compiled scan, from the start alone: the spurious minimum
        local = jaxroll.fit(model(schedules.constant(start, 32)), target, search=0, **arguments)
        assert local.search_points == 0
        assert w1(oracle.influence(arrays_of(local.model), n), target) > 1e-3
        assert local.schedule_parameters["beta"] < 0.1


# One optimizer object for the recovery tests: the same object reuses the
# compiled scan (a fresh optax.lbfgs() would compile again, ~10-25 s).
LBFGS = optax.lbfgs()


@pytest.mark.parametrize("start", [0.1, 0.9])
def test_global_stage_recovers_power_decay_from_constant_starts(start):
    """The spurious minimum of issue 13 on a cheaper geometry (32 layers, 8
    heads, n = 64): from constant(0.1) the local fit alone stops at
    lambda_0 ~ 0.03, beta -> 0 (a near-constant schedule with the truth's
    total mixing, W1 ~ 4e-3), from constant(0.9) at lambda_0 ~ 0.83, beta -> 0
    (W1 ~ 0.77). With the global stage both reach W1 < 1e-4 (oracle) and
    lambda_0, beta within 1e-2, the issue's acceptance numbers (observed:
    exact to 1e-15). L-BFGS keeps the suite fast: 60 steps from the design's
    best point, where Adam needs ~3000 steps along the narrow curved valley
    (benchmarks/fit.py times both at the issue's N = 256).
    """
    _recovery(start, num_heads=8, n=64)


@pytest.mark.slow
@pytest.mark.parametrize("start", [0.1, 0.9])
def test_global_stage_recovers_power_decay_on_mpt7b_geometry(start):
    """The issue's own problem: 32 layers, 32 heads, N = 256 (~3 min on a
    loaded 2-core machine; benchmarks/fit.py runs it)."""
    _recovery(start, num_heads=32, n=256)


def test_halton_design_matches_scipy():
    """The design of the global stage is the Halton sequence: scipy's unscrambled
    qmc.Halton (an independent implementation) from its second point on."""
    from scipy.stats import qmc

    expected = qmc.Halton(d=5, scramble=False).random(201)[1:]
    np.testing.assert_allclose(np.asarray(halton(200, 5)), expected, rtol=0, atol=1e-15)


def test_restarts_are_drawn_over_the_box():
    """Free per-layer lambdas (16 parameters, no design by default): the
    starting points are the model's own and draws over BOX['lambda'], in the
    box and spread over it, not noise around the start."""
    from jaxroll.fitting.design import _starting_points
    from jaxroll.fitting.problem import _setup

    model = jaxroll.RolloutModel.create(num_layers=16, num_heads=4, lambdas=0.1, sequence_length=16)
    target = np.full(16, 1 / 16)
    problem, fixed, target = _setup(model, target, ("lambdas",), "free", "per_layer", "wasserstein",
                                    16, "auto", None)
    points, searched = _starting_points(problem, fixed, target, problem.parametrisation.initial(model),
                                        restarts=200, search=0, key=jax.random.PRNGKey(3))
    lambdas = _sigmoid(np.asarray(points["lambdas"]))
    assert searched == 199 and lambdas.shape == (200, 16)
    np.testing.assert_allclose(lambdas[0], 0.1, rtol=1e-9)
    low, high = BOX["lambda"]
    draws = lambdas[1:]
    assert np.all((draws >= low - 1e-12) & (draws <= high + 1e-12))
    # Uniform on [0.01, 0.99]: 199 draws per layer have mean 0.5 +- 0.02
    # (standard error 0.283 / sqrt(199)); a 5-sigma band, and each layer
    # reaches both ends of the box.
    assert np.all(np.abs(draws.mean(axis=0) - 0.5) < 0.1)
    assert np.all(draws.min(axis=0) < 0.1) and np.all(draws.max(axis=0) > 0.9)


# -- the identifiability report -------------------------------------------------


def _unconstrained_jacobian(profile_of, u, h=1e-6):
    """dp/du by central differences of the oracle (error O(h^2) + 1e-16 / h ~ 1e-10)."""
    columns = []
    for k in range(u.size):
        step = np.zeros_like(u)
        step[k] = h
        columns.append((profile_of(u + step) - profile_of(u - step)) / (2 * h))
    return np.stack(columns, axis=1)


def test_identifiability_report_matches_finite_differences():
    """Power decay and temperature (three parameters) on a small model: the
    report's Jacobian, singular values, directions and uncertainties against a
    central-difference Jacobian of the NumPy oracle in the same unconstrained
    coordinates (logit lambda_0, sqrt beta, softplus^-1 tau), at a
    model whose profile differs from the target (so rho is the residual).
    Then a fit reports the same thing at its solution.

    Tolerances: FD error ~1e-10 absolute on entries of size ~1e-3 .. 1, so
    1e-7 on the Jacobian and 1e-9 absolute on the singular values (a
    perturbation of the matrix moves them by at most its norm); the
    uncertainties scale as 1 / s_k, so they are checked to 1e-9 / s_min
    relative (and at least 1e-6); directions up to sign to 1e-5.
    """
    n, T, H = 32, 8, 4
    t = np.arange(T)
    model = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=schedules.power_decay(0.6, 0.8, T),
                                        diagonal_scores=1.0, temperature=0.8, sequence_length=n)
    other = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=schedules.power_decay(0.5, 1.0, T),
                                        diagonal_scores=1.0, temperature=1.2, sequence_length=n)
    target = oracle.influence(arrays_of(other), n)
    report = identifiability(model, target, fit="lambdas,temperature", schedule="power_decay")
    assert report.names == ("lambda_0", "beta", "temperature")

    u = np.array([np.log(0.6 / 0.4), np.sqrt(0.8), np.log(np.expm1(0.8))])

    def profile_of(u):
        arrays = arrays_of(model)
        arrays["lambdas"] = _sigmoid(u[0]) / (t + 1.0) ** u[1] ** 2
        arrays["temperature"] = float(_softplus(u[2]))
        return oracle.influence(arrays, n)

    jacobian = _unconstrained_jacobian(profile_of, u)
    np.testing.assert_allclose(report.jacobian, jacobian, rtol=0, atol=1e-7)
    _, singular, right = np.linalg.svd(jacobian, full_matrices=False)
    np.testing.assert_allclose(report.singular_values, singular, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.abs(report.directions), np.abs(right), rtol=0, atol=1e-5)
    residual = np.linalg.norm(profile_of(u) - target)
    assert residual > 1e-3 and report.resolution == pytest.approx(residual, rel=1e-9)
    sigma = residual * np.sqrt((right ** 2 / singular[:, None] ** 2).sum(axis=0))
    np.testing.assert_allclose(report.parameter_uncertainty, sigma, rtol=max(1e-6, 1e-9 / singular[-1]))
    np.testing.assert_array_equal(report.determined, sigma <= 0.1)


def test_identifiability_finds_the_slope_temperature_null_direction():
    """Without content, scores are -m (i - j) / tau: scaling every slope and
    the temperature by one factor leaves the profile unchanged (a closed-form
    null direction, u = softplus^-1: du = x / sigmoid(u) for x = m, tau).
    The report must put a singular value at rounding level along exactly that
    direction and name the temperature as not determined; the warning line
    says so."""
    n, T, H = 16, 3, 2
    model = jaxroll.RolloutModel.create(num_layers=T, num_heads=H, lambdas=0.5, alibi_slopes=[0.3, 0.1],
                                        temperature=1.3, sequence_length=n)
    target = oracle.influence(arrays_of(model), n)
    report = identifiability(model, target, fit="alibi_slopes,temperature")
    assert len(report.names) == T * H + 1 and report.names[-1] == "temperature"
    x = np.r_[np.asarray(model.alibi_slopes).ravel(), float(model.temperature)]
    null = x / _sigmoid(np.log(np.expm1(x)))
    null /= np.linalg.norm(null)
    assert report.singular_values[-1] < 1e-10 * report.singular_values[0]
    assert abs(report.directions[-1] @ null) == pytest.approx(1.0, abs=1e-8)
    # An exact target: rho is the floor 1e-6 ||q||_2.
    assert report.resolution == pytest.approx(1e-6 * np.linalg.norm(target), rel=1e-9)
    assert "temperature" in report.undetermined
    warning = [line for line in report.summary() if line.startswith("warning:")]
    assert len(warning) == 1 and "temperature" in warning[0]


def test_reverse_mode_jacobian_matches_forward_mode():
    """The report's fallback (n vector-Jacobian products, for an influence
    behind a jax.custom_vjp) gives the forward-mode Jacobian, to rounding."""
    from jaxroll.fitting.identification import _profile_jacobian
    from jaxroll.fitting.problem import _setup

    model = jaxroll.RolloutModel.create(num_layers=4, num_heads=2, lambdas=schedules.power_decay(0.5, 0.7, 4),
                                        diagonal_scores=0.5, temperature=1.2, sequence_length=12)
    # The dense method: the structured product is a custom_vjp (issue 13) and has no forward mode.
    problem, fixed, _ = _setup(model, np.full(12, 1 / 12), "lambdas,temperature", "power_decay",
                               "per_layer", "wasserstein", 12, "dense", None)
    flat = problem.parametrisation.flatten(problem.parametrisation.initial(model))
    forward = _profile_jacobian(flat, fixed, problem=problem, batch_size=2, forward=True)
    reverse = _profile_jacobian(flat, fixed, problem=problem, batch_size=5, forward=False)
    assert forward.shape == (12, 3)
    np.testing.assert_allclose(np.asarray(reverse), np.asarray(forward), rtol=0, atol=1e-14)


def test_identifiability_with_fewer_positions_than_parameters_reports_the_null_directions():
    """J is 2 x 3: one direction of parameter space cannot move the profile at
    all, so its singular value is 0 and every parameter loading on it is
    undetermined; the report still has one entry per parameter."""
    from jaxroll.fitting.identification import identifiability_from_jacobian

    jacobian = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 2.0]])
    report = identifiability_from_jacobian(jacobian, ["a", "b", "c"], residual=1e-3, scale=1.0)
    np.testing.assert_allclose(report.singular_values, [np.sqrt(8.0), 1.0, 0.0], atol=1e-15)
    null = report.directions[2]
    np.testing.assert_allclose(np.abs(null), [0.0, np.sqrt(0.5), np.sqrt(0.5)], atol=1e-15)
    np.testing.assert_allclose(jacobian @ null, 0.0, atol=1e-15)
    assert report.parameter_uncertainty[0] == pytest.approx(1e-3)   # rho / s, s = 1 along a
    assert np.isinf(report.parameter_uncertainty[1:]).all()
    assert report.undetermined == ("b", "c")
    assert len(report.summary()) >= 3
