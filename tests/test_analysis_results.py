"""Loading sweep records and CSVs into one table, and aggregating over seeds."""

import json

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisInputError
from analysis.points import aggregate_seeds, pooled_seed_std
from analysis.results import load_runs, require_depths


def write_record(root, name, depth, width, seed, loss, status="finished", fingerprint="fp-aaa"):
    run = root / "sweep" / name
    run.mkdir(parents=True)
    record = {"status": status, "name": name, "run_id": name, "sweep": "sweep", "depth": depth,
              "width": width, "params_non_embedding": 12 * depth * width ** 2, "schema_version": 2,
              "point_id": f"L{depth}-d{width}-{fingerprint}", "lr_rule": "constant", "peak_lr": 1e-3,
              "planned_steps": 10,
              "params_total": 12 * depth * width ** 2 + 1000, "seed": seed,
              "final_eval_loss": loss, "tokens": 1000, "steps": 10, "wall_seconds": 1.0,
              "code_version": "abc", "data_fingerprint": fingerprint}
    (run / "result.json").write_text(json.dumps(record))


@pytest.fixture
def sweep_dir(tmp_path):
    for depth in (2, 4):
        for width in (32, 64):
            for seed in (0, 1):
                write_record(tmp_path, f"L{depth}-d{width}-s{seed}", depth, width, seed,
                             3.0 - 0.1 * depth - 0.001 * width + 0.01 * seed)
    write_record(tmp_path, "L4-d128-s0", 4, 128, 0, None, status="diverged")
    write_record(tmp_path, "L4-d128-s1", 4, 128, 1, None, status="failed")
    return tmp_path


def test_sweep_dir_keeps_finished_runs_and_counts_the_rest(sweep_dir):
    table = load_runs(sweep_dir)
    assert len(table.runs) == 8
    assert table.skipped == {"diverged": 1, "failed": 1}
    assert table.fingerprint == "fp-aaa"
    np.testing.assert_array_equal(table.runs["params"], 12 * table.runs["depth"] * table.runs["width"] ** 2)
    assert "skipped 2 (1 diverged, 1 failed)" in table.describe()


def test_mixed_fingerprints_are_refused_unless_one_is_chosen(sweep_dir):
    write_record(sweep_dir, "L2-d32-s9", 2, 32, 9, 2.5, fingerprint="fp-bbb")
    with pytest.raises(AnalysisInputError, match="different data"):
        load_runs(sweep_dir)
    table = load_runs(sweep_dir, fingerprint="fp-b")
    assert len(table.runs) == 1 and table.fingerprint == "fp-bbb"
    assert table.skipped["other data_fingerprint"] == 8
    with pytest.raises(AnalysisInputError, match="ambiguous"):
        load_runs(sweep_dir, fingerprint="fp-")


def test_directory_without_records(tmp_path):
    with pytest.raises(AnalysisInputError, match="no result.json"):
        load_runs(tmp_path)


def test_directory_with_only_failed_runs(tmp_path):
    write_record(tmp_path, "a", 2, 32, 0, None, status="diverged")
    with pytest.raises(AnalysisInputError, match="no finished runs"):
        load_runs(tmp_path)


def test_csv_round_trip_and_aggregation(tmp_path):
    rows = [(2, 32, 0, 3.0), (2, 32, 1, 3.2), (2, 32, 2, 3.1), (2, 64, 0, 2.8), (4, 32, 0, 2.9), (4, 32, 1, 2.95)]
    frame = pd.DataFrame(rows, columns=["depth", "width", "seed", "loss"])
    frame["params"] = 12 * frame["depth"] * frame["width"] ** 2
    frame.to_csv(tmp_path / "runs.csv", index=False)
    table = load_runs(tmp_path / "runs.csv")
    points = aggregate_seeds(table.runs)
    first = points[(points["depth"] == 2) & (points["width"] == 32)].iloc[0]
    assert first["loss_mean"] == pytest.approx(3.1)
    assert first["loss_std"] == pytest.approx(np.std([3.0, 3.2, 3.1], ddof=1))
    assert first["n_seeds"] == 3
    single = points[(points["depth"] == 2) & (points["width"] == 64)].iloc[0]
    assert single["n_seeds"] == 1 and np.isnan(single["loss_std"])
    std, dof = pooled_seed_std(table.runs)
    expected = np.sqrt((2 * np.var([3.0, 3.2, 3.1], ddof=1) + np.var([2.9, 2.95], ddof=1)) / 3)
    assert (std, dof) == (pytest.approx(expected), 3)


@pytest.mark.parametrize("content, match", [
    ("", "empty"),
    ("depth,width,params,seed,loss\n", "no rows"),
    ("depth,width,seed,loss\n2,32,0,3.0\n", "missing column.*params"),
    ("depth,width,params,seed,loss\n2,32,24576,0,nan\n", "NaN"),
    ("depth,width,params,seed,loss\n2,32,24576,0,\n", "NaN"),
    ("depth,width,params,seed,loss\n2,32,24576,0,abc\n", "non-numeric"),
    ("depth,width,params,seed,loss\n2,32,99999,0,3.0\n", "12·L·d²"),
])
def test_bad_csv(tmp_path, content, match):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(AnalysisInputError, match=match):
        load_runs(path)


def test_missing_path(tmp_path):
    with pytest.raises(AnalysisInputError, match="no such file"):
        load_runs(tmp_path / "nope.csv")


def test_single_depth_is_refused(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("depth,width,params,seed,loss\n2,32,24576,0,3.0\n2,64,98304,0,2.9\n")
    with pytest.raises(AnalysisInputError, match="only depth 2"):
        require_depths(load_runs(path))


# The JAX-free modules that read what runs leave behind: records, their metrics and the storage under them,
# and the run directories' names (scaling.store.rundir: a sweep's run found by its name).
RECORD_READERS = ("scaling.store.records", "scaling.store.record_checks", "scaling.store.metrics_log", "scaling.store.storage",
                  "scaling.store.rundir")
# The command line's shared, JAX-free pieces: one parser for every entry point, and what each does first
# (tests/test_help.py checks that `python -m analysis --help` loads no JAX).
COMMAND_LINE = ("scaling.cli", "scaling.entry")


def test_analysis_reads_records_only():
    """From the project the package imports only the JAX-free modules that read run records (and the command
    line's shared parser and start-up), never the trainer or launcher."""
    import ast

    from helpers import REPO

    for source in (REPO / "analysis").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.split(".")[0] in ("scaling", "sweeps"):
                    allowed = set(RECORD_READERS + COMMAND_LINE)  # ``from package import module`` names the module
                    imported = [f"{name}.{alias.name}" if f"{name}.{alias.name}" in allowed else name
                                for alias in node.names] if isinstance(node, ast.ImportFrom) else [name]
                    assert isinstance(node, (ast.Import, ast.ImportFrom)) and set(imported) <= set(RECORD_READERS + COMMAND_LINE), \
                        f"{source.name} imports {name}"
