"""mkdocs hooks for the jaxroll site (``hooks:`` in mkdocs.yml).

- The site's name carries the package version, read from pyproject.toml, so
  the docs show the version `jaxroll --version` prints without importing
  (or installing) the package.
- The walk-through notebooks live in ``notebooks/`` at the repository root
  (beside their jupytext sources); they are added to the site as
  ``notebooks/NN_name.ipynb`` before mkdocs-jupyter renders them (with the
  outputs they were committed with; nothing is executed at build time).
  The validation figure stays beside validation/run.py, which writes it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent


def version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]["version"]


def on_config(config):
    config.site_name = f"jaxroll {version()}"
    return config


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files, config):
    paths = [*sorted((ROOT / "notebooks").glob("*.ipynb")), ROOT / "validation" / "validation.png"]
    for path in paths:
        files.append(File(path.relative_to(ROOT).as_posix(), src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files
