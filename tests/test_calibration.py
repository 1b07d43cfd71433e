"""The calibration path: a preflight's estimate of each run is kept (sweeps/preflight/estimate_store.py), dry-run prices
the sweep with it, the launcher hands it to the trainer, the run record keeps it beside the measured MFU,
and status prints both."""

import contextlib
import io
import json
import types

import pytest

import tiny
from scaling.store import records
from sweeps import launch, preflight
from sweeps.preflight import calibration
from sweeps.preflight import estimate_store
from sweeps.preflight import table as preflight_table
from sweeps.spec import load_sweep
from sweeps.state import RunState

GRID = "depths=(1,), widths={1: (16,)}"  # one run, tiny.config()'s program


def launch_json(*argv) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = launch.main(list(argv))
    return code, json.loads(out.getvalue())


def test_a_real_preflight_estimate_reaches_dry_run_the_record_and_status(tmp_path, capsys, monkeypatch):
    if not preflight.libtpu_installed():
        pytest.skip('needs libtpu, the optional tpu extra: pip install -e ".[tpu]"')
    sweep_file = tiny.write_sweep(tmp_path, "calib", GRID)
    cache, workdir = tmp_path / "preflight-cache", tmp_path / "runs"
    monkeypatch.setenv("HOME", str(tmp_path))  # prices from the shipped table
    code, report = launch_json("preflight", str(sweep_file), "--topology", "v5e:2x2", "--jobs", "1",
                               "--compile-cache", str(cache), "--json", "--workdir", str(workdir))
    assert code == 0
    row, summary = report["runs"][0], report["summary"]
    assert row["fits"] and row["estimated_step_seconds"] > 0 and summary["estimates_kept"] == 1
    # Kept with the sweep, and in this machine's cache as a copy.
    assert summary["estimates_file"] == str(workdir / "calib" / "preflight.json")
    kept = json.loads((workdir / "calib" / "preflight.json").read_text())["runs"]
    assert kept == {load_sweep(str(sweep_file)).expand().runs[0].run_id: json.loads(
        next((cache / "estimates").glob("*.json")).read_text())}
    # Priced over the two estimates' range (the compiler's end only where it gave one).
    low, high = summary["chip_hours_low"], summary["chip_hours_high"] or summary["chip_hours_low"]
    assert summary["cost"]["device"] == "v5e" and summary["cost"]["usd_on_demand"] == pytest.approx(
        [low * 1.20, high * 1.416])
    assert "sweeps/preflight/price_table.py" in summary["price_line"]
    assert summary["price_line"] in preflight_table.format_table(report["runs"], summary).splitlines()

    monkeypatch.setenv("SCALING_PREFLIGHT_CACHE", str(cache))  # where dry-run and run look for estimates
    run = load_sweep(str(sweep_file)).expand().runs[0]
    code, plan = launch_json("dry-run", str(sweep_file), "--workdir", str(workdir), "--json")
    assert plan["preflight_runs"] == 1 and plan["device"] == "v5e"
    assert plan["device_hours"] == pytest.approx(row["estimated_step_seconds"] * run.config.steps * row["chips"] / 3600)
    assert plan["device_hours"] == pytest.approx(summary["chip_hours"])  # the preflight's own chip-hours
    launch.main(["dry-run", str(sweep_file), "--workdir", str(workdir)])
    assert "the preflight's estimated step times" in capsys.readouterr().out

    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == 0
    record = records.read_record(run.run_dir(workdir))
    assert record.status == "finished" and record.mfu > 0
    assert record.estimated_step_seconds == pytest.approx(row["estimated_step_seconds"])
    assert record.estimated_mfu == pytest.approx(row["estimated_mfu"])
    assert "preflight for v5e:2x2" in record.estimate_source and "4 chips" in record.estimate_source
    capsys.readouterr()
    assert launch.main(["status", str(sweep_file), "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert "estimate against measurement" in out
    line = next(line for line in out.splitlines() if line.startswith(run.name) and "%" in line)
    assert f"{row['estimated_mfu']:.1%}" in line and f"{record.mfu:.1%}" in line


def test_estimates_are_kept_per_slice_the_newest_is_read_and_a_run_that_stopped_fitting_loses_it(tmp_path):
    import datetime

    run = types.SimpleNamespace(run_id="abc123")
    row = {"fits": True, "estimated_step_seconds": 0.5, "estimated_mfu": 0.3, "bound": "compute", "chips": 4,
           "topology": "v5e:2x2"}
    first, later = datetime.datetime(2026, 1, 1), datetime.datetime(2026, 2, 1)
    assert estimate_store.save(str(tmp_path), [run], [row], "v5e:2x4", now=first) == 1
    assert estimate_store.save(str(tmp_path), [run], [dict(row, estimated_step_seconds=0.2, topology="v6e:2x2")],
                               "v6e:2x4", now=later) == 1
    assert estimate_store.latest(str(tmp_path), "abc123")["slice"] == "v6e:2x4"
    assert estimate_store.save(str(tmp_path), [run], [dict(row, fits=False)], "v6e:2x4", now=later) == 0
    kept = estimate_store.latest(str(tmp_path), "abc123")
    assert kept["slice"] == "v5e:2x4" and kept["estimated_step_seconds"] == 0.5
    assert estimate_store.device_of(kept) == "v5e"
    fields = estimate_store.record_fields(kept)
    assert fields["estimated_mfu"] == 0.3 and fields["estimate_source"].endswith("2026-01-01")
    assert estimate_store.latest(None, "abc123") is None and estimate_store.latest(str(tmp_path), "other") is None


def test_status_sets_each_estimate_against_the_measurement():
    spec = types.SimpleNamespace(name="L6-d128-s0")
    measured = {"status": "finished", "steps": 100, "train_seconds": 50.0, "mfu": 0.10,
                "estimated_step_seconds": 0.2, "estimated_mfu": 0.25, "estimate_source": "preflight for v5e:2x4"}
    lines = calibration.lines([RunState(spec, "finished", None, measured),
                               RunState(types.SimpleNamespace(name="L6-d192-s0"), "pending", None, None)])
    row = next(line for line in lines if line.startswith("L6-d128-s0")).split()
    assert row == ["L6-d128-s0", "finished", "0.2", "0.5", "25.0%", "10.0%", "0.40"]
    assert lines[-1] == "estimates: preflight for v5e:2x4"
    assert calibration.lines([RunState(spec, "finished", None, {"status": "finished", "mfu": 0.1})]) == []


def test_the_new_record_fields_are_optional_and_checked():
    base = dict(run_id="r", status="running", depth=1, width=16, seed=0, params_non_embedding=3072, point_id="p",
                lr_rule="constant", peak_lr=1e-3, planned_steps=8, schema_version=2)
    record = records.from_dict(base)
    estimate = (record.mfu, record.estimated_step_seconds, record.estimated_mfu, record.estimate_source)
    assert estimate == (None, None, None, "")
    kept = records.from_dict({**base, "mfu": 0.1, "estimated_mfu": 0.3, "estimated_step_seconds": 0.5,
                              "estimate_source": "preflight"})
    assert records.from_dict(json.loads(kept.to_json())) == kept
    for field, value in (("mfu", -0.1), ("estimated_step_seconds", "fast"), ("estimated_mfu", float("nan"))):
        with pytest.raises(records.RecordError, match=field):
            records.from_dict({**base, field: value})
