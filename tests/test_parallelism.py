"""Parallelism per run (sweeps/preflight/parallelism.py): a run's modes (data, fsdp, packed) compiled for a TPU
slice and priced by both estimates, the cheapest that fits chosen, kept with the run's estimate, and trained by
a sweep with ``parallelism="auto"`` (the mesh is no part of the run id)."""

import contextlib
import dataclasses
import io
import json

import pytest

import tiny
from scaling import hardware
from scaling.config import MeshConfig
from scaling.model import budget
from scaling.store import records
from sweeps import launch, preflight, preflight_plan
from sweeps.preflight import estimate_store, parallelism
from sweeps.preflight import table as preflight_table
from sweeps.spec import load_sweep

pytestmark = pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry:UserWarning")
GRID = "depths=(1,), widths={1: (16,)}"  # one run, tiny.config()'s program
PAPER = "sweeps/configs/paper.py"


def mode_row(mode, roofline, compiler, fits=True, pack_size=1, data=-1, fsdp=1) -> dict:
    """A mode's figures as ``parallelism.summary`` gives them (per-run seconds per step)."""
    return {"mode": mode, "mesh": {"data": data, "fsdp": fsdp, "tensor": 1}, "pack_size": pack_size, "chips": 4,
            "fits": fits, "hbm_bytes_per_device": 1 << 20, "flops": 1e9,
            "estimated_step_seconds": None if roofline is None else 0.9 * roofline * pack_size,
            "estimated_mfu": 0.25, "roofline_step_seconds": None if roofline is None else roofline * pack_size,
            "compiler_step_seconds": None if compiler is None else compiler * pack_size,
            "run_roofline_seconds": roofline, "run_compiler_seconds": compiler, "error": None}


def compared(*rows) -> dict:
    chosen = parallelism.choose(list(rows))
    return {"choice": chosen["mode"] if chosen else None, "modes": list(rows)}


# ---------------------------------------------------------------------------
# The choice


def test_the_cheapest_mode_that_fits_is_chosen_by_its_slower_estimate():
    data, fsdp = mode_row("data", 0.030, 0.080), mode_row("fsdp", 0.032, 0.090, data=1, fsdp=-1)
    packed = mode_row("packed", 0.020, 0.060, pack_size=4)
    assert parallelism.choose([data, fsdp, packed])["mode"] == "packed"
    # A cheaper mode that does not fit is never chosen, nor one the roofline could not price.
    assert parallelism.choose([data, fsdp, dict(packed, fits=False)])["mode"] == "data"
    assert parallelism.choose([dict(data, run_roofline_seconds=None), fsdp])["mode"] == "fsdp"
    assert parallelism.choose([dict(data, fits=False), dict(fsdp, fits=False)]) is None
    # Judged by the slower estimate: fast by the roofline but slow by the compiler loses.
    optimistic = mode_row("data", 0.010, 0.200)
    assert parallelism.choose([optimistic, fsdp])["mode"] == "fsdp"
    assert parallelism.run_cost(optimistic) == 0.200
    assert parallelism.run_cost(mode_row("data", 0.010, None)) == 0.010  # the roofline where the compiler gave none
    # A tie goes to the earlier mode.
    assert parallelism.choose([dict(fsdp, run_compiler_seconds=0.08), data])["mode"] == "data"


def test_modes_are_checked_on_construction_naming_the_field():
    assert [(m.name, m.pack_size) for m in parallelism.modes(8)] == [("data", 1), ("fsdp", 1), ("packed", 8)]
    assert [m.pack_size for m in parallelism.modes(8, group_chips=(1, 2, 8))] == [1, 1, 8, 4]
    assert [m.name for m in parallelism.modes(1)] == ["data", "fsdp"]
    for arguments, field in [(("tensor", -1, 1), "name"), (("data", 0, 1), "data"), (("fsdp", 1, -2), "fsdp"),
                             (("data", -1, 1, 2), "pack_size"), (("packed", -1, 1, 1), "pack_size")]:
        with pytest.raises(ValueError, match=f"^{field}="):
            parallelism.Mode(*arguments)
    rules = (("batch", ("data", "fsdp")),)
    assert parallelism.Mode("fsdp", 1, -1).mesh(MeshConfig(data=2, fsdp=1, tensor=2, rules=rules)) == \
        MeshConfig(data=1, fsdp=-1, tensor=1, rules=rules)


