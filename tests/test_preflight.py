"""The TPU preflight: real ahead-of-time compilation for a TPU slice, on this CPU machine.

These tests need libtpu (``pip install -e ".[tpu]"``). Without it they are
skipped with that reason; CI installs it and sets ``SCALING_REQUIRE_LIBTPU=1``
so that there a missing libtpu fails instead of skipping. Nothing is allocated: the oversized runs are
rejected by the TPU compiler in about a second.
"""

import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os

import pytest

from scaling.config import DataConfig, MeshConfig, ModelConfig, TrainConfig
from scaling.hardware import GIB
from scaling.model import budget
from sweeps import launch, preflight
from sweeps.preflight import command as command_lib, report as report_lib, topology as topology_lib
from sweeps.spec import Sweep

# The suite shares one persistent compilation cache (tests/conftest.py). JAX cannot load a
# TPU executable that was compiled ahead of time, without a TPU attached, back from that
# cache: it says so in a warning and compiles again, so the results are unaffected.
pytestmark = pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry:UserWarning")

TOPOLOGY = "v5e:2x2"  # 4 chips of 16 GiB


def small(depth=3, width=64, batch_size=8) -> TrainConfig:
    return TrainConfig(model=ModelConfig(depth=depth, width=width, head_dim=16, max_seq_len=64),
                       data=DataConfig(seq_len=64), batch_size=batch_size)


def oversized(remat="none", batch_size=64, mesh=MeshConfig(), depth=48, width=8192) -> TrainConfig:
    return TrainConfig(model=ModelConfig(depth=depth, width=width, head_dim=128, max_seq_len=512,
                                         compute_dtype="bfloat16", remat=remat),
                       data=DataConfig(seq_len=512), batch_size=batch_size, mesh=mesh)


def require_libtpu():
    """Skip without libtpu, except in CI, which installs the extra and sets SCALING_REQUIRE_LIBTPU=1."""
    if not preflight.libtpu_installed():
        message = 'needs libtpu, the optional tpu extra: pip install -e ".[tpu]"'
        if os.environ.get("SCALING_REQUIRE_LIBTPU") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def devices():
    require_libtpu()
    return preflight.topology_devices(preflight.parse_topology(TOPOLOGY))


def check(name, config, devices):
    return preflight.check_run(name, config, preflight.parse_topology(TOPOLOGY), devices)


def test_libtpu_is_found_where_it_is_required():
    # The preflight's check agrees with what pip installed, whether or not the tpu extra is here...
    try:
        importlib.metadata.distribution("libtpu")
        installed = True
    except importlib.metadata.PackageNotFoundError:
        installed = False
    assert preflight.libtpu_installed() == installed
    require_libtpu()  # ...fails in CI if the tpu extra did not install libtpu...
    # ...and what it found is a TPU compiler: it lays out the chips of a slice.
    found = preflight.topology_devices(preflight.parse_topology(TOPOLOGY))
    assert len(found) == 4 and {device.platform for device in found} == {"tpu"}


@pytest.mark.parametrize("name, chips, kind", [
    ("v5e:2x2", 4, "TPU v5 lite"), ("v5e:4x4", 16, "TPU v5 lite"), ("v4:2x2x4", 16, "TPU v4"),
    ("v5p:2x2x2", 8, "TPU v5"), ("v6e:4x4", 16, "TPU v6 lite"),
    ("v4:2x2x1", 4, "TPU v4"), ("v5p:2x2x1", 4, "TPU v5")])  # one host of the 3-D families
def test_topologies_give_one_device_per_chip(devices, name, chips, kind):
    topology = preflight.parse_topology(name)
    found = preflight.topology_devices(topology)
    assert topology.chips == chips and len(found) == chips
    assert {device.device_kind for device in found} == {kind}


@pytest.mark.parametrize("bad", ["v9:4x4", "v5e", "v5e:4x4x4", "v4:2x2", "v5e:0x4", "v5e:axb"])
def test_bad_topology_names_are_rejected(bad):
    with pytest.raises(ValueError, match="--topology"):
        preflight.parse_topology(bad)


