"""The committed results stay reproducible: each table in results/ is what its command prints today.

The commands are the ones the results' READMEs give, run from the repository
root on the committed run records, so a change in the analysis that would
alter a published number fails here first.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def analysis(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "analysis", *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("table, args", [
    ("table.csv", ("--format", "csv")),
    ("table.md", ()),
])
def test_log_length_tables_are_what_the_command_prints(table, args):
    committed = (ROOT / "results" / "log_length" / table).read_text()
    assert analysis("log-length", "results/log_length", *args) == committed
