"""The public API used as the docs use it, for the type check (pyright, .ci/run).

Not a test module (pytest does not collect it): pyright reads it with the
package's annotations (jaxroll ships ``py.typed``), so a signature that no
longer accepts what the docs pass, or returns something the docs cannot use,
is a type error here. It also runs as a script.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxroll
from jaxroll import metrics, theory


def main() -> None:
    version: str = jaxroll.__version__
    model: jaxroll.RolloutModel = jaxroll.published.load("mpt-7b")
    p = jaxroll.influence(model)
    attention_only = jaxroll.RolloutModel.create(num_layers=model.num_layers, num_heads=model.num_heads,
                                                 lambdas=1.0, alibi_slopes=model.alibi_slopes)
    collapsed = float(jaxroll.influence(attention_only)[0])
    preset = jaxroll.presets.get("bloom-7b1")
    gradients = jax.grad(lambda m: jaxroll.influence(m, 16)[0])(preset)
    matrix = jaxroll.rollout_matrix(model, 16)
    kernel = jaxroll.attention_kernel(model, layer=0, n=16)
    shape = metrics.shape_statistics(p)
    comparison = metrics.compare(np.asarray(p), np.asarray(jaxroll.influence(preset, 256)), normalize=True)
    drifts = theory.forces(model, 16).drift_center_of_mass
    mixing = theory.total_mixing(model)
    power = jaxroll.PowerKernel.create(num_layers=2, num_heads=2, slopes=[0.1, 0.5], exponents=0.8)
    decaying = jaxroll.KernelRolloutModel.create(kernel=power, lambdas=0.3, sequence_length=32)
    q = jaxroll.influence(decaying)
    result = jaxroll.sweep(jaxroll.presets.get("mpt-7b"), lambda_0=[0.2, 0.4], beta=[0.5, 1.0], progress=False)
    table: dict[str, np.ndarray] = result.table
    print(version, collapsed, gradients.lambdas.shape, matrix.shape, kernel.shape, float(shape.u_index),
          comparison.wasserstein, jnp.asarray(drifts).shape, float(mixing), q.shape, sorted(table))


if __name__ == "__main__":
    main()
