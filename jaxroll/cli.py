"""The ``jaxroll`` command.

Every command has ``--help``; every bad input ends with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

from .errors import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):
        raise ConfigError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}; allowed: an integer >= 1")
    return value


def _add_output_arguments(parser) -> None:
    """``--out DIR`` (default results), ``--force`` and ``--float64``, as every writing command has them."""
    parser.add_argument("--out", type=Path, default=Path("results"), help="output directory (default results)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    parser.add_argument("--float64", action="store_true", help="compute in float64")


def _add_model_arguments(parser) -> None:
    """``[CONFIG] [--preset NAME | --published NAME [--content ...] [--dataset ...]] [--length N]``."""
    from . import presets, published

    parser.add_argument("config", nargs="?", type=Path, help="rollout YAML file (default: a preset)")
    parser.add_argument("--preset", choices=presets.names(), default=None,
                        help=f"built-in geometry with a power-decay schedule (default {presets.DEFAULT} "
                             "without CONFIG or --published)")
    parser.add_argument("--published", choices=published.names(), default=None,
                        help="the paper authors' measured configuration of this model")
    parser.add_argument("--content", choices=("none", "mean", "all"), default="none",
                        help="with --published: no content, one score per layer, or per head (default none)")
    parser.add_argument("--dataset", choices=published.DATASETS, default="fineweb-edu",
                        help="with --published: the text it was measured on (default fineweb-edu)")
    parser.add_argument("--no-residual", action="store_true",
                        help="with --published: lambda = 1 in every layer (attention-only)")
    parser.add_argument("--length", type=_positive_int, default=None,
                        help="sequence length N (default: the configuration's)")
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="refuse runs whose estimated memory exceeds SIZE (e.g. 8G; "
                             "default: the memory available on this machine)")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxroll", description=(
        "Residual-aware attention rollouts: predicted position bias of causal "
        "transformers (arXiv 2602.16837)."))
    parser.add_argument("--version", action="version", version=f"jaxroll {version('jaxroll')}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rollout = commands.add_parser(
        "rollout", help="influence profile of a configuration or preset",
        description="Compute the influence profile p_T(j) = P_T[N-1, j] of a rollout "
                    "configuration (or a built-in preset) and write profile.csv, "
                    "profile.png and config.yaml into --out.")
    _add_model_arguments(rollout)
    _add_output_arguments(rollout)
    rollout.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                         help="how to multiply by the kernels (default auto)")
    rollout.set_defaults(run=_run_rollout)

    listing = commands.add_parser("presets", help="list the built-in presets",
                                  description="List the built-in model geometries.")
    listing.set_defaults(run=_run_presets)

    _add_measure_parser(commands)
    _add_theory_parsers(commands)
    _add_fit_parser(commands)
    _add_sweep_parser(commands)
    _add_kernel_fit_parser(commands)
    return parser


def _add_sweep_parser(commands) -> None:
    from ._cli_sweep import add_sweep_parser

    add_sweep_parser(commands)


def _add_measure_parser(commands) -> None:
    measure = commands.add_parser(
        "measure", help="measure lambda_t, content scores and influence on a local Hugging Face model",
        description="Measure a causal LM saved in MODEL_DIR (local files only): lambda_t per block, "
                    "content scores per layer and head, gradient influence of each input position, "
                    "optionally the mean attention. Writes measurement.npz, metadata.json, config.yaml, "
                    "influence.csv, lambdas.png and influence.png into --out. Needs jaxroll[measure].")
    measure.add_argument("model", type=Path, metavar="MODEL_DIR", help="directory written by save_pretrained")
    measure.add_argument("--texts", type=Path, required=True,
                         help=".txt (blank-line separated documents), .jsonl (field 'text') or a saved dataset")
    measure.add_argument("--length", type=_positive_int, required=True, help="tokens per sequence N")
    measure.add_argument("--samples", type=_positive_int, required=True, help="number of sequences S")
    measure.add_argument("--out", type=Path, required=True, help="output directory")
    measure.add_argument("--stats", default="lambda,content,influence",
                         help="comma-separated subset of lambda,content,influence,attention,qk "
                              "(default lambda,content,influence)")
    measure.add_argument("--dtype", choices=("bfloat16", "float32", "float64"), default="float32",
                         help="model dtype (default float32)")
    measure.add_argument("--falcon-alibi", choices=("once", "doubled"), default="once",
                         help="Falcon's ALiBi: once (intended, default) or doubled (its eager path)")
    measure.add_argument("--positions", type=_positive_int, default=1,
                         help="keep qk_mean at every K-th position (with --stats ...,qk)")
    measure.add_argument("--no-checkpointing", action="store_true",
                         help="hold every block's activations during the influence pass")
    measure.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    measure.add_argument("--force", action="store_true", help="write into a non-empty --out")
    measure.set_defaults(run=_run_measure)


def _run_measure(arguments) -> None:
    from . import io

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("measure: needs torch and transformers; install jaxroll[measure]") from None
    from . import measure

    stats = measure.parse_stats(arguments.stats)
    if arguments.resume and not (arguments.out / "checkpoint.npz").is_file():
        raise ConfigError(f"--resume: no checkpoint.npz in {arguments.out}; allowed: the --out of an interrupted run")
    # Everything is read and checked before --out is touched.
    documents = measure.read_texts(arguments.texts)
    model = measure.load_model(arguments.model, dtype=arguments.dtype)
    tokenizer = measure.load_tokenizer(arguments.model)
    token_ids, indices = measure.select_sequences(documents, tokenizer, arguments.length, arguments.samples)
    _check_measure_memory(model.config, stats, arguments)
    out = arguments.out if arguments.resume else io.prepare_output_dir(arguments.out, force=arguments.force)
    checkpoint = out / "checkpoint.npz"
    try:
        result = measure.measure(
            model, token_ids, stats=stats, falcon_alibi=arguments.falcon_alibi, positions=arguments.positions,
            checkpointing=not arguments.no_checkpointing, progress=True, checkpoint_path=checkpoint,
            resume=arguments.resume, source=str(arguments.model))
    except KeyboardInterrupt:
        raise ConfigError(f"measure: interrupted; the completed sequences are in {checkpoint}, rerun with --resume") from None
    result.document_indices = indices
    result.metadata["protocol"] = {
        "texts": str(arguments.texts), "documents": len(documents),
        "rule": "documents in order, keep those with >= N tokens, take the first N, no padding",
        "tokenizer_defaults": "add_special_tokens as the tokenizer's default", "length": arguments.length,
        "samples": arguments.samples}
    written = measure.write_measurement(result, out, overwrite=True)
    checkpoint.unlink(missing_ok=True)
    _print_measure_summary(result, out, written)


def _check_measure_memory(config, stats, arguments) -> None:
    """Refuse ``--stats attention`` / ``qk`` whose float64 means cannot fit: (L, N, N) and (L, H, n, n)."""
    from . import memory

    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    n = arguments.length
    needed = 0
    if "attention" in stats:
        needed += 8 * layers * n * n
    if "qk" in stats:
        kept = len(range(0, n, arguments.positions))
        needed += 8 * layers * heads * kept * kept
    memory.check_fits(needed, f"measure --stats {arguments.stats} at N = {n}", allowed=(
        "a shorter --length, fewer --stats (or --positions K for qk)"))


def _print_measure_summary(result, out, written) -> None:
    import numpy as np

    meta = result.metadata
    print(f"jaxroll measure: {meta['model']} ({meta['model_type']}, {meta['num_layers']} layers, "
          f"{meta['num_heads']} heads, {meta['dtype']})")
    print(f"  S = {meta['num_sequences']} sequences of N = {result.sequence_length} tokens; "
          f"formula: {meta['logit_formula']}")
    if result.lambdas is not None:
        print(f"  lambda_t: mean {float(np.mean(result.lambdas)):.4g}, first {result.lambdas[0]:.4g}, "
              f"last {result.lambdas[-1]:.4g}")
    if result.influence is not None:
        print(f"  influence: p[0] = {result.influence[0]:.4g}, p[-1] = {result.influence[-1]:.4g}, "
              f"argmin = {int(np.argmin(result.influence))}")
    print(f"  wrote {out}/" + ", ".join(path.name for path in written))


def _run_presets(arguments) -> None:
    from .presets import GEOMETRIES

    print("Presets (--preset NAME): each model's geometry, standard ALiBi slopes, no content, and a")
    print("power-decay schedule lambda_t = lambda_0 / (t + 1)^beta fitted to the measured one.")
    print(f"  {'name':14} {'model':22} {'layers':>6} {'heads':>5} {'lambda_0':>8} {'beta':>6}")
    for name, geometry in GEOMETRIES.items():
        print(f"  {name:14} {geometry.model_id:22} {geometry.num_layers:6d} {geometry.num_heads:5d} "
              f"{geometry.lambda_0:8.4f} {geometry.beta:6.4f}")
    print()
    print("Published (--published NAME [--content none|mean|all] [--dataset D] [--no-residual]): the")
    print("paper authors' measured lambda schedules (one per layer) and content scores, N = 256.")
    print("  content none: fineweb-edu, dclm, wikipedia; mean: fineweb-edu; all: fineweb-edu, dclm, wikipedia")
    for name, geometry in GEOMETRIES.items():
        print(f"  {name:14} {geometry.model_id:22} {geometry.num_layers:6d} {geometry.num_heads:5d}")


def _model_from_arguments(arguments):
    """The model of ``[CONFIG] [--preset NAME] [--length N]`` and a name for it."""
    import dataclasses

    from . import io, presets, published

    given = [flag for flag, value in (("CONFIG", arguments.config), ("--preset", arguments.preset),
                                      ("--published", arguments.published)) if value is not None]
    if len(given) > 1:
        raise ConfigError(f"{arguments.command}: give one of CONFIG, --preset, --published; got {' and '.join(given)}")
    published_only = [flag for flag, used in (("--content", arguments.content != "none"),
                                              ("--dataset", arguments.dataset != "fineweb-edu"),
                                              ("--no-residual", arguments.no_residual)) if used]
    if published_only and arguments.published is None:
        raise ConfigError(f"{published_only[0]}: applies to --published only")
    if arguments.config is not None:
        model, source = io.load_config(arguments.config), str(arguments.config)
    elif arguments.published is not None:
        content = None if arguments.content == "none" else arguments.content
        model = published.load(arguments.published, content, arguments.dataset,
                               residual=not arguments.no_residual)
        source = (f"published {arguments.published} ({arguments.content} content, {arguments.dataset}"
                  f"{', no residual' if arguments.no_residual else ''})")
    else:
        name = arguments.preset or presets.DEFAULT
        model, source = presets.get(name), f"preset {name}"
    if arguments.length is not None:
        model = dataclasses.replace(model, sequence_length=arguments.length)
    _check_kernel_length(model)
    _check_memory(model, arguments)
    return model, source


def _check_memory(model, arguments) -> None:
    """Refuse, before anything is written, a run that cannot fit in memory."""
    from . import memory

    limit = None if arguments.max_memory is None else memory.parse_size(arguments.max_memory)
    method = getattr(arguments, "method", "auto")
    itemsize = 8 if arguments.float64 else 4
    needed = memory.influence_bytes(model.sequence_length, model.num_heads, method, itemsize)
    memory.check_fits(needed, f"{arguments.command}: N = {model.sequence_length}", limit)


def _check_kernel_length(model) -> None:
    """A kernel model's length, checked before anything is written (dense N, table offsets)."""
    from .model import KernelRolloutModel

    if isinstance(model, KernelRolloutModel):
        try:
            model.kernel.check_length(model.sequence_length)
        except ConfigError as error:
            raise ConfigError(f"--length {model.sequence_length}: {str(error).partition(': ')[2]}") from None