def test_planned_mesh_is_the_kept_choice_with_the_configs_rules():
    config = dataclasses.replace(tiny.config(), mesh=MeshConfig(data=1, fsdp=-1, rules=(("batch", "data"),)))
    data, fsdp = mode_row("data", 0.030, 0.080), mode_row("fsdp", 0.032, 0.090, data=1, fsdp=-1)
    packed = mode_row("packed", 0.020, 0.060, pack_size=4)
    entry = {"estimated_step_seconds": 0.03, "parallelism": compared(data, fsdp, packed)}
    assert preflight.planned_mesh(config, entry) == (MeshConfig(data=-1, fsdp=1, rules=(("batch", "data"),)), 4,
                                                     "packed")
    assert preflight.planned_mesh(config, entry, solo=True) == (
        MeshConfig(data=-1, fsdp=1, rules=(("batch", "data"),)), 1, "data")
    cheap_fsdp = {"parallelism": compared(data, dict(fsdp, run_compiler_seconds=0.05, run_roofline_seconds=0.02))}
    assert preflight.planned_mesh(config, cheap_fsdp, solo=True)[0] == config.mesh
    assert preflight.planned_mesh(config, None) is None
    assert preflight.planned_mesh(config, {"estimated_step_seconds": 0.03}) is None  # not compared
    assert preflight.planned_mesh(config, {"parallelism": compared(dict(data, fits=False))}) is None


# ---------------------------------------------------------------------------
# The record


def test_the_record_names_the_mode_the_run_trained_in_and_old_records_read_unchanged():
    packed = mode_row("packed", 0.020, 0.060, pack_size=4)
    entry = {"estimated_step_seconds": 0.03, "estimated_mfu": 0.2, "chips": 4, "topology": "v5e:2x2",
             "slice": "v5e:2x2", "written": "2026-01-01T00:00:00", "parallelism": compared(mode_row("data", 0.03, 0.08),
                                                                                          packed)}
    fields = estimate_store.record_fields(entry, "packed")
    assert fields["parallelism"] == "packed"
    assert fields["estimated_step_seconds"] == packed["estimated_step_seconds"]  # the pack's step, not the base's
    assert "trained packed (4 runs per program)" in fields["estimate_source"]
    assert "parallelism" not in estimate_store.record_fields(entry)  # the sweep's own mesh: as before
    assert estimate_store.record_fields(entry)["estimated_step_seconds"] == 0.03
    with pytest.raises(ValueError, match="mode='fsdp' is invalid"):
        estimate_store.record_fields(entry, "fsdp")

    base = dict(run_id="r", status="running", depth=1, width=16, seed=0, params_non_embedding=3072, point_id="p",
                lr_rule="constant", peak_lr=1e-3, planned_steps=8, schema_version=2)
    assert records.from_dict(base).parallelism == ""
    kept = records.from_dict({**base, **fields})
    assert kept.parallelism == "packed" and records.from_dict(json.loads(kept.to_json())) == kept
    with pytest.raises(records.RecordError, match="parallelism=3 is invalid"):
        records.from_dict({**base, "parallelism": 3})


# ---------------------------------------------------------------------------
# The sweep and the launcher


def test_sweep_parallelism_is_checked_and_the_default_keeps_the_description(tmp_path):
    sweep = load_sweep(tiny.write_sweep(tmp_path, "par_default", GRID))
    assert sweep.parallelism == "pinned" and "parallelism" not in sweep.to_dict()
    auto = dataclasses.replace(sweep, parallelism="auto")
    assert auto.to_dict()["parallelism"] == "auto" and auto.digest() != sweep.digest()
    with pytest.raises(ValueError, match="parallelism='fast' is invalid: allowed one of pinned, auto"):
        dataclasses.replace(sweep, parallelism="fast")
    with pytest.raises(ValueError, match="data_parallel_state_bytes=0 is invalid"):
        dataclasses.replace(sweep, data_parallel_state_bytes=0)


