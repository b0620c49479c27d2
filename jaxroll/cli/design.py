"""``jaxroll design``: interventions optimised through the rollout to a target profile or a shape goal."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common

# The names of jaxroll.designs (SHAPES, GOALS), repeated so the parser builds before JAX loads;
# tests/test_design.py checks that they agree. The free parameters and their boxes are declared on the
# intervention types: read from the registry when asked (`PARAMETERS`) or when the help is printed.
SHAPES = ("global", "per_layer", "per_head", "per_layer_head")
GOALS = ("middle_mass", "u_index")
OUTPUTS = ("interventions.yaml", "design.json", "profiles.csv", "design.png")
"""interventions.yaml: the mapping ``jaxroll rollout --intervene`` reads (what rollout writes too);
design.json: the rest of the summary (the object --json prints)."""

# The library's names of design's inputs, as the command line spells them.
_FLAGS = {"kl_budget": "--kl-budget", "kappa_form": "--kappa-form", "form": "--kappa-form", "free": "--free",
          "bounds": "--bounds", "target": "--target", "goal": "--goal", "method": "--method", "steps": "--steps",
          "search": "--search", "loss": "--loss"}


def __getattr__(name: str):
    if name == "PARAMETERS":
        from ..designs.parameters import PARAMETERS

        return PARAMETERS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_NAMES = _common.RegisteredText(lambda kinds: ", ".join(kind.name for kind in kinds), "designable")
_BOXES = _common.RegisteredText(lambda kinds: ", ".join(f"{kind.name}={kind.box[0]:g}:{kind.box[1]:g}" for kind in kinds),
                                "designable")


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "design", help="design interventions for a target profile or a shape goal",
        description="Optimise the parameters of interventions (--free) through the rollout so that the "
                    "changed model's influence profile matches --target (flat or a profile CSV) by W1 or KL, "
                    "or raises the middle mass / lowers the U-index (--goal) while every layer's attention "
                    "kernel stays within --kl-budget (mean over rows of KL(A'_row || A_row)) of the original. "
                    "A global design over the parameter boxes, then L-BFGS or Adam until the fitting "
                    "package's stopping rule passes. Writes interventions.yaml (read by jaxroll rollout "
                    "--intervene DIR/interventions.yaml), design.json (the summary's numbers), profiles.csv "
                    "(token_position, before, after[, target]) and design.png into --out; the summary says whether it converged, which parameters ended at a bound of "
                    "their box, and the KL used against the budget.")
    _common.add_model_arguments(parser)
    free = parser.add_argument("--free", required=True, metavar="NAME=SHAPE[,...]",
                               help=f"free parameters, NAME one of %(names)s and SHAPE one of {', '.join(SHAPES)} "
                                    "(gamma: global or per_layer), e.g. tau=per_layer,gamma=global")
    free.names = _NAMES
    parser.add_argument("--target", default=None, metavar="flat|PROFILE.csv",
                        help="target profile: flat (1/N everywhere) or a CSV with header token_position,probability")
    parser.add_argument("--loss", choices=("wasserstein", "kl"), default="wasserstein",
                        help="distance to --target: W1/(N-1) or KL(target || profile) (default wasserstein)")
    parser.add_argument("--goal", choices=GOALS, default=None,
                        help="instead of --target: raise middle_mass or lower u_index (needs --kl-budget when "
                             "tau, slope_scale or kappa is free)")
    parser.add_argument("--kl-budget", type=float, default=None, metavar="NATS",
                        help="with --goal: the largest mean-over-rows KL(A'_row || A_row) of any layer's kernel")
    bounds = parser.add_argument("--bounds", default=None, metavar="NAME=LOW:HIGH[,...]",
                                 help="boxes of the free parameters (default %(boxes)s)")
    bounds.boxes = _BOXES
    parser.add_argument("--kappa-form", choices=("log1p", "unsquash"), default="log1p",
                        help="form g of a free distance bias kappa g(i - j) (default log1p)")
    parser.add_argument("--steps", type=_common.positive_int, default=2000,
                        help="the most optimisation steps per local stage (default 2000); a design stops "
                             "earlier when it converges")
    parser.add_argument("--search", type=_common.non_negative_int, default=None,
                        help="points of the global design over the boxes, 0 turns it off (default 128 for up "
                             "to 8 free scalars, else 0)")
    parser.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                        help="how to multiply by the kernels (default auto)")
    _common.add_output_arguments(parser)
    _common.add_json_argument(parser)
    parser.set_defaults(run=_run_design)


def _read_target(text: str | None, n: int):
    from .. import io

    if text is None or text == "flat":
        return text, "flat"
    path = Path(text)
    profile = io.read_profile(path)
    if profile.size != n:
        raise ConfigError(f"--target {path}: {profile.size} positions; allowed: N = {n} positions (the model's "
                          "length, or --length)")
    return profile, path.name


def _write_profiles(path: Path, result) -> None:
    import csv

    columns = {"before": result.before, "after": result.after}
    if result.target is not None:
        columns["target"] = result.target
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("token_position", *columns))
        for position, row in enumerate(zip(*columns.values())):
            writer.writerow((position, *(repr(float(x)) for x in row)))


def _flag_error(error: ConfigError) -> ConfigError:
    """`error` under the flag the user typed: ``kl_budget: ...`` -> ``--kl-budget: ...``,
    ``free tau: ...`` -> ``--free tau: ...``."""
    head, _, rest = (error.field or "").partition(" ")
    if head not in _FLAGS:
        return error
    return error.renamed(f"{_FLAGS[head]} {rest}" if rest else _FLAGS[head])


def _results(result, model, source: str, free: str, out: Path) -> dict:
    """The numbers of the summary (printed, held by design.json, and the object --json prints)."""
    import numpy as np

    return {"source": source, "N": model.sequence_length, "T": model.num_layers, "H": model.num_heads, "free": free,
            "objective": result.objective, "converged": bool(result.converged), "stop_reason": result.stop_reason,
            "optimizer": result.optimizer, "steps": int(result.steps), "max_steps": int(result.max_steps),
            "outer_iterations": int(result.outer_iterations), "search_points": int(result.search_points),
            "initial_value": float(result.initial_value), "final_value": float(result.final_value),
            "interventions": result.record,
            "middle_mass": [float(x) for x in result.middle_mass], "u_index": [float(x) for x in result.u_index],
            "argmin": [int(x) for x in result.argmin], "kl": np.asarray(result.kl, np.float64),
            "kl_budget": result.kl_budget, "at_bounds": dict(result.at_bounds), "warnings": list(result.warnings),
            "out": str(out), "wrote": list(OUTPUTS)}


def _check_free_names(free: str) -> None:
    """``--free NAME=SHAPE,...``: an unknown NAME or SHAPE refused before JAX loads, as `jaxroll.design` words it
    (the built-in designable names, `_names.DESIGNABLE`; once the registry is loaded, `design` checks alone)."""
    import sys

    if "jaxroll.interventions" in sys.modules:
        return
    from ._names import DESIGNABLE

    names = [name for name, _ in DESIGNABLE]
    for entry in free.split(","):
        name, equals, shape = (part.strip() for part in entry.partition("="))
        if not equals:
            return  # not NAME=SHAPE: `design` words that refusal
        if name not in names:
            raise ConfigError(f"--free {name}: unknown parameter; allowed: one of {', '.join(names)}")
        if shape not in SHAPES:
            raise ConfigError(f"--free {name}: shape {shape!r}; allowed: one of {', '.join(SHAPES)}")


def _run_design(arguments) -> None:
    import json

    # The refusals that need no model, before JAX loads.
    if arguments.kl_budget is not None and arguments.goal is None:
        raise ConfigError("--kl-budget: applies to --goal only")
    if arguments.goal is not None and arguments.target is not None:
        raise ConfigError("--goal: give --target or --goal, not both")
    if arguments.goal is None and arguments.target is None:
        raise ConfigError("design: no objective; allowed: --target flat|PROFILE.csv or --goal middle_mass|u_index")
    _check_free_names(arguments.free)
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import yaml

    from .. import io, plot
    from ..designs import design

    model, source = _common.model_from_arguments(arguments)
    target, target_name = _read_target(arguments.target, model.sequence_length)
    # Refuse an existing --out before the (long) optimisation; nothing is written until it has finished.
    io.check_output_dir(arguments.out, force=arguments.force)
    try:
        result = design(model, arguments.free, target=target, goal=arguments.goal, loss=arguments.loss,
                        kl_budget=arguments.kl_budget, bounds=arguments.bounds, kappa_form=arguments.kappa_form,
                        steps=arguments.steps, search=arguments.search, method=arguments.method,
                        target_name=target_name, progress=True)
    except ConfigError as error:
        raise _flag_error(error) from None
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    results = _results(result, model, source, arguments.free, out)
    (out / "interventions.yaml").write_text(yaml.safe_dump(result.record, sort_keys=False), encoding="utf-8")
    (out / "design.json").write_text(json.dumps(results, default=_common.plain_json, indent=1) + "\n",
                                     encoding="utf-8")
    _write_profiles(out / "profiles.csv", result)
    change = result.middle_mass[1] - result.middle_mass[0]
    plot.plot_design(out / "design.png", result.before, result.after, result.target, fraction=0.1,
                     title=f"{Path(source).name if arguments.config else source}: {result.objective}; "
                           f"middle mass {result.middle_mass[0]:.3f} -> {result.middle_mass[1]:.3f} "
                           f"({change:+.3f})",
                      designed=result.record, kl=result.kl,
                      kl_budget=result.kl_budget)
    if arguments.json:
        _common.print_json(results)
        return
    status = "converged" if result.converged else "not converged"
    print(f"jaxroll design: {source}: {status}")
    print(f"  N = {model.sequence_length}, T = {model.num_layers}, H = {model.num_heads}, free: {arguments.free}")
    for line in result.summary():
        print(f"  {line}")
    print(f"  wrote {out}/" + ", ".join(OUTPUTS))
    for warning in result.warnings:
        print(warning)