def _require_alibi_model(model, command: str) -> None:
    from .model import KernelRolloutModel

    if isinstance(model, KernelRolloutModel):
        raise ConfigError(f"{command}: CONFIG has a kernel_config ({type(model.kernel).__name__}); allowed: an "
                          "ALiBi configuration (attention_config)" + (
                              "; fit a kernel with jaxroll fit-kernel" if command == "fit" else ""))


def _run_rollout(arguments) -> None:
    import dataclasses

    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from . import io, plot
    from .rollout import influence_with_mass

    model, source = _model_from_arguments(arguments)
    out = io.prepare_output_dir(arguments.out, force=arguments.force)

    profile, mass = influence_with_mass(model, method=arguments.method)
    attention_only = influence_with_mass(
        dataclasses.replace(model, lambdas=np.ones_like(model.lambdas)), method=arguments.method
    )[0]
    profile = np.asarray(profile, dtype=np.float64)
    if not np.all(np.isfinite(profile)):
        raise ConfigError("rollout: the profile is not finite; try --float64")

    io.write_profile(profile, out / "profile.csv", overwrite=True)
    io.save_config(model, out / "config.yaml", overwrite=True)
    plot.plot_profile(out / "profile.png", profile, attention_only,
                      title=f"{source}: N={model.sequence_length}, T={model.num_layers}, H={model.num_heads}")
    _print_summary(model, profile, float(mass), source, out)


