"""``jaxroll compare`` and ``jaxroll forces``."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
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
    _common.add_model_arguments(forces)
    _common.add_output_arguments(forces)
    forces.set_defaults(run=_run_forces)


def _run_compare(arguments) -> None:
    import numpy as np

    from .. import io, metrics

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
    k = metrics.edge_count(p.size, arguments.fraction)
    print(f"jaxroll compare: A = {arguments.first}, B = {arguments.second}, N = {p.size}")
    constant = [name for name, x in (("A", p), ("B", q)) if np.all(x == x[0])]
    for field in ("wasserstein", "spearman", "kl", "js", "total_variation"):
        label = {"kl": "kl(A || B)", "wasserstein": "wasserstein W1/(N-1)"}.get(field, field)
        value, note = getattr(result, field), ""
        if field == "spearman" and constant:
            value, note = "undefined", f"({' and '.join(constant)} constant: ranks without spread)"
        elif field == "kl" and value == np.inf:
            note = "(B is 0 where A is not)"
        elif field == "wasserstein" and p.size == 1:
            note = "(one position: no distance to travel)"
        print(f"  {label:22} {_cell(value, 9)} {note}".rstrip())
    print(f"  {'':22} {'A':>14} {'B':>14}")
    for field in metrics.Shape._fields:
        a, b = getattr(result.p, field), getattr(result.q, field)
        note = ""
        if field == "u_index" and p.size <= 2 * k:
            a = b = "undefined"
            note = f"(no middle: N = {p.size} <= 2k, k = {k} edge position{'s' if k > 1 else ''})"
        elif field == "u_index" and np.inf in (a, b):
            note = "(inf: the middle holds no mass)"
        elif field == "center_of_mass" and p.size == 1:
            note = "(one position: defined as 0)"
        print(f"  {field:22} {_cell(a, 6, 14)} {_cell(b, 6, 14)} {note}".rstrip())


def _cell(value, digits: int, width: int = 0) -> str:
    """A number with `digits` significant digits, or a word, right-aligned to `width`."""
    text = value if isinstance(value, str) else f"{value:.{digits}g}"
    return f"{text:>{width}}"


def _run_forces(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io, plot, theory

    model, source = _common.model_from_arguments(arguments)
    _common.require_alibi_model(model, "forces")
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
