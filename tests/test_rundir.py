"""Run directories: one that holds a finished run refuses another config."""

import json
import shutil
import subprocess
import sys

import tiny
from scaling import train


def test_a_finished_run_dir_refuses_another_config(tmp_path, tiny_reference):
    shutil.copytree(tiny_reference[0], tmp_path / "run")  # a finished run of tiny.config()
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(train.to_dict(tiny.config())))
    cli = [sys.executable, "-m", "scaling.train", "--config", str(config_file), "--workdir", "run", "--no-progress"]
    other = subprocess.run(cli + ["--set", "model.depth=2"], cwd=tmp_path, env=tiny.env(), capture_output=True,
                           text=True)
    assert other.returncode == 2
    assert other.stderr.strip().count("\n") == 0 and "holds run" in other.stderr, other.stderr