def _print_summary(model, profile, mass, source, out) -> None:
    import numpy as np

    from .metrics import edge_count

    n = profile.size
    k = edge_count(n, 0.1)
    start = (n - k) // 2
    print(f"jaxroll rollout: {source}")
    print(f"  N = {n}, T = {model.num_layers}, H = {model.num_heads}, mask = {model.mask}")
    print(f"  sum of lambdas = {float(np.sum(model.lambdas)):.6g}, mass before normalising = {mass:.9g}")
    print(f"  p[0] = {profile[0]:.6g}, p[-1] = {profile[-1]:.6g}, argmin = {int(np.argmin(profile))}")
    print(f"  mass of the first / middle / last tenth ({k} positions each): "
          f"{profile[:k].sum():.6g} / {profile[start:start + k].sum():.6g} / {profile[-k:].sum():.6g}")
    from .schema import kernel_arrays

    extra = ", config.kernels.npz" if kernel_arrays(model) else ""
    print(f"  wrote {out}/profile.csv, profile.png, config.yaml{extra}")


def _add_theory_parsers(commands) -> None:
    compare = commands.add_parser(
        "compare", help="distances and shape statistics of two profiles",
        description="Compare two profile CSVs (header token_position,probability): "
                    "Wasserstein W1/(N-1), Spearman, KL(A||B), Jensen-Shannon, total "
                    "variation, and the shape of each (p[0], p[-1], argmin, center of "
                    "mass, edge and middle mass, U-index).")
    compare.add_argument("first", type=Path, metavar="A.csv", help="profile p")
    compare.add_argument("second", type=Path, metavar="B.csv", help="profile q")
    compare.add_argument("--normalize", action="store_true",
                         help="rescale profiles that do not sum to 1 (default: reject them)")
    compare.add_argument("--fraction", type=float, default=0.1,
                         help="edge fraction for edge mass and U-index (default 0.1)")
    compare.set_defaults(run=_run_compare)

    forces = commands.add_parser(
        "forces", help="the four forces: causal, residual, ALiBi, content",
        description="Decompose a configuration's profile by an ablation ladder: causal "
                    "masking alone (lambda = 1, no slopes, no content), + residuals, + "
                    "ALiBi, + content. Writes forces.csv and forces.png into --out and "
                    "prints the drift each force adds.")
    _add_model_arguments(forces)
    _add_output_arguments(forces)
    forces.set_defaults(run=_run_forces)


