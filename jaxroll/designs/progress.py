"""What `jaxroll.design` reports while it runs: the stage it is in, then each restart as it ends.

A design spends its time in a few compiled calls (the original kernels, the global stage's scores,
each outer iteration's local stages of every start), and the first call of each compiles: at
n = 64 the first local stage compiled for two minutes before anything could be counted. So the
report names each stage before its call (the first line comes before the first compilation, not
after it) and counts the restarts as they end inside the compiled loop (a host callback), in the
package's one convention (`jaxroll.progress.Progress`: a bar on a terminal, lines in a log). The
ETA of an outer iteration is estimated from the restarts that ended after the first one of the
first iteration: that one's time is mostly compilation, and a rate that counted it overstated the
remaining time thirty-fold.

    jaxroll design: compiling the original kernels and the global stage (128 points), elapsed 0 s
    jaxroll design: outer iteration 1 (at most 30): 8 restarts; compiling the local stage first, elapsed 3 s
    jaxroll design: restart 1 of 8 ended (1 min 58 s, the compilation included), elapsed 2 min 01 s
    jaxroll design, outer iteration 1: 4/8 restarts (50%), 0.4 restart/s, elapsed 8 s, ETA 10 s
"""

from __future__ import annotations

import sys
import time

from ..progress import Progress, format_seconds

__all__ = ["DesignProgress", "restart_ended"]

_LABEL = "jaxroll design"
_current: list = []  # the report the compiled loop's callback counts into (empty: none)


def restart_ended(_best_loss) -> None:
    """The host callback of the compiled loop: one start's local stage ended (its loss is passed only
    so that the callback runs after the stage)."""
    if _current:
        _current[-1].restart_ended()


class DesignProgress:
    """Stage lines and a count of restarts per outer iteration on `stream` (default stderr);
    nothing at all when `enabled` is false."""

    def __init__(self, enabled: bool, *, stream=None, clock=time.monotonic):
        self.enabled = bool(enabled)
        self.stream = stream
        self.clock = clock
        self.start = clock()
        self.bar = None
        self.outer = 0
        self.count = 0
        self.compiling = False  # the current iteration's first restart includes the compilation
        self.iteration_start = self.start
        self.label = _LABEL

    def __enter__(self) -> "DesignProgress":
        if self.enabled:
            _current.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled and self in _current:
            _current.remove(self)
        if self.bar is not None:
            self.bar.close()

    def _stream(self):
        return sys.stderr if self.stream is None else self.stream  # read late: pytest swaps stderr

    def stage(self, text: str) -> None:
        """One line now: ``jaxroll design: TEXT, elapsed 3 s``."""
        if not self.enabled:
            return
        stream = self._stream()
        stream.write(f"{_LABEL}: {text}, elapsed {format_seconds(self.clock() - self.start)}\n")
        stream.flush()

    def begin_outer(self, outer: int, count: int, limit: int | None, compiling: bool) -> None:
        """Outer iteration `outer` (of at most `limit`; None: the only one) of `count` restarts."""
        self.outer, self.count, self.compiling = outer, count, compiling
        self.label = f"{_LABEL}, " + ("the local stage" if limit is None else f"outer iteration {outer}")
        self.iteration_start = self.clock()
        if not self.enabled:
            return
        which = "the local stage" if limit is None else f"outer iteration {outer} (at most {limit})"
        self.stage(f"{which}: {count} restart{'s' if count != 1 else ''}"
                   + ("; compiling the local stage first (unless compiled before)" if compiling else ""))
        if not compiling:
            self.bar = self._bar(0)

    def _bar(self, initial: int) -> Progress:
        return Progress(self.count, initial=initial, stream=self._stream(), clock=self.clock,
                        label=self.label, unit="restarts", rate_unit="restart",
                        every_seconds=30.0, min_seconds=2.0)

    def restart_ended(self) -> None:
        """Count one restart (called from the compiled loop through `restart_ended`)."""
        if self.compiling:
            # The rate starts after the first restart: its time is mostly compilation.
            self.compiling = False
            self.stage(f"restart 1 of {self.count} ended ("
                       f"{format_seconds(self.clock() - self.iteration_start)}, the compilation included)")
            self.bar = self._bar(1)
        elif self.bar is not None:
            self.bar.update(1)

    def end_outer(self, feasible: int | None, settled: int | None) -> None:
        """Close the iteration's count; a budgeted one says how many starts are feasible and settled."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if feasible is not None:
            self.stage(f"outer iteration {self.outer} ended in {format_seconds(self.clock() - self.iteration_start)}"
                       f": {feasible}/{self.count} starts within the budget, {settled}/{self.count} settled")

    def close(self, outer: int, stop: str) -> None:
        """The closing line: the whole time, the outer iterations, how it stopped."""
        self.stage(f"done: {outer} outer iteration{'s' if outer != 1 else ''}, stop={stop}")
