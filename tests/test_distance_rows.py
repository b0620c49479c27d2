"""``attention_distances``: the mean attention rows under distance scores at a grid of kappa, and the default
route that reads them.

Oracle: each tiny model's own eager float64 probabilities (``output_attentions``, `test_chunked_stats`'s
`dense_probabilities`), reweighted here in NumPy by ``e^{kappa g(i - j)}`` (``g`` from NumPy's ``log1p`` and
SciPy's ``gammaln``, not the library's), renormalised per row and averaged over sequences and heads.
Tolerance 1e-10 (float64 on both sides, different summation orders). Then the default route, `jaxroll measure`
-> config.yaml -> rollout under a distance score, against a NumPy rollout of those tables, on a grid kappa and
between grid kappas (the blend of docs/design.md, written again here).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import gammaln

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jaxroll  # noqa: E402
from jaxroll import interventions  # noqa: E402
from jaxroll.measure import attention_rows, measure, read_measurement, write_measurement  # noqa: E402
from jaxroll.measure.registry import DISTANCE_GRID, default_stats  # noqa: E402

from test_chunked_stats import HEADS, N, dense_probabilities, ids, tiny  # noqa: E402


def forms(n):
    """``g_f(m)`` at m = 0..n-1 for log1p and unsquash (k = 2), ``(2, n)``: NumPy and SciPy."""
    m = np.arange(n, dtype=np.float64)
    return np.stack([np.log1p(m), gammaln(m + 0.5) - gammaln(m + 1.0) - gammaln(0.5)])


def reweighted_mean(p, score, kappa):
    """``mean_{s,h} p e^{kappa g(i - j)} / sum`` of probabilities ``p`` (..., S, H, N, N) and ``g`` (N,)."""
    n = p.shape[-1]
    offsets = np.maximum(np.arange(n)[:, None] - np.arange(n)[None, :], 0)
    changed = p * np.exp(kappa * score[offsets])
    changed /= changed.sum(axis=-1, keepdims=True)
    return changed.mean(axis=(-4, -3))


def distance_tables(p):
    """``(L, F, K, N, N)`` from the probabilities ``p`` (L, S, H, N, N)."""
    scores = forms(p.shape[-1])
    return np.stack([np.stack([reweighted_mean(p, score, kappa) for kappa in DISTANCE_GRID], axis=1)
                     for score in scores], axis=1)


@pytest.mark.parametrize("family,implementation", [("llama", "sdpa"), ("gpt2", "eager"), ("qwen3", "eager")])
def test_the_tables_equal_the_reweighted_eager_rows(family, implementation, monkeypatch):
    # Chunks of 3 rows (qwen3: the hooked eager probabilities, its rows are not recomputable)
    monkeypatch.setattr(attention_rows, "CHUNK_BYTES", 8 * 2 * HEADS * N * 3)
    result = measure(tiny(family, implementation), ids(), stats=("lambda", "attention", "attention_distances"),
                     batch_size=2)
    p = dense_probabilities(tiny(family), ids())
    expected = distance_tables(p)
    np.testing.assert_allclose(result.extra["distance_rows"], expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.extra["distance_scores"], forms(N), rtol=0, atol=1e-13)
    assert list(result.extra["distance_keys"]) == ["log1p", "unsquash k=2"]
    # Not the reweighted mean: the per-sequence normalisers matter (else the statistic would be redundant).
    mean = p.mean(axis=(1, 2))[:, None]
    offsets = np.maximum(np.arange(N)[:, None] - np.arange(N)[None, :], 0)
    reweighted = mean * np.exp(-2.0 * forms(N)[0][offsets])
    reweighted /= reweighted.sum(axis=-1, keepdims=True)
    assert np.abs(expected[:, 0, 0] - reweighted[:, 0]).max() > 1e-3


def test_the_batch_size_does_not_change_the_tables():
    one, three = (measure(tiny("llama"), ids(), stats=("lambda", "attention_distances"), batch_size=b)
                  for b in (1, 3))
    np.testing.assert_allclose(one.extra["distance_rows"], three.extra["distance_rows"], rtol=0, atol=1e-13)


def test_the_default_beside_the_gain_tables():
    for position, length, layers in (("rope", 128, 6), ("learned", 362, 4), ("rope", 363, 4), ("alibi", 64, 2)):
        stats = default_stats(position, length, layers)
        assert ("attention_distances" in stats) == ("attention_gains" in stats), (position, length, layers)
    assert "attention_distances" in default_stats("rope", 128, 6)
    assert "attention_distances" in default_stats("alibi", 64, 2)  # the tables an AnchoredTableKernel reads
    assert "attention_distances" not in default_stats("alibi", 363, 4)


def _read_at(tables, base, score, kappa):
    """The blend of two neighbouring grid tables, each carried to kappa by reweighting (docs/design.md)."""
    below = sum(k < 0 for k in DISTANCE_GRID)
    grid = np.concatenate([DISTANCE_GRID[:below], [0.0], DISTANCE_GRID[below:]])
    stack = np.concatenate([tables[:below], base[None], tables[below:]])
    k = int(np.clip(np.searchsorted(grid, kappa, side="right") - 1, 0, len(grid) - 2))
    w = float(np.clip((kappa - grid[k]) / (grid[k + 1] - grid[k]), 0.0, 1.0))
    n = base.shape[-1]
    offsets = np.maximum(np.arange(n)[:, None] - np.arange(n)[None, :], 0)

    def carried(table, delta):
        out = table * np.exp(delta * score[offsets])
        return out / out.sum(axis=-1, keepdims=True)

    return (1 - w) * carried(stack[k], kappa - grid[k]) + w * carried(stack[k + 1], kappa - grid[k + 1])


def _plain_rollout(kernels, lambdas, q=1.0):
    """``(e^T |R_T|^q ... |R_1|^q)^(1/q)``: the plain layers composed with the config's exponent q."""
    row = np.zeros(kernels.shape[-1])
    row[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        row = row @ ((1 - lambdas[t]) * np.eye(len(row)) + lambdas[t] * kernels[t]) ** q
    return row ** (1 / q)


@pytest.mark.parametrize("kappa,form", [(-0.5, "log1p"), (-0.35, "log1p"), (0.7, "unsquash"), (2.6, "log1p")])
def test_the_default_route_predicts_a_distance_score_from_the_tables(tmp_path, kappa, form):
    model = tiny("llama", "sdpa")
    result = measure(model, ids(), batch_size=2)  # the default statistics
    assert "attention_distances" in result.metadata["stats"]
    write_measurement(result, tmp_path)
    rollout = jaxroll.load_config(tmp_path / "config.yaml")
    arrays = read_measurement(tmp_path).arrays
    p = dense_probabilities(tiny("llama"), ids())
    column = ["log1p", "unsquash"].index(form)
    tables, base = distance_tables(p)[:, column], p.mean(axis=(1, 2))
    kernels = np.stack([_read_at(tables[t], base[t], forms(N)[column], kappa) for t in range(len(base))])
    # At gain 1 the closed-ratio layer is the plain layer on the rows (the path's shape does not move).
    q = 1.0 if rollout.composition is None else float(rollout.composition)  # fitted by measure (test_composition)
    expected = _plain_rollout(kernels, np.clip(arrays["lambdas"], 0, 1), q)
    changed = interventions.apply_all(rollout, interventions.parse(f"kappa={kappa},kappa_form={form}"))
    np.testing.assert_allclose(np.asarray(jaxroll.influence(changed)), expected / expected.sum(), rtol=0, atol=1e-10)
    unchanged = _plain_rollout(base, np.clip(arrays["lambdas"], 0, 1), q)
    assert np.abs(expected - unchanged).max() > 1e-3  # the score moved the prediction
