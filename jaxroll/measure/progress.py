"""Progress of a long measurement: a bar on a terminal, lines in a log.

On a terminal (``stream.isatty()``) a tqdm bar. Anywhere else (a pipe, a
file, a batch job's log) one line on the stream every `every_percent`
percent of the sequences or every `every_seconds` seconds, whichever comes
first, and one at the end; with a `delay`, nothing before it has passed
(a sub-second job prints its closing line only, or no bar)::

    jaxroll measure: 12/96 sequences (12%), 0.41 seq/s, elapsed 29 s, ETA 3 min 24 s

The rate counts the sequences done in this process since it started (a
resumed run does not count the ones loaded from the checkpoint), so the
ETA ``(total - done) / rate`` is honest after a resume. Pure Python: no
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
    """Report ``done / total`` sequences: a tqdm bar on a terminal, else lines.

    Args:
        total: sequences this process measures.
        initial: already done (loaded from a checkpoint).
        stream: where to write (default ``sys.stderr``).
        every_percent: a line when the done fraction crosses a multiple of it.
        every_seconds: a line when this long has passed since the last one.
        label: the line's prefix.
        clock: a ``() -> seconds`` function (tests pass a fake one).
        bar: True / False to force or forbid the tqdm bar; None (default):
            a bar exactly when `stream` is a terminal.
        delay: seconds before the first line or the bar shows (default 0;
            ``jaxroll measure`` passes 2, so a short job prints one line).
    """

    def __init__(self, total: int, *, initial: int = 0, stream=None, every_percent: float = 5.0,
                 every_seconds: float = 30.0, label: str = "jaxroll measure", clock=time.monotonic, bar=None,
                 delay: float = 0.0):
        self.total = int(total)
        self.done = int(initial)
        self.initial = int(initial)
        self.stream = sys.stderr if stream is None else stream
        self.every_percent = float(every_percent)
        self.every_seconds = float(every_seconds)
        self.label = label
        self.clock = clock
        self.delay = float(delay)
        self.start = self.last_time = clock()
        self.last_step = self._step(self.done)
        self.closed = False
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.bar = None
        if bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.initial, desc=label, unit="seq", file=self.stream,
                            delay=self.delay)

    def _step(self, done: int) -> int:
        # Which every_percent band `done` is in.
        return int(100.0 * done / max(self.total, 1) // self.every_percent)

    def line(self) -> str:
        """The current progress line (without a newline)."""
        elapsed = self.clock() - self.start
        fresh = self.done - self.initial
        rate = fresh / elapsed if elapsed > 0 else 0.0
        percent = 100.0 * self.done / max(self.total, 1)
        text = f"{self.label}: {self.done}/{self.total} sequences ({percent:.0f}%), "
        text += f"{rate:.3g} seq/s, elapsed {format_seconds(elapsed)}"
        if self.done < self.total:
            text += f", ETA {format_seconds((self.total - self.done) / rate) if rate > 0 else 'unknown'}"
        return text

    def update(self, n: int = 1) -> None:
        self.done += int(n)
        if self.bar is not None:
            self.bar.update(n)
            return
        now = self.clock()
        step = self._step(self.done)
        if step > self.last_step or now - self.last_time >= self.every_seconds:
            # The last line comes from close(); none before `delay` has passed.
            if self.done < self.total and now - self.start >= self.delay:
                self._write()
            self.last_step, self.last_time = step, now

    def _write(self) -> None:
        print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.done > self.initial:
            self._write()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
