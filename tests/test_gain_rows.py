"""``attention_gains``: the mean attention rows at a grid of logit gains, and the default route that reads them.

Oracle: each tiny model's own eager float64 probabilities (``output_attentions``, `test_chunked_stats`'s
`dense_probabilities`), turned into the tables by NumPy here: ``softmax(g log alpha)`` per row (the logits are
``log alpha`` up to a row constant), averaged over sequences and heads, with the closed form's path weights.
Tolerance 1e-10 (float64 on both sides, different summation orders). Then the default route, `jaxroll measure`
-> config.yaml -> rollout under a temperature, against a NumPy closed-ratio rollout of those tables.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.measure import attention_rows, measure, read_measurement, write_measurement  # noqa: E402
from jaxroll.measure.registry import GAIN_GRID, default_stats  # noqa: E402

from test_chunked_stats import HEADS, N, dense_probabilities, ids, tiny  # noqa: E402


def _spread(a):
    """``(1 - a_j)^2 + sum_{k != j} a_k^2`` per entry, by a loop over each row's keys with the own key left out
    (float64 without the cancellation of ``1 - 2 a_j + sum_k a_k^2`` at near-one-hot rows)."""
    out = np.empty_like(a)
    n = a.shape[-1]
    for j in range(n):
        keep = np.ones(n, bool)
        keep[j] = False
        rest = a[..., keep]
        out[..., j] = rest.sum(axis=-1) ** 2 + (rest ** 2).sum(axis=-1)  # 1 - a_j = sum of the others
    return out


def gain_tables(p):
    """``(rows, weights)`` (L, G, N, N) from the probabilities ``p`` (L, S, H, N, N), in NumPy float64."""
    hidden = p == 0
    logs = np.log(np.where(hidden, 1.0, p))
    rows, weights = [], []
    for gain in GAIN_GRID:
        x = np.where(hidden, -np.inf, gain * logs)
        a = np.exp(x - x.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        c = a * np.sqrt(_spread(a))
        rows.append(a.mean(axis=(1, 2)))
        weights.append(c.mean(axis=(1, 2)))
    return np.stack(rows, axis=1), np.stack(weights, axis=1)


@pytest.mark.parametrize("family,implementation", [("llama", "sdpa"), ("gpt2", "eager"), ("qwen3", "eager")])
def test_the_tables_equal_the_tempered_eager_rows(family, implementation, monkeypatch):
    # Chunks of 3 rows (qwen3: the hooked eager probabilities, its rows are not recomputable)
    monkeypatch.setattr(attention_rows, "CHUNK_BYTES", 8 * 2 * HEADS * N * 3)
    result = measure(tiny(family, implementation), ids(), stats=("lambda", "attention", "attention_gains"),
                     batch_size=2)
    rows, weights = gain_tables(dense_probabilities(tiny(family), ids()))
    np.testing.assert_allclose(result.extra["gain_rows"], rows, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.extra["gain_weights"], weights, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.extra["gain_rows"][:, GAIN_GRID.index(1.0)], result.attention_mean,
                               rtol=0, atol=1e-12)
    assert np.abs(rows[:, 0] - rows[:, -1]).max() > 0.05  # the gains move the rows: not a comparison of constants


def test_the_batch_size_does_not_change_the_tables():
    one, three = (measure(tiny("llama"), ids(), stats=("lambda", "attention_gains"), batch_size=b) for b in (1, 3))
    for name in ("gain_rows", "gain_weights"):
        np.testing.assert_allclose(one.extra[name], three.extra[name], rtol=0, atol=1e-13)


def test_the_default_for_every_family_where_the_tables_are_small():
    assert "attention_gains" in default_stats("rope", 128, 6)
    assert "attention_gains" in default_stats("learned", 362, 4)
    assert "attention_gains" not in default_stats("rope", 363, 4)  # 2 L G N^2 8 bytes over 64 MiB
    assert "attention_gains" in default_stats("alibi", 64, 2)  # they move its ALiBi kernel (AnchoredTableKernel)
    assert "attention_gains" not in default_stats("alibi", 363, 4)


def _closed_ratio_oracle(rows, weights, lambdas, shares, gain, q=1.0):
    """The rollout at one gain inside the grid, read linearly in ln g, closed-ratio layers (docs/design.md),
    composed with the exponent q (``(e^T |R_T|^q ... |R_1|^q)^(1/q)``)."""
    logs = np.log(GAIN_GRID)
    k = np.searchsorted(logs, np.log(gain), side="right") - 1
    w = (np.log(gain) - logs[k]) / (logs[k + 1] - logs[k])
    one = GAIN_GRID.index(1.0)
    row = np.zeros(rows.shape[-1])
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        kernel = (1 - w) * rows[t, k] + w * rows[t, k + 1]
        kernel /= kernel.sum(-1, keepdims=True)
        moved = (1 - w) * weights[t, k] + w * weights[t, k + 1]
        base = weights[t, one]
        shape = rows[t, one] * np.where(base > 0, moved / np.where(base > 0, base, 1), 1)
        shape /= shape.sum(-1, keepdims=True)
        branch = (1 - shares[t]) * kernel + shares[t] * gain * shape
        total = branch.sum(-1)
        n = len(total)
        layer = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * branch) / (1 - lambdas[t] + lambdas[t] * total)[:, None]
        row = row @ layer ** q
    row = row ** (1 / q)
    return row / row.sum()


def test_the_default_route_predicts_a_temperature_from_the_tables(tmp_path):
    model = tiny("llama", "sdpa")
    result = measure(model, ids(), batch_size=2)  # the default statistics
    assert "attention_gains" in result.metadata["stats"] and "paths" in result.metadata["stats"]
    write_measurement(result, tmp_path)
    rollout = jaxroll.load_config(tmp_path / "config.yaml")
    assert type(rollout.kernel).__name__ == "GainTableKernel"
    arrays = read_measurement(tmp_path).arrays
    ratio = np.nan_to_num(np.asarray(arrays["probability_over_value"]), nan=0.0)
    rows, weights = gain_tables(dense_probabilities(tiny("llama"), ids()))
    tau = 0.75
    changed = interventions.apply_all(rollout, interventions.parse(f"tau={tau}"))
    q = 1.0 if rollout.composition is None else float(rollout.composition)  # fitted by measure (test_composition)
    expected = _closed_ratio_oracle(rows, weights, np.clip(arrays["lambdas"], 0, 1), ratio / (1 + ratio), 1 / tau, q)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(changed)), expected, rtol=0, atol=1e-10)
    unchanged = _closed_ratio_oracle(rows, weights, np.clip(arrays["lambdas"], 0, 1), ratio / (1 + ratio), 1.0, q)
    assert np.abs(expected - unchanged).max() > 1e-3  # the temperature moved the prediction
