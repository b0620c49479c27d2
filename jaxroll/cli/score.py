"""``jaxroll score``: a predicted profile against a measurement, judged against the noise of the measured mean.

With ``--rows-config CONFIG.yaml`` it also scores every measured row (a
measurement made with ``jaxroll measure --queries K``) against the rows
``P_T[q_k, :]`` of that rollout configuration (`score_measured_rows`, shared
with ``jaxroll compare``): a profile CSV is one row and cannot give the others.
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
    score.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    score.add_argument("--plot", type=Path, metavar="FIGURE.png",
                       help="draw the measured profile with its pointwise band and the prediction")
    score.add_argument("--overwrite", action="store_true", help="replace an existing --plot file (and existing "
                       "rows.json, rows.png in --rows-out)")
    add_rows_arguments(score, "DIR (--measured)")
    score.set_defaults(run=_run_score)


def _run_score(arguments) -> None:
    from .. import io
    from ..measure.uncertainty import profile_band, score

    if not 0 < arguments.level < 1:
        raise ConfigError(f"--level: got {arguments.level}; allowed: 0 < level < 1")
    if arguments.resamples < 2:
        raise ConfigError(f"--resamples: got {arguments.resamples}; allowed: >= 2")
    if arguments.predicted is None and arguments.rows_config is None:
        raise ConfigError("score: give PREDICTED.csv, --rows-config CONFIG.yaml or both")
    if arguments.predicted is None and arguments.plot is not None:
        raise ConfigError(f"--plot {arguments.plot}: draws PREDICTED.csv against the measurement; give PREDICTED.csv "
                          "(the rows' figure is rows.png in --rows-out)")
    _common.check_figure_path(arguments.plot, arguments.overwrite)
    rows_outputs = check_rows_arguments(arguments)
    measured_rows = None if arguments.rows_config is None else measured_rows_arrays(arguments.measured, "--measured")
    result = None
    if arguments.predicted is not None:
        predicted = io.read_profile(arguments.predicted)
        if abs(predicted.sum() - 1.0) > 1e-6:
            raise ConfigError(f"{arguments.predicted}: probabilities sum to {predicted.sum():.9g}; allowed: 1")
        rows, data = _common.measured_arrays(arguments.measured, "--measured", predicted.size, arguments.predicted)
        result = score(predicted, rows, B=arguments.resamples, seed=arguments.seed, level=arguments.level)
    if result is not None and arguments.plot is not None:
        from ..plot import plot_prediction_against_measurement

        measured = rows.sum(axis=0) / rows.sum()  # m, as the measurement forms it
        band = profile_band(rows, level=arguments.level, resamples=arguments.resamples, seed=arguments.seed)
        interval = result.w1_interval
        plot_prediction_against_measurement(
            arguments.plot, measured, predicted, band=band, level=arguments.level,
            title=(f"{arguments.predicted.name} against {arguments.measured}: W1/(N-1) = {result.w1:.3g} "
                   f"[{interval[0]:.3g}, {interval[1]:.3g}], {result.ratio:.2g}x the noise, p = {result.p_value:.2g}"))
    if result is not None and not arguments.json:
        _print_summary(arguments, result, predicted.size)
        if measured_rows is None and "influence_rows_per_sequence" in data:
            print(f"  the measurement has {data['influence_rows_per_sequence'].shape[1]} rows (--queries): pass "
                  "--rows-config CONFIG.yaml to score every row against that rollout's rows")
    rows_result = None if measured_rows is None else score_measured_rows(
        arguments, measured_rows, arguments.measured, "--measured", rows_outputs, quiet=arguments.json)
    if arguments.json:
        last_row = None if result is None else result.as_dict()
        print(json.dumps(last_row if rows_result is None else {"last_row": last_row, **rows_result}, indent=2))


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


def add_rows_arguments(parser, measured: str) -> None:
    """``--rows-config CONFIG.yaml``, ``--rows-out DIR``, ``--buffer B``, ``--statistic``: every row scored."""
    parser.add_argument("--rows-config", type=Path, metavar="CONFIG.yaml",
                        help=f"score every row of the measurement in {measured} (made with jaxroll measure "
                             "--queries K: influence_rows_per_sequence, query_positions) against the rows "
                             "P_T[q_k, :] that this rollout configuration predicts (e.g. the config.yaml that "
                             "jaxroll measure wrote), or, with the word 'refined', against the refined rollout's rows "
                             "that jaxroll measure --refine SWITCHES --queries K wrote beside them (refined_rows): "
                             "per-row W1/noise, p-values with Holm's correction, the "
                             "power law by distance with a bootstrap interval over sequences; writes rows.json and "
                             "rows.png into --rows-out (docs/rows.md)")
    default = Path("results") / parser.prog.partition(" ")[2]
    parser.add_argument("--rows-out", type=Path, default=default, metavar="DIR",
                        help=f"with --rows-config: the folder for rows.json and rows.png (default {default}; created)")
    parser.add_argument("--buffer", type=_common.non_negative_int, default=0,
                        help="with --rows-config: leave source positions j < BUFFER out of the curve by "
                             "distance (Brändel et al.'s --source-min-index; default 0)")
    parser.add_argument("--statistic", choices=("median", "mean"), default="median",
                        help="with --rows-config: the statistic over query positions by distance (default median)")


def check_rows_arguments(arguments) -> tuple | None:
    """The paths rows.json and rows.png of --rows-out, refused before any work when they exist without
    --overwrite (None without --rows-config); the row options without --rows-config are refused."""
    if arguments.rows_config is None:
        used = [flag for flag, value, default in (("--buffer", arguments.buffer, 0),
                                                  ("--statistic", arguments.statistic, "median")) if value != default]
        if used:
            raise ConfigError(f"{used[0]}: applies to --rows-config only")
        return None
    if not (arguments.rows_config.is_file() or str(arguments.rows_config) == REFINED):
        raise ConfigError(f"--rows-config {arguments.rows_config}: no such file; allowed: a rollout YAML file or "
                          f"'{REFINED}' (the measurement's refined_rows)")
    if arguments.rows_out.exists() and not arguments.rows_out.is_dir():
        raise ConfigError(f"--rows-out {arguments.rows_out}: not a folder")
    paths = (arguments.rows_out / "rows.json", arguments.rows_out / "rows.png")
    for path in paths:
        if path.exists() and not arguments.overwrite:
            raise ConfigError(f"--rows-out {arguments.rows_out}: {path.name} exists; pass --overwrite to replace it")
    return paths


REFINED = "refined"
"""``--rows-config refined``: score the refined rollout's rows that ``jaxroll measure --refine S --queries K``
wrote into the same measurement.npz (``refined_rows``), not the rows of a configuration."""


def _refined_rows(measured_rows, directory: Path, flag: str):
    """``refined_rows (K, N)`` beside the measured rows, and a name for it (the switches in metadata.json)."""
    rows, _, refined = measured_rows
    if refined is None:
        raise ConfigError(f"{flag} {directory}: no refined_rows in measurement.npz; allowed with --rows-config "
                          f"{REFINED}: a measurement made with jaxroll measure --refine SWITCHES --queries K")
    if refined.shape != rows.shape[1:]:
        raise ConfigError(f"{flag} {directory}: refined_rows {refined.shape}; allowed: {rows.shape[1:]}, one per "
                          "measured row")
    try:
        switches = json.loads((directory / "metadata.json").read_text())["refined"]["switches"]
    except (OSError, ValueError, KeyError, TypeError):
        switches = None
    return refined, "the refined rollout" + (f" ({','.join(switches)})" if switches else "")


def measured_rows_arrays(directory: Path, flag: str):
    """``(influence_rows_per_sequence (S, K, N), query_positions (K,), refined_rows (K, N) or None)`` of
    ``DIR/measurement.npz``, checked (``refined_rows`` by `score_measured_rows`, where it is used)."""
    import numpy as np

    from .._readers import read_npz

    path = directory / "measurement.npz"
    if not path.is_file():
        raise ConfigError(f"{flag} {directory}: no measurement.npz; allowed: the --out of jaxroll measure")
    data = read_npz(path, "the measurement.npz that jaxroll measure writes into its --out",
                    label=f"{flag} {directory}: measurement.npz")
    if "influence_rows_per_sequence" not in data or "query_positions" not in data:
        raise ConfigError(f"{flag} {directory}: no influence_rows_per_sequence and query_positions in "
                          "measurement.npz; allowed: a measurement made with jaxroll measure --queries K")
    rows, queries = data["influence_rows_per_sequence"], data["query_positions"]
    if rows.ndim != 3 or queries.shape != (rows.shape[1],) or not np.issubdtype(queries.dtype, np.integer):
        raise ConfigError(f"{flag} {directory}: influence_rows_per_sequence {rows.shape} and query_positions "
                          f"{queries.shape}; allowed: (S, K, N) and (K,) integer positions")
    return rows, queries, data.get("refined_rows")


def score_measured_rows(arguments, measured_rows, directory: Path, flag: str, outputs, *,
                        quiet: bool = False) -> dict:
    """Every measured row (`measured_rows_arrays` of `directory`) against the rows of
    ``arguments.rows_config``: printed, rows.json and rows.png written into `outputs`; returns the rows.json
    object.

    `jaxroll.measure.row_scores.score_rows` (W1/noise, p-values, Holm) and
    `distance_exponent` for the measured rows (bootstrap interval over the
    sequences) and the predicted ones (the fit's interval), with
    ``--resamples``, ``--seed``, ``--level``, ``--buffer``, ``--statistic``.
    The rows are predicted at the measurement's N (the configuration's
    length is replaced), in float64.
    """
    import jax

    from .. import io
    from ..measure.row_scores import distance_exponent, score_rows
    from ..theory.rows import predicted_rows

    rows, queries, _ = measured_rows
    if str(arguments.rows_config) == REFINED and not arguments.rows_config.is_file():
        predicted, name = _refined_rows(measured_rows, directory, flag)
    else:
        model, name = io.load_config(arguments.rows_config), str(arguments.rows_config)
        with jax.enable_x64(True):
            predicted = predicted_rows(model, queries.tolist(), n=rows.shape[2])
    settings = {"B": arguments.resamples, "seed": arguments.seed, "level": arguments.level}
    try:
        scores = score_rows(predicted, rows, queries, **settings)
        distance = {"measured": distance_exponent(rows, queries, **settings, buffer=arguments.buffer,
                                                  statistic=arguments.statistic),
                    "predicted": distance_exponent(predicted, queries, **settings, buffer=arguments.buffer,
                                                   statistic=arguments.statistic)}
    except ConfigError as error:
        raise ConfigError(f"{flag} {directory}, --rows-config {arguments.rows_config}: {error}") from None
    result = {**scores.as_dict(), "distance": distance, "measured": str(directory),
              "rows_config": str(arguments.rows_config)}
    outputs[0].parent.mkdir(parents=True, exist_ok=True)
    outputs[0].write_text(json.dumps(result, indent=1))
    from ..plot.rows import plot_rows

    plot_rows(scores, distance["measured"], distance["predicted"], outputs[1],
              title=f"rows of {directory} (S = {rows.shape[0]}, N = {rows.shape[2]}) against the rollout of "
                    f"{name}")
    if not quiet:
        print_rows(scores, distance, outputs)
    return result


def print_rows(scores, distance: dict, outputs) -> None:
    """The per-row table (query, W1/noise, p, Holm), the summary line and the two exponents."""
    summary = scores.summary()
    print(f"every row: {summary['rows']} query positions, S = {summary['sequences']}, {summary['resamples']} "
          f"resamples (seed {summary['seed']}); H0 per row: the sequences were drawn around the predicted row")
    print(f"  {'query':>6} {'W1/noise':>9} {'p':>9} {'Holm p':>9}  rejected at {summary['alpha']:g} (Holm)")
    for query, ratio, p_value, adjusted, rejected in zip(scores.queries, scores.ratio, scores.p_value,
                                                         scores.holm_adjusted, scores.holm_rejected):
        print(f"  {int(query):6d} {ratio:9.3g} {p_value:9.3g} {adjusted:9.3g}  {'yes' if rejected else 'no'}")
    print(f"  W1/noise over rows: mean {summary['ratio_mean']:.3g}, median {summary['ratio_median']:.3g}, max "
          f"{summary['ratio_max']:.3g} (query {summary['ratio_max_query']}); Holm rejects {summary['holm_rejected']} "
          f"of {summary['rows']} rows at {summary['alpha']:g}"
          + ("" if summary["holm_can_reject"] else
             f" (it cannot reject any: p >= 1/(B + 1) = {summary['smallest_p_value']:.3g} > alpha / K; "
             "raise --resamples)"))
    for name, fitted in distance.items():
        low, high = fitted["p_interval"]
        kind = "bootstrap over sequences" if fitted["interval_kind"] == "bootstrap" else "the fit's interval"
        print(f"  by distance, {name}: p = {fitted['p']:.3g} [{low:.3g}, {high:.3g}] ({100 * fitted['level']:g}%, "
              f"{kind})" + (" at a bound of the search" if fitted["at_bound"] else ""))
    print(f"  wrote {outputs[0]} and {outputs[1]}")
