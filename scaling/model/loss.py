"""The training objectives' losses, computed so that whole logits never exist.

``[batch, length, vocab]`` float32 logits are the largest array of a small
model's step (with a 50k vocabulary they dwarf every activation), so the
model hands over its final hidden states and unembedding kernel
(``Transformer(..., return_hidden=True)``) and:

- ``cross_entropy_sum`` gathers the unembedding once, then forms the logits
  for a slice of the sequence at a time under ``jax.lax.scan``; each
  slice's logits are recomputed in the backward pass (a custom VJP that
  also sums the kernel's gradient in float32), so the backward pass is
  sliced too;
- ``label_cross_entropy_sums`` (classification) only ever forms the two
  label logits;
- ``loss_and_grads`` splits a batch into microbatches (gradient
  accumulation) and returns exactly the full batch's token-weighted mean
  loss and its gradient: it sums losses, weights and gradients over the
  microbatches and divides once, never averaging means.

``compute_loss`` is the one-call form used by evaluation and tests.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scaling.config import LOSS_IMPLS
from scaling.model import fused_loss, pallas_loss
from scaling.model.mesh import active_mesh, activation_shards, constrain
from scaling.model.transformer import _DTYPES, _PADDING_LOGIT, Transformer, unembed


def mask_for_mlm(rng, inputs, input_mask, *, rate: float, mask_id: int, random_token_limit: int):
    """BERT-style masking of token ids [batch, length].

    Each real token is selected with probability ``rate``; a selected token is
    replaced by ``mask_id`` 80% of the time, by a random id in
    [0, random_token_limit) 10% of the time, and kept 10% of the time.
    Returns ``(masked_inputs, targets, weights)``: the loss counts selected
    positions only (weights 1.0 there, 0.0 elsewhere).
    """
    select_key, action_key, random_key = jax.random.split(rng, 3)
    real = jnp.ones(inputs.shape, bool) if input_mask is None else input_mask > 0
    selected = (jax.random.uniform(select_key, inputs.shape) < rate) & real
    action = jax.random.uniform(action_key, inputs.shape)
    random_ids = jax.random.randint(random_key, inputs.shape, 0, random_token_limit, dtype=inputs.dtype)
    masked = jnp.where(selected & (action < 0.8), mask_id, inputs)
    masked = jnp.where(selected & (action >= 0.8) & (action < 0.9), random_ids, masked)
    return masked, inputs, selected.astype(jnp.float32)


def _logits(hidden, kernel, vocab_size: int):
    """Logits [..., padded vocabulary] in the dtype of ``hidden`` and ``kernel`` (bf16 in bf16 models).

    Ids at or beyond ``vocab_size`` (the padding) get a large negative logit:
    zero probability and zero gradient. Rounding the logits to bf16 is what
    the bf16 matmul always did; only the log-sum-exp needs float32.
    """
    logits = jnp.dot(hidden, kernel)
    if kernel.shape[-1] == vocab_size:
        return logits
    real = jnp.arange(kernel.shape[-1]) < vocab_size
    return jnp.where(real, logits, jnp.asarray(_PADDING_LOGIT, logits.dtype))


def _token_losses(logits, targets):
    """(−log p(target), log-sum-exp) per position, float32, from logits in any float dtype.

    Only the sum of exponentials runs in float32, converted on the fly: the
    maximum and the target's logit are read from the logits as they are, so
    no float32 copy of the logits is ever written.
    """
    peak = jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True)).astype(jnp.float32)
    lse = jnp.log(jnp.exp(logits.astype(jnp.float32) - peak).sum(axis=-1)) + peak[..., 0]
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0].astype(jnp.float32)
    return lse - target, lse


def _slice_loss_sum(hidden, kernel, targets, weights, vocab_size: int):
    return (_token_losses(_logits(hidden, kernel, vocab_size), targets)[0] * weights).sum()


def _sliced_sums(hidden, kernel, targets, weights, vocab_size: int):
    """(Σ weights · cross-entropy, log-sum-exp per position [slices, batch, positions]) over the slices."""
    def add_slice(total, xs):
        hidden_slice, target_slice, weight_slice = xs
        losses, lse = _token_losses(_logits(hidden_slice, kernel, vocab_size), target_slice)
        return total + (losses * weight_slice).sum(), lse

    return jax.lax.scan(add_slice, jnp.zeros((), jnp.float32), (hidden, targets, weights))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _sliced_loss_sum(hidden, kernel, targets, weights, vocab_size: int):
    """Σ weights · cross-entropy over slices: ``hidden`` [slices, batch, positions, width], ``kernel`` whole."""
    return _sliced_sums(hidden, kernel, targets, weights, vocab_size)[0]


def _sliced_forward(hidden, kernel, targets, weights, vocab_size):
    total, lse = _sliced_sums(hidden, kernel, targets, weights, vocab_size)
    return total, (hidden, kernel, targets, weights, lse)


def _sliced_backward(vocab_size, saved, g):
    # One slice's logits at a time again, recomputed; the log-sum-exp is the
    # forward pass's, and the unembedding's gradient is summed over slices in
    # float32 and rounded once, at the end.
    hidden, kernel, targets, weights, lse = saved

    def slice_grads(kernel_grad, xs):
        hidden_slice, target_slice, weight_slice, lse_slice = xs
        logits = _logits(hidden_slice, kernel, vocab_size)
        probs = jnp.exp(logits.astype(jnp.float32) - lse_slice[..., None])
        hot = jax.nn.one_hot(target_slice, logits.shape[-1], dtype=jnp.float32)
        logit_grad = ((probs - hot) * (g * weight_slice)[..., None]).astype(kernel.dtype)
        hidden_grad = jnp.einsum("bpv,dv->bpd", logit_grad, kernel)
        kernel_grad = kernel_grad + jnp.einsum("bpd,bpv->dv", hidden_slice, logit_grad,
                                               preferred_element_type=jnp.float32)
        target = jnp.take_along_axis(logits, target_slice[..., None], axis=-1)[..., 0].astype(jnp.float32)
        return kernel_grad, (hidden_grad, (lse_slice - target) * g)

    kernel_grad, (hidden_grad, weight_grad) = jax.lax.scan(
        slice_grads, jnp.zeros(kernel.shape, jnp.float32), (hidden, targets, weights, lse))
    target_grad = np.zeros(targets.shape, jax.dtypes.float0)
    return hidden_grad, kernel_grad.astype(kernel.dtype), target_grad, weight_grad.astype(weights.dtype)


_sliced_loss_sum.defvjp(_sliced_forward, _sliced_backward)


def slice_positions(batch: int, length: int, chunk_tokens: int, batch_shards: int = 1) -> int:
    """Positions of every sequence per loss slice: about ``chunk_tokens`` of one device's rows at a time.

    A device holds ``batch / batch_shards`` rows, so a slice of p positions
    forms p × rows_per_device logits rows on each device.
    """
    rows = max(1, batch // max(1, batch_shards))
    return min(length, max(1, chunk_tokens // rows))


# ``loss_impl="auto"``: the Pallas kernels on TPU when a device's tokens outnumber the width
# ``FUSED_TOKENS_PER_CHANNEL`` times or more and the vocabulary is not split over devices, chunked otherwise.
# libtpu's estimates (benchmarks/loss_estimates.md, v5e) price the kernels far cheaper than the chunked loss for
# the paper sweep's L6 rows (32,768 tokens per chip, d = 128..320: 100..256 tokens per channel) and dearer for
# GPT-3 XL at fsdp=256 (2,048 tokens per chip, d = 2048: 1 per channel), where the loss is a small part of the
# step and the kernels' re-reads of the unembedding cost more than the logits they spare. Under tensor
# parallelism every device would run the whole vocabulary (``scaling.model.pallas_loss``), so the chunked loss
# keeps it split. On a CPU or GPU the kernels do not compile (Pallas' interpreter only), and the plain-JAX
# fused loss measured no faster than the chunked one on a CPU (benchmarks/README.md).
FUSED_TOKENS_PER_CHANNEL = 64  # measured: >= 102 cheaper blocked (fused, pallas), 1 dearer; between untested


def resolve_loss_impl(impl: str, device_tokens: int = 0, width: int = 1, vocab_shards: int = 1) -> str:
    """``impl`` as the loss computes it for ``device_tokens`` positions per device of ``width`` channels with
    the vocabulary in ``vocab_shards`` pieces: ``auto`` becomes ``pallas`` on a TPU when ``device_tokens >=
    FUSED_TOKENS_PER_CHANNEL * width`` and ``vocab_shards == 1``, and ``chunked`` otherwise. The platform is
    that of the mesh the step is traced for (``activation_sharding``'s; outside one, JAX's default backend), so
    a TPU program compiled ahead of time on a CPU gets the TPU's."""
    if impl != "auto":
        return impl
    mesh = active_mesh()
    platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
    many_tokens = device_tokens >= FUSED_TOKENS_PER_CHANNEL * width
    return "pallas" if platform == "tpu" and many_tokens and vocab_shards == 1 else "chunked"


