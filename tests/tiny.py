"""The one tiny training run that the trainer, checkpoint, lease, launcher and storage tests share.

Compiling dominates the suite's time, and a program's key in the persistent compilation cache
(conftest.py) is its whole HLO: the model's shape, the batch, the optimizer's rates, the schedule (so
the step count) and the seed. So tests that train start from ``config()`` and change only what leaves
the program alone (checkpoint, log and eval cadence, wandb, names, the data's cache directory), and
their sweeps are ``SWEEP_FILE``'s depth-by-width grid; every such program is then compiled once a
session. The key also holds the process's device count: a test process has the 8 fake CPU devices of
conftest.py and a trainer subprocess one, so tests give ``train.run`` one device (``run`` below), and
the two kinds of process compile each program once each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax

import helpers
from helpers import REPO
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig, to_dict
from scaling.run import train
from scaling.store.metrics_log import read_metrics

PAUSE = Path(__file__).resolve().parent / "pause.py"

STEPS = 8
CHECKPOINT_EVERY = 4  # so a finished run holds two checkpoints, 4 and 8


def config(**changes) -> TrainConfig:
    """Depth 1, width 16, 8 sequences of 32 bytes of the built-in corpus, ``STEPS`` steps, no wandb."""
    base = TrainConfig(
        model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=32),
        data=DataConfig(source="builtin", seq_len=32),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=2),
        steps=STEPS, batch_size=8, eval_every=0, eval_batches=1, checkpoint_every=CHECKPOINT_EVERY,
        keep_checkpoints=3, log_every=1, wandb_mode="disabled", name="tiny")
    return dataclasses.replace(base, **changes)


def one_device() -> list:
    """The first of the test process's CPU devices: the device a trainer subprocess has."""
    return jax.devices()[:1]


def run(config: TrainConfig, run_dir, **kwargs):
    """``train.run`` on one device without a progress bar: the run record."""
    return train.run(config, run_dir, show_progress=False, devices=one_device(), **kwargs)


def on_one_device(monkeypatch) -> None:
    """Make ``train.run`` (as the sweep launcher calls it in this process) train on one device."""
    real = train.run
    monkeypatch.setattr(train, "run", lambda *args, **kwargs: real(*args, **{"devices": one_device(), **kwargs}))


def xla_flags(devices: int | None = None) -> str:
    """This process's XLA flags (conftest.py's among them) without a device count, and ``devices``'s."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
             if not flag.startswith("--xla_force_host_platform_device_count")]
    return " ".join(flags + ([f"--xla_force_host_platform_device_count={devices}"] if devices else []))


def env(devices: int | None = None, **extra) -> dict:
    """A trainer or launcher subprocess's environment: CPU (one device unless ``devices``), this checkout,
    the test session's XLA flags, quiet wandb."""
    return helpers.clean_env(**{"JAX_PLATFORMS": "cpu", "WANDB_SILENT": "true", "PYTHONPATH": str(REPO),
                                "XLA_FLAGS": xla_flags(devices), **extra})


def train_command(config: TrainConfig, workdir, config_file: Path, *extra, pause_file=None,
                  pause_step: int = 0) -> list[str]:
    """``python -m scaling.train`` for ``config`` (written to ``config_file``) into ``workdir``; with
    ``pause_file``, the run stops to wait after it logs ``pause_step`` (tests/pause.py)."""
    Path(config_file).write_text(json.dumps(to_dict(config)))
    arguments = ["--config", str(config_file), "--workdir", str(workdir), "--no-progress", *extra]
    if pause_file is None:
        return helpers.module_command("scaling.train", *arguments)
    return paused_command(pause_file, pause_step, "scaling.train", *arguments)


def paused_command(pause_file, when, module: str, *arguments) -> list[str]:
    """``python -m module arguments``, paused once a run logs a step: ``when`` is the step, or
    ``"RUN@STEP"`` for the run whose directory is named RUN (tests/pause.py)."""
    return [sys.executable, str(PAUSE), str(pause_file), str(when), module, *map(str, arguments)]