@pytest.mark.parametrize("bad, allowed", [
    ("v5e:3x3", "1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"), ("v5e:1x3", "16x16"), ("v5e:4x2", "2x4"),
    ("v5e:32x32", "16x16"), ("v6e:2x8", "8x16"), ("v4:3x3x3", "multiples of 4"), ("v4:8x4x4", "A <= B <= C"),
    ("v4:2x2x3", "2x4x4"), ("v4:16x16x32", "4096 chips"), ("v5p:16x16x32", "6144 chips")])
def test_a_grid_that_is_no_slice_of_its_generation_is_refused(bad, allowed):
    # Checked before anything is compiled: no libtpu needed, so these run on every machine.
    with pytest.raises(ValueError) as raised:
        preflight.parse_topology(bad)
    message = str(raised.value)
    assert "\n" not in message and repr(bad) in message and "has no" in message and allowed in message


@pytest.mark.parametrize("good", ["v5e:1x1", "v5e:2x4", "v5e:16x16", "v6e:8x16", "v4:2x2x1", "v4:2x4x4",
                                  "v4:4x4x4", "v4:4x4x12", "v4:16x16x16", "v5p:2x2x4", "v5p:16x16x24"])
def test_every_documented_slice_shape_is_accepted(good):
    assert preflight.parse_topology(good).name == good


def test_every_generation_with_chip_facts_has_slice_shapes():
    for generation in preflight.CHIPS:
        assert topology_lib.allowed_shapes(generation)
        dims = preflight.CHIPS[generation].tpu.dims
        assert topology_lib.is_slice_shape(generation, (1, 1) if dims == 2 else (2, 2, 1))


@pytest.fixture(scope="module")
def small_row(devices):
    return check("small", small(), devices)


def test_small_run_passes_with_memory_and_whole_step_flops(small_row):
    row, config = small_row, small()
    assert row["status"] == "PASS" and row["fits"] is True, row
    assert 0 < row["hbm_bytes_per_device"] < 0.1 * row["hbm_capacity_bytes"]
    assert row["hbm_capacity_bytes"] == 16 * GIB
    assert row["argument_bytes"] > 0 and row["compile_seconds"] > 0
    # FLOPs are per chip and cover every layer, although the layers are one
    # scanned loop body: at least the 6·N·tokens of the layers' matmuls, at
    # most twice everything a forward + backward can do.
    model = config.model
    tokens = config.batch_size * config.data.seq_len
    layer_flops = 6 * budget.non_embedding_params(model.depth, model.width) * tokens
    everything = layer_flops + 6 * 2 * model.vocab_size * model.width * tokens \
        + 12 * model.depth * config.data.seq_len * model.width * tokens
    assert layer_flops / 4 <= row["flops"] <= 2 * everything / 4
    assert row["estimated_step_seconds"] > 0
    assert 0 < row["estimated_mfu"] <= row["mfu_upper_bound"] <= 1
    # The scanned layers forward and backward, all counted from their TPU loop conditions.
    assert row["loops_counted"] >= 2 and row["loops_uncounted"] == 0 and row["kernels_uncounted"] == []


def test_scanned_costs_match_an_unrolled_compile(small_row, devices):
    # The compiler counts a loop body once; the preflight's correction must
    # give what the same model compiled layer by layer gives.
    scanned = small()
    unrolled = dataclasses.replace(scanned, model=dataclasses.replace(scanned.model, scan_layers=False))
    whole = check("unrolled", unrolled, devices)
    assert small_row["flops"] == pytest.approx(whole["flops"], rel=0.01)
    assert small_row["collective_bytes"] == pytest.approx(whole["collective_bytes"], rel=0.05)
    assert small_row["collective_bytes"] > 0  # data parallel over 4 chips: the gradients are all-reduced
    assert small_row["bound"] in ("compute", "memory", "collectives")


