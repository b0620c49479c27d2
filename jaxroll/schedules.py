"""Lambda schedules: the mixing coefficient ``lambda_t`` of each layer.

Layer t mixes the identity and the attention kernel,
``R_t = (1 - lambda_t) I + lambda_t A_t`` (arXiv 2602.16837), so a schedule is
one number in [0, 1] per layer, returned as an array of shape ``(T,)``.

Schedules given Python or NumPy numbers are checked and returned as float64
NumPy arrays (exact, so configurations round-trip); given JAX arrays (inside
`jax.grad`, say) they are computed with `jax.numpy` and not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._checks import as_float_array, as_float_scalar, check_positive_int, check_range, is_concrete
from .errors import ConfigError

if TYPE_CHECKING:  # annotations only: jaxtyping's Array imports JAX
    from jaxtyping import Array, Float

__all__ = ["constant", "power_decay", "custom"]


def constant(value, num_layers: int) -> Float[Array, " layers"]:
    """``lambda_t = value`` for every layer, clipped to [0, 1].

    Args:
        value: the mixing coefficient, a finite number.
        num_layers: T >= 1.

    Returns:
        An array of shape ``(T,)``.
    """
    num_layers = check_positive_int("num_layers", num_layers)
    if not is_concrete(value):
        import jax.numpy as jnp  # traced: JAX is loaded already

        return jnp.clip(jnp.full((num_layers,), value), 0.0, 1.0)
    value = as_float_scalar("lambda_const", value)
    check_range("lambda_const", value)
    return np.clip(np.full(num_layers, float(value)), 0.0, 1.0)


def power_decay(lambda_0, beta, num_layers: int) -> Float[Array, " layers"]:
    """``lambda_t = lambda_0 / (t + 1)^beta`` for t = 0..T-1, clipped to [0, 1].

    ``sum_t lambda_t`` stays finite as T grows iff ``beta > 1``: the regime in
    which the rollout does not collapse onto the first token.

    Args:
        lambda_0: the first layer's coefficient, > 0.
        beta: the decay exponent, >= 0 (``beta = 0`` is the constant schedule).
        num_layers: T >= 1.

    Returns:
        An array of shape ``(T,)``.
    """
    num_layers = check_positive_int("num_layers", num_layers)
    if not (is_concrete(lambda_0) and is_concrete(beta)):
        import jax.numpy as jnp  # traced: JAX is loaded already

        t = jnp.arange(num_layers)
        return jnp.clip(lambda_0 / (t + 1.0) ** beta, 0.0, 1.0)
    lambda_0 = as_float_scalar("lambda_0", lambda_0)
    beta = as_float_scalar("beta", beta)
    check_range("lambda_0", lambda_0, 0.0, None, low_open=True)
    check_range("beta", beta, 0.0, None)
    t = np.arange(num_layers, dtype=np.float64)
    return np.clip(float(lambda_0) / (t + 1.0) ** float(beta), 0.0, 1.0)


def custom(values) -> Float[Array, " layers"]:
    """A schedule given layer by layer; checked to lie in [0, 1], never clipped.

    Args:
        values: one coefficient per layer, each in [0, 1].

    Returns:
        An array of shape ``(T,)``.
    """
    if not is_concrete(values):
        import jax.numpy as jnp  # traced: JAX is loaded already

        return jnp.asarray(values)
    values = as_float_array("lambdas_custom", values)
    if values.ndim != 1 or values.size == 0:
        raise ConfigError(
            f"lambdas_custom: got shape {values.shape}; allowed: a non-empty list of numbers"
        )
    check_range("lambdas_custom", values, 0.0, 1.0)
    return values
