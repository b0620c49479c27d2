"""``jaxroll rollout``: the influence profile of one or more configurations or presets."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    rollout = commands.add_parser(
        "rollout", help="influence profile of a configuration or preset",
        description="Compute the influence profile p_T(j) = P_T[N-1, j] of a rollout "
                    "configuration (or a built-in preset) and write profile.csv, "
                    "profile.png and config.yaml into --out. At small N (hundreds of positions) the CPU "
                    "is the faster device: --device cpu.")
    _common.add_model_arguments(rollout)
    rollout.add_argument("more_configs", nargs="*", type=Path, metavar="CONFIG ...",
                         help="more rollout YAML files, run in one process (compiled programs shared): "
                              "each writes into --out/<its path below the files' common folder>")
    _common.add_output_arguments(rollout)
    rollout.add_argument("--no-figure", action="store_true",
                         help="skip profile.png (drawing it takes most of a small run's time)")
    rollout.add_argument("--method", choices=("auto", "dense", "structured"), default="auto",
                         help="how to multiply by the kernels (default auto)")
    rollout.add_argument("--intervene", metavar="NAME=VALUE[,...]",
                         help="predict the profile after changing the model: sinks (K tokens prepended: the "
                              "profile over the original positions, renormalised, and the sinks' mass), "
                              "rotary_ratio (rotary positions / r per head, Ms-PoE; a rotary model's offset "
                              "kernel), tau (softmax temperature), "
                              "slope_scale (ALiBi slopes), ssmax_scale (SSMax: logits x s ln n), kappa (a "
                              "distance bias kappa g(i - j); kappa_form "
                              "log1p or unsquash, kappa_k), gamma (the attention branch's strength), e.g. "
                              "tau=0.7,gamma=0.5, or a YAML file of them; config.yaml is then the changed "
                              "model and intervention.yaml records the change (docs/interventions.md)")
    _common.add_device_argument(rollout)
    rollout.set_defaults(run=_run_rollout)


def _run_rollout(arguments) -> None:
    # Everything here runs on the main thread: no import runs in a thread that could outlive it
    # (interpreter shutdown stopping a daemon thread inside a native import aborts the process with
    # "terminate called without an active exception", signal 6, instead of exit status 2). An
    # earlier background import of matplotlib gained nothing measurable (2.64 s against 2.68 s, the
    # mean of 6 runs each at N = 256 on 2 shared cores, noise +-0.5 s).
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)

    from .. import interventions, io
    from ..bucket import influence_with_mass  # pads small models to shared compiled shapes

    changes = interventions.parse(arguments.intervene) if arguments.intervene else []
    device = _common.device_context(arguments.device, command_line=getattr(arguments, "command_line", False))
    with device:
        runs = _batch(arguments) if arguments.more_configs else [
            (*_common.model_from_arguments(arguments), arguments.out)]
        # Every change is applied (and refused, in one line) before --out is touched.
        runs = [(interventions.apply_all(model, changes), source, out) for model, source, out in runs]
        arguments.changes = interventions.describe(changes)
        arguments.sinks = next((change for change in changes if isinstance(change, interventions.SinkTokens)), None)
        io.prepare_output_dir(arguments.out, force=arguments.force)
        for model, source, out in runs:
            out.mkdir(parents=True, exist_ok=True)
            _write_rollout(model, source, out, arguments, influence_with_mass, io)


def _batch(arguments):
    """``jaxroll rollout A.yaml B.yaml ...``: every model loaded and checked before --out is touched."""
    import os

    paths = [arguments.config, *arguments.more_configs]
    if arguments.preset is not None or arguments.published is not None:
        raise ConfigError("rollout: several CONFIG files take no --preset or --published")
    if len(set(map(os.path.abspath, paths))) < len(paths):
        raise ConfigError("rollout: a CONFIG file is given twice")
    parent = Path(os.path.commonpath([os.path.abspath(p.parent) for p in paths]))
    runs = []
    for path in paths:
        arguments.config = path
        model, source = _common.model_from_arguments(arguments)
        name = "-".join(Path(os.path.abspath(path)).relative_to(parent).with_suffix("").parts)
        runs.append((model, source, arguments.out / name))
    return runs


def _write_rollout(model, source, out, arguments, influence_with_mass, io) -> None:
    import dataclasses

    import numpy as np

    profile, mass = influence_with_mass(model, method=arguments.method)
    attention_only = influence_with_mass(
        dataclasses.replace(model, lambdas=np.ones_like(model.lambdas)), method=arguments.method
    )[0]
    profile = np.asarray(profile, dtype=np.float64)
    if not np.all(np.isfinite(profile)):
        raise ConfigError("rollout: the profile is not finite; try --float64")
    sinks = getattr(arguments, "sinks", None)
    if sinks is not None:  # the model runs at n + k; what is reported is the n original positions
        sink_mass, profile = (np.asarray(part, dtype=np.float64) for part in sinks.split(profile))
        attention_only = sinks.split(attention_only)[1]

    io.write_profile(profile, out / "profile.csv", overwrite=True)
    io.save_config(model, out / "config.yaml", overwrite=True)
    changes = getattr(arguments, "changes", {})
    changed = ", ".join(f"{name}={value}" for name, value in changes.items())
    if changes:
        import yaml

        (out / "intervention.yaml").write_text(yaml.safe_dump(changes, sort_keys=False), encoding="utf-8")
    if sinks is not None:
        (out / "sinks.yaml").write_text(yaml.safe_dump(
            {"sinks": sinks.num_sinks, "sink_mass": float(sink_mass), "length_with_sinks": model.sequence_length},
            sort_keys=False), encoding="utf-8")
    if not arguments.no_figure:
        from .. import plot

        plot.plot_profile(out / "profile.png", profile, attention_only,
                          attention_only_model=bool(np.all(np.asarray(model.lambdas) == 1.0)),
                          title=f"{source}{' with ' + changed if changed else ''}: N={profile.size}, "
                                f"T={model.num_layers}, H={model.num_heads}")
    _print_summary(model, profile, float(mass), source, out, figure=not arguments.no_figure, changed=changed,
                   sink_mass=None if sinks is None else float(sink_mass))


def _print_summary(model, profile, mass, source, out, figure=True, changed: str = "", sink_mass=None) -> None:
    import numpy as np

    from ..metrics import edge_count

    n = profile.size
    k = edge_count(n, 0.1)
    print(f"jaxroll rollout: {source}")
    if changed:
        print(f"  intervened: {changed} (the rollout's prediction of the changed model)")
    if sink_mass is not None:
        print(f"  sinks: {model.sequence_length - n} tokens in front (the model runs at N = {model.sequence_length}); "
              f"their mass = {sink_mass:.6g}; the profile below is over the {n} original positions, renormalised")
    print(f"  N = {n}, T = {model.num_layers}, H = {model.num_heads}, mask = {model.mask}")
    print(f"  sum of lambdas = {float(np.sum(model.lambdas)):.6g}, mass before normalising = {mass:.9g}")
    print(f"  p[0] = {profile[0]:.6g}, p[-1] = {profile[-1]:.6g}, argmin = {int(np.argmin(profile))}")
    # The names and definitions of jaxroll.metrics (first_mass, middle_mass,
    # last_mass), so the summary, `jaxroll compare` and the sweep table agree.
    print(f"  first_mass / middle_mass / last_mass = {profile[:k].sum():.6g} / "
          f"{profile[k:max(k, n - k)].sum():.6g} / {profile[-k:].sum():.6g} "
          f"(positions: first {k}, middle {max(n - 2 * k, 0)}, last {k})")
    from ..schema import kernel_arrays

    extra = ", config.kernels.npz" if kernel_arrays(model) else ""
    extra += ", intervention.yaml" if changed else ""
    extra += ", sinks.yaml" if sink_mass is not None else ""
    print(f"  wrote {out}/profile.csv, {'profile.png, ' if figure else ''}config.yaml{extra}")
