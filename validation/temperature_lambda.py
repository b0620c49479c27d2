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
pooled profiles). Writes ``RUN/temperature-lambda.md``.
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


def model_rows(wave: str, family: str, out: Path, log) -> list[str]:
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
    lines = []
    for spec in CHANGES:
        slug = spec.replace("=", "")
        intervened = runs.measure(model_dir, texts, folder / slug, "lambda,influence", samples, n, spec)
        lam = np.asarray(intervened["lambdas"], dtype=np.float64)
        changed = interventions.apply_all(config, interventions.parse(spec))
        profiles = {"default route": changed,
                    "with measured lambda'": dataclasses.replace(changed, lambdas=jax.numpy.asarray(lam)),
                    "lambda' alone": dataclasses.replace(config, lambdas=jax.numpy.asarray(lam))}
        changes = {name: middle_mass(np.asarray(jaxroll.influence(model), dtype=np.float64)) - predicted_base
                   for name, model in profiles.items()}
        ratio = lam / np.asarray(baseline["lambdas"], dtype=np.float64)
        line = (f"| {wave} {family} | `{spec}` | {ratio.min():.3f}-{ratio.max():.3f} | "
                f"{middle_mass(runs.profile_of(intervened['influence_per_sequence'])) - measured_base:+.4f} | "
                + " | ".join(f"{value:+.4f}" for value in changes.values()) + " |")
        log(line)
        lines.append(line)
    return lines


def main(argv=None) -> int:
    out = runs.start_run(__doc__, argv)
    log = functools.partial(print, flush=True)
    lines = ["| model | change | lambda'_t / lambda_t (min-max over layers) | middle mass change: measured | "
             "predicted: default route | with measured lambda' | lambda' alone |", "|---|---|---:|---:|---:|---:|---:|"]
    for wave, family in MODELS:
        lines += model_rows(wave, family, out, log)
    text = "\n".join(lines) + "\n"
    (out / "temperature-lambda.md").write_text(text)
    log(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
