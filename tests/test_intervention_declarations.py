"""Interventions declare themselves once: a toy intervention, defined and registered here alone, runs
everywhere its declarations allow (parse and describe, a YAML file on ``rollout --intervene``,
`apply_all`, a sweep, a design, the torch plan), against a NumPy float64 oracle; the docs' tables
agree with the registry.

The toy, `LogitScale`, multiplies every logit of an ALiBi + content kernel by ``c_{t,h} > 0``:
``s'_{t,h}(i, j) = c_{t,h} (-m_h (i - j) + d_h [i == j] + b_h)``, the reciprocal of a temperature.
A second, `LambdaPower` (``lambda'_t = lambda_t^{p_t}``), changes the mixing alone, as `BranchScale`
does, and keeps a sweep's Krylov path.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from jaxtyping import Array, Float

import jaxroll
from jaxroll import ConfigError
from jaxroll import interventions as iv
from jaxroll.cli import main

ROOT = Path(__file__).resolve().parent.parent
T, H, N = 3, 2, 12
SLOPES = np.array([[0.5, 0.125], [0.4, 0.2], [0.7, 0.05]])
DIAGONAL = np.array([[0.3, -0.2], [1.1, 0.0], [-0.4, 0.6]])
LAMBDAS = np.array([0.6, 0.35, 0.8])
SCALE = np.array([[1.5, 0.6], [0.8, 1.9], [1.2, 1.0]])


class LogitScale(iv.AbstractIntervention):
    """Logits multiplied by ``c_{t,h} > 0`` on an ALiBi + content kernel (slopes, content, background)."""

    name, parameter, neutral, order = "logit_scale", "scale", 1.0, 25
    box, log_box, lowest = (0.5, 2.0), True, (0.0, True)
    sweep_axis, torch_change = True, "divide"

    scale: Float[Array, "..."]

    def __init__(self, scale):
        self.scale = scale if isinstance(scale, jax.core.Tracer) else np.asarray(scale, np.float64)

    def torch_values(self, num_layers, num_heads):
        return 1.0 / self.layer_head_value(num_layers, num_heads)  # a "divide" step divides by 1 / c

    def apply(self, model):
        kernel = model.kernel
        scale = jnp.broadcast_to(self.scale, (model.num_layers, model.num_heads))
        changed = dataclasses.replace(kernel, alibi_slopes=kernel.alibi_slopes * scale,
                                      diagonal_scores=kernel.diagonal_scores * scale,
                                      base_scores=kernel.base_scores * scale)
        return dataclasses.replace(model, kernel=changed)


class LambdaPower(iv.AbstractIntervention):
    """The mixing raised to a power per layer, ``lambda'_t = lambda_t^{p_t}`` (p > 0): a change of the mixing alone."""

    name, parameter, neutral, order, changes = "lambda_power", "power", 1.0, 65, "mixing"
    shapes, sweep_axis = ("global", "per_layer"), True

    power: Float[Array, "..."]

    def __init__(self, power):
        self.power = power if isinstance(power, jax.core.Tracer) else np.asarray(power, np.float64)

    @classmethod
    def mixed_lambdas(cls, value, lambdas, stream_norms=None):
        return lambdas**value

    def apply(self, model):
        return dataclasses.replace(model, lambdas=self.mixed_lambdas(self.power, model.lambdas))


TOYS = (LogitScale, LambdaPower)


@pytest.fixture(scope="module", autouse=True)
def registered():
    iv.register_intervention(LogitScale)  # the one call the recipe asks for
    iv.register_intervention(LambdaPower)
    yield
    iv.unregister_intervention(LogitScale)
    iv.unregister_intervention(LambdaPower)


def _model(n=N):
    kernel = jaxroll.AlibiKernel.create(num_layers=T, num_heads=H, alibi_slopes=SLOPES, diagonal_scores=DIAGONAL)
    return jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=n)


