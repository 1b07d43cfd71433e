"""A roofline estimate of one train step on a TPU chip, read from the compiled program (``sweeps.preflight.hlo_cost``).

    step seconds = the compiled schedule replayed on two streams, the chip and its ICI links:
                   each op takes max(its FLOPs / peak, its HBM bytes / HBM bandwidth),
                   each collective its bytes / (the links of the axis it runs on × one link's bandwidth),
                   and an asynchronous collective overlaps the ops between its start and its done

All figures are per chip per step, summed over the HLO with every while loop
counted its trip count times (nested loops multiply). A loop whose count
cannot be read makes the step's figures unknown (None), never a guess:
``loops_uncounted`` says how many. Pallas kernels (custom calls) carry no
cost in the HLO; ``sweeps.preflight.kernels`` counts the attention kernels
analytically and anything else it cannot price also makes the figures
unknown (``kernels_uncounted``). ``bound`` names what the step spends most
time on: compute-bound ops, memory-bound ops, or collectives the schedule
leaves exposed. MFU is ``scaling.model.flops.model_flops_utilization``, the
trainer's own definition: model FLOPs (``scaling.model.flops``), never the
compiled FLOPs, whose rematerialised forward passes are cost, not work.

What the model leaves out, so the estimate leans optimistic: matmuls run at
the chip's peak whatever their shape (a 64-wide attention head half-fills
a 128×128 matrix unit), elementwise work is priced as FLOPs at that same
peak, and the vector units, the scalar core and kernel launch gaps are not
modelled. It is not a measurement: nothing here ran on a TPU.
"""

from __future__ import annotations

import dataclasses

from scaling.hardware import Accelerator
from sweeps.preflight import hlo_cost

# ---------------------------------------------------------------------------
# Whole-step costs from a compiled program


def link_counter(devices, chip: Accelerator):
    """``links(group)``: the ICI links a collective over logical device ids ``group`` can use on one chip.

    A group is laid out on the physical chip grid (``device.coords``); a ring
    on each grid dimension the group spans runs both ways, so it uses 2 links
    per spanned dimension, at most the chip's ``links``. Devices without
    coordinates (CPU) get every link.
    """
    coords = [getattr(device, "coords", None) for device in devices]

    def links(group) -> int:
        points = [coords[i] for i in group if i < len(coords) and coords[i] is not None]
        if len(points) < len(group) or not points:
            return chip.links
        spanned = sum(len({point[axis] for point in points}) > 1 for axis in range(len(points[0])))
        return max(1, min(chip.links, 2 * spanned))

    return links


def machine(chip: Accelerator) -> hlo_cost.Machine:
    """The cost model's view of ``chip``: its bfloat16 peak, HBM bandwidth, and one link's bandwidth."""
    return hlo_cost.Machine(chip.bf16_flops, chip.hbm_bandwidth, chip.link_bandwidth / chip.links, chip.links)


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """Roofline seconds of one step on one chip; every figure None when a loop or kernel went uncounted."""

    flops: float | None  # compiled FLOPs, remat's recomputation included
    hbm_bytes: float | None
    collective_bytes: float | None  # ICI bytes sent
    compute_seconds: float | None  # time of the ops bound by FLOPs
    memory_seconds: float | None  # time of the ops bound by HBM bytes
    collective_seconds: float | None  # the links' busy time
    exposed_collective_seconds: float | None  # what the schedule could not hide behind ops
    step_seconds: float | None
    bound: str | None  # "compute", "memory" or "collectives"
    loops_counted: int
    loops_uncounted: int
    kernels: dict  # analytically counted kernels: name -> [calls, FLOPs]
    kernels_uncounted: list
    collectives: dict  # kind -> [count, buffer bytes, bytes sent, seconds]

    @property
    def known(self) -> bool:
        return self.step_seconds is not None


def estimate(cost: hlo_cost.Cost) -> StepEstimate:
    """The ``StepEstimate`` of a program's ``hlo_cost.Cost``."""
    known = cost.loops_uncounted == 0 and not cost.kernels_uncounted
    exposed = max(0.0, cost.seconds - cost.op_seconds)
    terms = {"compute": cost.compute_seconds, "memory": cost.memory_seconds, "collectives": exposed}
    value = (lambda x: x) if known else (lambda x: None)  # noqa: E731
    return StepEstimate(value(cost.flops), value(cost.hbm_bytes), value(cost.ici_bytes), value(cost.compute_seconds),
                        value(cost.memory_seconds), value(cost.collective_seconds), value(exposed),
                        value(cost.seconds), value(max(terms, key=terms.get)), cost.loops_counted,
                        cost.loops_uncounted, dict(cost.kernels), list(cost.kernels_uncounted),
                        dict(cost.collectives))


def step_estimate(hlo_text: str, chip: Accelerator, devices, kernel_cost=None) -> StepEstimate:
    """The roofline of one execution of a compiled step (``compiled.as_text()``) on ``devices`` (the mesh's, in
    the order the program numbers them)."""
    devices = list(devices)
    return estimate(hlo_cost.program_cost(hlo_text, machine(chip), len(devices), link_counter(devices, chip),
                                          kernel_cost))


@dataclasses.dataclass
class CollectiveTraffic:
    """ICI traffic of one compiled program per chip: ``bytes`` sent, ``buffer_bytes`` of the arrays
    collected, ``by_kind`` kind -> [count, buffer bytes, bytes sent], ``unknown_loops`` loops not counted."""

    bytes: float = 0.0
    buffer_bytes: float = 0.0
    by_kind: dict = dataclasses.field(default_factory=dict)
    unknown_loops: int = 0


def collective_traffic(hlo_text: str, device_count: int = 1) -> CollectiveTraffic:
    """The collectives of a compiled program's HLO text, per chip per execution (``sweeps.preflight.hlo_cost``)."""
    one_link = hlo_cost.Machine(1.0, 1.0, 1.0)
    cost = hlo_cost.program_cost(hlo_text, one_link, device_count)
    by_kind = {kind: values[:3] for kind, values in cost.collectives.items()}
    return CollectiveTraffic(cost.ici_bytes, sum(values[1] for values in by_kind.values()), by_kind,
                             cost.loops_uncounted)


def sweep_time(step_seconds: dict, runs, chips_per_run: int, shares: list | None = None) -> dict:
    """Chip-hours and wall hours of training ``runs`` (objects with ``run_id`` and ``config``, such as the
    launcher's ``RunSpec``) from estimated step times.

    ``step_seconds`` maps run ids to seconds per step (runs without one, e.g.
    those that do not fit, count as zero and are left out of
    ``runs_estimated``). ``shares`` are the runs each host trains, when hosts
    train in parallel (the launcher deals them); the wall time is then the
    busiest host's; otherwise runs follow one another. Only training steps
    count: evaluation, checkpoints, compilation and data loading do not.
    """
    seconds = {run.run_id: step_seconds[run.run_id] * run.config.steps for run in runs
               if step_seconds.get(run.run_id)}
    shares = shares if shares else [list(runs)]
    wall = max(sum(seconds.get(run.run_id, 0.0) for run in share) for share in shares)
    return {"runs_estimated": len(seconds), "in_parallel": len(shares),
            "chip_hours": sum(seconds.values()) * chips_per_run / 3600, "wall_hours": wall / 3600}
