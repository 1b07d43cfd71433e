"""What one execution of a compiled program costs a chip: FLOPs, HBM bytes, ICI traffic and seconds, from its HLO.

The compiler's own ``cost_analysis()`` counts every loop body once and gives
no collective traffic, so the costs are summed here, instruction by
instruction, over the scheduled HLO (``sweeps.preflight.hlo``; what one op costs is
``sweeps.preflight.hlo_ops``, what one collective costs ``sweeps.preflight.collectives``):

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
- **Loops**: a while body counts ``sweeps.preflight.hlo.trip_count`` times, nested
  loops multiplying; a loop whose count cannot be read is counted once and
  reported in ``loops_uncounted``: the totals are then not the program's.
- **Kernels**: custom calls that run code (Pallas/Mosaic kernels) carry no
  cost the HLO can show. ``kernel_cost`` prices them analytically; one it
  cannot price is reported in ``kernels_uncounted``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sweeps.preflight import collectives as collective_costs, hlo, hlo_ops
from sweeps.preflight.hlo import Computation, Instruction, Module
from sweeps.preflight.hlo_ops import COLLECTIVES, FREE_TARGETS, Machine


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

    def _op(self, cost: Cost, flops: float, hbm_bytes: float, fill: float = 1.0) -> float:
        """Add one op's FLOPs and bytes to ``cost``; returns its roofline seconds (its FLOPs at ``fill`` of the
        peak: the fraction of the matrix unit it keeps busy)."""
        compute, memory = flops / (self.machine.peak_flops * fill), hbm_bytes / self.machine.hbm_bandwidth
        cost.flops += flops
        cost.hbm_bytes += hbm_bytes
        if compute >= memory:
            cost.compute_seconds += compute
        else:
            cost.memory_seconds += memory
        return max(compute, memory)

    def _fused(self, fused: Computation):
        return collective_costs.fused_collectives(self.module, fused, self.device_count, self.links_for, self.machine)

    def _launch(self, cost: Cost, collective, chip: float, links: float) -> tuple[float, float]:
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
                collective = collective_costs.collective(instruction, "", self.device_count, self.links_for,
                                                        self.machine)
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
                    collectives, starts, dones = self._fused(fused)
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
                collectives, starts, _ = self._fused(fused)
                if starts:
                    found.update(c.channel for c in collectives if c.channel)
        return found

    def _priced_op(self, computation: Computation, instruction: Instruction, cost: Cost) -> float:
        """Seconds of one top-level op on the chip (its FLOPs and bytes added to ``cost``)."""
        if instruction.opcode == "custom-call":
            priced = self._kernel(computation, instruction, cost)
            return 0.0 if priced is None else self._op(cost, priced[1], priced[2])
        flops, transcendentals = hlo_ops.instruction_flops(self.module, computation, instruction)
        cost.transcendentals += transcendentals
        return self._op(cost, flops, hlo_ops.instruction_hbm_bytes(self.module, computation, instruction))

    def _kernel(self, computation: Computation, instruction: Instruction, cost: Cost):
        """A custom call's (kernel, FLOPs, HBM bytes), counted in ``cost.kernels``; None for calls that cost
        nothing and for kernels ``kernel_cost`` cannot price (named in ``cost.kernels_uncounted``)."""
        target = (instruction.attribute("custom_call_target") or "").strip('"')
        if target in FREE_TARGETS:
            return None
        operands = [hlo_ops.operand_array(computation, name) for name in instruction.operands]
        priced = self.kernel_cost(instruction, operands)
        if priced is None:
            if target not in cost.kernels_uncounted:
                cost.kernels_uncounted.append(target)
            return None
        kernel, flops, _ = priced
        old = cost.kernels.get(kernel, [0.0, 0.0])
        cost.kernels[kernel] = [old[0] + 1, old[1] + flops]
        return priced

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
