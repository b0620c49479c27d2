"""The package's one Adam: the optimiser that the fits of `jaxroll.fitting` and `jaxroll.theory` share.

It sits below both packages, so that a closed-form theory fitted beside the
rollout (`jaxroll.theory.two_theories`) needs nothing from `jaxroll.fitting`.
"""

from __future__ import annotations

import optax

__all__ = ["cosine_adam"]


def cosine_adam(steps: int, learning_rate: float, final_fraction: float = 0.0) -> optax.GradientTransformation:
    """``optax.adam`` whose learning rate decays along a half cosine over `steps`.

    The package's one Adam (`jaxroll.fitting.default_optimizer`, the Adam of
    `jaxroll.fitting.kernel_fit.fit_kernel`, the fits of
    `jaxroll.theory.two_theories`). At update ``k``, with ``r`` the
    `learning_rate` and ``a`` the `final_fraction`,

        r_k = r ((1 - a) (1 + cos(pi min(k, steps) / steps)) / 2 + a),

    from ``r`` at ``k = 0`` down to ``a r`` at ``k = steps`` and held there
    (``optax.cosine_decay_schedule(r, steps, alpha=a)``); Adam's other
    constants are optax's defaults (``b1 = 0.9``, ``b2 = 0.999``, ``eps = 1e-8``).
    """
    return optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=final_fraction))
