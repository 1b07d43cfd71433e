"""Run the notebooks top to bottom and store their outputs, so they read well on a code host.

    python3 notebooks/execute.py                 # both notebooks, outputs written in place
    python3 notebooks/execute.py --check         # run them, change nothing; exit 1 if a stored one is stale

Each notebook runs in notebooks/ (as Jupyter starts it) with the python3
kernel of this environment. Cell timings are not recorded, so a rerun that
gives the same results leaves the files unchanged apart from embedded images.
tests/test_notebooks.py runs the same function on copies.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent
NAMES = ("reproduce_table1.ipynb", "analyze_sweep.ipynb")
# Printed temporary paths differ between runs; compare text without them.
_TEMPORARY = re.compile(r"/tmp\S*|/var/folders\S*")


def execute(name: str, timeout: int = 300) -> nbformat.NotebookNode:
    """The notebook ``name`` (in notebooks/) after running it, outputs included; the file is not written."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return notebook


def text_outputs(notebook) -> list[str]:
    """Per code cell, its printed and plain-text outputs, with temporary paths blanked."""
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        parts = [output.get("text", "") + output.get("data", {}).get("text/plain", "") for output in cell.outputs]
        cells.append(_TEMPORARY.sub("<tmp>", "".join(parts)))
    return cells


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 notebooks/execute.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a stored notebook's text outputs differ from a fresh run")
    args = parser.parse_args(argv)
    stale = []
    for name in NAMES:
        fresh = execute(name)
        if args.check:
            stored = nbformat.read(NOTEBOOKS / name, as_version=4)
            if text_outputs(stored) != text_outputs(fresh):
                stale.append(name)
        else:
            nbformat.write(fresh, NOTEBOOKS / name)
            print(f"wrote {name} with its outputs")
    for name in stale:
        print(f"{name}: stored outputs are stale; run python3 notebooks/execute.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
