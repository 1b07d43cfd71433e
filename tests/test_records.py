"""Run records: one record type, written whole, read back or named when damaged."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaling import records

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true",
               PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    return env


# ---------------------------------------------------------------------------
# The record type


def test_record_round_trip_and_validation(tmp_path):
    record = records.RunRecord(run_id="abc", status="finished", depth=2, width=32, seed=0,
                               params_non_embedding=12 * 2 * 32**2, final_eval_loss=2.5, wall_seconds=1.5)
    records.write_record(tmp_path, record)
    assert records.read_record(tmp_path) == record
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed, not left behind
    with pytest.raises(ValueError, match="final_eval_loss"):
        record.replace(final_eval_loss=-1.0)
    with pytest.raises(ValueError, match="status"):
        record.replace(status="done")
    assert json.loads(record.replace(status="diverged", final_eval_loss=float("nan")).to_json())[
        "final_eval_loss"] is None


@pytest.mark.parametrize("text,reason", [('{"run_id": "a", "sta', "not valid JSON"),
                                         ("[1, 2]", "expected an object"),
                                         ('{"run_id": "a"}', "missing"),
                                         ('{"run_id": "a", "status": "finished", "depth": 1, "width": 16, '
                                          '"seed": 0, "params_non_embedding": 3072, "final_eval_loss": -2}',
                                          "final_eval_loss")])
def test_damaged_records_are_named(tmp_path, text, reason):
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(records.RecordError, match=reason) as caught:
        records.read_record(tmp_path)
    assert str(tmp_path / "result.json") in str(caught.value)


def test_records_import_without_jax():
    code = "import sys, scaling.records, scaling.lease; assert 'jax' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), check=True)


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
