"""``jaxroll score``: a predicted profile against a measurement, judged against the noise of the measured mean."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    score = commands.add_parser(
        "score", help="a predicted profile against a measurement: W1 / noise of the mean, a p-value, "
                      "W1, Spearman, KL with intervals",
        description="Score PREDICTED.csv (token_position,probability) against the per-sequence influence "
                    "that `jaxroll measure` wrote into DIR/measurement.npz. Reference: the noise of the "
                    "measured mean m (median bootstrap W1(m*, m) over resamples of the sequences); headline: "
                    "W1(p, m) / noise (about 1 for a perfect prediction) and the p-value of H0 'the sequences "
                    "were drawn around the prediction'. Then W1/(N-1), Spearman and KL(measured || predicted), "
                    "each with a bias-corrected estimate and a bootstrap interval, and the effective number of "
                    "sequences. Pure NumPy; seeded. --json prints one object with stable keys "
                    "(docs/uncertainty.md).")
    score.add_argument("predicted", type=Path, metavar="PREDICTED.csv", help="predicted profile (sums to 1)")
    score.add_argument("--measured", type=Path, required=True, metavar="DIR",
                       help="the --out directory of jaxroll measure (measurement.npz with influence_per_sequence)")
    score.add_argument("--resamples", type=_common.positive_int, default=1000, help="bootstrap resamples B "
                       "(default 1000)")
    score.add_argument("--seed", type=_common.non_negative_int, default=0, help="random seed (default 0)")
    score.add_argument("--level", type=float, default=0.95,
                       help="interval coverage; the test's alpha is 1 - level (default 0.95)")
    score.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    score.add_argument("--plot", type=Path, metavar="FIGURE.png",
                       help="draw the measured profile with its pointwise band and the prediction")
    score.add_argument("--overwrite", action="store_true", help="replace an existing --plot file")
    score.set_defaults(run=_run_score)


def _run_score(arguments) -> None:
    from .. import io
    from ..measure.uncertainty import profile_band, score

    if not 0 < arguments.level < 1:
        raise ConfigError(f"--level: got {arguments.level}; allowed: 0 < level < 1")
    if arguments.resamples < 2:
        raise ConfigError(f"--resamples: got {arguments.resamples}; allowed: >= 2")
    _common.check_figure_path(arguments.plot, arguments.overwrite)
    predicted = io.read_profile(arguments.predicted)
    if abs(predicted.sum() - 1.0) > 1e-6:
        raise ConfigError(f"{arguments.predicted}: probabilities sum to {predicted.sum():.9g}; allowed: 1")
    rows = _common.measured_rows(arguments.measured, "--measured", predicted.size, arguments.predicted)
    result = score(predicted, rows, B=arguments.resamples, seed=arguments.seed, level=arguments.level)
    if arguments.plot is not None:
        from ..plot import plot_prediction_against_measurement

        measured = rows.sum(axis=0) / rows.sum()  # m, as the measurement forms it
        band = profile_band(rows, level=arguments.level, resamples=arguments.resamples, seed=arguments.seed)
        interval = result.w1_interval
        plot_prediction_against_measurement(
            arguments.plot, measured, predicted, band=band, level=arguments.level,
            title=(f"{arguments.predicted.name} against {arguments.measured}: W1/(N-1) = {result.w1:.3g} "
                   f"[{interval[0]:.3g}, {interval[1]:.3g}], {result.ratio:.2g}x the noise, p = {result.p_value:.2g}"))
    if arguments.json:
        print(json.dumps(result.as_dict(), indent=2))
        return
    _print_summary(arguments, result, predicted.size)


def _print_summary(arguments, result, size: int) -> None:
    percent = f"{100 * arguments.level:g}%"
    print(f"jaxroll score: {arguments.predicted} against {arguments.measured} (S = {result.sequences}, "
          f"n_eff = {result.n_eff:.1f} by gradient mass, N = {size}; {result.resamples} resamples, "
          f"seed {result.seed})")
    print(f"  {'':30} {'value':>11} {'bias-corrected':>15}   {percent + ' interval':>25}")
    for label, name in (("W1/(N-1)", "w1"), ("spearman", "spearman"), ("kl(measured || predicted)", "kl")):
        low, high = getattr(result, f"{name}_interval")
        print(f"  {label:30} {getattr(result, name):11.5g} {getattr(result, name + '_bias_corrected'):15.5g}   "
              f"[{low:11.5g}, {high:11.5g}]")
    print(f"  {'noise of the mean (median W1)':30} {result.noise:11.5g} {'':15}   95% quantile {result.noise_q95:.5g}")
    low, high = result.ratio_interval
    print(f"  {'W1 / noise':30} {result.ratio:11.5g} {'':15}   [{low:11.5g}, {high:11.5g}]")
    print(f"  {result.verdict()}")
