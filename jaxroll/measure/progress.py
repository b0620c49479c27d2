"""Progress of a long measurement: `jaxroll.progress`, the convention every
long command shares (a redrawn bar on a terminal, newline-terminated lines
elsewhere), kept here under its old name. Pure Python: no torch import."""

from __future__ import annotations

from ..progress import Progress, format_seconds

__all__ = ["Progress", "format_seconds"]
