"""Ms-PoE under grouped-query attention, as its authors' code runs it, against an oracle written here.

VITA-Group/Ms-PoE (``utils/modify_arch/llama.py``; ``mspoe_models.py`` of a
later version) rotates each query head at its own ratio ``p / r_h`` and the
keys of a key-value group once, at the ratio of the group's first query head
(``sample_rotary_emb``: ``cos[::num_key_value_groups]``). The oracle: a float64
NumPy forward from each attention's weights, q rotated at ``p / r_h``, each key
head at ``p / r_{first head of its group}``, then repeated to the query heads;
its softmax against the patched eager model's probabilities, ``W_O (A v)``
against the patched eager and SDPA outputs, and the chunked recomputation of
the rows by ``measure`` (1e-10). The head order of `ms_poe_order` against the
outlier count written here.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_patching import HEAD_DIM, HEADS, N, _attentions, _ids, _linear, _run_patched, hand_output, tiny  # noqa: E402
from test_patching_positions import _causal_softmax, _rescaled, hand_rescaled  # noqa: E402

from jaxroll.interventions import RotaryRescale, ms_poe_order, ms_poe_ratios  # noqa: E402
from jaxroll.measure import measure  # noqa: E402
from jaxroll.measure.torch_plan import check  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

# Different ratios inside each group of 2 query heads (num_key_value_heads = 2): what check used to refuse.
RATIOS = np.array([[1.2, 1.35, 1.5, 1.65], [1.65, 1.2, 1.35, 1.5]])


def test_the_tiny_model_has_grouped_queries_and_check_takes_ratios_that_differ_within_a_group():
    config = tiny("llama").config
    assert config.num_key_value_heads < config.num_attention_heads
    change = check([RotaryRescale(RATIOS)], config).change
    assert change.groups == 2
    np.testing.assert_array_equal(change.key_rotary_ratios, RATIOS[:, [0, 0, 2, 2]])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_grouped_ms_poe_matches_the_hand_written_attention(family, implementation):
    model = tiny(family, implementation)
    eager = implementation == "eager"
    inputs, outputs, probabilities = _run_patched(model, family, [RotaryRescale(RATIOS)], _ids(), eager)
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, v = hand_rescaled(attention, inputs[layer], model.config, RATIOS[layer])
        expected = _causal_softmax(q, k)
        if eager:
            np.testing.assert_allclose(probabilities[layer], expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(outputs[layer], hand_output(family, attention, expected, v), rtol=0, atol=1e-10)
        # The keys' ratio matters: rotating each key copy at its own query head's ratio is another attention.
        q_own, k_own, _ = _own_ratio_keys(attention, inputs[layer], model.config, RATIOS[layer])
        if eager:
            assert np.abs(probabilities[layer] - _causal_softmax(q_own, k_own)).max() > 1e-4


def _own_ratio_keys(attention, x, config, ratios):
    theta = config.rope_parameters["rope_theta"]
    B = x.shape[0]
    q = _linear(attention.q_proj, x).reshape(B, N, HEADS, HEAD_DIM)
    k = np.repeat(_linear(attention.k_proj, x).reshape(B, N, -1, HEAD_DIM), 2, axis=2)
    return _rescaled(q, theta, ratios), _rescaled(k, theta, ratios), None


def test_recomputed_rows_under_grouped_ms_poe_are_the_patched_attention():
    ids = _ids().numpy()
    changes = [RotaryRescale(RATIOS)]
    recomputed = measure(tiny("llama", "sdpa"), ids, stats=("attention",), interventions=changes)
    assert recomputed.metadata["attention_rows"] == "recomputed from q, k in chunks"
    model = tiny("llama", "eager")
    inputs, _, probabilities = _run_patched(model, "llama", changes, torch.as_tensor(ids), True)
    expected = []
    for layer, attention in enumerate(_attentions(model, "llama")):
        q, k, _ = hand_rescaled(attention, inputs[layer], model.config, RATIOS[layer])
        expected.append(_causal_softmax(q, k).mean(axis=(0, 1)))
    np.testing.assert_allclose(recomputed.attention_mean, np.stack(expected), rtol=0, atol=1e-10)
    np.testing.assert_allclose(recomputed.attention_mean, np.stack([p.mean(axis=(0, 1)) for p in probabilities]),
                               rtol=0, atol=1e-10)


def test_ms_poe_order_is_the_authors_outlier_ranking():
    rng = np.random.default_rng(3)
    heads, kv_heads, n, d = 4, 2, 12, 4
    q, k = rng.normal(size=(heads, n, d)) * 2, rng.normal(size=(kv_heads, n, d)) * 2
    # Oracle: the last row of the causal softmax of q . k / sqrt(d) (unrotated), k repeated per group; a
    # weight is an outlier above 3x the row mean over all n columns (1 / n on the last row).
    keys = np.repeat(k, heads // kv_heads, axis=0)
    z = np.einsum("hd,hjd->hj", q[:, -1], keys) / np.sqrt(d)
    weights = np.exp(z - z.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    outliers = (weights > 3.0 / n).mean(-1)
    order = ms_poe_order(q, k)
    assert sorted(order.tolist()) == list(range(heads))
    assert np.all(np.diff(outliers[order]) <= 0)  # most outliers first
    ratios = np.asarray(ms_poe_ratios(heads, order=order))
    np.testing.assert_allclose(ratios, (1.2 + 0.6 * np.arange(heads) / heads)[order], rtol=0, atol=1e-6)
    # Over at most max_tokens: the statistics of the first 8 tokens are those of the truncated inputs.
    np.testing.assert_array_equal(ms_poe_order(q, k, max_tokens=8), ms_poe_order(q[:, :8], k[:, :8]))
