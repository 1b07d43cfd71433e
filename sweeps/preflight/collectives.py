"""The collectives of compiled HLO: who takes part, how many bytes each chip sends, and for how long.

Each collective sends the bytes of a ring algorithm (an all-gather,
reduce-scatter or all-to-all of a B-byte array over n chips sends
B·(n-1)/n from each, an all-reduce twice that, a permute B) over the links
its group can use (``links_for``, from the chips' places on the grid).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from sweeps.preflight.hlo import Computation, Instruction, Module
from sweeps.preflight.hlo_ops import COLLECTIVES, Machine


def replica_group(attributes: str, device_count: int) -> list[int]:
    """The device ids (logical, as the HLO numbers them) of the first group of a collective."""
    mesh_form = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
    if mesh_form:  # mesh['axis_0'=4,'axis_1'=2] {'axis_0'}: devices varying along the named axes
        axes = re.findall(r"'([^']+)'=(\d+)", mesh_form.group(1))
        named = set(re.findall(r"'([^']+)'", mesh_form.group(2)))
        ids = np.arange(math.prod(int(size) for _, size in axes)).reshape([int(size) for _, size in axes])
        index = tuple(slice(None) if name in named else 0 for name, _ in axes)
        return [int(i) for i in ids[index].flatten()]
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes)
    if iota:  # [groups, size]<=[dims]T(permutation)
        dims = [int(d) for d in iota.group(3).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(4):
            ids = ids.transpose([int(p) for p in iota.group(4).split(",")])
        return [int(i) for i in ids.reshape(int(iota.group(1)), int(iota.group(2)))[0]]
    explicit = re.search(r"replica_groups=\{\{([\d,\s]*)\}", attributes)
    if explicit and explicit.group(1).strip():
        return [int(i) for i in explicit.group(1).split(",")]
    pairs = re.search(r"source_target_pairs=\{\{(\d+),(\d+)\}", attributes)
    if pairs:
        return [int(pairs.group(1)), int(pairs.group(2))]
    return list(range(device_count))


def bytes_sent(kind: str, buffer: float, group: int) -> float:
    """Bytes one chip sends for one collective on a ``buffer``-byte array under ring algorithms."""
    if group <= 1:
        return 0.0
    if kind in ("collective-permute", "collective-broadcast"):
        return buffer
    share = (group - 1) / group
    # An all-reduce is a reduce-scatter then an all-gather; each of those, and
    # an all-to-all, sends all but its own 1/group of the buffer.
    return 2 * share * buffer if kind == "all-reduce" else share * buffer


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    buffer: float  # bytes of the whole array gathered, reduced or exchanged
    sent: float  # bytes one chip sends
    seconds: float
    channel: str | None
    links: int = 1  # of the chip's links, the ones it uses


def collective(instruction: Instruction, fused_name: str, device_count: int, links_for, machine: Machine,
                opcode: str | None = None) -> Collective:
    opcode = opcode or instruction.opcode
    base = opcode.removesuffix("-start")
    found = [a for a in instruction.arrays if a.dims]  # scalars are async context, not data
    if opcode.endswith("-start") and base != "all-reduce" and len(found) >= 2:
        found = found[len(found) // 2:]  # (operands, results): the results
    group = replica_group(instruction.attributes, device_count)
    kind = base
    if base == "all-reduce" and fused_name.startswith("all-reduce-scatter"):
        kind = "reduce-scatter"  # TPU's fusion of an all-reduce sliced to one chip's share
        buffer = sum(a.nbytes for a in found)
    else:
        buffer = sum(a.nbytes for a in found) * (len(group) if kind == "reduce-scatter" else 1)
    sent = bytes_sent(kind, buffer, len(group))
    # A permute sends to one neighbour over one link; the others use the links of the dimensions they span.
    links = 1 if kind in ("collective-permute", "collective-broadcast") else links_for(group)
    links = max(1, min(links, machine.links))
    return Collective(kind, buffer, sent, sent / (links * machine.link_bandwidth) if sent else 0.0,
                      instruction.attribute("channel_id"), links)


def fused_collectives(module: Module, fused: Computation, device_count: int, links_for, machine: Machine):
    """(collectives, starts, dones) inside a fusion: its collectives, and whether it starts or ends async ones."""
    collectives, starts, dones = [], False, False
    for inner in fused.instructions:
        target = inner.attribute("custom_call_target") if inner.opcode == "custom-call" else None
        starts |= target == '"AsyncCollectiveStart"'
        dones |= target == '"AsyncCollectiveDone"'
        if inner.opcode in COLLECTIVES:
            collectives.append(collective(inner, fused.name, device_count, links_for, machine))
        elif inner.opcode == "fusion":
            for _, callee in inner.called():
                if module.computation(callee):
                    more, s, d = fused_collectives(module, module.computation(callee), device_count, links_for,
                                                    machine)
                    collectives, starts, dones = collectives + more, starts or s, dones or d
    return collectives, starts, dones
