"""``jaxroll kinetic``: the kinetic profile, its threshold t_crit and the matching rollout, in one figure."""

from __future__ import annotations

import math

from ..errors import ConfigError
from . import _common


def add_parser(commands) -> None:
    kinetic = commands.add_parser(
        "kinetic", help="the kinetic closed form beside the matching rollout",
        description="The kinetic profile S_t(s) = sum_n omega_n g_(a_n)(t; s) of Duerinckx, "
                    "Geshkovski and Rossi (arXiv 2605.09213), a_n = n^2 I_n(beta), omega_n = "
                    "exp(-pi^2 n^2 / (2 M^2)), its interior-minimum threshold t_crit, and the "
                    "rollout it is compared with: one ALiBi head of slope lambda/N, T layers of "
                    "constant lambda_t = c/T, c = a_eff t (a_eff = sum omega a^2 / sum omega a, "
                    "so both change their end slope at t = t_crit). Writes kinetic.csv, "
                    "profile.csv (the rollout), config.yaml (the rollout) and kinetic.png.")
    kinetic.add_argument("--beta", type=float, default=1.0, help="inverse temperature beta > 0 (default 1)")
    kinetic.add_argument("--lambda", dest="slope_length", type=float, default=1.0, metavar="LAMBDA",
                         help="ALiBi slope times length, lambda = m N >= 0 (default 1)")
    kinetic.add_argument("--depth", type=float, default=1.0,
                         help="depth t > 0, the kinetic theory's continuous time (default 1; the rollout's "
                              "layers are --layers)")
    kinetic.add_argument("--mode-width", type=float, default=8.0,
                         help="mode width M > 0 of the weights omega_n = exp(-pi^2 n^2 / (2 M^2)) (default 8)")
    kinetic.add_argument("--n-max", type=_common.positive_int, default=20, help="modes kept (default 20)")
    kinetic.add_argument("--length", type=_common.positive_int, default=256,
                         help="N positions of the rollout and of the distribution (default 256)")
    kinetic.add_argument("--layers", type=_common.positive_int, default=64,
                         help="T layers of the rollout (default 64; needs c <= T)")
    _common.add_output_arguments(kinetic)
    _common.add_json_argument(kinetic)
    for old, new in (("--lam", "--lambda"), ("--t", "--depth"), ("--M", "--mode-width")):
        _common.add_retired_argument(kinetic, old, new)
    kinetic.set_defaults(run=_run_kinetic)


def _check(arguments) -> None:
    for name, value, low_open in (("--beta", arguments.beta, True), ("--lambda", arguments.slope_length, False),
                                  ("--depth", arguments.depth, True), ("--mode-width", arguments.mode_width, True)):
        if not math.isfinite(value) or value < 0 or (low_open and value == 0):
            allowed = "a finite number > 0" if low_open else "a finite number >= 0"
            raise ConfigError(f"{name}: got {value}; allowed: {allowed}")
    if arguments.slope_length > 1000 or arguments.depth > 50 or arguments.beta > 100:
        raise ConfigError(f"--lambda {arguments.slope_length}, --depth {arguments.depth}, --beta {arguments.beta}: "
                          "allowed: lambda <= 1000, t <= 50, beta <= 100 (the tested range)")
    if arguments.length < 3:
        raise ConfigError(f"--length: got {arguments.length}; allowed: an integer >= 3")


