"""Compiling less: pad models to shared shapes, so nearby shapes share one program.

`jax.jit` compiles `jaxroll.influence` once per shape: per number of layers
T, heads H, sequence length n, mask and window. Values never recompile
(models that differ only in lambdas, slopes, content or weights share a
program). Two exact identities let nearby shapes share one too:

- a layer with ``lambda = 0`` is the identity, ``R = (1 - 0) I + 0 A = I``,
  so appending such layers to the end of the stack changes nothing: the
  scan from layer T down to layer 1 starts with ``e^T I = e^T`` (the padded
  layers copy the last real layer's kernel, so ``0 * (e^T A)`` is an exact
  zero, never ``0 * inf``);
- a head with weight ``w = 0`` drops out of the mixture
  ``A = sum_h w_h A_h / sum_h w_h`` (the padded heads copy head 0 of their
  layer, finite).

`pad` appends such layers and heads up to ``bucket(T)`` and ``bucket(H)``,
the next number of the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96,
128, ... (``2^k`` and ``3 * 2^(k-1)``: at most 50% padding). The paper
authors' 33 published configurations then need 4 programs, not 6 shapes'
worth (and not 33, one per file, as a compile per call would). Padding is
exact in exact arithmetic; in floating point the head sums add exact zeros,
so padded and unpadded profiles agree to rounding (tests/test_bucket.py:
1e-12 in float64). Padding costs at most 1.5 x 1.5 the work, which is what
a compilation costs at small n: `influence_with_mass` pads when the work
``T H n`` is at most `SMALL_WORK` and runs the model as it is otherwise.

A model over a kernel without a padding rule (`AbstractKernel.padded` is
None: every kernel type but ALiBi + content) is run as it is.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .model import RolloutModel

__all__ = ["SMALL_WORK", "bucket", "pad", "influence_with_mass"]

# T * H * n up to which padding's extra work (<= 2.25x, ~10 ms at n = 256 for
# BLOOM-176B) costs less than a compilation (0.5-1.3 s on a 2-core CPU).
SMALL_WORK = 1 << 27
"""``T * H * n`` up to which padding layers and heads to a bucket costs less than a compilation, so `influence_with_mass` pads."""


def bucket(size: int) -> int:
    """The smallest number ``>= size`` of the form ``2^k`` or ``3 * 2^(k-1)``."""
    if size < 1:
        raise ValueError(f"size: got {size}; allowed: an integer >= 1")
    power = 1
    while power < size:
        if power >= 2 and power * 3 // 2 >= size:
            return power * 3 // 2
        power *= 2
    return power


def pad(model: RolloutModel, num_layers: int | None = None, num_heads: int | None = None) -> RolloutModel:
    """`model` with identity layers and zero-weight heads appended: the same profile, a shared shape.

    Args:
        model: the model to pad, T layers and H heads.
        num_layers: the padded T' >= T (default ``bucket(T)``); layers
            T..T'-1 get ``lambda = 0`` and the last real layer's kernel.
        num_heads: the padded H' >= H (default ``bucket(H)``); heads
            H..H'-1 get weight 0 and head 0's slope and scores.

    Returns:
        A `RolloutModel` of shape ``(T', H')`` whose rollout equals `model`'s.
    """
    layers, heads = model.num_layers, model.num_heads
    num_layers = bucket(layers) if num_layers is None else num_layers
    num_heads = bucket(heads) if num_heads is None else num_heads
    if num_layers < layers or num_heads < heads:
        raise ValueError(f"pad: got ({num_layers}, {num_heads}); allowed: at least the model's ({layers}, {heads})")

    padded = _padded(model, num_layers, num_heads)
    if padded is None:
        raise ValueError(f"pad: a {type(model.kernel).__name__} has no padding rule; allowed: a kernel whose "
                         "padded() pads (AlibiKernel)")
    return padded


def _padded(model: RolloutModel, num_layers: int, num_heads: int) -> RolloutModel | None:
    """`pad`'s model, or None where the kernel has no padding rule (`AbstractKernel.padded`)."""
    kernel = model.kernel.padded(num_layers, num_heads)
    if kernel is None:
        return None
    lambdas = np.asarray(model.lambdas)
    lambdas = np.concatenate([lambdas, np.zeros(num_layers - model.num_layers, dtype=lambdas.dtype)])
    return dataclasses.replace(model, lambdas=lambdas, kernel=kernel)


def influence_with_mass(model, n: int | None = None, method: str = "auto"):
    """`jaxroll.influence_with_mass` on the padded model when the work is small.

    A `RolloutModel` whose ``T H n <= SMALL_WORK`` is padded to its bucket
    (`pad`) and given ``sequence_length = n`` (a static field: otherwise
    models that differ only in their default length would compile apart);
    anything else runs unchanged. Returns ``(p, mass)`` of shape ``(n,)``
    and ``()``, as `jaxroll.influence_with_mass` does. After
    `jaxroll.cache.enable` (the command line) a padded model's program is
    `jaxroll.cache.compiled`: loaded from the cache without tracing.
    """
    from .rollout import influence_with_mass as unpadded

    n = model.sequence_length if n is None else n
    padded = None
    if model.num_layers * model.num_heads * n <= SMALL_WORK:
        padded = _padded(model, bucket(model.num_layers), bucket(model.num_heads))
    if padded is None:
        return unpadded(model, n, method)
    model = dataclasses.replace(padded, sequence_length=n)
    from . import cache

    if cache.enabled():
        # The command line: the executable from the cache, no tracing or lowering.
        import jax

        from .engine.plan import plan
        from .rollout import influence_on_path

        path = plan(model, n, method)
        leaves, structure = jax.tree_util.tree_flatten(model)

        def flat(*leaves):
            return influence_on_path(jax.tree_util.tree_unflatten(structure, leaves), n, path)

        return cache.compiled("influence_with_mass", flat, leaves, static=(structure, n, path))(*leaves)
    return unpadded(model, n, method)
