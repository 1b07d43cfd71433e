"""Activation sharding: logical names on activations, mapped through the parameters' rules.

Runs on the 8 fake CPU devices of ``conftest.py``. The collective bytes are
read from the compiled CPU program with ``sweeps.roofline.collective_traffic``.
"""

import contextlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec

from scaling import mesh as mesh_lib, program as program_lib
from scaling.config import DataConfig, MeshConfig, ModelConfig, TrainConfig
from scaling.model import RESIDUAL
from sweeps import roofline


PARAM_BYTES = 4 * (12 * 32 * 32 + 2 * 64 * 32 + 64 * 32)  # float32 layer weights, embeddings, positions


def fsdp_config(**mesh) -> TrainConfig:
    return TrainConfig(model=ModelConfig(depth=1, width=32, head_dim=16, max_seq_len=64, vocab_size=64,
                                         scan_layers=False),
                       data=DataConfig(seq_len=64), batch_size=32, mesh=MeshConfig(**mesh))


@contextlib.contextmanager
def constraints_off(monkeypatch):
    program_lib.forget_programs()  # programs built with the constraints would be reused otherwise
    try:
        with monkeypatch.context() as patch:
            patch.setattr(mesh_lib, "activation_sharding", lambda mesh, rules: contextlib.nullcontext())
            yield
    finally:
        program_lib.forget_programs()


def test_constrain_maps_logical_names_through_the_rules(eight_devices):
    mesh = mesh_lib.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2), eight_devices)
    rules = MeshConfig().rules

    @jax.jit
    def pinned(x, heads):
        with mesh_lib.activation_sharding(mesh, rules):
            return mesh_lib.constrain(x, RESIDUAL), mesh_lib.constrain(heads, ("batch", "length", "heads", "kv"))

    residual, odd_heads = pinned(jnp.zeros((8, 4, 6)), jnp.zeros((8, 4, 3, 2)))
    assert residual.sharding.spec == PartitionSpec(("data", "fsdp"))  # the batch over both; width whole
    # 3 heads do not divide over tensor=2: that dimension stays whole, as a parameter's would.
    assert odd_heads.sharding.spec == PartitionSpec(("data", "fsdp"))
    even_heads = jax.jit(lambda x: pinned(x, x)[1])(jnp.zeros((8, 4, 2, 2)))
    assert even_heads.sharding.spec == PartitionSpec(("data", "fsdp"), None, "tensor")
    assert mesh_lib.constrain(jnp.ones(3), ("batch",)).sharding.is_fully_replicated  # outside the context


def test_constraints_leave_a_one_device_program_unchanged(eight_devices, monkeypatch):
    config = fsdp_config()
    mesh = mesh_lib.make_mesh(config.mesh, eight_devices[:1])

    def lowered():
        program = program_lib.build(config, mesh)
        return program.train_step.lower(program.abstract_state, program_lib.batch_spec(config, mesh),
                                        program.abstract_hparams).as_text()

    with_rules = lowered()
    with constraints_off(monkeypatch):
        assert lowered() == with_rules


def _traffic(config, mesh):
    program = program_lib.build(config, mesh)
    compiled = program.train_step.lower(program.abstract_state, program_lib.batch_spec(config, mesh),
                                        program.abstract_hparams).compile()
    return roofline.collective_traffic(compiled.as_text(), mesh.devices.size)


def test_fsdp_step_gathers_weights_not_activations(eight_devices):
    # (That the constrained program computes the losses one device does is
    # tests/test_train.py::test_one_device_and_eight_device_mesh_give_the_same_losses.)
    # The batch's activations here are 8x the weights, so a program that
    # gathered them (3.6 MB without the constraints) would fail this bound.
    config = fsdp_config(data=2, fsdp=4)
    traffic = _traffic(config, mesh_lib.make_mesh(config.mesh, eight_devices))
    assert traffic.bytes <= 4 * PARAM_BYTES, traffic.by_kind


@pytest.mark.slow
def test_fsdp_step_moves_far_less_with_constraints_than_without(eight_devices, monkeypatch):
    config = fsdp_config(data=2, fsdp=4)
    mesh = mesh_lib.make_mesh(config.mesh, eight_devices)
    with constraints_off(monkeypatch):
        unconstrained = _traffic(config, mesh)
    constrained = _traffic(config, mesh)
    assert constrained.bytes < unconstrained.bytes / 8
    assert constrained.by_kind["all-gather"][1] < unconstrained.by_kind["all-gather"][1] / 8
