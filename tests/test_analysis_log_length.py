"""`python -m analysis log-length`: the length-generalisation table and figure, from run records."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import helpers
from analysis import log_length
from scaling.store import records


def _write_run(root: Path, run_id: str, task: str, n: int, arm: str, seed: int, accuracy: float, bits: float,
               status: str = "finished", train_loss: float = 0.01, position: str = "learned",
               train_strings: int = 100) -> None:
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    config = {"data": {"source": task, "synthetic_max_length": n, "synthetic_eval_max_length": 1000,
                       "synthetic_train_size": train_strings},
              "model": {"attention_scale": arm, "position": position}}
    (run_dir / "config.json").write_text(json.dumps(config))
    finished = status == "finished"
    records.write_record(run_dir, records.RunRecord(
        run_id=run_id, status=status, depth=2, width=16, seed=seed, params_non_embedding=6144,
        point_id=f"{task}{n}{arm}{position}{train_strings}", lr_rule="constant", peak_lr=1e-3, planned_steps=100,
        final_eval_loss=bits * np.log(2) if finished else None,
        final_eval_accuracy=accuracy if finished else None, final_eval_bits=bits if finished else None,
        final_train_loss=train_loss))


@pytest.fixture
def sweep_dir(tmp_path):
    rng = np.random.default_rng(0)
    values = {}
    for task, lengths in (("first", (10, 100)), ("parity", (30,))):
        for n in lengths:
            for arm in ("standard", "log_length"):
                for seed in range(3):
                    accuracy, bits = float(rng.uniform(0.4, 1.0)), float(rng.uniform(0.0, 2.0))
                    # seed 2 of every cell ends far from fitting its training strings (0.5 nats)
                    _write_run(tmp_path, f"{task}{n}{arm}{seed}", task, n, arm, seed, accuracy, bits,
                               train_loss=0.5 if seed == 2 else 0.01)
                    values.setdefault((task, n, arm), []).append((accuracy, bits))
    _write_run(tmp_path, "running0", "first", 10, "standard", 9, 0.0, 0.0, status="running")
    return tmp_path, values


def test_table_gives_mean_and_std_over_seeds_per_cell(sweep_dir):
    directory, values = sweep_dir
    table = log_length.summary_table(log_length.load(directory).runs)
    assert len(table) == len(values) == 6
    for row in table.itertuples():
        cell = np.array(values[(row.task, row.train_length, row.arm)])
        assert row.seeds == 3 and row.test_length == 1000
        assert row.accuracy_mean == pytest.approx(cell[:, 0].mean())
        assert row.accuracy_std == pytest.approx(cell[:, 0].std(ddof=1))
        assert row.bits_mean == pytest.approx(cell[:, 1].mean())
        assert row.bits_std == pytest.approx(cell[:, 1].std(ddof=1))
        assert row.fitted == 2 and row.train_bits_mean == pytest.approx((0.5 + 0.02) / 3 / np.log(2))
    # standard before log_length within each (task, n)
    assert list(table["arm"][:2]) == ["standard", "log_length"]


def test_a_copied_run_directory_counts_once(sweep_dir):
    directory, _ = sweep_dir
    shutil.copytree(directory / "first10standard0", directory / "copy-of-a-run")
    loaded = log_length.load(directory)
    assert len(loaded.runs) == 18
    assert loaded.skipped == {"duplicate run id": 1, "running": 1}


def test_cli_prints_the_table_and_draws_the_figure(sweep_dir, tmp_path):
    directory, values = sweep_dir
    figure = tmp_path / "figure" / "accuracy.png"
    done = helpers.run_module("analysis", "log-length", directory, "--figure", figure, timeout=120)
    assert done.returncode == 0, done.stderr
    assert figure.stat().st_size > 10_000
    cell = np.array(values[("parity", 30, "log_length")])
    expected = (f"| PARITY | 30 | log_length | 3 | 1000 | {100 * cell[:, 0].mean():.1f} ± "
                f"{100 * cell[:, 0].std(ddof=1):.1f} | {cell[:, 1].mean():.3f} ± {cell[:, 1].std(ddof=1):.3f} | 2/3 |")
    assert expected in done.stdout.splitlines()
    as_json = helpers.run_module("analysis", "log-length", directory, "--format", "json", timeout=120)
    assert len(json.loads(as_json.stdout)["cells"]) == 6


def test_arm_difference_is_welchs_t_test(sweep_dir):
    """The p-value of each (task, n) is Welch's: t from the two sample variances, degrees of freedom
    from Welch-Satterthwaite, two-sided; computed here by hand from the seeds' accuracies."""
    from scipy import stats

    directory, values = sweep_dir
    comparison = log_length.compare_arms(log_length.load(directory).runs)
    assert len(comparison) == 3
    for row in comparison.itertuples():
        a = np.array(values[(row.task, row.train_length, "log_length")])[:, 0]
        b = np.array(values[(row.task, row.train_length, "standard")])[:, 0]
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        t = (a.mean() - b.mean()) / np.sqrt(va + vb)
        dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        assert row.difference == pytest.approx(a.mean() - b.mean())
        assert row.welch_p == pytest.approx(2 * stats.t.sf(abs(t), dof))


