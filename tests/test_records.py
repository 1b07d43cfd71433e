"""Run records: one record type, written whole, read back or named when damaged."""

import json
from pathlib import Path

import pytest

import helpers
import tiny
from helpers import REPO
from scaling.store import records


def _env() -> dict:
    env = helpers.with_checkout(JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("XLA_FLAGS", None)
    return env


# ---------------------------------------------------------------------------
# The record type


REQUIRED = dict(run_id="abc", status="finished", depth=2, width=32, seed=0, params_non_embedding=12 * 2 * 32**2,
                point_id="abc0", lr_rule="constant", peak_lr=1e-3, planned_steps=10, final_eval_loss=2.5)


def test_record_round_trip_and_validation(tmp_path):
    record = records.RunRecord(**REQUIRED, wall_seconds=1.5)
    records.write_record(tmp_path, record)
    assert records.read_record(tmp_path) == record
    assert json.loads((tmp_path / "result.json").read_text())["schema_version"] == records.SCHEMA_VERSION == 2
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed, not left behind
    with pytest.raises(ValueError, match="final_eval_loss"):
        record.replace(final_eval_loss=-1.0)
    with pytest.raises(ValueError, match="status"):
        record.replace(status="done")
    assert json.loads(record.replace(status="diverged", final_eval_loss=float("nan")).to_json())[
        "final_eval_loss"] is None


def test_train_seconds_are_optional_and_validated(tmp_path):
    # A record written before train_seconds existed reads as before, the field None; a new one keeps it.
    old = json.loads(records.RunRecord(**REQUIRED, wall_seconds=60.0).to_json())
    del old["train_seconds"]
    assert records.from_dict(old).train_seconds is None
    record = records.RunRecord(**REQUIRED, wall_seconds=60.0, train_seconds=19.0)
    records.write_record(tmp_path, record)
    assert records.read_record(tmp_path).train_seconds == 19.0
    for field, value in (("train_seconds", -1.0), ("train_seconds", "19"), ("wall_seconds", -0.5)):
        with pytest.raises(ValueError, match=f"^{field}="):
            records.RunRecord(**{**REQUIRED, field: value})


def test_committed_records_still_read(tmp_path):
    found = records.find_records(REPO / "results")
    older = [path for path in found if "train_seconds" not in json.loads(path.read_text())]
    assert older  # most committed results were written before train_seconds existed
    for path in found:
        record = records.read_record(path.parent)
        assert (record.train_seconds is None) == (path in older)


@pytest.mark.parametrize("field,value", [("point_id", ""), ("lr_rule", ""), ("peak_lr", 0.0),
                                         ("peak_lr", float("nan")), ("planned_steps", 0), ("planned_steps", 2.5)])
def test_version_2_requires_what_the_analysis_groups_runs_by(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        records.RunRecord(**{**REQUIRED, field: value})
    with pytest.raises(TypeError, match=field):
        records.RunRecord(**{name: v for name, v in REQUIRED.items() if name != field})


@pytest.mark.parametrize("text,reason", [('{"run_id": "a", "sta', "not valid JSON"),
                                         ("[1, 2]", "expected an object"),
                                         ('{"run_id": "a", "schema_version": 2}', "missing"),
                                         ('{"run_id": "a", "status": "finished", "depth": 1, "width": 16, '
                                          '"seed": 0, "params_non_embedding": 3072, "point_id": "a0", '
                                          '"lr_rule": "constant", "peak_lr": 0.001, "planned_steps": 10, '
                                          '"final_eval_loss": -2, "schema_version": 2}', "final_eval_loss"),
                                         ('{"run_id": "a", "schema_version": 3}', "schema_version=3")])
def test_damaged_records_are_named(tmp_path, text, reason):
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(records.RecordError, match=reason) as caught:
        records.read_record(tmp_path)
    assert str(tmp_path / "result.json") in str(caught.value)


@pytest.mark.parametrize("version", [{"schema_version": 1}, {}])  # the earliest records have no version field
def test_a_version_1_record_is_refused_in_one_line_naming_the_migration(tmp_path, version):
    run_dir = tmp_path / "sweep" / "abc"
    run_dir.mkdir(parents=True)
    data = {k: v for k, v in json.loads(records.RunRecord(**REQUIRED).to_json()).items() if k != "schema_version"}
    (run_dir / "result.json").write_text(json.dumps({**data, **version}))
    with pytest.raises(records.OutdatedRecord) as caught:
        records.read_record(run_dir)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and str(run_dir / "result.json") in message
    assert message.endswith(f"python -m scaling.migrate_records {tmp_path / 'sweep'}")
    assert not isinstance(caught.value, records.RecordError)  # not "damaged": a launcher would train it again


def test_launcher_status_on_a_version_1_record_is_one_line_naming_the_migration(tmp_path):
    sweep_file = tiny.write_sweep(tmp_path)
    from sweeps import spec

    run = spec.load_sweep(sweep_file).expand().runs[0]
    run_dir = Path(str(run.run_dir(tmp_path / "runs")))
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"run_id": run.run_id, "status": "finished", "depth": 1,
                                                     "width": 16, "seed": 0, "params_non_embedding": 3072,
                                                     "final_eval_loss": 2.0}))
    done = helpers.run_module("sweeps.launch", "status", sweep_file, "--workdir", tmp_path / "runs", cwd=tmp_path,
                              env=tiny.env(), timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"python -m sweeps.launch status: error: {run_dir}/result.json: "
                                                f"a run record of schema version 1, this code reads 2; upgrade the "
                                                f"records once with: python -m scaling.migrate_records "
                                                f"{run_dir.parent}"]


def test_find_records_lists_every_depth_in_the_callers_form(tmp_path, monkeypatch):
    for folder in ("a", "b/c", "b/c/d"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "result.json").write_text("{}")
    (tmp_path / "b" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert [str(p) for p in records.find_records("b")] == ["b/c/d/result.json", "b/c/result.json"]
    assert records.find_records("missing") == []


def test_records_import_without_jax():
    code = "import sys, scaling.store.records, scaling.store.record_checks, scaling.store.lease; assert 'jax' not in sys.modules, sorted(sys.modules)"
    helpers.run_python(code, env=_env(), check=True)


# ---------------------------------------------------------------------------
# Leases


# ---------------------------------------------------------------------------
# Resume past damage; refuse another config


# ---------------------------------------------------------------------------
# One bad run does not stop the sweep


# ---------------------------------------------------------------------------
# What the user reads


# ---------------------------------------------------------------------------
# Bad input: one line naming the field or argument