def test_sliced_loss_costs_count_every_slice(devices, monkeypatch):
    # 2 rows per chip, 64 tokens a slice: 2 slices of 32 positions. The compiler
    # counts the slice loop's body once; counted by its trip count, the step
    # costs what one unsliced loss costs, plus the slices' logits recomputed in
    # the backward pass (a forward unembedding).
    base = small(batch_size=8)
    base = dataclasses.replace(base, model=dataclasses.replace(base.model, loss_impl="chunked"))
    sliced = dataclasses.replace(base, model=dataclasses.replace(base.model, loss_chunk_tokens=64))
    whole = check("whole", base, devices)
    corrected = check("sliced", sliced, devices)
    assert corrected["loops_counted"] == whole["loops_counted"] + 2  # the slice loop, forward and backward
    assert whole["flops"] <= corrected["flops"] <= 1.08 * whole["flops"]
    # The fused loss's vocabulary blocks are loops inside the slice loop: every block of every slice counts.
    from scaling.model import fused_loss

    monkeypatch.setattr(fused_loss, "VOCAB_BLOCK", 128)  # the 384 padded byte ids in 3 blocks
    fused = check("fused", dataclasses.replace(sliced, model=dataclasses.replace(sliced.model, loss_impl="fused")),
                  devices)
    assert fused["loops_uncounted"] == 0 and fused["loops_counted"] == whole["loops_counted"] + 4
    assert whole["flops"] <= fused["flops"] <= 1.08 * whole["flops"]


def test_flash_attention_compiles_for_tpu_and_its_kernels_are_counted(devices):
    # Splash attention is a Pallas kernel: a custom call the compiler gives no cost, priced analytically.
    base = TrainConfig(model=ModelConfig(depth=2, width=128, head_dim=64, max_seq_len=128, compute_dtype="bfloat16"),
                       data=DataConfig(seq_len=128), batch_size=8)
    flash = dataclasses.replace(base, model=dataclasses.replace(base.model, attention_impl="flash"))
    xla_row, flash_row = check("xla", base, devices), check("flash", flash, devices)
    assert flash_row["status"] == "PASS" and flash_row["kernels_uncounted"] == []
    assert set(flash_row["kernels_analytic"]) == {"splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"}
    # One 128-block: the kernel computes every score, as XLA does; the same FLOPs within the softmax's share.
    assert flash_row["flops"] == pytest.approx(xla_row["flops"], rel=0.1)


@pytest.mark.parametrize("attention_impl", ["xla", "flash"])
def test_llama_block_compiles_for_tpu_with_fsdp_and_its_flops_are_counted(devices, attention_impl):
    config = TrainConfig(model=ModelConfig(depth=2, width=128, head_dim=64, max_seq_len=128, block="llama",
                                           compute_dtype="bfloat16", attention_impl=attention_impl, remat="dots"),
                         data=DataConfig(seq_len=128), batch_size=8, mesh=MeshConfig(data=1, fsdp=-1))
    row = check(f"llama-{attention_impl}", config, devices)
    assert row["status"] == "PASS" and row["loops_uncounted"] == 0 and row["kernels_uncounted"] == [], row
    tokens = config.batch_size * config.data.seq_len
    layer_flops = 6 * budget.count_params(config.model)["non_embedding"] * tokens
    assert layer_flops / 4 <= row["flops"], row  # at least the layers' matrix products, per chip


def test_oversized_run_without_fsdp_does_not_fit(devices):
    row = check("huge", oversized(), devices)
    assert row["fits"] is False and row["status"] == "FAIL"
    assert row["hbm_bytes_per_device"] > row["hbm_capacity_bytes"]
    # 12·48·8192² parameters, float32, plus two AdamW moments, replicated on each chip:
    assert row["argument_bytes"] >= 3 * 4 * budget.non_embedding_params(48, 8192)
    assert "mesh.fsdp=4" in row["suggestion"]


def test_state_left_whole_by_an_fsdp_that_does_not_divide_the_width(devices):
    # fsdp=4 cannot split width 8190 (= 65 heads of 126), so the state stays
    # whole on every chip; the fix is the fsdp size that does divide it.
    config = dataclasses.replace(oversized(mesh=MeshConfig(data=1, fsdp=4)),
                                 model=dataclasses.replace(oversized().model, width=8190, head_dim=126))
    row = check("unsharded", config, devices)
    assert row["fits"] is False
    assert "does not divide width 8190" in row["suggestion"] and "mesh.fsdp=2 mesh.data=2" in row["suggestion"]


def test_activation_bound_run_is_told_to_remat_then_to_shrink_the_batch(devices):
    plain = check("acts", oversized(depth=2, width=1024, batch_size=1024), devices)
    assert plain["fits"] is False
    assert plain["temporary_bytes"] > plain["argument_bytes"]
    assert "model.remat=full" in plain["suggestion"] and "fsdp" not in plain["suggestion"]
    rematted = check("acts-remat", oversized(depth=2, width=1024, batch_size=4096, remat="full"), devices)
    assert rematted["fits"] is False
    assert "per-chip batch (1024 sequences now" in rematted["suggestion"]


