"""The sliced cross-entropy: the same loss and gradients as whole logits, one gather of the unembedding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from scaling import mesh as mesh_lib
from scaling.config import MeshConfig
from scaling.loss import cross_entropy_sum, slice_positions
from scaling.model import unembed
from sweeps import hlo

VOCAB, PADDED, WIDTH = 300, 384, 32


def inputs(batch=4, length=10, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    hidden = jax.random.normal(keys[0], (batch, length, WIDTH))
    kernel = 0.3 * jax.random.normal(keys[1], (WIDTH, PADDED)) * (jnp.arange(PADDED) < VOCAB)
    targets = jax.random.randint(keys[2], (batch, length), 0, VOCAB)
    weights = (jax.random.uniform(keys[3], (batch, length)) < 0.8).astype(jnp.float32)
    return hidden, kernel, targets, weights


def whole_logits_loss(hidden, kernel, targets, weights, compute_dtype):
    """The loss as it was computed before slicing existed: float32 logits of every position at once."""
    logits = unembed(hidden, kernel, VOCAB, compute_dtype)
    return (optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights).sum()


@pytest.mark.parametrize("chunk_tokens", [8, 12, 1000])  # 2 positions a slice, 3 (10 is not a multiple), whole
def test_sliced_loss_and_gradients_equal_whole_logits_in_float32(chunk_tokens):
    args = inputs()
    sliced = lambda h, k: cross_entropy_sum(h, k, *args[2:], vocab_size=VOCAB, compute_dtype="float32",  # noqa: E731
                                            chunk_tokens=chunk_tokens)
    whole = lambda h, k: whole_logits_loss(h, k, *args[2:], "float32")  # noqa: E731
    loss, grads = jax.jit(jax.value_and_grad(sliced, argnums=(0, 1)))(*args[:2])
    expected, expected_grads = jax.value_and_grad(whole, argnums=(0, 1))(*args[:2])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert not np.any(grads[1][:, VOCAB:])  # padding ids are never predicted: no gradient reaches them


def test_bfloat16_loss_matches_the_old_bfloat16_logits():
    # Both round the logits to bf16 (the bf16 matmul always did); the sums run in float32.
    args = inputs(seed=1)
    loss = cross_entropy_sum(*args, vocab_size=VOCAB, compute_dtype="bfloat16", chunk_tokens=8)
    grads = jax.grad(lambda k: cross_entropy_sum(args[0], k, *args[2:], vocab_size=VOCAB,
                                                 compute_dtype="bfloat16", chunk_tokens=8))(args[1])
    expected = whole_logits_loss(*args, "bfloat16")
    expected_grads = jax.grad(lambda k: whole_logits_loss(args[0], k, *args[2:], "bfloat16"))(args[1])
    np.testing.assert_allclose(loss, expected, rtol=2e-3)
    np.testing.assert_allclose(grads, expected_grads, rtol=0.05, atol=2e-3 * float(jnp.abs(expected_grads).max()))


def test_slices_are_counted_in_one_devices_rows():
    # 256 sequences over 256 chips: one row each, so 8192 tokens are 8192 positions of it, not 32.
    assert slice_positions(256, 16384, 8192, batch_shards=256) == 8192
    assert slice_positions(256, 16384, 8192) == 32
    assert slice_positions(16, 100, 8192, batch_shards=4) == 100  # a device's rows fit: one piece


def test_the_unembedding_is_gathered_once_outside_the_slice_loop(eight_devices):
    mesh = mesh_lib.make_mesh(MeshConfig(data=1, fsdp=8), eight_devices)
    rules = MeshConfig().rules
    hidden, kernel, targets, weights = inputs(batch=8, length=16)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    kernel = jax.device_put(kernel, NamedSharding(mesh, PartitionSpec("fsdp")))

    def loss(h, k):
        with mesh_lib.activation_sharding(mesh, rules):
            return cross_entropy_sum(h, k, targets, weights, vocab_size=VOCAB, compute_dtype="float32",
                                     chunk_tokens=4)  # 4 positions of each device's row: 4 slices

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    module = hlo.parse(step.lower(jax.device_put(hidden, rows), kernel).compile().as_text())
    loops = {callee for c in module.computations.values() for i in c.instructions if i.opcode == "while"
             for role, callee in i.called()}
    in_loops, outside = 0, 0
    for computation in module.computations.values():
        for instruction in computation.instructions:
            if instruction.opcode.startswith("all-gather") and any(
                    a.dims == (WIDTH, PADDED) for a in instruction.arrays):
                in_loops += computation.name in loops
                outside += computation.name not in loops
    assert (in_loops, outside) == (0, 1)
