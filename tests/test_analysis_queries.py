"""`python -m analysis`: several budgets in one answer, far extrapolations, a narrow Table 1, `plot --out FILE`."""

import json

import pytest

import helpers
from analysis.__main__ import main


def run_cli(*args):
    return helpers.run_module("analysis", *args, timeout=120)


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


def table_rows(text):
    """The cells of a markdown table in ``text``, as dicts keyed by the header (separator row skipped)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


@pytest.mark.parametrize("form", [["--params", "125M", "350M", "1.3B"],
                                  ["--params", "125M", "--params", "350M", "--params", "1.3B"]])
def test_optimal_answers_every_budget_in_one_table(capsys, form):
    # `--params 125M --params 350M` answered only 350M; `--params 125M 350M` was refused.
    assert main(["optimal", *form]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [row["budget N"] for row in rows] == ["1.25e+08", "3.5e+08", "1.3e+09"]
    assert out.count("budget N") == 1  # one table, one header
    for row, budget in zip(rows, ("125M", "350M", "1.3B")):
        assert main(["optimal", "--params", budget, "--json"]) == 0
        alone = json.loads(capsys.readouterr().out)  # one budget: the object it always was
        assert row["optimal L"] == str(alone["depth"]) and row["optimal d"] == f"{alone['width']:,.0f}"
        assert row["d rounded"] == f"{alone['width_rounded']:,}" and row["fit range"] == alone["fit_range"]
    assert main(["optimal", *form, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [shape["params"] for shape in listed] == [125e6, 350e6, 1.3e9]
    assert [shape["depth"] for shape in listed] == [int(row["optimal L"]) for row in rows]


@pytest.mark.parametrize("command", [["optimal", "--params"], ["optimal", "--params", "125M"], ["table", "--params"]])
@pytest.mark.parametrize("value", ["-1e9", "-5", "0", "-2.5B"])
def test_a_budget_that_is_not_positive_is_one_line_naming_it(command, value):
    result = run_cli(*command, value)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "must be positive" in lines[0] and repr(value) in lines[0], lines
    assert "expected one argument" not in lines[0]


def test_a_budget_far_outside_the_fit_warns_on_stderr_and_in_the_table():
    from analysis import projection

    paper = projection.FIT_PRESETS["levine2020"]
    far = run_cli("optimal", "--params", "1e30", "--json")
    assert far.returncode == 0
    shape = json.loads(far.stdout)
    deepest = paper.depth_range[1]
    assert shape["fit_range"] == "far outside" and shape["depth_continuous"] > projection.FAR_FACTOR * deepest
    (warning,) = far.stderr.strip().splitlines()
    assert warning.startswith("warning: extrapolated far outside the fit")
    assert f"{shape['depth_continuous'] / deepest:.3g} times the deepest" in warning
    assert f"beyond {projection.FAR_FACTOR:g} times" in warning
    # The paper's own projection (175B at 80 layers) is an extrapolation, but not a far one.
    near = run_cli("optimal", "--params", "175e9", "--json")
    assert json.loads(near.stdout)["fit_range"] == "outside" and "far" not in near.stderr
    assert near.stderr.startswith("warning: extrapolated: depth 80")
    # Several budgets: the warning names its budget, the table says it too.
    several = run_cli("optimal", "--params", "125M", "1e30")
    assert [row["fit range"] for row in table_rows(several.stdout)] == ["inside", "far outside"]
    assert several.stderr.strip().splitlines() == [warning.replace("warning: ", "warning: N=1e+30: ")]
    table = run_cli("table", "--params", "125M", "1e30")
    assert table.returncode == 0 and "warning: 1e+30 budget: extrapolated far outside" in table.stderr
    assert "125M" not in table.stderr


def test_fit_range_tiers():
    from analysis import projection
    from analysis.fit import LogWidthFit

    paper = projection.FIT_PRESETS["levine2020"]  # depths 6 to 36
    assert projection.fit_range(20, paper) == "inside" and projection.fit_range(36.4, paper) == "inside"
    assert projection.fit_range(80, paper) == "outside" and projection.fit_range(3, paper) == "outside"
    assert projection.fit_range(109, paper) == "far outside" and projection.fit_range(1.9, paper) == "far outside"
    assert projection.extrapolation_warning(109, paper).startswith("extrapolated far outside")
    unknown = LogWidthFit(a=5.0, b=0.05, cov=paper.cov, name="mine")
    assert projection.fit_range(1000, unknown) == "unknown" and projection.extrapolation_warning(1000, unknown) is None


@pytest.mark.parametrize("args", [["table", "--preset", "gpt3"], ["table", "--preset", "gpt3", "--explain"],
                                  ["table", "--preset", "gpt2"], ["table", "--params", "125M", "2T", "1e30"],
                                  ["optimal", "--params", "125M", "175e9", "1e30", "1e3"]])
def test_tables_fit_a_terminal(capsys, args):
    # `table --preset gpt3` was 347 characters wide: a paragraph per row in the last column.
    from analysis import tables

    assert main(args) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= tables.MAX_WIDTH == 120


def test_the_explanation_is_behind_explain(capsys):
    assert main(["table", "--preset", "gpt3"]) == 0
    short = capsys.readouterr().out
    cells = {row["vs the paper"] for row in table_rows(short)}
    assert "same" in cells and cells <= {"same", "L: see --explain", "d: see --explain", "L, d: see --explain"}
    assert "root rounded up" not in short and "--explain says how" in short
    assert main(["table", "--preset", "gpt3", "--explain"]) == 0
    explained = capsys.readouterr().out
    assert table_rows(explained) == table_rows(short) and "the printed 38 is the root rounded up" in explained


def test_table_takes_budgets_instead_of_a_preset(capsys):
    assert main(["table", "--params", "125M", "350M", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["preset"] is None and [row["name"] for row in data["rows"]] == ["125M budget", "350M budget"]
    assert main(["optimal", "--params", "350M", "--json"]) == 0
    assert data["rows"][1]["optimal_depth"] == json.loads(capsys.readouterr().out)["depth"]
    assert main(["table", "--params", "125M"]) == 0
    text = capsys.readouterr().out
    assert "your budgets" in text and "paper L" not in text and table_rows(text)[0]["model"] == "125M budget"
    both = run_cli("table", "--preset", "gpt3", "--params", "1B")
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1 and "--params" in both.stderr
