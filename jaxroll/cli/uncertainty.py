"""``jaxroll score``: a predicted profile against a measurement, with bootstrap intervals and the noise floor."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    score = commands.add_parser(
        "score", help="a predicted profile against a measurement: W1, Spearman, KL with intervals, noise floor",
        description="Score PREDICTED.csv (token_position,probability) against the per-sequence influence "
                    "that `jaxroll measure` wrote into DIR/measurement.npz: W1/(N-1), Spearman and "
                    "KL(measured || predicted) with bootstrap percentile intervals over sequences, the "
                    "noise floor (W1 between the means of random halves, over many random splits) and "
                    "W1 / floor with its interval. Pure NumPy; seeded.")
    score.add_argument("predicted", type=Path, metavar="PREDICTED.csv", help="predicted profile (sums to 1)")
    score.add_argument("--measured", type=Path, required=True, metavar="DIR",
                       help="the --out directory of jaxroll measure (measurement.npz with influence_per_sequence)")
    score.add_argument("--resamples", type=_common.positive_int, default=1000, help="bootstrap resamples B "
                       "(default 1000)")
    score.add_argument("--splits", type=_common.positive_int, default=1000,
                       help="random half splits for the floor (default 1000)")
    score.add_argument("--seed", type=_common.non_negative_int, default=0, help="random seed (default 0)")
    score.add_argument("--level", type=float, default=0.95, help="interval coverage (default 0.95)")
    score.add_argument("--json", action="store_true", help="print the numbers as JSON")
    score.set_defaults(run=_run_score)


def _run_score(arguments) -> None:
    import numpy as np

    from .. import io
    from ..measure.uncertainty import score

    if not 0 < arguments.level < 1:
        raise ConfigError(f"--level: got {arguments.level}; allowed: 0 < level < 1")
    if arguments.resamples < 2:
        raise ConfigError(f"--resamples: got {arguments.resamples}; allowed: >= 2")
    predicted = io.read_profile(arguments.predicted)
    if abs(predicted.sum() - 1.0) > 1e-6:
        raise ConfigError(f"{arguments.predicted}: probabilities sum to {predicted.sum():.9g}; allowed: 1")
    path = arguments.measured / "measurement.npz"
    if not path.is_file():
        raise ConfigError(f"--measured {arguments.measured}: no measurement.npz; allowed: the --out of jaxroll measure")
    with np.load(path, allow_pickle=False) as data:
        if "influence_per_sequence" not in data.files:
            raise ConfigError(f"--measured {arguments.measured}: no influence_per_sequence in measurement.npz; "
                              "allowed: a measurement with --stats ...,influence by this version")
        rows = data["influence_per_sequence"]
    if rows.shape[0] < 2:
        raise ConfigError(f"--measured {arguments.measured}: {rows.shape[0]} sequence; allowed: at least 2")
    if rows.shape[1] != predicted.size:
        raise ConfigError(f"{arguments.predicted}: N = {predicted.size}; allowed: N = {rows.shape[1]} "
                          "as the measurement")
    result = score(predicted, rows, B=arguments.resamples, seed=arguments.seed, splits=arguments.splits,
                   level=arguments.level)
    if arguments.json:
        print(json.dumps(result.as_dict(), indent=2))
        return
    percent = f"{100 * arguments.level:g}%"
    print(f"jaxroll score: {arguments.predicted} against {arguments.measured} (S = {result.sequences}, "
          f"N = {predicted.size}; {result.resamples} resamples, {result.splits} splits, seed {result.seed})")
    print(f"  {'':26} {'value':>12}   {percent + ' interval':>27}")
    for label, value, interval in (
            ("W1/(N-1)", result.w1, result.w1_interval),
            ("spearman", result.spearman, result.spearman_interval),
            ("kl(measured || predicted)", result.kl, result.kl_interval),
            ("floor: W1 of random halves", result.floor, result.floor_interval),
            ("W1 / floor", result.ratio, result.ratio_interval)):
        print(f"  {label:26} {value:12.6g}   [{interval[0]:12.6g}, {interval[1]:12.6g}]")
    verdict = ("above the floor: distinguishable from the measurement's noise" if result.ratio_interval[0] > 1
               else "within the noise floor's reach")
    print(f"  the prediction is {result.ratio:.3g}x the floor ({verdict})")
