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
