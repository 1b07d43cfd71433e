"""One training loop for a run alone and for a pack (scaling/run/loop.py, scaling/run/train.py).

A run trained alone, as a pack of one and inside a pack of three keeps the same metrics rows, record
fields and committed checkpoints (losses to the packed tolerance), for a causal LM and a classification
task, on a local directory and on gs:// (the emulator). A user's hooks run between steps and at the end,
for a run alone and for every run of a pack. And each run's state is its own: a holder that lost a
run's lease writes nothing more into it, a fresh start keeps no old rows, a record without its metrics
log is not trusted, a resume in another pack size is recorded, and a failure names its own run.
"""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tiny

from scaling.config import DataConfig, ModelConfig
from scaling.model import program as program_lib
from scaling.run import train
from scaling.run.loop import Evaluation, Hook
from scaling.run.stopping import LeaseLost, Preempted, Stop
from scaling.store import background_save, checkpoints as checkpoints_lib, lease as lease_lib
from scaling.store import record_checks, records
from scaling.store.metrics_log import read_metrics
from scaling.store.storage import is_remote

RTOL = 1e-5  # a member follows its solo run to float32 rounding (tests/test_pack_train.py)
SEEDS_AND_RATES = ((0, 3e-3), (1, 1e-3), (2, 1e-2))
# Whatever is measured, or says how the run was trained, differs between the three ways of training it.
MEASURED = {"wall_seconds", "train_seconds", "mfu", "wandb_id", "pack_size", "pack_segments", "final_eval_loss",
            "final_train_loss", "initial_eval_loss", "final_eval_bits", "final_eval_accuracy", "code_version"}


def causal(**changes):
    return tiny.config(**changes)


def parity(**changes):
    """A classification task (the label read from two logits): accuracy and bits in its record."""
    base = tiny.config(model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=40, objective="masked"),
                       data=DataConfig(source="parity", seq_len=40))
    return dataclasses.replace(base, **changes)


def runs(task):
    return [dataclasses.replace(task(), seed=seed, name=f"s{seed}", optim=dataclasses.replace(task().optim, peak_lr=lr))
            for seed, lr in SEEDS_AND_RATES]


def pack(configs, root, **kwargs):
    dirs = [f"{root}/{config.name}" for config in configs]
    kwargs = {"devices": tiny.one_device(), "show_progress": False, **kwargs}
    return train.run_pack(configs, dirs, **kwargs), dirs


def rows(run_dir) -> list[dict]:
    return read_metrics(run_dir)


def losses(run_dir) -> list[float]:
    """The training losses logged, in step order (the row of step 0 holds the first evaluation only)."""
    return [row["loss"] for row in rows(run_dir) if "loss" in row]


def committed(run_dir) -> list[int]:
    from sweeps.state import checkpoint_steps

    return checkpoint_steps(run_dir)


def comparable(record: records.RunRecord) -> dict:
    return {key: value for key, value in dataclasses.asdict(record).items() if key not in MEASURED}


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("gcs")


@pytest.mark.parametrize("task", [causal, parity], ids=["causal", "parity"])
def test_alone_as_a_pack_of_one_and_in_a_pack_of_three_a_run_is_the_same(task, root, monkeypatch):
    submitted = []  # periodic checkpoints handed to a background saver, by run directory
    real_submit = background_save.BackgroundSaver.submit
    monkeypatch.setattr(background_save.BackgroundSaver, "submit",
                        lambda self, step, *a: (submitted.append(step), real_submit(self, step, *a))[1])
    configs = runs(task)
    alone = tiny.run(configs[0], f"{root}/alone/{configs[0].name}")
    (of_one,), (one_dir,) = pack(configs[:1], f"{root}/one")
    of_three, three_dirs = pack(configs, f"{root}/three")
    ways = {"alone": (alone, f"{root}/alone/{configs[0].name}"), "pack of one": (of_one, one_dir),
            "pack of three": (of_three[0], three_dirs[0])}
    reference_rows = rows(ways["alone"][1])
    for way, (record, run_dir) in ways.items():
        assert record.status == "finished", way
        assert comparable(record) == comparable(alone), way
        assert committed(run_dir) == committed(ways["alone"][1]) == [4, 8], way
        assert [sorted(row) for row in rows(run_dir)] == [sorted(row) for row in reference_rows], way
        np.testing.assert_allclose(losses(run_dir), losses(ways["alone"][1]), rtol=RTOL, err_msg=way)
        assert math.isclose(record.final_eval_loss, alone.final_eval_loss, rel_tol=RTOL), way
    for record in of_three:  # every run of the pack has what a run alone has
        assert record.status == "finished" and record.pack_size == 3 and record.pack_segments == [[0, 3]]
    if task is parity:  # the label's accuracy and bits, in the record and in the last row
        for record, run_dir in [(alone, ways["alone"][1]), *zip(of_three, three_dirs)]:
            assert record.final_eval_accuracy is not None and record.final_eval_bits is not None
            assert {"eval_accuracy", "eval_bits"} <= set(rows(run_dir)[-1])
    if is_remote(root):  # periodic checkpoints behind the loop, for a pack's runs too (step 4 of each run)
        assert submitted == [4] * 5


