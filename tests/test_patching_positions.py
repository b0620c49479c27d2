"""The torch side of `RotaryRescale` and `SinkTokens` against oracles written here.

Rotary rescale: a float64 NumPy forward of each attention from its own
weights (`test_patching.hand_qkv`'s projections), rotated in the test at
``p / r_h`` per head, ``angle_i = theta^(-2i/d) p / r_h`` from the config's
``rope_theta``; its softmax against the patched eager model's
probabilities, ``W_O (A v)`` against the patched SDPA output, and the
chunked row recomputation alike (1e-10 float64, 1e-6 float32).

Sinks: `measure --intervene sinks=k` against a forward and autograd written
here on a hand-built batch (the k sink ids in front of each sequence):
``||d max_v softmax(logits_{N+k-1})_v / d e_j||``, its split into the
sinks' share and the profile over the N originals renormalised (1e-10).
A task case under sinks is rescored by hand. Refusals are one line, exit 2,
before ``--out`` exists.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_patching import (HEAD_DIM, HEADS, LAYERS, N, ROTARY, VOCAB, _attentions, _ids, _linear, _np,  # noqa: E402
                           _run_patched, hand_output, snapshot, assert_same, softmax, tiny)
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

from jaxroll import ConfigError  # noqa: E402
from jaxroll.cli import main  # noqa: E402
from jaxroll.interventions import RotaryRescale, SinkTokens, parse  # noqa: E402
from jaxroll.interventions.patching import check, patch  # noqa: E402
from jaxroll.measure import measure  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

# One ratio per key-value group (2 groups of 2 query heads), different per layer.
RATIOS = {"one": 2.0, "per head": [1.5, 1.5, 0.7, 0.7], "per layer and head": [[3.0, 3.0, 1.0, 1.0],
                                                                                [0.5, 0.5, 2.5, 2.5]]}


def _rescaled(x, theta, ratios):
    """x ``(B, N, H, d)`` rotated at ``p / r_h``: ``x cos + rotate_half(x) sin`` at those angles."""
    d = x.shape[-1]
    inverse = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = (np.arange(x.shape[1])[None, :, None] / np.asarray(ratios)[:, None, None]) * inverse  # (H, N, d/2)
    angles = np.concatenate([angles, angles], -1).transpose(1, 0, 2)  # (N, H, d)
    turned = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * np.cos(angles)[None] + turned * np.sin(angles)[None]


def hand_rescaled(attention, x, config, ratios):
    """q, k rotated at p / r_h, v repeated to H heads, from the module's weights."""
    theta = config.rope_parameters["rope_theta"]
    B = x.shape[0]
    q = _linear(attention.q_proj, x).reshape(B, N, HEADS, HEAD_DIM)
    k = _linear(attention.k_proj, x).reshape(B, N, -1, HEAD_DIM)
    v = _linear(attention.v_proj, x).reshape(B, N, -1, HEAD_DIM)
    groups = HEADS // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    return _rescaled(q, theta, ratios), _rescaled(k, theta, ratios), v


def _per_layer(ratio):
    return np.broadcast_to(np.asarray(ratio, dtype=np.float64), (LAYERS, HEADS))


def _causal_softmax(q, k):
    z = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(HEAD_DIM)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    return softmax(np.where(j <= i, z, -np.inf))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(RATIOS))
