"""What one execution of a compiled program costs a chip: FLOPs, HBM bytes, ICI traffic and seconds, from its HLO.

The compiler's own ``cost_analysis()`` counts every loop body once and gives
no collective traffic, so the costs are summed here, instruction by
instruction, over the scheduled HLO (``sweeps.hlo``):

- **FLOPs**: 2 per multiply-add of every ``convolution`` and ``dot``
  (TPU programs express matmuls as convolutions whose padding and dilation
  leave most window positions empty; only the positions that meet real
  input are counted, as XLA's own cost analysis does), plus one per element
  of arithmetic elementwise ops and reductions.
- **HBM bytes**: what each top-level op reads and writes, except arrays the
  compiler placed outside HBM (on TPU a layout ``S(1)`` is on-chip VMEM):
  a fused operand that is only sliced counts the slices, an operand updated
  in place (``dynamic-update-slice``) counts the update.
- **Per-op roofline**: each op takes max(its FLOPs / peak, its HBM bytes /
  bandwidth); ops are summed, so a program that alternates compute-bound and
  memory-bound ops is not credited with overlapping them.
- **Collectives**: each is counted once (TPU splits an asynchronous
  collective into start, continuation and done fusions that repeat it; they
  share a ``channel_id``), sends the bytes of a ring algorithm, and takes
  sent bytes / (links × one link's bandwidth), the links being those of the
  physical dimensions its group spans (``links_for``).
- **Overlap**: each computation is replayed in its scheduled order on two
  streams, the chip and its links: an asynchronous collective runs on the
  links from its start until its done, where the chip waits for it; a
  synchronous one holds both. Loops and calls are run whole, their bodies
  being replayed the same way.
- **Loops**: a while body counts ``sweeps.hlo.trip_count`` times, nested
  loops multiplying; a loop whose count cannot be read is counted once and
  reported in ``loops_uncounted``: the totals are then not the program's.
- **Kernels**: custom calls that run code (Pallas/Mosaic kernels) carry no
  cost the HLO can show. ``kernel_cost`` prices them analytically; one it
  cannot price is reported in ``kernels_uncounted``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np

from sweeps import hlo
from sweeps.hlo import Computation, Instruction, Module

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all",
               "collective-permute", "collective-broadcast")
# Ops that move no data through HBM: bookkeeping, the halves of async ops that only wait, control flow.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id",
         "opt-barrier", "add-dependency", "domain", "copy-done", "slice-done", "async-done", "async-update",
         "send-done", "recv-done", "while", "call", "conditional"}
# Custom calls that are bookkeeping (buffer allocation, async markers, layout-only rewrites).
_FREE_TARGETS = {"AllocateBuffer", "AsyncCollectiveStart", "AsyncCollectiveDone", "ConcatBitcast",
                 "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked", "Sharding", "SPMDFullToShardShape",
                 "SPMDShardToFullShape", "MoveToHost", "MoveToDevice", "LayoutConstraint"}
_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "compare", "select",
                "and", "or", "xor", "not", "clamp", "remainder", "sign", "floor", "ceil", "round-nearest-afz",
                "round-nearest-even", "convert", "power", "atan2", "is-finite"}
_TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "sqrt", "rsqrt",
                   "cbrt", "sine", "cosine", "tan", "erf"}
_SLICING = {"dynamic-slice", "slice", "gather"}


@dataclasses.dataclass
class Cost:
    """Costs of one execution of a computation (or a whole program), per chip.

    ``compute_seconds`` / ``memory_seconds`` split the per-op roofline by the
    term that bound each op; ``collective_seconds`` is the links' busy time;
    ``seconds`` is the replayed schedule (``>=`` the ops' time, ``<=`` ops
    plus collectives). ``collectives`` maps kind -> [count, buffer bytes,
    bytes sent, seconds]; ``kernels`` maps a kernel's name -> [count, FLOPs].
    """

    flops: float = 0.0
    transcendentals: float = 0.0
    hbm_bytes: float = 0.0
    ici_bytes: float = 0.0
    compute_seconds: float = 0.0
    memory_seconds: float = 0.0
    collective_seconds: float = 0.0
    seconds: float = 0.0
    collectives: dict = dataclasses.field(default_factory=dict)
    kernels: dict = dataclasses.field(default_factory=dict)
    loops_counted: int = 0
    loops_uncounted: int = 0
    kernels_uncounted: list = dataclasses.field(default_factory=list)

    @property
    def op_seconds(self) -> float:
        return self.compute_seconds + self.memory_seconds

    def add(self, other: "Cost", times: float = 1) -> None:
        """Add ``times`` executions of ``other`` (its ``seconds`` included)."""
        for name in ("flops", "transcendentals", "hbm_bytes", "ici_bytes", "compute_seconds", "memory_seconds",
                     "collective_seconds", "seconds"):
            setattr(self, name, getattr(self, name) + times * getattr(other, name))
        for table, mine in ((other.collectives, self.collectives), (other.kernels, self.kernels)):
            for key, values in table.items():
                old = mine.get(key, [0.0] * len(values))
                mine[key] = [a + times * b for a, b in zip(old, values)]
        self.loops_counted += other.loops_counted
        self.loops_uncounted += other.loops_uncounted
        self.kernels_uncounted += [name for name in other.kernels_uncounted if name not in self.kernels_uncounted]


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


def _operand_array(computation: Computation, name: str) -> hlo.Array | None:
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
        operands = [_operand_array(computation, name) for name in instruction.operands[:2]]
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
        source = _operand_array(computation, instruction.operands[0]) if instruction.operands else None
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
            update = _operand_array(fused, producer.operands[1])
            total += update.nbytes if update is not None and array.memory_space == 0 else 0.0
        else:
            total += _hbm(array)
    return total


def instruction_hbm_bytes(module: Module, computation: Computation, instruction: Instruction) -> float:
    """HBM bytes one top-level instruction reads and writes (0 for bookkeeping and collectives)."""
    opcode = instruction.opcode
    if opcode in _FREE or opcode.removesuffix("-start") in COLLECTIVES or opcode.endswith("-done"):
        return 0.0
    if opcode == "custom-call" and instruction.attribute("custom_call_target") in {f'"{t}"' for t in _FREE_TARGETS}:
        return 0.0
    operands = [_operand_array(computation, name) for name in instruction.operands]
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


# ---------------------------------------------------------------------------
# Collectives


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


def _collective(instruction: Instruction, fused_name: str, device_count: int, links_for, machine: Machine,
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


def _fused_collectives(module: Module, fused: Computation, device_count: int, links_for, machine: Machine):
    """(collectives, starts, dones) inside a fusion: its collectives, and whether it starts or ends async ones."""
    collectives, starts, dones = [], False, False
    for inner in fused.instructions:
        target = inner.attribute("custom_call_target") if inner.opcode == "custom-call" else None
        starts |= target == '"AsyncCollectiveStart"'
        dones |= target == '"AsyncCollectiveDone"'
        if inner.opcode in COLLECTIVES:
            collectives.append(_collective(inner, fused.name, device_count, links_for, machine))
        elif inner.opcode == "fusion":
            for _, callee in inner.called():
                if module.computation(callee):
                    more, s, d = _fused_collectives(module, module.computation(callee), device_count, links_for,
                                                    machine)
                    collectives, starts, dones = collectives + more, starts or s, dones or d
    return collectives, starts, dones


# ---------------------------------------------------------------------------
# The walk


# (custom call, its operands' arrays) -> (kernel name, FLOPs, HBM bytes), or None for a kernel it cannot price.
KernelCost = Callable[[Instruction, list], "tuple[str, float, float] | None"]


class ProgramCoster:
    """Prices a parsed module for one chip; ``cost()`` is one execution of the entry computation."""

    def __init__(self, module: Module, machine: Machine, device_count: int, links_for=None,
                 kernel_cost: KernelCost | None = None):
        self.module, self.machine, self.device_count = module, machine, device_count
        self.links_for = links_for or (lambda group: 1)
        self.kernel_cost = kernel_cost or (lambda instruction, operands: None)
        self._cache: dict[str, Cost] = {}

    def cost(self) -> Cost:
        return self.computation_cost(self.module.entry) if self.module.entry else Cost()

    def _op(self, cost: Cost, flops: float, hbm_bytes: float) -> float:
        """Add one op's FLOPs and bytes to ``cost``; returns its roofline seconds."""
        compute, memory = flops / self.machine.peak_flops, hbm_bytes / self.machine.hbm_bandwidth
        cost.flops += flops
        cost.hbm_bytes += hbm_bytes
        if compute >= memory:
            cost.compute_seconds += compute
        else:
            cost.memory_seconds += memory
        return max(compute, memory)

    def _launch(self, cost: Cost, collective: Collective, chip: float, links: float) -> tuple[float, float]:
        """Start ``collective`` when the chip has issued it (``chip``) and links are free (``links``, the
        links' stream); returns (when it ends, when the links' stream is next free).

        The chip's links are one pool: a collective on k of its L links holds
        k/L of the pool for its duration, so collectives on different links
        (two permutes in opposite directions) can run side by side.
        """
        cost.ici_bytes += collective.sent
        cost.collective_seconds += collective.seconds * collective.links / self.machine.links
        old = cost.collectives.get(collective.kind, [0.0, 0.0, 0.0, 0.0])
        cost.collectives[collective.kind] = [old[0] + 1, old[1] + collective.buffer, old[2] + collective.sent,
                                             old[3] + collective.seconds]
        begin = max(chip, links)
        return begin + collective.seconds, begin + collective.seconds * collective.links / self.machine.links

    def computation_cost(self, name: str) -> Cost:
        """One execution of computation ``name``, replayed on the chip's and the links' streams."""
        if name in self._cache:
            return self._cache[name]
        computation, cost = self.module.computation(name), Cost()
        self._cache[name] = cost  # a recursive call (none in compiled HLO) would see an empty cost
        chip = links = 0.0  # when each stream is next free, seconds from the computation's start
        in_flight: dict[str, float] = {}  # async collective (channel or start name) -> when its transfer ends
        started = self._started_channels(computation)
        for instruction in computation.instructions:
            opcode = instruction.opcode
            if opcode in ("while", "call", "conditional", "async-start"):
                chip = links = max(chip, links)
                nested = self._control_flow(computation, instruction, cost)
                chip = links = chip + nested
                continue
            base = opcode.removesuffix("-start")
            if base in COLLECTIVES:
                collective = _collective(instruction, "", self.device_count, self.links_for, self.machine)
                ends, links = self._launch(cost, collective, chip, links)
                if opcode.endswith("-start"):
                    in_flight[instruction.name] = ends
                else:
                    chip = ends
                continue
            if opcode.endswith("-done") and instruction.operands:
                chip = max(chip, in_flight.pop(instruction.operands[0], 0.0))
                continue
            waits = []
            if opcode == "fusion":
                fused = next((self.module.computation(c) for r, c in instruction.called() if r == "calls"), None)
                if fused is not None:
                    collectives, starts, dones = _fused_collectives(self.module, fused, self.device_count,
                                                                    self.links_for, self.machine)
                    for collective in collectives:
                        key = collective.channel or instruction.name
                        if dones:
                            waits.append(in_flight.pop(key, 0.0))
                        elif starts or (key not in started and key not in in_flight):
                            ends, links = self._launch(cost, collective, chip, links)
                            in_flight[key] = ends
                            if not starts:  # a synchronous collective: the chip waits for it
                                chip = ends
            chip = max([chip] + waits)
            chip += self._priced_op(computation, instruction, cost)
        cost.seconds = max([chip, links] + list(in_flight.values()))
        return cost

    def _started_channels(self, computation: Computation) -> set[str]:
        """Channels of async collectives started by a fusion of ``computation`` (counted at their start only)."""
        found = set()
        for instruction in computation.instructions:
            if instruction.opcode != "fusion":
                continue
            for role, callee in instruction.called():
                fused = self.module.computation(callee)
                if fused is None:
                    continue
                collectives, starts, _ = _fused_collectives(self.module, fused, self.device_count, self.links_for,
                                                            self.machine)
                if starts:
                    found.update(c.channel for c in collectives if c.channel)
        return found

    def _priced_op(self, computation: Computation, instruction: Instruction, cost: Cost) -> float:
        """Seconds of one top-level op on the chip (its FLOPs and bytes added to ``cost``)."""
        if instruction.opcode == "custom-call":
            target = (instruction.attribute("custom_call_target") or "").strip('"')
            if target in _FREE_TARGETS:
                return 0.0
            priced = self.kernel_cost(instruction, [_operand_array(computation, n) for n in instruction.operands])
            if priced is None:
                if target not in cost.kernels_uncounted:
                    cost.kernels_uncounted.append(target)
                return 0.0
            kernel, flops, hbm_bytes = priced
            old = cost.kernels.get(kernel, [0.0, 0.0])
            cost.kernels[kernel] = [old[0] + 1, old[1] + flops]
            return self._op(cost, flops, hbm_bytes)
        flops, transcendentals = instruction_flops(self.module, computation, instruction)
        cost.transcendentals += transcendentals
        return self._op(cost, flops, instruction_hbm_bytes(self.module, computation, instruction))

    def _control_flow(self, computation: Computation, instruction: Instruction, cost: Cost) -> float:
        """Add a while loop, call or conditional to ``cost``; returns its seconds."""
        roles = instruction.called()
        if instruction.opcode == "while":
            trips = hlo.trip_count(self.module, computation, instruction)
            if trips is None:
                cost.loops_uncounted += 1
                trips = 1
            else:
                cost.loops_counted += 1
            before = cost.seconds
            for role, callee in roles:
                times = trips if role == "body" else trips + 1
                cost.add(self.computation_cost(callee), times)
            seconds, cost.seconds = cost.seconds - before, before
            return seconds
        # A conditional runs one branch: the costliest is counted. A call or async computation runs once.
        branches = [self.computation_cost(callee) for role, callee in roles if self.module.computation(callee)]
        if not branches:
            return 0.0
        chosen = max(branches, key=lambda c: c.seconds) if instruction.opcode == "conditional" else None
        before = cost.seconds
        for branch in ([chosen] if chosen else branches):
            cost.add(branch)
        seconds, cost.seconds = cost.seconds - before, before
        return seconds


def program_cost(hlo_text: str, machine: Machine, device_count: int, links_for=None,
                 kernel_cost: KernelCost | None = None) -> Cost:
    """The ``Cost`` of one execution of a compiled program (``compiled.as_text()``) on one chip."""
    return ProgramCoster(hlo.parse(hlo_text), machine, device_count, links_for, kernel_cost).cost()
