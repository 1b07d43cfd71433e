"""What one top-level HLO op costs a chip: its FLOPs and the HBM bytes it reads and writes (for ``hlo_cost``).

FLOPs: 2 per multiply-add of every ``convolution`` and ``dot`` (TPU programs
express matmuls as convolutions whose padding and dilation leave most window
positions empty; only positions that meet real input count, as in XLA's own
cost analysis), one per element of arithmetic elementwise ops and
reductions; fusions count what they fuse. HBM bytes: what the op reads and
writes, except arrays placed outside HBM (a TPU layout ``S(1)`` is on-chip
VMEM); a fused operand that is only sliced counts the slices, one updated in
place (``dynamic-update-slice``) the update.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from sweeps.preflight import hlo
from sweeps.preflight.hlo import Computation, Instruction, Module

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all",
               "collective-permute", "collective-broadcast")
# Ops that move no data through HBM: bookkeeping, the halves of async ops that only wait, control flow.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id",
         "opt-barrier", "add-dependency", "domain", "copy-done", "slice-done", "async-done", "async-update",
         "send-done", "recv-done", "while", "call", "conditional"}
# Custom calls that are bookkeeping (buffer allocation, async markers, layout-only rewrites).
FREE_TARGETS = {"AllocateBuffer", "AsyncCollectiveStart", "AsyncCollectiveDone", "ConcatBitcast",
                 "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked", "Sharding", "SPMDFullToShardShape",
                 "SPMDShardToFullShape", "MoveToHost", "MoveToDevice", "LayoutConstraint"}
_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "compare", "select",
                "and", "or", "xor", "not", "clamp", "remainder", "sign", "floor", "ceil", "round-nearest-afz",
                "round-nearest-even", "convert", "power", "atan2", "is-finite"}
_TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "sqrt", "rsqrt",
                   "cbrt", "sine", "cosine", "tan", "erf"}
_SLICING = {"dynamic-slice", "slice", "gather"}


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the per-op roofline needs of a chip: peak FLOP/s, HBM bytes/s, one ICI link's bytes/s, its links."""

    peak_flops: float
    hbm_bandwidth: float
    link_bandwidth: float
    links: int = 1


# ---------------------------------------------------------------------------
# FLOPs


def _window(attributes: str) -> dict[str, list]:
    match = re.search(r"window=\{([^}]*)\}", attributes)
    fields = {}
    for part in (match.group(1).split() if match else []):
        key, _, value = part.partition("=")
        fields[key] = [tuple(int(x) for x in item.split("_")) if "_" in item else int(item)
                       for item in value.split("x")]
    return fields


def _valid_pairs(in_size: int, out_size: int, window: int, stride: int, pad_low: int, lhs_dilation: int,
                 rhs_dilation: int) -> int:
    """(output position, window position) pairs of one spatial dimension that land on a real input element."""
    dilated = (in_size - 1) * lhs_dilation + 1
    out = np.arange(out_size)[:, None] * stride + np.arange(window)[None, :] * rhs_dilation - pad_low
    return int(np.count_nonzero((out >= 0) & (out < dilated) & (out % lhs_dilation == 0)))


