"""Draw the README's figures, ``docs/figures/*.png``, by executing the notebooks.

Each figure is the PNG that a notebook cell tagged ``figure:NAME`` displays
when the notebook runs (nbclient, the ``python3`` kernel), so the README shows
exactly what the notebooks compute and draw, with no second copy of their
code. Figures over `MAX_BYTES` are refused rather than committed.

    jupytext --to ipynb --execute notebooks/NN_name.py   # after editing a notebook's source
    python3 scripts/make_figures.py [--out docs/figures] [--only profile forces]

Run from a checkout with jaxroll installed (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The README's figures: name -> the notebook whose tagged cell draws it.
FIGURES = {
    "u_shape": "01_u_shape",
    "depth_dichotomy": "03_depth_dichotomy",
    "measure": "05_measure",
}
MAX_BYTES = 150_000


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell of a notebook in a fresh ``python3`` kernel, in the notebook's folder."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def tagged_png(notebook: nbformat.NotebookNode, name: str) -> bytes:
    """The first PNG displayed by the cell tagged ``figure:name``."""
    for cell in notebook.cells:
        if f"figure:{name}" in cell.get("metadata", {}).get("tags", []):
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if "image/png" in data:
                    return base64.b64decode(data["image/png"])
            raise SystemExit(f"figure {name}: its cell displayed no PNG")
    raise SystemExit(f"figure {name}: no cell tagged figure:{name}")


def command_figure(arguments: list[str], name: str) -> bytes:
    """The PNG `name` that ``jaxroll ARGUMENTS --out TMP`` writes."""
    import tempfile

    from jaxroll.cli import main as jaxroll_main

    with tempfile.TemporaryDirectory() as directory:
        if jaxroll_main([*arguments, "--out", directory, "--force"]) != 0:
            raise SystemExit(f"jaxroll {' '.join(arguments)} failed")
        return (Path(directory) / name).read_bytes()


# The figures the commands draw: name -> (command line, file it writes).
COMMAND_FIGURES = {
    "profile": (["rollout"], "profile.png"),  # the README's main command
    "forces": (["forces"], "forces.png"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="folder for the PNG files")
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES) + sorted(COMMAND_FIGURES), default=None,
                        help="draw these figures only (default: all)")
    args = parser.parse_args(argv)
    wanted = set(args.only or list(FIGURES) + list(COMMAND_FIGURES))
    figures = {}
    for stem in dict.fromkeys(owner for name, owner in FIGURES.items() if name in wanted):
        start = time.perf_counter()
        notebook = execute(NOTEBOOKS / f"{stem}.ipynb")
        print(f"executed {stem}.ipynb in {time.perf_counter() - start:.1f} s")
        for name in (name for name, owner in FIGURES.items() if owner == stem and name in wanted):
            figures[name] = tagged_png(notebook, name)
    for name, (arguments, file_name) in COMMAND_FIGURES.items():
        if name in wanted:
            figures[name] = command_figure(arguments, file_name)
    too_big = [f"{name} ({len(png)} bytes)" for name, png in figures.items() if len(png) > MAX_BYTES]
    if too_big:  # checked before anything is written
        print(f"figures over {MAX_BYTES} bytes: {', '.join(too_big)}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, png in figures.items():
        path = args.out / f"{name}.png"
        path.write_bytes(png)
        print(f"wrote {path} ({len(png)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