def _run_compare(arguments) -> None:
    from . import io, metrics

    if not 0 < arguments.fraction < 0.5:
        raise ConfigError(f"--fraction: got {arguments.fraction}; allowed: 0 < fraction < 0.5")
    p = io.read_profile(arguments.first)
    q = io.read_profile(arguments.second)
    try:
        result = metrics.compare(p, q, normalize=arguments.normalize, fraction=arguments.fraction)
    except ConfigError as error:
        field, _, rest = str(error).partition(":")
        name = {"p": arguments.first, "q": arguments.second}.get(field, field)
        raise ConfigError(f"{name}:{rest}") from None
    print(f"jaxroll compare: A = {arguments.first}, B = {arguments.second}, N = {p.size}")
    for field in ("wasserstein", "spearman", "kl", "js", "total_variation"):
        label = {"kl": "kl(A || B)", "wasserstein": "wasserstein W1/(N-1)"}.get(field, field)
        print(f"  {label:22} {getattr(result, field):.9g}")
    print(f"  {'':22} {'A':>14} {'B':>14}")
    for field in metrics.Shape._fields:
        a, b = getattr(result.p, field), getattr(result.q, field)
        print(f"  {field:22} {a:14.6g} {b:14.6g}")


def _run_forces(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from . import io, plot, theory

    model, source = _model_from_arguments(arguments)
    _require_alibi_model(model, "forces")
    out = io.prepare_output_dir(arguments.out, force=arguments.force)

    result = theory.forces(model)
    profiles = np.asarray(result.profiles, dtype=np.float64)
    if not np.all(np.isfinite(profiles)):
        raise ConfigError("forces: a profile is not finite; try --float64")
    positions = np.arange(profiles.shape[1])
    np.savetxt(out / "forces.csv", np.column_stack([positions, profiles.T]), delimiter=",",
               header="token_position," + ",".join(result.names), comments="",
               fmt=["%d"] + ["%.17g"] * len(result.names))
    label = arguments.config.name if arguments.config is not None else source
    plot.plot_forces(out / "forces.png", profiles, result.names,
                     title=f"{label}: N={model.sequence_length}, T={model.num_layers}, H={model.num_heads}")
    print(f"jaxroll forces: {source} (N = {profiles.shape[1]}, T = {model.num_layers}, H = {model.num_heads})")
    print(f"  {'force':10} {'center':>9} {'first10%':>9} {'last10%':>9} "
          f"{'d center':>9} {'d first':>9} {'d last':>9}")
    for k, name in enumerate(result.names):
        print(f"  +{name:9} {float(result.center_of_mass[k]):9.4f} {float(result.first_mass[k]):9.4f} "
              f"{float(result.last_mass[k]):9.4f} {float(result.drift_center_of_mass[k]):+9.4f} "
              f"{float(result.drift_first[k]):+9.4f} {float(result.drift_last[k]):+9.4f}")
    print(f"  wrote {out}/forces.csv, forces.png")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}; allowed: an integer >= 0")
    return value


