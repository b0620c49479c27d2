"""``jaxroll score``: a predicted profile against a measurement, judged against the noise of the measured mean.

With ``--rows-config CONFIG.yaml`` it also scores every measured row (a
measurement made with ``jaxroll measure --queries K``) against the rows
``P_T[q_k, :]`` of that rollout configuration
(`jaxroll.measure.row_scores.score_measured_rows`, as ``jaxroll compare``
does): a profile CSV is one row and cannot give the others.
"""

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
    score.add_argument("predicted", type=Path, nargs="?", metavar="PREDICTED.csv",
                       help="predicted profile (sums to 1); may be left out with --rows-config")
    score.add_argument("--measured", type=Path, required=True, metavar="DIR",
                       help="the --out directory of jaxroll measure (measurement.npz with influence_per_sequence)")
    score.add_argument("--resamples", type=_common.positive_int, default=1000, help="bootstrap resamples B "
                       "(default 1000)")
    score.add_argument("--seed", type=_common.non_negative_int, default=0, help="random seed (default 0)")
    score.add_argument("--level", type=float, default=0.95,
                       help="interval coverage; the test's alpha is 1 - level (default 0.95)")
    _common.add_json_argument(score)
    score.add_argument("--out", type=Path, default=None, metavar="DIR",
                       help=f"write {FIGURE} (the measured profile with its pointwise band and the prediction) "
                            "into DIR, and rows.json, rows.png with --rows-config (default for those: "
                            "results/score; created)")
    score.add_argument("--force", action="store_true", help="replace existing files of --out")
    _common.add_rows_arguments(score, "DIR (--measured)")
    _common.add_retired_argument(score, "--plot", "--out DIR (it writes score.png there)")
    _common.add_retired_argument(score, "--overwrite", "--force", takes_value=False)
    _common.add_retired_argument(score, "--rows-out", "--out DIR")
    score.set_defaults(run=_run_score)


FIGURE = "score.png"
"""The figure `jaxroll score --out DIR` draws: the measured profile, its band and the prediction."""


def _run_score(arguments) -> None:
    from ..measure.outputs import read_measurement

    if not 0 < arguments.level < 1:
        raise ConfigError(f"--level: got {arguments.level}; allowed: 0 < level < 1")
    if arguments.resamples < 2:
        raise ConfigError(f"--resamples: got {arguments.resamples}; allowed: >= 2")
    if arguments.predicted is None and arguments.rows_config is None:
        raise ConfigError("score: give PREDICTED.csv, --rows-config CONFIG.yaml or both")
    figure = None
    if arguments.out is not None and arguments.predicted is not None:
        figure = _common.free_output_path(arguments.out / FIGURE, arguments.force)
    rows_outputs = _common.check_rows_arguments(arguments, arguments.out or Path("results") / "score")
    saved = read_measurement(arguments.measured, flag="--measured", need_metadata=False)
    rows_check = None if arguments.rows_config is None else saved.query_rows("--measured " + str(arguments.measured))
    result = None
    if arguments.predicted is not None:
        result, predicted, rows = _score_profile(arguments, saved, figure)
        if not arguments.json:
            _print_summary(arguments, result, predicted.size)
            if rows_check is None and "influence_rows_per_sequence" in saved.arrays:
                print(f"  the measurement has {saved.arrays['influence_rows_per_sequence'].shape[1]} rows "
                      "(--queries): pass --rows-config CONFIG.yaml to score every row against that rollout's rows")
        if figure is not None and not arguments.json:
            print(f"  wrote {figure}")
    rows_result = None
    if rows_check is not None:
        rows_result = _score_rows(arguments, saved, rows_outputs)
    if arguments.json:
        last_row = None if result is None else result.as_dict()
        print(json.dumps(last_row if rows_result is None else {"last_row": last_row, **rows_result}, indent=2))


def _score_rows(arguments, saved, outputs) -> dict:
    """Every measured row against ``--rows-config``'s rows (rows.json, rows.png written); the rows.json object."""
    from ..measure.row_scores import rows_lines, score_measured_rows

    record, scores, distance = score_measured_rows(
        saved, arguments.measured, f"--measured {arguments.measured}", arguments.rows_config, outputs,
        B=arguments.resamples, seed=arguments.seed, level=arguments.level, buffer=arguments.buffer,
        statistic=arguments.statistic)
    if not arguments.json:
        print("\n".join(rows_lines(scores, distance, outputs)))
    return record


def _score_profile(arguments, saved, figure):
    """PREDICTED.csv against the measured rows: the `Score`, the profile and the rows; the figure drawn."""
    from .. import io
    from ..measure.uncertainty import score

    predicted = io.read_profile(arguments.predicted)
    if abs(predicted.sum() - 1.0) > 1e-6:
        raise ConfigError(f"{arguments.predicted}: probabilities sum to {predicted.sum():.9g}; allowed: 1")
    rows = saved.influence_rows(f"--measured {arguments.measured}", predicted.size, arguments.predicted)
    result = score(predicted, rows, B=arguments.resamples, seed=arguments.seed, level=arguments.level)
    if figure is not None:
        from ..measure.uncertainty import profile_band
        from ..plot import plot_prediction_against_measurement

        figure.parent.mkdir(parents=True, exist_ok=True)
        measured = rows.sum(axis=0) / rows.sum()  # m, as the measurement forms it
        band = profile_band(rows, level=arguments.level, resamples=arguments.resamples, seed=arguments.seed)
        interval = result.w1_interval
        plot_prediction_against_measurement(
            figure, measured, predicted, band=band, level=arguments.level,
            title=(f"{arguments.predicted.name} against {arguments.measured}: W1/(N-1) = {result.w1:.3g} "
                   f"[{interval[0]:.3g}, {interval[1]:.3g}], {result.ratio:.2g}x the noise, p = {result.p_value:.2g}"))
    return result, predicted, rows


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