def test_a_run_that_cannot_be_built_is_a_fail_row_not_a_crash(devices):
    row = check("odd-batch", small(batch_size=6), devices)
    assert row["status"] == "FAIL" and row["fits"] is False
    assert "batch_size=6" in row["error"]


SWEEP_FILE = '''
from scaling.config import DataConfig, MeshConfig, ModelConfig, TrainConfig
from sweeps.spec import Sweep

def sweep():
    base = TrainConfig(model=ModelConfig(head_dim=16, max_seq_len=64), data=DataConfig(seq_len=64),
                       batch_size=8, mesh=MeshConfig(data=1, fsdp=-1))
    return Sweep(name="pf", base=base, depths={depths}, widths={widths})
'''


def write_sweep(tmp_path, depths, widths):
    path = tmp_path / "sweep.py"
    path.write_text(SWEEP_FILE.format(depths=depths, widths=widths))
    return str(path)


def run_cli(path, *options):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = launch.main(["preflight", path, "--topology", TOPOLOGY, "--json", *options])
    return code, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def cli_sweep(tmp_path_factory):
    require_libtpu()
    folder = tmp_path_factory.mktemp("sweep")
    return write_sweep(folder, (1, 48), {1: (64,), 48: (8192,)}), str(folder / "compile-cache")


@pytest.fixture(scope="module")
def cli_run(cli_sweep):
    # Two programs in two processes: the parallel path, as the default takes it on a machine with 2 cores.
    path, cache = cli_sweep
    return run_cli(path, "--jobs", "2", "--compile-cache", cache)


def test_a_repeated_preflight_takes_every_compile_from_the_cache_with_the_same_results(cli_sweep, cli_run):
    path, cache = cli_sweep
    first_code, first = cli_run
    code, again = run_cli(path, "--jobs", "2", "--compile-cache", cache)
    assert code == first_code == 1
    assert (first["summary"]["programs_compiled"], first["summary"]["programs_from_cache"]) == (2, 0)
    assert (again["summary"]["programs_compiled"], again["summary"]["programs_from_cache"]) == (0, 2)
    for fresh, cached in zip(first["runs"], again["runs"]):  # a fit and an out-of-memory FAIL
        assert not fresh["compile_cached"] and cached["compile_cached"]
        assert {key for key in fresh if fresh[key] != cached[key]} <= {"compile_cached", "compile_seconds"}
    table = preflight.format_table(again["runs"], again["summary"])
    assert "cached" in table.splitlines()[1] and "2 from the compile cache" in table
    # --compile-cache off compiles again.
    _, uncached = run_cli(path, "--jobs", "1", "--only", "L1-*", "--compile-cache", "off")
    assert uncached["summary"]["programs_compiled"] == 1 and not uncached["runs"][0]["compile_cached"]


def test_cli_json_reports_every_run(cli_run):
    code, report = cli_run
    rows = report["runs"]
    assert code == 1  # one run does not fit
    assert [row["name"] for row in rows] == ["L1-d64-s0", "L48-d8192-s0"]
    for row in rows:
        assert {"name", "hbm_bytes_per_device", "hbm_capacity_bytes", "fits", "flops", "collective_bytes",
                "estimated_step_seconds", "estimated_mfu", "bound"} <= set(row)
    assert report["summary"]["runs"] == 2 and report["summary"]["runs_estimated"] == 1
    small_run, big_run = rows
    assert small_run["fits"] and small_run["flops"] > 0 and small_run["hbm_bytes_per_device"] > 0
    assert not big_run["fits"] and big_run["hbm_bytes_per_device"] > big_run["hbm_capacity_bytes"]
    assert big_run["suggestion"]


def test_table_names_runs_results_and_suggestions(cli_run):
    _, report = cli_run
    lines = preflight.format_table(report["runs"], report["summary"]).splitlines()
    assert lines[0].split()[0] == "run"
    assert lines[1].startswith("L1-d64-s0") and lines[1].endswith("PASS")
    assert lines[2].startswith("L48-d8192-s0") and lines[2].endswith("FAIL")
    assert any(line.startswith("L48-d8192-s0: ") and "GiB per chip" in line for line in lines[3:])


