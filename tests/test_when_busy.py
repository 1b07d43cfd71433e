"""A launcher never exits 0 while a run of its share is unfinished because another launcher holds it
(sweeps/busy.py): it waits for the holder to finish, takes the run over once the lease goes stale, or with
``--when-busy exit`` exits 75 naming the run. Before, such a run was skipped and the launcher exited 0, so a
SkyPilot job ended SUCCEEDED with the run untrained."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import tiny
from scaling.run import train
from scaling.run.stopping import PREEMPTED_EXIT_CODE
from sweeps import busy, launch, spec, state
from test_launch import write_record

GRID = "depths=(1,), widths={1: (16,)}"  # one run: tiny.config()'s program, compiled once a session


def one_run(tmp_path, name):
    sweep_file = tiny.write_sweep(tmp_path, name, GRID)
    (run,) = spec.load_sweep(sweep_file).expand().runs
    return sweep_file, run, tmp_path / "runs"


def hold(run, workdir, host: str, pid: int) -> Path:
    """A lease on ``run`` as another launcher's: written now, so its heartbeat is fresh."""
    run_dir = Path(str(run.run_dir(workdir)))
    run_dir.mkdir(parents=True, exist_ok=True)
    lease = run_dir / "lease.json"
    lease.write_text(json.dumps({"host": host, "pid": pid, "token": "theirs", "heartbeat": 0}))
    return lease


def status(run, workdir) -> str:
    return state.read_state(run, workdir).status


def polls(monkeypatch, before_each):
    """Make each poll instant, calling ``before_each(number)`` first (number 0, 1, ...)."""
    real, count = busy.wait_once, [0]

    def wait_once(runs, workdir, stop, say, poll_seconds=None):
        before_each(count[0])
        count[0] += 1
        return real(runs, workdir, stop, say, poll_seconds=0.05)
    monkeypatch.setattr(busy, "wait_once", wait_once)
    return count


def test_exit_75_naming_the_runs_another_launcher_holds(tmp_path, capsys, monkeypatch):
    sweep_file, run, workdir = one_run(tmp_path, "held")
    hold(run, workdir, "elsewhere", 4242)
    monkeypatch.setattr(train, "run", _refuse_training_after_the_lease(train.run))
    code = launch.main(["run", str(sweep_file), "--workdir", str(workdir), "--when-busy", "exit"])
    captured = capsys.readouterr()
    assert code == PREEMPTED_EXIT_CODE, captured.out + captured.err
    assert f"1 run(s) of this share are held by another launcher: {run.name}; exiting 75" in captured.out
    assert status(run, workdir) == "pending"


def test_waits_for_the_holder_to_finish(tmp_path, capsys, monkeypatch):
    sweep_file, run, workdir = one_run(tmp_path, "waited")
    lease = hold(run, workdir, "elsewhere", 4242)
    calls = []
    real = train.run
    monkeypatch.setattr(train, "run", lambda *a, **k: calls.append(a[1]) or real(*a, **k))

    def holder_finishes(number):
        if number == 1:  # the holder is still at it at the first poll, done by the second
            write_record(run, workdir, loss=2.75)
            lease.unlink()
    count = polls(monkeypatch, holder_finishes)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert count[0] == 2 and len(calls) == 2  # tried once at first and once after the first poll: held both times
    assert f"waiting for 1 run(s) held by another launcher: {run.name} by elsewhere pid 4242" in out
    assert f"{run.name}: finished by the launcher that held it" in out
    assert "skipped, another launcher holds it" in out and out.count("skipped, another launcher holds it") == 1
    assert status(run, workdir) == "finished"


def test_takes_the_run_over_when_the_holder_dies(tmp_path, capsys, monkeypatch):
    tiny.on_one_device(monkeypatch)
    sweep_file, run, workdir = one_run(tmp_path, "orphan")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        hold(run, workdir, socket.gethostname(), holder.pid)  # live on this host: busy until it dies

        def holder_dies(number):
            if number == 0:
                holder.kill()
                holder.wait()
        polls(monkeypatch, holder_dies)
        assert launch.main(["run", str(sweep_file), "--workdir", str(workdir), "--no-progress"]) == 0
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out
    assert f"{run.name}: skipped, another launcher holds it" in out
    assert f"{run.name}: finished, eval loss" in out  # trained here, after taking the stale lease over
    assert status(run, workdir) == "finished"
    assert json.loads((Path(str(run.run_dir(workdir))) / "result.json").read_text())["steps"] == tiny.STEPS


def test_a_signal_while_waiting_stops_with_75(tmp_path, capsys, monkeypatch):
    sweep_file, run, workdir = one_run(tmp_path, "stopped")
    hold(run, workdir, "elsewhere", 4242)
    polls(monkeypatch, lambda number: os.kill(os.getpid(), signal.SIGTERM))
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir), "--no-progress"]) == PREEMPTED_EXIT_CODE
    assert "stopped while waiting: SIGTERM received" in capsys.readouterr().out
    assert status(run, workdir) == "pending"


def _refuse_training_after_the_lease(real):
    """``train.run`` that may only find the run busy: training it here would be a test failure."""
    def run(*args, **kwargs):
        from scaling.store import lease

        try:
            real(*args, **kwargs)
        except lease.RunBusy:
            raise
        pytest.fail("trained a run that another launcher holds")
    return run
