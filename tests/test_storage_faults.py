"""The faults a bucket brings, against a local Cloud Storage emulator behind a fault-injecting proxy.

Every process here finds storage through ``STORAGE_EMULATOR_HOST`` alone
(``gcs_emulator.emulator_env`` removes what the project derives from it) and runs in an empty local
directory that must stay empty. Faults: a conditional write whose reply is lost, the storage
unreachable for a few seconds, storage that stops answering, SIGTERM during a hung write. Each
trainer pauses at a known step (``tests/pause.py``) while the test breaks the storage.
"""

import signal
import subprocess
import time

import pytest

import tiny
from gcs_emulator import FaultProxy, checkpoint_steps, env_for, keys, metric_steps
from scaling.run.stopping import PREEMPTED_EXIT_CODE
from scaling.store import lease, records


@pytest.fixture
def proxy(gcs_emulator):
    """A fault-injecting proxy in front of the test session's emulator, closed after the test."""
    proxy = FaultProxy(gcs_emulator.url)
    yield proxy
    proxy.close()


def test_a_lease_write_whose_reply_is_lost_is_recognised_as_our_own(gcs, proxy, monkeypatch):
    # The proxy passes the conditional upload to the emulator, which stores it, then drops the reply;
    # google-cloud-storage retries it and gets 412 (the object exists now / its generation moved on).
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)  # read by the lease's storage client
    is_upload = lambda method, path: method == "POST" and "/upload/" in path  # noqa: E731
    run = f"{gcs}/sweep/run"
    proxy.drop_reply(is_upload)
    holder = lease.Lease(run, heartbeat_seconds=3600).acquire()  # create: if_generation_match=0
    assert len(proxy.dropped) == 1 and holder.holder()["token"] == holder.token
    found = holder._store.read(holder.path)
    proxy.drop_reply(is_upload)
    assert holder._store.renew(holder.path, found[1], holder._content())  # renew: the generation read
    assert len(proxy.dropped) == 2 and holder.still_held()
    uploads = [r for r in proxy.requests if is_upload(*r)]
    assert len(uploads) == 4  # each write sent twice: the retry met the precondition failure
    with pytest.raises(lease.RunBusy):  # a write of another process is still refused
        lease.Lease(run).acquire()
    holder.release()
    assert holder._store.read(holder.path) is None


def _paused_behind(proxy: FaultProxy, config, run_dir: str, tmp_path, pause_step: int, stderr, **variables):
    """A trainer process into ``run_dir`` that reaches the storage through ``proxy`` (``variables``: more of
    its environment), paused after it logs ``pause_step``: (process, pause file)."""
    return tiny.paused_run(config, run_dir, tmp_path, pause_step,
                           environment=env_for(proxy.url, tmp_path, **variables), stderr=stderr)


def _written(run_dir: str, steps: list[int]) -> bool:
    """Whether the run's checkpoints are ``steps``, their writes done: periodic checkpoints are written
    behind the loop (scaling/store/background_save.py), and a step's write ends after its commit, when its pending
    folder (scaling/store/leased_commit.py) is removed."""
    return checkpoint_steps(run_dir) == steps and not any(key.startswith("checkpoints-pending/")
                                                         for key in keys(run_dir))


def test_storage_unreachable_for_a_few_seconds_mid_run_is_retried_not_fatal(gcs, proxy, tmp_path):
    # Storage goes away for 3 s mid-run (every connection closed unanswered, as while a server restarts),
    # hitting the metrics objects, checkpoint writes and listings; every client retries.
    # (Restarting fake-gcs-server itself is no test of that: it forgets its resumable upload sessions,
    # which Cloud Storage keeps for a week, so gcsfs's retried chunk meets 404.)
    run_dir = f"{gcs}/outage"
    proc, pause = _paused_behind(proxy, tiny.config(), run_dir, tmp_path, pause_step=5, stderr=subprocess.STDOUT)
    try:
        proxy.unreachable = True
        pause.unlink()  # the rest of the run meets the outage
        time.sleep(3)
        proxy.unreachable = False
        out = proc.communicate(timeout=400)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proxy.refused > 0  # it was trying to reach the storage during the outage
    assert proc.returncode == 0, out[-3000:]
    record = records.read_record(run_dir)
    assert record.status == "finished" and record.steps == tiny.STEPS
    assert metric_steps(run_dir) == list(range(tiny.STEPS + 1))


def _hanging_checkpoints(proxy: FaultProxy, run_dir: str):
    """Make the proxy hold every request for the run's checkpoint objects (JSON API or upload), those being
    written in the holder's pending folder (checkpoints-pending/, scaling/store/leased_commit.py) included."""
    bucket, _, prefix = run_dir[len("gs://"):].partition("/")
    marker = f"{prefix}/checkpoints"

    proxy.hang_when = lambda method, path: marker in path


# A checkpoint every 2 steps: the storage stops answering after step 2's, so step 4's write hangs (in the
# background, while training goes on) and the wait for it (its deadline, or a stop) gives up.
HANGING = dict(checkpoint_every=2)


