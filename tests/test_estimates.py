"""The preflight's two estimates per row: the corrected roofline and the compiler's own, and the range between them.

Read from compiled TPU programs in ``fixtures/``: nested scans
(``tpu_v5e_nested_scan.hlo``, loops of 5 inside 3), a train step's
collectives (``tpu_v5e_collectives.hlo``) and a small train step with splash
attention at head_dim 64 and fsdp (``tpu_v5e_flash_step.hlo.gz``, written by
``fixtures/make_tpu_flash_step_fixture.py``). Only the clock check compiles
(a lone matmul, seconds) and needs libtpu.
"""

import dataclasses
import gzip
import importlib.util
import re
from pathlib import Path

import pytest

from scaling.config import DataConfig, ModelConfig, TrainConfig
from sweeps import preflight
from sweeps.preflight import compiler_estimate, estimate_range, hlo, kernels, roofline
from sweeps.preflight import table as preflight_table
from sweeps.preflight import roofline_corrections as corrections_lib
from sweeps.preflight import tensorcore
from sweeps.preflight.roofline_corrections import Corrections
from sweeps.preflight.topology import CHIPS as TPU_CHIPS
from sweeps.spec import Sweep

FIXTURES = Path(__file__).parent / "fixtures"
NESTED = (FIXTURES / "tpu_v5e_nested_scan.hlo").read_text()
UNROLLED = (FIXTURES / "tpu_v5e_nested_scan_unrolled.hlo").read_text()
COLLECTIVES = (FIXTURES / "tpu_v5e_collectives.hlo").read_text()
with gzip.open(FIXTURES / "tpu_v5e_flash_step.hlo.gz", "rt") as _file:
    FLASH = _file.read()
CHIPS = [None] * 4  # v5e:2x2; no coordinates: every collective may use all links


def _flash_config() -> TrainConfig:
    spec = importlib.util.spec_from_file_location("make_flash", FIXTURES / "make_tpu_flash_step_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CONFIG


FLASH_KERNELS = kernels.kernel_cost(ModelConfig(objective="causal"))


def plain(text, kernel_cost=None):
    return roofline.step_estimate(text, TPU_CHIPS["v5e"], CHIPS, kernel_cost)


# ---------------------------------------------------------------------------
# The clock


def test_the_clock_follows_from_peak_and_matrix_units():
    assert tensorcore.clock_hz("v5e") == pytest.approx(1.5e9, rel=0.01)
    assert tensorcore.clock_hz("v4") == pytest.approx(1.05e9, rel=0.01)  # the TPU v4 paper's 1050 MHz
    assert tensorcore.mxu_width("v5e") == 128 and tensorcore.mxu_width("v6e") == 256
    assert tensorcore.clock_hz("v9x") is None
    with pytest.raises(ValueError, match="count"):
        tensorcore.MatrixUnits(0, 128)


def test_libtpu_counts_estimated_cycles_at_that_clock():
    from tests.test_preflight import require_libtpu

    require_libtpu()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = preflight.topology_devices(preflight.parse_topology("v5e:2x2"))
    sharding = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), PartitionSpec())
    size = 4096
    array = jax.ShapeDtypeStruct((size, size), jnp.bfloat16, sharding=sharding)
    text = jax.jit(lambda a, b: a @ b, out_shardings=sharding).lower(array, array).compile().as_text()
    cycles = sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', text))
    ideal = 2 * size**3 / tensorcore.MATRIX_UNITS["v5e"].flops_per_cycle  # every MXU busy every cycle
    assert ideal <= cycles <= 1.15 * ideal


# ---------------------------------------------------------------------------
# The corrections, each on a compiled fixture


def test_padded_dims_round_the_tiled_dimensions_up():
    assert corrections_lib.padded_dims((3, 200), "{1,0:T(8,128)}") == (8, 256)
    assert corrections_lib.padded_dims((3, 200), "{0,1:T(8,128)}") == (128, 200)  # dim 0 is the minor one
    assert corrections_lib.padded_dims((5, 3, 64), "{2,1,0:T(8,128)(2,1)}") == (5, 8, 128)  # bf16: 8-row tiles
    assert corrections_lib.padded_dims((50304,), "{0:T(1024)(128)(4,1)}") == (51200,)
    assert corrections_lib.padded_dims((3, 200), "") == (3, 200)
    assert corrections_lib.padded_dims((), "{:T(128)}") == ()


def test_tile_padding_prices_arrays_at_their_padded_size():
    # The flash step has 64-wide heads and 16-row shards: their tiles are padded, so more bytes move.
    logical = plain(FLASH, FLASH_KERNELS)
    padded = corrections_lib.corrected_step_estimate(FLASH, "v5e", CHIPS, FLASH_KERNELS,
                                                     Corrections(True, False, 0.0, 0.0))
    assert padded.hbm_bytes > 1.1 * logical.hbm_bytes
    assert padded.flops == pytest.approx(logical.flops)  # FLOPs stay logical
    assert padded.step_seconds > logical.step_seconds
    assert corrections_lib.padding_ratio(FLASH) > 1.0
    # The nested scans' arrays are whole tiles (128 x 256 bf16): nothing to pad.
    assert corrections_lib.padding_ratio(NESTED) == pytest.approx(1.0)
    assert corrections_lib.contributions(NESTED, "v5e", CHIPS)["tile_padding"] == pytest.approx(0.0, abs=1e-12)


