"""The scripts of validation/ (a folder of scripts, not part of the installed package), loaded by path."""

import importlib.util
import sys
from pathlib import Path

VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def load(name: str):
    """``validation/NAME.py`` as the module ``validation_NAME``, registered in ``sys.modules`` (its dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"validation_{name}", VALIDATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
