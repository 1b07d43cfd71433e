"""Metric tracking: wandb's offline log, the progress bar's clock, and a resumed tracker's metrics."""

import json
import threading

import numpy as np
from etils import epath

import tiny
from scaling.run.track import transaction_log_records, wait_for_transaction_log
from scaling.store.metrics_log import read_metrics


def test_wandb_offline_run_holds_the_loss_history(tmp_path):
    config = tiny.config(log_every=2, sweep_name="unit-sweep", wandb_mode="offline")
    result = tiny.run(config, tmp_path / "run")
    run_files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    logged, group = [], None
    for record in transaction_log_records(run_files[0]):
        if record.WhichOneof("record_type") == "history":
            values = {"/".join(item.nested_key) or item.key: item.value_json for item in record.history.item}
            if "loss" in values:
                logged.append(float(values["loss"]))
        if record.WhichOneof("record_type") == "run":
            group = record.run.run_group
            assert record.run.run_id == result.wandb_id
    np.testing.assert_allclose(logged, tiny.losses(tmp_path / "run"), rtol=1e-6)
    assert len(logged) == tiny.STEPS // 2
    assert group == "unit-sweep"


def test_a_finished_runs_wandb_log_is_complete_even_when_wandbs_service_writes_it_late(tmp_path, monkeypatch):
    """wandb's service writes a run's .wandb file when it closes the run's stream, after ``run.finish()``
    returns; on a loaded machine seconds later. Delay that close as load does: the file must still hold
    every logged row once the run is finished, before anything reads or copies it."""
    from wandb.sdk.lib.service import service_connection

    from scaling.run.track import finish_wandb_run, open_wandb_run

    from scaling.run import track

    monkeypatch.setattr(track, "_SERVICE_STUCK", False)
    close_stream = service_connection.ServiceConnection.inform_finish
    monkeypatch.setattr(service_connection.ServiceConnection, "inform_finish",
                        lambda self, run_id: threading.Timer(2.0, close_stream, (self, run_id)).start())
    run = open_wandb_run(tmp_path, mode="offline", project="p", id="late0close")
    for step in (2, 4, 6):
        run.log({"loss": float(step)}, step=step)
    finish_wandb_run(run, tmp_path)
    (log,) = tmp_path.glob("wandb/offline-run-*-late0close/run-late0close.wandb")
    records = list(transaction_log_records(log))
    assert [float(item.value_json) for record in records if record.WhichOneof("record_type") == "history"
            for item in record.history.item if ("/".join(item.nested_key) or item.key) == "loss"] == [2., 4., 6.]
    assert records[-1].WhichOneof("record_type") == "exit"


def test_a_stuck_wandb_service_is_waited_for_once_per_process(tmp_path, monkeypatch, capsys):
    """The service never closes the streams (never writes the files): the first finished run waits, warns and
    marks the service stuck; the next run of the process (a pack's next member) does not wait again."""
    from wandb.sdk.lib.service import service_connection

    from scaling.run import track

    monkeypatch.setattr(track, "_SERVICE_STUCK", False)
    monkeypatch.setattr(track, "FINISH_WRITE_SECONDS", 0.3)
    monkeypatch.setattr(service_connection.ServiceConnection, "inform_finish", lambda self, run_id: None)
    waits = []
    wait = track.wait_for_transaction_log
    monkeypatch.setattr(track, "wait_for_transaction_log",
                        lambda path, seconds: waits.append(path) or wait(path, seconds))
    for name in ("stuck0first", "stuck0second"):
        run = track.open_wandb_run(tmp_path / name, mode="offline", project="p", id=name)
        run.log({"loss": 1.0}, step=1)
        track.finish_wandb_run(run, tmp_path / name)
    assert [path.name for path in waits] == ["run-stuck0first.wandb"]
    assert "still lacks its exit record" in capsys.readouterr().err


def test_records_spanning_the_logs_32_kib_blocks_are_read_whole(tmp_path):
    from scaling.run.track import finish_wandb_run, open_wandb_run

    run = open_wandb_run(tmp_path, mode="offline", project="p", id="many0rows",
                         config={"notes": "x" * 70_000})  # one record longer than two blocks
    for step in range(1, 2001):
        run.log({"loss": 1.0 / step, "text_of_some_length": "y" * 40}, step=step)
    finish_wandb_run(run, tmp_path)
    (log,) = tmp_path.glob("wandb/offline-run-*/run-many0rows.wandb")
    assert log.stat().st_size > 4 * 32768
    records = list(transaction_log_records(log))
    steps = [record.history.step.num for record in records if record.WhichOneof("record_type") == "history"]
    assert steps == list(range(1, 2001))
    assert any(b"x" * 70_000 in record.SerializeToString() for record in records)  # the long record, whole


def test_waiting_for_a_wandb_log_ends_when_its_exit_record_lands(tmp_path):
    from scaling.run.track import finish_wandb_run, open_wandb_run

    run = open_wandb_run(tmp_path, mode="offline", project="p", id="wait0exit")
    run.log({"loss": 1.0}, step=1)
    finish_wandb_run(run, tmp_path)
    (log,) = tmp_path.glob("wandb/offline-run-*/run-wait0exit.wandb")
    whole = log.read_bytes()
    growing = tmp_path / "growing.wandb"
    growing.write_bytes(whole[:len(whole) - 3])  # the exit record cut short, as when caught mid-write
    assert [record.WhichOneof("record_type") for record in transaction_log_records(growing)][-1] != "exit"
    assert not wait_for_transaction_log(growing, 0.3)
    threading.Timer(0.5, growing.write_bytes, (whole,)).start()
    assert wait_for_transaction_log(growing, 30.0)
    assert not wait_for_transaction_log(tmp_path / "absent.wandb", 0.2)


