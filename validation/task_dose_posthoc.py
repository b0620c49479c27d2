"""A design direction at a tenth of its strength on another checkpoint, post hoc (issue 54).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 validation/task_dose_posthoc.py --model bloom-step9000 --work WORK

WORK is a `validation/task_design_alibi.py --model MODEL --work WORK` run's folder. The tau, kappa, gamma design
found there, at a tenth of its distance from neutral (`dose_mapping`), scored on its selection and held-out cases
against the unchanged model: middle accuracy (f = 0.4-0.6) and the answer loss, paired 95 % intervals. Not a
test: on bloom-step9000 the loop chose another design, whose doses `DOSE_RULE` found none to take.
"""
import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import task_design_alibi as t  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="bloom-step9000")
parser.add_argument("--work", type=Path, required=True)
arguments = parser.parse_args()
t.MODEL = t.MODELS / arguments.model
work = arguments.work
files = t.prepare(work, 10, 500)
rec = yaml.safe_load((work / "design-tau--kappa--gamma--the-llama-loop-s" / "interventions.yaml").read_text())
path = work / "posthoc-tkg-0.1.yaml"
path.write_text(yaml.safe_dump(t.dose_mapping(rec, 0.1)))
print("dose", yaml.safe_load(path.read_text()))
base_sel = t.score(files["selection"], work / "select-baseline")
base_held = t.score(files["held"], work / "held-baseline")
for label, cases, base in (("selection", files["selection"], base_sel), ("held out", files["held"], base_held)):
    rows = t.score(cases, work / f"posthoc-tkg-{label.replace(' ', '-')}", str(path))
    c = t.compare(base, rows)
    for n, v in c.items():
        m, l = v["middle"], v["answer_loss"]
        print(f"{label} N={n}: middle {m['before']:.3f} -> {m['after']:.3f} ({m['change']:+.3f} [{m['change_interval'][0]:+.3f}, {m['change_interval'][1]:+.3f}]) beyond={m.get('beyond')}; loss {l['change']:+.3f} [{l['change_interval'][0]:+.3f}, {l['change_interval'][1]:+.3f}]", flush=True)
