"""``jaxroll fit-kernel``: a relative-position kernel fitted to measured dense kernels."""

from __future__ import annotations

from . import _common

MAX_KERNEL_BYTES = 4 * 2**30
"""The most memory the float64 dense kernels ``(T, N, N)`` that `fit-kernel` fits may take."""


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
    fit.set_defaults(run=_run_kernel_fit)


def _run_kernel_fit(arguments) -> None:
    import sys

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
    n = model.sequence_length
    print(f"jaxroll fit-kernel: {source}: {result.stop_reason}")
    print(f"  N = {n}, T = {model.num_layers}, family {arguments.family}, H = {arguments.heads}, "
          f"optimizer = {result.optimizer}, steps per layer {int(result.steps.min())}-{int(result.steps.max())} "
          f"of at most {arguments.steps}")
    print(f"  mean row KL: before {result.losses[0]:.6g}, after {float(np.mean(result.divergence)):.6g}; "
          f"max abs kernel error {float(np.max(result.max_abs_error)):.3g}")
    print(f"  profile Wasserstein W1/(N-1), measured kernels vs fitted: {float(wasserstein(fitted, measured)):.6g}")
    if arguments.family != "table":
        kernel = result.model.kernel
        for t in range(min(model.num_layers, 4)):
            print(f"  layer {t}: slopes {np.array2string(np.asarray(kernel.slopes[t]), precision=4)}, exponents "
                  f"{np.array2string(np.asarray(kernel.exponents[t]), precision=4)}, diagonal "
                  f"{np.array2string(np.asarray(kernel.diagonal_scores[t]), precision=4)}")
    extra = ", fitted.kernels.npz" if arguments.family == "table" else ""
    print(f"  wrote {out}/fitted.yaml{extra}, kernel_fit.csv")
    if not result.converged:
        print(f"warning: the kernel fit did not converge in {arguments.steps} steps ({result.stop_reason}); "
              "raise --steps")