def test_setups_are_tabled_and_compared_apart(tmp_path):
    """Runs with the FIRST authors' setup (indicator positions, fresh strings) form their own table and
    comparison rows, never pooled with learned-position runs of the same task, n and arm."""
    for seed in range(4):
        _write_run(tmp_path, f"l-std{seed}", "first", 10, "standard", seed, 0.5 + 0.01 * seed, 1.0)
        _write_run(tmp_path, f"l-log{seed}", "first", 10, "log_length", seed, 0.5 + 0.02 * seed, 1.0)
        _write_run(tmp_path, f"a-std{seed}", "first", 10, "standard", seed, 0.6 + 0.01 * seed, 1.0,
                   position="first_indicator", train_strings=0)
        _write_run(tmp_path, f"a-log{seed}", "first", 10, "log_length", seed, 1.0 - 0.001 * seed, 0.0,
                   position="first_indicator", train_strings=0)
    runs = log_length.load(tmp_path).runs
    table = log_length.summary_table(runs)
    assert list(table["position"]) == ["learned", "learned", "first_indicator", "first_indicator"]
    assert set(table["seeds"]) == {4}
    comparison = log_length.compare_arms(runs).set_index("position")
    assert comparison.loc["first_indicator", "difference"] == pytest.approx(0.9985 - 0.615)
    assert comparison.loc["first_indicator", "welch_p"] < 1e-4 < comparison.loc["learned", "welch_p"]
    text = log_length.markdown(table, log_length.compare_arms(runs))
    assert "learned positions, a fixed set of 100 strings:" in text
    assert "first_indicator positions, a fresh string per example:" in text
    assert text.index("learned positions") < text.index("first_indicator positions")
    log_length.figure(runs, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000


def test_no_finished_runs_is_one_error_line(tmp_path):
    _write_run(tmp_path, "r0", "first", 10, "standard", 0, 0.0, 0.0, status="running")
    done = helpers.run_module("analysis", "log-length", tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "1 running" in done.stderr


def test_log_length_reads_gs_as_it_reads_a_local_directory(sweep_dir, gcs, capsys):
    """The same records copied to the bucket give the same table, left-out counts included, and the
    figure can be written to the bucket too."""
    from etils import epath

    from analysis.__main__ import main

    directory, _ = sweep_dir
    for file in directory.rglob("*.json"):
        epath.Path(f"{gcs}/sweeps/log_length/{file.relative_to(directory)}").write_bytes(file.read_bytes())
    for fmt in ("markdown", "csv", "json"):
        assert main(["log-length", str(directory), "--format", fmt]) == 0
        local = capsys.readouterr().out
        assert main(["log-length", f"{gcs}/sweeps/log_length", "--format", fmt]) == 0
        assert capsys.readouterr().out == local
    assert "left out: 1 running" in local or '"running": 1' in local
    assert main(["log-length", f"{gcs}/sweeps/log_length", "--figure", f"{gcs}/figures/accuracy.png"]) == 0
    assert epath.Path(f"{gcs}/figures/accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_a_version_1_record_stops_the_table_with_the_migration_command(sweep_dir, capsys):
    from analysis.__main__ import main

    directory, _ = sweep_dir
    record = directory / "first10standard0" / "result.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "schema_version": 1}))
    assert main(["log-length", str(directory)]) == 2  # never left out quietly: the table would change
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"{record}: a run record of schema version 1" in line
    assert line.endswith(f"python -m scaling.migrate_records {directory}")
