"""Three sweep launchers on one gs:// work directory, killed (SIGKILL) at random moments and restarted.

Issue 41's red-team scenario, kept as a test: whatever moment a launcher dies
at (loading, compiling, mid-step, a checkpoint write or commit under way behind
the loop, the record), every run ends finished exactly once: one record, one
metrics row per step, and the losses of a run never interrupted. Storage is
slowed a little (a delay per request, ``FaultProxy.delay``) so that the
launchers live long enough to be killed inside their runs, and checkpoint
writes are in flight behind the loop (``scaling/store/background_save.py``).
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import tiny
from gcs_emulator import FaultProxy, checkpoint_steps, env_for, keys, metric_steps
from scaling.store import records
from scaling.store.metrics_log import read_metrics
from sweeps import launch

GRID = "depths=(1, 2), widths={1: (16, 32), 2: (16,)}"
# A launcher that polls a run held by another launcher every second (30 s by default): a killed
# holder on this host is seen dead at once, so the test need not wait a whole poll each time.
LAUNCHER = "import sys; from sweeps import busy, launch; busy.POLL_SECONDS = 1.0; sys.exit(launch.main(sys.argv[1:]))"
SEED, KILLS = 41, 5


def _losses(run_dir) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_metrics(run_dir) if "loss" in row}


@pytest.mark.slow
def test_three_launchers_killed_at_random_train_every_run_exactly_once(gcs, gcs_emulator, tmp_path, monkeypatch):
    sweep_file = tiny.write_sweep(tmp_path, "micro", grid=GRID)
    # The reference: the same sweep, one launcher in this process, never interrupted (on one device, as a
    # launcher subprocess trains).
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "reference")]) == 0
    reference = {path.name: path for path in tiny.run_dirs(tmp_path / "reference", "micro")}
    assert len(reference) == 3

    proxy = FaultProxy(gcs_emulator.url)
    proxy.delay = 0.03  # seconds per request: a bucket in another zone
    env = env_for(proxy.url, tmp_path)
    command = [sys.executable, "-c", LAUNCHER, "run", str(sweep_file), "--workdir", f"{gcs}/sweeps"]
    logs = [tmp_path / f"launcher-{i}.log" for i in range(3)]
    outputs = [""] * 3

    def start(i: int) -> subprocess.Popen:
        log = logs[i].open("w")
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    rng, kills = random.Random(SEED), []
    try:
        procs = [start(i) for i in range(3)]
        for _ in range(KILLS):
            time.sleep(rng.uniform(2.0, 6.0))
            alive = [i for i, proc in enumerate(procs) if proc.poll() is None]
            if not alive:
                break
            victim = rng.choice(alive)
            os.killpg(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait()
            outputs[victim] += logs[victim].read_text()
            kills.append(victim)
            procs[victim] = start(victim)  # as a relaunch loop or a recovering cloud job would
        for i, proc in enumerate(procs):
            proc.wait(timeout=600)
            outputs[i] += logs[i].read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        proxy.close()
    assert len(kills) >= 2, outputs  # the launchers were still at work when killed
    assert [proc.returncode for proc in procs] == [0, 0, 0], outputs

    sweep_dir = f"{gcs}/sweeps/micro"
    run_ids = sorted({key.split("/")[0] for key in keys(sweep_dir) if key.endswith("/result.json")})
    assert run_ids == sorted(reference), outputs
    for run_id in run_ids:
        run_dir = f"{sweep_dir}/{run_id}"
        record, expected = records.read_record(run_dir), records.read_record(reference[run_id])
        assert record.status == "finished" and record.steps == tiny.STEPS, (run_id, outputs)
        # (Not counted from the launchers' lines: one that finds the record written between its listing and
        # its train.run reports that record as its own. The rows and the losses below tell.)
        assert metric_steps(run_dir) == list(range(tiny.STEPS + 1)), (run_id, outputs)  # one row per step
        assert record.final_eval_loss == pytest.approx(expected.final_eval_loss, rel=1e-6)
        losses, expected_losses = _losses(run_dir), _losses(reference[run_id])
        assert sorted(losses) == sorted(expected_losses)
        assert [losses[s] for s in sorted(losses)] == pytest.approx([expected_losses[s] for s in sorted(losses)],
                                                                    rel=1e-6)
        assert tiny.STEPS in checkpoint_steps(run_dir) and len(checkpoint_steps(run_dir)) <= 3  # keep_checkpoints
