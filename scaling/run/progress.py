"""Progress display: a tqdm bar on a terminal, tqdm-loggable's periodic lines anywhere else.

A bar redraws itself with carriage returns and, when nested (the sweep's bar
over each run's), cursor-movement escape codes. In a log file (every pod
worker's, ``nohup``, ``... 2> log``, CI) that is line noise, so when the stream
is not a terminal ``bar`` returns tqdm-loggable's bar instead: it logs one
line every ``interval`` seconds and one when closed, which this module writes
to stderr as plain text (``L2-d64-s0: 120/300 steps (40%), 8.1 steps/s, about
22 s left, loss=2.31``). Its records keep tqdm-loggable's structured fields, so
a log collector attached to its logger gets them too.
"""

from __future__ import annotations

import datetime
import logging
import sys

from tqdm_loggable import tqdm_logging as loggable


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal that a bar fits on (False for files, pipes, closed
    streams, and a terminal that reports a width of 0 columns, as some serial consoles and CI runners
    do: tqdm would draw nothing there, so such a terminal gets the plain lines of a log file)."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    import os

    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):
        return True  # a terminal whose size cannot be read: tqdm falls back to its own width


def bar(*, total: int, desc: str, unit: str, file=None, initial: int = 0, leave: bool = True,
        interval: float = 30.0, shown: bool = True, clock: str = "", **tqdm_options):
    """A progress display of ``total`` ``unit``s: tqdm on a terminal, else tqdm-loggable's lines on stderr.

    ``interval`` (seconds) spaces the lines; ``shown=False`` gives a display
    that prints nothing, as does ``leave=False`` off a terminal (a bar shown
    only while compiling); ``clock`` says in the last line what its elapsed
    time counts (e.g. "of training (compiling excluded)"); ``tqdm_options`` go to tqdm.
    Off a terminal ``file`` only decides that: the lines go to stderr, with tqdm's smoothed rate.
    """
    file = sys.stderr if file is None else file
    if is_terminal(file):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, initial=initial, leave=leave,
                    disable=not shown, **tqdm_options)
    _write_lines_to_stderr()
    return LogLines(total=total, desc=desc, unit=unit, file=file, initial=initial, leave=leave,
                    disable=not shown, interval=interval, clock=clock, **tqdm_options)


class LogLines(loggable.tqdm_logging):
    """tqdm-loggable's bar with its own ``interval`` (seconds between lines; the library has one for all
    bars, and a sweep's bar wants a line per run while a run's wants one every 30 s) and a last line
    that says what its time counts (``clock``)."""

    def __init__(self, *args, interval: float = 30.0, clock: str = "", **kwargs):
        self.log_message_rate = datetime.timedelta(seconds=interval)
        self.clock = clock
        self.logged_n = None  # the count the last line showed
        super().__init__(*args, **kwargs)

    def display(self, **kwargs) -> None:
        if not self.leave:  # a bar shown only for a while (while compiling) leaves no lines in a log
            return
        logged_at = self.last_log_message_at
        super().display(**kwargs)
        if self.last_log_message_at != logged_at:  # not held back by the interval
            self.logged_n = self.n

    def close(self) -> None:
        if self.n == self.logged_n:  # the last line is already out (a sweep's bar logs every run)
            self.disable = True
        if self.clock and not self.disable:
            self.postfix = ", ".join(filter(None, (self.postfix, f"time {self.clock}")))
        super().close()


def line(record: logging.LogRecord) -> str:
    """tqdm-loggable's structured record as one plain line (times in words, ``duration``)."""
    n, total, unit, rate = record.n, record.total, record.unit, record.rate
    parts = [f"{n}/{total} {unit}s" + (f" ({n / total:.0%})" if total else "")]
    if rate:
        parts.append(f"{rate:.3g} {unit}s/s" if rate >= 1 else f"{duration(1 / rate)} per {unit}")
    if rate and total and n < total:
        parts.append(f"about {duration(record.remaining)} left")
    else:
        parts.append(f"{duration(record.elapsed)} elapsed")
    if record.postfix and record.postfix != "-":  # tqdm-loggable's "none"
        parts.append(record.postfix)
    return f"{record.progress_name}: " + ", ".join(parts)


class _LineHandler(logging.Handler):
    """Writes tqdm-loggable's records to the current ``sys.stderr`` (looked up per line, so a redirected
    or captured stderr gets them) as ``line`` formats them."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(line(record) if getattr(record, "tqdm", False) else record.getMessage(), file=sys.stderr,
                  flush=True)
        except Exception:  # noqa: BLE001 - logging's rule: a display never stops the program
            self.handleError(record)


def _write_lines_to_stderr() -> None:
    """Once per process: tqdm-loggable's logger writes its lines to stderr (it logs at INFO, which an
    unconfigured logging drops), and not again through the root logger's handlers."""
    logger = logging.getLogger(loggable.__name__)
    if not any(isinstance(handler, _LineHandler) for handler in logger.handlers):
        logger.addHandler(_LineHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False


def duration(seconds: float) -> str:
    """A rough human duration: '42 s', '3.5 min', '2.1 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def run_time(steps: int, train_seconds: float | None, wall_seconds: float | None) -> str:
    """A run's time in words, saying what each number counts (``scaling.store.records.RunRecord``'s two measures):

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