def test_matrix_unit_fill_halves_the_attention_kernels_at_head_dim_64():
    assert corrections_lib.matrix_unit_fill(64, 128) == 0.5
    assert corrections_lib.matrix_unit_fill(128, 128) == 1.0
    assert corrections_lib.matrix_unit_fill(192, 128) == 0.75
    assert corrections_lib.matrix_unit_fill(64, 256) == 0.25

    def compute_bound(instruction, operands):  # the kernels' FLOPs scaled up until compute bounds them
        priced = FLASH_KERNELS(instruction, operands)
        return priced and (priced[0], 1e4 * priced[1], priced[2])

    def kernel_compute(corrections):
        cost = corrections_lib.corrected_cost(FLASH, "v5e", CHIPS, compute_bound, corrections)
        return cost.compute_seconds, sum(flops for _, flops in cost.kernels.values())

    without, kernel_flops = kernel_compute(Corrections(True, False, 0.0, 0.0))
    with_fill, _ = kernel_compute(Corrections(True, True, 0.0, 0.0))
    assert kernel_flops > 0
    # At half fill each kernel's matmuls take twice as long: the extra is their FLOPs at peak once more.
    assert with_fill - without == pytest.approx(kernel_flops / TPU_CHIPS["v5e"].bf16_flops, rel=1e-6)


def test_the_op_floor_is_no_more_than_the_compiler_gives_any_fusion():
    for text in (NESTED, FLASH):
        module = hlo.parse(text)
        floored = [compiler_estimate.op_cycles(i) for c in module.computations.values() for i in c.instructions
                   if corrections_lib._is_floored(module, c, i) and compiler_estimate.op_cycles(i) is not None]
        assert floored and min(floored) >= corrections_lib.OP_FLOOR_CYCLES
    added = corrections_lib.contributions(FLASH, "v5e", CHIPS, FLASH_KERNELS)["op_floor"]
    assert added > 0
    # A floor far above every op makes the step at least (floored ops run) x floor.
    huge = Corrections(False, False, 1e6, 0.0)
    cost = corrections_lib.corrected_cost(NESTED, "v5e", CHIPS, None, huge)
    assert cost.seconds >= 12 * 1e6 / tensorcore.clock_hz("v5e")  # the 12 floored fusions, each run at least once


def test_collective_latency_adds_a_fixed_time_to_every_collective():
    latency = 5e-6
    base = corrections_lib.corrected_cost(COLLECTIVES, "v5e", CHIPS, None, Corrections(False, False, 0.0, 0.0))
    slow = corrections_lib.corrected_cost(COLLECTIVES, "v5e", CHIPS, None, Corrections(False, False, 0.0, latency))
    count = sum(values[0] for values in base.collectives.values())
    assert count > 0
    added = sum(values[3] for values in slow.collectives.values()) - sum(v[3] for v in base.collectives.values())
    assert added == pytest.approx(count * latency)
    assert slow.seconds >= base.seconds


def test_no_corrections_is_the_roofline_as_it_was():
    for text, kernel_cost in ((NESTED, None), (FLASH, FLASH_KERNELS), (COLLECTIVES, None)):
        assert corrections_lib.corrected_step_estimate(text, "v5e", CHIPS, kernel_cost, Corrections.NONE) \
            .step_seconds == pytest.approx(plain(text, kernel_cost).step_seconds)


def test_corrections_are_validated():
    with pytest.raises(ValueError, match="op_floor_cycles"):
        Corrections(op_floor_cycles=-1)


# ---------------------------------------------------------------------------
# The compiler's estimate


def test_the_compiler_estimate_counts_each_op_its_trip_count_times():
    before = compiler_estimate.compiler_estimate(NESTED, "v5e", CHIPS)
    assert before.known and before.ops_estimated > 0
    # copy.24 sits in the inner scan's body, which runs 3 x 5 times: 1000 more cycles there are 15000 a step.
    text = re.sub(r'(%copy\.24 = .*?"estimated_cycles":")2098"', r'\g<1>3098"', NESTED)
    assert text != NESTED
    after = compiler_estimate.compiler_estimate(text, "v5e", CHIPS)
    assert (after.cycles_seconds - before.cycles_seconds) * before.clock_hz == pytest.approx(15 * 1000)
    assert (after.step_seconds - before.step_seconds) * before.clock_hz == pytest.approx(15 * 1000)


def test_no_compiler_estimate_where_the_backend_gave_none(monkeypatch):
    # The unrolled fixture was written without backend_config: no estimated_cycles anywhere.
    missing = compiler_estimate.compiler_estimate(UNROLLED, "v5e", CHIPS)
    assert missing.step_seconds is None and missing.cycles_seconds is None
    assert "no estimated_cycles" in missing.reason
    monkeypatch.setitem(tensorcore.MATRIX_UNITS, "v5e", None)
    unclocked = compiler_estimate.compiler_estimate(NESTED, "v5e", CHIPS)
    assert unclocked.step_seconds is None and "clock" in unclocked.reason