def test_runs_whose_state_fits_train_data_parallel_the_others_keep_the_base_mesh(tmp_path):
    sweep = load_sweep(tiny.write_sweep(tmp_path, "par_rule", "depths=(1,), widths={1: (16, 64)}"))
    sweep = dataclasses.replace(sweep, base=dataclasses.replace(sweep.base, mesh=MeshConfig(data=1, fsdp=-1)))
    small, large = sweep.expand().runs
    threshold = budget.training_state_bytes(small.config.model)
    assert budget.training_state_bytes(large.config.model) > threshold
    ruled = dataclasses.replace(sweep, data_parallel_state_bytes=threshold)
    small_ruled, large_ruled = ruled.expand().runs
    assert small_ruled.config.mesh == MeshConfig(data=-1, fsdp=1) and large_ruled.config.mesh == sweep.base.mesh
    assert [r.run_id for r in ruled.expand().runs] == [small.run_id, large.run_id]


def test_the_training_state_is_four_times_the_parameters_within_a_percent():
    for model in (tiny.config().model, load_sweep(PAPER).expand().runs[0].config.model):
        counted = 16 * budget.count_params(model)["total"]  # float32: parameter, gradient, two moments
        assert 0.99 * counted <= budget.training_state_bytes(model) <= counted
        half = dataclasses.replace(model, param_dtype="bfloat16")
        assert budget.training_state_bytes(half) == pytest.approx(budget.training_state_bytes(model) / 2, abs=8)


def test_a_data_parallel_state_limit_replicates_the_models_that_fit_and_keeps_run_ids():
    limited = load_sweep(PAPER)
    assert limited.parallelism == "auto"  # the paper sweep trains each run as its preflight chose,
    room = hardware.TPU_V5E.hbm_bytes // 4  # and without a choice data-parallel up to this state
    assert limited.data_parallel_state_bytes == room
    sweep = dataclasses.replace(limited, data_parallel_state_bytes=None)
    runs = limited.expand().runs
    for run in runs:
        data_parallel = budget.training_state_bytes(run.config.model) <= room
        assert (run.config.mesh.data, run.config.mesh.fsdp) == ((-1, 1) if data_parallel else (1, -1)), run.name
    by_name = {run.name: run for run in runs}
    assert by_name["L6-d128-s0"].config.mesh.data == -1 and by_name["L48-d1600-s0"].config.mesh.fsdp == -1
    assert sum(run.config.mesh.fsdp == 1 for run in runs) == 3 * 32  # 32 of the 48 shapes, 3 seeds each
    # Without the limit (fsdp on every run, as the sweep was) the run ids are the same: the mesh is no part of them.
    assert {run.config.mesh for run in sweep.expand().runs} == {MeshConfig(data=1, fsdp=-1, tensor=1)}
    assert [run.run_id for run in sweep.expand().runs] == [run.run_id for run in runs]


def keep_choice(cache, run, *rows) -> None:
    """Keep an estimate for ``run`` whose modes are ``rows`` (as a preflight of v5e:2x2 would)."""
    row = {"fits": True, "estimated_step_seconds": 0.5, "estimated_mfu": 0.3, "bound": "compute", "chips": 4,
           "topology": "v5e:2x2", "parallelism": compared(*rows)}
    assert estimate_store.save(str(cache), [run], [row], "v5e:2x2") == 1


