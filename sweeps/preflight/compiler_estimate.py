"""The compiler's own estimate of one train step: libtpu's ``estimated_cycles`` per op, summed over the schedule.

libtpu writes a cost-model estimate into the ``backend_config`` of most ops
of a compiled TPU program (``"estimated_cycles":"45664"``): fusions, copies,
broadcasts; in the chip's own clock cycles (``sweeps.preflight.tensorcore``: 1.5 GHz
on v5e). It writes none for collectives, for the asynchronous halves of
copies and slices (DMAs), or for Pallas kernels (splash attention).

The estimate replays the compiled schedule exactly as the corrected roofline
does (``sweeps.preflight.roofline_corrections``: loops by their trip counts, async
collectives overlapping the ops between their start and done), with every
op that carries ``estimated_cycles`` taking cycles / clock instead of its
roofline time; the ops libtpu leaves unestimated keep their corrected
roofline time, so the two estimates differ only where the compiler speaks.
``cycles_seconds`` is the compiler's cycles alone (no collectives, DMAs or
kernels), summed with the same trip counts.

No estimate (None, with ``reason``) where the backend provides none: a
program without a single ``estimated_cycles`` (another backend, or a libtpu
that stops writing them), a generation whose clock is unknown, or a loop or
kernel the walk could not count. Nothing is filled in by guesswork.
"""

from __future__ import annotations

import dataclasses
import re

from sweeps.preflight import hlo, roofline, tensorcore
from sweeps.preflight.roofline_corrections import Corrections, CorrectedCoster, corrected_cost

_CYCLES = re.compile(r'"estimated_cycles"\s*:\s*"?(\d+)')


def op_cycles(instruction: hlo.Instruction) -> int | None:
    """The ``estimated_cycles`` libtpu wrote for one instruction, None if it wrote none."""
    match = _CYCLES.search(instruction.attributes)
    return int(match.group(1)) if match else None


@dataclasses.dataclass(frozen=True)
class CompilerEstimate:
    """The compiler's estimate of one step on one chip; ``step_seconds`` None (see ``reason``) where it has none."""

    step_seconds: float | None  # the schedule replayed with the compiler's op times
    cycles_seconds: float | None  # the compiler's estimated cycles alone, over the clock
    ops_estimated: int  # op executions per step the compiler estimated
    ops_not_estimated: int  # op executions with work (not bookkeeping) it did not: priced by the roofline
    clock_hz: float | None
    reason: str | None = None  # why there is no estimate

    @property
    def known(self) -> bool:
        return self.step_seconds is not None


class CompilerCoster(CorrectedCoster):
    """The corrected roofline's walk with each op libtpu estimated taking its ``estimated_cycles`` / clock."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = None
        self.cycles = 0.0  # per execution of the entry computation, loops counted
        self.estimated = self.not_estimated = 0

    def cost(self):
        self._counts: dict[str, tuple] = {}
        total = super().cost()
        self.cycles, self.estimated, self.not_estimated = self._count(self.module.entry) if self.module.entry \
            else (0.0, 0, 0)
        return total

    def _priced_op(self, computation, instruction, cost) -> float:
        roofline_seconds = super()._priced_op(computation, instruction, cost)
        cycles = op_cycles(instruction)
        return cycles / self.clock if cycles is not None else roofline_seconds

    def _count(self, name: str) -> tuple[float, int, int]:
        """(cycles, ops estimated, ops with work not estimated) of one execution of computation ``name``."""
        if name in self._counts:
            return self._counts[name]
        computation = self.module.computation(name)
        cycles, estimated, missing = 0.0, 0, 0
        for instruction in computation.instructions:
            own = op_cycles(instruction)
            if own is not None:
                cycles, estimated = cycles + own, estimated + 1
                continue
            if instruction.opcode in ("while", "call", "conditional", "async-start"):
                roles = instruction.called()
                trips = hlo.trip_count(self.module, computation, instruction) if instruction.opcode == "while" else 1
                for role, callee in roles:
                    if self.module.computation(callee) is None:
                        continue
                    times = (trips or 1) + (role == "condition")
                    c, e, m = self._count(callee)
                    cycles, estimated, missing = cycles + times * c, estimated + times * e, missing + times * m
            elif _has_work(instruction):
                missing += 1
        self._counts[name] = (cycles, estimated, missing)
        return self._counts[name]


_BOOKKEEPING = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
                "replica-id", "opt-barrier", "add-dependency", "domain"}


def _has_work(instruction: hlo.Instruction) -> bool:
    # The "-done" half of an async op only waits; its "-start" is the op.
    return (instruction.opcode not in _BOOKKEEPING and not instruction.opcode.endswith("-done")
            and any(array.dims for array in instruction.arrays))


def compiler_estimate(hlo_text: str, generation: str, devices, kernel_cost=None,
                      corrections: Corrections = Corrections()) -> CompilerEstimate:
    """The compiler's estimate of one execution of a compiled step (``compiled.as_text()``) on ``devices``."""
    clock = tensorcore.clock_hz(generation)
    if clock is None:
        return CompilerEstimate(None, None, 0, 0, None,
                                f"no clock known for {generation} (sweeps/preflight/tensorcore.py)")
    if not _CYCLES.search(hlo_text):
        return CompilerEstimate(None, None, 0, 0, clock, "the compiled program carries no estimated_cycles")
    coster = {}

    def make(*args):
        coster["it"] = CompilerCoster(*args)
        coster["it"].clock = clock
        return coster["it"]

    cost = corrected_cost(hlo_text, generation, devices, kernel_cost, corrections, coster=make)
    walk = coster["it"]
    step = roofline.estimate(cost)
    if not step.known:
        return CompilerEstimate(None, None, walk.estimated, walk.not_estimated, clock,
                                "a loop or kernel went uncounted")
    return CompilerEstimate(step.step_seconds, walk.cycles / clock, walk.estimated, walk.not_estimated, clock)
