"""The roofline of ``sweeps.preflight.roofline`` corrected for four things a TPU does that it leaves out, each one named.

``sweeps.preflight.roofline`` prices each op at max(FLOPs / peak, HBM bytes / bandwidth)
and each collective at its bytes over its links. For the sweep's small,
skinny programs that is optimistic (libtpu's own estimate of L6-d128's step
is about 3× longer). Four corrections, each keeping the estimate a lower
bound of what the chip can do, in the order ``contributions`` adds them:

- ``tile_padding``: an array in HBM is stored in tiles, so it is read and
  written at its tile-padded size. The tile is the one the compiler chose,
  read from the array's layout in the compiled HLO (``{1,0:T(8,128)(2,1)}``:
  the two most-minor dimensions padded to multiples of 8 and 128); see
  XLA's "Tiled layout" documentation (openxla.org/xla/tiled_layout). Only the
  first tile pads: later ones, like bf16's ``(2,1)`` that packs row pairs
  into 32-bit words, subdivide it. In the compiled sweep programs f32 and bf16
  arrays alike carry ``T(8,128)``; a 64-wide head dimension doubles.
  Collectives move the padded arrays too. FLOPs stay logical.
- ``matrix_unit_fill``: the splash-attention kernel multiplies q·kᵀ over
  the head dimension and p·v into it, so every one of its matmuls has the
  head dimension as a contraction or output side; at head_dim 64 on a
  128-wide matrix unit (``sweeps.preflight.tensorcore``) half the array idles:
  its FLOPs run at ``head_dim / (head_dim rounded up to the MXU width)`` of peak.
- ``op_floor``: every fusion and kernel the TensorCore runs takes at least
  ``OP_FLOOR_CYCLES`` (pipeline fill and drain, loop set-up), however small.
- ``collective_latency``: every collective takes at least
  ``COLLECTIVE_LATENCY_SECONDS`` more than its bytes over its links.

What stays out (so the corrected roofline still leans optimistic): elementwise
and transcendental work on the vector units (priced as FLOPs at matrix-unit
peak, or not at all), matmuls other than attention with dimensions that fill
the matrix units partly, and HBM bandwidth below peak.
"""

from __future__ import annotations

import dataclasses
import math
import re

from sweeps.preflight import collectives, hlo, hlo_cost, hlo_ops, kernels, roofline, tensorcore
from sweeps.preflight.hlo import Computation, Instruction
from sweeps.preflight.topology import CHIPS

# libtpu's own cost model puts the smallest fusion it can make, a multiply-add over one (8,128) f32 tile for
# v5e, at 1,841 cycles, and half of the fusions of L6-d128's compiled step at 1,833 cycles or fewer: the floor
# is that minimum, rounded down, in the chip's own cycles (1.2 µs on v5e at 1.5 GHz).
OP_FLOOR_CYCLES = 700
# One ICI hop between neighbouring chips: of the order of a microsecond ("How to Scale Your Model", the
# JAX team's book, section on sharded matrix multiplication). A collective sends at least one hop.
COLLECTIVE_LATENCY_SECONDS = 1e-6
_TILE = re.compile(r":\s*T\(([\d,]+)\)")


