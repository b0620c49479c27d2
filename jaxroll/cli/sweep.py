"""``jaxroll sweep SPEC.yaml --out DIR``: a parameter sweep from a YAML spec.

A spec names a base model and the axes of `jaxroll.sweep`::

    base: {preset: mpt-7b, sequence_length: 256}   # or config: FILE, or published: NAME
    axes: {lambda_0: [0.2, 0.4], beta: [0.5, 1.0]}   # or interventions: {tau: [...], gamma: [...]}
    lengths: [128, 256]                              # optional
    zip: false                                       # optional
    batch_size: 64                                   # optional
    mesh: 2                                          # optional: devices to shard over

Everything is checked before --out is touched. Finished chunks go to
``DIR/.partial/`` atomically; ``--resume`` continues an interrupted sweep from
there. Outputs (each written to a temporary file and renamed): sweep.csv,
sweep.parquet (when pyarrow is installed), profiles.npz, and one figure per
shape statistic (heatmap_<statistic>.png over the first two axes, or
line_<statistic>.png for one axis).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from . import _common

SPEC_KEYS = {"base", "axes", "lengths", "zip", "batch_size", "mesh"}
BASE_KEYS = {"preset", "config", "published", "content", "dataset", "sequence_length"}
PARTIAL = ".partial"


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "sweep", help="a parameter sweep from a YAML spec",
        description="Evaluate the influence profile at every point of a parameter grid "
                    "(jaxroll.sweep) and write sweep.csv (one row per point and length, with "
                    "its shape statistics), sweep.parquet (if pyarrow is installed), "
                    "profiles.npz and heatmap_<statistic>.png / line_<statistic>.png into --out.")
    parser.add_argument("spec", type=Path, metavar="SPEC.yaml",
                        help="keys: base (preset | config | published, content, dataset, "
                             "sequence_length), axes, lengths, zip, batch_size, mesh")
    _common.add_output_arguments(parser)
    parser.add_argument("--resume", action="store_true",
                        help="continue the interrupted sweep in --out from its last finished chunk")
    _common.add_json_argument(parser)
    parser.set_defaults(run=run)


def _check_keys(where: str, mapping, allowed: set) -> dict:
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: got {mapping!r:.60}; allowed: a mapping")
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    return mapping


def _base_model(base: dict, spec_path: Path):
    import dataclasses

    from .. import io, presets, published

    sources = [key for key in ("preset", "config", "published") if key in base]
    if len(sources) != 1:
        raise ConfigError(f"base: got {sources or 'no source'}; allowed: exactly one of preset, config, published")
    source = sources[0]
    if source != "published" and base.keys() & {"content", "dataset"}:
        raise ConfigError(f"base.{sorted(base.keys() & {'content', 'dataset'})[0]}: only with base.published")
    if source == "preset":
        model = presets.get(base["preset"])
    elif source == "config":
        path = Path(base["config"])
        model = io.load_config(path if path.is_absolute() else spec_path.parent / path)
    else:
        model = published.load(base["published"], base.get("content"), base.get("dataset", "fineweb-edu"))
    if "sequence_length" in base:
        from .._checks import check_positive_int

        length = check_positive_int("base.sequence_length", base["sequence_length"])
        model = dataclasses.replace(model, sequence_length=length)
    return model


def read_spec(path: Path) -> tuple:
    """``(model, axes, options)`` of a spec file, every key checked."""
    from .. import io

    spec = _check_keys(str(path), io.read_yaml(path), SPEC_KEYS)
    if "base" not in spec:
        raise ConfigError(f"{path}: base: missing; this key is required")
    model = _base_model(_check_keys("base", spec["base"], BASE_KEYS), path)
    axes = spec.get("axes") or {}
    if not isinstance(axes, dict):
        raise ConfigError(f"axes: got {axes!r:.60}; allowed: a mapping of field to a list of values")
    zipped = spec.get("zip", False)
    if not isinstance(zipped, bool):
        raise ConfigError(f"zip: got {zipped!r}; allowed: true or false")
    options = {"lengths": spec.get("lengths"), "zip": zipped, "batch_size": spec.get("batch_size"),
               "mesh": spec.get("mesh")}
    return model, dict(axes), options


def _figure_axes(result, options) -> list[tuple[str, list]]:
    """The plotted axes: the sweep's (one "point" axis when zipped), then the lengths."""
    if options["zip"] and result.axes:
        count = len(next(iter(result.axes.values())))
        axes = [("point", list(range(count)))]
    else:
        axes = [(name, [v if np.ndim(v) == 0 and not isinstance(v, dict) else k
                        for k, v in enumerate(values)]) for name, values in result.axes.items()]
    if result.lengths is not None:
        axes.append(("length", list(result.lengths)))
    return axes


