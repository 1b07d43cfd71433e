"""Flash attention (the splash kernel, in Pallas interpret mode on CPU) against XLA's, forward and gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling.config import ModelConfig
from scaling.model import attention
from scaling.model.transformer import attention_logit_scale

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 256, 2, 32


def qkv(seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    shape = (BATCH, LENGTH, HEADS, HEAD_DIM)
    return tuple(jax.random.normal(k, shape, jnp.float32) for k in keys[:3]), jax.random.normal(keys[3], shape)


@pytest.fixture
def two_blocks(monkeypatch):
    # Blocks of 128 positions: 2×2 blocks per sequence, so the causal kernel skips one.
    monkeypatch.setattr(attention, "FLASH_BLOCK", 128)


@pytest.mark.parametrize("objective, scale, padded", [
    ("causal", "standard", False), ("masked", "standard", False),  # causal and bidirectional
    ("causal", "log_length", False), ("masked", "log_length", True),  # log n per query / per sequence
    ("masked", "standard", True)])
def test_flash_equals_xla_in_values_and_gradients(objective, scale, padded, two_blocks):
    model = ModelConfig(width=HEADS * HEAD_DIM, head_dim=HEAD_DIM, objective=objective, attention_scale=scale,
                        max_seq_len=LENGTH)
    (q, k, v), probe = qkv()
    mask = None
    if padded:  # the second sequence's last 56 positions are padding
        mask = jnp.ones((BATCH, LENGTH)).at[1, 200:].set(0.0)
    logit_scale = attention_logit_scale(model, LENGTH, mask)
    real = jnp.ones((BATCH, LENGTH, 1, 1)) if mask is None else mask[:, :, None, None]

    def loss(implementation, q, k, v):
        out = attention.attention(q, k, v, logit_scale, causal=objective == "causal", input_mask=mask,
                                  implementation=implementation)
        return (out * probe * real).sum(), out * real  # padded queries' outputs are never used

    (flash, flash_out), flash_grads = jax.value_and_grad(lambda *a: loss("flash", *a), argnums=(0, 1, 2),
                                                         has_aux=True)(q, k, v)
    (xla, xla_out), xla_grads = jax.value_and_grad(lambda *a: loss("xla", *a), argnums=(0, 1, 2),
                                                   has_aux=True)(q, k, v)
    np.testing.assert_allclose(flash_out, xla_out, atol=2e-5)
    np.testing.assert_allclose(flash, xla, rtol=1e-5)
    for got, want in zip(flash_grads, xla_grads):
        np.testing.assert_allclose(got, want, atol=5e-5)


@pytest.mark.parametrize("scale, padded", [("standard", False), ("log_length", False), ("standard", True)])
def test_causal_xla_attention_in_query_blocks_equals_the_whole_square(scale, padded, monkeypatch):
    # The blocked path (4 query blocks at 256 positions) against the same code with one block,
    # which forms and masks the whole [T, T] square: values and gradients.
    model = ModelConfig(width=HEADS * HEAD_DIM, head_dim=HEAD_DIM, attention_scale=scale, max_seq_len=LENGTH)
    (q, k, v), probe = qkv(seed=1)
    mask = jnp.ones((BATCH, LENGTH)).at[1, 190:].set(0.0) if padded else None
    logit_scale = attention_logit_scale(model, LENGTH, mask)

    def loss(q, k, v):
        out = attention.xla_attention(q, k, v, logit_scale, causal=True, input_mask=mask)
        return (out * probe).sum(), out

    assert attention.causal_query_blocks(LENGTH) == 4
    (blocked, blocked_out), blocked_grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    monkeypatch.setattr(attention, "CAUSAL_QUERY_BLOCKS", 1)
    assert attention.causal_query_blocks(LENGTH) == 1
    (square, square_out), square_grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    np.testing.assert_allclose(blocked_out, square_out, atol=2e-6)
    np.testing.assert_allclose(blocked, square, rtol=1e-6)
    for got, want in zip(blocked_grads, square_grads):
        np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("length, blocks", [(128, 2), (192, 3), (256, 4), (1024, 4), (100, 1), (64, 1), (320, 4)])
def test_causal_query_blocks_divide_the_sequence_into_blocks_of_at_least_64(length, blocks):
    assert attention.causal_query_blocks(length) == blocks
    assert length % blocks == 0


def test_blocked_causal_attention_compiles_fewer_flops_than_the_square(monkeypatch):
    (q, k, v), _ = qkv()

    def compiled_flops():
        attend = jax.jit(lambda q, k, v: attention.xla_attention(q, k, v, 0.2, causal=True))
        return attend.lower(q, k, v).compile().cost_analysis()["flops"]

    blocked = compiled_flops()
    monkeypatch.setattr(attention, "CAUSAL_QUERY_BLOCKS", 1)
    square = compiled_flops()
    assert blocked < 0.7 * square  # 4 blocks: 5/8 of the square's products, plus the softmax's elementwise work


def test_scaled_queries_fold_a_per_query_scale():
    (q, _, _), _ = qkv()
    scale = jnp.arange(1.0, LENGTH + 1)[None, None, :, None]  # [1, 1, query, 1], as log_length's causal scale
    np.testing.assert_allclose(attention.scaled_queries(q, scale), q * jnp.arange(1.0, LENGTH + 1)[None, :, None, None])


def test_analytic_kernel_flops_skip_the_blocks_above_the_diagonal(monkeypatch):
    monkeypatch.setattr(attention, "FLASH_BLOCK", 512)
    full = attention.attention_flops_per_call(1, 1, 1024, 64, causal=False)
    causal = attention.attention_flops_per_call(1, 1, 1024, 64, causal=True)
    assert full["fwd"] == 4 * 64 * 1024 * 1024  # q·kᵀ and p·v: 2 matmuls of 2·d FLOPs per pair
    assert causal["fwd"] == full["fwd"] * (2 + 1) / (2 * 2)  # 512-blocks: 3 of 4 run
    assert full["dq"] + full["dkv"] == 3.5 * full["fwd"]  # 3 + 4 matmuls recomputing the scores


def test_a_model_with_flash_attention_trains_like_one_with_xla():
    from scaling.model.loss import compute_loss
    from model_params import init_params
    from scaling.model.transformer import Transformer

    length = 128  # one block: the kernels' masks are tested above
    flash = ModelConfig(depth=1, width=64, head_dim=32, max_seq_len=length, attention_scale="log_length",
                        attention_impl="flash")
    xla = dataclasses.replace(flash, attention_impl="xla")
    params = init_params(xla, jax.random.PRNGKey(0), length=length)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (BATCH, length + 1), 0, xla.vocab_size)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": jnp.ones((BATCH, length)),
             "input_mask": None}
    grads = {}
    for config in (flash, xla):
        grads[config.attention_impl] = jax.jit(jax.value_and_grad(
            lambda p: compute_loss(Transformer(config), p, batch)[0]))(params)
    np.testing.assert_allclose(grads["flash"][0], grads["xla"][0], rtol=1e-5)
    for got, want in zip(jax.tree_util.tree_leaves(grads["flash"][1]), jax.tree_util.tree_leaves(grads["xla"][1])):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_flash_under_a_sharded_mesh_runs_per_device_and_equals_xla(eight_devices):
    # Batch split over data × fsdp and heads over tensor: each device runs the kernel on its own shard.
    from scaling.model import mesh as mesh_lib
    from scaling.config import MeshConfig

    config = MeshConfig(data=2, fsdp=2, tensor=2)
    mesh = mesh_lib.make_mesh(config, eight_devices)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    q, k, v = (jax.random.normal(key, (4, 128, 2, 32)) for key in keys)
    mask = jnp.ones((4, 128)).at[3, 100:].set(0.0)

    def run(implementation):
        def attend(q, k, v, mask):
            with mesh_lib.activation_sharding(mesh, config.rules):
                out = attention.attention(q, k, v, 0.2, causal=True, input_mask=mask, implementation=implementation)
            return out * mask[:, :, None, None]
        return jax.jit(attend)(q, k, v, mask)

    np.testing.assert_allclose(run("flash"), run("xla"), atol=2e-5)
