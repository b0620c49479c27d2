"""``jaxroll predict-rows``: an intervention predicted by each sequence's own attention rows (the per-sequence rows)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common

OUTPUT_FILES = ("profile.csv", "baseline_profile.csv", "rows.json")
"""What `jaxroll predict-rows` writes into --out."""


def add_parser(commands) -> None:
    rows = commands.add_parser(
        "predict-rows", help="predict an intervention's profile from each sequence's own attention rows",
        description="From a baseline measurement (--measured DIR, the --out of jaxroll measure with lambda: its "
                    "model, token_ids and lambdas), predict the profile of the model under --intervene by the "
                    "per-sequence rows: each sequence's eager attention rows, per layer and head, have their "
                    "logits changed as the torch patch changes them (tau, slope_scale, ssmax_scale, kappa; "
                    "rotary_ratio recomputes them from q and k rotated at p / r; gamma acts on the lambdas; "
                    "sinks are refused), are averaged over sequences and heads per layer, and are "
                    "rolled out with the lambdas; the same without the change is the predicted baseline (the "
                    "rollout of the mean kernel). When DIR measured paths (every default measurement does: "
                    "probability_over_value), each layer also carries the probability path in the closed-ratio "
                    "form: the path weights of the unchanged and changed rows move the mean kernel's shape, "
                    "weighted by the path's share rho = r / (1 + r) and the logit gain (1/tau, SSMax's s ln n_i; "
                    "a per-head tau as its heads' mean); without paths, today's layer on the rows. rows.json "
                    "names the form that ran. Every rollout composes its paths with the exponent q of DIR/config.yaml "
                    "where jaxroll measure fitted one (rows.json: composition). Sequences stream in micro-batches. Writes profile.csv and "
                    "baseline_profile.csv (for jaxroll effect --predicted and --predicted-baseline) and "
                    "rows.json into --out (docs/interventions.md, 'Predicting by the per-sequence rows' and "
                    "'The probability path's shape').")
    rows.add_argument("--measured", type=Path, default=None, metavar="DIR",
                      help="the baseline measurement (the --out of jaxroll measure, without --intervene)")
    _common.add_intervene_argument(rows, "the change to predict", "rows.json records it")
    rows.add_argument("--model", type=Path, default=None, metavar="DIR",
                      help="the model folder (default: the one DIR/metadata.json names)")
    rows.add_argument("--batch-size", type=_common.positive_int, default=8,
                      help="sequences per forward pass (default 8): the working memory grows with it")
    rows.add_argument("--max-memory", default=None, metavar="SIZE",
                      help="refuse a run whose estimated memory exceeds SIZE (e.g. 8G; default: the memory "
                           "available on this machine)")
    rows.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                      help="where the model runs (default cpu)")
    rows.add_argument("--out", type=Path, default=Path("results") / "predict-rows",
                      help="output directory (default results/predict-rows)")
    rows.add_argument("--force", action="store_true", help="write into a non-empty --out")
    _common.add_json_argument(rows)
    rows.set_defaults(run=_run_predict_rows, uses_jax=False)


def _run_predict_rows(arguments) -> None:
    from .. import io, memory
    from ..measure.row_prediction import predict_from_measurement, write_prediction

    if arguments.measured is None:
        raise ConfigError.of("--measured", None, "--measured DIR, the --out of jaxroll measure on the baseline")
    if arguments.intervene is None:
        raise ConfigError.of("--intervene", None, "NAME=VALUE[,...] or a YAML file (jaxroll measure's --intervene)")
    limit = None if arguments.max_memory is None else memory.parse_size(arguments.max_memory)
    io.check_output_dir(arguments.out, force=arguments.force)
    prediction, record = predict_from_measurement(arguments.measured, arguments.intervene,
                                                  model_dir=arguments.model, batch_size=arguments.batch_size,
                                                  max_memory=limit, device=arguments.device)
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    paths = write_prediction(out, prediction, record)
    if arguments.json:
        _common.print_json(record | {"files": [str(path) for path in paths]})
        return
    middle = record["middle_mass"]
    print(f"jaxroll predict-rows: {arguments.measured} (S = {record['sequences']}, N = {record['length']}), "
          f"intervened: {arguments.intervene}")
    print(f"  form: {record['form']}; middle mass: predicted {middle['predicted']:.4f}, predicted baseline "
          f"{middle['predicted_baseline']:.4f}, change {middle['change']:+.4f} (today's layer on the rows: "
          f"{middle['change_rows_only']:+.4f})")
    if record["composition"] is not None:
        print(f"  paths composed with q = {record['composition']:.6g} (DIR/config.yaml, as jaxroll measure fitted it)")
    print(f"  wrote {', '.join(str(path) for path in paths)}")
