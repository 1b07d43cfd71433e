"""Interrupted runs: a SIGKILL then a restart, SIGTERM (preemption) and Ctrl-C, each resumed exactly."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from scaling import train
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def small_config(**changes) -> TrainConfig:
    base = TrainConfig(
        model=ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=64),
        data=DataConfig(source="builtin", seq_len=64),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=5),
        steps=20, batch_size=8, eval_every=0, eval_batches=2, checkpoint_every=10, log_every=1,
        wandb_mode="offline", name="test")
    return dataclasses.replace(base, **changes)


def losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return env


def _cli(workdir, config: TrainConfig, *extra) -> list[str]:
    config_path = Path(workdir).parent / (Path(workdir).name + "-config.json")
    config_path.write_text(json.dumps(dataclasses.asdict(config)))
    return [sys.executable, "-m", "scaling.train", "--config", str(config_path), "--workdir", str(workdir),
            "--no-progress", *extra]


def _final_params(run_dir):
    manager = ocp.CheckpointManager(Path(run_dir) / "checkpoints", item_names=("state", "meta"))
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return step, restored["state"]["params"]


def _wait_for(predicate, timeout, proc):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.communicate()[0]}")
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_sigkill_then_restart_matches_an_uninterrupted_run(tmp_path):
    config = small_config(steps=60, log_every=2, eval_every=30, checkpoint_every=30)
    # The reference runs in the same kind of process as the killed run (one CPU device).
    subprocess.run(_cli(tmp_path / "reference", config), cwd=REPO, env=_env(1), check=True, capture_output=True)
    reference = json.loads((tmp_path / "reference" / "result.json").read_text())
    workdir = tmp_path / "killed"
    proc = subprocess.Popen(_cli(workdir, config), cwd=REPO, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    def logged_steps():
        text = (workdir / "metrics.jsonl").read_text() if (workdir / "metrics.jsonl").exists() else ""
        return [json.loads(line)["step"] for line in text.splitlines() if line.endswith("}")]

    # Kill once rows past the checkpoint of step 30 are on disk, so the resume must cut them.
    _wait_for(lambda: (workdir / "checkpoints" / "30").exists() and max(logged_steps(), default=0) >= 36, 240, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # like a machine dying: the trainer and its helpers
    proc.wait()
    assert not (workdir / "result.json").exists()
    assert max(logged_steps()) > 30 and not (workdir / "checkpoints" / "60").exists()
    restarted = subprocess.run(_cli(workdir, config), cwd=REPO, env=_env(1), capture_output=True, text=True)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    resumed = json.loads((workdir / "result.json").read_text())
    assert resumed["final_eval_loss"] == reference["final_eval_loss"]  # bitwise on CPU
    step_a, params_a = _final_params(tmp_path / "reference")
    step_b, params_b = _final_params(workdir)
    assert step_a == step_b == 60
    jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)
    assert _wandb_run_ids(workdir) == {resumed["wandb_id"]}  # the restart continued the same wandb run
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    reference_steps = [json.loads(line)["step"] for line in
                       (tmp_path / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert steps == reference_steps and len(steps) == len(set(steps))  # one row per step, none repeated


def test_sigterm_saves_and_exits_then_resumes(tmp_path):
    config = small_config(steps=400, log_every=5, checkpoint_every=1000)
    workdir = tmp_path / "preempted"
    proc = subprocess.Popen(_cli(workdir, config), cwd=REPO, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = workdir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(losses(workdir)) >= 2, 240, proc)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert time.time() - sent < 30
    assert proc.returncode == train.PREEMPTED_EXIT_CODE, out
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(saved) == 1 and 0 < saved[0] < 400
    wandb_id_before = _wandb_run_ids(workdir)
    finished = subprocess.run(_cli(workdir, small_config(steps=400, log_every=5, checkpoint_every=1000)),
                              cwd=REPO, env=_env(1), capture_output=True, text=True)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_logged = [row["step"] for row in rows if "loss" in row]
    # the resumed process starts right after the saved step: no step is logged twice
    assert len(steps_logged) == len(set(steps_logged))
    assert min(s for s in steps_logged if s > saved[0]) == (saved[0] // 5 + 1) * 5
    assert json.loads((workdir / "result.json").read_text())["steps"] == 400
    assert _wandb_run_ids(workdir) == wandb_id_before  # one wandb id across the restart


def test_ctrl_c_stops_like_sigterm_and_a_second_one_exits_at_once(tmp_path):
    config = small_config(steps=400, log_every=5, checkpoint_every=1000, wandb_mode="disabled")
    workdir = tmp_path / "interrupted"
    proc = subprocess.Popen(_cli(workdir, config), cwd=REPO, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (workdir / "metrics.jsonl").exists() and len(losses(workdir)) >= 2, 240, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == train.PREEMPTED_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    [line] = [line for line in err.splitlines() if "stopped by" in line]
    assert line.startswith("stopped by SIGINT after step ") and line.endswith("checkpoint saved")
    record = json.loads((workdir / "result.json").read_text())
    assert record["status"] == "stopped" and record["error"] == line  # resumable, not failed
    saved = [p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1

    # Two presses: the first asks for a checkpoint, the second exits at once. (Two signals sent back to
    # back reach Python's handler as one, so they are sent from inside, a moment apart.)
    code = textwrap.dedent("""
        import os, signal, time
        from scaling import train
        stop = {"flag": False, "lease": None}
        with train.stop_signals(stop):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            print("asked to stop:", stop["flag"], stop["signal"], flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
            print("still running", flush=True)
    """)
    sent = time.time()
    twice = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(1), capture_output=True, text=True,
                           timeout=60)
    assert twice.returncode == 130 and time.time() - sent < 25, twice.stderr
    assert twice.stdout == "asked to stop: True SIGINT\n" and "interrupted again: exiting now" in twice.stderr


def _wandb_run_ids(run_dir) -> set:
    return {p.name.rsplit("-", 1)[-1] for p in (Path(run_dir) / "wandb").glob("offline-run-*")}