def test_cli_exit_status_is_zero_when_every_run_passes(tmp_path, capsys):
    require_libtpu()
    path = write_sweep(tmp_path, (1,), {1: (64,)})
    assert launch.main(["preflight", path, "--topology", TOPOLOGY]) == 0
    out = capsys.readouterr().out
    assert "L1-d64-s0" in out and "PASS" in out


def test_missing_libtpu_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setattr(command_lib, "libtpu_installed", lambda: False)
    assert preflight.main(preflight.Options(topology=TOPOLOGY), []) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install -e ".[tpu]"' in err


def test_bad_topology_on_the_command_line(tmp_path, capsys):
    path = write_sweep(tmp_path, (1,), {1: (64,)})
    assert launch.main(["preflight", path, "--topology", "v5e:4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2-D chip grid" in err


def test_a_slice_shape_that_does_not_exist_is_one_line_on_the_command_line(tmp_path, capsys, monkeypatch):
    # v5e:3x3 used to be checked on one host's 2x2 and pass; it must stop before the compiler is looked for.
    monkeypatch.setattr(report_lib, "topology_devices", lambda topology: pytest.fail("compiled for a bad slice"))
    path = write_sweep(tmp_path, (1,), {1: (64,)})
    assert launch.main(["preflight", path, "--topology", "v5e:3x3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "v5e has no 3x3 slice" in err and "2x4, 4x4" in err


# ---------------------------------------------------------------------------
# Which mesh, which runs, how often: no compiler needed


@pytest.mark.parametrize("slice_name, one_host", [
    ("v5e:2x2", "v5e:2x2"), ("v5e:2x4", "v5e:2x4"), ("v5e:4x4", "v5e:2x2"), ("v5e:16x16", "v5e:2x2"),
    ("v6e:8x8", "v6e:2x2"), ("v4:2x2x1", "v4:2x2x1"), ("v4:2x2x4", "v4:2x2x1"), ("v5p:2x2x2", "v5p:2x2x1")])
def test_host_parallel_runs_are_checked_on_one_hosts_chips(slice_name, one_host):
    topology = preflight.parse_topology(slice_name)
    assert preflight.checked_topology(topology).name == one_host
    assert preflight.checked_topology(topology, pod_wide=True).name == slice_name


def fake_row(name, config, topology, devices, remat_search=False, cache=None, per_layer=True):
    return {"name": name, "fits": True, "status": "PASS", "estimated_step_seconds": 0.5,
            "checked": (topology.name, len(devices))}


def test_seeds_compile_once_only_narrows_and_hosts_share_the_sweep(tmp_path, monkeypatch, capsys):
    checked = []
    monkeypatch.setattr(command_lib, "libtpu_installed", lambda: True)
    monkeypatch.setattr(report_lib, "topology_devices", lambda topology: [None] * topology.chips)
    monkeypatch.setattr(report_lib, "check_run", lambda *args: checked.append(args[0]) or fake_row(*args))
    path = tmp_path / "seeds.py"
    path.write_text(SWEEP_FILE.format(depths=(1, 2), widths={1: (64,), 2: (64,)}).replace(
        'widths={1: (64,), 2: (64,)})', 'widths={1: (64,), 2: (64,)}, seeds=(0, 1, 2))'))
    command = ["preflight", str(path), "--topology", "v5e:4x4", "--json", "--jobs", "1"]
    assert launch.main(command + ["--only", "L1-*"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert checked == ["L1-d64-s0"]  # three seeds, one compile
    assert [row["name"] for row in report["runs"]] == ["L1-d64-s0", "L1-d64-s1", "L1-d64-s2"]
    assert [row.get("same_program_as") for row in report["runs"]] == [None, "L1-d64-s0", "L1-d64-s0"]
    assert {tuple(row["checked"]) for row in report["runs"]} == {("v5e:2x2", 4)}
    summary = report["summary"]
    steps = TrainConfig().steps
    assert summary["mode"] == "host-parallel" and summary["in_parallel"] == 4
    assert summary["chip_hours"] == pytest.approx(3 * steps * 0.5 * 4 / 3600)
    assert summary["wall_hours"] == pytest.approx(steps * 0.5 / 3600)  # one run per host
    checked.clear()
    assert launch.main(command + ["--pod-wide"]) == 0
    report = json.loads(capsys.readouterr().out)
    # Quick mode compiles the deeper one first (it dominates); these fake rows cannot be re-priced, so the other too.
    assert sorted(checked) == ["L1-d64-s0", "L2-d64-s0"]
    assert {tuple(row["checked"]) for row in report["runs"]} == {("v5e:4x4", 16)}
    assert report["summary"]["wall_hours"] == pytest.approx(6 * steps * 0.5 / 3600)


def test_a_run_with_an_uncounted_loop_reads_unknown_in_the_table_and_the_hours(tmp_path):
    runs = Sweep(name="u", base=small(), depths=(1, 2), widths={1: (64,), 2: (64,)}).expand().runs
    counted = {"name": runs[0].name, "fits": True, "status": "PASS", "estimated_step_seconds": 0.5,
               "loops_counted": 2, "loops_uncounted": 0}
    uncounted = dict(counted, name=runs[1].name, estimated_step_seconds=None, loops_counted=1, loops_uncounted=1)
    rows = []
    for row in (counted, uncounted):
        full = {key: None for key in ("hbm_bytes_per_device", "hbm_capacity_bytes", "flops", "collective_bytes",
                                      "bound", "estimated_mfu", "mfu_upper_bound", "compile_seconds")}
        rows.append({**full, **row})
    summary = preflight.sweep_summary(rows, runs, "v5e:2x2")
    assert summary["runs_unknown"] == 1 and summary["loops_uncounted"] == 1 and summary["loops_counted"] == 3
    assert summary["chip_hours"] is None and summary["wall_hours"] is None  # never a number that leaves a run out
    table = preflight.format_table(rows, summary)
    line = next(line for line in table.splitlines() if line.startswith(runs[1].name))
    assert "unknown" in line and "1 (1 not)" in line
    assert "unknown chip-hours" in table


def test_the_cheapest_remat_policy_that_fits_is_found_cheapest_first():
    tried = []

    def fits_from(fitting):
        def fits(candidate):
            tried.append(candidate.model.remat)
            return {"fits": candidate.model.remat in fitting}
        return fits

    config = dataclasses.replace(small(), model=dataclasses.replace(small().model, remat="full"))
    assert preflight.cheapest_remat(config, fits_from({"dots", "full"}))["remat"] == "dots"
    assert tried == ["none", "dots"]
    assert preflight.cheapest_remat(config, fits_from({"full"})) is None  # nothing cheaper fits: keep full
    tried.clear()
    none = dataclasses.replace(config, model=dataclasses.replace(config.model, remat="none"))
    assert preflight.cheapest_remat(none, fits_from({"none"})) is None and tried == []  # already the cheapest


def _pallas_step(devices, cost_estimate) -> str:
    """The compiled TPU HLO of one Pallas kernel (it doubles a [256, 256] array), with or without a declared
    ``pl.CostEstimate``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    def double(x_ref, out_ref):
        out_ref[...] = 2.0 * x_ref[...]

    kernel = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32), name="doubler",
                            cost_estimate=cost_estimate)
    one = NamedSharding(Mesh(np.asarray(devices[:1]), ("x",)), PartitionSpec())
    abstract = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=one)
    return jax.jit(kernel, out_shardings=one).lower(abstract).compile().as_text()


def test_a_pallas_kernel_is_priced_by_its_declared_cost_estimate_and_never_as_free(devices):
    from jax.experimental import pallas as pl

    from sweeps.preflight import kernels, roofline

    chip = topology_lib.CHIPS["v5e"]
    declared = pl.CostEstimate(flops=3_000_000_000, transcendentals=0, bytes_accessed=524_288)
    priced = roofline.step_estimate(_pallas_step(devices, declared), chip, devices[:1],
                                    kernels.kernel_cost(ModelConfig()))
    (name, (calls, flops)), = priced.kernels.items()
    assert name == "doubler" + kernels.DECLARED and kernels.cost_source(name) == "cost estimate"
    assert (calls, flops) == (1, 3e9) and priced.step_seconds >= 3e9 / chip.bf16_flops
    assert kernels.cost_source("splash_mha_fwd") == "stated model"
    unpriced = roofline.step_estimate(_pallas_step(devices, None), chip, devices[:1],
                                      kernels.kernel_cost(ModelConfig()))
    assert unpriced.kernels_uncounted and unpriced.step_seconds is None  # unknown, not free
