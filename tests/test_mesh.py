"""Meshes: one device and eight give the same run, parameters are created sharded, two processes run as
one job, and activations are sharded (logical names on activations, mapped through the parameters' rules).

Runs on the 8 fake CPU devices of ``conftest.py``. The collective bytes are
read from the compiled CPU program with ``sweeps.preflight.collective_traffic``; programs are lowered ahead
of time by ``scaling.model.run_program.lower_train_step``, as the preflight and the benchmarks lower them.
"""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import helpers
import tiny
from scaling.config import DataConfig, MeshConfig, ModelConfig, OptimConfig, TrainConfig
from scaling.model import mesh as mesh_lib, program as program_lib, run_program
from scaling.model.transformer import RESIDUAL
from scaling.run import train
from sweeps.preflight import collective_traffic


def small_config(**changes) -> TrainConfig:
    """Two layers of two heads: every mesh axis splits something (heads and feed-forward over tensor)."""
    base = TrainConfig(
        model=ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=64),
        data=DataConfig(source="builtin", seq_len=64),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=5),
        steps=10, batch_size=8, eval_every=0, eval_batches=2, checkpoint_every=10, log_every=1,
        wandb_mode="disabled", name="test")
    return dataclasses.replace(base, **changes)


EIGHT = MeshConfig(data=2, fsdp=2, tensor=2)


@pytest.fixture(scope="module")
def eight_device_run(tmp_path_factory):
    """``small_config`` trained once over all 8 devices (data, fsdp and tensor 2 each): (run directory, record)."""
    run_dir = tmp_path_factory.mktemp("eight") / "run"
    return run_dir, train.run(small_config(mesh=EIGHT), run_dir, show_progress=False, devices=jax.devices()[:8])


def test_one_device_and_eight_device_mesh_give_the_same_losses(tmp_path, eight_device_run):
    single = train.run(small_config(), tmp_path / "one", show_progress=False, devices=jax.devices()[:1])
    eight_dir, sharded = eight_device_run
    a, b = tiny.losses(tmp_path / "one"), tiny.losses(eight_dir)
    assert len(a) == len(b) == 10
    np.testing.assert_allclose(a, b, rtol=1e-4)
    assert abs(single.final_eval_loss - sharded.final_eval_loss) < 1e-4 * single.final_eval_loss


def test_params_are_created_sharded(eight_devices):
    config = small_config(mesh=EIGHT)
    mesh = mesh_lib.make_mesh(config.mesh, eight_devices)
    program = program_lib.build(config, mesh)
    state = program.init(jax.random.PRNGKey(0))
    kernel = state["params"]["layers"]["mlp"]["wi"]["kernel"]  # [layers, embed, mlp]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert kernel.addressable_shards[0].data.shape == (2, 16, 64)


def test_two_processes_reproduce_the_eight_device_run(tmp_path, eight_device_run):
    port = helpers.free_port()
    workdir = tmp_path / "multi"
    command = tiny.train_command(small_config(mesh=EIGHT), workdir, tmp_path / "config.json", "--coordinator",
                                 f"127.0.0.1:{port}", "--num-processes", "2")
    procs = [helpers.start(command + ["--process-id", str(i)], env=tiny.env(devices=4), merge_stderr=True)
             for i in range(2)]
    outputs = [done.stdout for done in helpers.finish(procs, timeout=300)]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    np.testing.assert_allclose(tiny.losses(workdir), tiny.losses(eight_device_run[0]), rtol=1e-4)


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
        return run_program.lower_train_step(config, mesh)[1].as_text()

    with_rules = lowered()
    with constraints_off(monkeypatch):
        assert lowered() == with_rules


def _traffic(config, mesh):
    _, lowered = run_program.lower_train_step(config, mesh)
    return collective_traffic(lowered.compile().as_text(), mesh.devices.size)


def test_fsdp_step_gathers_weights_not_activations(eight_devices):
    # (That the constrained program computes the losses one device does is
    # test_one_device_and_eight_device_mesh_give_the_same_losses above.)
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
