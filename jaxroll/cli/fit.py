"""``jaxroll fit``: a rollout model fitted to a profile."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    from ._names import DATASETS, PRESETS, PUBLISHED
    from ._names import FIT_CONTENTS as CONTENTS, FIT_FIELDS as FIELDS, FIT_LOSSES as LOSSES, FIT_SCHEDULES as SCHEDULES

    fit = commands.add_parser(
        "fit", help="fit lambdas and content to a measured profile",
        description="Fit the arrays named by --fit so that the influence profile of CONFIG (or "
                    "--preset/--published) matches PROFILE.csv: a global stage (a design over the "
                    "parameter box, for up to 8 free parameters) then, from the best points, L-BFGS "
                    "(up to 8 free parameters) or Adam with a cosine decay, until the fit converges "
                    "(gradient norm and relative loss change below tolerances) or --steps is reached. "
                    "Writes fitted.yaml (a config `jaxroll rollout` reads; a power_decay or constant "
                    "schedule with its parameters), fitted.csv (the fitted profile, "
                    "token_position,probability), fit.csv (position, target, initial, fitted) and "
                    "fit.png into --out; the summary's first line says whether the fit converged.")
    fit.add_argument("config", nargs="?", type=Path, default=None,
                     help="rollout YAML file: the start and the fixed arrays (or --preset/--published)")
    fit.add_argument("profile", type=Path, metavar="PROFILE.csv",
                     help="target profile, header token_position,probability")
    fit.add_argument("--preset", choices=PRESETS, default=None,
                     help="start from a built-in geometry with a power-decay schedule")
    fit.add_argument("--published", choices=PUBLISHED, default=None,
                     help="start from the paper authors' measured configuration of this model")
    fit.add_argument("--content", action=_PublishedContent, default="none", metavar="{none,mean,all}",
                     help="with --published: no content, one score per layer, or per head (default none), as "
                          "every command says --content")
    fit.add_argument("--dataset", choices=DATASETS, default="fineweb-edu",
                     help="with --published: the text it was measured on (default fineweb-edu)")
    fit.add_argument("--fit", default="lambdas",
                     help=f"comma-separated free arrays, any of {','.join(FIELDS)} (default lambdas)")
    fit.add_argument("--schedule", choices=SCHEDULES, default="free",
                     help="parametrisation of free lambdas (default free: one per layer)")
    fit.add_argument("--content-shape", choices=CONTENTS, default="per_layer",
                     help="the shape of free diagonal_scores: one per layer or one per head (default per_layer)")
    fit.add_argument("--loss", choices=LOSSES, default="wasserstein", help="default wasserstein")
    fit.add_argument("--steps", type=_common.positive_int, default=2000,
                     help="the most optimisation steps per starting point (default 2000); a fit stops "
                          "earlier when it converges")
    fit.add_argument("--optimizer", choices=("auto", "lbfgs", "adam"), default="auto",
                     help="local optimiser (default auto: L-BFGS for up to 8 free parameters, else Adam)")
    fit.add_argument("--gradient-tolerance", type=float, default=None,
                     help="stop when max |gradient| (unconstrained coordinates) and the relative loss "
                          "change are below their tolerances (default 1e-8)")
    fit.add_argument("--loss-tolerance", type=float, default=None,
                     help="tolerance on the relative change of the loss per step (default 1e-10)")
    fit.add_argument("--restarts", type=_common.positive_int, default=None,
                     help="starting points refined one after the other: the best of the global design, "
                          "or the config and draws over the box (default 3 with L-BFGS, else 1)")
    fit.add_argument("--search", type=_common.non_negative_int, default=None,
                     help="design points of the global stage, 0 turns it off (default 128 when "
                          "at most 8 parameters are free, else 0)")
    fit.add_argument("--seed", type=int, default=0, help="seed of the restarts (default 0)")
    fit.add_argument("--length", type=_common.positive_int, default=None,
                     help="sequence length N to fit at; must equal the profile's length (default: the "
                          "starting model's sequence_length, which the profile must then have; the "
                          "presets and published configurations have 256)")
    fit.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                     help="how to multiply by the kernels (default auto)")
    _common.add_output_arguments(fit)
    _common.add_json_argument(fit)
    _common.add_retired_argument(fit, "--published-content", "--content")
    fit.set_defaults(run=_run_fit)


class _PublishedContent(argparse.Action):
    """``--content``: none, mean or all, as every command says; the shape of free content
    (per_layer, per_head) is --content-shape, and is named so in one line."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values in ("per_layer", "per_head"):
            raise ConfigError(f"--content {values}: the shape of free content is --content-shape {values}; "
                              "--content is the published content (none, mean, all) as in every command",
                              field="--content", value=values, allowed="none, mean, all")
        if values not in ("none", "mean", "all"):
            raise ConfigError.of("--content", values, "none, mean, all")
        setattr(namespace, self.dest, values)