@dataclasses.dataclass(frozen=True)
class Corrections:
    """Which corrections the roofline applies; ``Corrections.NONE`` is ``sweeps.preflight.roofline`` as it is."""

    tile_padding: bool = True
    matrix_unit_fill: bool = True
    op_floor_cycles: float = OP_FLOOR_CYCLES
    collective_latency_seconds: float = COLLECTIVE_LATENCY_SECONDS

    def __post_init__(self):
        for name in ("op_floor_cycles", "collective_latency_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"Corrections.{name} = {getattr(self, name)}: must be >= 0")


Corrections.NONE = Corrections(False, False, 0.0, 0.0)
ORDER = ("tile_padding", "matrix_unit_fill", "op_floor", "collective_latency")  # as ``contributions`` adds them


# ---------------------------------------------------------------------------
# Tile padding


def padded_dims(dims: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """``dims`` with each dimension the layout's first tile covers rounded up to the tile (``{1,0:T(8,128)}``).

    The tile applies to the most-minor dimensions in ``minor_to_major`` order;
    a layout without a tile leaves ``dims`` as they are.
    """
    tile = _TILE.search(layout or "")
    if not tile or not dims:
        return dims
    order_text = (layout or "").strip("{}").split(":")[0]
    minor_to_major = [int(d) for d in order_text.split(",") if d.strip()] or list(range(len(dims)))[::-1]
    sizes = [int(t) for t in tile.group(1).split(",")]
    padded = list(dims)
    for position, size in enumerate(reversed(sizes)):  # the tile's last size covers the most-minor dimension
        if position < len(minor_to_major):
            axis = minor_to_major[position]
            padded[axis] = -(-padded[axis] // size) * size
    return tuple(padded)


def padded_hlo_text(hlo_text: str) -> str:
    """Compiled HLO text with every tiled array's dimensions replaced by its tile-padded ones."""

    def pad(match: re.Match) -> str:
        dtype, dims_text, layout = match.groups()
        dims = tuple(int(d) for d in dims_text.split(",") if d)
        return f"{dtype}[{','.join(map(str, padded_dims(dims, layout or '')))}]{layout or ''}"

    return hlo._ARRAY.sub(pad, hlo_text)


def padding_ratio(hlo_text: str) -> float | None:
    """Padded over logical bytes of every array the compiled program's instructions produce (1.0: no padding)."""
    logical = padded = 0.0
    for dtype, dims_text, layout in hlo._ARRAY.findall(hlo_text):
        dims = tuple(int(d) for d in dims_text.split(",") if d)
        logical += hlo.DTYPE_BYTES[dtype] * math.prod(dims)
        padded += hlo.DTYPE_BYTES[dtype] * math.prod(padded_dims(dims, layout))
    return padded / logical if logical else None


def matrix_unit_fill(head_dim: int, width: int) -> float:
    """The share of a ``width``-wide matrix unit a matmul with a ``head_dim`` side uses (64 of 128: 0.5)."""
    if head_dim < 1 or width < 1:
        raise ValueError(f"matrix_unit_fill: head_dim {head_dim} and width {width} must be >= 1")
    return head_dim / (-(-head_dim // width) * width)


# ---------------------------------------------------------------------------
# The corrected walk


def _is_floored(module, computation: Computation, instruction: Instruction) -> bool:
    """True for the ops the floor applies to: fusions and kernels with a non-scalar result, not collectives."""
    if not any(array.dims for array in instruction.arrays):
        return False
    if instruction.opcode == "custom-call":
        target = (instruction.attribute("custom_call_target") or "").strip('"')
        return target not in hlo_ops.FREE_TARGETS
    if instruction.opcode != "fusion":
        return False
    fused = next((module.computation(c) for role, c in instruction.called() if role == "calls"), None)
    if fused is None:
        return True
    found, starts, dones = collectives.fused_collectives(module, fused, 1, lambda group: 1,
                                                         hlo_ops.Machine(1.0, 1.0, 1.0))
    return not (found or starts or dones)


class CorrectedCoster(hlo_cost.ProgramCoster):
    """``hlo_cost.ProgramCoster`` with ``Corrections``: bytes from the tile-padded program, FLOPs from the
    logical one (``logical``, the same program parsed unpadded), kernels at their matrix-unit fill."""

    def __init__(self, logical, padded, machine, device_count, links_for, kernel_cost, corrections: Corrections,
                 clock_hz: float | None, mxu_width: int | None):
        super().__init__(padded if corrections.tile_padding else logical, machine, device_count, links_for,
                         kernel_cost)
        self.logical, self.corrections = logical, corrections
        self.floor_seconds = corrections.op_floor_cycles / clock_hz if clock_hz else 0.0
        self.mxu_width = mxu_width

    def _twin(self, computation: Computation, instruction: Instruction) -> tuple[Computation, Instruction]:
        twin = self.logical.computation(computation.name)
        return twin, twin.by_name[instruction.name]

    def _roofline_op(self, computation: Computation, instruction: Instruction, cost) -> float:
        """The op's seconds with padding and fill (no floor); its FLOPs and bytes added to ``cost``."""
        logical_computation, logical = self._twin(computation, instruction)
        if instruction.opcode == "custom-call":
            priced = self._kernel(logical_computation, logical, cost)
            if priced is None:
                return 0.0
            kernel, flops, hbm_bytes = priced
            if self.module is not self.logical:  # the same kernel's bytes with its operands padded
                padded_operands = [hlo_ops.operand_array(computation, n) for n in instruction.operands]
                padded = self.kernel_cost(instruction, padded_operands)
                hbm_bytes = padded[2] if padded else hbm_bytes
            fill = 1.0
            if self.corrections.matrix_unit_fill and self.mxu_width and kernel.startswith("splash_mha"):
                operands = [hlo_ops.operand_array(logical_computation, n) for n in logical.operands]
                query = next(a for a in operands if a is not None and a.dtype in kernels.FLOATS and len(a.dims) >= 3)
                fill = matrix_unit_fill(query.dims[-1], self.mxu_width)
            return self._op(cost, flops, hbm_bytes, fill)
        flops, transcendentals = hlo_ops.instruction_flops(self.logical, logical_computation, logical)
        cost.transcendentals += transcendentals
        return self._op(cost, flops, hlo_ops.instruction_hbm_bytes(self.module, computation, instruction))

    def _priced_op(self, computation: Computation, instruction: Instruction, cost) -> float:
        seconds = self._roofline_op(computation, instruction, cost)
        if self.floor_seconds and seconds < self.floor_seconds and _is_floored(self.module, computation,
                                                                                instruction):
            cost.compute_seconds += self.floor_seconds - seconds  # the floor is time the TensorCore is busy
            return self.floor_seconds
        return seconds

    def _launch(self, cost, collective, chip: float, links: float) -> tuple[float, float]:
        latency = self.corrections.collective_latency_seconds
        if latency:
            collective = dataclasses.replace(collective, seconds=collective.seconds + latency)
        return super()._launch(cost, collective, chip, links)


def corrected_cost(hlo_text: str, generation: str, devices, kernel_cost=None,
                   corrections: Corrections = Corrections(), coster=CorrectedCoster, padded_text: str | None = None,
                   logical_module=None) -> hlo_cost.Cost:
    """The ``hlo_cost.Cost`` of one execution of a compiled program on a chip of ``generation``, corrected."""
    chip = CHIPS[generation]
    devices = list(devices)
    logical = logical_module or hlo.parse(hlo_text)
    padded = hlo.parse(padded_text or padded_hlo_text(hlo_text)) if corrections.tile_padding else logical
    return coster(logical, padded, roofline.machine(chip), len(devices), roofline.link_counter(devices, chip),
                  kernel_cost, corrections, tensorcore.clock_hz(generation), tensorcore.mxu_width(generation)).cost()


def corrected_step_estimate(hlo_text: str, generation: str, devices, kernel_cost=None,
                            corrections: Corrections = Corrections()) -> roofline.StepEstimate:
    """``roofline.StepEstimate`` of one compiled step with ``corrections`` (all four by default)."""
    return roofline.estimate(corrected_cost(hlo_text, generation, devices, kernel_cost, corrections))


def contributions(hlo_text: str, generation: str, devices, kernel_cost=None) -> dict:
    """Seconds per step each correction adds, switched on one after another in ``ORDER`` (they add up to the
    corrected step time less the uncorrected one); None where the step is unknown."""
    logical, padded_text = hlo.parse(hlo_text), padded_hlo_text(hlo_text)
    steps = [Corrections.NONE, Corrections(True, False, 0.0, 0.0), Corrections(True, True, 0.0, 0.0),
             Corrections(True, True, OP_FLOOR_CYCLES, 0.0), Corrections()]
    seconds = [roofline.estimate(corrected_cost(hlo_text, generation, devices, kernel_cost, step,
                                                padded_text=padded_text, logical_module=logical)).step_seconds
               for step in steps]
    if None in seconds:
        return {name: None for name in ORDER}
    return {name: after - before for name, before, after in zip(ORDER, seconds, seconds[1:])}
