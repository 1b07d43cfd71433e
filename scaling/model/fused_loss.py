"""The fused linear cross-entropy: unembedding, log-softmax, label pick and backward pass in vocabulary blocks.

``scaling.model.loss``'s chunked loss forms one slice of positions' logits
over the whole vocabulary at a time ([rows, 50,304] for GPT-2's tokens) and
reads them several times. This one (``model.loss_impl="fused"``) also cuts
the vocabulary into blocks of about ``VOCAB_BLOCK`` ids and never holds more
than one block's logits of one slice of positions:

- forward: for each block, logits = hidden · kernel[:, block] (in the
  compute dtype, bf16 in bf16 models, as the chunked loss rounds them), and
  an online log-sum-exp in float32 carries a running maximum and a running
  sum of exponentials rescaled to it ("Online normalizer calculation for
  softmax", Milakov and Gimelshein, 2018, section 3); the target's logit is
  picked from the block that holds it;
- backward (a ``jax.custom_vjp``): each block's logits are recomputed, the
  softmax is read off the saved log-sum-exp, and the hidden states' gradient
  (summed over blocks) and the unembedding's (one block at a time, summed
  over slices of positions) are accumulated in float32 and rounded once.

This is the blockwise scheme of Cut Cross-Entropy ("Cut Your Losses in
Large-Vocabulary Language Models", Wijmans et al., ICLR 2025, section 4)
written in plain JAX, so it runs on every backend and serves as the
reference for a kernel. Plain JAX still leaves XLA three passes over each
block's logits (the matmul with the block's maximum, the sum of exponentials,
and the backward pass's softmax gradient), which libtpu prices at about what
the chunked loss's passes cost per logit (``benchmarks/loss_estimates.md``);
what changes is the peak memory, one block, and some of the passes' cost
(keeping each block on chip takes a kernel: ``scaling.model.pallas_loss``).

Per-position weights, the padded vocabulary (ids at or beyond ``vocab_size``
get the chunked loss's large negative logit: zero probability, zero
gradient) and any sharding of the batch work as in the chunked loss; the
kernel's vocabulary is padded further with zero columns, also masked, so that
it cuts into equal blocks (multiples of 128 ids, the TPU's lane width).

Why not Tokamax's Pallas TPU kernel (``tokamax`` 0.0.12 from the package
index, ``linear_softmax_cross_entropy_loss``, ``pallas_mosaic_tpu*.py``) here,
read from its source against this project's loss:

- it sums or averages the loss of every row: no per-position weights, which
  the padding of documents, the masked objective and the loss's own slice
  padding need (0/1 weights could be emulated by zeroing those rows of the
  hidden states and subtracting log V per row, fractional ones not at all);
- it has no mask for the padded vocabulary: its padding columns are columns
  of the kernel (zero at initialisation, logit 0), so they enter the softmax
  with weight e^0 and take gradient, and slicing the kernel to the real
  vocabulary (50,261) leaves a last block it pads with zero columns, the same
  error; the loss would differ from this project's by log(1 + pad·e^{-lse});
- its rows must be a multiple of its row block, at least 1,024 rows (a
  width that is not a multiple of its width block, e.g. d = 192, it masks);
- it takes one device's [rows, width] and [width, vocab] (no sharding rules:
  it would need a ``shard_map`` over the batch), picks its block sizes by
  asking the TPU it runs on (``pltpu.get_tpu_info``, so the preflight's
  ahead-of-time compile on a CPU cannot reach them without a device), and
  declares no ``pl.CostEstimate``, so the preflight could only price it by a
  model of its own;
- it pins typeguard 2.13.3 and brings pydantic, qwix and jaxtyping.
So it is not an implementation here. ``scaling.model.pallas_loss`` is this
project's own kernel for the same scheme, with the weights and the mask, and
this module (with the chunked loss) is the reference its tests hold it to.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from scaling.model.mesh import constrain
from scaling.model.transformer import _PADDING_LOGIT

VOCAB_BLOCK = 4096  # ids per block at most: a block of 8,192 positions' float32 logits is 128 MiB
LANE = 128  # block sizes are multiples of the TPU's vector lane width


def vocab_blocks(padded_vocab: int, block: int = VOCAB_BLOCK) -> tuple[int, int]:
    """``(blocks, ids per block)``: the fewest blocks of at most ``block`` ids (rounded up to a multiple of
    128) that cover ``padded_vocab`` ids, as equal as multiples of 128 allow (50,304 ids: 13 of 3,968)."""
    if padded_vocab < 1 or block < 1:
        raise ValueError(f"vocab_blocks: padded_vocab={padded_vocab} and block={block} must be >= 1")
    block = -(-block // LANE) * LANE
    count = -(-padded_vocab // block)
    size = -(-padded_vocab // count)
    return count, -(-size // LANE) * LANE


def kernel_blocks(kernel, block: int = VOCAB_BLOCK):
    """The unembedding [width, padded vocabulary] as [blocks, width, ids per block], zero columns appended
    (the loss masks them as padding ids)."""
    width, padded_vocab = kernel.shape
    count, size = vocab_blocks(padded_vocab, block)
    kernel = jnp.pad(kernel, ((0, 0), (0, count * size - padded_vocab)))
    return constrain(jnp.moveaxis(kernel.reshape(width, count, size), 1, 0), (None, None, "vocab"))


def _block_logits(hidden, kernel_block, start, vocab_size: int):
    """Logits [ids per block, ...positions] of one block starting at id ``start``, padding ids at a large
    negative. The block's ids lead, so the reductions over them need not reduce across a vector register's
    lanes; libtpu's estimate of L6-d128's step (v5e:2x4) is 77.9 ms so against 78.6 ms with the ids last."""
    logits = jnp.einsum("dv,...d->v...", kernel_block, hidden)
    real = start + jnp.arange(kernel_block.shape[-1]) < vocab_size
    return jnp.where(_leading(real, logits.ndim), logits, jnp.asarray(_PADDING_LOGIT, logits.dtype))


def _leading(vector, ndim: int):
    """A [n] vector as [n, 1, ...] (``ndim`` dimensions), to broadcast along the leading axis."""
    return vector.reshape(vector.shape + (1,) * (ndim - 1))


def _slice_lse(hidden, blocks, targets, vocab_size: int):
    """(log-sum-exp, target's logit) per position of one slice, float32, over the blocks by an online
    log-sum-exp: the running sum of exponentials is kept relative to the running maximum."""
    size = blocks.shape[-1]

    def add_block(carry, xs):
        peak, total, target = carry
        kernel_block, start = xs
        logits = _block_logits(hidden, kernel_block, start, vocab_size)
        new_peak = jnp.maximum(peak, logits.max(axis=0).astype(jnp.float32))
        total = total * jnp.exp(peak - new_peak) + jnp.exp(logits.astype(jnp.float32) - new_peak).sum(axis=0)
        local = targets - start
        picked = jnp.take_along_axis(logits, jnp.clip(local, 0, size - 1)[None], axis=0)[0]
        target = target + jnp.where((local >= 0) & (local < size), picked.astype(jnp.float32), 0.0)
        return (new_peak, total, target), None

    # The running maximum starts at the padding logit, not -inf: exp(start - real logit) is then 0, never nan.
    start = (jnp.full(targets.shape, _PADDING_LOGIT, jnp.float32), jnp.zeros(targets.shape, jnp.float32),
             jnp.zeros(targets.shape, jnp.float32))
    (peak, total, target), _ = jax.lax.scan(add_block, start, (blocks, jnp.arange(blocks.shape[0]) * size))
    return peak + jnp.log(total), target


def _slice_grads(hidden, blocks, kernel_grad, targets, scale, lse, vocab_size: int):
    """One slice's (hidden gradient float32, kernel gradient blocks float32 with this slice's added).

    ``scale`` is the loss's cotangent times each position's weight; each
    block's logits are recomputed and its softmax read off the forward pass's
    log-sum-exp ``lse``.
    """
    size = blocks.shape[-1]

    def block_grads(hidden_grad, xs):
        kernel_block, kernel_grad_block, start = xs
        logits = _block_logits(hidden, kernel_block, start, vocab_size)
        probs = jnp.exp(logits.astype(jnp.float32) - lse)
        hot = targets - start == _leading(jnp.arange(size), logits.ndim)
        logit_grad = ((probs - hot) * scale).astype(kernel_block.dtype)
        hidden_grad = hidden_grad + jnp.einsum("v...,dv->...d", logit_grad, kernel_block,
                                               preferred_element_type=jnp.float32)
        kernel_grad_block = kernel_grad_block + jnp.einsum("bpd,vbp->dv", hidden, logit_grad,
                                                           preferred_element_type=jnp.float32)
        return hidden_grad, kernel_grad_block

    starts = jnp.arange(blocks.shape[0]) * size
    return jax.lax.scan(block_grads, jnp.zeros(hidden.shape, jnp.float32), (blocks, kernel_grad, starts))


def _forward_sums(hidden, blocks, targets, weights, vocab_size: int):
    """(Σ weights · cross-entropy, log-sum-exp [slices, batch, positions]) over the slices."""
    def add_slice(total, xs):
        hidden_slice, target_slice, weight_slice = xs
        lse, target = _slice_lse(hidden_slice, blocks, target_slice, vocab_size)
        return total + ((lse - target) * weight_slice).sum(), (lse, target)

    total, (lse, target) = jax.lax.scan(add_slice, jnp.zeros((), jnp.float32), (hidden, targets, weights))
    return total, lse, target


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def fused_loss_sum(hidden, blocks, targets, weights, vocab_size: int):
    """Σ weights · (−log p(target)) in nats, float32.

    ``hidden`` [slices, batch, positions, width] are the final hidden states
    cut into slices of positions, ``blocks`` the unembedding from
    ``kernel_blocks`` [blocks, width, ids per block], both in the compute
    dtype; ``targets`` and ``weights`` [slices, batch, positions]. Ids at or
    beyond ``vocab_size`` are padding, never predicted.
    """
    return _forward_sums(hidden, blocks, targets, weights, vocab_size)[0]


def _fused_forward(hidden, blocks, targets, weights, vocab_size):
    total, lse, target = _forward_sums(hidden, blocks, targets, weights, vocab_size)
    return total, (hidden, blocks, targets, weights, lse, target)


def _fused_backward(vocab_size, saved, g):
    hidden, blocks, targets, weights, lse, target = saved

    def slice_grads(kernel_grad, xs):
        hidden_slice, target_slice, weight_slice, lse_slice = xs
        hidden_grad, kernel_grad = _slice_grads(hidden_slice, blocks, kernel_grad, target_slice,
                                                g * weight_slice, lse_slice, vocab_size)
        return kernel_grad, hidden_grad.astype(hidden.dtype)

    kernel_grad, hidden_grad = jax.lax.scan(slice_grads, jnp.zeros(blocks.shape, jnp.float32),
                                            (hidden, targets, weights, lse))
    weight_grad = ((lse - target) * g).astype(weights.dtype)
    return hidden_grad, kernel_grad.astype(blocks.dtype), np.zeros(targets.shape, jax.dtypes.float0), weight_grad


fused_loss_sum.defvjp(_fused_forward, _fused_backward)
