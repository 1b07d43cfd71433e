"""A run that starts from another run's weights (``init_from``, ``--init-from``), and a profile of steps
(``loop.Profile``, ``--profile``)."""

import dataclasses
import gzip
import os
import json

import pytest
import tiny

from scaling.config import ModelConfig, config_id
from scaling.run import train
from scaling.run.restore import RunDirError
from scaling.store import records


def test_a_run_continues_another_runs_weights_at_a_new_rate(tmp_path):
    parent = tiny.run(tiny.config(), tmp_path / "parent")
    child_config = dataclasses.replace(tiny.config(), init_from=str(tmp_path / "parent"),
                                       optim=dataclasses.replace(tiny.config().optim, peak_lr=1e-3))
    child = tiny.run(child_config, tmp_path / "child")
    assert child.parent_run_id == parent.run_id and records.read_record(tmp_path / "child").parent_run_id == parent.run_id
    # The child's first evaluation is the parent's last: the same parameters on the same validation set.
    assert child.initial_eval_loss == pytest.approx(parent.final_eval_loss, rel=1e-6)
    assert child.run_id != config_id(dataclasses.replace(child_config, init_from=""))  # a new run
    assert config_id(tiny.config()) == parent.run_id  # ids of configs without a parent are as before
    fresh = tiny.run(dataclasses.replace(child_config, init_from=""), tmp_path / "fresh")
    assert fresh.initial_eval_loss == pytest.approx(parent.initial_eval_loss, rel=1e-6)
    assert fresh.parent_run_id is None


def test_a_parent_of_another_shape_is_refused_in_one_line(tmp_path):
    tiny.run(tiny.config(), tmp_path / "parent")
    wider = tiny.config(model=ModelConfig(depth=1, width=32, head_dim=16, max_seq_len=32),
                        init_from=str(tmp_path / "parent"))
    with pytest.raises(RunDirError, match="differs from this one's in width"):
        tiny.run(wider, tmp_path / "child")


def test_the_command_line_starts_from_a_parent_and_writes_a_profile(tmp_path):
    import helpers

    tiny.run(tiny.config(), tmp_path / "parent")
    config_file = tmp_path / "config.json"
    from scaling.config import to_dict

    config_file.write_text(json.dumps(to_dict(tiny.config())))
    done = helpers.run_module("scaling.train", "--config", config_file, "--workdir", tmp_path / "child",
                              "--init-from", tmp_path / "parent", "--profile", "2:3", "--no-progress",
                              env=tiny.env(devices=1))
    assert done.returncode == 0, done.stderr[-3000:]
    record = records.read_record(tmp_path / "child")
    assert record.parent_run_id == records.read_record(tmp_path / "parent").run_id
    traces = list((tmp_path / "child" / "profile").rglob("perfetto_trace.json.gz"))
    assert len(traces) == 1 and list((tmp_path / "child" / "profile").rglob("*.xplane.pb"))
    assert "train_step" in gzip.decompress(traces[0].read_bytes()).decode(errors="replace")
    assert "profile of steps 2-4" in done.stderr


def test_a_profile_needs_a_start_after_the_compiling_step(tmp_path):
    import helpers

    done = helpers.run_module("scaling.train", "--config", "tiny", "--workdir", tmp_path / "x", "--profile", "0:5")
    assert done.returncode == 2 and "--profile" in done.stderr and "START >= 1" in done.stderr
    with pytest.raises(ValueError, match="steps=0"):
        train.Profile(1, 0, tmp_path)


def test_the_docs_block_continues_a_run_and_profiles_it(tiny_reference, tmp_path):
    """docs/training.md's --init-from and --profile command, as written, on a copy of a trained run at runs/tiny."""
    import re
    import shutil
    import subprocess
    import sys

    from helpers import REPO

    page = (REPO / "docs" / "training.md").read_text()
    block = re.search(r"## Start from another run, and profile steps.*?```bash\n(.*?)```", page, flags=re.S).group(1)
    (command,) = [line for line in block.splitlines() if line.strip()]
    shutil.copytree(tiny_reference[0], tmp_path / "runs" / "tiny")
    done = subprocess.run(command.replace("python3 ", f"{sys.executable} ", 1), shell=True, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**tiny.env(devices=1), "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])})
    assert done.returncode == 0, done.stderr[-3000:]
    assert records.read_record(tmp_path / "runs" / "tiny-cont").parent_run_id == tiny_reference[1].run_id
    assert list((tmp_path / "runs" / "tiny-cont" / "profile").rglob("perfetto_trace.json.gz"))
