"""Records that are valid but cannot be trusted (issue 41, items 3-6): another run's result.json, two
records of one run that disagree, a final loss edited by hand; and two small command-line answers."""

import json
import shutil

import pytest

import tiny
from analysis.errors import AnalysisInputError
from analysis.results import load_runs
from scaling import train as train_cli
from scaling.config import to_dict
from scaling.run import train
from scaling.store import lease as lease_lib, record_checks, records
from sweeps import launch

PAIR = "depths=(1,), widths={1: (16, 32)}"  # L1-d16 and L1-d32


def _trained_pair(tmp_path, monkeypatch):
    """The two-run sweep trained in this process: (sweep file, {name: run directory})."""
    sweep = str(tiny.write_sweep(tmp_path, "mini", PAIR))
    monkeypatch.chdir(tmp_path)
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", sweep, "--workdir", "runs", "--no-progress"]) == 0
    dirs = {records.read_record(d).name: d for d in tiny.run_dirs(tmp_path / "runs")}
    return sweep, dirs


def test_another_runs_record_and_an_edited_loss_are_named_trained_again_and_left_out_of_the_analysis(
        tmp_path, capsys, monkeypatch):
    sweep, dirs = _trained_pair(tmp_path, monkeypatch)
    small, large = dirs["L1-d16-s0"], dirs["L1-d32-s0"]
    large_record = records.read_record(large)
    shutil.copy(small / "result.json", large / "result.json")  # d16's result over d32's
    capsys.readouterr()

    # The analysis leaves the copy out and says why (before: d32 vanished as a "duplicate" of d16).
    table = load_runs(tmp_path / "runs" / "mini")
    assert table.skipped == {"untrusted record": 1} and len(table.runs) == 1
    assert any(f"{large}/result.json: skipped" in note and "not run" in note for note in table.notes)

    # status names it; run trains it again (resuming at its last checkpoint) and writes its own record.
    assert launch.main(["status", sweep, "--workdir", "runs"]) == 0
    out = capsys.readouterr().out
    assert f"{large}/result.json: holds run {records.read_record(small).run_id}'s record" in out
    assert launch.main(["run", sweep, "--workdir", "runs", "--no-progress"]) == 0
    assert "1 to train" in capsys.readouterr().out
    again = records.read_record(large)
    assert again.run_id == large_record.run_id and again.final_eval_loss == large_record.final_eval_loss

    # A final loss edited by hand disagrees with the metrics log: named, trained again, left out.
    honest = records.read_record(small)
    records.write_record(small, honest.replace(final_eval_loss=honest.final_eval_loss - 0.5))
    table = load_runs(tmp_path / "runs" / "mini")
    assert table.skipped == {"untrusted record": 1}
    assert any("disagrees with the metrics log" in note for note in table.notes)
    assert launch.main(["status", sweep, "--workdir", "runs", "--json"]) == 0
    states = {run["name"]: run["status"] for run in json.loads(capsys.readouterr().out)["runs"]}
    assert states == {"L1-d16-s0": "unreadable", "L1-d32-s0": "finished"}
    # The trainer itself does not take the edited record for a finished run either.
    assert tiny.run(records_config(small), small).final_eval_loss == pytest.approx(honest.final_eval_loss, rel=1e-6)
    assert record_checks.read_checked_record(small, honest.run_id) == records.read_record(small)


def records_config(run_dir):
    """The run's config, from its config.json."""
    from scaling.config import TrainConfig, from_dict

    return from_dict(TrainConfig, json.loads((run_dir / "config.json").read_text()))


def _record(run_id, loss, depth=1, **fields):
    return records.RunRecord(run_id=run_id, status="finished", depth=depth, width=16, seed=0,
                             params_non_embedding=12 * depth * 16 ** 2, point_id="p" + run_id, lr_rule="constant", peak_lr=1e-3, planned_steps=8, steps=8,
                             final_eval_loss=loss, **{"data_fingerprint": "fp", **fields})


def _write(directory, record):
    directory.mkdir(parents=True)
    records.write_record(directory, record)