def _add_fit_parser(commands) -> None:
    from .fit import CONTENTS, FIELDS, LOSSES, SCHEDULES

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
    fit.add_argument("--steps", type=_positive_int, default=2000, help="optimisation steps (default 2000)")
    fit.add_argument("--restarts", type=_positive_int, default=1,
                     help="starting points refined side by side: the best of the global design, "
                          "or the config and draws over the box (default 1)")
    fit.add_argument("--search", type=_non_negative_int, default=None,
                     help="design points of the global stage, 0 turns it off (default 128 when "
                          "at most 8 parameters are free, else 0)")
    fit.add_argument("--seed", type=int, default=0, help="seed of the restarts (default 0)")
    fit.add_argument("--length", type=_positive_int, default=None,
                     help="sequence length N to fit at; must equal the profile's length (default: the "
                          "config's sequence_length, which the profile must then have)")
    fit.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                     help="how to multiply by the kernels (default auto)")
    _add_output_arguments(fit)
    fit.set_defaults(run=_run_fit)


def _run_fit(arguments) -> None:
    import csv

    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from . import io, plot
    from .fit import IDENTIFIABILITY_MAX_PARAMETERS, fit, objective
    from .rollout import influence

    model = io.load_config(arguments.config)
    _require_alibi_model(model, "fit")
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
    from .metrics import wasserstein

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
    from .kernel_fit import FAMILIES

    fit = commands.add_parser(
        "fit-kernel", help="fit a relative-position kernel to measured dense kernels",
        description="Fit a relative-position kernel f_h(i - j) (power: -m k^alpha, alibi: -m k, table: "
                    "free) to the dense kernels of CONFIG (e.g. the config.yaml `jaxroll measure` writes "
                    "for a rotary model), by Adam on the mean row KL divergence. Writes fitted.yaml (a "
                    "config `jaxroll rollout` reads at any --length for power and alibi) and "
                    "kernel_fit.csv (per layer: KL, max abs error) into --out.")
    fit.add_argument("config", type=Path, help="rollout YAML file with a dense kernel_config")
    fit.add_argument("--family", choices=FAMILIES, default="power", help="default power")
    fit.add_argument("--heads", type=_positive_int, default=1, help="heads of the fitted mixture (default 1)")
    fit.add_argument("--steps", type=_positive_int, default=2000, help="optimisation steps (default 2000)")
    _add_output_arguments(fit)
    fit.set_defaults(run=_run_kernel_fit)


def _run_kernel_fit(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from . import io
    from .kernel_fit import fit_kernel
    from .kernel_types import DenseKernel
    from .metrics import wasserstein
    from .model import KernelRolloutModel
    from .rollout import influence

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


def main(argv=None) -> int:
    parser = _build_parser()
    try:
        arguments = parser.parse_args(argv)
        arguments.run(arguments)
    except ConfigError as error:
        print(f"jaxroll: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