def test_an_auto_sweep_trains_the_kept_choice_with_its_run_id_and_a_pinned_one_ignores_it(tmp_path, monkeypatch):
    sweep = load_sweep(tiny.write_sweep(tmp_path, "par_plan", "depths=(1,), widths={1: (16, 32)}"))
    chosen, other = sweep.expand().runs
    monkeypatch.setenv("SCALING_PREFLIGHT_CACHE", str(tmp_path / "cache"))
    fsdp = mode_row("fsdp", 0.02, 0.05, data=1, fsdp=-1)
    packed = mode_row("packed", 0.01, 0.02, pack_size=4)  # the cheapest: a pack of 4, one run per chip
    keep_choice(tmp_path / "cache", chosen, mode_row("data", 0.03, 0.08), fsdp, packed)
    kept = preflight_plan.kept_estimates(None, sweep.name)  # no work directory: this machine's cache
    pinned_specs, pinned_modes, pinned_sizes = preflight_plan.planned_runs(sweep, [chosen, other], kept)
    assert pinned_specs == [chosen, other] and pinned_modes == pinned_sizes == {}
    auto = dataclasses.replace(sweep, parallelism="auto")
    specs, modes, sizes = preflight_plan.planned_runs(auto, [chosen, other], kept)
    assert modes == {chosen.run_id: "packed"} and sizes == {chosen.run_id: 4}
    assert specs[0].config.mesh == MeshConfig(data=-1, fsdp=1) and specs[0].run_id == chosen.run_id
    assert specs[1] == other  # no kept estimate: the sweep's own mesh
    keep_choice(tmp_path / "cache", chosen, mode_row("data", 0.03, 0.08), fsdp)  # no pack compared
    specs, modes, sizes = preflight_plan.planned_runs(auto, [chosen, other], kept)
    assert modes == {chosen.run_id: "fsdp"} and sizes == {}
    assert specs[0].config.mesh == MeshConfig(data=1, fsdp=-1)


def test_an_auto_sweep_whose_choice_is_a_pack_trains_its_runs_packed(tmp_path, monkeypatch):
    sweep_file = tiny.write_sweep(tmp_path, "par_pack", GRID + ', seeds=(0, 1), parallelism="auto"')
    runs = load_sweep(str(sweep_file)).expand().runs
    monkeypatch.setenv("SCALING_PREFLIGHT_CACHE", str(tmp_path / "cache"))
    for run in runs:  # a pack of 2 is each run's cheapest mode
        keep_choice(tmp_path / "cache", run, mode_row("data", 0.03, 0.08), mode_row("packed", 0.01, 0.02, pack_size=2))
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs")]) == 0
    for run in runs:
        record = records.read_record(run.run_dir(tmp_path / "runs"))
        assert (record.status, record.pack_size, record.parallelism) == ("finished", 2, "packed")


def test_an_auto_sweep_records_the_mode_it_trained_in(tmp_path, monkeypatch):
    sweep_file = tiny.write_sweep(tmp_path, "par_run", GRID + ', parallelism="auto"')
    (run,) = load_sweep(str(sweep_file)).expand().runs
    monkeypatch.setenv("SCALING_PREFLIGHT_CACHE", str(tmp_path / "cache"))
    fsdp = mode_row("fsdp", 0.02, 0.05, data=1, fsdp=-1)
    keep_choice(tmp_path / "cache", run, mode_row("data", 0.03, 0.08), fsdp)
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs")]) == 0
    record = records.read_record(run.run_dir(tmp_path / "runs"))
    assert record.status == "finished" and record.run_id == run.run_id
    assert record.parallelism == "fsdp" and record.estimated_step_seconds == pytest.approx(
        fsdp["estimated_step_seconds"])