def paused_run(config: TrainConfig, run_dir, tmp_path, pause_step: int, environment: dict | None = None,
               **popen) -> tuple[subprocess.Popen, Path]:
    """A trainer process for ``config`` into ``run_dir`` (local or gs://), paused after it logs
    ``pause_step``: (process, pause file; delete it to let the run go on). Its config and pause files
    are in ``tmp_path``; ``environment`` defaults to ``env()``; stdout is a text pipe; ``popen``: more of
    ``subprocess.Popen``'s arguments (``cwd``, ``stderr``, ``start_new_session``...)."""
    pause = Path(tmp_path) / "paused"
    command = train_command(config, run_dir, Path(tmp_path) / "config.json", pause_file=pause, pause_step=pause_step)
    proc = subprocess.Popen(command, env=env() if environment is None else environment, stdout=subprocess.PIPE,
                            text=True, **popen)
    wait_for(pause.exists, 300, proc)
    return proc, pause


def final_params(run_dir) -> tuple[int, dict]:
    """The step and the parameters of a run's newest checkpoint (local run directory)."""
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(Path(run_dir) / "checkpoints", item_names=("state", "meta"))
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return step, restored["state"]["params"]


def wait_for(predicate, timeout: float, proc=None, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds or if ``proc`` ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            output = proc.communicate()[0] or ""
            raise AssertionError(f"process ended early: {output[-3000:]}")
        time.sleep(interval)
    raise AssertionError("timed out")


def metric_steps(run_dir) -> list[int]:
    """The step of every row of the run's metrics log (local or gs://)."""
    return [row["step"] for row in read_metrics(run_dir)]


def run_dirs(workdir, sweep: str = "mini") -> list[Path]:
    """The run directories of sweep ``sweep`` under ``workdir`` (local), in name order."""
    return sorted(p for p in (Path(workdir) / sweep).iterdir() if p.is_dir() and p.name != "wandb")


def losses(run_dir) -> list[float]:
    """The training loss of every row that has one."""
    return [row["loss"] for row in read_metrics(run_dir) if "loss" in row]


# A sweep file: ``config()``'s model, data and optimizer over a grid of depths and widths. {...} are
# filled by ``write_sweep``; its defaults give four runs, L1-d16 (``config()`` itself), L1-d32, L2-d16, L2-d32.
SWEEP_FILE = '''"""Test sweep {name}.

    python -m sweeps.launch run {path} --workdir WORKDIR
"""
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep():
    base = TrainConfig(
        model=ModelConfig(head_dim={head_dim}, max_seq_len={seq_len}),
        data=DataConfig(source="builtin", seq_len={seq_len}),
        optim=OptimConfig(warmup_steps={warmup_steps}, {optim}),
        steps={steps}, batch_size=8, eval_every=0, eval_batches=1, eval_at_start={eval_at_start},
        checkpoint_every={checkpoint_every}, keep_checkpoints=3, log_every={log_every}, wandb_mode="{wandb}")
    return Sweep(name="{name}", base=base, {grid}, multiple_of={head_dim})
'''

GRID = "depths=(1, 2), widths={1: (16, 32), 2: (16, 32)}"


def sweep_text(name: str = "mini", grid: str = GRID, path="sweep.py", steps: int = STEPS,
               checkpoint_every: int = CHECKPOINT_EVERY, log_every: int = 1, wandb: str = "disabled",
               optim: str = "peak_lr=3e-3", warmup_steps: int = 2, head_dim: int = 16, seq_len: int = 32,
               eval_at_start: bool = True) -> str:
    """The text of a sweep file (see ``SWEEP_FILE``); widths are multiples of ``head_dim``."""
    return SWEEP_FILE.format(name=name, path=path, grid=grid, steps=steps, checkpoint_every=checkpoint_every,
                             log_every=log_every, wandb=wandb, optim=optim, warmup_steps=warmup_steps,
                             head_dim=head_dim, seq_len=seq_len, eval_at_start=eval_at_start)


def write_sweep(directory, name: str = "mini", grid: str = GRID, **fields) -> Path:
    """Write ``directory/<name>.py``, a sweep file (see ``sweep_text``), and return its path."""
    path = Path(directory) / f"{name}.py"
    path.write_text(sweep_text(name, grid, path, **fields))
    return path
