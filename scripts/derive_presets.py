"""Recompute the presets' power-decay schedules from the authors' measured ones.

    python scripts/derive_presets.py [REFERENCE_CONFIGS_DIR]

The directory defaults to the published configurations shipped in the package
(`jaxroll.published.ROOT`).

Fits ``lambda_t = lambda_0 / (t + 1)^beta`` (t from 0) by least squares to the
``lambdas_custom`` of each model's ``rollout/alibi/no_content/`` file, subject
to keeping the total mixing ``sum_t lambda_t`` of the measured schedule (the
quantity the theory says governs collapse; a plain least-squares fit is pulled
by BLOOM-176B's first layer, 0.645 against a plateau near 0.05, and loses 3/4
of its total mixing). Prints lambda_0, beta, the RMS residual and the sum. `jaxroll/presets.py` holds the
results rounded to four significant digits.
"""

import sys
from pathlib import Path

import numpy as np

from jaxroll.io import read_yaml
from jaxroll.presets import GEOMETRIES


def fit_power_decay(lambdas: np.ndarray) -> tuple[float, float, float]:
    """(lambda_0, beta, rms) of the sum-preserving least-squares fit.

    For each beta on a grid of step 1e-4 in [0, 4], lambda_0 is fixed by the
    sum; betas that would need lambda_0 > 1 are left out.
    """
    layers = np.arange(len(lambdas), dtype=np.float64)
    betas = np.arange(0.0, 4.0, 1e-4)
    decay = (layers[None, :] + 1.0) ** -betas[:, None]
    lambda_0 = lambdas.sum() / decay.sum(axis=1)
    errors = np.sum((lambda_0[:, None] * decay - lambdas) ** 2, axis=1)
    errors[lambda_0 > 1.0] = np.inf
    best = int(np.argmin(errors))
    rms = float(np.sqrt(errors[best] / len(lambdas)))
    return float(lambda_0[best]), float(betas[best]), rms


def main(root: Path) -> None:
    print(f"{'preset':14} {'lambda_0':>9} {'beta':>7} {'rms':>7} {'sum':>6}")
    for name, geometry in GEOMETRIES.items():
        config = read_yaml(root / "rollout/alibi/no_content" / geometry.reference_file)
        lambdas = np.asarray(config["lambda_schedule_config"]["lambdas_custom"], dtype=float)
        lambda_0, beta, rms = fit_power_decay(lambdas)
        print(f"{name:14} {lambda_0:9.4f} {beta:7.4f} {rms:7.4f} {lambdas.sum():6.3f}")


if __name__ == "__main__":
    from jaxroll.published import ROOT

    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
