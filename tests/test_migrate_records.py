"""`python -m scaling.migrate_records`: old run records upgraded in place, once, locally and on gs://."""

import dataclasses
import json

import pytest
from etils import epath

from scaling import migrate_records
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig, config_id, to_dict
from scaling.store import records


def config(seed=0, lr=2e-3) -> TrainConfig:
    return TrainConfig(model=ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=32),
                       data=DataConfig(source="builtin", seq_len=32), optim=OptimConfig(peak_lr=lr, lr_rule="mup"),
                       steps=30, batch_size=8, seed=seed)


def version_1(run_config: TrainConfig, legacy: bool, **changes) -> dict:
    """A version-1 record of ``run_config`` as the trainer of that version wrote it; ``legacy``: one written
    before ``point_id``, ``peak_lr``, ``planned_steps`` and ``schema_version`` existed."""
    data = {"run_id": config_id(run_config), "status": "finished", "depth": 2, "width": 32, "seed": run_config.seed,
            "params_non_embedding": 24576, "lr_rule": run_config.optim.lr_rule, "final_eval_loss": 2.5,
            "steps": 30, "name": "L2-d32", "schema_version": 1,
            "point_id": config_id(dataclasses.replace(run_config, seed=0)), "peak_lr": run_config.optim.peak_lr,
            "planned_steps": run_config.steps}
    if legacy:
        for name in ("point_id", "peak_lr", "planned_steps", "schema_version"):
            del data[name]
    return {**data, **changes}


def write_run(root, run_config: TrainConfig, data: dict, with_config: bool = True) -> epath.Path:
    run_dir = epath.Path(root) / config_id(run_config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "result.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    if with_config:
        (run_dir / "config.json").write_text(json.dumps(to_dict(run_config), indent=2, sort_keys=True))
    return run_dir


def test_a_legacy_record_takes_the_missing_fields_from_its_config_as_the_trainer_computes_them(tmp_path):
    run_config = config(seed=3)
    run_dir = write_run(tmp_path, run_config, version_1(run_config, legacy=True))
    assert migrate_records.main([str(tmp_path)]) == 0
    record = records.read_record(run_dir)
    assert record.schema_version == 2 and record.run_id == config_id(run_config) == run_dir.name
    assert record.point_id == config_id(dataclasses.replace(run_config, seed=0)) != record.run_id
    assert (record.peak_lr, record.lr_rule, record.planned_steps) == (2e-3, "mup", 30)
    assert (record.steps, record.final_eval_loss, record.name) == (30, 2.5, "L2-d32")  # the rest is kept


def test_a_record_with_the_fields_keeps_them_and_only_its_version_changes(tmp_path):
    run_config = config()
    data = version_1(run_config, legacy=False, peak_lr=5e-3)  # a record's own value wins over its config's
    run_dir = write_run(tmp_path, run_config, data, with_config=False)
    assert migrate_records.main([str(tmp_path)]) == 0
    after = json.loads((run_dir / "result.json").read_text())
    assert {k: v for k, v in after.items() if v is not None and v != ""} == {**data, "schema_version": 2,
                                                                            "wall_seconds": 0.0, "tokens": 0, "pack_size": 1}


def test_a_second_run_writes_nothing_and_a_newly_arrived_old_record_is_migrated(tmp_path, capsys):
    first, second = config(seed=0), config(seed=1)
    write_run(tmp_path, first, version_1(first, legacy=True))
    assert migrate_records.main([str(tmp_path)]) == 0
    migrated = tmp_path / config_id(first) / "result.json"
    before = (migrated.read_bytes(), migrated.stat().st_mtime_ns)
    write_run(tmp_path / "later", second, version_1(second, legacy=False))
    capsys.readouterr()
    assert migrate_records.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{tmp_path}: 2 records: 1 migrated to version 2, "
                                                    "1 already current"]
    assert (migrated.read_bytes(), migrated.stat().st_mtime_ns) == before  # not even rewritten
    assert migrate_records.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{tmp_path}: 2 records: 0 migrated to version 2, "
                                                    "2 already current"]


def test_a_record_that_cannot_be_upgraded_is_named_and_the_others_are_migrated(tmp_path, capsys):
    good, orphan = config(seed=0), config(seed=1)
    good_dir = write_run(tmp_path, good, version_1(good, legacy=True))
    orphan_dir = write_run(tmp_path, orphan, version_1(orphan, legacy=True), with_config=False)
    assert migrate_records.main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: {orphan_dir}/result.json: lacks point_id, peak_lr, planned_steps and has "
                                "no config.json beside it to take them from"]
    assert "1 migrated to version 2, 0 already current, 1 failed" in out
    assert records.read_record(good_dir).schema_version == 2
    assert json.loads((orphan_dir / "result.json").read_text()) == version_1(orphan, legacy=True)  # untouched


def test_dry_run_counts_and_writes_nothing(tmp_path, capsys):
    run_config = config()
    run_dir = write_run(tmp_path, run_config, version_1(run_config, legacy=True))
    before = (run_dir / "result.json").read_text()
    assert migrate_records.main([str(tmp_path), "--dry-run"]) == 0
    assert "1 to migrate to version 2" in capsys.readouterr().out
    assert (run_dir / "result.json").read_text() == before
    assert migrate_records.main([str(tmp_path / "empty")]) == 2


def test_records_on_gs_are_migrated_in_place(gcs):
    runs = [config(seed=seed, lr=lr) for seed in (0, 1) for lr in (1e-3, 2e-3)]
    for index, run_config in enumerate(runs):
        write_run(f"{gcs}/sweeps/demo/part{index % 2}", run_config, version_1(run_config, legacy=index == 0))
    counts, problems = migrate_records.migrate(f"{gcs}/sweeps/demo")
    assert (counts, problems) == ({"migrated": 4}, [])
    found = records.find_records(f"{gcs}/sweeps/demo")
    assert all(str(path).startswith(f"{gcs}/sweeps/demo/part") for path in found) and len(found) == 4
    assert {records.read_record(path.parent).point_id for path in found} == {
        config_id(dataclasses.replace(run_config, seed=0)) for run_config in runs}
    assert migrate_records.migrate(f"{gcs}/sweeps/demo") == ({"current": 4}, [])


def test_upgrade_refuses_what_is_not_a_version_1_record():
    with pytest.raises(migrate_records.MigrationError, match="schema_version 7"):
        migrate_records.upgrade({"schema_version": 7}, lambda: None, "r.json")