def _base_point(model) -> dict:
    """The base model's value on the axes it has one for: lambda_0 and beta when its lambdas are a
    power decay, lambda_const when they are constant, and any scalar field of the model or its kernel."""
    point = {}
    lambdas = np.asarray(model.lambdas, np.float64).ravel()
    if lambdas.size and np.allclose(lambdas, lambdas[0], rtol=1e-9, atol=0):
        point["lambda_const"] = float(lambdas[0])
    if lambdas.size >= 2 and np.all(lambdas > 0):
        beta = float(np.log(lambdas[0] / lambdas[1]) / np.log(2.0))
        t = np.arange(lambdas.size, dtype=np.float64)
        if beta >= 0 and np.allclose(lambdas, lambdas[0] / (t + 1) ** beta, rtol=1e-9, atol=0):
            point.update(lambda_0=float(lambdas[0]), beta=beta)
    for owner in (model, getattr(model, "kernel", None)):
        for name in ("temperature", "sequence_length"):
            value = getattr(owner, name, None)
            if value is not None and np.ndim(value) == 0 and name not in point:
                point[name] = float(value)
    point.setdefault("length", float(model.sequence_length))
    # An intervention axis' base is the identity: the model as given.
    point.update(tau=1.0, slope_scale=1.0, kappa=0.0, gamma=1.0)
    return point


def run(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    from .. import io, plot
    from ..sweeps import STATISTICS, plan_sweep, sweep, write_tables

    model, axes, options = read_spec(arguments.spec)
    # Check every point before --out is touched: nothing is written on bad input.
    plan = plan_sweep(model, **axes, lengths=options["lengths"], zip=options["zip"],
                      batch_size=options["batch_size"], mesh=options["mesh"])
    out = arguments.out
    partial = out / PARTIAL
    main_process = jax.process_index() == 0
    if arguments.resume:
        if not (partial / "fingerprint.txt").is_file():
            raise ConfigError(f"--resume: no {PARTIAL}/ in {out}; allowed: the --out of an interrupted sweep")
        if arguments.force:
            raise ConfigError("--resume: give --resume or --force, not both")
    elif main_process:
        if (partial / "fingerprint.txt").is_file() and not arguments.force:
            raise ConfigError(f"--out {out}: holds an interrupted sweep; pass --resume to continue it "
                              "(or --force to discard its finished chunks and start over)")
        io.prepare_output_dir(out, force=arguments.force)
        if partial.exists():
            shutil.rmtree(partial)  # --force: a fresh sweep, not a resumed one
    try:
        result = sweep(model, **axes, lengths=options["lengths"], zip=options["zip"],
                       batch_size=options["batch_size"], mesh=options["mesh"],
                       progress=True, checkpoint=partial)
    except KeyboardInterrupt:
        # main() prints this line and exits 130 (an interrupt, not bad input).
        raise KeyboardInterrupt(f"sweep: the finished chunks are in {partial}; rerun the same command "
                                "with --resume to continue") from None
    if not main_process:
        return
    written = write_tables(result, plan, out)
    figure_axes = _figure_axes(result, options)
    grid = tuple(len(values) for _, values in figure_axes)
    statistics = {name: np.asarray(result.table[name], np.float64).reshape(grid)
                  for name in STATISTICS}
    figures = plot.plot_sweep(out, statistics, figure_axes,
                              title=f"{arguments.spec.name}: T = {model.num_layers}, H = {model.num_heads}",
                              sequence_length=model.sequence_length, base=_base_point(model))
    written += [path.name for path in figures]
    shutil.rmtree(partial, ignore_errors=True)
    _print_summary(arguments, result, grid, plan.mesh.devices.size, out, written)


def _print_summary(arguments, result, grid, devices: int, out: Path, written: list) -> None:
    """The sweep's size, method and the range of four statistics: a table, or one JSON object (--json)."""
    count = result.table["length"].shape[0]
    ranges = {name: (float(np.nanmin(np.asarray(result.table[name], np.float64))),
                     float(np.nanmax(np.asarray(result.table[name], np.float64))))
              for name in ("first", "last", "center_of_mass", "u_index")}
    if arguments.json:
        _common.print_json({"spec": arguments.spec, "profiles": int(count), "grid": list(grid),
                            "method": result.method, "batch_size": int(result.batch_size), "devices": devices,
                            "ranges": {name: {"min": low if np.isfinite(low) else None,
                                              "max": high if np.isfinite(high) else None}
                                       for name, (low, high) in ranges.items()},
                            "out": out, "written": written})
        return
    print(f"jaxroll sweep: {arguments.spec} ({count} profiles, grid {grid}, method {result.method}, "
          f"{result.batch_size} points per call on {devices} device(s))")
    for name, (low, high) in ranges.items():
        print(f"  {name:15} min {low:.6g}  max {high:.6g}")
    print(f"  wrote {out}/" + ", ".join(written))
