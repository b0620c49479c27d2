"""The recipes of docs/development.md, followed from this file alone: a toy kernel and a toy intervention.

`DecayKernel` (one head per layer, logits ``s_t(i, j) = -r_t (i - j)`` on causal pairs, so
``A_t[i, j] = e^{-r_t (i - j)} / Z_i``) declares its YAML form, a sweepable and fittable field and two
logit operations (``temper`` and ``scale_slopes``); `LogitGain` (logits multiplied by ``c > 0``) asks
the kernel to temper by ``1 / c``, so it runs on every kernel that declares ``temper``. Each is
registered with one call, and then runs everywhere its declarations allow, checked against
`_oracle`, a NumPy float64 product written from the definitions above: influence (structured and
dense paths), `jax.grad` (central differences), save and load, a sweep over the kernel's field and
over the intervention, a fit of the field, every built-in intervention (applied where declared,
refused in one line where not), a design, and ``jaxroll rollout CONFIG --intervene FILE.yaml``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from jaxtyping import Array, Float

import jaxroll
from jaxroll import interventions as iv
from jaxroll.cli import main
from jaxroll.engine.kernel import KERNEL_TYPES, AbstractKernel, layer_head_values, register_kernel
from jaxroll.engine.plan import Path

RATES = np.array([0.9, 0.2, 0.5])
LAMBDAS = np.array([0.6, 0.35, 0.8])
N = 10


class DecayKernel(AbstractKernel):
    """``A_t[i, j] = e^{-r_t (i - j)} / sum_{k <= i} e^{-r_t (i - k)}`` for j <= i: one head, decay rate r_t >= 0."""

    rates: Float[Array, " layers"]

    config_kind = "decay"
    sweep_fields = ("rates",)
    slope_field = "rates"
    fittable_fields = {"rates": "positive"}

    @property
    def num_layers(self):
        return self.rates.shape[0]

    @property
    def num_heads(self):
        return 1

    def dense(self, n):
        distance = jnp.arange(n)[:, None] - jnp.arange(n)[None, :]
        logits = jnp.where(distance >= 0, -self.rates * distance, -jnp.inf)
        return jax.nn.softmax(logits, axis=-1)

    def row_times_kernel(self, v, path=Path()):
        return v @ self.dense(v.shape[-1])

    def check_length(self, n):
        pass

    def influence_bytes(self, n, method, itemsize):
        return 2 * n * n * itemsize

    def check(self):
        if isinstance(self.rates, jax.core.Tracer):  # under jit or grad: checked where it was concrete
            return
        rates = np.asarray(self.rates)
        if rates.ndim != 1 or not (np.isfinite(rates) & (rates >= 0)).all():
            raise jaxroll.ConfigError.of("rates", rates.tolist(), "one number >= 0 per layer")

    def _per_layer(self, field, value):
        return layer_head_values(field, value, self.num_layers, 1)[:, 0]

    def temper(self, tau, field="tau"):
        return dataclasses.replace(self, rates=self.rates / self._per_layer(field, tau))

    def scale_slopes(self, scale, field="slope_scale"):
        return dataclasses.replace(self, rates=self.rates * self._per_layer(field, scale))

    def to_config(self, kernel_file=None):
        return {"kernel_config": {"kernel_type": self.config_kind, "rates": np.asarray(self.rates).tolist()}}

    @classmethod
    def from_config(cls, config, *, num_layers, directory=None):
        kernel = cls(np.asarray(config["kernel_config"]["rates"], dtype=np.float64))
        kernel.check()
        return kernel


class LogitGain(iv.AbstractIntervention):
    """Every logit multiplied by ``c > 0`` (``s' = c s``): the kernel tempered by ``1 / c``."""

    name, parameter, neutral, order = "logit_gain", "gain", 1.0, 26
    box, log_box, lowest = (0.5, 2.0), True, (0.0, True)
    sweep_axis, torch_change = True, "divide"

    gain: Float[Array, "..."]

    def __init__(self, gain):
        self.gain = gain if isinstance(gain, jax.core.Tracer) else np.asarray(gain, np.float64)

    def torch_values(self, num_layers, num_heads):
        return 1.0 / self.layer_head_value(num_layers, num_heads)

    def apply(self, model):
        return dataclasses.replace(model, kernel=model.kernel.temper(1.0 / self.gain, self.name))


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_kernel(DecayKernel)  # the recipes' one call each
    iv.register_intervention(LogitGain)
    yield
    iv.unregister_intervention(LogitGain)
    # Taken out again (there is no unregister_kernel): a worker that runs a later module would
    # otherwise list "decay" among the allowed kernel types (test_kernel_types' messages, under
    # --dist worksteal, where a module may run after this one on the same worker).
    KERNEL_TYPES.pop(DecayKernel.config_kind, None)


def _model(rates=RATES, lambdas=LAMBDAS, n=N):
    return jaxroll.RolloutModel.create(kernel=DecayKernel(jnp.asarray(rates)), lambdas=lambdas, sequence_length=n)


def _oracle(rates=RATES, lambdas=LAMBDAS, n=N):
    """``e_{n-1}^T R_T ... R_1`` in NumPy float64 from the kernel's definition (not its code)."""
    rates = np.broadcast_to(np.asarray(rates, dtype=np.float64), (3,))
    product = np.eye(n)
    for rate, lam in zip(rates, lambdas):
        kernel = np.zeros((n, n))
        for i in range(n):
            weights = np.exp(-rate * (i - np.arange(i + 1)))
            kernel[i, : i + 1] = weights / weights.sum()
        product = ((1.0 - lam) * np.eye(n) + lam * kernel) @ product
    return product[n - 1]


@pytest.mark.parametrize("method", ["structured", "dense"])
def test_influence_on_both_paths(method):
    np.testing.assert_allclose(np.asarray(jaxroll.influence(_model(), method=method)), _oracle(), rtol=0, atol=1e-13)


def test_grad_matches_central_differences():
    def first_mass(rates):
        return jaxroll.influence(_model(rates))[0]

    gradient = np.asarray(jax.grad(first_mass)(jnp.asarray(RATES)))
    step = 1e-6  # float64: central differences are accurate to about step^2 ~ 1e-12, rounding to ~1e-10
    for t in range(3):
        bump = np.eye(3)[t] * step
        expected = (_oracle(RATES + bump)[0] - _oracle(RATES - bump)[0]) / (2 * step)
        assert abs(gradient[t] - expected) < 1e-8


def test_save_and_load_carry_the_kernel(tmp_path):
    path = jaxroll.save_config(_model(), tmp_path / "decay.yaml")
    loaded = jaxroll.load_config(path)
    assert type(loaded.kernel) is DecayKernel
    np.testing.assert_allclose(np.asarray(jaxroll.influence(loaded)), _oracle(), rtol=0, atol=1e-13)


def test_sweeps_over_the_kernel_field_and_the_intervention():
    by_rates = jaxroll.sweep(_model(), rates=[0.1, [1.0, 0.0, 2.0]], progress=False)
    np.testing.assert_allclose(by_rates.profiles[0], _oracle(0.1), rtol=0, atol=1e-13)
    np.testing.assert_allclose(by_rates.profiles[1], _oracle([1.0, 0.0, 2.0]), rtol=0, atol=1e-13)
    by_gain = jaxroll.sweep(_model(), logit_gain=[0.5, 2.0], progress=False)
    for k, gain in enumerate([0.5, 2.0]):
        np.testing.assert_allclose(by_gain.profiles[k], _oracle(RATES * gain), rtol=0, atol=1e-13)


def test_a_fit_recovers_the_rates():
    # Near the start: far from it this profile has other local minima within 4e-4 of the target.
    truth = np.array([1.0, 0.3, 0.4])
    result = jaxroll.fit(_model(), _oracle(truth), fit="rates", loss="kl", progress=False)
    assert result.converged and type(result.model.kernel) is DecayKernel
    np.testing.assert_allclose(np.asarray(result.model.kernel.rates), truth, rtol=0, atol=1e-5)


def test_every_built_in_intervention_applies_where_declared_and_is_refused_where_not():
    expected = {  # the rates (or lambdas) each change gives on this kernel, written from its definition
        "tau=0.5": (RATES / 0.5, LAMBDAS),
        "slope_scale=3": (RATES * 3, LAMBDAS),
        "gamma=0.5": (RATES, 0.5 * LAMBDAS / (0.5 * LAMBDAS + 1 - LAMBDAS)),
        "logit_gain=1.5": (RATES * 1.5, LAMBDAS),
        "logit_gain=2,tau=0.8": (RATES * 2 / 0.8, LAMBDAS),
    }
    for text, (rates, lambdas) in expected.items():
        changed = iv.apply_all(_model(), iv.parse(text))
        np.testing.assert_allclose(np.asarray(jaxroll.influence(changed)), _oracle(rates, lambdas), rtol=0,
                                   atol=1e-13, err_msg=text)
    sinks = iv.apply_all(_model(), iv.parse("sinks=2"))  # positions only: the same kernel at n + 2
    np.testing.assert_allclose(np.asarray(jaxroll.influence(sinks)), _oracle(n=N + 2), rtol=0, atol=1e-13)
    for text, field in (("kappa=0.5", "kappa"), ("ssmax_scale=1", "ssmax_scale"), ("rotary_ratio=2", "rotary_ratio")):
        with pytest.raises(jaxroll.ConfigError, match=rf"^{field}: a DecayKernel ") as error:
            iv.apply_all(_model(), iv.parse(text))
        assert "\n" not in str(error.value)


def test_a_design_recovers_the_gain():
    result = jaxroll.design(_model(), "logit_gain=global", target=_oracle(RATES * 1.3), loss="kl", search=8)
    assert abs(float(result.values["logit_gain"]) - 1.3) < 1e-4


def test_rollout_intervene_from_a_yaml_file(tmp_path, capsys):
    config, changes, out = tmp_path / "decay.yaml", tmp_path / "changes.yaml", tmp_path / "out"
    jaxroll.save_config(_model(), config)
    changes.write_text(yaml.safe_dump({"logit_gain": 1.5, "gamma": 0.5}), encoding="utf-8")
    assert main(["rollout", str(config), "--intervene", str(changes), "--out", str(out), "--no-figure"]) == 0
    capsys.readouterr()
    lambdas = 0.5 * LAMBDAS / (0.5 * LAMBDAS + 1 - LAMBDAS)
    np.testing.assert_allclose(jaxroll.read_profile(out / "profile.csv"), _oracle(RATES * 1.5, lambdas), rtol=0,
                               atol=1e-12)


def _help(command, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["measure", "task"])
def test_the_intervene_help_lists_the_registered_names(command, capsys):
    help_text = _help(command, capsys)
    assert "logit_gain" in help_text and "kappa (kappa_form, kappa_k)" in help_text


def test_the_rollout_help_names_every_built_in_intervention(capsys):
    # rollout --help answers before JAX loads (tests/test_lazy_imports.py), so its prose is written by hand:
    # this keeps it from drifting from the registry.
    help_text = _help("rollout", capsys)
    built_in = [kind for kind in iv.intervention_types() if kind.__module__.startswith("jaxroll.")]
    assert len(built_in) == 7
    for kind in built_in:
        assert kind.name in help_text and all(option in help_text for option in kind.options)
