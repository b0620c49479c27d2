"""What a temperature moves: the mixing ratios lambda_t (issue 53, a probe).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/temperature_lambda.py --out RUN

The default route predicts the temperature and SSMax changes of the Llamas far too small (wave-6 Llama, tau = 0.7:
+0.001 against +0.023 measured), on the rows route as on the default one. A temperature changes how concentrated
each attention row is, and with it the norm of the attention output, which is what the measured lambda_t is a
ratio of. The rollout's transforms keep lambda_t as measured on the baseline.

For each validation model (wave 5 at N = 64, S = 64; wave 6 at N = 128, S = 48) this probe measures the baseline
with the default route's statistics (`validation/interventions.py`'s ``BASE_STATS``). It then measures the model
under ``tau=0.7``, ``tau=1.5`` and ``ssmax_scale=0.3`` (``lambda,influence``). Each change is predicted three
ways from the baseline's config.yaml (with its fitted q):

- the default route: the change applied to the model (``jaxroll rollout --intervene``);
- the same, with the intervened model's *measured* lambda'_t in place of lambda_t (an oracle for lambda only);
- lambda'_t alone, on the unchanged kernel.

Each is reported as its middle-mass change beside the measured one (`jaxroll.measure.effect.middle_mass` of the
pooled profiles).

Is lambda'_t a property of layer t alone? For each temperature and each layer t, the model is measured once more
(``lambda`` only, a forward pass) with the temperature at layer t only (a YAML ``tau`` of shape (T, 1), 1 elsewhere):
layer t then reads the baseline's input, so its lambda_t is the *local* lambda'_t, what a first-order rule computed
from the baseline (its attention outputs at the changed gain) would give. The second table sets it beside the
measured lambda'_t and predicts with it as with the measured one. (SSMax has no neutral value per layer, s ln n,
so it has no local row.) Writes ``RUN/temperature-lambda.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import composition_fit as fit  # noqa: E402
import interventions as runs  # noqa: E402

HERE = Path(__file__).resolve().parent
MODELS = fit.MODELS  # the validation models, their N and S, as every issue-53 run reads them
CHANGES = ("tau=0.7", "tau=1.5", "ssmax_scale=0.3")


def local_lambdas(model_dir: Path, texts: Path, folder: Path, tau: float, layers: int, samples: int,
                  n: int) -> np.ndarray:
    """``(T,)``: lambda_t measured with the temperature `tau` at layer t alone, one run per layer (lambda only)."""
    import yaml

    local = np.empty(layers)
    for layer in range(layers):
        run = folder / f"local{layer}"
        run.mkdir(parents=True, exist_ok=True)
        spec = run / "interventions.yaml"
        spec.write_text(yaml.safe_dump({"tau": [[tau if t == layer else 1.0] for t in range(layers)]}))
        local[layer] = runs.measure(model_dir, texts, run, "lambda", samples, n, str(spec))["lambdas"][layer]
    return local


def model_rows(wave: str, family: str, out: Path, log) -> tuple[list[str], list[str]]:
    import jaxroll
    from jaxroll import interventions
    from jaxroll.measure.effect import middle_mass

    n, samples = MODELS[wave, family]
    runs.LENGTH = n
    model_dir, texts = HERE / "models" / wave / f"{family}-trained", HERE / "models" / wave / "held_out.jsonl"
    folder = out / wave / family
    baseline = runs.measure(model_dir, texts, folder / "baseline", runs.BASE_STATS[family], samples)
    config = jaxroll.load_config(folder / "baseline" / "config.yaml")
    measured_base = middle_mass(runs.profile_of(baseline["influence_per_sequence"]))
    predicted_base = middle_mass(np.asarray(jaxroll.influence(config), dtype=np.float64))
    lines, local_lines = [], []
    lambdas = np.asarray(baseline["lambdas"], dtype=np.float64)

    def predicted_change(model) -> float:
        return middle_mass(np.asarray(jaxroll.influence(model), dtype=np.float64)) - predicted_base

    def with_lambdas(changed, values) -> tuple:
        """The changed model and the unchanged one, each with `values` as lambda_t."""
        return tuple(dataclasses.replace(model, lambdas=jax.numpy.asarray(values)) for model in (changed, config))
    for spec in CHANGES:
        slug = spec.replace("=", "")
        intervened = runs.measure(model_dir, texts, folder / slug, "lambda,influence", samples, n, spec)
        lam = np.asarray(intervened["lambdas"], dtype=np.float64)
        changed = interventions.apply_all(config, interventions.parse(spec))
        changes = [predicted_change(model) for model in (changed, *with_lambdas(changed, lam))]
        ratio = lam / lambdas
        line = (f"| {wave} {family} | `{spec}` | {ratio.min():.3f}-{ratio.max():.3f} | "
                f"{middle_mass(runs.profile_of(intervened['influence_per_sequence'])) - measured_base:+.4f} | "
                + " | ".join(f"{value:+.4f}" for value in changes) + " |")
        log(line)
        lines.append(line)
        if not spec.startswith("tau="):
            continue
        local = local_lambdas(model_dir, texts, folder / slug, float(spec[4:]), len(lambdas), samples, n)
        if abs(local[0] - lam[0]) > 1e-10:  # layer 0 reads the embeddings either way: the two runs must agree
            raise RuntimeError(f"{wave} {family} {spec}: local lambda'_0 {local[0]!r} != measured {lam[0]!r}")
        local_changes = [predicted_change(model) for model in with_lambdas(changed, local)]
        line = (f"| {wave} {family} | `{spec}` | " + ", ".join(f"{v:.3f}" for v in ratio) + " | "
                + ", ".join(f"{v:.3f}" for v in local / lambdas) + " | "
                + f"{np.median((local - lambdas) / (lam - lambdas)):.2f} | "
                + " | ".join(f"{v:+.4f}" for v in (changes[1], local_changes[0], changes[2], local_changes[1]))
                + " |")
        log(line)
        local_lines.append(line)
    return lines, local_lines


def main(argv=None) -> int:
    out = runs.start_run(__doc__, argv)
    log = functools.partial(print, flush=True)
    lines = ["| model | change | lambda'_t / lambda_t (min-max over layers) | middle mass change: measured | "
             "predicted: default route | with measured lambda' | lambda' alone |", "|---|---|---:|---:|---:|---:|---:|"]
    local = ["| model | change | lambda'_t / lambda_t, measured (per layer) | local: the change at layer t only | "
             "local share of the change (median over layers) | predicted: with measured lambda' | with local lambda' | "
             "measured lambda' alone | local lambda' alone |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for wave, family in MODELS:
        rows, local_rows = model_rows(wave, family, out, log)
        lines += rows
        local += local_rows
    text = "\n".join(lines) + "\n\n" + "\n".join(local) + "\n"
    (out / "temperature-lambda.md").write_text(text)
    log(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
