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


@pytest.mark.parametrize("committed, args", [
    ("fit.txt", ()),
    ("fit.json", ("--json",)),
])
def test_cpu_depth_fit_is_what_the_command_prints(committed, args):
    # the bootstrap's seed is fixed, so the whole output, intervals included, is deterministic
    expected = (ROOT / "results" / "cpu_depth" / committed).read_text()
    assert analysis("fit", "results/cpu_depth", *args) == expected


def test_cpu_depth_main_sweep_is_complete():
    """Four depths, three sizes each, three seeds at every point: the design the README reports on."""
    from analysis.results import load_runs

    table = load_runs(ROOT / "results" / "cpu_depth")
    seeds = table.runs.groupby(["depth", "width"])["seed"].nunique()
    assert sorted(table.runs["depth"].unique()) == [2, 3, 4, 6]
    assert seeds.groupby(level="depth").size().tolist() == [3, 3, 3, 3]
    assert seeds.min() >= 3, seeds[seeds < 3]
    assert not table.skipped and (table.unfinished is None or table.unfinished.empty)
