"""A run's one ending: what ended it decides its record's status, its tracker's and its process's exit codes,
and the three agree whatever else fails while the run ends."""

import json

import pytest

import tiny
from scaling import train as train_cli
from scaling.config import DataConfig, config_id, to_dict
from scaling.model import budget, program as program_lib
from scaling.run import member as member_lib, train
from scaling.run.ending import REFUSED, AlreadyFinished, Ending, ResumesElsewhere, as_raised, ending
from scaling.run.stopping import PREEMPTED_EXIT_CODE, LeaseLost, Preempted, Stop
from scaling.run.track import Tracker
from scaling.store import lease as lease_lib, records, rundir
from scaling.store.checkpoints import CheckpointError, WriteAbandoned


def _finished_record() -> records.RunRecord:
    return records.RunRecord(run_id="a" * 12, status="finished", depth=1, width=16, seed=0,
                             params_non_embedding=3072, point_id="b" * 12, lr_rule="constant", peak_lr=1e-3,
                             planned_steps=8, final_eval_loss=2.0)


@pytest.mark.parametrize("error, expected", [
    (None, Ending("finished", 0, 0)),
    (Preempted("stopped by SIGTERM after step 3; checkpoint saved"), Ending("stopped", PREEMPTED_EXIT_CODE,
                                                                             PREEMPTED_EXIT_CODE)),
    (LeaseLost("taken over"), Ending(None, 1, 2)),
    (rundir.ConfigMismatch("another config's run"), Ending(None, 1, 2)),
    (lease_lib.RunBusy("held by another"), Ending(None, 1, 2)),
    (records.OutdatedRecord("schema 1"), Ending(None, 1, 2)),
    (ResumesElsewhere("resumes from step 4, its pack from step 0"), Ending(None, 1, 2)),
    (AlreadyFinished(_finished_record()), Ending(None, 0, 0)),
    (CheckpointError("checkpoint of step 4 failed"), Ending("failed", 1, 1)),
    (WriteAbandoned("not finished after 5 s", stopped=False), Ending("failed", 1, 1)),
    (ValueError("mesh does not fit"), Ending("failed", 1, 1)),
    (RuntimeError("no data"), Ending("failed", 1, 1)),
], ids=lambda value: type(value).__name__)
def test_each_end_maps_to_one_status_and_two_exit_codes(error, expected):
    assert ending(error) == expected
    assert set(REFUSED) == {rundir.ConfigMismatch, lease_lib.RunBusy, records.OutdatedRecord, ResumesElsewhere}


def test_a_run_that_trained_to_its_end_exits_by_its_status():
    assert ending(None, "finished") == Ending("finished", 0, 0)
    assert ending(None, "diverged") == Ending("diverged", 1, 1)


def test_what_an_error_means_once_the_lease_is_lost_or_a_stop_gave_up_a_write():
    stop = Stop()
    error = RuntimeError("disk gone")
    assert as_raised(error, stop, False) is error
    stopped = as_raised(WriteAbandoned("checkpoint of step 4 in /x: abandoned after a stop request", stopped=True),
                        stop, False)
    assert isinstance(stopped, Preempted) and ending(stopped).status == "stopped"
    assert str(stopped).startswith("stopped by SIGTERM while waiting for a write that storage did not finish")
    deadline = WriteAbandoned("not finished after 5 s", stopped=False)
    assert as_raised(deadline, stop, False) is deadline  # storage that never answered: the run failed
    for error in (RuntimeError("disk gone"), Preempted("stopped by SIGTERM"), CheckpointError("refused")):
        lost = as_raised(error, stop, True)
        assert isinstance(lost, LeaseLost) and ending(lost) == Ending(None, 1, 2)


def _tracker_exit_codes(monkeypatch) -> list:
    codes = []
    real_close = Tracker.close

    def close(self, exit_code=0):
        codes.append(exit_code)
        return real_close(self, exit_code=exit_code)

    monkeypatch.setattr(Tracker, "close", close)
    return codes


def test_a_record_that_cannot_be_written_fails_the_run_for_the_tracker_and_the_process_alike(tmp_path, monkeypatch,
                                                                                           capsys):
    # Before: the tracker (wandb) had finished with exit code 0 when the record's write failed, and the
    # command line then exited 1 for the same run.
    codes = _tracker_exit_codes(monkeypatch)

    def refuse(run_dir, record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records, "write_record", refuse)
    with pytest.raises(OSError) as caught:
        tiny.run(tiny.config(steps=2, checkpoint_every=2), tmp_path / "run")
    assert codes == [ending(caught.value).tracker_exit_code] == [1]
    assert ending(caught.value).exit_code == 1
    assert (tmp_path / "run" / "error.log").exists() and not (tmp_path / "run" / "result.json").exists()
    assert "while ending the run: OSError" in capsys.readouterr().err  # the failed record could not land either


def test_an_error_after_the_lease_was_lost_ends_the_run_as_lease_lost_everywhere(tmp_path, monkeypatch, capsys):
    # Before: nothing was recorded (the run is another process's), yet the command line said "run failed"
    # and exited 1, and a launcher counted the run as failed instead of held elsewhere.
    codes, leases = _tracker_exit_codes(monkeypatch), []
    real_acquire = lease_lib.Lease.acquire

    def acquire(self):
        leases.append(self)
        return real_acquire(self)

    def lose_the_lease_then_fail(*args, **kwargs):
        leases[0].lost = True  # as the heartbeat finds when another launcher took the run over
        raise RuntimeError("disk gone")

    monkeypatch.setattr(lease_lib.Lease, "acquire", acquire)
    monkeypatch.setattr(program_lib, "evaluate", lose_the_lease_then_fail)
    tiny.on_one_device(monkeypatch)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(to_dict(tiny.config(steps=2, checkpoint_every=2))))
    run_dir = tmp_path / "run"
    assert train_cli.main(["--config", str(config_file), "--workdir", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m scaling.train: error: another process took over this run's lease")
    assert "disk gone" in err[-1]
    assert codes == [1] and not (run_dir / "result.json").exists() and not (run_dir / "error.log").exists()


def test_the_records_counts_come_from_the_resolved_config_and_its_identity_from_the_users(tmp_path):
    user = tiny.config(data=DataConfig(source="builtin", seq_len=32))
    resolved = train.resolve_config(user, type("Pipeline", (), {"vocab_size": 400})())
    assert user.model.vocab_size == 260 and resolved.model.vocab_size == 400
    member = member_lib.Member(tmp_path, user, None, Stop())
    assert member.record("failed").params_total is None  # failed before its data was read: unknown, not wrong
    member.begin(resolved, "fingerprint")
    record = member.record("running")
    counts = budget.count_params(resolved.model)
    assert (record.params_total, record.params_embedding) == (counts["total"], counts["embedding"])
    assert counts["total"] != budget.count_params(user.model)["total"]
    assert record.run_id == config_id(user) != config_id(resolved) and record.data_fingerprint == "fingerprint"
    assert json.loads((tmp_path / "config.json").read_text()) == to_dict(user)  # the user's config
