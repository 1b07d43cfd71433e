"""``depth-width-train config``: the resolved config of a preset or a run, its ``--set`` keys, and the
trainer's echo of its overrides (scaling/config_cli.py, scaling/train.py)."""

import json
import shutil

import pytest

import tiny
from scaling import train as train_cli
from scaling.config import config_id, from_dict, to_dict, TrainConfig
from scaling.overrides import override


def command(capsys, *argv):
    try:
        status = train_cli.main(list(argv))
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


def test_config_of_a_preset_lists_every_key_with_overrides_applied(capsys):
    status, out, err = command(capsys, "config", "--config", "tiny", "--set", "model.num_heads=2")
    assert status == 0, err
    expected = override(train_cli.PRESETS["tiny"], ["model.num_heads=2"])
    assert f"run id {config_id(expected)}" in out.splitlines()[0]
    values = dict(line.split(" = ") for line in out.splitlines()[1:])
    values = {key.strip(): json.loads(value) for key, value in values.items()}
    assert values["model.num_heads"] == 2 and values["model.depth"] == 2 and values["steps"] == 300
    assert "optim.peak_lr" in values and "data.seq_len" in values  # every key, each set-able
    for key, value in values.items():
        if not isinstance(value, (list, dict)) and value is not None:
            override(expected, [f"{key}={value}"])


def test_config_json_reads_back_as_the_same_config(capsys, tmp_path):
    status, out, _ = command(capsys, "config", "--config", "tiny", "--set", "steps=7", "--json")
    assert status == 0
    assert from_dict(TrainConfig, json.loads(out)) == override(train_cli.PRESETS["tiny"], ["steps=7"])


def test_config_of_a_run_by_its_folder_or_its_name(capsys, tmp_path):
    folder = tmp_path / "smoke" / config_id(tiny.config())
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(to_dict(tiny.config())))
    for path in (folder, tmp_path / "smoke" / "tiny"):
        status, out, err = command(capsys, "config", str(path))
        assert status == 0, err
        assert str(folder) in out.splitlines()[0] and f"run id {config_id(tiny.config())}" in out


@pytest.mark.parametrize("argv, message", [
    (["config"], "give either a RUN_DIR or --config"),
    (["config", "--config", "tiny", "--set", "model.heads=7"], "did you mean model.num_heads"),
    (["config", "--config", "huge"], "not a preset"),
])
def test_config_bad_input_gives_one_line(capsys, argv, message):
    status, out, err = command(capsys, *argv)
    assert status == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def test_the_trainer_echoes_its_overrides_at_start(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALING_MALLOC_TUNING", "0")
    workdir = tmp_path / "run"  # holds another config's run: the trainer stops before training
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(to_dict(override(tiny.config(), ["model.depth=3"]))))
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(to_dict(tiny.config())))
    status, out, _ = command(capsys, "--config", str(config_file), "--workdir", str(workdir), "--no-progress",
                             "--set", "model.depth=4", "--set", "optim.peak_lr=1e-3")
    assert status == 2
    depth = tiny.config().model.depth
    assert f"config {config_file} with model.depth=4 (was {depth}), optim.peak_lr=0.001 (was " in out
