"""A roofline estimate of one train step on a TPU chip, read from the compiled program (``sweeps.hlo_cost``).

    step seconds = the compiled schedule replayed on two streams, the chip and its ICI links:
                   each op takes max(its FLOPs / peak, its HBM bytes / HBM bandwidth),
                   each collective its bytes / (the links of the axis it runs on × one link's bandwidth),
                   and an asynchronous collective overlaps the ops between its start and its done

All figures are per chip per step, summed over the HLO with every while loop
counted its trip count times (nested loops multiply). A loop whose count
cannot be read makes the step's figures unknown (None), never a guess:
``loops_uncounted`` says how many. Pallas kernels (custom calls) carry no
cost in the HLO; ``sweeps.kernels`` counts the attention kernels
analytically and anything else it cannot price also makes the figures
unknown (``kernels_uncounted``). ``bound`` names what the step spends most
time on: compute-bound ops, memory-bound ops, or collectives the schedule
leaves exposed. MFU is ``scaling.flops.model_flops_utilization``, the
trainer's own definition: model FLOPs (``scaling.flops``), never the
compiled FLOPs, whose rematerialised forward passes are cost, not work.

What the model leaves out, so the estimate leans optimistic: matmuls run at
the chip's peak whatever their shape (a 64-wide attention head half-fills
a 128×128 matrix unit), elementwise work is priced as FLOPs at that same
peak, and the vector units, the scalar core and kernel launch gaps are not
modelled. It is not a measurement: nothing here ran on a TPU.
"""

from __future__ import annotations

import dataclasses

from sweeps import hlo_cost

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """Public facts about one TPU generation, per chip."""

    hbm_bytes: int  # HBM capacity
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # HBM bytes/s
    ici_bandwidth: float  # inter-chip interconnect bytes/s, one direction, all links of the chip
    chip_config: str  # libtpu chip config giving one JAX device per chip, as on the TPU VMs
    dims: int  # chip-grid dimensions in topology names: v5e:4x4, v4:2x2x4
    cores_per_chip: int  # accelerator-type names count TensorCores (v4-32 = 16 chips)
    accelerator_prefix: str

    @property
    def ici_links(self) -> int:
        """ICI links per chip: a neighbour on each side of every grid dimension (4 on 2-D, 6 on 3-D slices)."""
        return 2 * self.dims


# Per-chip figures from the Cloud TPU documentation, one page per generation:
#   v4:  https://cloud.google.com/tpu/docs/v4        275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s
#        ICI: 2400 Gbps per chip, from the v4 column of the comparison table in
#        https://cloud.google.com/blog/products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer
#   v5e: https://cloud.google.com/tpu/docs/v5e       197 TFLOP/s, 16 GB HBM2 at 819 GB/s, ICI 1600 Gbps
#   v5p: https://cloud.google.com/tpu/docs/v5p       459 TFLOP/s, 95 GB HBM2e at 2765 GB/s, ICI 4800 Gbps
#   v6e: https://cloud.google.com/tpu/docs/v6e       918 TFLOP/s, 32 GB HBM at 1640 GB/s, ICI 3200 Gbps
# ICI in Gbps is one direction, all links of the chip together; the pages'
# newer "bidirectional GBps" rows are twice Gbps/8 (v5e 400, v5p 1200, v6e 800
# GB/s). One direction is used here: a ring collective sends each byte once.
# One link carries ici_bandwidth / ici_links. HBM capacity is counted in GiB
# because libtpu does (it reports 15.75 of 16 GiB usable on v5e). The compiler
# agrees on v5e's peak: its optimal_seconds for a lone matmul is flops / 197e12.
CHIPS = {
    "v4": Chip(32 * GIB, 275e12, 1200e9, 2400e9 / 8, "megacore", 3, 2, "v4-"),
    "v5e": Chip(16 * GIB, 197e12, 819e9, 1600e9 / 8, "default", 2, 1, "v5litepod-"),
    "v5p": Chip(95 * GIB, 459e12, 2765e9, 4800e9 / 8, "megacore", 3, 2, "v5p-"),
    "v6e": Chip(32 * GIB, 918e12, 1640e9, 3200e9 / 8, "default", 2, 1, "v6e-"),
}


# ---------------------------------------------------------------------------
# Whole-step costs from a compiled program


def link_counter(devices, chip: Chip):
    """``links(group)``: the ICI links a collective over logical device ids ``group`` can use on one chip.

    A group is laid out on the physical chip grid (``device.coords``); a ring
    on each grid dimension the group spans runs both ways, so it uses 2 links
    per spanned dimension, at most the chip's ``ici_links``. Devices without
    coordinates (CPU) get every link.
    """
    coords = [getattr(device, "coords", None) for device in devices]

    def links(group) -> int:
        points = [coords[i] for i in group if i < len(coords) and coords[i] is not None]
        if len(points) < len(group) or not points:
            return chip.ici_links
        spanned = sum(len({point[axis] for point in points}) > 1 for axis in range(len(points[0])))
        return max(1, min(chip.ici_links, 2 * spanned))

    return links


def machine(chip: Chip) -> hlo_cost.Machine:
    return hlo_cost.Machine(chip.peak_flops, chip.hbm_bandwidth, chip.ici_bandwidth / chip.ici_links, chip.ici_links)


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


def step_estimate(hlo_text: str, chip: Chip, devices, kernel_cost=None) -> StepEstimate:
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
    """The collectives of a compiled program's HLO text, per chip per execution (``sweeps.hlo_cost``)."""
    one_link = hlo_cost.Machine(1.0, 1.0, 1.0)
    cost = hlo_cost.program_cost(hlo_text, one_link, device_count)
    by_kind = {kind: values[:3] for kind, values in cost.collectives.items()}
    return CollectiveTraffic(cost.ici_bytes, sum(values[1] for values in by_kind.values()), by_kind,
                             cost.loops_uncounted)


def sweep_time(step_seconds: dict, runs, chips_per_run: int, parallel: int = 1) -> dict:
    """Chip-hours and wall hours of training ``runs`` (``sweeps.spec.RunSpec``) from estimated step times.

    ``step_seconds`` maps run ids to seconds per step (runs without one, e.g.
    those that do not fit, count as zero and are left out of
    ``runs_estimated``). With ``parallel`` > 1 the runs are dealt to that many
    hosts as the launcher deals them (``sweeps.spec.shard``) and the wall time
    is the busiest host's; otherwise runs follow one another. Only training
    steps count: evaluation, checkpoints, compilation and data loading do not.
    """
    from sweeps import spec as spec_lib

    seconds = {run.run_id: step_seconds[run.run_id] * run.config.steps for run in runs
               if step_seconds.get(run.run_id)}
    shares = [spec_lib.shard(list(runs), index, parallel) for index in range(parallel)] if runs else [[]]
    wall = max(sum(seconds.get(run.run_id, 0.0) for run in share) for share in shares)
    return {"runs_estimated": len(seconds), "in_parallel": parallel,
            "chip_hours": sum(seconds.values()) * chips_per_run / 3600, "wall_hours": wall / 3600}
