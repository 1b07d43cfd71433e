"""Interrupted runs: a SIGKILL then a restart, SIGTERM (preemption) and Ctrl-C, each resumed exactly.

Each interrupted trainer is a process of its own (``tests/pause.py``), paused after it logs a chosen
step so that the signal lands there however fast the machine is.
"""

import dataclasses
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import jax
import numpy as np

import pytest

import helpers
import tiny
from scaling.model import program as program_lib
from scaling.run import train
from scaling.run.stopping import PREEMPTED_EXIT_CODE, Stop
from scaling.store import records
from sweeps import launch


def _wandb_run_ids(run_dir) -> set:
    return {p.name.rsplit("-", 1)[-1] for p in (Path(run_dir) / "wandb").glob("offline-run-*")}


def test_sigkill_then_restart_matches_an_uninterrupted_run(tmp_path):
    config = tiny.config(eval_every=tiny.CHECKPOINT_EVERY, wandb_mode="offline")
    # The reference runs in the same kind of process as the killed run (one CPU device).
    reference_dir = tmp_path / "reference"
    reference_cli = tiny.train_command(dataclasses.replace(config, wandb_mode="disabled"), reference_dir,
                                       tmp_path / "reference.json")
    helpers.run(reference_cli, env=tiny.env(), check=True)
    reference = json.loads((reference_dir / "result.json").read_text())
    # Killed once rows past the checkpoint of step 4 are on disk, so the resume must cut them.
    proc, _ = tiny.paused_run(config, tmp_path / "run", tmp_path, pause_step=6, cwd=tmp_path, stderr=subprocess.STDOUT,
                              start_new_session=True)
    workdir = tmp_path / "run"
    tiny.wait_for(lambda: (workdir / "checkpoints" / "4").exists(), 120, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # like a machine dying: the trainer and its helpers
    proc.wait()
    assert not (workdir / "result.json").exists()
    assert max(tiny.metric_steps(workdir)) > 4 and not (workdir / "checkpoints" / str(tiny.STEPS)).exists()
    restarted = helpers.run(tiny.train_command(config, workdir, tmp_path / "config.json"), env=tiny.env())
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    resumed = json.loads((workdir / "result.json").read_text())
    assert resumed["final_eval_loss"] == reference["final_eval_loss"]  # bitwise on CPU
    step_a, params_a = tiny.final_params(reference_dir)
    step_b, params_b = tiny.final_params(workdir)
    assert step_a == step_b == tiny.STEPS
    jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)
    assert _wandb_run_ids(workdir) == {resumed["wandb_id"]}  # the restart continued the same wandb run
    steps = tiny.metric_steps(workdir)
    assert steps == tiny.metric_steps(reference_dir) and len(steps) == len(set(steps))  # one row per step


def test_sigterm_saves_and_exits_then_resumes(tmp_path):
    config = tiny.config(checkpoint_every=1000, wandb_mode="offline")
    proc, pause = tiny.paused_run(config, tmp_path / "run", tmp_path, pause_step=2, cwd=tmp_path,
                                  stderr=subprocess.STDOUT)
    workdir = tmp_path / "run"
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    pause.unlink()
    out = proc.communicate(timeout=60)[0]
    assert time.time() - sent < 30
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(saved) == 1 and 0 < saved[0] < tiny.STEPS
    wandb_id_before = _wandb_run_ids(workdir)
    assert tiny.run(config, workdir).status == "finished"  # resumed (in this process: no signal involved)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps_logged = [row["step"] for row in rows if "loss" in row]
    # the resumed process starts right after the saved step: no step is logged twice
    assert len(steps_logged) == len(set(steps_logged))
    assert min(s for s in steps_logged if s > saved[0]) == saved[0] + 1
    assert json.loads((workdir / "result.json").read_text())["steps"] == tiny.STEPS
    assert _wandb_run_ids(workdir) == wandb_id_before  # one wandb id across the restart


def test_ctrl_c_stops_like_sigterm_and_a_second_one_exits_at_once(tmp_path):
    config = tiny.config(checkpoint_every=1000)
    proc, pause = tiny.paused_run(config, tmp_path / "run", tmp_path, pause_step=2, cwd=tmp_path,
                                  stderr=subprocess.PIPE)
    workdir = tmp_path / "run"
    proc.send_signal(signal.SIGINT)
    pause.unlink()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    [line] = [line for line in err.splitlines() if "stopped by" in line]
    assert line.startswith("stopped by SIGINT after step ")
    assert line.endswith("checkpoint saved; rerun the same command to resume")  # and how to resume
    record = json.loads((workdir / "result.json").read_text())
    assert record["status"] == "stopped"  # resumable, not failed
    assert record["error"] + "; rerun the same command to resume" == line
    saved = [p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1

    # Two presses: the first asks for a checkpoint, the second exits at once. (Two signals sent back to
    # back reach Python's handler as one, so they are sent from inside, a moment apart.)
    code = textwrap.dedent("""
        import os, signal, time
        from scaling.run.stopping import Stop
        stop = Stop()
        with stop.listening():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            print("asked to stop:", stop.requested, stop.signal, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
            print("still running", flush=True)
    """)
    sent = time.time()
    twice = helpers.run_python(code, env=tiny.env(), timeout=60)
    assert twice.returncode == 130 and time.time() - sent < 25, twice.stderr
    assert twice.stdout == "asked to stop: True SIGINT\n" and "interrupted again: exiting now" in twice.stderr


SWEEP = tiny.sweep_text("two", "depths=(1,), widths={1: (16, 32)}", steps=2, checkpoint_every=2, warmup_steps=1,
                        eval_at_start=False)  # two tiny runs


def test_listening_nests_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    stop = Stop()
    with stop.listening():
        handler = signal.getsignal(signal.SIGTERM)
        with stop.listening():  # as when the launcher's Stop reaches train.run
            assert signal.getsignal(signal.SIGTERM) is handler
        assert signal.getsignal(signal.SIGTERM) is handler and not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("moment", ["final evaluation", "record"])
def test_sigterm_at_the_end_of_a_run_stops_the_launcher_before_the_next_run(tmp_path, monkeypatch, capsys, moment):
    """The run finishes (only its final evaluation or record was left), and no further run starts."""
    sent = []

    def sigterm_first(function):
        def wrapped(*args, **kwargs):
            if not sent:
                sent.append(moment)
                os.kill(os.getpid(), signal.SIGTERM)
            return function(*args, **kwargs)
        return wrapped

    if moment == "final evaluation":
        monkeypatch.setattr(program_lib, "evaluate", sigterm_first(program_lib.evaluate))
    else:
        monkeypatch.setattr(records, "write_record", sigterm_first(records.write_record))
    sweep_file = tmp_path / "two.py"
    sweep_file.write_text(SWEEP)
    code = launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs"), "--no-progress"])
    out = capsys.readouterr().out
    assert sent and code == PREEMPTED_EXIT_CODE, out
    results = [json.loads(path.read_text()) for path in (tmp_path / "runs" / "two").glob("*/result.json")]
    assert [(r["name"], r["status"], r["steps"]) for r in results] == [("L1-d16-s0", "finished", 2)]
    assert "stopping after L1-d16-s0: SIGTERM received" in out
