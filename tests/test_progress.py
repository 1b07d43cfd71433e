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
