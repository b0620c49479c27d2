"""The stream rule's run against the run before it: the middle-mass change of each branch, slope and distance row.

    PYTHONPATH=. python3 validation/stream_compare.py [--label NAME] [--all] OLD.json:FAMILY NEW.json:FAMILY ... > table.md

Arguments in pairs (``--label`` names the re-run's column, default "stream rule"; ``--all`` every row with a
middle-mass prediction, not only the sized ones: the temperatures and SSMax too), the run before (its ``results.json`` of `validation/interventions.py` and a family) then the
re-run; prints a Markdown table of the default route's predicted middle-mass change (``middle_extended``) in both,
the measured change, each size ratio and the 1.25x target (c), for the rows that target names, and the anchored
W1 / noise (target (a)) before and after.
"""

from __future__ import annotations

import json
import sys

SIZED = ("slope_scale", "gamma", "kappa")


def rows(path: str, family: str) -> dict:
    return {row["intervention"]: row for row in json.load(open(path))["rows"]
            if row["family"] == family and "error" not in row}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    label = "stream rule"
    if args[:1] == ["--label"]:
        label, args = args[1], args[2:]
    every = args[:1] == ["--all"]
    args = args[1:] if every else args
    print(f"| model | change | measured [95 %] | before: predicted (ratio) | {label}: predicted (ratio) | "
          "anchored W1/noise: before / now |")
    print("|---|---|---:|---:|---:|---:|")
    for old_arg, new_arg in zip(args[::2], args[1::2]):
        old, new = rows(*old_arg.split(":")), rows(*new_arg.split(":"))
        name = new_arg.split(":")[0].split("/")[-2] + " " + new_arg.split(":")[1]
        for key, row in new.items():
            sized = any(key.startswith(s) or key.startswith("per-layer " + s) for s in SIZED)
            if not (sized or every and "middle_extended" in row) or key not in old:
                continue
            low, high = row["middle_measured_interval"]
            significant = low > 0 or high < 0
            measured = row["middle_measured"]

            def cell(value):
                ratio = value / measured
                verdict = ("met" if 0.8 <= ratio <= 1.25 else "missed") if significant else "n.s."
                return f"{value:+.4f} ({ratio:.2f}x, {verdict})"

            print(f"| {name} | `{key}` | {measured:+.4f} [{low:+.4f}, {high:+.4f}] | {cell(old[key]['middle_extended'])} "
                  f"| {cell(row['middle_extended'])} | {old[key]['extended_anchored_ratio']:.2f}x / "
                  f"{row['extended_anchored_ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
