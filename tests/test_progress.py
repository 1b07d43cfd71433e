"""scaling.run.progress: a terminal gets tqdm, anything else tqdm-loggable's plain lines at most every `interval` seconds."""

import datetime
import io

import pytest
import tqdm.std
from tqdm_loggable import tqdm_logging as loggable

from scaling.run import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def clock(monkeypatch):
    """A clock for tqdm's rates and tqdm-loggable's interval that moves only when told (seconds)."""
    now = [0.0]
    epoch = datetime.datetime(2025, 1, 1)

    class Datetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return epoch + datetime.timedelta(seconds=now[0])

    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    monkeypatch.setattr(loggable, "datetime", Datetime)
    monkeypatch.setattr(tqdm.std.tqdm, "monitor_interval", 0)  # no thread refreshing bars on the real clock
    return now


def test_a_file_gets_loggable_lines_and_a_terminal_gets_tqdm():
    lines = progress.bar(total=3, desc="x", unit="step", file=io.StringIO())
    assert isinstance(lines, loggable.tqdm_logging)
    lines.close()
    terminal = progress.bar(total=3, desc="x", unit="step", file=Terminal())
    assert isinstance(terminal, tqdm.std.tqdm) and not isinstance(terminal, loggable.tqdm_logging)
    terminal.close()


def test_lines_are_periodic_plain_and_end_with_a_summary(clock, capsys):
    out = io.StringIO()  # not a terminal: the lines go to stderr, none of tqdm's redrawing to the stream
    bar = progress.bar(total=100, desc="L2-d64-s0", unit="step", file=out, interval=30)
    for _ in range(10):
        clock[0] += 10
        bar.set_postfix({"loss": "2.31"}, refresh=False)
        bar.update(10)
    bar.close()
    bar.close()  # twice is harmless
    lines = capsys.readouterr().err.splitlines()
    # 100 s of updates: one line at the start, one per 30 s after it, and the final one
    assert len(lines) == 4, lines
    assert all(line.startswith("L2-d64-s0: ") for line in lines)
    assert lines[0] == "L2-d64-s0: 0/100 steps (0%), 0 s elapsed"
    assert lines[1] == "L2-d64-s0: 40/100 steps (40%), 1 steps/s, about 60 s left, loss=2.31"
    assert lines[-1] == "L2-d64-s0: 100/100 steps (100%), 1 steps/s, 1.7 min elapsed, loss=2.31"
    assert out.getvalue() == ""


def test_a_line_per_update_at_interval_zero_and_no_repeated_last_line(clock, capsys):
    bar = progress.bar(total=2, desc="sweep s", unit="run", file=io.StringIO(), interval=0)
    for _ in range(2):
        clock[0] += 60
        bar.update(1)
    bar.close()
    assert capsys.readouterr().err.splitlines() == [
        "sweep s: 0/2 runs (0%), 0 s elapsed", "sweep s: 1/2 runs (50%), 60 s per run, about 60 s left",
        "sweep s: 2/2 runs (100%), 60 s per run, 2.0 min elapsed"]


def test_hidden_displays_print_nothing(capsys):
    out = io.StringIO()
    for bar in (progress.bar(total=5, desc="compile", unit="step", file=out, leave=False),
                progress.bar(total=5, desc="off", unit="run", file=Terminal(), shown=False),
                progress.bar(total=5, desc="off", unit="run", file=out, shown=False)):
        bar.set_postfix_str("compiling")
        bar.update(5)
        bar.close()
    assert out.getvalue() == "" and capsys.readouterr().err == ""


def test_durations_read_naturally():
    assert progress.duration(42) == "42 s" and progress.duration(210) == "3.5 min" and progress.duration(7560) == "2.1 h"


def test_the_last_line_says_what_its_time_counts(clock, capsys):
    # a run resumed at step 40: this display trains 60 steps
    bar = progress.bar(total=100, desc="L2-d64-s0", unit="step", file=io.StringIO(), initial=40, interval=1000,
                       clock="of training (compiling excluded)")
    clock[0] += 20
    bar.update(60)
    bar.close()
    assert capsys.readouterr().err.splitlines()[-1] == (
        "L2-d64-s0: 100/100 steps (100%), 3 steps/s, 20 s elapsed, time of training (compiling excluded)")


def test_a_run_time_says_which_time_is_which():
    assert progress.run_time(500, 19.2, 60.4) == ("500 steps in 19 s of training (+41 s loading data, compiling, "
                                                  "final evaluation and checkpoint; 60 s wall)")
    assert progress.run_time(500, None, 96.0) == "500 steps in 1.6 min wall"  # a record from before train_seconds
    assert progress.run_time(0, None, None) == "0 steps"


def test_a_terminal_of_zero_columns_gets_plain_lines():
    import fcntl
    import os
    import pty
    import struct
    import termios

    from scaling.run.progress import is_terminal

    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as stream:
            for columns, expected in ((0, False), (80, True)):
                fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
                assert is_terminal(stream) is expected
    finally:
        os.close(leader)
        os.close(follower)