def _run_kinetic(arguments) -> None:
    import jax

    _check(arguments)
    if arguments.float64:
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from .. import io, metrics, plot
    from ..rollout import influence
    from ..theory import bridge, kinetic
    from ..theory.two_theories import to_distribution

    beta, lam, t, width = arguments.beta, arguments.slope_length, arguments.depth, arguments.mode_width
    model = kinetic.KineticModel.create(beta=beta, lam=lam, t=t, M=width, n_max=arguments.n_max)
    n, layers = arguments.length, arguments.layers
    effective = float(kinetic.effective_rate(beta, width, arguments.n_max))
    c = effective * t
    if not c <= layers:
        raise ConfigError(f"--layers: got {layers}; allowed: >= c = a_eff t = {c:.6g} (each lambda_t = c/T <= 1)")
    t_crit = float(model.critical_time()[0])
    rollout_model = bridge.matching_rollout(model, n, layers)
    out = io.prepare_output_dir(arguments.out, force=arguments.force)

    s = (np.arange(n) + 0.5) / n
    values = np.asarray(model(s), dtype=np.float64)
    distribution = np.asarray(to_distribution(model, n), dtype=np.float64)
    rollout = np.asarray(influence(rollout_model), dtype=np.float64)
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(rollout))):
        raise ConfigError("kinetic: a profile is not finite; try --float64")
    np.savetxt(out / "kinetic.csv", np.column_stack([np.arange(n), s, values, distribution]), delimiter=",",
               header="token_position,s,S_t,probability", comments="", fmt=["%d"] + ["%.17g"] * 3)
    io.write_profile(rollout, out / "profile.csv", overwrite=True)
    io.save_config(rollout_model, out / "config.yaml", overwrite=True)

    # The rollout's query position carries the identity path's point mass (about e^-c), which
    # the kinetic profile has no counterpart for: compare the shapes off the query.
    off_kinetic, off_rollout = distribution[:-1] / distribution[:-1].sum(), rollout[:-1] / rollout[:-1].sum()
    distance = float(metrics.wasserstein(off_kinetic, off_rollout))
    fine = np.linspace(0.5 / n, 1.0, 400)
    mode = np.asarray(kinetic.mode(c, fine, lam), dtype=np.float64)
    s_rollout, scaled = (np.asarray(x, dtype=np.float64) for x in bridge.mode_from_rollout(rollout, c))
    plot.plot_kinetic(out / "kinetic.png", off_kinetic, off_rollout, fine, mode, s_rollout, scaled,
                      title=(f"kinetic beta={beta:g}, lambda={lam:g}, t={t:g}, "
                             f"M={width:g} (t/t_crit = {t / t_crit:.3g}) vs rollout "
                             f"N={n}, T={layers}, m={lam / n:.3g}, c={c:.3g}"))
    results = {"beta": beta, "lambda": lam, "depth": t, "mode_width": width, "n_max": arguments.n_max,
               "t_crit": t_crit, "depth_over_t_crit": t / t_crit, "interior_minimum": t < t_crit,
               "a_eff": effective, "c": c, "N": n, "T": layers, "slope": lam / n, "lambda_t": c / layers,
               "query_mass": float(rollout[-1]), "exp_minus_c": math.exp(-c), "wasserstein_off_query": distance,
               "argmin_rollout": int(np.argmin(off_rollout)), "argmin_kinetic": int(np.argmin(off_kinetic)),
               "out": str(out), "wrote": ["kinetic.csv", "profile.csv", "config.yaml", "kinetic.png"]}
    if arguments.json:
        _common.print_json(results)
    else:
        _print_summary(results)


def _print_summary(r: dict) -> None:
    regime = "interior minimum (rises into the query)" if r["interior_minimum"] else "no rise into the query"
    print(f"jaxroll kinetic: beta = {r['beta']:g}, lambda = {r['lambda']:g}, t = {r['depth']:g}, "
          f"M = {r['mode_width']:g}, n_max = {r['n_max']}")
    print(f"  t_crit = {r['t_crit']:.9g}, t / t_crit = {r['depth_over_t_crit']:.6g}: {regime}")
    print(f"  a_eff = sum omega a^2 / sum omega a = {r['a_eff']:.6g}, c = a_eff t = {r['c']:.6g}")
    print(f"  matching rollout: N = {r['N']}, T = {r['T']}, one head, slope m = lambda/N = {r['slope']:.6g}, "
          f"lambda_t = c/T = {r['lambda_t']:.6g}")
    print(f"  rollout mass at the query j = N-1: {r['query_mass']:.6g} (e^-c = {r['exp_minus_c']:.6g}; "
          "none in the kinetic profile)")
    print(f"  off the query (j < N-1, each renormalised): W1/(N-1) = {r['wasserstein_off_query']:.6g}, "
          f"argmin rollout = {r['argmin_rollout']}, kinetic = {r['argmin_kinetic']}")
    print(f"  wrote {r['out']}/{', '.join(r['wrote'])}")
