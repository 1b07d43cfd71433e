"""Both analysis notebooks execute top to bottom (nbclient, kernel python3) and show their results."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), \
        f"{name} is stored with outputs; clear them"
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    text, images = [], 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            data = output.get("data", {})
            text.append(data.get("text/plain", ""))
            images += "image/png" in data
    return "\n".join(text), images


def test_reproduce_table1_notebook():
    text, images = execute("reproduce_table1.ipynb")
    assert "GPT-3 175B" in text and "1T budget" in text
    assert "175e9 parameters: depth 80" in text
    assert "N_tr(96) = 1.16e+12" in text
    assert images >= 2


@pytest.mark.parametrize("name", ["analyze_sweep.ipynb"])
def test_analyze_sweep_notebook_on_synthetic_data(name):
    text, images = execute(name)
    assert "loaded 162 runs" in text
    assert text.count("transition width") >= 2
    assert "recovered a =" in text
    assert images >= 3