def _oracle(scale=1.0, lambdas=LAMBDAS, n=N, slopes=SLOPES, diagonal=DIAGONAL):
    """``e_{n-1}^T R_T ... R_1`` in float64 with ``A_t`` the head mean of ``softmax(c (-m (i - j) + d [i == j]))``."""
    scale = np.broadcast_to(np.asarray(scale, np.float64), (T, H))
    slopes, diagonal = np.broadcast_to(slopes, (T, H)), np.broadcast_to(diagonal, (T, H))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    product = np.eye(n)
    for t in range(T):
        kernel = np.zeros((n, n))
        for h in range(H):
            scores = scale[t, h] * (-slopes[t, h] * (i - j) + diagonal[t, h] * (i == j))
            weights = np.where(j <= i, np.exp(scores - scores.max(axis=1, keepdims=True)), 0.0)
            kernel += weights / weights.sum(axis=1, keepdims=True) / H
        product = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * kernel) @ product
    return product[n - 1]


def test_the_toy_reads_and_writes_as_text_in_its_declared_order():
    assert iv.NAMES == ("sinks", "rotary_ratio", "tau", "logit_scale", "slope_scale", "kappa", "kappa_form",
                        "kappa_k", "ssmax_scale", "gamma", "lambda_power")
    changes = iv.parse("slope_scale=2,logit_scale=1.5,tau=0.7")
    assert [type(change).__name__ for change in changes] == ["Temperature", "LogitScale", "SlopeScale"]
    record = iv.describe(changes)
    assert record == {"tau": 0.7, "logit_scale": 1.5, "slope_scale": 2.0}
    assert iv.describe(iv.from_mapping(record)) == record
    with pytest.raises(ConfigError, match=r"^--intervene logit_scale: got 'x'; allowed: a number$"):
        iv.parse("logit_scale=x")


def test_apply_all_runs_the_toy_with_the_built_ins():
    gamma = 0.5
    changed = iv.apply_all(_model(), [LogitScale(SCALE), iv.BranchScale(gamma)])
    lambdas = gamma * LAMBDAS / (gamma * LAMBDAS + 1 - LAMBDAS)
    np.testing.assert_allclose(jaxroll.influence(changed), _oracle(SCALE, lambdas), rtol=0, atol=1e-13)
    np.testing.assert_allclose(jaxroll.influence(LogitScale(1.0).apply(_model())), _oracle(), rtol=0, atol=1e-13)


def test_rollout_intervene_reads_the_toy_from_a_yaml_file(tmp_path, capsys):
    config, changes, out = tmp_path / "model.yaml", tmp_path / "change.yaml", tmp_path / "out"
    jaxroll.save_config(_model(), config)
    changes.write_text(yaml.safe_dump({"logit_scale": SCALE.tolist()}), encoding="utf-8")
    assert main(["rollout", str(config), "--intervene", str(changes), "--out", str(out), "--no-figure"]) == 0
    assert "intervened: logit_scale=" in capsys.readouterr().out
    np.testing.assert_allclose(jaxroll.read_profile(out / "profile.csv"), _oracle(SCALE), rtol=0, atol=1e-13)
    (record,) = out.glob("intervention*.yaml")  # the record rollout writes beside profile.csv
    assert yaml.safe_load(record.read_text(encoding="utf-8")) == {"logit_scale": SCALE.tolist()}


def test_a_sweep_varies_the_toy():
    values = [0.5, 1.0, SCALE.tolist()]
    result = jaxroll.sweep(_model(), logit_scale=values, progress=False)
    for k, value in enumerate(values):
        np.testing.assert_allclose(result.profiles[k], _oracle(value), rtol=0, atol=1e-13)
    with pytest.raises(ConfigError, match=r"^axis 'scale': unknown field; allowed: one of .*, exponents, tau, "
                                          r"logit_scale, kappa, gamma, lambda_power(, \w+)*$"):  # then kernel fields other tests registered
        jaxroll.sweep(_model(), scale=[1.0], progress=False)


def test_a_sweep_applies_a_mixing_toy_on_the_krylov_path():
    """A change of lambda alone keeps the Krylov path of a model whose layers share one kernel."""
    slopes = SLOPES[0]
    kernel = jaxroll.AlibiKernel.create(num_layers=T, num_heads=H, alibi_slopes=slopes)
    model = jaxroll.RolloutModel.create(kernel=kernel, lambdas=LAMBDAS, sequence_length=N)
    powers = [0.5, 1.0, [2.0, 1.0, 0.3]]
    result = jaxroll.sweep(model, lambda_power=powers, progress=False)
    assert result.method == "krylov"
    for k, power in enumerate(powers):
        expected = _oracle(lambdas=LAMBDAS ** np.asarray(power), slopes=slopes, diagonal=0.0)
        np.testing.assert_allclose(result.profiles[k], expected, rtol=0, atol=1e-13)
    changed = iv.apply_all(model, iv.parse("lambda_power=2"))
    np.testing.assert_allclose(jaxroll.influence(changed), _oracle(lambdas=LAMBDAS**2, slopes=slopes, diagonal=0.0),
                               rtol=0, atol=1e-13)


