"""benchmarks/loss_estimates.py: a compiled TPU step's estimates split into loss, layers and rest by the Python
stack XLA keeps for each op (needs libtpu, as the preflight's tests)."""

import dataclasses
import sys

from helpers import REPO
from scaling.config import DataConfig, ModelConfig, TrainConfig
from scaling.model import mesh as mesh_lib, run_program
from sweeps import preflight
from sweeps.preflight import kernels
from test_preflight import require_libtpu

sys.path.insert(0, str(REPO / "benchmarks"))
import loss_estimates  # noqa: E402


def split(config, devices) -> dict:
    mesh = mesh_lib.make_mesh(config.mesh, devices)
    text = run_program.lower_train_step(config, mesh)[1].compile().as_text()
    return loss_estimates.split_estimates(text, "v5e", mesh.devices.flat, kernels.kernel_cost(config.model))


def test_the_loss_part_grows_with_the_vocabulary_and_the_layers_part_does_not():
    require_libtpu()
    devices = preflight.topology_devices(preflight.parse_topology("v5e:2x2"))
    base = TrainConfig(model=ModelConfig(depth=2, width=128, head_dim=64, vocab_size=1000, max_seq_len=256,
                                         compute_dtype="bfloat16", loss_impl="fused"),
                       data=DataConfig(seq_len=256), batch_size=16)
    small = split(base, devices)
    large = split(dataclasses.replace(base, model=dataclasses.replace(base.model, vocab_size=32000)), devices)
    for kind in ("compiler", "roofline"):
        for parts in (small[kind], large[kind]):
            assert parts["loss"] > 0 and parts["layers"] > 0 and parts["rest"] >= 0, (kind, parts)
            assert abs(parts["loss"] + parts["layers"] + parts["rest"] - parts["step"]) < 1e-9
        assert large[kind]["loss"] > 4 * small[kind]["loss"], kind
        assert abs(large[kind]["layers"] / small[kind]["layers"] - 1) < 0.1, kind


def test_the_costliest_ops_count_loop_trips_and_name_the_loss_kernels():
    require_libtpu()
    devices = preflight.topology_devices(preflight.parse_topology("v5e:2x2"))
    config = TrainConfig(model=ModelConfig(depth=3, width=128, head_dim=64, vocab_size=32000, max_seq_len=256,
                                           compute_dtype="bfloat16", loss_impl="pallas", scan_layers=True),
                         data=DataConfig(seq_len=256), batch_size=16)
    mesh = mesh_lib.make_mesh(config.mesh, devices)
    text = run_program.lower_train_step(config, mesh)[1].compile().as_text()
    ops = loss_estimates.top_ops(text, "v5e", mesh.devices.flat, kernels.kernel_cost(config.model), count=10_000)
    step = loss_estimates.split_estimates(text, "v5e", mesh.devices.flat, kernels.kernel_cost(config.model))
    kernels_found = {op["op"].split(".")[0]: op for op in ops if op["op"].startswith("pallas_ce")}
    assert set(kernels_found) == {"pallas_ce_forward_expectation", "pallas_ce_kernel_grad"}
    assert all(op["part"] == "loss" and op["runs"] == 1 for op in kernels_found.values())
    assert any(op["part"] == "layers" and op["runs"] % 3 == 0 and op["runs"] >= 3 for op in ops)  # the layer loop
    assert [op["seconds"] for op in ops] == sorted((op["seconds"] for op in ops), reverse=True)
    # Ops in sequence, collectives not overlapped: at least the step's compiler estimate, not wildly more.
    assert step["compiler"]["step"] * 0.9 <= sum(op["seconds"] for op in ops) <= step["compiler"]["step"] * 1.5


def test_the_committed_paper_preflights_compare_row_by_row():
    """benchmarks/preflight_compare.py reads both committed reports: all 48 shapes, each a range, and the
    data-parallel rows with the Pallas loss faster at the slow end than before."""
    import preflight_compare

    folder = REPO / "benchmarks" / "paper_preflight"
    before, after = ((folder / name).read_text() for name in ("before.txt", "after.txt"))
    old, new = preflight_compare.step_ranges(before), preflight_compare.step_ranges(after)
    assert len(old) == len(new) == 48 and set(old) == set(new)
    assert all(low < high for low, high in [*old.values(), *new.values()])
    assert old["L6-d128-s0"][1] / new["L6-d128-s0"][1] > 2  # the compiler's end: 77.9 -> 32.3 ms
    table = preflight_compare.compare(before, after)
    assert table.count("\n| L") == 48 and "chip-hours" in table and "price:" in table
