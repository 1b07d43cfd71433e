"""Run directories: one that holds a finished run refuses another config."""

import json
import os
import subprocess
import sys
from pathlib import Path

from scaling import train
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def tiny(**changes) -> TrainConfig:
    base = TrainConfig(
        model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=32),
        data=DataConfig(source="builtin", seq_len=32),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=2),
        steps=20, batch_size=8, eval_every=0, eval_batches=2, checkpoint_every=5, keep_checkpoints=3,
        log_every=5, wandb_mode="disabled", name="tiny")
    return TrainConfig(**{**base.__dict__, **changes})


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true",
               PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    return env


def test_a_finished_run_dir_refuses_another_config(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(train.to_dict(tiny(steps=4))))
    cli = [sys.executable, "-m", "scaling.train", "--config", str(config_file), "--workdir", "run", "--no-progress"]
    subprocess.run(cli, cwd=tmp_path, env=_env(), check=True, capture_output=True)
    other = subprocess.run(cli + ["--set", "model.depth=2"], cwd=tmp_path, env=_env(), capture_output=True,
                           text=True)
    assert other.returncode == 2
    assert other.stderr.strip().count("\n") == 0 and "holds run" in other.stderr, other.stderr
