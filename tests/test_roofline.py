"""The roofline: collective bytes read from compiled HLO, the step-time arithmetic, the sweep's hours.

Needs no libtpu: CPU programs are compiled on the 8 fake devices of
``conftest.py``, and TPU programs come from saved compiles: an excerpt of a
train step's collectives (``fixtures/tpu_v5e_collectives.hlo``) and nested
scans with known trip counts (``fixtures/tpu_v5e_nested_scan*.hlo``, written
by ``fixtures/make_tpu_loop_fixtures.py``).
"""

import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scaling import hardware
from scaling.config import DataConfig, ModelConfig, TrainConfig
from sweeps.preflight import collectives, hlo, hlo_cost, roofline
from sweeps.spec import Sweep, shard

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def line(eight_devices):
    mesh = Mesh(np.array(eight_devices), ("x",))
    return NamedSharding(mesh, PartitionSpec("x")), NamedSharding(mesh, PartitionSpec())


def compiled_text(function, in_shardings, out_shardings, *shapes) -> str:
    specs = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    return jax.jit(function, in_shardings=in_shardings, out_shardings=out_shardings).lower(*specs).compile().as_text()


def test_gather_and_reduce_of_a_cpu_program(line):
    split, whole = line
    text = compiled_text(lambda x: (x, x.sum(axis=0)), (split,), (whole, whole), (64, 32))
    traffic = roofline.collective_traffic(text, 8)
    # Gathering f32[64, 32] (8 KiB) over 8 chips sends 7/8 of it from each;
    # the all-reduce of the f32[32] column sums sends 2 · 7/8 of its 128 bytes.
    assert traffic.by_kind == {"all-gather": [1, 8192, 7168], "all-reduce": [1, 128, 224]}
    assert traffic.bytes == 7168 + 224 and traffic.buffer_bytes == 8192 + 128


def test_collectives_in_a_loop_count_once_per_iteration(line):
    split, _ = line
    rows = NamedSharding(split.mesh, PartitionSpec(None, "x"))

    def rotate(carry, xs):  # each step shifts a sharded vector by one: a collective-permute per step
        step = lambda c, row: (jax.lax.with_sharding_constraint(jnp.roll(c, 1) * row, split), None)  # noqa: E731
        return jax.lax.scan(step, carry, xs)[0]

    traffic = roofline.collective_traffic(compiled_text(rotate, (split, rows), split, (64,), (5, 64)), 8)
    count, buffer, sent = traffic.by_kind["collective-permute"]
    assert count == 5 and traffic.unknown_loops == 0
    assert sent == buffer == 5 * 4  # one float32 crosses to the next chip per step


def test_tpu_collectives_in_async_fusions_and_reduce_scatter_fusions():
    traffic = roofline.collective_traffic((FIXTURES / "tpu_v5e_collectives.hlo").read_text(), 4)
    # bf16[260,256] gathered in the entry and bf16[256,260] inside an
    # async_collective_fusion, each 133120 bytes over 4 chips; the
    # all-reduce-scatter fusion reduces bf16[1024,256] and keeps a quarter
    # (a reduce-scatter); the collective-permute-start's tuple holds its
    # operand and result, bf16[1,64,4,64] each, and counts once (not at -done).
    assert traffic.by_kind == {"all-gather": [2, 2 * 133120, 2 * 133120 * 3 / 4],
                               "reduce-scatter": [1, 524288, 524288 * 3 / 4],
                               "collective-permute": [1, 32768, 32768]}


@pytest.mark.parametrize("text, size", [
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", 4),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}", 8),
    ("replica_groups=[2,4]<=[8]", 4),
    ("replica_groups={{0,1},{2,3}}", 2),
    ("channel_id=1", 16),  # no groups: every chip
])
def test_group_sizes(text, size):
    assert len(collectives.replica_group(text, 16)) == size


def test_step_model_prices_each_op_and_overlaps_async_collectives_with_the_ops_between():
    chip = hardware.TPUS["v5e"]
    machine = roofline.machine(chip)
    text = "\n".join([
        "HloModule m, is_scheduled=true",
        "ENTRY %main (p: bf16[1024,1024], q: bf16[1024,1024]) -> bf16[4096,1024] {",
        "  %p = bf16[1024,1024]{1,0} parameter(0)",
        "  %q = bf16[1024,1024]{1,0} parameter(1)",
        "  %ag = (bf16[1024,1024]{1,0}, bf16[4096,1024]{1,0}) all-gather-start(%p), channel_id=1, "
        "replica_groups=[1,4]<=[4], dimensions={0}",
        "  %d = bf16[1024,1024]{1,0} dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "  %e = bf16[1024,1024]{1,0} add(%d, %q)",
        "  ROOT %done = bf16[4096,1024]{1,0} all-gather-done(%ag)",
        "}"])
    cost = hlo_cost.program_cost(text, machine, 4, lambda group: 4)
    dot_seconds = max(2 * 1024**3 / chip.bf16_flops, 3 * 2 * 1024**2 / chip.hbm_bandwidth)
    add_seconds = max(1024**2 / chip.bf16_flops, 3 * 2 * 1024**2 / chip.hbm_bandwidth)
    gather_seconds = 3 / 4 * 8 * 2**20 / chip.link_bandwidth  # 3/4 of the 8 MiB result, over all 4 links
    assert cost.flops == 2 * 1024**3 + 1024**2
    assert cost.compute_seconds == pytest.approx(dot_seconds) and cost.memory_seconds == pytest.approx(add_seconds)
    assert cost.collective_seconds == pytest.approx(gather_seconds)
    # The gather runs beside the dot and the add; the chip then waits for what is left of it.
    assert cost.seconds == pytest.approx(max(dot_seconds + add_seconds, gather_seconds))
    estimate = roofline.estimate(cost)
    assert estimate.exposed_collective_seconds == pytest.approx(max(0.0, gather_seconds - dot_seconds - add_seconds))


