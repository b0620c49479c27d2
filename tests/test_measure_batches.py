"""Batched measurement equals one sequence at a time, row by row (float64, tiny models).

The oracle is the pass at batch size 1 (one sequence per forward and
backward, the definition of each per-sequence quantity); a batch of B rows
must give every per-sequence row and every mean to 1e-10 (float64: only the
summation order of matmuls over a different batch shape may change, ~1e-16
relative). S = 7 with B = 3 leaves a last batch of 1.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from jaxroll import ConfigError  # noqa: E402
from jaxroll.measure import measure  # noqa: E402
from jaxroll.measure.batching import choose_batch_size, sequence_bytes  # noqa: E402
from test_measure import tiny, token_ids  # noqa: E402

TOLERANCE = 1e-10
REFINEMENTS = ("attention_heads", "lambda_positions", "lambda_mlp", "norm_kernels", "head_norms", "lambda_gradient")


def _stats(family):
    base = ("lambda", "influence", "sinks", "attention") + REFINEMENTS
    return base if family in ("llama", "mistral", "qwen2") else ("content", "qk") + base


def _assert_same(one, many):
    a, b = one.arrays(), many.arrays()
    assert a.keys() == b.keys()
    for name, value in a.items():
        value, other = np.asarray(value), np.asarray(b[name])
        if value.dtype.kind in "iu":
            np.testing.assert_array_equal(value, other, err_msg=name)
        elif value.dtype.kind == "f":
            np.testing.assert_allclose(other, value, rtol=0, atol=TOLERANCE, err_msg=name)


@pytest.mark.parametrize("family", ["bloom", "gpt2", "llama"])
def test_every_statistic_is_the_same_at_batch_size_three_as_at_one(family):
    model = tiny(family)
    ids = token_ids(7, 10, seed=3)
    one = measure(model, ids, stats=_stats(family), batch_size=1)
    many = measure(model, ids, stats=_stats(family), batch_size=3)
    _assert_same(one, many)
    assert many.metadata["batch_size"] == 3
    # Per-sequence rows really differ between sequences (the comparison is not vacuous).
    assert np.ptp(one.influence_per_sequence[:, 0]) > 1e-6


@pytest.mark.parametrize("family", ["mpt", "falcon", "mistral", "qwen2"])
def test_default_statistics_are_the_same_batched_on_the_other_families(family):
    model = tiny(family)
    ids = token_ids(5, 9, seed=4)
    stats = ("lambda", "influence", "sinks") + (("content",) if family in ("mpt", "falcon") else ())
    _assert_same(measure(model, ids, stats=stats, batch_size=1), measure(model, ids, stats=stats, batch_size=2))


def test_sdpa_model_batched_equals_eager_one_at_a_time():
    # The efficient attention the loader picks for default statistics gives the same numbers.
    ids = token_ids(5, 12, seed=5)
    eager = measure(tiny("llama"), ids, stats=("lambda", "influence"), batch_size=1)
    sdpa = measure(tiny("llama", implementation="sdpa"), ids, stats=("lambda", "influence"), batch_size=4)
    # Llama's eager path takes its softmax in float32 even for a float64 model (sdpa stays in
    # float64): the two agree to float32's precision, ~1e-7 relative.
    np.testing.assert_allclose(sdpa.lambdas_per_sequence, eager.lambdas_per_sequence, rtol=1e-6)
    np.testing.assert_allclose(sdpa.influence_per_sequence, eager.influence_per_sequence, rtol=1e-5, atol=1e-9)


def test_resume_with_another_batch_size_gives_the_uninterrupted_result(tmp_path):
    model = tiny("bloom")
    ids = token_ids(7, 8, seed=6)
    stats = ("lambda", "content", "influence", "sinks")
    whole = measure(model, ids, stats=stats, batch_size=1)
    checkpoint = tmp_path / "partial.npz"
    measure(model, ids[:4], stats=stats, batch_size=3)  # warm: nothing written
    calls = []

    class Stop(Exception):
        pass

    class Bar:
        def update(self, n):
            calls.append(n)
            if sum(calls) >= 3:
                raise Stop

        def close(self):
            pass

    with pytest.raises(Stop):
        measure(model, ids, stats=stats, batch_size=3, checkpoint_path=checkpoint, progress=Bar())
    resumed = measure(model, ids, stats=stats, batch_size=2, checkpoint_path=checkpoint, resume=True)
    _assert_same(whole, resumed)


def test_batch_size_from_free_memory_is_within_bounds_and_refuses_bad_values():
    model = tiny("bloom")
    per = sequence_bytes(layers=2, hidden=32, heads=4, intermediate=128, length=100, itemsize=8, eager=True,
                         checkpointing=True, stats=("lambda", "influence"))
    assert choose_batch_size(model, 100, ("lambda", "influence"), 50, free=10 * per) == 5  # half of 10
    assert choose_batch_size(model, 100, ("lambda", "influence"), 50, free=per) == 1  # never 0
    assert choose_batch_size(model, 100, ("lambda", "influence"), 3, free=10**15) == 3  # never beyond S
    assert choose_batch_size(model, 100, ("lambda", "influence"), 500, free=10**15) == 64
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="batch_size"):
            measure(model, token_ids(2, 4), batch_size=bad)


def test_float16_model_runs_in_float16_and_agrees_with_float32_to_its_precision():
    ids = token_ids(3, 10, seed=11)
    reference = measure(tiny("llama").float(), ids, stats=("lambda", "influence"), batch_size=3)
    half = measure(tiny("llama").half(), ids, stats=("lambda", "influence"), batch_size=3)
    assert half.metadata["dtype"] == "float16"
    # float16 keeps 11 bits: 1e-2 relative covers two layers of rounding.
    np.testing.assert_allclose(half.lambdas_per_sequence, reference.lambdas_per_sequence, rtol=1e-2)
    np.testing.assert_allclose(half.influence, reference.influence, rtol=5e-2, atol=1e-3)
    assert abs(half.influence.sum() - 1) < 1e-12  # normalised in float64
