"""The fused linear cross-entropy as Pallas TPU kernels: each block of logits lives on chip only.

``model.loss_impl="pallas"``. ``scaling.model.fused_loss`` computes the same
loss in plain JAX, in vocabulary blocks; XLA still writes every block's
logits to HBM between the matmul that forms them and the passes that reduce
them, and libtpu prices those passes at about what the chunked loss's cost.
Here each [rows, ids] tile of logits stays in VMEM from the matmul that
forms it to the reductions that consume it. Two kernels carry a training
step:

- forward, a grid (row tiles, vocabulary tiles) with the vocabulary inner:
  the tile's logits, an online log-sum-exp (a running maximum and the sum
  of exponentials rescaled to it: "Online normalizer calculation for
  softmax", Milakov and Gimelshein, 2018, section 3) and the target's logit
  in float32 scratch; and, in the same pass, Σ_v p_v · kernel[:, v], the
  softmax's expectation of the unembedding's columns, accumulated and
  rescaled with the running maximum as flash attention rescales its output
  ("FlashAttention", Dao et al., 2022, section 3.1). The hidden states'
  gradient of Σ weights · loss is weight · (that expectation −
  kernel[:, target]): linear in the loss's cotangent, so the backward pass
  only scales it, and no kernel recomputes the logits for it;
- the unembedding's gradient, a grid (vocabulary tiles, row tiles) with the
  rows inner: the tile computed ids-first ([ids, rows]), the softmax read
  off the saved log-sum-exp, minus the one-hot, times the row's scale, times
  the hidden rows, summed over the rows in float32. Each output block is
  written by one run of its inner loop, as a Pallas TPU grid requires.

That is four matmul passes over the vocabulary (two per kernel) against the
chunked loss's three. Evaluation, which takes no gradient, runs a forward
kernel without the expectation (one pass). This is the blockwise scheme of
Cut Cross-Entropy ("Cut Your Losses in Large-Vocabulary Language Models",
Wijmans et al., ICLR 2025, section 4), written for this project's loss:
per-row weights (documents' padding, the masked objective) and a mask for
ids at or beyond the real vocabulary, which Tokamax's kernel lacks
(``scaling.model.fused_loss``).

Each kernel declares a ``pl.CostEstimate`` (its matmul FLOPs, exponentials
and HBM bytes), which the preflight prices by the roofline
(``sweeps.preflight.kernels``): libtpu writes no cycle estimate for a Pallas
kernel, and the vector unit's work on each logit is not in that price
(assumed to overlap the matrix unit, as the estimate's floor assumed).

Numbers: logits are rounded to the compute dtype as the chunked loss rounds
them, every reduction and accumulation is float32, and the gradients are
rounded once. On a CPU the kernels run in Pallas' interpreter (slow: tests
only); ``loss_impl="auto"`` never picks them off a TPU, and a GPU refuses
them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from scaling.model import mesh as mesh_lib
from scaling.model.transformer import _PADDING_LOGIT

# Tile sizes. Large tiles mean fewer grid steps (each has a fixed cost) and fewer re-reads of the operand the
# inner loop walks; the bound is VMEM: libtpu refuses a kernel whose double-buffered blocks, scratch and
# temporaries exceed its scoped VMEM (16 MiB by default on v5e), as it did for d = 2048 with [512, 2048]
# float32 blocks of the unembedding's gradient, and for d = 192 with 2,048-row tiles in the forward kernel
# (whose [rows, 1] statistics each fill [rows, 128] of VMEM, the lane width).
ROW_BLOCK = 1024  # rows per tile at most (fewer for wide models: ``row_block``); [1024, 512] f32 logits: 2 MiB
VOCAB_BLOCK = 512  # ids per tile of the forward kernels (fewer for wide models: ``vocab_block``)
TILE_ELEMENTS = 1024 * 512  # an [ids, width] tile of the unembedding (or its float32 gradient) at most
ROW_TILE_ELEMENTS = 1024 * 384  # a [rows, width] tile of the forward kernel's float32 expectation at most


MAX_WIDTH = 4096  # the widest model whose kernels fit the default scoped VMEM (compiled for v5e)


def row_block(rows: int, width: int, itemsize: int = 2) -> int:
    """Rows per tile for ``rows`` rows of ``width`` channels of ``itemsize`` bytes (2: bfloat16): the largest
    multiple of 128 (the lane width) up to ``ROW_BLOCK`` that divides ``rows`` rounded up to 128, fewer for
    wide models (the forward kernel's float32 expectation tile is rows × width, at most
    ``ROW_TILE_ELEMENTS``, halved for float32 inputs, whose tiles are twice the bytes)."""
    padded = -(-rows // 128) * 128
    budget = ROW_TILE_ELEMENTS * 2 // max(2, itemsize)
    block = max(128, min(ROW_BLOCK, budget // max(1, width), padded) // 128 * 128)
    while padded % block:
        block -= 128
    return block


def vocab_block(width: int, elements: int = 2 * TILE_ELEMENTS) -> int:
    """Ids per tile for a model of ``width`` channels: ``VOCAB_BLOCK``, halved (down to 128) while a tile of
    the unembedding, ids × width, has more than ``elements`` (so every tile size divides ``VOCAB_BLOCK``)."""
    block = VOCAB_BLOCK
    while block > 128 and block * width > elements:
        block //= 2
    return block


def ids_block(width: int) -> int:
    """Ids per tile of the unembedding-gradient kernel, whose float32 accumulator and output are ids × width:
    ``vocab_block`` with at most half of ``TILE_ELEMENTS`` in such a tile."""
    return vocab_block(width, TILE_ELEMENTS // 2)


def _tile_logits(logits, first_id, axis: int, vocab_size: int, dtype):
    """A float32 tile of logits rounded to ``dtype`` (the chunked loss's rounding), with ids at or beyond
    ``vocab_size`` at the padding logit; the ids run along ``axis`` from ``first_id``."""
    logits = logits.astype(dtype).astype(jnp.float32)
    ids = first_id + jax.lax.broadcasted_iota(jnp.int32, logits.shape, axis)
    return jnp.where(ids < vocab_size, logits, _PADDING_LOGIT), ids


def _dot(a, b, contract, upcast: bool):
    """A float32 product of two tiles contracting dimensions ``contract`` ((a's,), (b's,)); ``upcast`` multiplies
    bfloat16 tiles as float32 (exact products, as the matrix unit's), for the interpreter on a CPU, whose
    XLA has no bfloat16 × bfloat16 → float32 product."""
    if upcast:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _online_softmax_step(hidden_ref, kernel_ref, target_ref, peak, total, picked, vocab_size, vocab_block, upcast):
    """One vocabulary tile of the forward pass: the running maximum, the sum of exponentials rescaled to it
    and the target's logit updated in scratch; returns the tile's exp(logit - new maximum) and the factor
    exp(old maximum - new maximum) that rescales what was summed before."""
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        peak[...] = jnp.full(peak.shape, _PADDING_LOGIT, jnp.float32)  # exp(start - a real logit) is 0, not nan
        total[...] = jnp.zeros(total.shape, jnp.float32)
        picked[...] = jnp.zeros(picked.shape, jnp.float32)

    raw = _dot(hidden_ref[...], kernel_ref[...], ((1,), (0,)), upcast)  # [rows, ids]
    logits, ids = _tile_logits(raw, j * vocab_block, 1, vocab_size, hidden_ref.dtype)
    new_peak = jnp.maximum(peak[...], logits.max(axis=1, keepdims=True))
    rescale = jnp.exp(peak[...] - new_peak)
    exps = jnp.exp(logits - new_peak)
    total[...] = total[...] * rescale + exps.sum(axis=1, keepdims=True)
    peak[...] = new_peak
    picked[...] += jnp.where(ids == target_ref[...], logits, 0.0).sum(axis=1, keepdims=True)
    return exps, rescale


def _forward_kernel(hidden_ref, kernel_ref, target_ref, lse_ref, picked_ref, peak, total, picked, *,
                    vocab_size: int, vocab_block: int, upcast: bool):
    _online_softmax_step(hidden_ref, kernel_ref, target_ref, peak, total, picked, vocab_size, vocab_block, upcast)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        lse_ref[...] = peak[...] + jnp.log(total[...])
        picked_ref[...] = picked[...]


def _forward_expectation_kernel(hidden_ref, kernel_ref, target_ref, lse_ref, picked_ref, expect_ref, peak, total,
                                picked, acc, *, vocab_size: int, vocab_block: int, upcast: bool):
    """The forward kernel that also accumulates Σ_v p_v · kernel[:, v] per row (the softmax's expectation of
    the unembedding's columns), rescaled with the running maximum as flash attention rescales its output."""
    @pl.when(pl.program_id(1) == 0)
    def _():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    exps, rescale = _online_softmax_step(hidden_ref, kernel_ref, target_ref, peak, total, picked, vocab_size,
                                         vocab_block, upcast)
    # [rows, ids] · [width, ids]ᵀ: contract the ids of both
    acc[...] = acc[...] * rescale + _dot(exps.astype(kernel_ref.dtype), kernel_ref[...], ((1,), (1,)), upcast)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        lse_ref[...] = peak[...] + jnp.log(total[...])
        picked_ref[...] = picked[...]
        expect_ref[...] = acc[...] / total[...]


def _kernel_grad_kernel(hidden_ref, kernel_t_ref, target_ref, lse_ref, scale_ref, grad_ref, acc, *,
                        vocab_size: int, vocab_block: int, upcast: bool):
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    # [ids, width] · [rows, width]ᵀ: the tile ids-first, so its per-row values ([1, rows]) lie along the lanes
    raw = _dot(kernel_t_ref[...], hidden_ref[...], ((1,), (1,)), upcast)
    logits, ids = _tile_logits(raw, j * vocab_block, 0, vocab_size, hidden_ref.dtype)
    probs = jnp.exp(logits - lse_ref[...])
    logit_grad = ((probs - (ids == target_ref[...]).astype(jnp.float32)) * scale_ref[...]).astype(hidden_ref.dtype)
    acc[...] += _dot(logit_grad, hidden_ref[...], ((1,), (0,)), upcast)  # [ids, width]

    @pl.when(i == pl.num_programs(1) - 1)
    def _():
        grad_ref[...] = acc[...]


def _params(*semantics):
    return pltpu.CompilerParams(dimension_semantics=semantics)


def _cost(rows: int, width: int, ids: int, matmuls: int, bytes_accessed: int) -> pl.CostEstimate:
    return pl.CostEstimate(flops=2 * matmuls * rows * width * ids, transcendentals=rows * ids,
                           bytes_accessed=int(bytes_accessed))


def _shapes(hidden, kernel):
    rows, width = hidden.shape
    ids = kernel.shape[1]
    block = row_block(rows, width, hidden.dtype.itemsize)
    if rows % block or ids % VOCAB_BLOCK:
        raise ValueError(f"pallas loss: rows={rows} must be a multiple of {block} and ids={ids} of {VOCAB_BLOCK}"
                         " (pallas_loss_sum pads them)")
    return rows, width, ids, block, hidden.dtype.itemsize, vocab_block(width)


def _forward_call(hidden, kernel, targets, vocab_size: int, interpret: bool, expectation: bool):
    """The forward kernel over the tiles; with ``expectation`` the one that also accumulates it (one matmul
    pass more, its [rows, width] float32 accumulator and output)."""
    rows, width, ids, block, item, tile = _shapes(hidden, kernel)
    per_row = pl.BlockSpec((block, 1), lambda i, j: (i, 0))
    whole_rows = pl.BlockSpec((block, width), lambda i, j: (i, 0))
    column = jax.ShapeDtypeStruct((rows, 1), jnp.float32)
    out_specs, out_shape = [per_row, per_row], [column, column]
    scratch = [pltpu.VMEM((block, 1), jnp.float32)] * 3
    hbm_bytes = item * (rows * width + rows // block * width * ids) + 12 * rows
    if expectation:
        out_specs, out_shape = out_specs + [whole_rows], out_shape + [jax.ShapeDtypeStruct((rows, width), jnp.float32)]
        scratch, hbm_bytes = scratch + [pltpu.VMEM((block, width), jnp.float32)], hbm_bytes + 4 * rows * width
    kernel_fn = _forward_expectation_kernel if expectation else _forward_kernel
    return pl.pallas_call(
        functools.partial(kernel_fn, vocab_size=vocab_size, vocab_block=tile, upcast=interpret),
        grid=(rows // block, ids // tile),
        in_specs=[whole_rows, pl.BlockSpec((width, tile), lambda i, j: (0, j)), per_row],
        out_specs=out_specs, out_shape=out_shape, scratch_shapes=scratch,
        compiler_params=_params("parallel", "arbitrary"),
        cost_estimate=_cost(rows, width, ids, 2 if expectation else 1, hbm_bytes),
        interpret=interpret, name="pallas_ce_forward_expectation" if expectation else "pallas_ce_forward",
    )(hidden, kernel, targets)


def lse_and_target(hidden, kernel, targets, *, vocab_size: int, interpret: bool = False):
    """(log-sum-exp, target's logit) per row, float32 [rows, 1]: ``hidden`` [rows, width] and ``kernel``
    [width, ids] in the compute dtype (rows a multiple of ``row_block``, ids of ``VOCAB_BLOCK``),
    ``targets`` int32 [rows, 1]."""
    return _forward_call(hidden, kernel, targets, vocab_size, interpret, expectation=False)


def lse_target_expectation(hidden, kernel, targets, *, vocab_size: int, interpret: bool = False):
    """``lse_and_target`` and, float32 [rows, width], each row's Σ_v p_v · kernel[:, v], the term of the
    hidden states' gradient that needs the whole softmax (``_device_forward``): one matmul pass more over the
    tiles, in the same kernel."""
    return _forward_call(hidden, kernel, targets, vocab_size, interpret, expectation=True)


def kernel_grad(hidden, kernel, targets, lse, scale, *, vocab_size: int, interpret: bool = False):
    """d loss / d kernel [width, ids] in float32 (one device's rows only): ``lse`` and ``scale`` (the loss's
    cotangent times each row's weight) float32 [rows, 1], the rest as ``lse_and_target``."""
    rows, width, ids, block, item, _ = _shapes(hidden, kernel)
    id_block = ids_block(width)
    along_lanes = pl.BlockSpec((1, block), lambda j, i: (0, i))
    lanes = lambda x: x.reshape(1, rows)  # noqa: E731  [rows, 1] -> [1, rows]
    grad_t = pl.pallas_call(
        functools.partial(_kernel_grad_kernel, vocab_size=vocab_size, vocab_block=id_block, upcast=interpret),
        grid=(ids // id_block, rows // block),
        in_specs=[pl.BlockSpec((block, width), lambda j, i: (i, 0)),
                  pl.BlockSpec((id_block, width), lambda j, i: (j, 0)), along_lanes, along_lanes, along_lanes],
        out_specs=pl.BlockSpec((id_block, width), lambda j, i: (j, 0)),
        out_shape=jax.ShapeDtypeStruct((ids, width), jnp.float32),
        scratch_shapes=[pltpu.VMEM((id_block, width), jnp.float32)],
        compiler_params=_params("parallel", "arbitrary"),
        cost_estimate=_cost(rows, width, ids, 2, item * (ids * width + ids // id_block * rows * width)
                            + 4 * ids * width + 12 * rows * ids // id_block),
        interpret=interpret, name="pallas_ce_kernel_grad",
    )(hidden, kernel.T, lanes(targets), lanes(lse), lanes(scale))
    return grad_t.T


class _Rows:
    """Per-device [batch, length, ...] arrays as the kernels' [rows, ...], rows padded to the row block (the
    padded rows carry weight 0), and back."""

    def __init__(self, hidden):
        batch, length, width = hidden.shape
        self.shape, self.rows = (batch, length), batch * length
        self.extra = -self.rows % row_block(self.rows, width, hidden.dtype.itemsize)

    def flat(self, x, dtype=None):
        x = x.reshape(self.rows, -1).astype(dtype or x.dtype)
        return jnp.pad(x, ((0, self.extra), (0, 0)))

    def unflat(self, x):
        return x[:self.rows].reshape(*self.shape, *x.shape[1:])


def _device_lse(hidden, kernel, targets, vocab_size, interpret):
    rows = _Rows(hidden)
    lse, picked = lse_and_target(rows.flat(hidden), kernel, rows.flat(targets, jnp.int32), vocab_size=vocab_size,
                                 interpret=interpret)
    return rows.unflat(lse)[..., 0], rows.unflat(picked)[..., 0]


def _device_forward(hidden, kernel, targets, weights, vocab_size, interpret):
    """(log-sum-exp, target's logit, d(Σ weights · loss) / d hidden in float32) of one device's rows. The
    gradient is weight · (Σ_v p_v · kernel[:, v] − kernel[:, target]): linear in the loss's cotangent, so the
    backward pass only scales it."""
    rows = _Rows(hidden)
    lse, picked, expectation = lse_target_expectation(rows.flat(hidden), kernel, rows.flat(targets, jnp.int32),
                                                      vocab_size=vocab_size, interpret=interpret)
    target_columns = jnp.take(kernel, targets, axis=1, mode="clip")  # [width, batch, length]
    grad = (rows.unflat(expectation) - jnp.moveaxis(target_columns, 0, -1).astype(jnp.float32)) \
        * weights.astype(jnp.float32)[..., None]
    return rows.unflat(lse)[..., 0], rows.unflat(picked)[..., 0], grad


def _device_kernel_grad(hidden, kernel, targets, lse, scale, vocab_size, interpret, batch_axes):
    rows = _Rows(hidden)
    d_kernel = kernel_grad(rows.flat(hidden), kernel, rows.flat(targets, jnp.int32), rows.flat(lse),
                           rows.flat(scale), vocab_size=vocab_size, interpret=interpret)
    return jax.lax.psum(d_kernel, batch_axes) if batch_axes else d_kernel


def _on_devices(fn, batch_axes, in_batched, out_batched):
    """``fn`` on each device's rows of the batch under the active mesh (``shard_map``), whole arrays for the
    arguments and results flagged False; ``fn`` itself without a mesh of several devices."""
    mesh = mesh_lib.active_mesh()
    if mesh is None or mesh.devices.size == 1:
        return fn
    spec = lambda batched: jax.sharding.PartitionSpec(batch_axes or None) if batched else jax.sharding.PartitionSpec()  # noqa: E731
    out_specs = spec(out_batched) if isinstance(out_batched, bool) else tuple(map(spec, out_batched))
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(map(spec, in_batched)), out_specs=out_specs,
                         check_vma=False)


def _batch_axes(batch: int) -> tuple[str, ...]:
    rows = mesh_lib.activation_spec(("batch",), (batch,))[0]
    return () if rows is None else (rows,) if isinstance(rows, str) else tuple(rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _loss_sum(hidden, kernel, targets, weights, vocab_size: int, interpret: bool):
    axes = _batch_axes(hidden.shape[0])  # not differentiated (evaluation): the forward kernel alone
    lse, picked = _on_devices(functools.partial(_device_lse, vocab_size=vocab_size, interpret=interpret), axes,
                              (True, False, True), (True, True))(hidden, kernel, targets)
    return ((lse - picked) * weights.astype(jnp.float32)).sum()


def _loss_forward(hidden, kernel, targets, weights, vocab_size, interpret):
    axes = _batch_axes(hidden.shape[0])
    lse, picked, hidden_grad = _on_devices(
        functools.partial(_device_forward, vocab_size=vocab_size, interpret=interpret), axes,
        (True, False, True, True), (True, True, True))(hidden, kernel, targets, weights)
    total = ((lse - picked) * weights.astype(jnp.float32)).sum()
    return total, (hidden, kernel, targets, weights, lse, picked, hidden_grad)


def _loss_backward(vocab_size, interpret, saved, g):
    hidden, kernel, targets, weights, lse, picked, hidden_grad = saved
    axes = _batch_axes(hidden.shape[0])
    grads = functools.partial(_device_kernel_grad, vocab_size=vocab_size, interpret=interpret, batch_axes=axes)
    d_kernel = _on_devices(grads, axes, (True, False, True, True, True), False)(
        hidden, kernel, targets, lse, g * weights.astype(jnp.float32))
    return ((g * hidden_grad).astype(hidden.dtype), d_kernel.astype(kernel.dtype),
            np.zeros(targets.shape, jax.dtypes.float0), ((lse - picked) * g).astype(weights.dtype))


_loss_sum.defvjp(_loss_forward, _loss_backward)


def pallas_loss_sum(hidden, kernel, targets, weights, *, vocab_size: int, interpret: bool | None = None):
    """Σ weights · (−log p(target)) in nats, float32, by the kernels above.

    ``hidden`` [batch, length, width] and ``kernel`` [width, padded vocabulary]
    in the compute dtype, ``targets`` and ``weights`` [batch, length]; ids at
    or beyond ``vocab_size`` are padding. Under a mesh each device takes its
    rows of the batch (``shard_map``) with the whole unembedding (gathered if
    the vocabulary is split: redundant work under tensor parallelism), and
    the unembedding's gradient is summed over the batch's devices in float32
    before it is rounded. ``interpret`` (default: off a TPU) runs Pallas'
    interpreter.
    """
    if kernel.shape[0] > MAX_WIDTH:
        raise ValueError(f"model.loss_impl='pallas' supports widths up to {MAX_WIDTH} (got {kernel.shape[0]}): "
                         "its tiles would not fit the TPU's scoped VMEM; use loss_impl='fused' or 'chunked'")
    if interpret is None:
        mesh = mesh_lib.active_mesh()
        platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
        if platform not in ("tpu", "cpu"):  # the interpreter would train, hundreds of times slower
            raise ValueError(f"model.loss_impl='pallas' runs TPU kernels (Pallas' interpreter on a CPU, for "
                             f"tests); on {platform} use loss_impl='auto', 'chunked' or 'fused'")
        interpret = platform != "tpu"
    padded_vocab = kernel.shape[1]
    padded = jnp.pad(kernel, ((0, 0), (0, -padded_vocab % VOCAB_BLOCK)))  # zero columns, masked as padding ids
    return _loss_sum(hidden, padded, targets, weights, vocab_size, interpret)
