"""Names of a package that live in its submodules, imported on first use (PEP 562)."""

from __future__ import annotations

import importlib


def lazy_names(package: str, names: dict[str, str], namespace: dict):
    """``(__getattr__, __dir__)`` for `package`, whose public `names` map to the submodule that defines each.

    A name is imported from ``package.<submodule>`` on first access and bound
    in `namespace` (the package's globals), so later look-ups are plain
    attributes; any other name is an ``AttributeError``.
    """

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