def cross_entropy_sum(hidden, kernel, targets, weights, *, vocab_size: int, compute_dtype: str,
                      chunk_tokens: int, impl: str = "chunked", vocab_block: int | None = None) -> jax.Array:
    """Σ weights · (−log p(target)) in nats over [batch, length] positions (float32 scalar).

    ``hidden`` [batch, length, width] are the final hidden states, ``kernel``
    [width, padded vocabulary] the unembedding (ids >= ``vocab_size`` are
    padding and never predicted). The kernel is cast to ``compute_dtype`` and
    made whole over the fsdp axis here, once, before the slice loop, so the
    loop reads the same gathered copy in every slice, forward and backward
    (referenced only inside the loop, it was gathered again in every slice).
    The logits are formed for ``slice_positions`` positions of every
    sequence at a time, about ``chunk_tokens`` rows per device, in
    ``compute_dtype``, with the log-sum-exp in float32; the backward pass
    recomputes one slice's logits at a time and sums the kernel's gradient
    in float32. Slicing the sequence rather than the batch keeps each slice
    spread over the batch's shards. A device's rows of at most
    ``chunk_tokens`` tokens are computed in one piece.
    ``impl`` (``ModelConfig.loss_impl``; ``auto`` as ``resolve_loss_impl`` decides for this shape):
    ``chunked`` forms a slice's logits over the whole vocabulary; ``fused`` (``scaling.model.fused_loss``) also
    cuts the vocabulary into blocks of at most ``vocab_block`` ids
    (default ``fused_loss.VOCAB_BLOCK``); ``pallas`` (``scaling.model.pallas_loss``) runs the blocks as TPU
    kernels over each device's rows whole (Pallas' interpreter off a TPU: for tests, slow).
    """
    if impl not in LOSS_IMPLS:
        raise ValueError(f"impl={impl!r} is invalid: allowed one of {', '.join(LOSS_IMPLS)}")
    dtype = _DTYPES[compute_dtype]
    kernel = constrain(kernel.astype(dtype), (None, "vocab"))
    hidden = hidden.astype(dtype)
    batch, length, width = hidden.shape
    shards = activation_shards("batch", batch)
    impl = resolve_loss_impl(impl, max(1, batch // shards) * length, width, activation_shards("vocab", kernel.shape[1]))
    chunk = slice_positions(batch, length, chunk_tokens, shards)
    if impl == "pallas":  # the kernels take each device's rows whole: no slices
        return pallas_loss.pallas_loss_sum(hidden, kernel, targets, weights, vocab_size=vocab_size)
    if chunk == length and impl == "chunked":
        return _slice_loss_sum(hidden, kernel, targets, weights, vocab_size)
    chunks = -(-length // chunk)
    padding = chunks * chunk - length  # extra positions carry weight 0
    if padding:
        hidden = jnp.pad(hidden, ((0, 0), (0, padding), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, padding)))
        weights = jnp.pad(weights, ((0, 0), (0, padding)))

    def slices(array):  # [batch, chunks * chunk, ...] -> [chunks, batch, chunk, ...]
        return jnp.moveaxis(array.reshape(batch, chunks, chunk, *array.shape[2:]), 1, 0)

    if impl == "fused":
        blocks = fused_loss.kernel_blocks(kernel, vocab_block or fused_loss.VOCAB_BLOCK)
        return fused_loss.fused_loss_sum(slices(hidden), blocks, slices(targets), slices(weights), vocab_size)
    return _sliced_loss_sum(slices(hidden), kernel, slices(targets), slices(weights), vocab_size)


def label_cross_entropy_sums(hidden, kernel, targets, weights, label_ids: tuple[int, int], compute_dtype: str):
    """Binary classification read from two logits of the vocabulary.

    Only the logits of ``label_ids`` (class 0's token, class 1's token)
    count: their difference is the classifier's logit, so this is the
    sigmoid output layer of "Overcoming a Theoretical Limitation of
    Self-Attention" (section 2.1), whatever the other logits say; only those
    two columns of the unembedding are ever multiplied. ``targets`` hold the
    label token at weighted positions. Returns ``(Σ weights · cross-entropy
    in nats, Σ weights of correct predictions)``.
    """
    pair = unembed(hidden, kernel[:, jnp.asarray(label_ids)], 2, compute_dtype)  # [batch, length, 2]
    classes = (targets == label_ids[1]).astype(jnp.int32)
    losses = optax.softmax_cross_entropy_with_integer_labels(pair, classes)
    correct = (jnp.argmax(pair, axis=-1) == classes).astype(jnp.float32)
    return (losses * weights).sum(), (correct * weights).sum()


def objective_batch(model: Transformer, batch: dict, rng, *, mask_id: int | None = None,
                    random_token_limit: int | None = None):
    """``(batch, dropout_rng)``: the batch the loss sees, and the key for dropout.

    For the masked objective on LM data (``mask_id`` given), the inputs are
    masked with a key drawn from ``rng`` and the targets and weights become
    the original tokens at the masked positions; otherwise ``batch`` passes
    through. ``rng`` None means ``PRNGKey(0)``.
    """
    cfg = model.config
    rng = jax.random.PRNGKey(0) if rng is None else rng
    mask_rng, dropout_rng = jax.random.split(rng)
    prepared = {"inputs": batch["inputs"], "targets": batch["targets"], "weights": batch["weights"],
                "input_mask": batch.get("input_mask")}
    if cfg.objective == "masked" and mask_id is not None:
        prepared["inputs"], prepared["targets"], prepared["weights"] = mask_for_mlm(
            mask_rng, batch["inputs"], prepared["input_mask"], rate=cfg.mask_rate, mask_id=mask_id,
            random_token_limit=random_token_limit or cfg.vocab_size)
    return prepared, dropout_rng


def loss_sums(model: Transformer, params, batch: dict, *, dropout_rng, deterministic: bool = True,
              label_ids: tuple[int, int] | None = None) -> dict:
    """Summed loss of an ``objective_batch``: ``loss_sum`` (nats, weighted), ``tokens`` (Σ weights),
    ``correct`` (weighted correct labels; 0 without ``label_ids``)."""
    cfg = model.config
    hidden, kernel = model.apply({"params": params}, batch["inputs"], batch["input_mask"],
                                 deterministic=deterministic, rngs={"dropout": dropout_rng}, return_hidden=True)
    targets, weights = batch["targets"], batch["weights"]
    if label_ids is not None:
        loss_sum, correct = label_cross_entropy_sums(hidden, kernel, targets, weights, label_ids, cfg.compute_dtype)
    else:
        loss_sum = cross_entropy_sum(hidden, kernel, targets, weights, vocab_size=cfg.vocab_size,
                                     compute_dtype=cfg.compute_dtype, chunk_tokens=cfg.loss_chunk_tokens,
                                     impl=cfg.loss_impl)
        correct = jnp.zeros((), jnp.float32)
    return {"loss_sum": loss_sum, "tokens": weights.sum(), "correct": correct}


def _mean(sums: dict, label_ids) -> tuple[jax.Array, dict]:
    loss = sums["loss_sum"] / jnp.maximum(sums["tokens"], 1.0)
    aux = {"loss": loss, "tokens": sums["tokens"]}
    if label_ids is not None:
        aux["correct"] = sums["correct"]
    return loss, aux


def compute_loss(model: Transformer, params, batch: dict, *, rng=None, deterministic: bool = True,
                 mask_id: int | None = None, random_token_limit: int | None = None,
                 label_ids: tuple[int, int] | None = None):
    """Loss in nats per predicted token for one batch of the data pipeline's format.

    ``batch`` holds ``inputs``, ``targets``, ``weights`` and ``input_mask``
    ([batch, length] arrays). For the masked objective on LM data
    (``mask_id`` given), ``inputs`` are masked here with ``rng`` and the
    targets are the original tokens; otherwise the batch's targets are used.
    ``label_ids`` (classification tasks) reads each label from those two
    logits only (``label_cross_entropy_sums``); the aux dict then also holds
    ``correct``, the number of correctly classified examples.
    Returns ``(loss, {"loss": ..., "tokens": number of predicted tokens})``.
    """
    prepared, dropout_rng = objective_batch(model, batch, rng, mask_id=mask_id, random_token_limit=random_token_limit)
    sums = loss_sums(model, params, prepared, dropout_rng=dropout_rng, deterministic=deterministic,
                     label_ids=label_ids)
    return _mean(sums, label_ids)


def loss_and_grads(model: Transformer, params, batch: dict, *, rng=None, microbatches: int = 1,
                   deterministic: bool = True, mask_id: int | None = None, random_token_limit: int | None = None,
                   label_ids: tuple[int, int] | None = None):
    """``(loss, aux, grads)`` of ``compute_loss`` on the whole ``batch``, in ``microbatches`` passes.

    Masking (masked objective) is drawn once for the whole batch, then the
    batch is cut into ``microbatches`` interleaved slices (sequence i goes to
    microbatch i mod k, so a batch sharded by rows leaves every microbatch
    spread over all shards) and a ``jax.lax.scan`` sums each slice's weighted
    loss, weights and gradient; one division by the total weight at the end
    gives the full batch's mean loss and gradient. Only one microbatch's
    activations are alive at a time. Dropout draws a different key per
    microbatch, so with dropout the noise (not the data) depends on the split.
    """
    def mean_loss(p):
        return compute_loss(model, p, batch, rng=rng, deterministic=deterministic, mask_id=mask_id,
                            random_token_limit=random_token_limit, label_ids=label_ids)

    if microbatches == 1:
        (loss, aux), grads = jax.value_and_grad(mean_loss, has_aux=True)(params)
        return loss, aux, grads
    rows = batch["inputs"].shape[0]
    if rows % microbatches:
        raise ValueError(f"microbatches={microbatches} is invalid: allowed a divisor of the batch's {rows} rows")
    prepared, dropout_rng = objective_batch(model, batch, rng, mask_id=mask_id, random_token_limit=random_token_limit)

    def interleave(array):  # [rows, ...] -> [microbatches, rows // microbatches, ...]
        return jnp.moveaxis(array.reshape(rows // microbatches, microbatches, *array.shape[1:]), 1, 0)

    micro = jax.tree_util.tree_map(interleave, prepared)

    def add_microbatch(totals, xs):
        index, piece = xs

        def summed(p):
            sums = loss_sums(model, p, piece, dropout_rng=jax.random.fold_in(dropout_rng, index),
                             deterministic=deterministic, label_ids=label_ids)
            return sums["loss_sum"], sums

        (_, sums), grads = jax.value_and_grad(summed, has_aux=True)(params)
        grad_sum, counts = totals
        grad_sum = jax.tree_util.tree_map(lambda total, g: total + g.astype(jnp.float32), grad_sum, grads)
        return (grad_sum, jax.tree_util.tree_map(jnp.add, counts, sums)), None

    zeros = (jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
             {key: jnp.zeros((), jnp.float32) for key in ("loss_sum", "tokens", "correct")})
    (grad_sum, sums), _ = jax.lax.scan(add_microbatch, zeros, (jnp.arange(microbatches), micro))
    scale = 1.0 / jnp.maximum(sums["tokens"], 1.0)
    grads = jax.tree_util.tree_map(lambda total, p: (total * scale).astype(p.dtype), grad_sum, params)
    loss, aux = _mean(sums, label_ids)
    return loss, aux, grads
