"""`python -m analysis log-length`: the length-generalisation table and figure, from run records."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis import log_length
from scaling import records

REPO = Path(__file__).resolve().parents[1]


def _write_run(root: Path, run_id: str, task: str, n: int, arm: str, seed: int, accuracy: float, bits: float,
               status: str = "finished", train_loss: float = 0.01) -> None:
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    config = {"data": {"source": task, "synthetic_max_length": n, "synthetic_eval_max_length": 1000},
              "model": {"attention_scale": arm}}
    (run_dir / "config.json").write_text(json.dumps(config))
    finished = status == "finished"
    records.write_record(run_dir, records.RunRecord(
        run_id=run_id, status=status, depth=2, width=16, seed=seed, params_non_embedding=6144,
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
    done = subprocess.run([sys.executable, "-m", "analysis", "log-length", str(directory), "--figure", str(figure)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert figure.stat().st_size > 10_000
    cell = np.array(values[("parity", 30, "log_length")])
    expected = (f"| PARITY | 30 | log_length | 3 | 1000 | {100 * cell[:, 0].mean():.1f} ± "
                f"{100 * cell[:, 0].std(ddof=1):.1f} | {cell[:, 1].mean():.3f} ± {cell[:, 1].std(ddof=1):.3f} | 2/3 |")
    assert expected in done.stdout.splitlines()
    as_json = subprocess.run([sys.executable, "-m", "analysis", "log-length", str(directory), "--format", "json"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert len(json.loads(as_json.stdout)["cells"]) == 6


def test_no_finished_runs_is_one_error_line(tmp_path):
    _write_run(tmp_path, "r0", "first", 10, "standard", 0, 0.0, 0.0, status="running")
    done = subprocess.run([sys.executable, "-m", "analysis", "log-length", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "1 running" in done.stderr
