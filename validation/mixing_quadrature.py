"""Which mixing share composes in quadrature? A probe on the composition test's models (issue 53).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/mixing_quadrature.py --out RUN

The composition test (`validation/composition.py`, run in ``validation/composition-run-q``) found that local
Jacobian norms, composed in quadrature (q = 2), land within the noise of the measured influence. This probe asks
what the rollout's own layer needs for that. It keeps each layer's measured mean attention ``A_t`` (today's kernel)
and swaps its mixing share ``mu_t`` in ``(1 - mu_t) I + mu_t A_t``. The shares tried:

- the norm ratio ``lambda_t`` (today's);
- the local Jacobians' off-diagonal share, ``mu_t (1 - mean_i A_t(i, i)) = mean_i (1 - Mn_t(i, i))``. This is
  ``mixing_local_mean`` in the composition test's results.json, which costs the full local Jacobians;
- the default measurement's ``branch_share``, ``(V + P) / (I + V + P)`` of the ``paths`` statistic;
- the backward-pass gradient share ``lambda_gradient`` (the composition test's results.json).

Each is rolled out with q = 1 and q = 2. Today's fitted q is shown beside them. Every candidate is scored by
W1 / noise against the measured influence (`jaxroll.measure.uncertainty.score`, 1000 resamples, seed 0), on the
same 32 sequences, N = 64, float64, as the composition test. Writes ``RUN/mixing-quadrature.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import composition as comp  # noqa: E402
import interventions as runs  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "composition-run-q" / "results.json"


def candidates(model, arrays: dict, layers: list[dict], n: int) -> dict[str, np.ndarray]:
    """The profiles ``(N,)`` by name: each mixing share of the module docstring, composed with q = 1 and 2."""
    from jaxroll.rollout import transition

    lam = np.asarray(model.lambdas, dtype=np.float64)
    R = np.stack([np.asarray(transition(model, t, n), dtype=np.float64) for t in range(model.num_layers)])
    A = (R - (1 - lam)[:, None, None] * np.eye(n)) / lam[:, None, None]
    diagonal = np.array([np.mean(np.diag(kernel)[1:]) for kernel in A])
    shares = {"lambda_t (norm ratio, today)": lam,
              "local Jacobians' off-diagonal share": np.array([r["mixing_local_mean"] for r in layers]) / (1 - diagonal),
              "branch share (paths statistic)": np.asarray(arrays["branch_share"], dtype=np.float64),
              "gradient share": np.array([r["lambda_gradient"] for r in layers])}
    out = {"lambda_t, the config's fitted q (the default route)": _roll(A, lam, fitted_q(model))}
    for name, mix in shares.items():
        for q in (1.0, 2.0):
            out[f"{name}, q = {q:g}"] = _roll(A, mix, q)
    return out


def fitted_q(model) -> float:
    """The composition exponent of the config (1 where it has none)."""
    return 1.0 if model.composition is None else float(model.composition)


def _roll(kernels, mix, q):
    n = kernels.shape[-1]
    transitions = (1 - mix)[:, None, None] * np.eye(n) + mix[:, None, None] * kernels
    return comp._normalised(comp.compose_in_power(transitions, q))


def main(argv=None) -> int:
    out = runs.start_run(__doc__, argv)
    import jaxroll
    from jaxroll.measure.uncertainty import score

    results = json.loads(RESULTS.read_text())
    stats = {family: stats + ",paths" for family, stats in comp.STATS.items()}
    comp.STATS = stats
    table, fitted = {}, {}
    for family in comp.FAMILIES:
        arrays, _, config = comp.measure_and_roll_out(family, HERE / "models" / "wave5", out, 32)
        model = jaxroll.load_config(config)
        fitted[family] = fitted_q(model)
        profiles = candidates(model, arrays, results["models"][family]["layers"], comp.LENGTH)
        table[family] = {name: score(p, arrays["influence_per_sequence"], B=1000, seed=0).ratio
                         for name, p in profiles.items()}
    lines = ["| mixing share, composition | bloom | llama |", "|---|---:|---:|"]
    lines += [f"| {name} | {table['bloom'][name]:.2f} | {table['llama'][name]:.2f} |" for name in table["bloom"]]
    text = "\n".join(lines) + f"\n\nThe config's fitted q: {fitted['bloom']:.4g} (bloom), {fitted['llama']:.4g} (llama).\n"
    (out / "mixing-quadrature.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