def test_storage_that_stops_answering_fails_the_checkpoint_in_bounded_time(gcs, proxy, tmp_path):
    limit = 5
    run_dir = f"{gcs}/unreachable"
    proc, pause = _paused_behind(proxy, tiny.config(**HANGING), run_dir, tmp_path, pause_step=3,
                                 stderr=subprocess.PIPE, SCALING_CHECKPOINT_TIMEOUT_SECONDS=str(limit))
    tiny.wait_for(lambda: _written(run_dir, [2]), 120, proc)
    _hanging_checkpoints(proxy, run_dir)
    pause.unlink()
    hung = time.time()
    out, err = proc.communicate(timeout=120)
    assert time.time() - hung < limit + 60  # the limit, the steps to the next checkpoint, the exit
    assert proc.returncode == 1, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("python -m scaling.train: error")]
    assert "Traceback" not in err and len(lines) == 1, err
    # A later write hangs behind the loop (which one depends on where each request meets the hang: a
    # periodic one, or the last step's); the run fails when the loop waits for it, at the end.
    assert lines[0].startswith("python -m scaling.train: error: run failed: WriteAbandoned: checkpoint "), err
    assert f"{run_dir}/checkpoints" in lines[0] and f"not finished after {limit} s" in lines[0]
    assert metric_steps(run_dir) == list(range(tiny.STEPS + 1))  # the hung write never held the loop
    assert records.read_record(run_dir).status == "failed"


def test_sigterm_during_a_hung_checkpoint_write_still_ends_the_run(gcs, proxy, tmp_path):
    run_dir = f"{gcs}/hung"
    proc, pause = _paused_behind(proxy, tiny.config(**HANGING), run_dir, tmp_path, pause_step=3,
                                 stderr=subprocess.PIPE, SCALING_CHECKPOINT_TIMEOUT_SECONDS="3600")
    tiny.wait_for(lambda: _written(run_dir, [2]), 120, proc)
    _hanging_checkpoints(proxy, run_dir)
    pause.unlink()
    tiny.wait_for(lambda: proxy.held > 0, 120, proc)  # the next checkpoint's write is hanging now
    time.sleep(1)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert time.time() - sent < 30
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "stopped by SIGTERM while waiting for a write that storage did not finish" in err
    record = records.read_record(run_dir)
    assert record.status == "stopped" and checkpoint_steps(run_dir) == [2]


def test_sigterm_while_storage_is_unreachable_ends_within_the_grace_period(gcs, proxy, tmp_path):
    # Issue 41, item 1: storage goes away mid-run, then SIGTERM (a preemption gives ~30 s). Every write of
    # the stop (metrics, lease, checkpoint, record) meets the outage and the clients retry for minutes;
    # orbax's close would wait for its write with no limit. The process must end within the grace period.
    grace = 5
    run_dir = f"{gcs}/outage-stop"
    proc, pause = _paused_behind(proxy, tiny.config(), run_dir, tmp_path, pause_step=5, stderr=subprocess.PIPE,
                                 SCALING_STOP_GRACE_SECONDS=str(grace))
    tiny.wait_for(lambda: _written(run_dir, [4]), 120, proc)
    proxy.unreachable = True
    pause.unlink()
    tiny.wait_for(lambda: proxy.refused > 0, 60, proc)  # the run is meeting the outage now
    time.sleep(1)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.time() - sent < grace + 20, err[-3000:]
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    lines = [line for line in err.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith(f"stopped by SIGTERM: not ended within {grace} s of the signal"), err[-3000:]
    proxy.unreachable = False
    assert checkpoint_steps(run_dir) == [4]  # what was complete before the outage is still there


def _objects(run_dir: str) -> dict[str, str]:
    """Object name (relative to ``run_dir``) -> generation, of everything in the run but the holders' own
    pending folders (scaling/store/leased_commit.py), listed afresh."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(run_dir)
    fs.invalidate_cache()
    found = fs.find(root, detail=True)
    return {name[len(root) + 1:]: str(info.get("generation")) for name, info in found.items()
            if not name[len(root) + 1:].startswith("checkpoints-pending/")}


def test_a_paused_holders_in_flight_checkpoint_never_lands_after_it_lost_the_lease(gcs, proxy, tmp_path):
    # Issue 41, item 2: holder A's checkpoint write is in flight (its requests held by the storage) when A is
    # paused (SIGSTOP). B takes the stale lease over and trains the run to the end. Then A's requests go
    # through and A resumes: nothing of A may land among the run's objects, which are B's now.
    run_dir = f"{gcs}/paused-holder"
    proc, pause = _paused_behind(proxy, tiny.config(), run_dir, tmp_path, pause_step=3, stderr=subprocess.PIPE)
    prefix = run_dir[len("gs://"):].partition("/")[2]
    proxy.hang_when = lambda method, path: f"{prefix}/checkpoints" in path  # step 4's write hangs
    pause.unlink()
    tiny.wait_for(lambda: proxy.held > 0, 120, proc)
    proc.send_signal(signal.SIGSTOP)  # A, paused with its write in flight
    try:
        taken = lease.Lease(run_dir, stale_seconds=0).acquire()  # as a launcher that finds A's lease stale
        taken.release()
        finished = tiny.run(tiny.config(), run_dir)  # B: the whole run
        assert finished.status == "finished" and checkpoint_steps(run_dir) == [4, 8]
        before = _objects(run_dir)
        proxy.hang_when = None  # A's held requests reach the storage now
    finally:
        proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "took over this run's lease" in err, err[-3000:]
    after = _objects(run_dir)
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    assert not changed, changed  # no object of the run created, rewritten or removed by A
    assert records.read_record(run_dir) == finished and checkpoint_steps(run_dir) == [4, 8]
    assert metric_steps(run_dir) == list(range(tiny.STEPS + 1))