def test_rotary_rescale_matches_the_hand_rotated_attention(family, implementation, name):
    model = tiny(family, implementation)
    eager = implementation == "eager"
    changes = [RotaryRescale(RATIOS[name])]
    inputs, outputs, probabilities = _run_patched(model, family, changes, _ids(), eager)
    ratios = _per_layer(RATIOS[name])
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, v = hand_rescaled(attention, inputs[layer], model.config, ratios[layer])
        expected = _causal_softmax(q, k)
        if eager:
            np.testing.assert_allclose(probabilities[layer], expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(outputs[layer], hand_output(family, attention, expected, v), rtol=0, atol=1e-10)
    # The change is visible: ratio 1 is a different forward.
    _, _, plain = _run_patched(model, family, [RotaryRescale(1.0)], _ids(), True) if eager else (0, 0, None)
    if eager:
        assert max(np.abs(p - e).max() for p, e in zip(plain, probabilities)) > 1e-3


def test_rotary_rescale_in_float32_matches_the_float64_oracle():
    model = tiny("llama", "sdpa", dtype=torch.float32)
    ratio = RATIOS["per layer and head"]
    inputs, outputs, _ = _run_patched(model, "llama", [RotaryRescale(ratio), parse("tau=0.7")[0]], _ids(), False)
    for layer, attention in enumerate(_attentions(model, "llama")):
        q, k, v = hand_rescaled(attention, inputs[layer], model.config, _per_layer(ratio)[layer])
        expected = _causal_softmax(q / 0.7, k)
        scale = np.abs(outputs[layer]).max()
        np.testing.assert_allclose(outputs[layer] / scale, hand_output("llama", attention, expected, v) / scale,
                                   rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_recomputed_rows_under_a_rotary_rescale_are_the_patched_attention(family):
    # measure under SDPA recomputes the rows from the hooked q, k: the same re-rotation as the patched eager model.
    ids = _ids().numpy()
    changes = [RotaryRescale(RATIOS["per layer and head"])]
    recomputed = measure(tiny(family, "sdpa"), ids, stats=("attention",), interventions=changes)
    assert recomputed.metadata["attention_rows"] == "recomputed from q, k in chunks"
    model = tiny(family, "eager")
    inputs, _, probabilities = _run_patched(model, family, changes, torch.as_tensor(ids), True)
    expected = []
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, _ = hand_rescaled(attention, inputs[layer], model.config, _per_layer(RATIOS["per layer and head"])[layer])
        expected.append(_causal_softmax(q, k).mean(axis=(0, 1)))
    np.testing.assert_allclose(recomputed.attention_mean, np.stack(expected), rtol=0, atol=1e-10)
    np.testing.assert_allclose(recomputed.attention_mean, np.stack([p.mean(axis=(0, 1)) for p in probabilities]),
                               rtol=0, atol=1e-10)


def test_the_model_is_bit_identical_after_a_rotary_rescale():
    model = tiny("llama", "sdpa")
    ids = _ids()
    with torch.no_grad():
        baseline = model(ids).logits
    before = snapshot(model)
    with torch.no_grad(), patch(model, parse("rotary_ratio=2,tau=0.5")):
        changed = model(ids).logits
    assert not torch.allclose(changed, baseline)
    with pytest.raises(RuntimeError), patch(model, parse("rotary_ratio=0.5")):
        raise RuntimeError("inside")
    assert_same(before, snapshot(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, baseline)


@pytest.mark.parametrize("config, text, message", [
    ("bloom", "rotary_ratio=2", "rotary_ratio: a bloom model has alibi positions"),
    ("gpt2", "rotary_ratio=2", "rotary_ratio: a gpt2 model has learned positions"),
    ("linear", "rotary_ratio=2", "rotary_ratio: rope_scaling type 'linear' is not supported"),
    ("llama", "rotary_ratio=[1,2,1,1]", "rotary_ratio: layer 0 gives different ratios to the query heads of key"),
    ("qwen3", "rotary_ratio=2", "rotary_ratio: the qwen3 family's rotary module is not mapped"),
])
def test_check_refuses_a_rotary_rescale_it_cannot_apply(tmp_path, config, text, message):
    T = transformers
    config = {"bloom": lambda: T.BloomConfig(n_layer=2, n_head=4, hidden_size=16, vocab_size=VOCAB),
              "gpt2": lambda: T.GPT2Config(n_layer=2, n_head=4, n_embd=16, vocab_size=VOCAB),
              "linear": lambda: T.LlamaConfig(**ROTARY, rope_scaling={"rope_type": "linear", "factor": 2.0}),
              "llama": lambda: T.LlamaConfig(**ROTARY),
              "qwen3": lambda: T.Qwen3Config(**ROTARY, head_dim=4)}[config]()
    if "[" in text:
        path = tmp_path / "ratios.yaml"
        path.write_text("rotary_ratio: [1, 2, 1, 1]\n")
        text = str(path)
    with pytest.raises(ConfigError, match=message) as refused:
        check(parse(text), config)
    assert "\n" not in str(refused.value)
