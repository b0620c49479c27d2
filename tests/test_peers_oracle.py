"""jaxroll's influence is the saliency norm that captum and inseq compute (benchmarks/peers.py).

The oracle is captum's recipe written out with plain torch autograd (no
captum, no inseq, no jaxroll in it): the model's forward on input
embeddings ``e`` (1, N, d), ``f = max_v softmax(logits_p)_v`` at position p,
``torch.autograd.grad(f, e)`` and the L2 norm over d, giving ``(N,)``.
`influence_gradients` and the per-sequence norms of
``measure(..., stats=("influence",))`` must equal it to 1e-10 in float64.

GPT-2 computes in float64 end to end in transformers, so its oracle is the
model as shipped. A float64 Llama rounds to float32 inside transformers
(RMSNorm, rotary tables), which jaxroll removes (`jaxroll.measure.precision`,
checked against a forward written from the weights in
tests/test_measure_float64.py): its oracle runs under ``full_precision``
for 1e-10, and as shipped (what a captum user gets) within 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxroll.measure import influence_gradients, measure  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

VOCAB, N = 61, 24

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def _tiny(family):
    torch.manual_seed(3)
    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    else:
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").double().eval()
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(3.0)
    return model


def _ids(sequences, seed):
    return np.random.default_rng(seed).integers(0, VOCAB, (sequences, N))


def saliency_norms(model, ids, position=-1):
    """captum's Saliency on the top probability at `position`, then the L2 norm over the embedding dimension."""
    embeddings = model.get_input_embeddings()(torch.as_tensor(ids)[None]).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeddings, use_cache=False).logits[:, position]  # (1, V): every row computed
    target = torch.softmax(logits, dim=-1).max(dim=-1).values  # (1,)
    (gradient,) = torch.autograd.grad(target.sum(), embeddings)
    return gradient[0].norm(dim=-1).detach().numpy()


def _oracle(model, ids, family, position=-1):
    if family == "llama":
        with full_precision(model):
            return saliency_norms(model, ids, position)
    return saliency_norms(model, ids, position)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_influence_gradients_is_the_saliency_norm(family):
    model = _tiny(family)
    ids = _ids(1, 7)[0]
    expected = _oracle(model, ids, family)
    assert expected.shape == (N,) and np.all(expected > 0)
    np.testing.assert_allclose(influence_gradients(model, ids), expected, rtol=1e-10, atol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_influence_at_an_inner_position_is_the_saliency_norm_there(family):
    model = _tiny(family)
    ids = _ids(1, 8)[0]
    position = 15
    expected = _oracle(model, ids, family, position)
    result = influence_gradients(model, ids, position=position)
    np.testing.assert_allclose(result[:position + 1], expected[:position + 1], rtol=1e-10, atol=0)
    assert np.all(result[position + 1:] == 0.0) and np.all(expected[position + 1:] == 0.0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_measured_per_sequence_norms_are_the_saliency_norms(family):
    model = _tiny(family)
    ids = _ids(3, 9)
    result = measure(model, ids, stats=("influence",), batch_size=2)
    expected = np.stack([_oracle(model, row, family) for row in ids])
    np.testing.assert_allclose(result.influence_per_sequence, expected, rtol=1e-10, atol=0)
    mean = expected.mean(axis=0)
    np.testing.assert_allclose(result.influence, mean / mean.sum(), rtol=1e-10, atol=0)


def test_a_llama_as_shipped_differs_by_float32_rounding_only():
    # What captum and inseq get from a float64 Llama without jaxroll's float64 mode: float32 inside.
    model = _tiny("llama")
    ids = _ids(1, 10)[0]
    shipped, ours = saliency_norms(model, ids), influence_gradients(model, ids)
    difference = np.max(np.abs(shipped - ours)) / np.max(ours)
    assert 1e-12 < difference < 1e-6
