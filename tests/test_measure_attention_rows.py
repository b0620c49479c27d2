"""Attention rows recomputed in chunks from hooked q, k equal each family's eager probabilities.

The oracle is the model's own eager attention (``output_attentions``),
float64 models; the recomputation sees only the hooked projections (and, for
rotary families, the rotary module's cos/sin). Tolerance 1e-6: the eager
paths take their softmax in float32 even in a float64 model. Chunks of 3
rows of N = 11 leave a last chunk of 2; chunked rows equal the one-chunk rows
to 1e-15 and every row sums to 1 to 1e-12.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from jaxroll.measure.attention_rows import (RotaryCapture, key_bias, probability_rows, row_chunks,  # noqa: E402
                                            sliding_window)
from jaxroll.measure.hooks import Hooks  # noqa: E402
from jaxroll.measure.layer_maps import resolve  # noqa: E402
from test_measure import tiny, token_ids  # noqa: E402

CASES = [("bloom", "once", {}), ("mpt", "once", {}), ("falcon", "once", {}), ("falcon", "doubled", {}),
         ("gpt2", "once", {}), ("llama", "once", {}), ("mistral", "once", {"sliding_window": 4}),
         ("mistral", "once", {}), ("qwen2", "once", {})]


def _captured(model, resolved, ids, falcon_alibi):
    seen = {}
    hooks = Hooks(resolved, model.config,
                  on_query_key=lambda layer, q, k: seen.__setitem__(("qk", layer), (q, k)),
                  on_probabilities=lambda layer, p: seen.__setitem__(("p", layer), p),
                  zero_falcon_alibi=resolved.layer_map.name == "falcon" and falcon_alibi == "once")
    rotary = RotaryCapture(model, resolved) if resolved.layer_map.rotary else None
    with hooks, torch.no_grad():
        if rotary is not None:
            with rotary:
                model(torch.as_tensor(ids), use_cache=False)
            seen["rotary"] = (rotary.cos, rotary.sin)
        else:
            model(torch.as_tensor(ids), use_cache=False)
    return seen


@pytest.mark.parametrize("family,falcon_alibi,extra", CASES)
def test_recomputed_rows_equal_the_eager_probabilities(family, falcon_alibi, extra):
    from jaxroll.measure.attention_rows import rotate

    model = tiny(family, **extra)
    resolved = resolve(model)
    ids = token_ids(2, 11, seed=7)
    seen = _captured(model, resolved, ids, falcon_alibi)
    scale = float(resolved.layer_map.logit_scale(model.config, resolved.head_dim))
    bias = key_bias(model, resolved, ids.shape[1], falcon_alibi)
    window = sliding_window(model.config, resolved.layer_map.name)
    assert (window == 4) == ("sliding_window" in extra)
    for layer in range(len(resolved.blocks)):
        q, k = seen[("qk", layer)]
        if "rotary" in seen:
            q, k = rotate(q, *seen["rotary"]), rotate(k, *seen["rotary"])
        whole = probability_rows(q, k, scale=scale, bias=bias, window=window)
        chunks = torch.cat([rows for _, rows in row_chunks(q, k, scale=scale, bias=bias, window=window, chunk=3)],
                           dim=2)
        np.testing.assert_allclose(chunks.numpy(), whole.numpy(), rtol=0, atol=1e-15)
        np.testing.assert_allclose(whole.sum(-1).numpy(), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(whole.numpy(), seen[("p", layer)].numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama", "falcon", "mistral"])
def test_sinks_and_attention_on_sdpa_equal_the_eager_measurement(family):
    from jaxroll.measure import measure

    ids = token_ids(5, 12, seed=8)
    stats = ("lambda", "influence", "sinks", "attention")
    extra = {"sliding_window": 5} if family == "mistral" else {}
    eager = measure(tiny(family, **extra), ids, stats=stats, batch_size=1)
    sdpa = measure(tiny(family, implementation="sdpa", **extra), ids, stats=stats, batch_size=2)
    # Both recompute their rows from q, k (issue 55: the eager path too, where the logit is stated exactly);
    # the eager model's own probabilities are the oracle of tests/test_chunked_stats.py.
    assert sdpa.metadata["attention_rows"] and eager.metadata["attention_rows"]
    for name in ("sink_received", "sink_first_share", "sink_rate_first_per_sequence"):
        np.testing.assert_allclose(sdpa.extra[name], eager.extra[name], rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(sdpa.attention_mean, eager.attention_mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(sdpa.lambdas_per_sequence, eager.lambdas_per_sequence, rtol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_refinement_kernels_on_sdpa_equal_the_eager_measurement(family):
    from jaxroll.measure import measure

    ids = token_ids(3, 10, seed=9)
    stats = ("lambda", "attention_heads", "norm_kernels", "head_norms")
    eager = measure(tiny(family), ids, stats=stats, batch_size=1)
    sdpa = measure(tiny(family, implementation="sdpa"), ids, stats=stats, batch_size=2)
    assert sdpa.metadata["attention_rows"]
    for name in ("attention_heads", "norm_kernels", "head_norms"):
        np.testing.assert_allclose(sdpa.extra[name], eager.extra[name], rtol=1e-6, atol=1e-6, err_msg=name)