def test_a_hook_evaluates_on_a_second_dataset_for_a_run_alone_and_for_a_pack(tmp_path):
    files = []
    for part in range(2):  # two documents
        files.append(tmp_path / f"other-{part}.txt")
        files[-1].write_text("".join(f"Line {i} of a second corpus, of sentences the runs never train on.\n"
                                     for i in range(1000)))
    evaluation = DataConfig(source="local", paths=tuple(map(str, files)), seq_len=32)
    seen = []
    hooks = [Hook(Evaluation("other", evaluation), every=4),
             Hook(lambda info: seen.append((info.step, info.final, len(info.members))), every=3)]
    alone = tiny.run(runs(causal)[0], tmp_path / "alone", hooks=hooks)
    packed, dirs = pack(runs(causal), tmp_path / "pack", hooks=hooks)
    for record, run_dir in [(alone, tmp_path / "alone"), *zip(packed, dirs)]:
        logged = {row["step"]: row["other/eval_loss"] for row in rows(run_dir) if "other/eval_loss" in row}
        assert sorted(logged) == [4, 8]
        assert record.final_evaluations == {"other": logged[8]} and logged[8] != record.final_eval_loss
        assert records.read_record(run_dir).final_evaluations == {"other": logged[8]}
    assert seen == [(3, False, 1), (6, False, 1), (8, True, 1), (3, False, 3), (6, False, 3), (8, True, 3)]


def test_a_hook_refuses_a_negative_interval(tmp_path):
    with pytest.raises(ValueError, match="every=-1"):
        tiny.run(causal(), tmp_path / "run", hooks=[Hook(lambda info: None, every=-1)])
    assert not (tmp_path / "run").exists()  # refused before anything was touched


def test_a_final_evaluation_not_finite_saves_the_last_checkpoint_then_records_diverged(tmp_path, monkeypatch):
    real = program_lib.evaluate
    calls = []

    def evaluate(*args, **kwargs):
        results = real(*args, **kwargs)
        calls.append(1)
        return [{**result, "loss": float("nan")} for result in results]

    monkeypatch.setattr(program_lib, "evaluate", evaluate)
    alone = tiny.run(causal(), tmp_path / "alone")
    packed, dirs = pack(runs(causal), tmp_path / "pack")
    for record, run_dir in [(alone, tmp_path / "alone"), *zip(packed, map(Path, dirs))]:
        assert record.status == "diverged" and record.final_eval_loss is None
        assert committed(run_dir) == [4, 8]  # the final checkpoint is saved, as a run alone's is


def _take_over(run_dir) -> None:
    """Another launcher takes the run's lease over (as after this holder was paused past it)."""
    path = Path(run_dir) / lease_lib.LEASE_FILE
    holder = json.loads(path.read_text())
    path.write_text(json.dumps({**holder, "token": "another-launcher", "pid": 1}))


