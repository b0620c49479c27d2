"""Activation checkpointing chosen from memory (`measure(checkpointing=None)`, the default): results unchanged.

Checkpointing only trades time for memory; the default turns it on where
holding every block's activations would shrink the batch (the batching
estimate against the device's free memory), and the measured arrays are the
same either way (compared with the forced settings, to float64 rounding).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxroll.measure import batching, measure  # noqa: E402


def _tiny():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      hidden_size=16, intermediate_size=32, vocab_size=64)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").double().eval()


def test_checkpointing_is_on_only_where_memory_needs_it_and_changes_no_result(monkeypatch):
    model, ids = _tiny(), np.random.default_rng(0).integers(0, 64, (4, 12))
    stats = ("lambda", "influence", "paths")
    roomy = measure(model, ids, stats=stats, batch_size=2)
    assert roomy.metadata["activation_checkpointing"] is False  # a tiny model: every activation fits
    monkeypatch.setattr(batching, "free_bytes", lambda device: 1)  # nothing fits: one sequence without it
    tight = measure(model, ids, stats=stats, batch_size=2)
    assert tight.metadata["activation_checkpointing"] is True
    for forced in (True, False):
        run = measure(model, ids, stats=stats, batch_size=2, checkpointing=forced)
        assert run.metadata["activation_checkpointing"] is forced
        for name in ("influence_per_sequence", "lambdas_per_sequence", "path_per_sequence"):
            np.testing.assert_allclose(roomy.extra.get(name, roomy.arrays().get(name)),
                                       run.extra.get(name, run.arrays().get(name)), rtol=1e-12, equal_nan=True)
