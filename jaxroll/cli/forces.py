"""``jaxroll forces``: a configuration's profile decomposed by an ablation ladder."""

from __future__ import annotations

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    forces = commands.add_parser(
        "forces", help="the four forces: causal, residual, ALiBi, content",
        description="Decompose a configuration's profile by an ablation ladder: causal "
                    "masking alone (lambda = 1, no slopes, no content), + residuals, + "
                    "ALiBi, + content. Writes forces.csv and forces.png into --out and "
                    "prints the drift each force adds.")
    _common.add_model_arguments(forces)
    _common.add_output_arguments(forces)
    _common.add_json_argument(forces)
    forces.set_defaults(run=_run_forces)


def _run_forces(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io, plot, theory

    model, source = _common.model_from_arguments(arguments)
    model = _common.alibi_model(model, "forces")
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
    columns = ("center_of_mass", "first_mass", "last_mass", "drift_center_of_mass", "drift_first", "drift_last")
    results = {"source": source, "N": int(profiles.shape[1]), "T": model.num_layers, "H": model.num_heads,
               "forces": [{"name": name, **{column: float(getattr(result, column)[k]) for column in columns}}
                          for k, name in enumerate(result.names)],
               "out": str(out), "wrote": ["forces.csv", "forces.png"]}
    if arguments.json:
        _common.print_json(results)
        return
    print(f"jaxroll forces: {source} (N = {results['N']}, T = {model.num_layers}, H = {model.num_heads})")
    print(f"  {'force':10} {'center':>9} {'first10%':>9} {'last10%':>9} "
          f"{'d center':>9} {'d first':>9} {'d last':>9}")
    for row in results["forces"]:
        print(f"  +{row['name']:9} {row['center_of_mass']:9.4f} {row['first_mass']:9.4f} {row['last_mass']:9.4f} "
              f"{row['drift_center_of_mass']:+9.4f} {row['drift_first']:+9.4f} {row['drift_last']:+9.4f}")
    print(f"  wrote {out}/forces.csv, forces.png")
