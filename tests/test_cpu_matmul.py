"""The dense layers' CPU product (``scaling.model.cpu_matmul``): XLA's values and gradients, the trainer's losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny
from scaling.model import cpu_matmul
from scaling.model import program as program_lib
from scaling.store.metrics_log import read_metrics

# (input shape, kernel shape, contracted axes of the input): Dense, DenseGeneral's q/k/v and out projections.
FORMS = [((24, 16), (16, 40), 1), ((24, 16), (16, 4, 8), 1), ((24, 4, 8), (4, 8, 16), 2)]


def _dimension_numbers(x, kernel, contracted):
    lhs = tuple(range(x.ndim - contracted, x.ndim))
    return ((lhs, tuple(range(contracted))), ((), ()))


@pytest.mark.parametrize("x_shape, kernel_shape, contracted", FORMS)
def test_product_and_gradients_are_xlas(x_shape, kernel_shape, contracted):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal(kernel_shape), jnp.float32)
    numbers = _dimension_numbers(x, kernel, contracted)
    cotangent = jnp.asarray(rng.standard_normal(x_shape[:x.ndim - contracted] + kernel_shape[contracted:]))

    def pulled_back(product):
        out, pullback = jax.vjp(lambda a, b: product(a, b, numbers), x, kernel)
        return (out, *pullback(cotangent))

    ours = jax.jit(lambda: pulled_back(cpu_matmul.weight_grad_friendly_dot_general))()
    xlas = jax.jit(lambda: pulled_back(jax.lax.dot_general))()
    for mine, reference in zip(ours, xlas):
        assert mine.shape == reference.shape
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-5)
    jaxpr = str(jax.make_jaxpr(lambda: pulled_back(cpu_matmul.weight_grad_friendly_dot_general))())
    assert "optimization_barrier" in jaxpr  # the weight gradient's transpose is written out


def test_other_products_are_left_to_xla():
    x, y = jnp.ones((3, 4, 5)), jnp.ones((3, 5, 6))
    batched = (((2,), (1,)), ((0,), (0,)))
    out = cpu_matmul.weight_grad_friendly_dot_general(x, y, batched)
    np.testing.assert_allclose(out, jax.lax.dot_general(x, y, batched))
    jaxpr = jax.make_jaxpr(lambda a, b: jax.grad(
        lambda a: cpu_matmul.weight_grad_friendly_dot_general(a, b, batched).sum())(a))(x, y)
    assert "optimization_barrier" not in str(jaxpr)


def test_only_a_one_device_cpu_program_gets_it(monkeypatch, eight_devices):
    from scaling.config import MeshConfig
    from scaling.model import mesh as mesh_lib

    assert cpu_matmul.dot_general_for("cpu") is cpu_matmul.weight_grad_friendly_dot_general
    assert cpu_matmul.dot_general_for("tpu") is None and cpu_matmul.dot_general_for("gpu") is None
    for devices, expected in ((eight_devices[:1], cpu_matmul.weight_grad_friendly_dot_general),
                              (eight_devices, None)):  # several CPU devices stand in for a TPU slice
        mesh = mesh_lib.make_mesh(MeshConfig(fsdp=len(devices)), devices)
        with mesh_lib.activation_sharding(mesh, {}):
            assert cpu_matmul.dot_general_for("cpu") is expected
    with cpu_matmul.plain_products():
        assert cpu_matmul.dot_general_for("cpu") is None
    assert cpu_matmul.dot_general_for("cpu") is cpu_matmul.weight_grad_friendly_dot_general


def test_the_trainers_cpu_step_uses_it():
    from scaling.config import MeshConfig
    from scaling.model import mesh as mesh_lib

    config = tiny.config()
    program_lib.forget_programs()
    program = program_lib.build(config, mesh_lib.make_mesh(MeshConfig(), tiny.one_device()),
                                 **program_lib.arguments_of(config))
    state = jax.eval_shape(program.init, jax.random.PRNGKey(0))
    assert "optimization_barrier" in str(jax.make_jaxpr(program.train_step)(state, *_step_inputs(program, config)))


def _step_inputs(program, config):
    shape = (config.batch_size, config.data.seq_len)
    batch = {"inputs": jnp.zeros(shape, jnp.int32), "targets": jnp.zeros(shape, jnp.int32),
             "weights": jnp.ones(shape, jnp.float32), "input_mask": jnp.ones(shape, jnp.float32)}
    return batch, program_lib.hyperparameters(config)


def test_the_trainers_losses_over_50_steps_are_unchanged(tmp_path, monkeypatch):
    """The forward pass is XLA's own product and the gradients differ in summation order only, so 50 steps
    of training give the plain product's losses to 1e-6 relative."""
    config = tiny.config(steps=50, checkpoint_every=50, keep_checkpoints=1, log_every=1)
    losses = {}
    for transposed in (False, True):
        monkeypatch.setattr(cpu_matmul, "TRANSPOSED_WEIGHT_GRAD_ON_CPU", transposed)
        program_lib.forget_programs()  # a fresh trace: the switch is read while tracing
        run_dir = tmp_path / str(transposed)
        tiny.run(config, run_dir)
        losses[transposed] = [row["loss"] for row in read_metrics(run_dir) if "loss" in row]
    program_lib.forget_programs()
    assert len(losses[True]) == 50
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-6)
