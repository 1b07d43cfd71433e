"""Progress display: a tqdm bar on a terminal, plain periodic lines anywhere else.

A bar redraws itself with carriage returns and, when nested (the sweep's bar
over each run's), cursor-movement escape codes. In a log file (every pod
worker's, or ``... 2> log``) that is line noise, so when the stream is not a
terminal ``bar`` returns ``LineProgress`` instead: one ordinary line every
``interval`` seconds and one at the end, and nothing else.
"""

from __future__ import annotations

import sys
import time


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes and closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def bar(*, total: int, desc: str, unit: str, file=None, initial: int = 0, leave: bool = True,
        interval: float = 30.0, shown: bool = True, clock: str = "", **tqdm_options):
    """A progress display of ``total`` ``unit``s: tqdm on a terminal, else ``LineProgress``.

    ``interval`` (seconds) spaces the plain lines; ``shown=False`` gives a
    display that prints nothing; ``clock`` says what the plain lines' elapsed
    time counts (e.g. "of training, compiling excluded"); ``tqdm_options`` go to tqdm only.
    """
    file = sys.stderr if file is None else file
    if not shown:
        return LineProgress(total=total, desc=desc, unit=unit, file=file, initial=initial, leave=False)
    if is_terminal(file):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, initial=initial, leave=leave, **tqdm_options)
    return LineProgress(total=total, desc=desc, unit=unit, file=file, initial=initial, leave=leave,
                        interval=interval, clock=clock)


def duration(seconds: float) -> str:
    """A rough human duration: '42 s', '3.5 min', '2.1 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def run_time(steps: int, train_seconds: float | None, wall_seconds: float | None) -> str:
    """A run's time in words, saying what each number counts (``scaling.records.RunRecord``'s two measures):

    '500 steps in 19 s of training (+41 s loading data, compiling, final evaluation and checkpoint; 60 s wall)';
    '500 steps in 60 s wall' for a record that has no ``train_seconds``.
    """
    if wall_seconds is None:
        return f"{steps} steps"
    if train_seconds is None:
        return f"{steps} steps in {duration(wall_seconds)} wall"
    rest = max(wall_seconds - train_seconds, 0.0)
    return (f"{steps} steps in {duration(train_seconds)} of training (+{duration(rest)} loading data, compiling, "
            f"final evaluation and checkpoint; {duration(wall_seconds)} wall)")


class LineProgress:
    """The part of tqdm's interface the trainer and launcher use, written as plain lines.

    A line looks like ``L2-d64-s0: 120/300 steps (40%), 8.1 steps/s, about 22 s left, loss=2.31``,
    the last one ``... 300/300 steps (100%), 8.1 steps/s, 300 steps in 37 s {clock}, loss=2.29``.
    The rate, time left and time taken count from creation (``start_t``, as tqdm names it).
    With ``leave=False`` (a bar shown only while compiling) it prints nothing.
    """

    def __init__(self, *, total: int, desc: str, unit: str, file, initial: int = 0, leave: bool = True,
                 interval: float = 30.0, clock: str = ""):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.n = self._start = initial
        self.leave, self.interval, self.clock = leave, interval, clock
        self.postfix = ""
        self.start_t = time.monotonic()
        self._printed_at, self._printed_n = self.start_t, initial
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.leave and now - self._printed_at >= self.interval:
            self._print(now)

    def set_postfix(self, values: dict | None = None, refresh: bool = True, **kwargs) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in {**(values or {}), **kwargs}.items())

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        if not self._closed and self.leave and self.n != self._printed_n:
            self._print(time.monotonic())
        self._closed = True

    def _print(self, now: float) -> None:
        elapsed = now - self.start_t
        done = self.n - self._start
        parts = [f"{self.n}/{self.total} {self.unit}s" + (f" ({self.n / self.total:.0%})" if self.total else "")]
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            parts.append(f"{rate:.3g} {self.unit}s/s" if rate >= 1 else f"{duration(1 / rate)} per {self.unit}")
            if self.total and self.n < self.total:
                parts.append(f"about {duration((self.total - self.n) / rate)} left")
            else:  # the count of this display's units: a resumed run's first ones were done before
                parts.append(f"{done} {self.unit}{'s' if done != 1 else ''} in {duration(elapsed)}"
                             + (f" {self.clock}" if self.clock else ""))
        if self.postfix:
            parts.append(self.postfix)
        print(f"{self.desc}: " + ", ".join(parts), file=self.file, flush=True)
        self._printed_at, self._printed_n = now, self.n
