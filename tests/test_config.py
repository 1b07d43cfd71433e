"""Config validation, the JSON round trip, ``--set`` overrides and run ids (``scaling.config``)."""

import dataclasses
import json

import pytest

from helpers import REPO
from scaling.config import (DataConfig, ModelConfig, OptimConfig, PositionEncoding, TrainConfig, choices, config_id,
                            from_dict, to_dict)
from scaling.overrides import override


@pytest.mark.parametrize("field,kwargs", [
    ("depth", {"depth": 0}),
    ("depth", {"depth": 2.5}),
    ("num_heads", {"width": 64, "num_heads": 3}),
    ("head_dim", {"width": 96, "head_dim": 64}),
    ("objective", {"objective": "seq2seq"}),
    ("norm", {"norm": "sandwich"}),
    ("activation", {"activation": "swish"}),
    ("position", {"position": "alibi"}),
    ("attention_scale", {"attention_scale": "cosine"}),
    ("dropout", {"dropout": 1.5}),
    ("remat", {"remat": "sometimes"}),
    ("init_std", {"init_std": float("nan")}),
])
def test_bad_model_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_flash_needs_sequences_in_blocks_of_128():
    base = TrainConfig(model=ModelConfig(max_seq_len=256, attention_impl="flash"), data=DataConfig(seq_len=256))
    assert base.model.attention_impl == "flash"
    with pytest.raises(ValueError, match="data.seq_len"):
        dataclasses.replace(base, data=DataConfig(seq_len=100))
    with pytest.raises(ValueError, match="attention_impl"):
        ModelConfig(attention_impl="splash")


def test_literal_fields_list_their_choices_once():
    assert choices(PositionEncoding) == ("learned", "sinusoidal", "first_indicator", "rope")
    with pytest.raises(ValueError, match="'learned', 'sinusoidal', 'first_indicator' or 'rope'"):
        ModelConfig(position="alibi")



def test_overrides_are_typed_and_validated():
    config = override(TrainConfig(), ["model.depth=4", "optim.peak_lr=1e-3", "model.scan_layers=false",
                                      "data.paths=a.txt,b.txt", "steps=1e3", "model.num_heads=null",
                                      "name=123", "model.use_bias=yes"])
    assert config.model.depth == 4 and config.optim.peak_lr == 1e-3 and config.model.scan_layers is False
    assert config.data.paths == ("a.txt", "b.txt") and config.steps == 1000 and config.model.num_heads is None
    assert config.name == "123" and config.model.use_bias is True


@pytest.mark.parametrize("assignment,message", [
    ("model.depth=0", "model.depth: Input should be greater than 0"),
    ("model.dpth=3", "model.dpth: unknown field"),
    ("steps=10.7", "steps: Input should be a valid integer"),
    ("optim.peak_lr=nan", "optim.peak_lr: Input should be a finite number"),
    ("model.scan_layers=maybe", "model.scan_layers: Input should be a valid boolean"),
    ("model.num_heads=5", "model.num_heads=5 is invalid: allowed a divisor of width=64"),
    ("data.seq_len=512", "data.seq_len=512 is invalid: allowed <= model.max_seq_len=256"),
    ("model=3", "model is a config section"),
    ("model.depth.x=3", "'depth' is not a config section"),
    ("depth", "must look like key=value"),
    ("steps=true", "steps is a number"),  # pydantic alone would read it as 1
    ("optim.peak_lr=false", "optim.peak_lr is a number"),
])
def test_bad_overrides_name_the_field_in_one_line(assignment, message):
    with pytest.raises(ValueError) as error:
        override(TrainConfig(), [assignment])
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("assignment,suggested", [
    ("model.heads=7", "model.num_heads"),
    ("optim.lr=1e-3", "optim.peak_lr"),
    ("modle.depth=3", "model.depth"),
    ("model.dept=3", "model.depth"),
])
def test_a_wrong_key_suggests_the_nearest(assignment, suggested):
    with pytest.raises(ValueError) as error:
        override(TrainConfig(), [assignment])
    assert "did you mean " + suggested in str(error.value) and "\n" not in str(error.value)


def test_a_key_like_none_points_at_the_command_that_lists_them():
    with pytest.raises(ValueError, match="lists every key"):
        override(TrainConfig(), ["zzzz=1"])


def test_json_round_trip_is_exact_and_typed():
    config = override(TrainConfig(), ["model.depth=3", "data.paths=x.txt", "mesh.fsdp=2"])
    assert from_dict(TrainConfig, json.loads(json.dumps(to_dict(config)))) == config
    # JSON has no tuples and writes 1e3 as a float: both come back as the field's type,
    # and an integer in a float field stays a float, so the run id does not move
    loaded = from_dict(TrainConfig, {"steps": 1e3, "optim": {"peak_lr": 1}, "mesh": {"rules": [["batch", ["data"]]]}})
    assert loaded.steps == 1000 and isinstance(loaded.steps, int)
    assert isinstance(loaded.optim.peak_lr, float) and loaded.mesh.rules == (("batch", ("data",)),)
    assert config_id(loaded) == config_id(dataclasses.replace(loaded, optim=OptimConfig(peak_lr=1.0)))
    with pytest.raises(ValueError, match="optim.sgd: unknown field"):
        from_dict(TrainConfig, {"optim": {"sgd": True}})


def test_run_id_ignores_presentation_fields_only():
    base = TrainConfig()
    assert config_id(base) == config_id(override(base, ["name=other", "log_every=3", "wandb_mode=disabled",
                                                        "data.cache_dir=gs://b/tokens", "microbatches=2"]))
    assert config_id(base) != config_id(override(base, ["seed=1"]))
    assert config_id(base) != config_id(TrainConfig(model=ModelConfig(depth=3)))


def test_committed_run_ids_are_stable():
    # Every committed run is filed under, and records, the id of its config: a change to the
    # config classes or the hash that moved one would orphan its results.
    configs = sorted(REPO.glob("results/**/config.json"))
    assert configs, "no committed run records to check against"
    for path in configs:
        config = from_dict(TrainConfig, json.loads(path.read_text()))
        record = json.loads((path.parent / "result.json").read_text())
        assert config_id(config) == path.parent.name == record["run_id"], path
