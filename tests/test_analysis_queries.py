"""`python -m analysis`: several budgets in one answer, far extrapolations, a narrow Table 1, `plot --out FILE`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.__main__ import main

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "analysis", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_plot_out_pointing_at_a_file_is_one_line_naming_it(tmp_path, capsys, where):
    existing = tmp_path / "figures.png"
    existing.write_bytes(b"not a folder")
    out = existing if where == "file" else existing / "figures"
    # The path is checked before the sweep is read: a missing sweep is not what gets reported.
    assert main(["plot", str(tmp_path / "no-such-sweep.csv"), "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and "a file, not a directory" in lines[0]
    assert "File exists" not in lines[0] and existing.read_bytes() == b"not a folder"
