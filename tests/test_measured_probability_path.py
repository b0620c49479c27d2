"""The default route's extended layer: a measurement with ``paths`` gives a config whose layers carry the
probability path (shares ``r / (1 + r)``), neutral at the measured setting, moved by a temperature.

Oracle: a NumPy float64 rollout of the ALiBi + content kernel written here, with the share form of
docs/design.md ("The probability path") written out: ``W = 1 - rho + rho / tau``,
``R(i, :) = ((1 - lambda) e_i + lambda W A(i, :)) / (1 - lambda + lambda W)``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.measure import measure, read_measurement, write_measurement  # noqa: E402

VOCAB, HEADS, HIDDEN, LENGTH, SEQUENCES = 64, 2, 8, 6, 3


def _tiny_bloom():
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=2, n_head=HEADS, hidden_size=HIDDEN, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
    return model.double().eval()


def _oracle(arrays, tau: float, q: float = 1.0) -> np.ndarray:
    """Last row of the extended rollout in NumPy float64, from the measured arrays alone, composed with the
    exponent q (``(e^T |R_T|^q ... |R_1|^q)^(1/q)``, normalised)."""
    n = LENGTH
    slopes = np.asarray(arrays["alibi_slopes_logit"], dtype=np.float64)
    scale = float(arrays["logit_scale"])
    diagonal = scale * np.asarray(arrays["content_diagonal"], dtype=np.float64)  # (L, H)
    ratio = np.asarray(arrays["probability_over_value"], dtype=np.float64)
    shares = ratio / (1.0 + ratio)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    row = np.zeros(n)
    row[-1] = 1.0
    lambdas = np.clip(arrays["lambdas"], 0.0, 1.0)
    for t in reversed(range(len(lambdas))):  # e^T R_T ... R_1: the last layer first
        lam = lambdas[t]
        kernel = np.zeros((n, n))
        for h in range(HEADS):
            logits = (-slopes[h] * (i - j) + diagonal[t, h] * (i == j)) / tau
            logits = np.where(j <= i, logits, -np.inf)
            a = np.exp(logits - logits.max(axis=1, keepdims=True))
            kernel += a / a.sum(axis=1, keepdims=True) / HEADS
        weight = 1.0 - shares[t] + shares[t] / tau
        layer = ((1.0 - lam) * np.eye(n) + lam * weight * kernel) / (1.0 - lam + lam * weight)
        row = row @ layer ** q
    row = row ** (1 / q)
    return row / row.sum()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    ids = np.random.default_rng(0).integers(0, VOCAB, (SEQUENCES, LENGTH))
    result = measure(_tiny_bloom(), ids, stats=("lambda", "content", "influence", "paths"))
    out = tmp_path_factory.mktemp("measured")
    write_measurement(result, out)
    return out, read_measurement(out).arrays


def test_the_config_carries_shares_r_over_one_plus_r(measured):
    out, arrays = measured
    ratio = np.asarray(arrays["probability_over_value"], dtype=np.float64)
    model = jaxroll.load_config(out / "config.yaml")
    # Read back from YAML: the shares as written, every digit of the float64 r / (1 + r).
    np.testing.assert_allclose(np.asarray(model.probability_shares), ratio / (1.0 + ratio), rtol=0, atol=1e-15)
    assert np.all(ratio > 0)


@pytest.mark.parametrize("tau", [1.0, 0.7, 1.5])
def test_the_measured_config_predicts_as_the_share_form(measured, tau):
    out, arrays = measured
    model = jaxroll.load_config(out / "config.yaml")  # float64: tests/conftest.py enables x64
    changed = interventions.apply_all(model, [interventions.Temperature(tau)]) if tau != 1.0 else model
    predicted = np.asarray(jaxroll.influence(changed), dtype=np.float64)
    q = 1.0 if model.composition is None else float(model.composition)  # fitted by measure (test_composition)
    # float64 end to end: the oracle and the engine differ by summation order only.
    np.testing.assert_allclose(predicted, _oracle(arrays, tau, q), rtol=0, atol=1e-12)


def test_a_temperature_moves_the_extended_prediction_differently_from_the_plain_one(measured):
    out, arrays = measured
    plain = dict(arrays)
    plain["probability_over_value"] = np.zeros_like(np.asarray(arrays["probability_over_value"]))
    extended, today = _oracle(arrays, 0.7), _oracle(plain, 0.7)
    assert np.abs(extended - today).max() > 1e-4  # the shares matter under a temperature
    np.testing.assert_allclose(_oracle(arrays, 1.0), _oracle(plain, 1.0), rtol=0, atol=1e-14)  # and not without
