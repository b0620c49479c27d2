"""``jaxroll presets``: the built-in presets and the published configurations, listed."""

from __future__ import annotations

from . import _common


def add_parser(commands) -> None:
    listing = commands.add_parser("presets", help="list the presets and the published configurations",
                                  description="List the built-in presets (model geometries with a fitted "
                                              "power-decay schedule, --preset NAME) and the published "
                                              "measured configurations (--published NAME).")
    _common.add_json_argument(listing)
    listing.set_defaults(run=_run_presets)


def _run_presets(arguments) -> None:
    from ..presets import GEOMETRIES

    presets = [{"name": name, "model": geometry.model_id, "layers": geometry.num_layers, "heads": geometry.num_heads,
                "lambda_0": geometry.lambda_0, "beta": geometry.beta} for name, geometry in GEOMETRIES.items()]
    published = [{key: row[key] for key in ("name", "model", "layers", "heads")} for row in presets]
    if arguments.json:
        _common.print_json({"presets": presets, "published": published})
        return
    print("Presets (--preset NAME): each model's geometry, standard ALiBi slopes, no content, and a")
    print("power-decay schedule lambda_t = lambda_0 / (t + 1)^beta fitted to the measured one.")
    print(f"  {'name':14} {'model':22} {'layers':>6} {'heads':>5} {'lambda_0':>8} {'beta':>6}")
    for row in presets:
        print(f"  {row['name']:14} {row['model']:22} {row['layers']:6d} {row['heads']:5d} "
              f"{row['lambda_0']:8.4f} {row['beta']:6.4f}")
    print()
    print("Published (--published NAME [--content none|mean|all] [--dataset D] [--no-residual] [--length N]):")
    print("the paper authors' measured lambda schedules (one per layer) and content scores, measured at")
    print("N = 256 and N = 2048 (--length N <= 256 reads the 256 files, N <= 2048 the 2048 ones).")
    print("  content none: fineweb-edu, dclm, wikipedia; mean: fineweb-edu (256 only); all: fineweb-edu, dclm, "
          "wikipedia")
    for row in published:
        print(f"  {row['name']:14} {row['model']:22} {row['layers']:6d} {row['heads']:5d}")