def test_the_choices_kept_with_the_sweep_reach_a_machine_without_the_cache(gcs, tmp_path, capsys, monkeypatch):
    """As on a pod's host: no preflight cache on this machine, the estimates and choices in the bucket."""
    sweep_file = tiny.write_sweep(tmp_path, "par_gs", GRID + ', parallelism="auto"')
    (run,) = load_sweep(str(sweep_file)).expand().runs
    workdir = f"{gcs}/sweeps"
    fsdp = mode_row("fsdp", 0.02, 0.05, data=1, fsdp=-1)
    row = {"fits": True, "estimated_step_seconds": 0.5, "estimated_mfu": 0.3, "bound": "compute", "chips": 4,
           "topology": "v5e:2x2", "parallelism": compared(mode_row("data", 0.03, 0.08), fsdp)}
    kept_file = estimate_store.sweep_file(workdir, "par_gs")
    assert kept_file == f"{workdir}/par_gs/preflight.json"
    assert estimate_store.save(None, [run], [row], "v5e:2x2", sweep_file=kept_file) == 1  # the preflight's save
    monkeypatch.setenv("SCALING_PREFLIGHT_CACHE", "off")  # nothing on this machine
    capsys.readouterr()
    for command in ("dry-run", "status"):
        assert launch.main([command, str(sweep_file), "--workdir", workdir]) == 0
        assert (f"preflight estimates: {kept_file} (kept with the sweep; 1 of 1 runs estimated, parallelism chosen "
                "for 1)") in capsys.readouterr().out, command
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", str(sweep_file), "--workdir", workdir, "--no-progress"]) == 0
    record = records.read_record(run.run_dir(workdir))
    assert record.status == "finished" and record.parallelism == "fsdp"
    assert record.estimated_step_seconds == pytest.approx(fsdp["estimated_step_seconds"])
    assert launch.main(["dry-run", str(sweep_file), "--workdir", f"{gcs}/elsewhere"]) == 0
    assert "preflight estimates: none" in capsys.readouterr().out  # another work directory, no cache


def test_a_damaged_kept_file_is_one_line_naming_it(tmp_path):
    sweep_file = tiny.write_sweep(tmp_path, "par_bad", GRID)
    (tmp_path / "runs" / "par_bad").mkdir(parents=True)
    (tmp_path / "runs" / "par_bad" / "preflight.json").write_text("{not json")
    assert launch.main(["status", str(sweep_file), "--workdir", str(tmp_path / "runs")]) == 2


# ---------------------------------------------------------------------------
# Compiled for a TPU slice (libtpu on this CPU)


def test_the_preflight_compiles_and_prices_each_mode_a_packed_one_included(tmp_path, monkeypatch):
    from test_preflight import require_libtpu

    require_libtpu()
    sweep_file = tiny.write_sweep(tmp_path, "par_tpu", GRID + ', parallelism="auto"')
    cache = tmp_path / "preflight-cache"
    monkeypatch.setenv("HOME", str(tmp_path))  # prices from the shipped table
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = launch.main(["preflight", str(sweep_file), "--topology", "v5e:2x2", "--jobs", "1",
                            "--compile-cache", str(cache), "--json", "--parallelism"])
    assert code == 0
    report = json.loads(out.getvalue())
    row = report["runs"][0]
    modes = {mode["mode"]: mode for mode in row["parallelism"]["modes"]}
    assert list(modes) == ["data", "fsdp", "packed"] and modes["packed"]["pack_size"] == 4
    for mode in modes.values():
        assert mode["fits"] and mode["error"] is None, mode
        assert mode["run_roofline_seconds"] > 0 and mode["run_compiler_seconds"] > 0
    # Each chip trains a whole run of the pack: about 4x the FLOPs of a quarter of one run's batch (data mode).
    assert 3.0 < modes["packed"]["flops"] / modes["data"]["flops"] < 5.0
    packed = modes["packed"]
    assert packed["run_roofline_seconds"] == pytest.approx(packed["roofline_step_seconds"] / 4)
    best = min((mode for mode in modes.values()), key=lambda mode: (parallelism.run_cost(mode),
                                                                    parallelism.MODES.index(mode["mode"])))
    assert row["parallelism"]["choice"] == best["mode"]
    assert "parallelism" in preflight_table.format_table(report["runs"], report["summary"]).splitlines()[0]
    # The choice is kept with the run's estimate, where the launcher finds it.
    (run,) = load_sweep(str(sweep_file)).expand().runs
    kept = estimate_store.latest(str(cache), run.run_id)
    assert preflight.planned_mesh(run.config, kept)[2] == best["mode"]
    # Without --parallelism the preflight compiles the run as the sweep gives it and compares nothing.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert launch.main(["preflight", str(sweep_file), "--topology", "v5e:2x2", "--jobs", "1",
                            "--compile-cache", str(cache), "--json"]) == 0
    assert not json.loads(out.getvalue())["runs"][0].get("parallelism")
