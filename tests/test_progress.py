"""scaling.progress: a terminal gets tqdm, anything else plain lines at most every `interval` seconds."""

import io

from scaling import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_file_gets_plain_lines_and_a_terminal_gets_tqdm():
    assert isinstance(progress.bar(total=3, desc="x", unit="step", file=io.StringIO()), progress.LineProgress)
    terminal = progress.bar(total=3, desc="x", unit="step", file=Terminal())
    from tqdm import tqdm

    assert isinstance(terminal, tqdm)
    terminal.close()


def test_lines_are_periodic_plain_and_end_with_a_summary(monkeypatch):
    clock = iter(range(0, 10_000, 10))  # each reading of the clock is 10 s after the previous
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = progress.bar(total=100, desc="L2-d64-s0", unit="step", file=out, interval=30)
    for _ in range(10):
        bar.set_postfix({"loss": "2.31"}, refresh=False)
        bar.update(10)
    bar.close()
    bar.close()  # twice is harmless
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 5  # 100 s of updates, one line per 30 s, and the final one
    assert all(line.startswith("L2-d64-s0: ") and "loss=2.31" in line for line in lines)
    assert "left" in lines[0] and lines[-1].startswith("L2-d64-s0: 100/100 steps (100%)") and " in " in lines[-1]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_hidden_displays_print_nothing():
    out = io.StringIO()
    for bar in (progress.bar(total=5, desc="compile", unit="step", file=out, leave=False),
                progress.bar(total=5, desc="off", unit="run", file=Terminal(), shown=False)):
        bar.set_postfix_str("compiling")
        bar.update(5)
        bar.close()
    assert out.getvalue() == ""


def test_durations_read_naturally():
    assert progress.duration(42) == "42 s" and progress.duration(210) == "3.5 min" and progress.duration(7560) == "2.1 h"


def test_the_last_line_says_what_its_time_counts(monkeypatch):
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    # a run resumed at step 40: this display trains 60 steps
    bar = progress.bar(total=100, desc="L2-d64-s0", unit="step", file=out, initial=40, interval=1000,
                       clock="of training (compiling excluded)")
    bar.update(60)
    bar.close()
    # the clock is read at creation, update and close: 20 s
    assert out.getvalue().splitlines()[-1] == ("L2-d64-s0: 100/100 steps (100%), 3 steps/s, 60 steps in 20 s of "
                                               "training (compiling excluded)")


def test_a_run_time_says_which_time_is_which():
    assert progress.run_time(500, 19.2, 60.4) == ("500 steps in 19 s of training (+41 s loading data, compiling, "
                                                  "final evaluation and checkpoint; 60 s wall)")
    assert progress.run_time(500, None, 96.0) == "500 steps in 1.6 min wall"  # a record from before train_seconds
    assert progress.run_time(0, None, None) == "0 steps"
