"""Analytic costs of the Pallas kernels the model calls, for the roofline (``sweeps.preflight.hlo_cost``).

A Pallas kernel is one ``custom-call`` in compiled HLO (``tpu_custom_call``)
whose cost the HLO cannot show: the compiler's cost analysis gives it none.
The splash-attention kernels of ``scaling.model.attention`` are recognised by
their names (``splash_mha_fwd``, ``splash_mha_dq``, ``splash_mha_dkv``,
with or without residuals or segments) and priced from their operands' shapes:

- FLOPs: ``scaling.model.attention.attention_flops_per_call`` (the matmuls the
  kernel runs, causal blocks above the diagonal skipped);
- HBM bytes: every operand and result once, plus the keys and values read
  again for every further block of queries that needs them.

Any other kernel is left unpriced, and the roofline then reports the step's
cost as unknown rather than leave the kernel out.
"""

from __future__ import annotations

import math
import re

from scaling.config import ModelConfig
from scaling.model import attention

_SPLASH = re.compile(r"splash_mha_(fwd|dq|dkv)")
FLOATS = ("bf16", "f32", "f16")  # the dtypes of q, k and v; block masks and segment ids are integers


def splash_cost(instruction, operands, causal: bool):
    """(kernel name, FLOPs, HBM bytes) of one splash-attention custom call, or None if it is not one."""
    match = _SPLASH.search(instruction.name) or _SPLASH.search(instruction.attributes)
    if not match:
        return None
    phase = match.group(1)
    floats = [a for a in operands if a is not None and a.dtype in FLOATS and len(a.dims) >= 3]
    if len(floats) < 3:
        return None
    query = floats[0]  # [..., heads, length, head_dim]: q, k, v come first, in that order
    *lead, heads, length, head_dim = query.dims
    batch = math.prod(lead)
    flops = attention.attention_flops_per_call(batch, heads, length, head_dim, causal)[phase]
    block = attention.flash_block(length)
    blocks = length // block
    density = (blocks + 1) / (2 * blocks) if causal else 1.0
    touched = sum(a.nbytes for a in operands if a is not None) + sum(a.nbytes for a in instruction.arrays)
    rereads = (blocks * density - 1) * (floats[1].nbytes + floats[2].nbytes) if blocks > 1 else 0.0
    return f"splash_mha_{phase}", flops, touched + rereads


def kernel_cost(model: ModelConfig):
    """The ``hlo_cost.KernelCost`` of ``model``'s kernels: splash attention, causal for the causal objective."""
    causal = model.objective == "causal"

    def cost(instruction, operands):
        return splash_cost(instruction, operands, causal)

    return cost
