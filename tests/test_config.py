"""Configs: typed overrides, run ids, and checks across fields."""

import pytest

from scaling.config import ModelConfig, TrainConfig, config_id, override


def test_overrides_are_typed_and_validated():
    config = override(TrainConfig(), ["model.depth=4", "optim.peak_lr=1e-3", "model.scan_layers=false",
                                      "data.paths=a.txt,b.txt"])
    assert config.model.depth == 4 and config.optim.peak_lr == 1e-3 and config.model.scan_layers is False
    assert config.data.paths == ("a.txt", "b.txt")
    with pytest.raises(ValueError, match="depth"):
        override(TrainConfig(), ["model.depth=0"])
    with pytest.raises(ValueError, match="unknown field"):
        override(TrainConfig(), ["model.dpth=3"])


def test_run_id_ignores_presentation_fields_only():
    base = TrainConfig()
    assert config_id(base) == config_id(override(base, ["name=other", "log_every=3", "wandb_mode=disabled"]))
    assert config_id(base) != config_id(override(base, ["seed=1"]))
    assert config_id(base) != config_id(TrainConfig(model=ModelConfig(depth=3)))


def test_train_config_checks_sequence_fits_the_model():
    with pytest.raises(ValueError, match="seq_len"):
        override(TrainConfig(), ["data.seq_len=512"])
