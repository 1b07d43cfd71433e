"""The pod path end to end, without a cloud: preflight -> SkyPilot task -> hosts -> status -> fit.

1. The preflight of a tiny sweep (``tests/fixtures/pod_path_sweep.py``, 4 runs, ``parallelism="auto"``) for a
   ``v5e:4x4`` slice (v5litepod-16: 4 hosts, each run checked on one host's ``v5e:2x2``), with a ``gs://``
   work directory on the emulator and no local cache: its estimates and choices are kept in the bucket only.
2. ``sweeps.launch sky --dry-run`` builds the job's task with SkyPilot's own parser (region read from the
   bucket, FAILOVER, lock file).
3. The task's ``run`` script runs with bash for each of the slice's 4 hosts, as local processes with the
   variables SkyPilot sets on each (``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_IPS``, ...),
   each with its own home (``~/scaling-venv/bin/python`` is this interpreter) and 4 CPU devices for its chips.
   Host 0 is killed (SIGKILL, a preempted host) in the middle of a run; SkyPilot then kills the other hosts
   too, and FAILOVER relaunches the job where it ran: the run script again on every host.
4. ``status`` from a third process, then ``analysis fit`` and ``analysis curves`` straight from the bucket.

Every run trains exactly once (one record, one metrics row per step), in the mode the preflight chose, with
the preflight's estimate in its record. It needs SkyPilot (the ``cloud`` extra) and libtpu (the ``tpu``
extra); CI runs it in the cloud venv by name (``.ci/run``).
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from gcs_emulator import checkpoint_steps, env_for, metric_steps
from helpers import REPO
from scaling.store import records
from sweeps import launch
from sweeps.preflight import estimate_store
from sweeps.spec import load_sweep

SWEEP = "tests/fixtures/pod_path_sweep.py"
HOSTS = 4  # v5litepod-16: a v5e:4x4 slice, 4 hosts of 2x2 chips
PYTHON = """#!/usr/bin/env bash
# ~/scaling-venv/bin/python of one host: the test's interpreter. With PAUSE_FILE, `-m MODULE ...` runs under
# tests/pause.py, which holds the first run at PAUSE_STEP so that the test can kill the host there.
if [ -n "${{PAUSE_FILE:-}}" ] && [ "$1" = "-m" ]; then
  shift
  exec {python} {pause} "$PAUSE_FILE" "$PAUSE_STEP" "$@"
fi
exec {python} "$@"
"""


def host_env(task, rank: int, home, base: dict, **extra) -> dict:
    """The environment SkyPilot gives the ``run`` of host ``rank``: the task's envs and its own variables."""
    ips = "\n".join(f"10.0.0.{index + 1}" for index in range(HOSTS))
    return {**base, **task.envs, "HOME": str(home), "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NUM_NODES": str(HOSTS), "SKYPILOT_NODE_IPS": ips, "SKYPILOT_TASK_ID": "sky-podpath-1",
            "SKYPILOT_SETUP_NODE_RANK": str(rank), "SKYPILOT_SETUP_NODE_IPS": ips, **extra}


