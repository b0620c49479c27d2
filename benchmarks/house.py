"""The house benchmark: the same numbers and the same speed before and after a change of layout.

Two jobs, each through the public API only, so one script runs on any
checkout (``PYTHONPATH=CHECKOUT python3 benchmarks/house.py ...``):

- ``values OUT.npz [--against BASE.npz]``: float64 profiles of every
  published configuration (N = 256 and 2048) and both presets, a sweep, a
  fit, a design, and the rollout's prediction under each intervention on a
  small ALiBi model and its rotary (power-kernel) twin; with ``--against``
  the largest absolute difference per group against a saved run.
- ``speed [--rounds R]``: seconds, warm (after one compile), of the 33
  configurations at N = 256, BLOOM-176B's influence and its gradient with
  respect to the lambdas at N = 2^16 and 2^20 (float32, structured), and a
  Krylov sweep of 64 schedules: the least of R rounds per row. Run two
  checkouts alternately and compare the rows (`farm-bench`-style A/B).

Never run in CI.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _profiles_published(jaxroll):
    out = {}
    for model_name, content, dataset, length in jaxroll.published.catalogue():
        model = jaxroll.published.load(model_name, content, dataset, length)
        out[f"published/{model_name}/{content}/{dataset}/{length}"] = np.asarray(jaxroll.influence(model))
    for name in jaxroll.presets.names():
        out[f"preset/{name}"] = np.asarray(jaxroll.influence(jaxroll.presets.get(name)))
    return out


def _small_models(jaxroll):
    alibi = jaxroll.RolloutModel.create(num_layers=3, num_heads=2, lambdas=[0.6, 0.4, 0.5],
                                        alibi_slopes=[[0.5, 0.1], [0.3, 0.05], [0.2, 0.4]],
                                        diagonal_scores=[[0.5, -0.3], [1.0, 0.2], [0.0, 0.4]], sequence_length=32)
    return alibi


def _interventions(jaxroll):
    from jaxroll import interventions as iv
    from jaxroll.engine.dense import DenseKernel
    from jaxroll.engine.offset import PowerKernel, TableKernel

    alibi = _small_models(jaxroll)
    power = jaxroll.RolloutModel.create(
        kernel=PowerKernel(slopes=np.array([[0.5, 0.1], [0.3, 0.05], [0.2, 0.4]]),
                           exponents=np.array([[0.7, 1.0], [0.5, 0.9], [1.2, 0.8]]),
                           diagonal_scores=np.array([[0.5, -0.3], [1.0, 0.2], [0.0, 0.4]]),
                           head_weights=np.full((3, 2), 0.5)),
        lambdas=[0.6, 0.4, 0.5], sequence_length=32)
    rng = np.random.default_rng(0)
    table = jaxroll.RolloutModel.create(
        kernel=TableKernel(offset_scores=-np.cumsum(rng.uniform(0.0, 0.3, (3, 2, 40)), axis=-1),
                           diagonal_scores=np.array([[0.5, -0.3], [1.0, 0.2], [0.0, 0.4]]),
                           head_weights=np.full((3, 2), 0.5)),
        lambdas=[0.6, 0.4, 0.5], sequence_length=32)
    raw = np.tril(rng.uniform(0.1, 1.0, (3, 32, 32)))
    dense = jaxroll.RolloutModel.create(kernel=DenseKernel(raw / raw.sum(-1, keepdims=True), True),
                                        lambdas=[0.6, 0.4, 0.5], sequence_length=32)
    changes = {"tau": "tau=0.7", "slope_scale": "slope_scale=1.5", "kappa": "kappa=-0.5",
               "kappa_unsquash": "kappa=0.3,kappa_form=unsquash", "ssmax": "ssmax_scale=0.8", "gamma": "gamma=0.5",
               "sinks": "sinks=4", "rotary": "rotary_ratio=2.0", "joint": "tau=0.8,gamma=0.7,kappa=0.2"}
    out = {}
    for model_name, model in (("alibi", alibi), ("power", power), ("table", table), ("dense", dense)):
        for name, text in changes.items():
            if model_name == "alibi" and name == "rotary":
                continue
            try:
                changed = iv.apply_all(model, iv.parse(text))
            except jaxroll.errors.ConfigError:
                continue
            out[f"intervene/{model_name}/{name}"] = np.asarray(jaxroll.influence(changed))
    return out


def _sweep_fit_design(jaxroll):
    from jaxroll import interventions as iv

    out = {}
    grid = jaxroll.sweep(jaxroll.presets.get("mpt-7b", 64), tau=[0.5, 1.0, 2.0], gamma=[0.5, 1.0, 2.0], progress=False)
    out["sweep/intervention_profiles"] = np.asarray(grid.profiles)
    grid = jaxroll.sweep(jaxroll.presets.get("mpt-7b", 64), lambda_0=[0.2, 0.4, 0.6], beta=[0.5, 1.0, 2.0],
                         progress=False)
    out["sweep/krylov_profiles"] = np.asarray(grid.profiles)
    model = _small_models(jaxroll)
    target = np.asarray(jaxroll.influence(jaxroll.RolloutModel.create(
        num_layers=3, num_heads=2, lambdas=[0.3, 0.5, 0.2], alibi_slopes=[[0.5, 0.1], [0.3, 0.05], [0.2, 0.4]],
        diagonal_scores=[[0.5, -0.3], [1.0, 0.2], [0.0, 0.4]], sequence_length=32)))
    fit = jaxroll.fit(model, target, steps=300)
    out["fit/lambdas"] = np.asarray(fit.model.lambdas)
    target = jaxroll.influence(iv.apply_all(model, [iv.Temperature(0.8), iv.BranchScale(0.7)]))
    result = jaxroll.design(model, "tau=global,gamma=global", target=target, loss="kl")
    out["design/values"] = np.array([float(result.values["tau"]), float(result.values["gamma"])])
    return out


def values(args) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jaxroll
    import jaxroll.errors  # noqa: F401

    found = _profiles_published(jaxroll) | _interventions(jaxroll) | _sweep_fit_design(jaxroll)
    np.savez(args.out, **found)
    print(f"{len(found)} arrays -> {args.out}")
    if args.against:
        base = np.load(args.against)
        groups: dict[str, float] = {}
        missing = sorted(set(base.files) ^ set(found))
        for key in sorted(set(base.files) & set(found)):
            group = key.split("/")[0] + ("/" + key.split("/")[1] if key.startswith("intervene") else "")
            difference = float(np.max(np.abs(base[key] - found[key]))) if base[key].shape == found[key].shape \
                else float("inf")
            groups[group] = max(groups.get(group, 0.0), difference)
        print(f"{'group':<22} {'largest |difference|':>22}")
        for group, difference in groups.items():
            print(f"{group:<22} {difference:>22.3g}")
        print(f"arrays in one run only: {missing or 'none'}")


def _least(function, rounds: int) -> float:
    function()  # compile
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def speed(args) -> None:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import jaxroll

    configs = [jaxroll.published.load(m, c, d, n) for m, c, d, n in jaxroll.published.catalogue() if n == 256][:33]
    rows = {"33 configurations, N = 256": lambda: [jaxroll.influence(m).block_until_ready() for m in configs]}
    for exponent in (16, 20):
        model = jaxroll.presets.get("bloom-176b", 2 ** exponent)
        rows[f"bloom-176b influence, N = 2^{exponent}"] = (
            lambda model=model: jaxroll.influence(model).block_until_ready())
        gradient = jax.jit(jax.grad(lambda lambdas, model=model: jaxroll.influence(
            eqx.tree_at(lambda m: m.lambdas, model, lambdas))[0]))
        lambdas = jnp.asarray(model.lambdas)
        rows[f"bloom-176b grad, N = 2^{exponent}"] = lambda g=gradient, x=lambdas: g(x).block_until_ready()
    preset = jaxroll.presets.get("mpt-7b", 1024)
    rows["krylov sweep, 64 schedules, N = 1024"] = lambda: jaxroll.sweep(
        preset, lambda_0=list(np.linspace(0.1, 0.8, 8)), beta=list(np.linspace(0.2, 2.0, 8)), progress=False)
    print(f"{'row':<40} {'seconds (least of ' + str(args.rounds) + ')':>24}")
    for name, function in rows.items():
        print(f"{name:<40} {_least(function, args.rounds):>24.4f}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs = parser.add_subparsers(dest="job", required=True)
    job = jobs.add_parser("values")
    job.add_argument("out")
    job.add_argument("--against")
    job.set_defaults(run=values)
    job = jobs.add_parser("speed")
    job.add_argument("--rounds", type=int, default=3)
    job.set_defaults(run=speed)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
