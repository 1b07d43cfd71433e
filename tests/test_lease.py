"""Leases between launchers: live, stale and taken-over holders, on a local disk and on gs://."""

import json
import os
import time

import pytest

import helpers
import tiny
from scaling.run import stopping
from scaling.store import lease, records


def test_a_live_lease_blocks_and_a_stale_one_is_taken_over(tmp_path):
    holder = lease.Lease(tmp_path, heartbeat_seconds=0.05).acquire()
    with pytest.raises(lease.RunBusy, match="pid"):
        lease.Lease(tmp_path).acquire()
    time.sleep(0.3)
    assert (tmp_path / "lease.json").stat().st_mtime > time.time() - 60  # renewed by touching
    holder._stop.set()  # the holder stops renewing, as if hung
    holder._thread.join()
    renewed = (tmp_path / "lease.json").stat().st_mtime
    os.utime(tmp_path / "lease.json", (renewed - 1000, renewed - 1000))  # its last heartbeat, 1000 s ago
    with pytest.raises(lease.RunBusy):  # a lease renewed within stale_seconds is live
        lease.Lease(tmp_path, stale_seconds=2000).acquire()
    successor = lease.Lease(tmp_path, stale_seconds=60, heartbeat_seconds=0.05).acquire()
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == successor.token
    holder._stop.clear()
    holder._start_heartbeat()  # the old holder wakes up and finds the lease is no longer its own
    holder._thread.join(timeout=5)
    assert holder.lost
    holder.release()  # must not delete the successor's lease
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == successor.token
    successor.release()
    assert not (tmp_path / "lease.json").exists()


def test_a_gs_lease_is_taken_and_renewed_under_generation_preconditions(gcs):
    # Against the storage emulator through google-cloud-storage: its generations are the compare-and-swap.
    from google.cloud import storage

    run = f"{gcs}/sweep/run"
    holder = lease.Lease(run, heartbeat_seconds=3600).acquire()
    assert type(holder._store).__name__ == "_GcsStore"
    with pytest.raises(lease.RunBusy):
        lease.Lease(run).acquire()
    bucket = storage.Client().bucket(gcs[len("gs://"):])
    blob = bucket.get_blob("sweep/run/lease.json")  # a blob object stands for one generation
    store = holder._store
    # Compare-and-swap: of two writers holding the same generation, only the first wins.
    assert store.take_over(run, blob.generation, holder._content())
    assert not store.take_over(run, blob.generation, holder._content())
    # A heartbeat 1000 s old is stale: a successor takes over, and the old holder finds out.
    blob = bucket.get_blob("sweep/run/lease.json")
    blob.upload_from_string(json.dumps({**json.loads(blob.download_as_text()), "heartbeat": time.time() - 1000}),
                            if_generation_match=blob.generation)
    successor = lease.Lease(run, heartbeat_seconds=3600).acquire()
    assert json.loads(bucket.get_blob("sweep/run/lease.json").download_as_text())["token"] == successor.token
    assert holder.holder()["token"] == successor.token
    holder.release()  # not its lease any more: left alone
    assert bucket.get_blob("sweep/run/lease.json") is not None
    successor.release()
    assert bucket.get_blob("sweep/run/lease.json") is None


def test_a_holder_that_cannot_renew_gives_up_before_it_could_be_taken_over(tmp_path, monkeypatch):
    holder = lease.Lease(tmp_path, stale_seconds=0.4, heartbeat_seconds=0.05).acquire()

    def unreachable(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(holder._store, "read", unreachable)
    holder._thread.join(timeout=5)  # the heartbeat keeps retrying, then stops after stale_seconds / 2
    assert holder.lost and not holder.still_held()
    monkeypatch.undo()
    holder.release()


def test_a_trainer_whose_lease_was_taken_over_stops_without_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(lease.Lease, "still_held", lambda self: False)  # as if a successor took it
    with pytest.raises(stopping.LeaseLost):
        tiny.run(tiny.config(), tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()
    assert not [p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name[0].isdigit()]
    # the lease is first read before the checkpoint of step 4: nothing is written after that
    assert max(tiny.metric_steps(tmp_path / "run"), default=0) < tiny.CHECKPOINT_EVERY


def test_a_dead_holder_on_this_host_is_stale_at_once(tmp_path):
    dead = helpers.run_python("import os; print(os.getpid())", check=True).stdout.strip()
    import socket
    import time

    def holder(pid):  # a lease renewed just now, by ``pid`` on this host
        (tmp_path / "lease.json").write_text(json.dumps({"host": socket.gethostname(), "pid": pid,
                                                         "token": "x", "heartbeat": time.time()}))

    holder(os.getppid())  # alive (pytest's parent): its fresh lease is respected
    with pytest.raises(lease.RunBusy, match=f"pid {os.getppid()}"):
        lease.Lease(tmp_path).acquire()
    holder(int(dead))  # dead: taken over at once, although its heartbeat is as fresh
    taken = lease.Lease(tmp_path).acquire()
    held = json.loads((tmp_path / "lease.json").read_text())
    assert (held["token"], held["pid"]) == (taken.token, os.getpid())
    taken.release()
    assert not (tmp_path / "lease.json").exists()


def test_two_launchers_on_one_workdir_train_each_run_once(tmp_path):
    sweep = tiny.write_sweep(tmp_path, "mini", "depths=(1, 2), widths={1: (16, 32), 2: (16,)}", wandb="offline")
    command = helpers.module_command("sweeps.launch", "run", sweep, "--workdir", "runs")
    procs = [helpers.start(command, cwd=tmp_path, env=tiny.env(), merge_stderr=True) for _ in range(2)]
    outputs = [done.stdout for done in helpers.finish(procs, timeout=600)]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    dirs = tiny.run_dirs(tmp_path / "runs")
    assert len(dirs) == 3
    for run_dir in dirs:
        record = records.read_record(run_dir)
        assert record.status == "finished" and record.steps == tiny.STEPS
        steps = tiny.metric_steps(run_dir)
        assert steps == sorted(set(steps)) and steps[-1] == tiny.STEPS
        assert not list((run_dir / "checkpoints").glob("*tmp*"))
        assert not (run_dir / "lease.json").exists()
        assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1  # one training, one wandb run
        # Count the trainer's end-of-steps line, not the launcher's result line: a launcher that takes the
        # lease just after the other one finished the run is handed the finished record and reports it too.
        trained_by = [out.count(f"{record.name}: {tiny.STEPS}/{tiny.STEPS} steps") for out in outputs]
        assert sum(trained_by) == 1, outputs  # the other launcher skipped it or found it finished
