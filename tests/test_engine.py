"""The engine's extension point: a kernel type written in this file alone runs everywhere.

`BlendKernel` below is the recipe of docs/development.md ("A new kernel
type"): an `AbstractKernel` subclass with the four declared methods and
nothing registered. Influence (structured and dense), the rollout matrix,
`jax.grad` and a sweep must all run on it and agree with a NumPy float64
oracle written here (dense matrices, layer by layer) and with central finite
differences. Also: the house rules issue 42 set (one model type, the
planner's paths, no model-type forks).
"""

import ast
from pathlib import Path as FilePath

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import jaxroll
from jaxroll.engine.kernel import AbstractKernel
from jaxroll.engine.plan import Path, plan

PACKAGE = FilePath(__file__).resolve().parent.parent / "jaxroll"


class BlendKernel(AbstractKernel):
    """``A_t = beta_t I + (1 - beta_t) U`` with U causal uniform, ``U[i, j] = 1 / (i + 1)`` for j <= i.

    ``(v^T U)_j = sum_{i >= j} v_i / (i + 1)``: a reverse cumulative sum, O(n).
    """

    betas: Float[Array, " layers"]

    @property
    def num_layers(self) -> int:
        return self.betas.shape[0]

    @property
    def num_heads(self) -> int:
        return 1

    def row_times_kernel(self, v, path: Path = Path()):
        scaled = v / jnp.arange(1, v.shape[-1] + 1, dtype=v.dtype)
        uniform = jnp.cumsum(scaled[::-1])[::-1]
        return self.betas * v + (1.0 - self.betas) * uniform

    def dense(self, n: int):
        rows = jnp.arange(n)
        uniform = jnp.where(rows[None, :] <= rows[:, None], 1.0 / (rows[:, None] + 1.0), 0.0)
        return self.betas * jnp.eye(n) + (1.0 - self.betas) * uniform

    def check_length(self, n: int) -> None:
        del n

    def influence_bytes(self, n: int, method: str, itemsize: int) -> int:
        return (3 * n if method != "dense" else 3 * n * n) * itemsize


LAMBDAS = np.array([0.3, 0.8, 0.55])
BETAS = np.array([0.1, 0.6, 0.25])
N = 13


def _model(lambdas=LAMBDAS, betas=BETAS, n=N):
    return jaxroll.RolloutModel.create(kernel=BlendKernel(jnp.asarray(betas)), lambdas=lambdas, sequence_length=n)


def _oracle_matrix(lambdas, betas, n):
    """``P_T = R_T ... R_1`` in NumPy float64 from the kernel's definition."""
    rows = np.arange(n)
    uniform = np.where(rows[None, :] <= rows[:, None], 1.0 / (rows[:, None] + 1.0), 0.0)
    product = np.eye(n)
    for weight, beta in zip(lambdas, betas):
        kernel = beta * np.eye(n) + (1.0 - beta) * uniform
        product = ((1.0 - weight) * np.eye(n) + weight * kernel) @ product
    return product


def test_a_kernel_in_a_test_file_runs_influence_and_the_rollout_matrix():
    """Structured and dense influence and P_T equal the oracle to 1e-13 (float64, sums of 13 terms)."""
    model = _model()
    expected = _oracle_matrix(LAMBDAS, BETAS, N)
    for method in ("auto", "dense"):
        p = np.asarray(jaxroll.influence(model, method=method))
        np.testing.assert_allclose(p, expected[-1] / expected[-1].sum(), rtol=0, atol=1e-13)
        assert abs(p.sum() - 1.0) < 1e-12
    np.testing.assert_allclose(np.asarray(jaxroll.rollout_matrix(model)), expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(jaxroll.rollout_row(model, jnp.eye(N)[5])), expected[5], rtol=0,
                               atol=1e-13)
    assert plan(model, N).checkpoint  # the default path checkpoints a product with no VJP of its own


def test_a_kernel_in_a_test_file_has_gradients_matching_finite_differences():
    """d p[0] / d(lambdas, betas) by `jax.grad` against central differences of the oracle (step 1e-6, 1e-8)."""
    model = _model()
    gradient = jax.grad(lambda m: jaxroll.influence(m)[0])(model)
    step = 1e-6
    for name, values, got in (("lambdas", LAMBDAS, gradient.lambdas), ("betas", BETAS, gradient.kernel.betas)):
        for index in range(len(values)):
            moved = []
            for sign in (1, -1):
                changed = values.copy()
                changed[index] += sign * step
                lambdas, betas = (changed, BETAS) if name == "lambdas" else (LAMBDAS, changed)
                row = _oracle_matrix(lambdas, betas, N)[-1]
                moved.append(row[0] / row.sum())
            assert abs(float(got[index]) - (moved[0] - moved[1]) / (2 * step)) < 1e-8, (name, index)


