"""A kernel type defined here, outside the package, declares what it can do and registers with one call.

Then, with nothing else written anywhere: `save_config`/`load_config` carry it, a sweep varies its
declared field, a fit frees its declared field, and an operation it does not declare is refused in one
line naming the field and the type. Every number is checked against a NumPy float64 oracle written
from the kernel's definition (docs/development.md, "A new kernel type").
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import jaxroll
from jaxroll.engine.kernel import AbstractKernel
from jaxroll.engine.plan import Path
from jaxroll.kernel_types import KERNEL_TYPES, register_kernel


class UniformKernel(AbstractKernel):
    """``A_t = (1 - s_t) I + s_t U``, ``U[i, j] = 1 / (i + 1)`` for j <= i: row i keeps ``1 - s_t`` of
    its own weight and spreads ``s_t`` evenly over its prefix."""

    strength: Float[Array, " layers"]  # s_t in [0, 1], one per layer

    config_kind = "uniform"
    sweep_fields = ("strength",)
    fittable_fields = {"strength": "unit"}

    @property
    def num_layers(self):
        return self.strength.shape[0]

    @property
    def num_heads(self):
        return 1

    def row_times_kernel(self, v, path=Path()):  # v^T A in O(n): a reverse cumulative sum
        u = v / jnp.arange(1, v.shape[-1] + 1, dtype=v.dtype)
        return (1 - self.strength) * v + self.strength * jnp.cumsum(u[::-1])[::-1]

    def dense(self, n):
        i = jnp.arange(n)[:, None]
        uniform = jnp.where(jnp.arange(n)[None, :] <= i, 1.0 / (i + 1), 0.0)
        return (1 - self.strength) * jnp.eye(n) + self.strength * uniform

    def check_length(self, n):
        pass  # defined at every length

    def influence_bytes(self, n, method, itemsize):
        return (n * n + 2 * n if method == "dense" else 4 * n) * itemsize

    def check(self):
        values = np.asarray(self.strength)
        if values.ndim != 1 or not ((values >= 0) & (values <= 1)).all():
            raise jaxroll.ConfigError.of("strength", values.tolist(), "one number in [0, 1] per layer")

    def to_config(self, kernel_file=None):
        return {"kernel_config": {"kernel_type": self.config_kind,
                                  "strength": [float(x) for x in np.asarray(self.strength)]}}

    @classmethod
    def from_config(cls, config, *, num_layers, directory=None):
        kernel = cls(np.asarray(config["kernel_config"]["strength"], dtype=np.float64))
        kernel.check()
        return kernel


register_kernel(UniformKernel)

LAMBDAS = np.array([0.7, 0.4, 0.9])
STRENGTH = np.array([0.8, 0.3, 0.6])
N = 11


def _model(strength=STRENGTH, lambdas=LAMBDAS):
    return jaxroll.RolloutModel.create(kernel=UniformKernel(jnp.asarray(strength)), lambdas=lambdas,
                                       sequence_length=N)


def _oracle(strength, lambdas=LAMBDAS, n=N):
    """``p_T = e_{n-1}^T R_T ... R_1`` in NumPy float64, ``R_t = (1 - lambda_t) I + lambda_t A_t``."""
    rows = np.arange(n, dtype=np.float64)[:, None]
    uniform = np.where(np.arange(n)[None, :] <= rows, 1.0 / (rows + 1.0), 0.0)
    row = np.eye(n)[n - 1]
    for lam, s in reversed(list(zip(lambdas, strength))):
        kernel = (1.0 - s) * np.eye(n) + s * uniform
        row = row @ ((1.0 - lam) * np.eye(n) + lam * kernel)
    return row


def test_one_call_registers_the_type_by_its_name():
    assert KERNEL_TYPES["uniform"] is UniformKernel
    assert register_kernel(UniformKernel) is UniformKernel  # again: a no-op
    np.testing.assert_allclose(np.asarray(jaxroll.influence(_model())), _oracle(STRENGTH), rtol=0, atol=1e-13)


def test_save_config_and_load_config_carry_it(tmp_path):
    path = jaxroll.io.save_config(_model(), tmp_path / "uniform.yaml")
    assert "kernel_type: uniform" in path.read_text()
    loaded = jaxroll.io.load_config(path)
    assert type(loaded.kernel) is UniformKernel and loaded.sequence_length == N
    np.testing.assert_array_equal(np.asarray(loaded.kernel.strength), STRENGTH)
    np.testing.assert_array_equal(np.asarray(loaded.lambdas), LAMBDAS)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(loaded)), _oracle(STRENGTH), rtol=0, atol=1e-13)


def test_a_sweep_varies_its_declared_field():
    values = [[0.1, 0.2, 0.3], [1.0, 0.0, 0.5], 0.25]
    result = jaxroll.sweep(_model(), strength=values, progress=False)
    assert result.profiles.shape == (3, N)
    for profile, value in zip(result.profiles, values):
        strength = np.broadcast_to(np.asarray(value, dtype=np.float64), (3,))
        np.testing.assert_allclose(profile, _oracle(strength), rtol=0, atol=1e-12)
    with pytest.raises(jaxroll.ConfigError, match=r"^strength\[0\]: got \[2\.0, 2\.0, 2\.0\]; allowed: one number"):
        jaxroll.sweep(_model(), strength=[2.0], progress=False)


def test_a_fit_frees_its_declared_field():
    truth = np.array([0.2, 0.7, 0.45])
    target = _oracle(truth)
    result = jaxroll.fit(_model(), target, fit="strength", loss="l2", steps=200, restarts=1, search=0, progress=False)
    fitted = np.asarray(result.model.kernel.strength)
    assert type(result.model.kernel) is UniformKernel
    np.testing.assert_allclose(np.asarray(result.model.lambdas), LAMBDAS)  # held fixed
    np.testing.assert_allclose(_oracle(fitted), target, rtol=0, atol=1e-6)
    with pytest.raises(jaxroll.ConfigError, match=r"^fit: unknown array 'slopes'; allowed: .*strength"):
        jaxroll.fit(_model(), target, fit="slopes", progress=False)


def test_an_operation_it_does_not_declare_is_refused_in_one_line():
    with pytest.raises(jaxroll.ConfigError, match=r"^tau: a UniformKernel has no logits to temper; allowed: "
                                                   r".*AlibiKernel") as error:
        jaxroll.interventions.Temperature(0.5).apply(_model())
    assert "\n" not in str(error.value) and error.value.field == "tau"
    with pytest.raises(jaxroll.ConfigError, match=r"^axis 'alibi_slopes': not a field of a UniformKernel model"):
        jaxroll.sweep(_model(), alibi_slopes=[0.1], progress=False)


def test_a_changed_kernel_is_still_a_pytree_of_its_type():
    changed = _model().kernel.replaced(strength=np.array([0.5, 0.5, 0.5]))
    assert isinstance(changed, UniformKernel) and eqx.tree_equal(changed, UniformKernel(np.full(3, 0.5)))
