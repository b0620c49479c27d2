"""``jaxroll presets``: the built-in presets and the published configurations, listed."""

from __future__ import annotations


def add_parser(commands) -> None:
    listing = commands.add_parser("presets", help="list the presets and the published configurations",
                                  description="List the built-in presets (model geometries with a fitted "
                                              "power-decay schedule, --preset NAME) and the published "
                                              "measured configurations (--published NAME).")
    listing.set_defaults(run=_run_presets)


def _run_presets(arguments) -> None:
    from ..presets import GEOMETRIES

    print("Presets (--preset NAME): each model's geometry, standard ALiBi slopes, no content, and a")
    print("power-decay schedule lambda_t = lambda_0 / (t + 1)^beta fitted to the measured one.")
    print(f"  {'name':14} {'model':22} {'layers':>6} {'heads':>5} {'lambda_0':>8} {'beta':>6}")
    for name, geometry in GEOMETRIES.items():
        print(f"  {name:14} {geometry.model_id:22} {geometry.num_layers:6d} {geometry.num_heads:5d} "
              f"{geometry.lambda_0:8.4f} {geometry.beta:6.4f}")
    print()
    print("Published (--published NAME [--content none|mean|all] [--dataset D] [--no-residual] [--length N]):")
    print("the paper authors' measured lambda schedules (one per layer) and content scores, measured at")
    print("N = 256 and N = 2048 (--length N <= 256 reads the 256 files, N <= 2048 the 2048 ones).")
    print("  content none: fineweb-edu, dclm, wikipedia; mean: fineweb-edu (256 only); all: fineweb-edu, dclm, "
          "wikipedia")
    for name, geometry in GEOMETRIES.items():
        print(f"  {name:14} {geometry.model_id:22} {geometry.num_layers:6d} {geometry.num_heads:5d}")
