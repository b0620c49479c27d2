"""The installed package's version, read from its metadata (what every output's record names)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


def package_version() -> str:
    """jaxroll's version string, or ``"0.0.0"`` for a source tree that is not installed."""
    try:
        return version("jaxroll")
    except PackageNotFoundError:
        return "0.0.0"
