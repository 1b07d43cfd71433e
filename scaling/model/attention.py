"""Softmax attention over [batch, length, heads, head_dim] queries, keys and values: XLA or a flash kernel.

``model.attention_impl`` chooses:

- ``xla``: the scores [batch, heads, T, T] are formed in float32, masked,
  softmaxed and applied by XLA; they are materialised (and, under remat,
  recomputed), which makes attention memory-bound at T = 1024 and beyond.
  Under a causal mask they are formed in up to 4 query blocks, each against
  only the keys it can see, which skips most of the masked half (on a CPU
  this made the train step 4–9% faster at T = 128).
- ``flash``: a fused kernel that never writes the scores to memory.
  On TPU it is the Pallas splash-attention kernel that ships with JAX
  (``jax.experimental.pallas.ops.tpu.splash_attention``), run per device
  under ``shard_map`` (a Pallas call cannot be split by the SPMD
  partitioner), over the batch shards and the tensor-parallel heads of the
  activation sharding; its causal mask skips the blocks above the
  diagonal. On GPU it is cuDNN's, through ``jax.nn.dot_product_attention(...,
  implementation="cudnn")``. On CPU, where neither exists, the splash kernel
  runs in Pallas interpret mode: exact but slow, meant for tests.

Both take the same logit scale (``scaling.model.transformer.attention_logit_scale``):
flash folds it into the queries, which is exact because it is constant
along the keys (1/sqrt(d) times, for ``log_length``, the log of the number
of keys the query sees). Padding (``input_mask``) hides padded keys from
every query; on TPU padded tokens form their own segment, so a padded
query attends among the padding (its output is never used), and cuDNN takes
it as per-sequence lengths, so there padding must sit at the end of a row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scaling.model import mesh as mesh_lib

FLASH_BLOCK = 512  # splash block size along queries and keys (at most the sequence; a multiple of 128)


CAUSAL_QUERY_BLOCKS = 4  # at most this many query blocks in the XLA path's causal attention
MIN_QUERY_BLOCK = 64  # positions; shorter blocks cost more in per-op overhead than they save


def causal_query_blocks(length: int) -> int:
    """How many query blocks the XLA path splits a causal sequence of ``length`` positions into (1 = none)."""
    blocks = min(CAUSAL_QUERY_BLOCKS, length // MIN_QUERY_BLOCK)
    while blocks > 1 and length % blocks:
        blocks -= 1
    return max(blocks, 1)


def _scores_softmax_mix(query, key, value, logit_scale, allowed):
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)
    logits = jnp.where(allowed, logits * logit_scale, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


def xla_attention(query, key, value, logit_scale, *, causal: bool, input_mask=None):
    """Attention with the scores materialised: float32 logits, masked with the float32 minimum.

    Under a causal mask the queries are cut into ``causal_query_blocks``
    blocks and block i only meets the keys up to its own end, so the
    products above the diagonal that the mask would discard are never
    computed (at 2 blocks, 3/4 of the full T×T work; at 4, 5/8). The result
    is the same attention, up to float rounding.
    """
    length = query.shape[1]
    key_mask = None if input_mask is None else (input_mask[:, None, None, :] > 0)  # [batch, 1, 1, key]
    scale = jnp.asarray(logit_scale, jnp.float32)
    scale = scale.reshape((1,) * (4 - scale.ndim) + scale.shape)  # [batch|1, heads|1, query|1, 1]
    blocks = causal_query_blocks(length) if causal else 1
    size = length // blocks
    mixed = []
    for block in range(blocks):
        queries, keys = slice(block * size, (block + 1) * size), slice(0, (block + 1) * size if causal else length)
        allowed = jnp.ones((1, 1, size, keys.stop), dtype=bool)
        if causal:
            allowed = allowed & (jnp.arange(keys.stop)[None, :] <= jnp.arange(queries.start, queries.stop)[:, None])
        if key_mask is not None:
            allowed = allowed & key_mask[..., keys]
        block_scale = scale[:, :, queries] if scale.shape[2] > 1 else scale
        mixed.append(_scores_softmax_mix(query[:, queries], key[:, keys], value[:, keys], block_scale, allowed))
    return mixed[0] if blocks == 1 else jnp.concatenate(mixed, axis=1)


def scaled_queries(query, logit_scale):
    """``query`` [batch, length, heads, head_dim] times a scale broadcastable to [batch, heads, query, key]
    that is constant along the keys (so the product equals scaling the logits)."""
    scale = jnp.asarray(logit_scale, jnp.float32)
    scale = scale.reshape((1,) * (4 - scale.ndim) + scale.shape)[..., 0]  # [batch|1, heads|1, query|1]
    scale = jnp.transpose(scale, (0, 2, 1))[..., None]  # [batch|1, query|1, heads|1, 1]
    return (query.astype(jnp.float32) * scale).astype(query.dtype)


def platform() -> str:
    """The platform the current trace compiles for: the activation mesh's devices, else the default backend."""
    mesh = mesh_lib.active_mesh()
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def flash_attention(query, key, value, logit_scale, *, causal: bool, input_mask=None):
    """The fused kernel of this platform (see the module docstring) on [batch, length, heads, head_dim]."""
    query = scaled_queries(query, logit_scale)
    where = platform()
    if where == "gpu" or where == "cuda":
        lengths = None if input_mask is None else (input_mask > 0).sum(axis=-1).astype(jnp.int32)
        return jax.nn.dot_product_attention(query, key, value, scale=1.0, is_causal=causal,
                                            key_value_seq_lengths=lengths, implementation="cudnn")
    return _splash(query, key, value, causal=causal, input_mask=input_mask, interpret=where == "cpu")


