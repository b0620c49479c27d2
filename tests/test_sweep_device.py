"""Sweeps on the device (issue 33): coefficients under jit, chunks sized to the device, streamed profiles.

Oracles: the polynomial ``prod_t ((1 - lambda_t) + lambda_t x)`` expanded by
NumPy's own polynomial product (an independent float64 formula), the host
formula `polynomial_coefficients`, and the in-memory sweep for the streamed
one (the same chunks, so equal bit for bit).
"""

import types

import numpy as np
import pytest
from numpy.polynomial import polynomial

import jax

import jaxroll
from jaxroll.sweeps import evaluate, plan
from sweep_models import content_model, uniform_model


def test_device_coefficients_equal_the_expanded_polynomial():
    """1e-12 against NumPy's polymul of the T = 70 factors ``(1 - lambda_t) + lambda_t x``: both
    are sums of products of numbers in [0, 1], 70 steps of rounding."""
    lambdas = np.random.default_rng(0).uniform(0.0, 1.0, (257, 70))
    lambdas[:3] = np.array([0.0, 1.0, 0.5])[:, None]  # the identity, pure attention, a constant
    device = np.asarray(evaluate.device_coefficients(lambdas))
    with jax.enable_x64(False):  # the float64 entry point, whatever the JAX default
        np.testing.assert_array_equal(evaluate.polynomial_coefficients(lambdas), device)
    for row, weights in zip(device, lambdas):
        expanded = np.ones(1)
        for weight in weights:
            expanded = polynomial.polymul(expanded, [1.0 - weight, weight])
        expanded = np.pad(expanded, (0, row.size - expanded.size))  # polymul trims trailing zeros
        np.testing.assert_allclose(row, expanded, rtol=0, atol=1e-12)
    assert np.all(device >= 0) and np.allclose(device.sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("make_model, axes", [
    (uniform_model, {"lambda_0": [0.2, 0.5, 0.9], "beta": [0.5, 1.5]}),
    (content_model, {"temperature": [0.5, 1.0, 2.0]}),
])
def test_streamed_sweep_equals_the_in_memory_one(tmp_path, make_model, axes):
    model = make_model()
    kept = jaxroll.sweep(model, **axes, lengths=[7, 24], batch_size=2, progress=False)
    path = tmp_path / "profiles.npy"
    streamed = jaxroll.sweep(model, **axes, lengths=[7, 24], batch_size=2, progress=False, stream_to=path)
    assert isinstance(streamed.profiles, np.memmap) and streamed.profiles.shape == kept.profiles.shape
    np.testing.assert_array_equal(streamed.profiles, kept.profiles)
    np.testing.assert_array_equal(np.load(path).reshape(kept.profiles.shape), kept.profiles)
    assert streamed.table.keys() == kept.table.keys()
    for name in kept.table:
        np.testing.assert_array_equal(streamed.table[name], kept.table[name])


def test_streaming_refuses_an_existing_file(tmp_path):
    path = tmp_path / "mine.npy"
    path.write_text("keep")
    with pytest.raises(jaxroll.ConfigError, match=r"^stream_to: .*mine\.npy exists; allowed: a new \.npy file"):
        jaxroll.sweep(uniform_model(), lambda_0=[0.5], beta=[1.0], progress=False, stream_to=path)
    assert path.read_text() == "keep"


def test_table_statistics_match_the_metrics_of_each_profile():
    """The device-side statistics against `jaxroll.metrics.shape_statistics` of the returned profiles."""
    result = jaxroll.sweep(content_model(), temperature=[0.5, 2.0], lengths=[5, 24], progress=False)
    for row in range(4):
        point, position = divmod(row, 2)
        n = result.lengths[position]
        shape = jaxroll.metrics.shape_statistics(result.profiles[point, position, :n])
        for name in ("first", "last", "center_of_mass", "first_mass", "middle_mass", "last_mass", "u_index"):
            np.testing.assert_allclose(result.table[name][row], float(getattr(shape, name)), rtol=1e-12,
                                       atol=1e-15, equal_nan=True)
        assert result.table["argmin"][row] == int(shape.argmin)


class _Device:
    def __init__(self, platform, stats):
        self.platform, self._stats = platform, stats

    def memory_stats(self):
        return self._stats


def _mesh(*devices):
    return types.SimpleNamespace(devices=np.array(devices, dtype=object))


def test_chunk_budget_comes_from_the_device_memory():
    gpu = _Device("gpu", {"bytes_limit": 100 * 2**30, "bytes_in_use": 20 * 2**30})
    small = _Device("gpu", {"bytes_limit": 50 * 2**30, "bytes_in_use": 10 * 2**30})
    assert plan.chunk_budget("vmap", _mesh(gpu)) == int(plan.DEVICE_FRACTION * 80 * 2**30)
    # Several devices: the smallest one's free memory, on each of them.
    assert plan.chunk_budget("krylov", _mesh(gpu, small)) == 2 * int(plan.DEVICE_FRACTION * 40 * 2**30)
    # A device that reports nothing: the documented default, per device.
    assert plan.chunk_budget("vmap", _mesh(_Device("tpu", None))) == plan.MEMORY_BUDGET
    # The CPU: the cache heuristic on the vmap path only.
    cpu = _Device("cpu", {"bytes_limit": 2**40})
    assert plan.chunk_budget("vmap", _mesh(cpu)) == plan.VMAP_WORKING_SET
    assert plan.chunk_budget("krylov", _mesh(cpu)) == plan.KRYLOV_WORKING_SET