def _start_model(arguments):
    """The starting model of ``[CONFIG | --preset NAME | --published NAME]`` and a name for it."""
    if arguments.config is None and arguments.preset is None and arguments.published is None:
        raise ConfigError(f"{arguments.command}: no starting model; allowed: CONFIG, --preset NAME or --published NAME")
    if arguments.published is None and (arguments.content != "none" or arguments.dataset != "fineweb-edu"):
        flag = "--content" if arguments.content != "none" else "--dataset"
        raise ConfigError(f"{flag}: applies to --published only")
    shared = argparse.Namespace(
        command=arguments.command, config=arguments.config, preset=arguments.preset,
        published=arguments.published, content=arguments.content, dataset=arguments.dataset,
        no_residual=False, length=None, max_memory=None, float64=arguments.float64, method=arguments.method)
    return _common.model_from_arguments(shared)


def _run_fit(arguments) -> None:
    import csv

    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io, plot
    from ..fitting import GRADIENT_TOLERANCE, LOSS_TOLERANCE, default_lbfgs, default_optimizer, fit, objective
    from ..metrics import wasserstein
    from ..rollout import influence

    model, source = _start_model(arguments)
    # A kernel configuration (measured dense attention, a table or power kernel) fits its lambdas with the
    # kernel held fixed; jaxroll.fit refuses any other --fit on it in one line.
    target = io.read_profile(arguments.profile)
    # One rule for every start (CONFIG, --preset, --published): the profile has the
    # model's sequence_length, or --length says at which length to fit.
    if arguments.length is None and target.size != model.sequence_length:
        raise ConfigError(
            f"{arguments.profile}: {target.size} positions, but {source} has sequence_length "
            f"{model.sequence_length}; allowed: a profile of {model.sequence_length} positions, or "
            f"--length {target.size} to fit at the profile's length")
    n = model.sequence_length if arguments.length is None else arguments.length
    tolerances = {"gradient_tolerance": GRADIENT_TOLERANCE if arguments.gradient_tolerance is None
                  else arguments.gradient_tolerance,
                  "loss_tolerance": LOSS_TOLERANCE if arguments.loss_tolerance is None else arguments.loss_tolerance}
    for flag, value in tolerances.items():
        if not (np.isfinite(value) and value >= 0):
            raise ConfigError(f"--{flag.replace('_', '-')}: got {value!r}; allowed: a finite number >= 0")
    optimizer = {"auto": None, "lbfgs": default_lbfgs(),
                 "adam": default_optimizer(arguments.steps)}[arguments.optimizer]
    # Check everything (and fail with one line) before the output directory is touched.
    try:
        objective(model, target, fit=arguments.fit, schedule=arguments.schedule,
                  content=arguments.content_shape, loss=arguments.loss, n=n, method=arguments.method)
    except ConfigError as error:  # named as typed: jaxroll.fit's content= is --content-shape
        flags = {"fit": "--fit", "schedule": "--schedule", "content": "--content-shape", "loss": "--loss",
                 "method": "--method", "target": str(arguments.profile)}
        raise (error.renamed(flags[error.field]) if error.field in flags else error) from None
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    result = fit(model, target, fit=arguments.fit, schedule=arguments.schedule,
                 content=arguments.content_shape, loss=arguments.loss, steps=arguments.steps,
                 restarts=arguments.restarts, search=arguments.search, optimizer=optimizer,
                 key=jax.random.PRNGKey(arguments.seed), n=n,
                 method=arguments.method, progress=True, **tolerances)
    target = target / target.sum()
    initial = np.asarray(influence(model, n, method=arguments.method), dtype=np.float64)
    # What was fitted is what is saved: a power_decay or constant schedule with its parameters.
    io.save_config(result.model, out / "fitted.yaml", overwrite=True, schedule=result.schedule_config)
    io.write_profile(result.profile, out / "fitted.csv", overwrite=True)
    with open(out / "fit.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("token_position", "target", "initial", "fitted"))
        for row in zip(range(n), target, initial, result.profile):
            writer.writerow((row[0],) + tuple(repr(float(x)) for x in row[1:]))
    plot.plot_fit(out / "fit.png", target, initial, result.profile, result.losses,
                  initial_loss=result.initial_loss,
                  title=f"{Path(source).name} fitted to {arguments.profile.name} ({arguments.fit}, "
                        f"schedule {arguments.schedule})")
    results = _results(result, model, source, arguments, n, before=float(wasserstein(initial, target)), out=out)
    if arguments.json:
        _common.print_json(results)
    else:
        _print_summary(results, result)


def _results(result, model, source: str, arguments, n: int, *, before: float, out) -> dict:
    """The numbers of the summary: the table and --json show the same."""
    from ..fitting import report as fit_report

    identifiability_lines, bound_warnings = fit_report.bound_lines(result)
    status = result.stop_reason
    if bound_warnings and result.converged:  # converged, but not inside the model's range
        status = status.replace("converged:", "converged at a bound of the model's range:", 1)
    warnings = list(result.warnings) + bound_warnings
    if not result.converged and (not result.warnings or "step limit" in result.stop_reason):
        warnings.append(f"warning: the fit did not converge in {result.max_steps} steps ({result.stop_reason}); "
                        "the parameters may be short of the optimum: raise --steps or the tolerances")
    return {"source": source, "profile": str(arguments.profile), "status": status,
            "converged": bool(result.converged), "N": n, "T": model.num_layers, "H": model.num_heads,
            "free": arguments.fit, "schedule": arguments.schedule, "loss": arguments.loss,
            "optimizer": result.optimizer, "steps": int(result.steps), "max_steps": int(result.max_steps),
            "restart_steps": [int(x) for x in result.restart_steps],
            "restarts": int(result.restart_losses.size), "search_points": int(result.search_points),
            "wasserstein_before": before, "wasserstein_after": float(result.metrics.wasserstein),
            "loss_before": float(result.initial_loss), "loss_after": float(result.final_loss),
            "spearman_after": float(result.metrics.spearman),
            "schedule_parameters": {name: float(value) for name, value in result.schedule_parameters.items()},
            "identifiability_computed": result.identifiability is not None, "identifiability": identifiability_lines,
            "warnings": warnings, "out": str(out), "wrote": ["fitted.yaml", "fitted.csv", "fit.csv", "fit.png"]}


def _print_summary(r: dict, result) -> None:
    """The summary, its counts and its warnings in one place (stdout); progress went to stderr."""
    from ..fitting import IDENTIFIABILITY_MAX_PARAMETERS

    print(f"jaxroll fit: {r['source']} -> {r['profile']}: {r['status']}")
    steps = f"steps = {r['steps']} of at most {r['max_steps']}"
    if len(r["restart_steps"]) > 1:
        steps += (f" (the best of {len(r['restart_steps'])} restarts; the longest took "
                  f"{max(r['restart_steps'])}, the progress count)")
    print(f"  N = {r['N']}, T = {r['T']}, H = {r['H']}, free: {r['free']}, "
          f"schedule = {r['schedule']}, loss = {r['loss']}, optimizer = {r['optimizer']}, "
          f"{steps}, restarts = {r['restarts']}, global design = {r['search_points']} points")
    print(f"  Wasserstein W1/(N-1): before {r['wasserstein_before']:.6g}, after {r['wasserstein_after']:.6g}")
    print(f"  loss: before {r['loss_before']:.6g}, after {r['loss_after']:.6g}; "
          f"Spearman after {r['spearman_after']:.6g}")
    for name, value in result.schedule_parameters.items():
        print(f"  {name} = {value:.8g}")  # 8 digits: 0.99999955 at a bound, not 1
    if not r["identifiability_computed"]:
        print(f"  identifiability: not computed (more than {IDENTIFIABILITY_MAX_PARAMETERS} free parameters)")
    for line in r["identifiability"]:
        print(f"  {line}")
    print(f"  wrote {r['out']}/{', '.join(r['wrote'])}")
    for warning in r["warnings"]:
        print(warning)
