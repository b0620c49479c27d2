"""``jaxroll fit`` and ``jaxroll fit-kernel``."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    from ._names import FIT_CONTENTS as CONTENTS, FIT_FIELDS as FIELDS, FIT_LOSSES as LOSSES, FIT_SCHEDULES as SCHEDULES

    fit = commands.add_parser(
        "fit", help="fit lambdas and content to a measured profile",
        description="Fit the arrays named by --fit so that the configuration's influence "
                    "profile matches PROFILE.csv: a global stage (a design over the parameter "
                    "box, for up to 8 free parameters) then optax Adam with a cosine decay from "
                    "the best --restarts points. Writes "
                    "fitted.yaml (a config `jaxroll rollout` reads), fit.csv (position, "
                    "target, initial, fitted) and fit.png into --out, and prints the "
                    "Wasserstein distance before and after.")
    fit.add_argument("config", type=Path, help="rollout YAML file: the start and the fixed arrays")
    fit.add_argument("profile", type=Path, metavar="PROFILE.csv",
                     help="target profile, header token_position,probability")
    fit.add_argument("--fit", default="lambdas",
                     help=f"comma-separated free arrays, any of {','.join(FIELDS)} (default lambdas)")
    fit.add_argument("--schedule", choices=SCHEDULES, default="free",
                     help="parametrisation of free lambdas (default free: one per layer)")
    fit.add_argument("--content", choices=CONTENTS, default="per_layer",
                     help="free diagonal content per layer or per head (default per_layer)")
    fit.add_argument("--loss", choices=LOSSES, default="wasserstein", help="default wasserstein")
    fit.add_argument("--steps", type=_common.positive_int, default=2000, help="optimisation steps (default 2000)")
    fit.add_argument("--restarts", type=_common.positive_int, default=1,
                     help="starting points refined side by side: the best of the global design, "
                          "or the config and draws over the box (default 1)")
    fit.add_argument("--search", type=_common.non_negative_int, default=None,
                     help="design points of the global stage, 0 turns it off (default 128 when "
                          "at most 8 parameters are free, else 0)")
    fit.add_argument("--seed", type=int, default=0, help="seed of the restarts (default 0)")
    fit.add_argument("--length", type=_common.positive_int, default=None,
                     help="sequence length N to fit at; must equal the profile's length (default: the "
                          "config's sequence_length, which the profile must then have)")
    fit.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                     help="how to multiply by the kernels (default auto)")
    _common.add_output_arguments(fit)
    fit.set_defaults(run=_run_fit)
    _add_kernel_fit_parser(commands)


def _run_fit(arguments) -> None:
    import csv

    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io, plot
    from ..fit import IDENTIFIABILITY_MAX_PARAMETERS, fit, objective
    from ..rollout import influence

    model = io.load_config(arguments.config)
    _common.require_alibi_model(model, "fit")
    target = io.read_profile(arguments.profile)
    if arguments.length is None and target.size != model.sequence_length:
        raise ConfigError(
            f"{arguments.profile}: {target.size} positions, but {arguments.config} has sequence_length "
            f"{model.sequence_length}; allowed: a profile of {model.sequence_length} positions, or "
            f"--length {target.size} to fit at the profile's length")
    n = target.size if arguments.length is None else arguments.length
    # Check everything (and fail with one line) before the output directory is touched.
    objective(model, target, fit=arguments.fit, schedule=arguments.schedule,
              content=arguments.content, loss=arguments.loss, n=n, method=arguments.method)
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    result = fit(model, target, fit=arguments.fit, schedule=arguments.schedule,
                 content=arguments.content, loss=arguments.loss, steps=arguments.steps,
                 restarts=arguments.restarts, search=arguments.search,
                 key=jax.random.PRNGKey(arguments.seed), n=n,
                 method=arguments.method, progress=True)
    target = target / target.sum()
    initial = np.asarray(influence(model, n, method=arguments.method), dtype=np.float64)
    io.save_config(result.model, out / "fitted.yaml", overwrite=True)
    with open(out / "fit.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("token_position", "target", "initial", "fitted"))
        for row in zip(range(n), target, initial, result.profile):
            writer.writerow((row[0],) + tuple(repr(float(x)) for x in row[1:]))
    plot.plot_fit(out / "fit.png", target, initial, result.profile, result.losses,
                  title=f"{arguments.config.name} fitted to {arguments.profile.name} ({arguments.fit})")
    from ..metrics import wasserstein

    before = float(wasserstein(initial, target))
    print(f"jaxroll fit: {arguments.config} -> {arguments.profile}")
    print(f"  N = {n}, T = {model.num_layers}, H = {model.num_heads}, free: {arguments.fit}, "
          f"schedule = {arguments.schedule}, loss = {arguments.loss}, steps = {result.steps}, "
          f"restarts = {arguments.restarts}, global design = {result.search_points} points")
    print(f"  Wasserstein W1/(N-1): before {before:.6g}, after {result.metrics.wasserstein:.6g}")
    print(f"  loss: before {result.initial_loss:.6g}, after {result.final_loss:.6g}; "
          f"Spearman after {result.metrics.spearman:.6g}")
    for name, value in result.schedule_parameters.items():
        print(f"  {name} = {value:.6g}")
    if result.identifiability is None:
        print(f"  identifiability: not computed (more than {IDENTIFIABILITY_MAX_PARAMETERS} free parameters)")
    else:
        for line in result.identifiability.summary():
            print(f"  {line}")
    print(f"  wrote {out}/fitted.yaml, fit.csv, fit.png")


def _add_kernel_fit_parser(commands) -> None:
    from ._names import KERNEL_FAMILIES as FAMILIES

    fit = commands.add_parser(
        "fit-kernel", help="fit a relative-position kernel to measured dense kernels",
        description="Fit a relative-position kernel f_h(i - j) (power: -m k^alpha, alibi: -m k, table: "
                    "free) to the dense kernels of CONFIG (e.g. the config.yaml `jaxroll measure` writes "
                    "for a rotary model), by Adam on the mean row KL divergence. Writes fitted.yaml (a "
                    "config `jaxroll rollout` reads at any --length for power and alibi) and "
                    "kernel_fit.csv (per layer: KL, max abs error) into --out.")
    fit.add_argument("config", type=Path, help="rollout YAML file with a dense kernel_config")
    fit.add_argument("--family", choices=FAMILIES, default="power", help="default power")
    fit.add_argument("--heads", type=_common.positive_int, default=1, help="heads of the fitted mixture (default 1)")
    fit.add_argument("--steps", type=_common.positive_int, default=2000, help="optimisation steps (default 2000)")
    _common.add_output_arguments(fit)
    fit.set_defaults(run=_run_kernel_fit)


def _run_kernel_fit(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io
    from ..kernel_fit import fit_kernel
    from ..kernel_types import DenseKernel
    from ..metrics import wasserstein
    from ..model import KernelRolloutModel
    from ..rollout import influence

    model = io.load_config(arguments.config)
    if not isinstance(model, KernelRolloutModel) or not isinstance(model.kernel, DenseKernel):
        raise ConfigError(f"{arguments.config}: kernel_config.kernel_type: not dense; allowed: a config with "
                          "measured dense kernels (kernel_type: dense)")
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    result = fit_kernel(model, family=arguments.family, num_heads=arguments.heads, steps=arguments.steps)
    io.save_config(result.model, out / "fitted.yaml", overwrite=True)
    np.savetxt(out / "kernel_fit.csv", np.column_stack([np.arange(model.num_layers), result.divergence,
                                                        result.max_abs_error]),
               delimiter=",", header="layer,kl,max_abs_error", comments="", fmt=["%d", "%.17g", "%.17g"])
    measured = np.asarray(influence(model), dtype=np.float64)
    fitted = np.asarray(influence(result.model), dtype=np.float64)
    n = model.sequence_length
    print(f"jaxroll fit-kernel: {arguments.config} (N = {n}, T = {model.num_layers}), family {arguments.family}, "
          f"H = {arguments.heads}, steps = {arguments.steps}")
    print(f"  mean row KL: before {result.losses[0]:.6g}, after {float(np.mean(result.divergence)):.6g}; "
          f"max abs kernel error {float(np.max(result.max_abs_error)):.3g}")
    print(f"  profile Wasserstein W1/(N-1), measured kernels vs fitted: {float(wasserstein(fitted, measured)):.6g}")
    extra = ", fitted.kernels.npz" if arguments.family == "table" else ""
    print(f"  wrote {out}/fitted.yaml{extra}, kernel_fit.csv")
