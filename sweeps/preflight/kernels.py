"""Costs of the Pallas kernels the model calls, for the roofline (``sweeps.preflight.hlo_cost``).

A Pallas kernel is one ``custom-call`` in compiled HLO (``tpu_custom_call``)
whose cost the HLO's own cost analysis does not give. Each kernel is priced
one of two ways, and its name in the estimate's ``kernels`` says which
(``cost_source``); a kernel priced neither way is never counted as free:

- a stated model: the splash-attention kernels of ``scaling.model.attention``,
  recognised by their names (``splash_mha_fwd``, ``splash_mha_dq``,
  ``splash_mha_dkv``, with or without residuals or segments), priced from
  their operands' shapes: FLOPs from
  ``scaling.model.attention.attention_flops_per_call`` (the matmuls the
  kernel runs, causal blocks above the diagonal skipped); HBM bytes, every
  operand and result once plus the keys and values read again for every
  further block of queries that needs them;
- the kernel's own cost estimate: a ``pallas_call`` given
  ``cost_estimate=pl.CostEstimate(flops=..., transcendentals=...,
  bytes_accessed=...)`` carries it in its custom call's backend config
  (``"cost_estimate":{"flops":"...","bytes_accessed":"...",...}`` in the
  compiled HLO), and its FLOPs and bytes are taken as declared (named
  ``NAME (its cost estimate)``): the loss kernels of
  ``scaling.model.pallas_loss`` declare their matmuls (recomputations
  included) and the bytes their tiles read and write. The roofline prices
  those two; the vector unit's work on each element (exponentials, maxima,
  masks) is assumed to overlap the matrix unit and is not priced.

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
# JAX writes the estimate as JSON inside the backend config's string, so its quotes may be escaped.
_DECLARED = re.compile(r'cost_estimate\\*"\s*:\s*\{([^}]*)\}')
_OP_NAME = re.compile(r'op_name="([^"]+)"')
DECLARED = " (its cost estimate)"  # the suffix of a kernel priced by its own cost estimate


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


def declared_cost(instruction, operands=None):
    """(kernel name + ``DECLARED``, FLOPs, HBM bytes) from the ``pl.CostEstimate`` a Pallas kernel declares in
    its custom call, or None if it declares none (``operands`` unused: the kernel's author counted them)."""
    match = _DECLARED.search(instruction.attributes)
    if not match:
        return None
    fields = {}
    for key in ("flops", "bytes_accessed"):
        found = re.search(key + r'\\*"\s*:\s*\\*"?(\d+)', match.group(1))  # libtpu quotes the numbers
        if found is None:
            return None
        fields[key] = float(found.group(1))
    op_name = _OP_NAME.search(instruction.attributes)  # "jit(step)/.../NAME/pallas_call": the kernel's name
    path = op_name.group(1).split("/") if op_name else [instruction.name]
    name = path[-2] if path[-1] == "pallas_call" and len(path) > 1 else path[-1]
    return name + DECLARED, fields["flops"], fields["bytes_accessed"]


def cost_source(kernel: str) -> str:
    """How a kernel of an estimate's ``kernels`` was priced: ``cost estimate`` or ``stated model``."""
    return "cost estimate" if kernel.endswith(DECLARED) else "stated model"


def kernel_cost(model: ModelConfig):
    """The ``hlo_cost.KernelCost`` of ``model``'s kernels: splash attention (causal for the causal objective)
    by its stated model, any other kernel by the cost estimate it declares."""
    causal = model.objective == "causal"

    def cost(instruction, operands):
        return splash_cost(instruction, operands, causal) or declared_cost(instruction, operands)

    return cost
