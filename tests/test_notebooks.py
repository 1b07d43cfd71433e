"""Both analysis notebooks are stored with their outputs, still run top to bottom, and show their results.

They are executed here on copies (nbclient, kernel python3, in notebooks/);
``python3 notebooks/execute.py`` rewrites the stored outputs after a change.
"""

import re
import sys

import nbformat
import pytest

from helpers import REPO

NOTEBOOKS = REPO / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import execute  # noqa: E402  (notebooks/execute.py)


def printed(notebook) -> list[str]:
    """Per code cell, what it printed (stdout), temporary paths blanked: the notebooks' own formatting."""
    return [execute._TEMPORARY.sub("<tmp>", "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout"))
            for cell in notebook.cells if cell.cell_type == "code"]


def summary(notebook):
    text, images = [], 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            data = output.get("data", {})
            text.append(data.get("text/plain", ""))
            images += "image/png" in data
    return "\n".join(text), images


def run(name):
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    fresh = execute.execute(name)
    # Stored with outputs, so the notebook reads on a code host, and not stale.
    assert summary(stored)[1] == summary(fresh)[1] > 0, f"{name}: store it with outputs (python3 notebooks/execute.py)"
    assert printed(stored) == printed(fresh), f"{name}: stored outputs are stale; run python3 notebooks/execute.py"
    return summary(fresh)


def test_reproduce_table1_notebook():
    text, images = run("reproduce_table1.ipynb")
    assert "GPT-3 175B" in text and "1T budget" in text
    assert "175e9 parameters: depth 80" in text
    assert "N_tr(96) = 1.16e+12" in text
    assert "paper_note" in text and "rounded up" in text  # Table 1's printed values, and why they differ
    assert images >= 2


@pytest.mark.parametrize("name", ["analyze_sweep.ipynb"])
def test_analyze_sweep_notebook_on_synthetic_data(name):
    text, images = run(name)
    assert "loaded 162 runs" in text
    assert text.count("transition width") >= 2
    assert "recovered a =" in text
    assert images >= 3


def test_the_example_sweep_paths_exist_from_notebooks():
    notebook = nbformat.read(NOTEBOOKS / "analyze_sweep.ipynb", as_version=4)
    line = next(cell.source for cell in notebook.cells if cell.source.startswith("SWEEP ="))
    examples = re.findall(r'"(\.\./[^"]+)"', line)
    assert examples and (NOTEBOOKS / examples[0]).exists()  # the committed results, as the kernel sees them