@pytest.mark.parametrize("name", ["nested", "flash"])
def test_the_compiler_is_never_below_the_roofline_by_more_than_the_corrections(name):
    text, kernel_cost = {"nested": (NESTED, None), "flash": (FLASH, FLASH_KERNELS)}[name]
    corrected = corrections_lib.corrected_step_estimate(text, "v5e", CHIPS, kernel_cost).step_seconds
    added = sum(corrections_lib.contributions(text, "v5e", CHIPS, kernel_cost).values())
    compiler = compiler_estimate.compiler_estimate(text, "v5e", CHIPS, kernel_cost)
    assert added > 0
    assert corrected - added == pytest.approx(plain(text, kernel_cost).step_seconds)  # they add up
    assert compiler.step_seconds >= corrected - added
    assert compiler.cycles_seconds > 0


def test_no_estimate_is_faster_than_the_model_flops_at_peak():
    config = _flash_config()
    fields = estimate_range.row_fields(config, FLASH, "v5e", CHIPS, kernels.kernel_cost(config.model), len(CHIPS))
    at_peak = fields["model_flops_per_chip"] / TPU_CHIPS["v5e"].bf16_flops
    for key in ("roofline_corrected_step_seconds", "compiler_step_seconds", "step_seconds_low",
                "step_seconds_high"):
        assert fields[key] >= at_peak, key
    assert 0 < fields["mfu_low"] <= fields["mfu_high"] <= 1
    assert fields["mfu_causal_low"] < fields["mfu_low"]  # fewer model FLOPs in the causal half
    assert fields["step_seconds_low"] <= fields["step_seconds_high"]
    assert set(fields) == set(estimate_range.EMPTY_FIELDS)


# ---------------------------------------------------------------------------
# Rows, the summary and the table


def test_model_flops_by_convention():
    config = TrainConfig(model=ModelConfig(depth=2, width=64, head_dim=16, max_seq_len=64), data=DataConfig(seq_len=64))
    full, causal = (estimate_range.model_flops_per_step(config, c) for c in ("full", "causal"))
    tokens = config.batch_size * config.data.seq_len
    assert full - causal == pytest.approx(6 * 2 * 64 * 64 * tokens)  # 6·L·T·d per token
    with pytest.raises(ValueError, match="convention"):
        estimate_range.model_flops_per_step(config, "half")


def test_summary_and_table_give_the_range_and_say_where_the_compiler_gave_none():
    base = TrainConfig(model=ModelConfig(depth=1, width=64, head_dim=16, max_seq_len=64), data=DataConfig(seq_len=64),
                       steps=3600)
    runs = Sweep(name="r", base=base, depths=(1, 2), widths={1: (64,), 2: (64,)}).expand().runs
    empty = {key: None for key in ("hbm_bytes_per_device", "hbm_capacity_bytes", "flops", "collective_bytes",
                                   "bound", "estimated_mfu", "mfu_upper_bound", "compile_seconds")}
    both = {**empty, **estimate_range.EMPTY_FIELDS, "name": runs[0].name, "fits": True, "status": "PASS",
            "estimated_step_seconds": 0.5, "step_seconds_low": 1.0, "step_seconds_high": 3.0, "mfu_low": 0.1,
            "mfu_high": 0.3, "loops_counted": 1, "loops_uncounted": 0}
    only_roofline = dict(both, name=runs[1].name, step_seconds_high=None, mfu_low=None,
                         compiler_estimate_missing="the compiled program carries no estimated_cycles")
    summary = estimate_range.summary_fields([both, both], runs, 4)
    assert summary["chip_hours_low"] == pytest.approx(2 * 3600 * 1.0 * 4 / 3600)
    assert summary["chip_hours_high"] == pytest.approx(2 * 3600 * 3.0 * 4 / 3600)
    summary = preflight.sweep_summary([both, only_roofline], runs, "v5e:2x2")  # 4 chips, one run after another
    assert summary["chip_hours_low"] == pytest.approx(8.0) and summary["chip_hours_high"] is None
    table = preflight_table.format_table([both, only_roofline], summary)
    assert "1..3" in next(line for line in table.splitlines() if line.startswith(runs[0].name))
    assert "1..?" in next(line for line in table.splitlines() if line.startswith(runs[1].name))
    assert "8.0..? chip-hours" in table


def test_corrections_dataclass_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Corrections().tile_padding = False


def test_contributions_are_unknown_when_a_loop_is_uncounted():
    text = NESTED.replace("direction=LT", "direction=NE")  # loop conditions it cannot read
    assert plain(text).step_seconds is None
    assert set(corrections_lib.contributions(text, "v5e", CHIPS).values()) == {None}
    assert compiler_estimate.compiler_estimate(text, "v5e", CHIPS).step_seconds is None