def _splash_kernel(length: int, heads: int, causal: bool, interpret: bool, block: int):
    # Made afresh in every trace: the kernel holds its mask as jax arrays, which
    # must not outlive the trace that created them.
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    one = splash.CausalMask((length, length)) if causal else splash.FullMask((length, length))
    return splash.make_splash_mha(splash.MultiHeadMask([one] * heads), block_sizes=sizes, head_shards=1,
                                  q_seq_shards=1, interpret=interpret)


def flash_block(length: int) -> int:
    """The splash block: ``FLASH_BLOCK`` positions, or fewer when that does not divide the sequence."""
    block = min(FLASH_BLOCK, length)
    while length % block:
        block -= 128
    return block


def check_flash_length(length: int) -> None:
    """The splash kernel tiles sequences in blocks of 128 positions: ValueError naming the allowed lengths."""
    if length % 128:
        raise ValueError(f"model.attention_impl='flash' needs a sequence length that is a multiple of 128 "
                         f"(got {length}); use model.attention_impl='xla'")


def _splash(query, key, value, *, causal: bool, input_mask, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, length, heads, _ = query.shape
    check_flash_length(length)
    segments = (jnp.ones((batch, length), jnp.int32) if input_mask is None
                else (input_mask > 0).astype(jnp.int32))

    def per_device(q, k, v, segment_ids):  # [rows, length, local heads, head_dim]
        kernel = _splash_kernel(length, q.shape[2], causal, interpret, flash_block(length))
        heads_first = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # noqa: E731
        one_row = lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s))  # noqa: E731
        out = jax.vmap(one_row)(heads_first(q), heads_first(k), heads_first(v), segment_ids)
        return jnp.transpose(out, (0, 2, 1, 3))

    mesh = mesh_lib.active_mesh()
    if mesh is None or mesh.devices.size == 1:
        return per_device(query, key, value, segments)
    rows = mesh_lib.activation_spec(("batch", "length", "heads", "kv"), query.shape)
    spec_rows = jax.sharding.PartitionSpec(rows[0], None)
    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=(rows, rows, rows, spec_rows), out_specs=rows,
                           check_vma=False)
    return mapped(query, key, value, segments)


def attention(query, key, value, logit_scale, *, causal: bool, input_mask=None, implementation: str = "xla"):
    """Mixed values [batch, length, heads, head_dim]: softmax(scale · q·kᵀ, masked) · v."""
    if implementation == "flash":
        return flash_attention(query, key, value, logit_scale, causal=causal, input_mask=input_mask)
    return xla_attention(query, key, value, logit_scale, causal=causal, input_mask=input_mask)


def attention_flops_per_call(batch: int, heads: int, length: int, head_dim: int, causal: bool) -> dict[str, float]:
    """FLOPs of the splash kernels on [batch, heads, length, head_dim], by phase, as the kernels compute them.

    The forward pass does two matmuls per (query, key) pair (q·kᵀ and p·v),
    the dq kernel three (recomputed q·kᵀ, dO·vᵀ, dS·k) and the dkv kernel four
    (q·kᵀ, dO·vᵀ, dSᵀ·q, Pᵀ·dO); each is 2·head_dim FLOPs per pair. A causal
    mask skips whole blocks above the diagonal: of n×n blocks, n(n+1)/2 run.
    """
    blocks = length // flash_block(length)
    density = (blocks + 1) / (2 * blocks) if causal else 1.0
    pairs = batch * heads * length * length * density
    return {"fwd": 2 * 2 * head_dim * pairs, "dq": 3 * 2 * head_dim * pairs, "dkv": 4 * 2 * head_dim * pairs}

