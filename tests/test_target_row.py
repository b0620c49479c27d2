"""`influence_gradients` computes the last block's attention at the target row only (`jaxroll.measure.target_row`).

The oracle is the saliency norm with every row of every block computed:
plain torch autograd on the input embeddings ``e`` (1, N, d) of the model as
called by a user, ``f = max_v softmax(logits_p)_v``, ``||df/de_j||_2`` (the
recipe of tests/test_peers_oracle.py), under ``full_precision`` so that both
sides compute in float64 (checked against a forward written from the weights
in tests/test_measure_float64.py). Narrowing the last block to row p must not
change the gradient beyond rounding (1e-12 relative), on every family that
runs sdpa attention, at the last position and at an inner one; and the
narrowing must really happen: the last layer's attention gets fewer than N
query rows, every other layer all N.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_families import N, tiny  # noqa: E402

from jaxroll.measure import influence_gradients  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402
from jaxroll.measure.target_row import last_block_at_row  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

# The families of tests/test_families.py whose transformers attention runs on sdpa (gemma2 refuses it:
# softcapping; bloom, mpt and falcon build their scores themselves).
SDPA_FAMILIES = ["gpt2", "opt", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma3_text",
                 "phi3", "olmo2", "stablelm", "starcoder2"]


def _saliency_every_row(model, ids, position):
    with full_precision(model):
        embeddings = model.get_input_embeddings()(torch.as_tensor(ids)[None]).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, position]  # (V,): all N rows computed
        (gradient,) = torch.autograd.grad(torch.softmax(logits, dim=-1).max(), embeddings)
    return gradient[0].norm(dim=-1).detach().numpy()


@pytest.mark.parametrize("family", SDPA_FAMILIES)
def test_the_last_block_at_the_target_row_gives_the_gradient_of_every_row(family, monkeypatch):
    model = tiny(family)
    model.set_attn_implementation("sdpa")
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, N)
    rows = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(query, *args, **kwargs):
        rows.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    layers = model.config.num_hidden_layers
    for position in (-1, 3):
        expected = _saliency_every_row(model, ids, position)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
        got = influence_gradients(model, ids, position=position)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
        assert np.max(np.abs(got - expected)) <= 1e-12 * np.max(expected)
        assert np.all(got[position % N + 1:] == 0) and np.max(got) > 0  # causal: nothing after the target
        # One call per layer: all N query rows but in the last (1 row; grouped queries packed by
        # transformers into (kv heads, group) for a single query under a mask: the group size).
        assert rows[:-1] == [N] * (layers - 1) and rows[-1] < N
        rows.clear()


def test_the_interface_entry_comes_back_after_an_error_and_other_modules_fall_through():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = tiny("llama")
    model.set_attn_implementation("sdpa")
    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    assert "sdpa" not in local
    first, last = model.model.layers[0].self_attn, model.model.layers[-1].self_attn
    with pytest.raises(RuntimeError):
        with last_block_at_row(model, last, -1, N):
            assert "sdpa" in local
            q = torch.randn(1, 4, N, 8, dtype=torch.float64)
            # Another module's call is the full attention, the same as transformers' own entry.
            full, _ = local["sdpa"](first, q, q, q, None, scaling=0.5)
            expected, _ = ALL_ATTENTION_FUNCTIONS._global_mapping["sdpa"](first, q, q, q, None, scaling=0.5)
            assert torch.equal(full, expected)
            narrowed, _ = local["sdpa"](last, q, q, q, None, scaling=0.5)
            assert torch.equal(narrowed[:, :-1], torch.zeros_like(narrowed[:, :-1]))
            assert torch.allclose(narrowed[:, -1], expected[:, -1], rtol=1e-13, atol=0)
            raise RuntimeError("inside")
    assert "sdpa" not in local
    sentinel = object()
    local["sdpa"] = sentinel  # an entry someone else put there comes back as it was
    try:
        with last_block_at_row(model, last, -1, N):
            assert local["sdpa"] is not sentinel
        assert local["sdpa"] is sentinel
    finally:
        del local["sdpa"]


@pytest.mark.parametrize("family, spec", [("llama", "tau=0.5,kappa=1,ssmax_scale=1.2,gamma=0.3,rotary_ratio=2"),
                                          ("gpt2", "tau=0.5,kappa=1,ssmax_scale=1.2,gamma=0.3")])
def test_under_an_intervention_the_single_row_is_still_row_p(family, spec):
    # patching.py's wrapper reads a single query as the last of its keys (a decoding step), which is row p
    # here; its row-dependent terms (SSMax's ln n_i, the distance bias, the rotary re-rotation) must match.
    from jaxroll.interventions import parse
    from jaxroll.measure.patching import patch

    model = tiny(family)
    model.set_attn_implementation("sdpa")
    ids = np.random.default_rng(5).integers(0, model.config.vocab_size, N)
    for position in (-1, 4):
        with patch(model, parse(spec)):
            got = influence_gradients(model, ids, position=position)
            expected = _saliency_every_row(model, ids, position)
        assert np.max(np.abs(got - expected)) <= 1e-12 * np.max(expected)