@pytest.mark.parametrize("betas, method", [(BETAS, "vmap"), (np.full(3, 0.4), "krylov")])
def test_a_kernel_in_a_test_file_sweeps_its_lambdas(betas, method):
    """A sweep over constant schedules at two lengths equals the oracle's last rows (1e-12), on the
    vmap path and (every layer the same kernel) the Krylov path."""
    result = jaxroll.sweep(_model(betas=betas), lambdas=[0.2, 0.9], lengths=[7, N])
    assert result.method == method
    profiles = np.asarray(result.profiles)  # (points, lengths, N)
    for k, value in enumerate((0.2, 0.9)):
        for l, n in enumerate((7, N)):
            row = _oracle_matrix(np.full(3, value), betas, n)[-1]
            np.testing.assert_allclose(profiles[k, l, :n], row / row.sum(), rtol=0, atol=1e-12)


def test_memory_asks_the_kernel():
    model = _model()
    assert jaxroll.memory.model_influence_bytes(model, 1000, "auto", 8) == 3 * 1000 * 8
    assert jaxroll.memory.model_influence_bytes(model, 1000, "dense", 8) == 3 * 1000 * 1000 * 8


def test_a_kernel_must_declare_the_interface():
    """A subclass that leaves a declared method out cannot be built."""

    class Incomplete(AbstractKernel):
        betas: Float[Array, " layers"]

        @property
        def num_layers(self) -> int:
            return 1

        @property
        def num_heads(self) -> int:
            return 1

    with pytest.raises(TypeError, match="abstract"):
        Incomplete(jnp.zeros(1))


def test_one_model_type_reads_the_alibi_fields_and_the_old_name():
    """`RolloutModel.create(alibi_slopes=...)` holds an `AlibiKernel`; the fields read through the model."""
    model = jaxroll.RolloutModel.create(num_layers=2, num_heads=4, lambdas=0.5, diagonal_scores=0.3)
    assert isinstance(model.kernel, jaxroll.AlibiKernel)
    assert jaxroll.KernelRolloutModel is jaxroll.RolloutModel
    np.testing.assert_array_equal(np.asarray(model.alibi_slopes[0]), jaxroll.alibi_slopes(4))
    assert float(model.temperature) == 1.0 and model.mask == "causal" and model.window is None
    gradient = jax.grad(lambda m: jaxroll.influence(m, 32)[-1])(model)
    assert gradient.alibi_slopes.shape == (2, 4) and gradient.temperature.shape == ()
    with pytest.raises(AttributeError, match="alibi_slopes: a field of the ALiBi"):
        _ = _model().alibi_slopes


def test_the_planner_picks_the_alibi_paths_from_concrete_arrays_only():
    shared = jaxroll.presets.get("mpt-7b")  # one kernel in every layer
    assert plan(shared, 256).shared_kernel and not plan(shared, 2048).shared_kernel
    assert plan(shared, 2048).shared_slopes
    assert plan(shared, 256, "dense") == Path(method="dense", checkpoint=True)
    traced = []
    jax.jit(lambda m: traced.append(plan(m, 256)) or 0.0)(shared)
    assert not traced[0].shared_kernel and not traced[0].shared_slopes


def _model_type_checks() -> list[str]:
    """``isinstance(x, <a model type>)`` calls in the package, as ``file:line``."""
    names = {"RolloutModel", "KernelRolloutModel"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                    and len(node.args) == 2):
                continue
            types = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(getattr(t, "id", getattr(t, "attr", None)) in names for t in types):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_at_most_three_model_type_checks_remain():
    """Issue 42: no forks on model type; the one check lives in `jaxroll.model.is_model`."""
    found = _model_type_checks()
    assert 1 <= len(found) <= 3, found


def test_the_layer_step_is_written_once():
    """``(1 - weight) * x + weight * ...`` appears only in `jaxroll.engine.step` (the sweep's polynomial
    coefficients, a product of ``(1 - lambda) + lambda x`` over layers, are another formula)."""
    pattern = "(1.0 - weight) * "
    owners = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if pattern in path.read_text())
    assert owners == ["engine/step.py"], owners
