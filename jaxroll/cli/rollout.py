"""``jaxroll rollout``: the influence profile of one or more configurations or presets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import ConfigError
from . import _common

CHANGES_FILE = "interventions.yaml"
"""What ``rollout --intervene`` and ``design`` write: the mapping ``--intervene FILE.yaml`` reads back."""


def add_parser(commands) -> None:
    rollout = commands.add_parser(
        "rollout", help="influence profile of a configuration or preset",
        description="Compute the influence profile p_T(j) = P_T[N-1, j] of a rollout "
                    "configuration (or a built-in preset) and write profile.csv, "
                    "profile.png and config.yaml into --out. At small N (hundreds of positions) the CPU "
                    "is the faster device: --device cpu. A small ALiBi CONFIG (at most about 8 million kernel "
                    "entries formed, e.g. the paper's 64-token example) is rolled out in NumPy float64 without "
                    "loading JAX; its numbers equal --float64's to 1e-12.")
    _common.add_model_arguments(rollout)
    rollout.add_argument("more_configs", nargs="*", type=Path, metavar="CONFIG ...",
                         help="more rollout YAML files, run in one process (compiled programs shared): "
                              "each writes into --out/<its path below the files' common folder>")
    _common.add_output_arguments(rollout)
    rollout.add_argument("--no-figure", action="store_true",
                         help="skip profile.png (drawing it takes most of a small run's time)")
    rollout.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                         help="how to multiply by the kernels (default auto)")
    rollout.add_argument("--intervene", metavar="NAME=VALUE[,...]", action=_common.GivenOnce,
                         help="predict the profile after changing the model: sinks (K tokens prepended: the "
                              "profile over the original positions, renormalised, and the sinks' mass), "
                              "rotary_ratio (rotary positions / r per head, Ms-PoE; a rotary model's offset "
                              "kernel), tau (softmax temperature), "
                              "slope_scale (ALiBi slopes), ssmax_scale (SSMax: logits x s ln n), kappa (a "
                              "distance bias kappa g(i - j); kappa_form "
                              "log1p or unsquash, kappa_k), gamma (the attention branch's strength), e.g. "
                              "tau=0.7,gamma=0.5, or a YAML file of them (the interventions.yaml of "
                              "jaxroll design); given once; config.yaml is then the changed "
                              f"model and {CHANGES_FILE} records the change (docs/interventions.md)")
    _common.add_json_argument(rollout)
    _common.add_device_argument(rollout)
    rollout.set_defaults(run=_run_rollout)


@dataclasses.dataclass(frozen=True)
class _Options:
    """What every run of one ``jaxroll rollout`` shares (read once from the parsed arguments)."""

    method: str
    figure: bool
    changes: dict  # `interventions.describe` of the changes: what interventions.yaml holds
    sinks: object  # the SinkTokens change, or None
    quiet: bool  # --json: the results go to stdout as one object, not as the table
    kernel_changes: tuple = ()  # the names of the changes that change the attention kernel A_t (tau, kappa, ...)


# The fields an intervention's constructor names, as --intervene spells them.
_INTERVENE_FIELDS = {"form": "kappa_form", "k": "kappa_k"}


def _intervene_error(error: ConfigError) -> ConfigError:
    """`error` under the name typed in --intervene (``form`` -> ``--intervene kappa_form``)."""
    from .. import interventions

    field = _INTERVENE_FIELDS.get(error.field, error.field)
    if field in interventions.NAMES:
        return error.renamed(f"--intervene {field}")
    return error


def _small_model(arguments):
    """The configuration as a `jaxroll.numpy_rollout.SmallModel` when NumPy answers this run faster (one ALiBi
    CONFIG file, small enough: `numpy_rollout.is_small`; no --intervene, --method, accelerator or batch),
    else None: the JAX path then runs, and says in one line what it refuses."""
    if (arguments.config is None or arguments.more_configs or arguments.intervene or arguments.method != "auto"
            or arguments.device not in ("auto", "cpu") or arguments.preset or arguments.published
            or arguments.content != "none" or arguments.dataset != "fineweb-edu" or arguments.no_residual):
        return None
    from .. import numpy_rollout

    model = numpy_rollout.read_config(arguments.config)
    if model is None or model.kind != "alibi":
        return None
    if arguments.length is not None:
        model = model.with_length(arguments.length)
    return model if numpy_rollout.is_small(model) else None


def _run_small(arguments, model) -> None:
    """`_run_rollout` in NumPy float64 (`jaxroll.numpy_rollout`): the same files, summary and --json, no JAX."""
    import numpy as np

    import sys

    from .. import io, memory, numpy_rollout

    if "jax" in sys.modules:  # JAX already loaded in this process: --device says where it may compute, as ever
        _common.device_context(arguments.device, command_line=getattr(arguments, "command_line", False))
    limit = None if arguments.max_memory is None else memory.parse_size(arguments.max_memory)
    memory.check_fits(numpy_rollout.working_bytes(model), f"rollout: N = {model.sequence_length}", limit)
    options = _Options(method=arguments.method, figure=not arguments.no_figure, changes={}, sinks=None,
                       quiet=arguments.json)
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    profile, mass = numpy_rollout.influence_with_mass(model)
    attention_only = numpy_rollout.influence_with_mass(dataclasses.replace(model, lambdas=np.ones_like(model.lambdas)))[0]
    source = str(arguments.config)
    io.write_profile(profile, out / "profile.csv", overwrite=True)
    numpy_rollout.save_config(model, out / "config.yaml")
    if options.figure:
        _draw_profile(out / "profile.png", model, profile, attention_only, None, source, "", options)
    results = _results(model, profile, mass, source, out, options, None, kernel_file=False)
    if arguments.json:
        _common.print_json(results)
    else:
        _print_summary(results, "")


def _run_rollout(arguments) -> None:
    small = _small_model(arguments)
    if small is not None:  # a small ALiBi file: NumPy answers before JAX would have loaded
        return _run_small(arguments, small)
    # Everything here runs on the main thread: no import runs in a thread that could outlive it
    # (interpreter shutdown stopping a daemon thread inside a native import aborts the process with
    # "terminate called without an active exception", signal 6, instead of exit status 2). A
    # background import of matplotlib gained nothing measurable (2.64 s against 2.68 s, the
    # mean of 6 runs each at N = 256 on 2 shared cores, noise +-0.5 s).
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)

    from .. import interventions, io
    from ..bucket import influence_with_mass  # pads small models to shared compiled shapes

    try:
        changes = interventions.parse(arguments.intervene) if arguments.intervene else []
    except ConfigError as error:
        raise _intervene_error(error) from None
    device = _common.device_context(arguments.device, command_line=getattr(arguments, "command_line", False))
    with device:
        runs = _batch(arguments) if arguments.more_configs else [
            (*_common.model_from_arguments(arguments), arguments.out)]
        # Every change is applied (and refused, in one line) before --out is touched.
        baselines = [model for model, _, _ in runs] if changes else [None] * len(runs)
        try:
            runs = [(interventions.apply_all(model, changes), source, out) for model, source, out in runs]
        except ConfigError as error:
            raise _intervene_error(error) from None
        options = _Options(method=arguments.method, figure=not arguments.no_figure,
                           changes=interventions.describe(changes), quiet=arguments.json,
                           sinks=interventions.length_change(changes),
                           kernel_changes=tuple(change.name for change in changes if change.changes == "kernel"))
        io.prepare_output_dir(arguments.out, force=arguments.force)
        results = []
        for (model, source, out), baseline in zip(runs, baselines):
            out.mkdir(parents=True, exist_ok=True)
            results.append(_write_rollout(model, source, out, options, influence_with_mass, io, baseline))
    if arguments.json:
        _common.print_json(results[0] if len(results) == 1 else {"runs": results})


def _batch(arguments):
    """``jaxroll rollout A.yaml B.yaml ...``: every model loaded and checked before --out is touched."""
    import argparse
    import os

    paths = [arguments.config, *arguments.more_configs]
    if arguments.preset is not None or arguments.published is not None:
        raise ConfigError("rollout: several CONFIG files take no --preset or --published")
    if len(set(map(os.path.abspath, paths))) < len(paths):
        raise ConfigError("rollout: a CONFIG file is given twice")
    parent = Path(os.path.commonpath([os.path.abspath(p.parent) for p in paths]))
    runs = []
    for path in paths:
        model, source = _common.model_from_arguments(argparse.Namespace(**{**vars(arguments), "config": path}))
        name = "-".join(Path(os.path.abspath(path)).relative_to(parent).with_suffix("").parts)
        runs.append((model, source, arguments.out / name))
    return runs


def _mean_kernel_note(baseline, options: _Options) -> str | None:
    """The note a change of logits on a measured mean kernel (a `DenseKernel`: ``stores_dense``) earns."""
    if baseline is None or not options.kernel_changes or not baseline.kernel.stores_dense:
        return None
    return (f"note: {', '.join(options.kernel_changes)} changed a measured mean kernel (the mean over sequences "
            "of softmax rows, which has no logits): the rollout tempers or biases the mean itself, an "
            "approximation (the mean of changed rows is not the changed mean; docs/interventions.md)")


def _write_rollout(model, source, out, options: _Options, influence_with_mass, io, baseline=None) -> dict:
    """Write one run's files into `out`, print its summary (unless --json) and return its results;
    `baseline` (with --intervene) is the model before the change, drawn beside it in profile.png."""
    import numpy as np

    profile, mass = influence_with_mass(model, method=options.method)
    attention_only = influence_with_mass(
        dataclasses.replace(model, lambdas=np.ones_like(model.lambdas)), method=options.method
    )[0]
    profile = np.asarray(profile, dtype=np.float64)
    if not np.all(np.isfinite(profile)):
        raise ConfigError("rollout: the profile is not finite; try --float64")
    sinks, sink_mass = options.sinks, None
    if sinks is not None:  # the model runs at n + k; what is reported is the n original positions
        sink_mass, profile = (np.asarray(part, dtype=np.float64) for part in sinks.split(profile))
        attention_only = sinks.split(attention_only)[1]
        sink_mass = float(sink_mass)

    io.write_profile(profile, out / "profile.csv", overwrite=True)
    io.save_config(model, out / "config.yaml", overwrite=True)
    changed = ", ".join(f"{name}={value}" for name, value in options.changes.items())
    if options.changes:
        import yaml

        (out / CHANGES_FILE).write_text(yaml.safe_dump(options.changes, sort_keys=False), encoding="utf-8")
    if sinks is not None:
        (out / "sinks.yaml").write_text(yaml.safe_dump(
            {"sinks": sinks.num_sinks, "sink_mass": sink_mass, "length_with_sinks": model.sequence_length},
            sort_keys=False), encoding="utf-8")
    if options.figure:
        _draw_profile(out / "profile.png", model, profile, attention_only, baseline, source, changed, options)
    from ..schema import kernel_arrays

    results = _results(model, profile, float(mass), source, out, options, sink_mass,
                       kernel_file=bool(kernel_arrays(model)))
    note = _mean_kernel_note(baseline, options)
    if not options.quiet:
        _print_summary(results, changed)
        if note:
            print(note)
    elif note:
        import sys

        print(note, file=sys.stderr)  # stdout holds the --json object alone
    return results


def _draw_profile(path, model, profile, attention_only, baseline, source, changed: str, options: _Options) -> None:
    """profile.png: the profile and its attention-only contrast; after --intervene, the baseline
    (the model as given, at its own length) beside the changed profile, and their difference."""
    import numpy as np

    from .. import plot

    title = (f"{source}{' with ' + changed if changed else ''}: N={profile.size}, T={model.num_layers}, "
             f"H={model.num_heads}")
    if baseline is None:
        plot.plot_profile(path, profile, attention_only,
                          attention_only_model=bool(np.all(np.asarray(model.lambdas) == 1.0)), title=title)
        return
    from ..bucket import influence_with_mass

    before = np.asarray(influence_with_mass(baseline, method=options.method)[0], dtype=np.float64)
    plot.plot_intervened_profile(path, before, profile, change=changed, title=title)


def _results(model, profile, mass, source, out, options: _Options, sink_mass, *, kernel_file: bool) -> dict:
    """The numbers of one run's summary (the table and --json show the same); `kernel_file`: config.yaml has
    a config.kernels.npz beside it."""
    import numpy as np

    n = profile.size
    k = max(1, round(0.1 * n))  # jaxroll.metrics.edge_count(n), which imports JAX (tests/test_latency.py pins it)
    # The names and definitions of jaxroll.metrics (first_mass, middle_mass,
    # last_mass), so the summary, `jaxroll compare` and the sweep table agree.
    files = ["profile.csv", *(["profile.png"] if options.figure else []), "config.yaml",
             *(["config.kernels.npz"] if kernel_file else []),
             *([CHANGES_FILE] if options.changes else []), *(["sinks.yaml"] if sink_mass is not None else [])]
    return {"source": source, "interventions": options.changes, "N": n, "T": model.num_layers,
            "H": model.num_heads, "mask": model.mask, "lambda_sum": float(np.sum(model.lambdas)), "mass": mass,
            "composition": None if model.composition is None else float(model.composition),
            "p_first": float(profile[0]), "p_last": float(profile[-1]), "argmin": int(np.argmin(profile)),
            "edge": k, "first_mass": float(profile[:k].sum()), "middle_mass": float(profile[k:max(k, n - k)].sum()),
            "last_mass": float(profile[-k:].sum()), "sinks": None if sink_mass is None else options.sinks.num_sinks,
            "sink_mass": sink_mass, "length_with_sinks": model.sequence_length, "out": str(out), "wrote": files}


def _print_summary(results: dict, changed: str) -> None:
    r = results
    n, k = r["N"], r["edge"]
    print(f"jaxroll rollout: {r['source']}")
    if changed:
        print(f"  intervened: {changed} (the rollout's prediction of the changed model)")
    if r["sink_mass"] is not None:
        print(f"  sinks: {r['sinks']} tokens in front (the model runs at N = {r['length_with_sinks']}); "
              f"their mass = {r['sink_mass']:.6g}; the profile below is over the {n} original positions, "
              "renormalised")
    print(f"  N = {n}, T = {r['T']}, H = {r['H']}, mask = {r['mask']}")
    print(f"  sum of lambdas = {r['lambda_sum']:.6g}, mass before normalising = {r['mass']:.9g}")
    if r["composition"] is not None:
        print(f"  paths composed with q = {r['composition']:.6g} (1: linearly, the paper's rollout; 2: in quadrature; "
              "the mass is 1 only at q = 1)")
    print(f"  p[0] = {r['p_first']:.6g}, p[-1] = {r['p_last']:.6g}, argmin = {r['argmin']}")
    print(f"  first_mass / middle_mass / last_mass = {r['first_mass']:.6g} / {r['middle_mass']:.6g} / "
          f"{r['last_mass']:.6g} (positions: first {k}, middle {max(n - 2 * k, 0)}, last {k})")
    print(f"  wrote {r['out']}/{', '.join(r['wrote'])}")
