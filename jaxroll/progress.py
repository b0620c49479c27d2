"""Progress of a long command: a redrawn bar on a terminal, lines in a log.

The one convention of every long command (``fit``, ``fit-kernel``,
``measure``, ``sweep``, ``task``). On a terminal (``stream.isatty()``) a
tqdm bar, redrawn in place. Anywhere else (a pipe, a file, a batch job's
log) newline-terminated lines, never a carriage return: one when the done
fraction crosses a multiple of `every_percent` or `every_seconds` have
passed, but never two within `min_seconds`, and one at the end; with a
`delay`, nothing before it has passed (a sub-second job prints its closing
line only, or no bar)::

    jaxroll measure: 12/96 sequences (12%), 0.41 seq/s, elapsed 29 s, ETA 3 min 24 s
    jaxroll fit: 46/46 steps (100%), 31.2 step/s, elapsed 1 s, loss=0.0123, stop=converged

The rate counts the work done in this process since it started (a resumed
run does not count what it loaded from a checkpoint), so the ETA
``(total - done) / rate`` is honest after a resume. Pure Python: no JAX or
torch import.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``"42 s"``, ``"3 min 24 s"``, ``"2 h 05 min"``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


class Progress:
    """Report ``done / total`` units of work: a tqdm bar on a terminal, else lines.

    Args:
        total: units this process does.
        initial: already done (loaded from a checkpoint).
        stream: where to write (default ``sys.stderr``).
        every_percent: a line when the done fraction crosses a multiple of it.
        every_seconds: a line when this long has passed since the last one.
        min_seconds: never two lines within this long (the closing line excepted).
        label: the line's prefix.
        unit: the plural name of a unit (``"sequences"``, ``"steps"``).
        rate_unit: its short name in the rate (default: `unit` without a final "s").
        clock: a ``() -> seconds`` function (tests pass a fake one).
        bar: True / False to force or forbid the tqdm bar; None (default):
            a bar exactly when `stream` is a terminal.
        delay: seconds before the first line or the bar shows (default 0;
            the commands pass 2, so a short job prints one line).
    """

    def __init__(self, total: int, *, initial: int = 0, stream=None, every_percent: float = 5.0,
                 every_seconds: float = 30.0, min_seconds: float = 5.0, label: str = "jaxroll measure",
                 unit: str = "sequences", rate_unit: str | None = None, clock=time.monotonic, bar=None,
                 delay: float = 0.0):
        self.total = int(total)
        self.done = int(initial)
        self.initial = int(initial)
        self.stream = sys.stderr if stream is None else stream
        self.every_percent = float(every_percent)
        self.every_seconds = float(every_seconds)
        self.min_seconds = float(min_seconds)
        self.label = label
        self.unit = unit
        self.rate_unit = rate_unit if rate_unit is not None else (unit[:-1] if unit.endswith("s") else unit)
        self.clock = clock
        self.delay = float(delay)
        self.postfix: dict[str, str] = {}
        self.start = self.last_time = clock()
        self.last_line = -float("inf")  # when the last line was written
        self.last_step = self._step(self.done)
        self.closed = False
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.bar = None
        if bar:
            from tqdm.auto import tqdm

            label_ = label.removeprefix("jaxroll ")
            self.bar = tqdm(total=self.total, initial=self.initial, desc=label_, unit=self.rate_unit,
                            file=self.stream, delay=self.delay)

    def _step(self, done: int) -> int:
        # Which every_percent band `done` is in.
        return int(100.0 * done / max(self.total, 1) // self.every_percent)

    def line(self) -> str:
        """The current progress line (without a newline)."""
        elapsed = self.clock() - self.start
        fresh = self.done - self.initial
        rate = fresh / elapsed if elapsed > 0 else 0.0
        percent = 100.0 * self.done / max(self.total, 1)
        text = f"{self.label}: {self.done}/{self.total} {self.unit} ({percent:.0f}%), "
        text += f"{rate:.3g} {self.rate_unit}/s, elapsed {format_seconds(elapsed)}"
        if self.done < self.total:
            text += f", ETA {format_seconds((self.total - self.done) / rate) if rate > 0 else 'unknown'}"
        return text + "".join(f", {key}={value}" for key, value in self.postfix.items())

    def set_postfix(self, **values) -> None:
        """Fields shown after the counts (``loss=0.0123``); the next line or redraw shows them."""
        self.postfix.update({key: str(value) for key, value in values.items()})
        if self.bar is not None:
            self.bar.set_postfix(self.postfix, refresh=False)

    def update(self, n: int = 1) -> None:
        self.done += int(n)
        if self.bar is not None:
            self.bar.update(n)
            return
        now = self.clock()
        step = self._step(self.done)
        if (step > self.last_step or now - self.last_time >= self.every_seconds) \
                and now - self.last_line >= self.min_seconds:
            # The last line comes from close(); none before `delay` has passed.
            if self.done < self.total and now - self.start >= self.delay:
                self._write()
                self.last_line = now
            self.last_step, self.last_time = step, now

    def _write(self) -> None:
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self, *, complete: bool = False, **postfix) -> None:
        """Write the closing line (or draw the bar's last state) once.

        complete: the work ended early (a fit that converged before its step
            limit): the total becomes what was done, so the count ends at 100%.
        postfix: last fields to show (``stop="converged"``).
        """
        if self.closed:
            return
        self.closed = True
        if complete:
            self.total = self.done
        if postfix:
            self.set_postfix(**postfix)
        if self.bar is not None:
            if complete:
                self.bar.total = self.bar.n
            self.bar.close()
        elif self.done > self.initial:
            self._write()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is not None and self.bar is None and self.clock() - self.start < self.delay:
            self.closed = True  # interrupted before anything showed: the error's line is the only one
            return
        self.close()