@pytest.mark.parametrize("change", [dict(loss=2.5), dict(loss=3.0, data_fingerprint="other")])
def test_two_records_of_one_run_that_disagree_are_refused(tmp_path, change):
    # One run id in two places (a copy kept elsewhere, a rerun): equal records count once, different ones
    # cannot both be right, as with two CSV rows of one run (before: the first by path order was kept).
    _write(tmp_path / "sweep" / "a" / "run", _record("aaaaaaaaaaaa", 3.0))
    _write(tmp_path / "sweep" / "b" / "run", _record("bbbbbbbbbbbb", 3.1, depth=2))
    _write(tmp_path / "sweep" / "c" / "copy", _record("aaaaaaaaaaaa", 3.0))
    assert load_runs(tmp_path / "sweep").skipped == {"duplicate run_id": 1}
    loss = change.pop("loss")
    shutil.rmtree(tmp_path / "sweep" / "c")
    _write(tmp_path / "sweep" / "c" / "copy", _record("aaaaaaaaaaaa", loss, **change))
    with pytest.raises(AnalysisInputError, match="records of one run .aaaaaaaaaaaa. with different") as caught:
        load_runs(tmp_path / "sweep")
    assert ("final_eval_loss" if loss != 3.0 else "data_fingerprint") in str(caught.value)


def test_a_record_in_a_directory_named_after_another_run_is_left_out(tmp_path):
    _write(tmp_path / "sweep" / "aaaaaaaaaaaa", _record("aaaaaaaaaaaa", 3.0))
    _write(tmp_path / "sweep" / "cccccccccccc", _record("bbbbbbbbbbbb", 3.1, depth=2))  # b's record in c's directory
    _write(tmp_path / "sweep" / "kept-by-hand", _record("dddddddddddd", 3.2, depth=3))  # no run id: nothing to compare
    table = load_runs(tmp_path / "sweep")
    assert sorted(table.runs["run_id"]) == ["aaaaaaaaaaaa", "dddddddddddd"]
    assert table.skipped == {"untrusted record": 1}


def test_a_metrics_log_without_the_last_evaluation_judges_nothing(tmp_path):
    run_dir = tmp_path / "run"
    _write(run_dir, _record("aaaaaaaaaaaa", 3.0))
    assert record_checks.metrics_problem(records.read_record(run_dir), run_dir) is None  # no log at all
    (run_dir / "metrics.jsonl").write_text('{"step": 4, "eval_loss": 1.0}\n{"step": 8, "loss": 2.0}\n')
    assert record_checks.metrics_problem(records.read_record(run_dir), run_dir) is None
    (run_dir / "metrics.jsonl").write_text('{"step": 4, "eval_loss": 1.0}\n{"step": 8, "eval_loss": 2.0}\n')
    assert "disagrees" in record_checks.metrics_problem(records.read_record(run_dir), run_dir)


def test_a_flag_given_to_a_number_is_refused(tmp_path, capsys):
    assert train_cli.main(["--config", "tiny", "--workdir", str(tmp_path / "run"), "--set", "steps=true"]) == 2
    assert "steps=true: steps is a number" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["lease", "error.log"])
def test_a_failure_names_error_log_only_if_it_was_written(tmp_path, capsys, monkeypatch, where):
    # A read-only run directory: the lease cannot be created (nothing recorded), or the run fails later
    # and its traceback cannot be written either. Root ignores permissions, so the writes fail by hand.
    if where == "lease":
        def refuse(self):
            raise PermissionError(13, "Permission denied", self.path)

        monkeypatch.setattr(lease_lib.Lease, "acquire", refuse)
    else:
        monkeypatch.setattr(train.data, "build", lambda config: (_ for _ in ()).throw(RuntimeError("no data")))
        monkeypatch.setattr(train.rundir, "log_failure", lambda run_dir, error: None)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(to_dict(tiny.config())))
    assert train_cli.main(["--config", str(config), "--workdir", str(tmp_path / "run"), "--no-progress"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m scaling.train: error: run failed:") and "error.log" not in lines[0].replace(
        "no error.log", ""), lines
