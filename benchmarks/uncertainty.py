"""Calibration and power of `jaxroll.measure.uncertainty.score`, by simulation with known truths.

    python benchmarks/uncertainty.py [--quick] [--replicates R] [--seed SEED] [--out DIR]

The truth: a profile mu (N,) (U-shaped with a recency tilt). A measurement:
S per-sequence rows ``g_s = w_s r_s``, each sequence's own profile
``r_s ~ Dirichlet(concentration * N * mu)`` (a relative spread of
``1 / sqrt(concentration + 1/N)`` per position: concentration 2 gives
about 0.7, as noisy as the gradient rows of a trained model) and its mass
``w_s ~ Gamma(shape)`` (shape 1.5: Kish's n_eff about 0.6 S, as measured
on held-out models). The measured profile's centre is mu (``E[w r] /
E[w] = mu``, w and r independent).

The predictions: ``p_k ∝ mu exp(a_k x)`` (x in [-1, 1]), a_k chosen by
bisection so that ``W1(p_k, mu) = k * noise_true``, ``noise_true`` the
median over 4000 simulated measurements of ``W1(m, mu)``; k = 0, 2, 4, 8.

Per replicate (a fresh measurement) and k: `score` with B resamples, and
the table gives the share of replicates with ``p_value <= 0.05`` (the
false-positive rate at k = 0, the power otherwise), the coverage of the
95 % W1, KL and Spearman intervals `score` reports (``*_hull``; truths
W1(p_k, mu), KL(mu || p_k), rho(p_k, mu)) beside the raw basic and
percentile intervals' coverage of the same truths (and for W1 the raw
studentised interval's, ``w1_studentised``: neither clipped nor set to 0
where the test keeps H0), the mean and median W1 / noise, the relative
error of the raw and bias-corrected KL, and the spread of the estimated
noise and of W1's standard error (sd / mean over replicates). Binomial
standard errors of a rate r over R replicates: ``sqrt(r (1 - r) / R)``.

Writes uncertainty_calibration.csv.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from jaxroll.measure.uncertainty import kl, profile_from_rows, score, spearman, studentised_interval, wasserstein


def truth_profile(n: int) -> np.ndarray:
    x = np.linspace(-1.0, 1.0, n)
    mu = (1.0 + 3.0 * x ** 2) * np.exp(0.8 * x)
    return mu / mu.sum()


def measurement(mu, sequences: int, rng, *, concentration: float = 2.0, shape: float = 1.5) -> np.ndarray:
    """``(S, N)`` rows ``w_s r_s``: ``r_s ~ Dirichlet(concentration N mu)``, ``w_s ~ Gamma(shape)``."""
    profiles = rng.dirichlet(concentration * mu.size * mu, size=sequences)
    return rng.gamma(shape, size=(sequences, 1)) * profiles


def tilted(mu, target: float) -> np.ndarray:
    """``mu exp(a x)`` normalised, a >= 0 by bisection so that W1 to mu equals `target`."""
    x = np.linspace(-1.0, 1.0, mu.size)

    def profile(a):
        p = mu * np.exp(a * x)
        return p / p.sum()

    low, high = 0.0, 1.0
    while wasserstein(profile(high), mu) < target:
        high *= 2
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (middle, high) if wasserstein(profile(middle), mu) < target else (low, middle)
    return profile((low + high) / 2)


def noise_of_the_mean(mu, sequences: int, rng, draws: int = 4000) -> float:
    """Median over `draws` simulated measurements of W1(m, mu)."""
    return float(np.median([wasserstein(profile_from_rows(np.ones((1, sequences)), measurement(mu, sequences, rng))[0],
                                        mu) for _ in range(draws)]))


def calibration(n: int, sequences: int, resamples: int, replicates: int, errors=(0, 2, 4, 8), seed: int = 0):
    rng = np.random.default_rng(seed)
    mu = truth_profile(n)
    noise_true = noise_of_the_mean(mu, sequences, rng)
    predictions = {k: (mu if k == 0 else tilted(mu, k * noise_true)) for k in errors}
    records = {k: [] for k in errors}
    for replicate in range(replicates):
        rows = measurement(mu, sequences, rng)
        for k, p in predictions.items():
            result = score(p, rows, B=resamples, seed=replicate)
            truths = {"w1": float(wasserstein(p, mu)), "kl": float(kl(mu, p)), "spearman": float(spearman(p, mu))}
            record = {"rejected": result.p_value <= 0.05, "ratio": result.ratio, "noise": result.noise,
                      "w1_se": result.w1_standard_error,
                      "n_eff": result.n_eff, "kl_error": result.kl - truths["kl"],
                      "kl_bc_error": result.kl_bias_corrected - truths["kl"], "kl_truth": truths["kl"]}
            for name, truth in truths.items():
                low, high = getattr(result, f"{name}_interval")
                record[f"{name}_hull"] = low <= truth <= high
                q_low, q_high = np.quantile(result.bootstrap[name], [0.025, 0.975])
                estimate = getattr(result, name)
                record[f"{name}_basic"] = 2 * estimate - q_high <= truth <= 2 * estimate - q_low
                record[f"{name}_percentile"] = q_low <= truth <= q_high
            low, high = studentised_interval(result.w1, result.bootstrap["w1"], result.w1_standard_error,
                                             result.bootstrap["w1_standard_error"], 0.95)
            record["w1_studentised"] = low <= truths["w1"] <= high
            records[k].append(record)
    table = []
    for k, rows in records.items():
        mean = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
        kl_truth = max(mean["kl_truth"], 1e-300)
        table.append(dict(error=k, reject=mean["rejected"], ratio=mean["ratio"],
                          ratio_median=float(np.median([r["ratio"] for r in rows])),
                          **{f"{name}_{kind}": mean[f"{name}_{kind}"] for name in ("w1", "kl", "spearman")
                             for kind in ("hull", "basic", "percentile")},
                          w1_studentised=mean["w1_studentised"],
                          kl_bias=mean["kl_error"] / kl_truth if k else mean["kl_error"],
                          kl_bc_bias=mean["kl_bc_error"] / kl_truth if k else mean["kl_bc_error"],
                          noise_spread=float(np.std([r["noise"] for r in rows]) / np.mean([r["noise"] for r in rows])),
                          w1_se_spread=float(np.std([r["w1_se"] for r in rows]) / np.mean([r["w1_se"] for r in rows])),
                          noise_true=noise_true, n_eff=mean["n_eff"]))
    return table


COLUMNS = ("error", "reject", "ratio", "ratio_median", "w1_hull", "w1_basic", "w1_percentile", "w1_studentised",
           "kl_hull", "kl_basic", "kl_percentile", "spearman_hull", "spearman_basic", "spearman_percentile", "kl_bias",
           "kl_bc_bias", "noise_spread", "w1_se_spread", "noise_true", "n_eff")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 64, S = 48, B = 300, 200 replicates")
    parser.add_argument("--replicates", type=int, default=500,
                        help="replicates per error of the full run (default 500)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the simulated measurements (default 0); score's own seed is the replicate")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for uncertainty_calibration.csv")
    arguments = parser.parse_args(argv)
    full = (256, 96, 1000, arguments.replicates)
    n, sequences, resamples, replicates = (64, 48, 300, 200) if arguments.quick else full
    start = time.perf_counter()
    table = calibration(n, sequences, resamples, replicates, seed=arguments.seed)
    seconds = time.perf_counter() - start
    print(f"# score calibration: N = {n}, S = {sequences}, B = {resamples}, {replicates} replicates per error, "
          f"seed {arguments.seed} "
          f"({seconds:.0f} s); error in units of the noise of the mean; reject: p <= 0.05; "
          "kl_bias: mean (estimate - truth) / truth (absolute at error 0)")
    print(" | ".join(COLUMNS))
    for row in table:
        print(" | ".join(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS), flush=True)
    with open(arguments.out / "uncertainty_calibration.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
