"""The trainer's command line before training starts (scaling/train_cli.py): input it cannot use is one
line and exit 2, at once."""

import huggingface_hub.constants
import pytest

from scaling import train_cli
from scaling.config import DataConfig
from scaling.corpus import check_hub_reachable

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
