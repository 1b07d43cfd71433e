"""The trainer's command line before training starts (scaling/train.py): input it cannot use is one
line and exit 2, at once."""

import huggingface_hub.constants
import pytest

from scaling import train as train_cli
from scaling.config import DataConfig
from scaling.data.corpus import check_hub_reachable

HUB = ["--set", "data.source=hub", "--set", "data.hub_name=wikitext", "--set", "data.hub_config=wikitext-2-raw-v1"]


@pytest.fixture
def unreachable_hub(monkeypatch):
    # Nothing listens on port 1 of this machine: the connection is refused at once, network or none.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:1")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_an_unreachable_hub_dataset_is_one_line_and_exit_2(unreachable_hub, tmp_path, capsys):
    status = train_cli.main(["--config", "tiny", "--workdir", str(tmp_path / "run"), "--no-progress", *HUB])
    err = capsys.readouterr().err
    assert status == 2
    lines = [line for line in err.strip().splitlines() if not line.startswith("config tiny with")]
    assert len(lines) == 1 and "cannot reach the Hugging Face Hub" in lines[0] and "wikitext" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("data, env", [
    (DataConfig(source="hub", hub_name="wikitext", cache_dir="/somewhere/tokens"), {}),  # the hub is not read
    (DataConfig(source="hub", hub_name="wikitext"), {"HF_HUB_OFFLINE": "1"}),  # the local cache is read
    (DataConfig(source="builtin"), {}),
])
def test_no_hub_check_where_the_hub_is_not_needed(unreachable_hub, monkeypatch, data, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    check_hub_reachable(data)


def test_help_names_the_commands_of_a_trained_run_and_describes_the_preset(capsys):
    with pytest.raises(SystemExit):
        train_cli.main(["--help"])
    out = capsys.readouterr().out
    assert "{eval,sample,config,export}" in out.split("\n\n")[0]  # the usage line
    assert "tiny: L=2, d=64" in " ".join(out.split())


def test_errors_carry_the_programs_name_like_every_other_command(capsys, tmp_path):
    assert train_cli.main(["--config", "nope", "--workdir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("python -m scaling.train: error: --config 'nope'")


def test_a_presets_run_is_named_after_its_workdir_unless_named():
    tiny = train_cli.PRESETS["tiny"]
    assert train_cli.named_for_workdir(tiny, "tiny", [], "runs/tiny-deep/").name == "tiny-deep"
    assert train_cli.named_for_workdir(tiny, "tiny", ["name=mine"], "runs/tiny-deep").name == "tiny"
    assert train_cli.named_for_workdir(tiny, "config.json", [], "runs/tiny-deep").name == "tiny"


def test_a_finished_run_ends_with_a_sentence_or_with_json(tiny_reference, tmp_path, capsys, monkeypatch):
    import json
    import shutil

    monkeypatch.setenv("SCALING_MALLOC_TUNING", "0")
    run_dir, record = tiny_reference
    shutil.copytree(run_dir, tmp_path / "run")
    argv = ["--config", str(tmp_path / "run" / "config.json"), "--workdir", str(tmp_path / "run"), "--no-progress"]
    assert train_cli.main(argv) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{record.name}: finished, eval loss {record.final_eval_loss:.4f}, ") and "\n" not in out
    assert str(tmp_path / "run" / "result.json") in out
    assert train_cli.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["final_eval_loss"] == record.final_eval_loss


def test_a_stopped_run_says_how_to_resume(tmp_path, capsys, monkeypatch):
    from scaling.run import train
    from scaling.run.stopping import Preempted

    monkeypatch.setenv("SCALING_MALLOC_TUNING", "0")

    def stopped(*args, **kwargs):
        raise Preempted("stopped by Ctrl-C at step 40 (checkpoint saved)")

    monkeypatch.setattr(train, "run", stopped)
    status = train_cli.main(["--config", "tiny", "--workdir", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 75 and "rerun the same command to resume" in err
