"""`python -m analysis`: the exact commands the checks use, sweep analysis, and bad input."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import helpers
from analysis.__main__ import main
from analysis.synthetic import synthetic_runs


def record_json(name, depth, width, seed, loss, fingerprint="fp", **extra):
    """A valid finished run record (``scaling.store.records``) as JSON text."""
    from scaling.store.records import RunRecord

    return RunRecord(run_id=name, status="finished", depth=int(depth), width=int(width), seed=int(seed),
                     params_non_embedding=12 * int(depth) * int(width) ** 2, name=name,
                     point_id=f"L{depth}-d{width}-{fingerprint}", lr_rule="constant", peak_lr=1e-3, planned_steps=100,
                     final_eval_loss=float(loss), data_fingerprint=fingerprint, **extra).to_json()


def run_cli(*args):
    return helpers.run_module("analysis", *args, timeout=120)


def run_json(capsys, *args):
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_optimal_175e9_subprocess():
    result = run_cli("optimal", "--params", "175e9", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["depth"] == 80
    assert data["width"] == pytest.approx(13500, rel=0.02)
    assert data["params"] == 175e9
    assert data["depth_low"] < data["depth_continuous"] < data["depth_high"]
    assert data["n_transition"] == pytest.approx(1.65e11, rel=0.02)
    assert (data["a"], data["b"]) == (5.039, 0.0555)


def test_table_gpt3_subprocess():
    result = run_cli("table", "--preset", "gpt3", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["a"], data["b"], data["fit"]) == (5.039, 0.0555, "levine2020")
    expected = [(23, 555), (32, 886), (38, 1220), (42, 1550), (47, 2110), (54, 3150), (60, 4200), (80, 13500),
                (95, 30100)]
    assert len(data["rows"]) == 9
    for row, (depth, width) in zip(data["rows"], expected):
        assert {"name", "params", "trained_depth", "trained_width", "optimal_depth", "optimal_width"} <= set(row)
        assert abs(row["optimal_depth"] - depth) <= 1
        assert row["optimal_width"] == pytest.approx(width, rel=0.02)


# Table 1 of the paper as printed (optimal depth, width), the data the table command must show beside its own.
PRINTED_TABLE1 = {"GPT-3 Small": (23, 555), "GPT-3 Medium": (32, 886), "GPT-3 Large": (38, 1220),
                  "GPT-3 XL": (42, 1550), "GPT-3 2.7B": (47, 2110), "GPT-3 6.7B": (54, 3150),
                  "GPT-3 13B": (60, 4200), "GPT-3 175B": (80, 13500), "1T budget": (95, 30100)}


def test_table_names_the_papers_values_and_why_each_row_differs():
    result = run_cli("table", "--preset", "gpt3", "--explain")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| model"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert {"our L", "paper L", "our d", "paper d", "vs the paper"} <= set(columns)
    data = json.loads(run_cli("table", "--preset", "gpt3", "--json").stdout)
    rows = {row["name"]: row for row in data["rows"]}
    # --explain lists each row's full note under the table (wrapped: continuation lines are indented)
    explained = "\n".join(lines[lines.index("How each printed value of Table 1 arises:") + 1:]).replace("\n  ", " ")
    notes = dict(line[2:].split(": ", 1) for line in explained.splitlines())
    shown = 0
    for line in lines:
        cells = dict(zip(columns, (cell.strip() for cell in line.strip("|").split("|"))))
        if cells.get("model") not in PRINTED_TABLE1:
            continue
        shown += 1
        depth, width = PRINTED_TABLE1[cells["model"]]
        assert (cells["paper L"], cells["paper d"]) == (str(depth), f"{width:,}")
        ours = rows[cells["model"]]
        assert cells["our L"] == str(ours["optimal_depth"])
        assert cells["vs the paper"] == ours["paper_summary"]
        note = notes[cells["model"]]
        assert note == ours["paper_note"]
        if ours["optimal_depth"] != depth:  # the depth differs: the note says from which root and a, b
            assert note.startswith("L:") and f"{ours['optimal_depth_continuous']:.2f}" in note
            assert "5.039" in note and "0.0555" in note
            assert cells["vs the paper"].startswith("L")
        if float(f"{ours['optimal_width']:.2e}") != width and ours["optimal_depth"] == depth:
            assert "d:" in note, note  # the width differs at the same depth: the note says how it was rounded
            assert cells["vs the paper"] == "d: see --explain"
        if "same;" in note:
            assert ours["optimal_depth"] == depth and float(f"{ours['optimal_width']:.2e}") == width
            assert cells["vs the paper"] == "same"
    assert shown == len(PRINTED_TABLE1) and len(notes) == len(PRINTED_TABLE1)
    assert any(rows[name]["paper_depth_difference"] != 0 for name in rows)  # the Large row, root 37.4


def test_table_with_another_fit_shows_no_paper_columns(tmp_path):
    fit = tmp_path / "mine.json"
    fit.write_text(json.dumps({"a": 5.2, "b": 0.05, "cov": [[1e-3, 0], [0, 1e-6]]}))
    result = run_cli("table", "--preset", "gpt3", "--fit", str(fit))
    assert result.returncode == 0 and "paper L" not in result.stdout and "--fit levine2020" in result.stdout


def test_transition_size_96_subprocess():
    result = run_cli("transition-size", "--depth", "96", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["n_transition"] == pytest.approx(1.17e12, rel=0.02)
    assert data["delta_n"] == pytest.approx(0.23e12, abs=0.02e12)


def test_table_text_formats_name_the_fit(capsys):
    assert main(["table", "--preset", "gpt3"]) == 0
    markdown = capsys.readouterr().out
    assert "a = 5.039" in markdown and "b = 0.0555" in markdown and markdown.count("| GPT-3") == 8
    assert main(["table", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 10 and lines[0].endswith("fit,a,b") and lines[1].endswith("levine2020,5.039,0.0555")


@pytest.mark.parametrize("text, depth", [("1.3B", 42), ("1.3e9", 42), ("800M", 39)])
def test_optimal_accepts_suffixes(capsys, text, depth):
    data = run_json(capsys, "optimal", "--params", text, "--json")
    assert data["depth"] == depth


def test_transition_size_several_depths(capsys):
    rows = run_json(capsys, "transition-size", "--depth", "80", "96", "100", "--json")
    assert [row["depth"] for row in rows] == [80, 96, 100]
    assert rows[2]["relative_error"] == pytest.approx(0.20, abs=0.01)


@pytest.fixture
def sweep_csv(tmp_path):
    path = tmp_path / "sweep.csv"
    synthetic_runs(depths=(2, 4, 6, 8), a=3.0, b=0.25, seeds=3, noise=0.002, rng=3).to_csv(path, index=False)
    return path


def test_fit_save_and_reuse(capsys, sweep_csv, tmp_path):
    saved = tmp_path / "fit.json"
    data = run_json(capsys, "fit", str(sweep_csv), "--json", "--save", str(saved), "--bootstrap", "100")
    assert data["runs"] == len(synthetic_runs(depths=(2, 4, 6, 8), seeds=3))
    assert [t["status"] for t in data["transitions"]] == ["found"] * 3
    assert data["fit"]["n_points"] == 3 and data["fit"]["chi2_red"] is not None
    stored = json.loads(saved.read_text())
    assert stored["a"] == data["fit"]["a"] and len(stored["cov"]) == 2
    shape = run_json(capsys, "optimal", "--params", "1e6", "--fit", str(saved), "--json")
    assert shape["a"] == stored["a"] and 2 < shape["depth"] < 20


def test_fit_text_output(capsys, sweep_csv):
    assert main(["fit", str(sweep_csv), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "transition width" in out and "R² =" in out and "pooled two-sample t-test" in out


def test_fit_with_too_few_transitions_says_so(capsys, tmp_path):
    runs = synthetic_runs(depths=(2, 4), seeds=3, rng=4)
    runs.to_csv(tmp_path / "two.csv", index=False)
    assert main(["fit", str(tmp_path / "two.csv"), "--bootstrap", "20"]) == 0
    out = capsys.readouterr().out
    assert "not enough points" in out and "need 2 or more" in out


def test_plot_writes_png_and_pdf(capsys, sweep_csv, tmp_path):
    out_dir = tmp_path / "figures"
    data = run_json(capsys, "plot", str(sweep_csv), "--out", str(out_dir), "--json", "--bootstrap", "50")
    names = {Path(p).name for p in data["figures"]}
    for stem in ("pair_L2_L4", "pair_L6_L8", "pair_differences", "width_fit", "transition_size", "projection",
                 "threshold"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
        assert (out_dir / f"{stem}.png").stat().st_size > 10_000
        assert (out_dir / f"{stem}.pdf").read_bytes().startswith(b"%PDF")


def test_plot_does_not_overwrite_another_sweeps_figures(capsys, sweep_csv, tmp_path):
    out_dir = tmp_path / "figures"
    run_json(capsys, "plot", str(sweep_csv), "--out", str(out_dir), "--json", "--bootstrap", "20")
    other = tmp_path / "other.csv"
    other.write_bytes(Path(sweep_csv).read_bytes())
    assert main(["plot", str(other), "--out", str(out_dir), "--bootstrap", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds the figures of" in err and str(sweep_csv) in err
    run_json(capsys, "plot", str(sweep_csv), "--out", str(out_dir), "--json", "--bootstrap", "20")  # its own: redrawn


def test_fit_from_a_sweep_directory(tmp_path, capsys):
    runs = synthetic_runs(depths=(2, 4, 6), seeds=2, rng=5)
    for index, row in runs.iterrows():
        run = tmp_path / "sweep" / f"run{index}"
        run.mkdir(parents=True)
        (run / "result.json").write_text(record_json(f"L{row.depth}-d{row.width}-s{row.seed}", row.depth, row.width,
                                                     row.seed, row.loss))
    data = run_json(capsys, "fit", str(tmp_path / "sweep"), "--json", "--bootstrap", "20")
    assert data["runs"] == len(runs) and data["fingerprint"] == "fp" and data["skipped"] == {}
    assert len(data["transitions"]) == 2 and data["fit"] is not None


BAD_INPUTS = {
    "empty file": ("", "empty"),
    "missing columns": ("depth,width,loss\n2,32,3.0\n", "missing column"),
    "single depth": ("depth,width,params,seed,loss\n2,32,24576,0,3.0\n2,64,98304,0,2.9\n", "only depth 2"),
    "NaN losses": ("depth,width,params,seed,loss\n2,32,24576,0,NaN\n4,32,49152,0,3.0\n", "NaN"),
}


@pytest.mark.parametrize("command", ["fit", "plot"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_line_and_exit_2(tmp_path, capsys, command, case):
    content, phrase = BAD_INPUTS[case]
    path = tmp_path / "runs.csv"
    path.write_text(content)
    extra = ["--out", str(tmp_path / "f")] if command == "plot" else []
    assert main([command, str(path), *extra]) == 2  # an unexpected exception would fail here
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0] and "runs.csv" in lines[0]


def test_bad_input_subprocess_has_no_traceback(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(BAD_INPUTS["NaN losses"][0])
    result = run_cli("fit", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_mixed_data_fingerprints_exit_2(tmp_path, capsys):
    for index, fingerprint in enumerate(("fp-one", "fp-two")):
        run = tmp_path / f"run{index}"
        run.mkdir()
        (run / "result.json").write_text(record_json(f"run{index}", 2 + 2 * index, 32, 0, 3.0, fingerprint))
    assert main(["fit", str(tmp_path)]) == 2
    assert "--fingerprint" in capsys.readouterr().err


def test_nonexistent_path_and_bad_fit_file(tmp_path, capsys):
    assert main(["fit", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["optimal", "--params", "1e9", "--fit", str(tmp_path / "nofit.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nofit.json" in err[0]


def test_bad_argument_is_one_line():
    result = run_cli("optimal", "--params", "lots")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'lots'" in lines[0]


def test_plot_draws_loss_curves_for_a_single_seed_sweep(tmp_path):
    """One seed per point gives no transitions, but the loss curves are still drawn."""
    rows = ["depth,width,params,seed,loss"]
    for depth, widths in ((1, (48, 64, 128)), (2, (32, 48, 96))):
        for width in widths:
            rows.append(f"{depth},{width},{12 * depth * width**2},0,{2.5 - 0.001 * width + 0.1 * depth}")
    source = tmp_path / "single_seed.csv"
    source.write_text("\n".join(rows) + "\n")
    out = helpers.run_module("analysis", "plot", source, "--out", tmp_path / "figs")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "figs" / "loss_vs_size.png").stat().st_size > 1000
    assert "single seed" in out.stdout


def test_transition_size_overflow_is_strict_json(capsys):
    result = run_cli("transition-size", "--depth", "1e6", "--json")
    assert result.returncode == 0, result.stderr
    assert "Infinity" not in result.stdout and "inf" not in result.stdout.replace("info", "")
    data = json.loads(result.stdout)  # Python's reader accepts Infinity; the check above keeps it strict
    assert data["n_transition"] is None and "exceeds the largest floating-point number" in data["note"]


@pytest.mark.parametrize("budget", ["1e3", "1e15"])
def test_optimal_warns_when_extrapolating_and_rounds_the_width(budget):
    result = run_cli("optimal", "--params", budget, "--json")
    assert result.returncode == 0, result.stderr
    warning = result.stderr.strip().splitlines()
    assert warning[0].startswith("warning: extrapolated") and "L = 6 to 36" in warning[0]
    data = json.loads(result.stdout)
    assert data["warning"] == warning[0][len("warning: "):]
    # Only the tiny budget's width rounds so far that the shape misses the budget (next test).
    assert len(warning) == (2 if data["budget_warning"] else 1)
    assert data["width_rounded"] % data["head_size"] == 0 and data["width_rounded"] >= data["head_size"]
    assert abs(data["width_rounded"] - data["width"]) <= data["head_size"] / 2 or data["width"] < data["head_size"]


def test_optimal_warns_when_the_rounded_width_misses_the_budget():
    # 1e3 parameters: the width sqrt(1e3/12) ≈ 9 channels rounds up to one 64-channel head.
    result = run_cli("optimal", "--params", "1e3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    ratio = 12 * data["depth"] * data["width_rounded"] ** 2 / data["params"]
    assert ratio > 10
    assert f"warning: {data['budget_warning']}" in result.stderr.splitlines()
    assert f"{ratio:.3g} times the budget" in data["budget_warning"] and "--head-size" in data["budget_warning"]
    text = run_cli("optimal", "--params", "1e3")
    assert text.returncode == 0 and f"{ratio:.3g} times the budget" in text.stderr
    # A finer head size keeps the same tiny budget within 10%: no warning.
    fine = json.loads(run_cli("optimal", "--params", "1e3", "--head-size", "1", "--json").stdout)
    assert fine["budget_warning"] is None


@pytest.mark.parametrize("budget", ["-5", "0", "-0.5", "=-2e9"])
def test_optimal_says_a_budget_must_be_positive(budget):
    # argparse takes "-2e9" for an option; "--params=-2e9" is how a shell user passes it.
    result = run_cli("optimal", f"--params{budget}" if budget.startswith("=") else "--params",
                     *([] if budget.startswith("=") else [budget]))
    assert result.returncode == 2 and result.stdout == ""
    assert "must be positive" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_optimal_inside_the_fitted_depths_has_no_warning():
    result = run_cli("optimal", "--params", "3e8", "--json", "--head-size", "128")
    assert result.returncode == 0 and result.stderr == ""
    data = json.loads(result.stdout)
    assert data["warning"] is None and data["head_size"] == 128 and data["width_rounded"] % 128 == 0


def test_fit_save_with_nothing_to_save_exits_non_zero(tmp_path):
    # One depth pair with no transition in range: the analysis runs, but there is no fit to keep.
    flat = synthetic_runs(depths=(2, 4), a=9.0, b=0.1, seeds=3, noise=0.003, rng=0)
    csv_path = tmp_path / "flat.csv"
    flat.to_csv(csv_path, index=False)
    saved = tmp_path / "fit.json"
    result = run_cli("fit", str(csv_path), "--save", str(saved), "--bootstrap", "50")
    assert result.returncode == 1, result.stderr
    assert not saved.exists()
    assert f"nothing saved to {saved}" in result.stderr
    chained = helpers.run(["bash", "-c", f"{sys.executable} -m analysis fit {csv_path} --save {saved} "
                           f"--bootstrap 50 >/dev/null && echo reached"])
    assert "reached" not in chained.stdout


def test_synthetic_sweep_gives_back_the_planted_fit(tmp_path):
    out = tmp_path / "sweep.csv"
    result = run_cli("synthetic", "--out", str(out), "--depths", "6", "12", "18", "--seed", "1")
    assert result.returncode == 0, result.stderr
    saved = tmp_path / "fit.json"
    assert run_cli("fit", str(out), "--save", str(saved), "--bootstrap", "50").returncode == 0
    fit = json.loads(saved.read_text())
    assert abs(fit["b"] - 0.0555) < 4 * fit["sigma_b"] and abs(fit["a"] - 5.039) < 4 * fit["sigma_a"]
    bad = run_cli("synthetic", "--out", str(out), "--depths", "6")
    assert bad.returncode == 2 and "2 or more distinct depths" in bad.stderr


def test_fit_json_carries_both_estimates(capsys, sweep_csv):
    data = run_json(capsys, "fit", str(sweep_csv), "--json", "--bootstrap", "100")
    assert set(data["fits"]) == {"crossing", "paper"} and all(data["fits"].values())
    assert data["estimate"] == "crossing" and data["fit"] == data["fits"]["crossing"]
    for transition in data["transitions"]:
        assert transition["crossing_width"] and len(transition["crossing_ci"]) == 2
        assert transition["width"] and len(transition["paper_ci"]) == 2
        assert transition["noise"]["source"].startswith("pooled over the seeds of L=")
    paper = run_json(capsys, "fit", str(sweep_csv), "--json", "--bootstrap", "100", "--estimate", "paper")
    assert paper["fit"] == paper["fits"]["paper"]


def test_figures_say_whose_data_they_show():
    from analysis import plots, projection
    from analysis.fit import LogWidthFit

    paper = projection.FIT_PRESETS["levine2020"]
    ax = plots.plot_transition_size(paper, budgets=projection.BUDGET_PRESETS["gpt3"])
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "GPT-3's trained shapes (paper's Table 1)" in labels
    assert any("levine2020 (the paper's eq. 10)" in label for label in labels)
    # A loose fit whose first-order ΔN exceeds N_tr: the band's lower edge stays on the log axis.
    loose = LogWidthFit(a=3.0, b=0.25, cov=((0.05, -0.01), (-0.01, 0.004)), name="mine")
    ax = plots.plot_transition_size(loose)
    band = ax.collections[0].get_paths()[0].vertices
    assert np.all(band[:, 1] > 0) and band[:, 1].min() > ax.get_ylim()[0]
    assert any("mine (your runs)" in t.get_text() for t in ax.get_legend().get_texts())
    # the measured points say which estimate they are; the zero crossing is no significance test
    from planted import planted_pair_runs
    from analysis.transition import find_transitions

    transitions, _ = find_transitions(planted_pair_runs(2, 4, 3e6, np.random.default_rng(0)), n_bootstrap=20)
    for estimate, words in [("crossing", "zero crossing of a line fitted to the loss difference (not a significance test)"),
                            ("paper", "the paper's significance rule")]:
        ax = plots.plot_transition_size(paper, transitions=transitions, estimate=estimate)
        assert any(words in t.get_text() for t in ax.get_legend().get_texts()), estimate