def test_a_design_frees_the_toy_in_its_declared_box():
    designs = jaxroll.designs
    assert designs.PARAMETERS == ("tau", "logit_scale", "slope_scale", "kappa", "gamma")
    assert designs.BOXES["logit_scale"] == (0.5, 2.0) and designs.IDENTITY["logit_scale"] == 1.0
    result = jaxroll.design(_model(), "logit_scale=global", target=_oracle(1.4), loss="kl", search=8)
    scale = float(result.values["logit_scale"])
    assert abs(scale - 1.4) < 1e-4 and result.record == {"logit_scale": scale}
    np.testing.assert_allclose(result.after, _oracle(scale), rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match=r"^free logit_scale: shape 'per_layers'"):
        jaxroll.design(_model(), "logit_scale=per_layers", target="flat")


def test_the_torch_plan_asks_the_toy_for_its_step():
    transformers = pytest.importorskip("transformers")
    from jaxroll.measure.torch_plan import check

    config = transformers.BloomConfig(n_layer=T, n_head=H, hidden_size=8 * H, vocab_size=32)
    plan = check([LogitScale(SCALE), iv.BranchScale(0.5)], config)
    ((kind, values, distance),) = plan.change.steps
    assert kind == "divide" and distance is None
    np.testing.assert_array_equal(values, 1.0 / SCALE)
    np.testing.assert_array_equal(plan.gammas, np.full(T, 0.5))


def test_registration_refuses_bad_declarations_in_one_line():
    class Unnamed(iv.AbstractIntervention):
        def apply(self, model):
            return model

    class Taken(Unnamed):
        name = "tau"

    with pytest.raises(ConfigError, match=r"^Unnamed\.name: got None; allowed: an identifier"):
        iv.register_intervention(Unnamed)
    with pytest.raises(ConfigError, match=r"^Taken\.name: got 'tau'; allowed: a name and options not taken "
                                          r"\(Temperature has tau\)$"):
        iv.register_intervention(Taken)
    with pytest.raises(ConfigError, match=r"^intervention: Unnamed has no text form; allowed: SinkTokens, "):
        iv.describe([Unnamed()])


def _table(text: str) -> dict[str, list[str]]:
    """``{name: cells}`` of the markdown table whose header starts ``| name | intervention | neutral |``."""
    start = text.index("| name | intervention | neutral | design box |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _box(kind) -> str:
    return "" if kind.box is None else f"[{kind.box[0]:g}, {kind.box[1]:g}]"


@pytest.mark.parametrize("text", [(ROOT / "docs" / "interventions.md").read_text(encoding="utf-8"),
                                  iv.__doc__], ids=["docs/interventions.md", "jaxroll.interventions"])
def test_the_docs_tables_are_the_registry(text):
    built_in = [kind for kind in iv.intervention_types() if kind not in TOYS]
    rows = _table(text)
    assert list(rows) == [kind.name for kind in built_in]
    for kind in built_in:
        neutral = "" if kind.neutral is None else f"{kind.neutral:g}"
        assert rows[kind.name] == [kind.__name__, neutral, _box(kind)], kind.name


def test_the_text_and_design_docstrings_name_the_registry():
    from jaxroll.designs import parameters
    from jaxroll.interventions import spec

    named = re.findall(r"^\| ``(\w+)`` \| `(\w+)`", spec.__doc__, flags=re.MULTILINE)
    assert named == [(kind.name, kind.__name__) for kind in iv.intervention_types() if kind not in TOYS]
    boxes = dict(re.findall(r"^(\w+) +``.*``(?: \(log box\))? +``(\[.*\])``$", parameters.__doc__, flags=re.MULTILINE))
    assert boxes == {kind.name: _box(kind) for kind in iv.designable() if kind not in TOYS}
