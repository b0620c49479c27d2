"""``jaxroll fit-kernel``: a relative-position kernel fitted to measured dense kernels."""

from __future__ import annotations

from . import _common

MAX_KERNEL_BYTES = 4 * 2**30
"""The most memory the float64 dense kernels ``(T, N, N)`` that `fit-kernel` fits may take."""

_SHOWN_LAYERS = 4  # the summary's layers; the rest are counted on one line (--json and fitted.yaml hold all)


def add_parser(commands) -> None:
    from ._names import KERNEL_FAMILIES as FAMILIES

    fit = commands.add_parser(
        "fit-kernel", help="fit a relative-position kernel to measured dense kernels",
        description="Fit a relative-position kernel f_h(i - j) (power: -m k^alpha, alibi: -m k, table: "
                    "free) to the dense kernels of CONFIG (e.g. the config.yaml `jaxroll measure` writes "
                    "for a rotary model; or the kernels of any CONFIG, --preset or --published model at "
                    "--length), layer by layer, minimising the mean row KL divergence until it converges "
                    "(L-BFGS for up to 8 parameters per layer, else Adam; at most --steps). Writes "
                    "fitted.yaml (the family's parameters; a config `jaxroll rollout` reads at any "
                    "--length for power and alibi) and kernel_fit.csv (per layer: KL, max abs error, "
                    "steps) into --out.")
    _common.add_model_arguments(fit)
    fit.add_argument("--family", choices=FAMILIES, default="power", help="default power")
    fit.add_argument("--heads", type=_common.positive_int, default=1, help="heads of the fitted mixture (default 1)")
    fit.add_argument("--steps", type=_common.positive_int, default=2000,
                     help="the most optimisation steps per layer (default 2000); a layer stops earlier when "
                          "it converges")
    _common.add_output_arguments(fit)
    _common.add_json_argument(fit)
    fit.set_defaults(run=_run_kernel_fit)


def _run_kernel_fit(arguments) -> None:
    import jax

    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io, memory
    from ..fitting.kernel_fit import fit_kernel
    from ..model import as_dense_model
    from ..metrics import wasserstein
    from ..rollout import influence

    model, source = _common.model_from_arguments(arguments)
    memory.check_fits(8 * model.num_layers * model.sequence_length ** 2,
                      f"fit-kernel: {model.num_layers} dense {model.sequence_length}^2 float64 kernels",
                      MAX_KERNEL_BYTES, allowed="a smaller --length", limit_source="fit-kernel allows")
    model = as_dense_model(model)
    out = io.prepare_output_dir(arguments.out, force=arguments.force)
    result = fit_kernel(model, family=arguments.family, num_heads=arguments.heads, steps=arguments.steps,
                        progress=True)
    io.save_config(result.model, out / "fitted.yaml", overwrite=True)
    np.savetxt(out / "kernel_fit.csv", np.column_stack([np.arange(model.num_layers), result.divergence,
                                                        result.max_abs_error, result.steps]),
               delimiter=",", header="layer,kl,max_abs_error,steps", comments="",
               fmt=["%d", "%.17g", "%.17g", "%d"])
    measured = np.asarray(influence(model), dtype=np.float64)
    fitted = np.asarray(influence(result.model), dtype=np.float64)
    results = _results(result, model, source, arguments, float(wasserstein(fitted, measured)), out)
    if arguments.json:
        _common.print_json(results)
    else:
        _print_summary(results)


def _results(result, model, source: str, arguments, distance: float, out) -> dict:
    """The numbers of the summary: the table and --json show the same (layers numbered from 0)."""
    import numpy as np

    layers = []
    if arguments.family != "table":
        kernel = result.model.kernel
        layers = [{"layer": t, "slopes": np.asarray(kernel.slopes[t]),
                   "exponents": np.asarray(kernel.exponents[t]),
                   "diagonal": np.asarray(kernel.diagonal_scores[t])} for t in range(model.num_layers)]
    return {"source": source, "stop_reason": result.stop_reason, "converged": bool(result.converged),
            "N": model.sequence_length, "T": model.num_layers, "family": arguments.family, "H": arguments.heads,
            "optimizer": result.optimizer, "steps": np.asarray(result.steps), "max_steps": arguments.steps,
            "kl_before": float(result.losses[0]), "kl_after": float(np.mean(result.divergence)),
            "kl": np.asarray(result.divergence, np.float64),
            "max_abs_error": float(np.max(result.max_abs_error)), "wasserstein": distance, "layers": layers,
            "out": str(out), "wrote": ["fitted.yaml", *(["fitted.kernels.npz"] if arguments.family == "table" else []),
                                       "kernel_fit.csv"]}


def _print_summary(r: dict) -> None:
    import numpy as np

    print(f"jaxroll fit-kernel: {r['source']}: {r['stop_reason']}")
    print(f"  N = {r['N']}, T = {r['T']}, family {r['family']}, H = {r['H']}, "
          f"optimizer = {r['optimizer']}, steps per layer {int(r['steps'].min())}-{int(r['steps'].max())} "
          f"of at most {r['max_steps']}")
    print(f"  mean row KL: before {r['kl_before']:.6g}, after {r['kl_after']:.6g}; "
          f"max abs kernel error {r['max_abs_error']:.3g}")
    print(f"  profile Wasserstein W1/(N-1), measured kernels vs fitted: {r['wasserstein']:.6g}")
    for layer in r["layers"][:_SHOWN_LAYERS]:
        print(f"  layer {layer['layer']}: slopes {np.array2string(layer['slopes'], precision=4)}, exponents "
              f"{np.array2string(layer['exponents'], precision=4)}, diagonal "
              f"{np.array2string(layer['diagonal'], precision=4)}")
    hidden = len(r["layers"]) - _SHOWN_LAYERS
    if hidden > 0:
        print(f"  ... ({hidden} more layer{'s' if hidden != 1 else ''}; --json for all, fitted.yaml holds them)")
    print(f"  wrote {r['out']}/{', '.join(r['wrote'])}")
    if not r["converged"]:
        print(f"warning: the kernel fit did not converge in {r['max_steps']} steps ({r['stop_reason']}); "
              "raise --steps")