def convolution_flops(instruction: Instruction, lhs: hlo.Array, rhs: hlo.Array) -> float:
    """2 × multiply-adds of an HLO convolution, counting only window positions that meet real input."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instruction.attributes)
    out = instruction.arrays[0]
    if not labels:
        return 0.0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    window = _window(instruction.attributes)
    spatial = [c for c in lhs_labels if c.isdigit()]
    pairs = 1.0
    for k, dim in enumerate(sorted(spatial)):
        size = rhs.dims[rhs_labels.index(dim)]
        value = lambda key, default: window.get(key, [default] * len(spatial))[k]  # noqa: E731
        pad = value("pad", (0, 0))
        count = _valid_pairs(lhs.dims[lhs_labels.index(dim)], out.dims[out_labels.index(dim)], size,
                             value("stride", 1), pad[0], value("lhs_dilate", 1), value("rhs_dilate", 1))
        pairs *= count / out.dims[out_labels.index(dim)]
    return 2.0 * out.elements * rhs.dims[rhs_labels.index("i")] * pairs


def dot_flops(instruction: Instruction, lhs: hlo.Array) -> float:
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)
    dims = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
    return 2.0 * instruction.arrays[0].elements * math.prod(lhs.dims[d] for d in dims)


def operand_array(computation: Computation, name: str) -> hlo.Array | None:
    source = computation.by_name.get(name)
    found = source.arrays if source else []
    return found[0] if len(found) == 1 else None


def instruction_flops(module: Module, computation: Computation, instruction: Instruction) -> tuple[float, float]:
    """(FLOPs, transcendentals) of one instruction, fused computations included."""
    opcode = instruction.opcode
    if opcode == "fusion":
        flops = transcendentals = 0.0
        for role, callee in instruction.called():
            fused = module.computation(callee)
            for inner in (fused.instructions if fused else ()):
                f, t = instruction_flops(module, fused, inner)
                flops, transcendentals = flops + f, transcendentals + t
        return flops, transcendentals
    out = instruction.arrays
    if opcode in ("convolution", "dot"):
        operands = [operand_array(computation, name) for name in instruction.operands[:2]]
        if None in operands:
            return 0.0, 0.0
        if opcode == "dot":
            return dot_flops(instruction, operands[0]), 0.0
        return convolution_flops(instruction, *operands), 0.0
    elements = sum(array.elements for array in out)
    if opcode in _ELEMENTWISE:
        return float(elements), 0.0
    if opcode in _TRANSCENDENTAL:
        return 0.0, float(elements)
    if opcode in ("reduce", "reduce-window"):
        source = operand_array(computation, instruction.operands[0]) if instruction.operands else None
        return float(source.elements if source else elements), 0.0
    return 0.0, 0.0


# ---------------------------------------------------------------------------
# HBM bytes


def _hbm(array: hlo.Array | None) -> float:
    return array.nbytes if array is not None and array.memory_space == 0 else 0.0


def _through_bitcasts(computation: Computation, name: str) -> list[Instruction]:
    """The users of ``name``, looking through bitcasts."""
    found = []
    for user in computation.users(name):
        found += _through_bitcasts(computation, user.name) if user.opcode == "bitcast" else [user]
    return found


def _parameter_bytes(module: Module, fused: Computation, index: int, operand: hlo.Array | None) -> float:
    """HBM bytes a fusion reads of its operand ``index``: the slices taken of it, nothing if updated in place.

    A nested fusion that takes the parameter is followed into (TPU fuses a
    scanned layer's ``dynamic-slice`` of the stacked weights that way).
    """
    if operand is None or operand.memory_space != 0:
        return 0.0
    parameter = next((i for i in fused.instructions if i.opcode == "parameter"
                      and i.operand_text.strip() == str(index)), None)
    users = _through_bitcasts(fused, parameter.name) if parameter else []
    if not users:
        return operand.nbytes
    total = 0.0
    for user in users:
        first = bool(user.operands) and _traces_to(fused, user.operands[0], parameter.name)
        if user.opcode in _SLICING and first:
            total += sum(array.nbytes for array in user.arrays)
        elif user.opcode == "dynamic-update-slice" and first:
            continue  # written in place: the write is counted with the fusion's output
        elif user.opcode == "fusion":
            nested = next((module.computation(c) for role, c in user.called() if role == "calls"), None)
            positions = [k for k, name in enumerate(user.operands) if _traces_to(fused, name, parameter.name)]
            if nested is None or not positions:
                return operand.nbytes
            total += sum(_parameter_bytes(module, nested, k, operand) for k in positions)
        else:
            return operand.nbytes
    return min(total, operand.nbytes)


def _traces_to(computation: Computation, name: str, target: str) -> bool:
    while name != target:
        source = computation.by_name.get(name)
        if source is None or source.opcode != "bitcast" or not source.operands:
            return False
        name = source.operands[0]
    return True


def _output_bytes(fused: Computation | None, outputs: list[hlo.Array]) -> float:
    """HBM bytes a fusion writes: an output made by an in-place dynamic-update-slice writes only its update."""
    root = fused.root if fused else None
    producers = root.operands if root is not None and root.opcode == "tuple" else [root.name if root else None]
    total = 0.0
    for k, array in enumerate(outputs):
        producer = fused.by_name.get(producers[k]) if fused and k < len(producers) and producers[k] else None
        while producer is not None and producer.opcode == "bitcast" and producer.operands:
            producer = fused.by_name.get(producer.operands[0])
        if producer is not None and producer.opcode == "dynamic-update-slice" and len(producer.operands) > 1:
            update = operand_array(fused, producer.operands[1])
            total += update.nbytes if update is not None and array.memory_space == 0 else 0.0
        else:
            total += _hbm(array)
    return total


def instruction_hbm_bytes(module: Module, computation: Computation, instruction: Instruction) -> float:
    """HBM bytes one top-level instruction reads and writes (0 for bookkeeping and collectives)."""
    opcode = instruction.opcode
    if opcode in _FREE or opcode.removesuffix("-start") in COLLECTIVES or opcode.endswith("-done"):
        return 0.0
    if opcode == "custom-call" and instruction.attribute("custom_call_target") in {f'"{t}"' for t in FREE_TARGETS}:
        return 0.0
    operands = [operand_array(computation, name) for name in instruction.operands]
    if opcode == "copy-start":  # (destination, source, context): one read and one write, where each is in HBM
        arrays = instruction.arrays
        return (_hbm(arrays[1]) + _hbm(arrays[0])) if len(arrays) >= 2 else 0.0
    if opcode == "slice-start":  # ((operand), slice, context): the slice is read and written where each lies
        arrays = instruction.arrays
        if len(arrays) < 2:
            return 0.0
        read = arrays[1].nbytes if arrays[0].memory_space == 0 else 0.0
        return read + _hbm(arrays[1])
    if opcode == "fusion":
        fused = next((module.computation(c) for role, c in instruction.called() if role == "calls"), None)
        if fused is None:
            return sum(_hbm(a) for a in operands) + sum(_hbm(a) for a in instruction.arrays)
        read = sum(_parameter_bytes(module, fused, k, array) for k, array in enumerate(operands))
        return read + _output_bytes(fused, instruction.arrays)
    if opcode in _SLICING:
        return 2 * sum(_hbm(a) for a in instruction.arrays)
    if opcode == "dynamic-update-slice":
        return 2 * _hbm(operands[1] if len(operands) > 1 else None)
    return sum(_hbm(a) for a in operands) + sum(_hbm(a) for a in instruction.arrays)
