"""``jaxroll effect``: the rollout's predicted change against a baseline and an intervened measurement."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from . import _common

OUTPUT_FILES = ("effect.json", "effect.png")
"""What `jaxroll effect` writes into --out."""


def add_parser(commands) -> None:
    effect = commands.add_parser(
        "effect", help="score a predicted change: baseline and intervened measurements against the rollout's "
                       "prediction of the intervened model",
        description="Compare the per-sequence influence of --measured BASELINE --measured INTERVENED (in this "
                    "order; each the --out of jaxroll measure, with influence_per_sequence in measurement.npz) "
                    "and score the rollout's "
                    "predicted profile of the intervened model (--predicted, as jaxroll rollout --intervene "
                    "writes profile.csv). Reports the measured effect W1(m_I, m_B) over the noise of the "
                    "difference with a permutation p-value (paired when both measurements read the same "
                    "token_ids: the rows of a sequence swapped; with --unpaired, labels permuted), the "
                    "prediction's "
                    "W1(p_I, m_I) over the noise of m_I with its p-value (as jaxroll score), the predicted and "
                    "measured changes of middle mass and center of mass with bootstrap intervals, and whether "
                    "the prediction beats 'no change'. The predicted change is the rollout's own: "
                    "f(predicted) - f(predicted baseline), the latter BASELINE/config.yaml rolled out unless "
                    "--predicted-baseline is given. Refused in one line: the same folder twice, other models, "
                    "another N, other token ids (unless --unpaired), a baseline measured under --intervene "
                    "(swapped folders). Writes effect.json (every number) and effect.png into "
                    "--out. Seeded; NumPy, the rollout of BASELINE/config.yaml included at small N (JAX beyond) "
                    "(docs/interventions.md, 'Scoring a predicted change').")
    effect.add_argument("--measured", type=Path, action="append", default=[], metavar="DIR",
                        help="twice, in this order: the measurement of the baseline model, then of the intervened "
                             "model (--measured BASELINE --measured INTERVENED)")
    effect.add_argument("retired_folders", nargs="*", metavar="", help=argparse.SUPPRESS)
    effect.add_argument("--predicted", type=Path, required=True, metavar="PROFILE.csv",
                        help="the rollout's profile of the intervened model (token_position,probability; sums to "
                             "1), as jaxroll rollout BASELINE/config.yaml --intervene ... writes it")
    effect.add_argument("--predicted-baseline", type=Path, metavar="PROFILE.csv",
                        help="the rollout's profile of the baseline model (default: BASELINE/config.yaml rolled "
                             "out at N); the predicted change is f(predicted) - f(predicted baseline), the "
                             "rollout's own")
    effect.add_argument("--unpaired", action="store_true",
                        help="compare measurements of different texts (other token_ids), unpaired; without it "
                             "they are refused")
    effect.add_argument("--resamples", type=_common.positive_int, default=1000,
                        help="bootstrap resamples and permutations B (default 1000)")
    effect.add_argument("--seed", type=_common.non_negative_int, default=0, help="random seed (default 0)")
    effect.add_argument("--level", type=float, default=0.95,
                        help="interval coverage; the tests' alpha is 1 - level (default 0.95)")
    effect.add_argument("--out", type=Path, default=Path("results") / "effect",
                        help="output directory (default results/effect)")
    effect.add_argument("--force", action="store_true", help="write into a non-empty --out")
    _common.add_json_argument(effect)
    effect.set_defaults(run=_run_effect, uses_jax=False)


def _predictor(predicted: Path) -> str:
    """Who predicted `predicted`: `jaxroll predict-rows` writes rows.json (with its ``form``) beside its profile."""
    import json

    try:
        form = json.loads((predicted.parent / "rows.json").read_text(encoding="utf-8")).get("form")
    except (OSError, ValueError, AttributeError):
        return "the rollout"
    return f"the per-sequence rows ({form})" if form else "the per-sequence rows"


def _run_effect(arguments) -> None:
    from .. import io
    from ..measure.effect import baseline_prediction, check_pair, effect, interventions_of, write_effect

    folders = _folders(arguments)
    io.check_output_dir(arguments.out, force=arguments.force)
    predicted = _profile(io, arguments.predicted, "--predicted")
    baseline_saved, intervened_saved = (_measurement(directory) for directory in folders)
    paired, why = check_pair(folders, baseline_saved, intervened_saved, same_texts=not arguments.unpaired)
    baseline_rows, intervened_rows = (saved.influence_rows(f"--measured {directory}", predicted.size,
                                                           arguments.predicted)
                                      for saved, directory in zip((baseline_saved, intervened_saved), folders))
    if arguments.predicted_baseline is not None:
        reference, reference_name = _profile(io, arguments.predicted_baseline, "--predicted-baseline"), str(
            arguments.predicted_baseline)
        if reference.size != predicted.size:
            raise ConfigError(f"--predicted-baseline {arguments.predicted_baseline}: N = {reference.size}; "
                              f"allowed: N = {predicted.size}, the length of {arguments.predicted}")
    else:  # the rollout's own change by default: the baseline's prediction from its measured config.yaml
        reference = baseline_prediction(folders[0], predicted.size)
        reference_name = f"rollout of {folders[0] / 'config.yaml'} at N = {predicted.size}"
    intervention = interventions_of(intervened_saved.metadata)
    try:
        result = effect(baseline_rows, intervened_rows, predicted, predicted_baseline=reference, paired=paired,
                        pairing_note=why, B=arguments.resamples, seed=arguments.seed, level=arguments.level)
    except ConfigError as error:  # checked once, by effect: the field named as the user typed it
        flag = {"B": "--resamples", "level": "--level"}.get(error.field)
        raise (error.renamed(flag) if flag else ConfigError(f"effect: {error}")) from None
    except ValueError as error:
        raise ConfigError(f"effect: {error}") from None
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    predictor = _predictor(arguments.predicted)
    record = {"baseline": str(folders[0]), "intervened": str(folders[1]), "predicted": str(arguments.predicted),
              "predicted_baseline": reference_name, "predictor": predictor, "intervention": intervention
              } | result.as_dict()
    write_effect(out, result, record, baseline_rows, intervened_rows, predicted, predicted_baseline=reference,
                 intervention=intervention, model=str(baseline_saved.metadata.get("model") or ""),
                 predictor=predictor)
    if arguments.json:
        _common.print_json(record)
    else:
        _print_table(arguments, folders, result, intervention, reference_name, out)


def _folders(arguments) -> tuple[Path, Path]:
    """``--measured BASELINE --measured INTERVENED``: exactly two folders, in that order."""
    if arguments.retired_folders:
        raise ConfigError(f"{' '.join(arguments.retired_folders)}: positional measurement folders are retired; use "
                          "--measured BASELINE --measured INTERVENED (docs/changelog.md lists the renames)",
                          field="BASELINE_DIR INTERVENED_DIR", value=arguments.retired_folders,
                          allowed="--measured BASELINE --measured INTERVENED")
    if len(arguments.measured) != 2:
        raise ConfigError(f"--measured: given {len(arguments.measured)} times; allowed: twice, --measured BASELINE "
                          "--measured INTERVENED", field="--measured", value=[str(path) for path in arguments.measured],
                          allowed="twice")
    return tuple(arguments.measured)


def _measurement(directory: Path):
    """The `SavedMeasurement` of one ``--measured DIR``, with its metadata.json."""
    from ..measure.outputs import read_measurement

    if not directory.is_dir():
        raise ConfigError(f"--measured {directory}: no such directory; allowed: the --out of jaxroll measure")
    return read_measurement(directory, flag="--measured")


def _profile(io, path: Path, flag: str):
    """A profile CSV that sums to 1, or a one-line refusal naming `flag`."""
    profile = io.read_profile(path)
    if abs(profile.sum() - 1.0) > 1e-6:
        raise ConfigError(f"{flag} {path}: probabilities sum to {profile.sum():.9g}; allowed: 1")
    return profile


def _print_table(arguments, folders, result, intervention: str, reference_name: str, out: Path) -> None:
    percent = f"{100 * result.level:g}%"
    score = result.prediction
    print(f"jaxroll effect: baseline {folders[0]}, intervened {folders[1]}, predicted "
          f"{arguments.predicted} (N = {result.positions}; S = {result.sequences_baseline} and "
          f"{result.sequences_intervened}; {result.resamples} resamples, seed {result.seed})")
    if intervention:
        print(f"  intervention: {intervention}")
    print(f"  {result.pairing}")
    print(f"  {'':36} {'W1/(N-1)':>11} {'noise':>11} {'W1 / noise':>11} {'p':>9}")
    print(f"  {'measured effect W1(m_I, m_B)':36} {result.effect_w1:11.5g} {result.effect_noise:11.5g} "
          f"{result.effect_ratio:11.4g} {result.effect_p_value:9.3g}")
    print(f"  {'prediction W1(p_I, m_I)':36} {score.w1:11.5g} {score.noise:11.5g} {score.ratio:11.4g} "
          f"{score.p_value:9.3g}")
    if result.anchored is not None:
        anchored = result.anchored
        print(f"  {'anchored m_B p_I / p_B vs m_I':36} {anchored.w1:11.5g} {anchored.noise:11.5g} "
              f"{anchored.ratio:11.4g} {anchored.p_value:9.3g}")
    reference = next(iter(result.changes.values())).reference
    print(f"  change, intervened - baseline      {'measured [' + percent + ' interval]':>33}  "
          f"{'predicted [' + percent + ' interval]':>33}  {'measured - predicted':>33}")
    for name, change in result.changes.items():
        cells = [_interval(getattr(change, field), getattr(change, field + "_interval"))
                 for field in ("measured", "predicted", "miss")]
        print(f"  {name:34} {cells[0]:>33}  {cells[1]:>33}  {cells[2]:>33}")
    print(f"  ({result.headline}, the headline; rollout(baseline): {reference_name}"
          f"{'; exact, no sampling noise' if reference == 'predicted baseline' else ''})")
    low, high = result.advantage_interval
    print(f"  against 'no change': W1(m_B, m_I) = {result.effect_w1:.5g}, W1(p_I, m_I) = {score.w1:.5g}, "
          f"advantage {result.advantage:.5g} [{low:.5g}, {high:.5g}]: the prediction "
          f"{'beats' if result.beats_no_change else 'does not beat'} 'no change'")
    print(f"  effect: {result.verdict()}")
    print(f"  prediction: {score.verdict()}")
    print(f"  wrote {out / 'effect.json'}, {out / 'effect.png'}")


def _interval(value: float, interval) -> str:
    return f"{value:+.4g} [{interval[0]:+.4g}, {interval[1]:+.4g}]"
