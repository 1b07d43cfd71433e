"""An upper bound on the MFU a shape can reach on a device, from arithmetic alone (a roofline).

Nothing is measured here: with no device at hand, the efficiency a piece plans with can only be bounded.
Each step is split into the operations that carry the model's FLOPs: per layer the four dense matrix
products (queries/keys/values, attention output, the two feed-forward ones), the attention scores and
their weighted sum per head, and the unembedding. Each takes at least the longer of its FLOPs at the
device's peak and its bytes at the memory bandwidth (inputs, weights and outputs once each in the compute
dtype). Attention without a fused kernel (``model.attention_impl="xla"``) also writes and reads its float32
scores matrix ``SCORE_PASSES`` times, over the part of it its causal query blocks form; a fused kernel
(``flash``: cuDNN's on a GPU) keeps the scores on chip, so only its FLOPs count. Backward costs twice the
forward in both. Everything else (normalisation, activations, the
optimizer, kernel launches) only adds time, so the result bounds the MFU from above; a plan must assume
less, and the first piece measures it.
"""

from __future__ import annotations

from scaling.config import ModelConfig
from scaling.hardware import Accelerator
from scaling.model.attention import CAUSAL_QUERY_BLOCKS
from scaling.model.flops import training_flops_per_token

SCORE_PASSES = 4  # scores written, read by softmax, probabilities written, read by the weighted sum (forward)
SCORE_BYTES = 4  # the XLA path forms the scores in float32 (scaling.model.attention)
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def _matmul_seconds(rows: float, inner: float, cols: float, nbytes: int, peak: float, bandwidth: float) -> float:
    """Forward and backward seconds, at least, of a (rows × inner) by (inner × cols) product."""
    flops = 2.0 * rows * inner * cols
    moved = nbytes * (rows * inner + inner * cols + rows * cols)
    return 3.0 * max(flops / peak, moved / bandwidth)


def step_seconds_bound(model: ModelConfig, seq_len: int, batch: int, device: Accelerator) -> float:
    """The least seconds one training step of ``batch`` sequences of ``seq_len`` tokens can take on ``device``."""
    dtype = model.compute_dtype
    nbytes, peak, bandwidth = DTYPE_BYTES.get(dtype, 4), device.peak_flops(dtype), device.hbm_bandwidth
    tokens, d, heads = batch * seq_len, model.width, model.width // model.head_dim
    layer = sum(_matmul_seconds(tokens, d, out, nbytes, peak, bandwidth) for out in (3 * d, d))
    layer += _matmul_seconds(tokens, d, model.ff_width, nbytes, peak, bandwidth)
    layer += _matmul_seconds(tokens, model.ff_width, d, nbytes, peak, bandwidth)
    # Scores and weighted sum per head: 2·S·S·head_dim FLOPs each per sequence; the S×S matrix moved unless fused.
    attention_flops = 2 * 2.0 * batch * heads * seq_len * seq_len * model.head_dim
    formed = (1 + 1 / CAUSAL_QUERY_BLOCKS) / 2 if model.objective == "causal" else 1.0  # blocks skip the rest
    attention_bytes = 0.0 if model.attention_impl == "flash" else (
        SCORE_PASSES * SCORE_BYTES * batch * heads * seq_len * seq_len * formed)
    layer += 3.0 * max(attention_flops / peak, attention_bytes / bandwidth)
    unembed = _matmul_seconds(tokens, d, model.vocab_size, nbytes, peak, bandwidth)
    return model.depth * layer + unembed


def mfu_bound(model: ModelConfig, seq_len: int, batch: int, device: Accelerator) -> float:
    """The highest MFU (model FLOPs over the step's least seconds, as a fraction of the peak) ``model`` can reach."""
    flops = training_flops_per_token(model, seq_len).total * batch * seq_len
    return flops / (step_seconds_bound(model, seq_len, batch, device) * device.peak_flops(model.compute_dtype))


def bound_line(runs, device: Accelerator, assumed: float) -> str:
    """One line for dry-run: the MFU bound at the smallest and largest shapes of ``runs`` on ``device``."""
    by_shape = {}
    for run in runs:
        by_shape.setdefault((run.depth, run.width), run)
    shapes = sorted(by_shape.values(), key=lambda run: run.flops / run.config.steps)
    if not shapes:
        return "arithmetic MFU bound: no runs"
    bounds = [(f"L{run.depth}-d{run.width}", mfu_bound(run.config.model, run.config.data.seq_len, run.config.batch_size,
                                                        device)) for run in (shapes[0], shapes[-1])]
    return (f"arithmetic MFU bound on {device.name} (roofline, {device.hbm_bandwidth / 1e12:.1f} TB/s, "
            f"{shapes[0].config.model.attention_impl} attention; not measured): {bounds[0][1]:.0%} at {bounds[0][0]} "
            f"to {bounds[1][1]:.0%} at {bounds[1][0]}; the plan assumes {assumed:.0%}")