def test_an_offline_wandb_run_of_a_gs_run_is_kept_in_the_bucket_beside_its_records(gcs, tmp_path):
    """As on a cloud slice without a wandb key: the slice's disk goes, the bucket keeps the run for `wandb sync`."""
    from gcs_emulator import keys

    config = tiny.config(log_every=2, wandb_mode="offline")
    result = tiny.run(config, f"{gcs}/run")
    kept = sorted(key for key in keys(f"{gcs}/run") if key.startswith("wandb/"))
    (run_file,) = [key for key in kept if key.endswith(".wandb")]
    assert run_file.startswith("wandb/offline-run-") and run_file.endswith(f"-{result.wandb_id}/run-{result.wandb_id}"
                                                                         ".wandb")
    local = tmp_path / "run.wandb"
    local.write_bytes(epath.Path(f"{gcs}/run/{run_file}").read_bytes())
    logged = [float(values["loss"]) for values in (
        {"/".join(item.nested_key) or item.key: item.value_json for item in record.history.item}
        for record in transaction_log_records(local) if record.WhichOneof("record_type") == "history") if "loss" in values]
    assert len(logged) == tiny.STEPS // 2


def test_each_run_of_a_pack_has_its_own_offline_wandb_run_with_its_losses(tmp_path):
    # The runs of a pack are open at once in one process: each its own wandb run (reinit="create_new").
    from scaling.run import train as pack_train

    configs = [tiny.config(seed=seed, name=f"s{seed}", log_every=2, wandb_mode="offline") for seed in (0, 1)]
    outcomes = pack_train.run_pack(configs, [tmp_path / "a", tmp_path / "b"], devices=tiny.one_device(),
                                   show_progress=False)
    for outcome, run_dir in zip(outcomes, [tmp_path / "a", tmp_path / "b"]):
        (run_file,) = (run_dir / "wandb").glob(f"offline-run-*-{outcome.wandb_id}/run-*.wandb")
        logged = [float(values["loss"]) for values in
                  ({"/".join(item.nested_key) or item.key: item.value_json for item in record.history.item}
                   for record in transaction_log_records(run_file) if record.WhichOneof("record_type") == "history")
                  if "loss" in values]
        np.testing.assert_allclose(logged, tiny.losses(run_dir), rtol=1e-6)
        assert len(logged) == tiny.STEPS // 2


def test_the_progress_bar_clock_starts_after_compilation(tmp_path, capsys):
    import time

    from scaling.run.track import Tracker

    tracker = Tracker(tmp_path, total_steps=100, start_step=40, config={}, name="eta", mode="disabled",
                      show_progress=True, keep_until_step=40)
    opened = tracker.bar.start_t
    assert tracker.bar.postfix == "compiling"
    time.sleep(0.05)  # stands in for compilation
    tracker.advance()
    assert tracker.bar.start_t > opened  # the ETA is measured from the first trained step
    assert tracker.bar.n == 41 and "compiling" not in (tracker.bar.postfix or "")
    tracker.close()
    shown = capsys.readouterr().err
    # a resumed run never shows a count below where it resumed, nor a negative rate
    assert " 0/100" not in shown and "-" not in shown.replace("eta", "")


def test_a_resumed_tracker_merges_into_the_restored_step(tmp_path):
    from scaling.run.track import Tracker

    rows = [{"step": s, "loss": 5.0 - s / 10} for s in range(0, 35, 5)]  # a segment that reached step 30
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3')
    tracker = Tracker(tmp_path, total_steps=40, start_step=20, config={}, name="t", mode="disabled",
                      show_progress=False, keep_until_step=20)
    assert tracker.pending(20) == {"loss": 3.0}
    tracker.log(20, {"eval_loss": 2.5})
    tracker.log(25, {"loss": 2.9})
    tracker.close()
    written = read_metrics(tmp_path)
    assert [r["step"] for r in written] == [0, 5, 10, 15, 20, 25]
    assert written[4] == {"step": 20, "loss": 3.0, "eval_loss": 2.5}


def test_a_resume_killed_before_its_first_write_loses_no_row(tmp_path):
    # The resumed segment holds step 20's row to merge into it; killed before writing it (a SIGKILL while
    # compiling), the next resume must still find that row on disk.
    from scaling.run.track import Tracker

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0 - s / 10}) + "\n"
                                                    for s in range(0, 35, 5)))
    killed = Tracker(tmp_path, total_steps=40, start_step=20, config={}, name="t", mode="disabled",
                     show_progress=False, keep_until_step=20)
    killed.discard_pending()  # dies holding step 20's row, written nowhere since
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 5, 10, 15, 20]
    resumed = Tracker(tmp_path, total_steps=40, start_step=20, config={}, name="t", mode="disabled",
                      show_progress=False, keep_until_step=20)
    assert resumed.pending(20) == {"loss": 3.0}


def test_every_wandb_run_opens_one_way(tmp_path):
    # The trainer's runs and the launcher's sweep run: resumable under our id, files beside the run.
    from scaling.run.track import open_wandb_run

    assert open_wandb_run(tmp_path, mode="disabled", project="p", id="abc123") is None
    run = open_wandb_run(tmp_path, mode="offline", project="p", group="g", name="n", id="abc123", config={"a": 1})
    try:
        assert (run.id, run.group, run.config["a"]) == ("abc123", "g", 1)
        assert list((tmp_path / "wandb").glob("offline-run-*-abc123"))
    finally:
        run.finish()