def test_collectives_use_the_links_of_the_grid_dimensions_their_group_spans():
    chip = hardware.TPUS["v5e"]
    devices = [types.SimpleNamespace(coords=(x, y, 0)) for y in range(4) for x in range(2)]  # v5e:2x4
    links = roofline.link_counter(devices, chip)
    assert links([0, 1]) == 2  # one row: a ring along x, both directions
    assert links([0, 2, 4, 6]) == 2  # one column
    assert links(list(range(8))) == 4  # both dimensions: every link of the chip
    assert roofline.link_counter([types.SimpleNamespace()] * 8, chip)([0, 1]) == chip.links  # no coordinates


def test_sweep_time_in_chip_hours_and_busiest_host():
    base = TrainConfig(model=ModelConfig(head_dim=16, max_seq_len=64), data=DataConfig(seq_len=64), steps=3600)
    runs = Sweep(name="t", base=base, depths=(1, 2), widths={1: (32,), 2: (32,)}, seeds=(0, 1)).expand().runs
    seconds = {run.run_id: 1.0 + run.depth for run in runs}  # L1 runs: 2 s/step (2 h), L2: 3 s/step (3 h)
    serial = roofline.sweep_time(seconds, runs, chips_per_run=4)
    assert serial["chip_hours"] == pytest.approx(4 * (2 + 2 + 3 + 3)) and serial["wall_hours"] == pytest.approx(10)
    # On two hosts the launcher deals the two costlier (L2) runs first, one to each host.
    parallel = roofline.sweep_time(seconds, runs, chips_per_run=4, shares=[shard(runs, i, 2) for i in range(2)])
    assert parallel["chip_hours"] == serial["chip_hours"] and parallel["wall_hours"] == pytest.approx(5)
    assert (serial["in_parallel"], parallel["in_parallel"]) == (1, 2)
    unfit = roofline.sweep_time({runs[0].run_id: 2.0}, runs, chips_per_run=4)
    assert unfit["runs_estimated"] == 1 and unfit["chip_hours"] == pytest.approx(8)


NESTED = FIXTURES / "tpu_v5e_nested_scan.hlo"  # 3 x 5 nested scans and their gradient, compiled for v5e:2x2
UNROLLED = FIXTURES / "tpu_v5e_nested_scan_unrolled.hlo"  # the same program with unroll=True: no loops


def compiler_flops(path) -> float:
    return float(re.search(r"compiler cost_analysis flops: (\d+)", path.read_text()).group(1))


def test_trip_counts_are_read_from_tpu_loop_conditions():
    text = NESTED.read_text()
    assert "known_trip_count" not in text  # TPU programs do not carry it: the count is in the condition
    module = hlo.parse(text)
    counts = sorted(hlo.trip_count(module, computation, instruction)
                    for computation in module.computations.values()
                    for instruction in computation.instructions if instruction.opcode == "while")
    assert counts == [3, 3, 5, 5]  # the outer and inner scan, forward and backward


def test_nested_loops_multiply_and_match_the_compiler_on_the_unrolled_program():
    machine = roofline.machine(hardware.TPUS["v5e"])
    looped = hlo_cost.program_cost(NESTED.read_text(), machine, 4)
    unrolled = hlo_cost.program_cost(UNROLLED.read_text(), machine, 4)
    assert (looped.loops_counted, looped.loops_uncounted, unrolled.loops_counted) == (4, 0, 0)
    # Every one of the 15 layers: 2·128·256·256 FLOPs per matmul per chip, forward, and the two backward
    # matmuls (the loops also form the first layer's unused input gradient, which unrolling drops).
    matmul = 2 * 128 * 256 * 256
    assert 45 * matmul <= looped.flops <= 1.03 * 45 * matmul
    assert unrolled.flops == pytest.approx(compiler_flops(UNROLLED), rel=0.005)  # the compiler's own count
    assert compiler_flops(NESTED) < looped.flops / 10  # ... which counts each loop body once
    # The gradients of the replicated weights, one per layer (3 x 5): 15 all-reduces of one in the loops,
    # one combined all-reduce of all 15 unrolled.
    assert looped.collectives["all-reduce"][:2] == [15, 15 * 256 * 256 * 2]
    assert unrolled.collectives["all-reduce"][:2] == [1, 15 * 256 * 256 * 2]


def test_a_loop_it_cannot_count_makes_the_estimate_unknown():
    # Make the inner loops' bound a parameter instead of a constant: the count is no longer readable.
    text = NESTED.read_text().replace("constant(5)", "parameter(1)")
    estimate = roofline.step_estimate(text, hardware.TPUS["v5e"], [types.SimpleNamespace()] * 4)
    assert estimate.loops_uncounted == 2 and estimate.loops_counted == 2
    assert estimate.step_seconds is None and estimate.flops is None and estimate.bound is None


def test_flops_of_a_cpu_program_match_the_compiler(line):
    split, whole = line
    function = lambda x, w: jnp.tanh(x @ w).sum(axis=1)  # noqa: E731
    specs = [jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 16), jnp.float32)]
    compiled = jax.jit(function, in_shardings=(split, whole), out_shardings=split).lower(*specs).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    cost = hlo_cost.program_cost(compiled.as_text(), roofline.machine(hardware.TPUS["v5e"]), 8)
    assert cost.flops == pytest.approx(analysis["flops"], rel=0.05)
    assert cost.flops >= 2 * 8 * 32 * 16  # each chip's 8 rows times the 32x16 weights