def test_a_holder_that_lost_a_runs_lease_writes_nothing_more_into_it(tmp_path):
    taken = {}

    def take_over_the_first_run(info):
        if info.step != 5:
            return
        run_dir = info.members[0].run_dir
        _take_over(run_dir)
        taken["log"] = (Path(run_dir) / "metrics.jsonl").read_text()

    outcomes, dirs = pack(runs(causal)[:2], tmp_path, hooks=[Hook(take_over_the_first_run, every=5)])
    assert isinstance(outcomes[0], LeaseLost) and str(dirs[0]) in str(outcomes[0])
    assert (Path(dirs[0]) / "metrics.jsonl").read_text() == taken["log"]  # not one row more
    assert not (Path(dirs[0]) / "result.json").exists()
    assert outcomes[1].status == "finished" and [row["step"] for row in rows(dirs[1])] == list(range(9))


def test_a_local_run_that_starts_afresh_keeps_no_row_of_the_old_start(tmp_path):
    def fail_at_three(info):
        if info.step == 3:
            raise RuntimeError("killed before the first checkpoint")

    with pytest.raises(RuntimeError):
        tiny.run(causal(), tmp_path / "run", hooks=[Hook(fail_at_three, every=1)])
    assert committed(tmp_path / "run") == []
    tiny.run(causal(), tmp_path / "run")
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(9))  # one row per step


def test_a_finished_record_without_its_metrics_log_is_not_trusted(tmp_path, capsys):
    from analysis.results import load_runs

    record = tiny.run(causal(), tmp_path / "sweep" / "run")
    (tmp_path / "sweep" / "run" / "metrics.jsonl").unlink()
    forged = json.loads((tmp_path / "sweep" / "run" / "result.json").read_text())
    forged["final_eval_loss"] = 0.5
    (tmp_path / "sweep" / "run" / "result.json").write_text(json.dumps(forged))
    with pytest.raises(records.RecordError, match="no metrics log"):
        record_checks.read_checked_record(tmp_path / "sweep" / "run", record.run_id)
    table = load_runs(tmp_path / "sweep")
    assert any("not checked" in note and "no metrics log" in note for note in table.notes)
    retrained = tiny.run(causal(), tmp_path / "sweep" / "run")  # trained again (from its checkpoints), not trusted
    assert retrained.final_eval_loss == pytest.approx(record.final_eval_loss, rel=1e-6)


def test_a_run_resumed_in_another_pack_size_records_its_segments(tmp_path, monkeypatch):
    configs = runs(causal)
    uninterrupted, reference = pack(configs, tmp_path / "reference")
    stop = Stop()

    def stop_after_four(info):
        if info.step == 4:
            stop.signal = "SIGTERM"

    stopped, dirs = pack(configs, tmp_path / "stopped", stop=stop, hooks=[Hook(stop_after_four, every=4)])
    assert all(isinstance(outcome, Preempted) for outcome in stopped)
    resumed = tiny.run(configs[0], dirs[0])  # alone, from step 4
    assert resumed.pack_segments == [[0, 3], [4, 1]] and resumed.pack_size == 1
    assert uninterrupted[0].pack_segments == [[0, 3]]
    np.testing.assert_allclose(losses(dirs[0]), losses(reference[0]), rtol=RTOL)


def test_a_runs_checkpoint_failure_ends_that_run_alone_naming_its_own_directory(tmp_path, monkeypatch):
    real_save = checkpoints_lib.Checkpoints.save

    def save(self, step, *args, **kwargs):
        if "s0" in str(self.directory):
            raise checkpoints_lib.CheckpointError(f"checkpoint of step {step} in {self.directory} failed: disk full")
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(checkpoints_lib.Checkpoints, "save", save)
    outcomes, dirs = pack(runs(causal), tmp_path)
    assert isinstance(outcomes[0], checkpoints_lib.CheckpointError) and str(dirs[0]) in str(outcomes[0])
    assert records.read_record(dirs[0]).status == "failed"
    assert [outcome.status for outcome in outcomes[1:]] == ["finished", "finished"]


def test_the_trainer_is_found_where_users_imported_it():
    import scaling.train as public

    from scaling.run import train as trainer

    assert public.run is trainer.run and public.run_pack is trainer.run_pack and public.Hook is Hook
