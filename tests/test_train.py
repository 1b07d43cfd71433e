"""The trainer: learning, divergence, reruns, classification records, and one-line errors."""

import json
import re
import shutil
import time

import jax
import numpy as np
import pytest

import helpers
import tiny
from scaling import train as train_cli
from scaling.config import DataConfig, MeshConfig, ModelConfig, OptimConfig, TrainConfig, to_dict
from scaling.run import train
from scaling.store import records


def test_eval_loss_falls_by_a_third(tmp_path):
    config = tiny.config(steps=60, eval_batches=4, optim=OptimConfig(peak_lr=1e-2, warmup_steps=2))
    result = tiny.run(config, tmp_path / "run")
    assert result.status == "finished"
    assert result.final_eval_loss < 0.7 * result.initial_eval_loss
    for key in ("depth", "width", "params_non_embedding", "params_total", "final_eval_loss", "tokens", "steps",
                "wall_seconds", "code_version", "data_fingerprint"):
        assert getattr(result, key) not in (None, "")
    assert result.params_non_embedding == 12 * 1 * 16**2
    assert result.tokens == 60 * 8 * 32
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["final_eval_loss"] == result.final_eval_loss
    assert (tmp_path / "run" / "config.json").exists()


def test_training_time_leaves_out_loading_and_compiling_and_the_progress_line_shows_it(tmp_path, capsys,
                                                                                       monkeypatch):
    real_build = train.data.build

    def slow_build(config):  # loading the data takes a second: wall time only
        time.sleep(1.0)
        return real_build(config)

    monkeypatch.setattr(train.data, "build", slow_build)
    result = train.run(tiny.config(), tmp_path / "run", show_progress=True, devices=tiny.one_device())
    assert 0 < result.train_seconds and result.wall_seconds >= result.train_seconds + 1.0
    # stderr is not a terminal here: plain lines, the last one printed when the steps ended
    last = capsys.readouterr().err.strip().splitlines()[-1]
    match = re.search(rf"{tiny.STEPS}/{tiny.STEPS} steps \(100%\), .*?(\d+) s elapsed, .*"
                      r"time of training \(compiling excluded\)$", last)
    assert match, last
    assert abs(int(match.group(1)) - result.train_seconds) <= 0.6  # rounded to whole seconds


def test_absurd_learning_rate_diverges_and_leaves_finite_checkpoints(tmp_path):
    # Warmup lets a few steps pass before the rate explodes, so checkpoints exist before the divergence.
    # (Two layers: the tiny run's one layer stays finite at this rate.)
    config = tiny.config(model=ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=64),
                         data=DataConfig(source="builtin", seq_len=64), steps=30, checkpoint_every=2,
                         optim=OptimConfig(peak_lr=1e5, warmup_steps=10, schedule="constant", grad_clip=0.0,
                                           weight_decay=0.0))
    result = tiny.run(config, tmp_path / "run")
    assert result.status == "diverged"
    assert 2 <= result.steps < 30
    step, params = tiny.final_params(tmp_path / "run")
    assert step >= 2
    assert all(np.isfinite(leaf).all() for leaf in jax.tree_util.tree_leaves(params))
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "diverged"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["diverged"] == 1.0 and rows[-1]["loss"] is None  # strict JSON: no bare NaN


def test_rerun_of_a_finished_run_does_nothing(tmp_path, tiny_reference):
    reference_dir, first = tiny_reference
    shutil.copytree(reference_dir, tmp_path / "run")
    stamp = (tmp_path / "run" / "result.json").stat().st_mtime_ns
    again = tiny.run(tiny.config(), tmp_path / "run")
    assert again == first
    assert (tmp_path / "run" / "result.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("changes,field", [
    ({"batch_size": 6, "mesh": MeshConfig(data=4)}, "batch_size"),
    ({"mesh": MeshConfig(data=3)}, "mesh"),
])
def test_bad_config_fails_before_compiling(tmp_path, eight_devices, changes, field, monkeypatch):
    compiled = []
    from scaling.model import program as program_lib
    monkeypatch.setattr(program_lib, "build", lambda *a, **k: compiled.append(1))
    devices = eight_devices[:4]
    with pytest.raises(ValueError, match=field):
        train.run(tiny.config(**changes), tmp_path / "run", show_progress=False, devices=devices)
    assert not compiled
    record = records.read_record(tmp_path / "run")  # the launcher's status shows why it failed
    assert record.status == "failed" and field in record.error and record.steps == 0


def test_cli_reports_bad_overrides_in_one_line(tmp_path):
    out = helpers.run_module("scaling.train", "--config", "tiny", "--workdir", tmp_path / "x", "--set",
                             "optim.lr_rule=sometimes", env=tiny.env())
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "lr_rule" in out.stderr


def test_classification_record_holds_accuracy_and_bits(tmp_path):
    """FIRST, learnable in a few hundred steps: the record's accuracy and bits are the eval's."""
    config = TrainConfig(
        model=ModelConfig(depth=2, width=16, num_heads=1, max_seq_len=33, objective="masked", norm="post"),
        data=DataConfig(source="first", seq_len=33, synthetic_min_length=8, synthetic_max_length=8,
                        synthetic_eval_min_length=8, synthetic_eval_max_length=8),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=0, weight_decay=0.0),
        steps=300, batch_size=16, eval_every=0, eval_batches=8, checkpoint_every=300, log_every=50,
        wandb_mode="disabled", name="first")
    result = tiny.run(config, tmp_path / "run")
    assert result.status == "finished"
    assert result.final_eval_accuracy > 0.95  # chance is 0.5
    assert result.final_eval_bits == pytest.approx(result.final_eval_loss / np.log(2))
    assert result.final_eval_bits < 0.3  # of at most ~1 bit at chance
    assert result.tokens_per_step == 16 * 9  # rows of 8 bits and CLS, not seq_len
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["final_eval_accuracy"] == result.final_eval_accuracy
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["eval_accuracy"] == result.final_eval_accuracy


def test_language_model_record_has_no_accuracy(tiny_reference):
    reference_dir, result = tiny_reference
    assert result.status == "finished"
    assert result.final_eval_accuracy is None and result.final_eval_bits is None
    assert records.read_record(reference_dir) == result  # as written, not only as returned


@pytest.mark.parametrize("setting, named", [
    ("model.num_heads=abc", "model.num_heads"), ("model=3", "model"), ("steps=1e400", "steps"),
    ("steps=abc", "steps"), ("optim.peak_lr=inf", "optim.peak_lr"), ("steps=10.7", "steps")])
def test_a_bad_override_is_one_line_naming_the_field(setting, named, tmp_path, capsys):
    assert train_cli.main(["--config", "tiny", "--workdir", str(tmp_path / "run"), "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_a_config_file_with_a_fractional_step_count_is_refused(tmp_path, capsys):
    config = to_dict(tiny.config())
    config["steps"] = 10.7
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert train_cli.main(["--config", str(tmp_path / "config.json"), "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "steps" in err and "10.7" in err, err