def start_host(task, rank: int, tmp_path, base: dict, attempt: int, **extra) -> subprocess.Popen:
    home = tmp_path / f"host-{rank}"
    python = home / "scaling-venv" / "bin" / "python"
    if not python.exists():
        python.parent.mkdir(parents=True)
        python.write_text(PYTHON.format(python=sys.executable, pause=REPO / "tests" / "pause.py"))
        python.chmod(0o755)
    log = (tmp_path / f"host-{rank}-{attempt}.log").open("w")
    return subprocess.Popen(["bash", "-c", task.run], cwd=REPO, env=host_env(task, rank, home, base, **extra),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def logs(tmp_path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(tmp_path.glob("host-*.log")))


def wait_group(proc: subprocess.Popen, timeout: float = 300.0) -> int:
    """Wait for a host's bash and for every process of its group (a launcher outlives a bash killed by SIGTERM
    while it saves a checkpoint); bash's exit status."""
    code = proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return code
        time.sleep(0.2)
    raise TimeoutError(f"host process group {proc.pid} still alive")


def wait_for(path, procs, tmp_path, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, logs(tmp_path)
        assert procs[0].poll() is None, f"host 0 ended before its pause\n{logs(tmp_path)}"
        time.sleep(0.2)


def preflight_and_task(workdir: str, monkeypatch, capsys):
    """Steps 1 and 2: the preflight's kept file, and the job's ``sky.Task`` as ``sky --dry-run`` built it."""
    from sweeps.cloud import command

    code = launch.main(["preflight", str(REPO / SWEEP), "--topology", "v5e:4x4", "--parallelism", "--jobs", "1",
                        "--compile-cache", "off", "--workdir", workdir])
    assert code == 0, capsys.readouterr()
    kept_file = estimate_store.sweep_file(workdir, "podpath")
    assert f"estimates and choices kept with the sweep: {kept_file}" in capsys.readouterr().out
    built = []
    real_build = command.build_task
    monkeypatch.setattr(command, "build_task", lambda job: built.append(real_build(job)) or built[-1])
    sky_flags = ["sky", str(REPO / SWEEP), "--workdir", workdir, "--accelerator", "v5litepod-16", "--dry-run"]
    assert launch.main(sky_flags) == 0
    out = capsys.readouterr().out
    assert "4 hosts" in out and "recovery: FAILOVER" in out and "dry run: nothing submitted" in out
    assert f"preflight estimates: {kept_file} (kept with the sweep; 4 of 4 runs estimated" in out
    (task,) = built
    assert task.envs["WORKDIR"] == workdir and task.envs["SWEEP"] == SWEEP and task.envs["MODE"] == "host-parallel"
    return kept_file, task


@pytest.mark.slow
def test_the_pod_path_from_preflight_to_fit(gcs, gcs_emulator, tmp_path, monkeypatch, capsys):
    from test_preflight import require_libtpu

    pytest.importorskip("sky")
    require_libtpu()
    monkeypatch.setenv("SCALING_PREFLIGHT_CACHE", "off")  # no laptop cache: the hosts must read the bucket
    workdir = f"{gcs}/sweeps"
    kept_file, task = preflight_and_task(workdir, monkeypatch, capsys)
    assert yaml.safe_load((REPO / "tpu" / "sweep.sky.yaml").read_text())["run"] == task.run

    base = env_for(gcs_emulator.url, tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=4",
                   SCALING_PREFLIGHT_CACHE="off")
    pause = tmp_path / "host-0.paused"
    procs = [start_host(task, rank, tmp_path, base, 0,
                        **({"PAUSE_FILE": str(pause), "PAUSE_STEP": "5"} if rank == 0 else {}))
             for rank in range(HOSTS)]
    try:
        wait_for(pause, procs, tmp_path)
        os.killpg(procs[0].pid, signal.SIGKILL)  # host 0 preempted in the middle of its run
        for proc in procs[1:]:  # SkyPilot then kills the job's other hosts (force: exit 137, no checkpoint saved)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert [wait_group(proc) for proc in procs][0] == -signal.SIGKILL
        # FAILOVER: the job again where it ran, setup and run on every host.
        procs = [start_host(task, rank, tmp_path, base, 1) for rank in range(HOSTS)]
        assert [wait_group(proc, 600) for proc in procs] == [0] * HOSTS, logs(tmp_path)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    runs = load_sweep(str(REPO / SWEEP)).expand().runs
    kept = estimate_store.load(workdir, "podpath", None)
    assert kept.with_sweep and kept.where == kept_file
    for run in runs:
        run_dir = run.run_dir(workdir)
        record = records.read_record(run_dir)
        assert record.status == "finished" and record.steps == 8, (run.name, logs(tmp_path))
        assert metric_steps(run_dir) == list(range(9)), run.name  # trained once: one row per step
        assert 8 in checkpoint_steps(run_dir)
        entry = kept.latest(run.run_id)
        choice = (entry.get("parallelism") or {}).get("choice")
        expected = estimate_store.record_fields(entry, choice)
        assert (record.parallelism or None) == expected.get("parallelism"), run.name  # "" where none was chosen
        assert record.estimated_step_seconds == pytest.approx(expected["estimated_step_seconds"]), run.name
        assert record.estimate_source == expected["estimate_source"], run.name
    assert sum(bool((kept.latest(run.run_id).get("parallelism") or {}).get("choice")) for run in runs) >= 1

    # A third process: the sweep's status, then the analysis, straight from the bucket.
    third = {**base, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "sweeps.launch", "status", SWEEP, "--workdir", workdir], cwd=REPO,
                          env=third, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "4 finished" in done.stdout, done.stdout + done.stderr
    assert f"preflight estimates: {kept_file} (kept with the sweep; 4 of 4 runs estimated" in done.stdout
    sweep_dir = f"{workdir}/podpath"
    done = subprocess.run([sys.executable, "-m", "analysis", "fit", sweep_dir], env=third, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    curves = tmp_path / "curves"
    done = subprocess.run([sys.executable, "-m", "analysis", "curves", sweep_dir, "--out", str(curves)], env=third,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and sorted(curves.glob("*.png")), done.stdout + done.stderr
