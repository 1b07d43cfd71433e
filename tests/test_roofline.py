"""The roofline: collective bytes read from compiled HLO, the step-time arithmetic, the sweep's hours.

Needs no libtpu: CPU programs are compiled on the 8 fake devices of
``conftest.py``, and a TPU program's collectives come from a saved excerpt of
one of our own compiles (``fixtures/tpu_v5e_collectives.hlo``).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sweeps import roofline
from sweeps.spec import Sweep
from scaling.config import DataConfig, ModelConfig, TrainConfig

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
    assert roofline._group_size(text, 16) == size


def test_roofline_adds_collectives_to_the_slower_of_compute_and_memory():
    chip = roofline.CHIPS["v5e"]
    compute_bound = roofline.estimate_step(chip, flops=197e12, hbm_bytes=819e9 / 2, ici_bytes=200e9 / 4)
    assert compute_bound.step_seconds == pytest.approx(1.25) and compute_bound.bound == "compute"
    memory_bound = roofline.estimate_step(chip, flops=197e12 / 10, hbm_bytes=819e9, ici_bytes=0.0)
    assert memory_bound.step_seconds == pytest.approx(1.0) and memory_bound.bound == "memory"
    talk_bound = roofline.estimate_step(chip, flops=197e12 / 10, hbm_bytes=None, ici_bytes=400e9)
    assert talk_bound.step_seconds == pytest.approx(2.1) and talk_bound.bound == "collectives"
    assert talk_bound.memory_seconds is None
    # 4 chips for 2 s at 25% of peak: a quarter of 2 s · 4 · peak.
    assert roofline.model_flops_utilization(2 * 4 * 197e12 / 4, 2.0, 4, chip) == pytest.approx(0.25)


def test_chip_table_covers_four_generations_with_positive_figures():
    assert set(roofline.CHIPS) == {"v4", "v5e", "v5p", "v6e"}
    for chip in roofline.CHIPS.values():
        assert chip.hbm_bytes > 0 and chip.peak_flops > 1e14 and chip.hbm_bandwidth > 5e11
        assert 1e11 < chip.ici_bandwidth < chip.hbm_bandwidth


def test_sweep_time_in_chip_hours_and_busiest_host():
    base = TrainConfig(model=ModelConfig(head_dim=16, max_seq_len=64), data=DataConfig(seq_len=64), steps=3600)
    runs = Sweep(name="t", base=base, depths=(1, 2), widths={1: (32,), 2: (32,)}, seeds=(0, 1)).expand().runs
    seconds = {run.run_id: 1.0 + run.depth for run in runs}  # L1 runs: 2 s/step (2 h), L2: 3 s/step (3 h)
    serial = roofline.sweep_time(seconds, runs, chips_per_run=4)
    assert serial["chip_hours"] == pytest.approx(4 * (2 + 2 + 3 + 3)) and serial["wall_hours"] == pytest.approx(10)
    # On two hosts the launcher deals the two costlier (L2) runs first, one to each host.
    parallel = roofline.sweep_time(seconds, runs, chips_per_run=4, parallel=2)
    assert parallel["chip_hours"] == serial["chip_hours"] and parallel["wall_hours"] == pytest.approx(5)
    unfit = roofline.sweep_time({runs[0].run_id: 2.0}, runs, chips_per_run=4)
    assert unfit["runs_estimated"] == 1 and unfit["chip_hours"] == pytest.approx(8)
