"""A roofline estimate of one train step: TPU chip figures, collective traffic read from compiled HLO.

    step seconds ≈ max(FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth) + ICI bytes / ICI bandwidth

All three numerators are per chip and per step. FLOPs and HBM bytes are the
compiler's ``cost_analysis()`` (``flops``, ``bytes accessed``). ICI bytes are
summed here over the collectives of the compiled program's HLO text
(``collective_traffic``), because the compiler reports no such figure. The
collectives are added, not overlapped with compute: XLA can hide some of them
behind matmuls, so this leans towards a longer step. ``bound`` names the term
that dominates. ``whole_step_costs`` gathers the three numerators for a
whole step, correcting for the loops (scanned layers, the sliced loss) that
the compiler's cost analysis counts once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

from scaling.config import to_dict

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


# Per-chip figures from the Cloud TPU documentation, one page per generation:
#   v4:  https://cloud.google.com/tpu/docs/v4        275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s
#        ICI: 2400 Gbps per chip, from the v4 column of the comparison table in
#        https://cloud.google.com/blog/products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer
#   v5e: https://cloud.google.com/tpu/docs/v5e       197 TFLOP/s, 16 GB HBM2 at 819 GB/s, ICI 1600 Gbps
#   v5p: https://cloud.google.com/tpu/docs/v5p       459 TFLOP/s, 95 GB HBM2e at 2765 GB/s, ICI 4800 Gbps
#   v6e: https://cloud.google.com/tpu/docs/v6e       918 TFLOP/s, 32 GB HBM at 1640 GB/s, ICI 3200 Gbps
# ICI in Gbps is one direction; the pages' newer "bidirectional GBps" rows are
# twice Gbps/8 (v5e 400, v5p 1200, v6e 800 GB/s). One direction is used here:
# a ring collective sends each byte once. HBM capacity is counted in GiB
# because libtpu does (it reports 15.75 of 16 GiB usable on v5e). The compiler
# agrees on v5e's peak: its optimal_seconds for a lone matmul is flops / 197e12.
CHIPS = {
    "v4": Chip(32 * GIB, 275e12, 1200e9, 2400e9 / 8, "megacore", 3, 2, "v4-"),
    "v5e": Chip(16 * GIB, 197e12, 819e9, 1600e9 / 8, "default", 2, 1, "v5litepod-"),
    "v5p": Chip(95 * GIB, 459e12, 2765e9, 4800e9 / 8, "megacore", 3, 2, "v5p-"),
    "v6e": Chip(32 * GIB, 918e12, 1640e9, 3200e9 / 8, "default", 2, 1, "v6e-"),
}


# ---------------------------------------------------------------------------
# Collectives in HLO text

# The cross-chip collectives of HLO. Their asynchronous halves are counted at
# the "-start" (the "-done" only waits). TPU programs also wrap collectives in
# fusions (async_collective_fusion) and async computations: those are reached
# through the calls that name them, so each collective counts once per execution.
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all",
               "collective-permute", "collective-broadcast")

_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
                "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|body|condition|to_apply|true_computation|false_computation|"
                     r"branch_computations|async_computation)=\{?(%?[\w.\-]+(?:,\s*%[\w.\-]+)*)\}?")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dims) of every array in an HLO type (a tuple type lists several)."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(type_text)]


def _nbytes(array) -> float:
    dtype, dims = array
    return _DTYPE_BYTES[dtype] * math.prod(dims)


def _group_size(attributes: str, default: int) -> int:
    """Chips taking part in one group of a collective, from its replica_groups (or the default)."""
    mesh_form = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
    if mesh_form:  # mesh['axis_0'=4,'axis_1'=1] {'axis_0'}: the product of the named axes
        sizes = {name: int(size) for name, size in re.findall(r"'([^']+)'=(\d+)", mesh_form.group(1))}
        return math.prod(sizes.get(name, 1) for name in re.findall(r"'([^']+)'", mesh_form.group(2)))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
    if iota:  # [groups, size]<=[devices]
        return int(iota.group(2))
    explicit = re.search(r"replica_groups=\{\{([\d,\s]*)\}", attributes)
    if explicit and explicit.group(1).strip():
        return len(explicit.group(1).split(","))
    return default


def _full_buffer(kind: str, result_bytes: float, group: int) -> float:
    """The whole buffer a collective works on: its result, except a reduce-scatter's (one chip's 1/group)."""
    return result_bytes * group if kind == "reduce-scatter" else result_bytes


def _bytes_sent(kind: str, buffer: float, group: int) -> float:
    """Bytes one chip sends for one collective on a ``buffer``-byte array under ring algorithms."""
    if group <= 1:
        return 0.0
    if kind in ("collective-permute", "collective-broadcast"):
        return buffer
    share = (group - 1) / group
    # An all-reduce is a reduce-scatter then an all-gather; each of those, and
    # an all-to-all, sends all but its own 1/group of the buffer.
    return 2 * share * buffer if kind == "all-reduce" else share * buffer


@dataclasses.dataclass
class CollectiveTraffic:
    """Collectives of one compiled program, per chip per execution.

    ``bytes`` is what each chip sends over ICI (ring algorithms: an
    all-gather, reduce-scatter or all-to-all of a B-byte array over n chips
    sends B·(n-1)/n, an all-reduce twice that, a collective-permute B);
    ``buffer_bytes`` sums those B (the whole gathered or reduced arrays); both
    are broken down by kind in ``by_kind`` (kind -> [count, buffer bytes,
    bytes sent]).
    """

    bytes: float = 0.0
    buffer_bytes: float = 0.0
    by_kind: dict = dataclasses.field(default_factory=dict)
    unknown_loops: int = 0  # while loops without a known trip count (their collectives counted once)

    def add(self, kind: str, buffer: float, sent: float, count: float = 1) -> None:
        self.bytes += sent
        self.buffer_bytes += buffer
        old = self.by_kind.get(kind, (0, 0.0, 0.0))
        self.by_kind[kind] = [old[0] + count, old[1] + buffer, old[2] + sent]

    def merge(self, other: "CollectiveTraffic", times: float = 1) -> None:
        """Add ``times`` executions of ``other``."""
        for kind, (count, buffer, sent) in other.by_kind.items():
            self.add(kind, buffer * times, sent * times, count * times)
        self.unknown_loops += other.unknown_loops


def _split_computations(hlo_text: str) -> tuple[dict[str, list[str]], str | None]:
    computations, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and "=" not in line.split("(")[0]:
                current = match.group(1)
                computations[current] = []
                if line.startswith("ENTRY"):
                    entry = current
        elif line.strip() == "}":
            current = None
        else:
            computations[current].append(line)
    return computations, entry


def collective_traffic(hlo_text: str, device_count: int = 1) -> CollectiveTraffic:
    """Sum the collectives of a compiled program's HLO text (``compiled.as_text()``), per chip per step.

    Every instruction reachable from the entry computation counts once per
    execution: bodies of while loops with a ``known_trip_count`` count that
    many times, fusions and async computations once per call. A collective
    whose ``replica_groups`` cannot be read is taken to span ``device_count``
    chips. Asynchronous ``-start`` ops return (operands, results) tuples; their
    results are the second half.
    """
    computations, entry = _split_computations(hlo_text)
    cache: dict[str, CollectiveTraffic] = {}

    def once(name: str, stack: tuple = ()) -> CollectiveTraffic:
        """The collectives of one execution of computation ``name``, its callees included."""
        if name in cache:
            return cache[name]
        traffic = CollectiveTraffic()
        for line in computations.get(name, ()):
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            type_text, opcode, rest = match.groups()
            base = opcode.removesuffix("-start")
            if base in COLLECTIVES:
                arrays = [a for a in _arrays(type_text) if a[1]]  # scalars are async context, not data
                if opcode.endswith("-start") and base != "all-reduce" and len(arrays) >= 2:
                    arrays = arrays[len(arrays) // 2:]
                if base == "all-reduce" and name.startswith("all-reduce-scatter"):
                    # TPU's all-reduce-scatter fusion: an all-reduce whose result is sliced to
                    # one chip's share, which the TPU runs as a reduce-scatter.
                    base = "reduce-scatter-fused"
                group = _group_size(rest, device_count)
                kind = "reduce-scatter" if base == "reduce-scatter-fused" else base
                buffer = _full_buffer(base, sum(_nbytes(a) for a in arrays), group)
                traffic.add(kind, buffer, _bytes_sent(kind, buffer, group))
            times = 1
            if opcode == "while":
                trip = _TRIP_COUNT.search(rest)
                if trip:
                    times = int(trip.group(1))
                else:
                    traffic.unknown_loops += 1
            for called in _CALLED.findall(rest):
                for callee in called.split(","):
                    callee = callee.strip().lstrip("%")
                    if callee in computations and callee not in stack:
                        traffic.merge(once(callee, stack + (name,)), times)
        cache[name] = traffic
        return traffic

    return once(entry) if entry is not None else CollectiveTraffic()


# ---------------------------------------------------------------------------
# Costs of a whole step from compiled programs


def compiled_costs(compiled, chips: int) -> dict:
    """Per-chip ``flops``, HBM ``hbm_bytes`` and ICI ``collective_bytes`` of one compiled program (None: unknown)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
        analysis = analysis[0] if analysis else None
    analysis = analysis or {}
    flops, accessed = analysis.get("flops"), analysis.get("bytes accessed")
    return {"flops": float(flops) if flops and flops > 0 else None,
            "hbm_bytes": float(accessed) if accessed and accessed > 0 else None,
            "collective_bytes": collective_traffic(compiled.as_text(), chips).bytes}


# Costs of the depth-1 and depth-2 unrolled compiles, keyed by everything else
# about the run and its mesh: runs that differ only in depth or seed share them.
_SHALLOW_COSTS: dict = {}


def _shallow_key(config, mesh) -> str:
    fields = to_dict(config)
    fields.update(seed=0, name="", sweep_name="")
    fields["model"].update(depth=0, scan_layers=False)
    devices = tuple(int(device.id) for device in mesh.devices.flat)
    return json.dumps([fields, dict(mesh.shape), devices, mesh.devices.flat[0].device_kind], sort_keys=True)


def _loss_slice_positions(config, chunk_tokens: int) -> int:
    # Positions per slice of the sliced cross-entropy (scaling.loss.cross_entropy_sum), one microbatch.
    return min(config.data.seq_len, max(1, chunk_tokens // config.batch_size))


def _shallow(config, depth: int, chunk_tokens: int):
    model = dataclasses.replace(config.model, depth=depth, scan_layers=False, loss_chunk_tokens=chunk_tokens)
    return dataclasses.replace(config, model=model, microbatches=1)


def whole_step_costs(config, mesh, compiled, compile_step) -> dict:
    """Per-chip flops, HBM bytes and collective bytes of one whole train step of ``config`` on ``mesh``.

    ``compiled`` is the step as it will run; ``compile_step(config, mesh)``
    compiles the shallow variants described here.

    The compiler's cost analysis counts a loop body once, so with scanned
    layers its figures miss L-1 layers, and with the sliced cross-entropy
    all but one slice of the logits. Layers are identical, so the step's cost
    is linear in depth; a slice's cost is linear in its positions. We compile
    the run unrolled at depths 1 and 2 and, when the loss is sliced, at
    depth 1 with half-size slices, and solve cost = a + L·layer + P·position,
    P being the positions the compiler saw; the whole step has P = every
    position of the sequence. (This equals a full unrolled compile:
    tests/test_preflight.py checks it.) The collective bytes come from the
    HLO, where loops are counted with their trip counts, so only depth is
    extrapolated for them. The shallow compiles take the whole batch in one
    microbatch (the same FLOPs; repeated weight gathers of microbatches > 1
    are not counted) and are made once per width (and mesh), then reused
    for every depth and seed.
    """
    depth, chips = config.model.depth, mesh.devices.size
    one_batch = dataclasses.replace(config, microbatches=1)
    chunk_tokens = config.model.loss_chunk_tokens
    positions = _loss_slice_positions(one_batch, chunk_tokens)
    sliced = positions < config.data.seq_len
    if not sliced and (not config.model.scan_layers or depth == 1) and config.microbatches == 1:
        return compiled_costs(compiled, chips)
    key = _shallow_key(config, mesh)
    if key not in _SHALLOW_COSTS:
        plans = [(1, chunk_tokens), (2, chunk_tokens)]
        if sliced:  # half-size slices (or double, when a slice is one position)
            plans.append((1, chunk_tokens // 2 if positions > 1 else 2 * config.batch_size))
        _SHALLOW_COSTS[key] = [(_loss_slice_positions(one_batch, tokens),
                                compiled_costs(compile_step(_shallow(config, shallow, tokens), mesh), chips))
                               for shallow, tokens in plans]
    (seen, one), (_, two) = _SHALLOW_COSTS[key][:2]
    whole = {}
    for name in one:
        if one[name] is None or two[name] is None:
            whole[name] = None
            continue
        whole[name] = one[name] + (depth - 1) * (two[name] - one[name])
        if sliced and name != "collective_bytes":
            other_seen, other = _SHALLOW_COSTS[key][2]
            per_position = (one[name] - other[name]) / (seen - other_seen)
            slices = -(-config.data.seq_len // seen)
            whole[name] += (slices * seen - seen) * per_position
    return whole


# ---------------------------------------------------------------------------
# The estimate


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """Roofline seconds of one step on one chip, each term and their combination."""

    compute_seconds: float  # FLOPs / peak FLOP/s
    memory_seconds: float | None  # HBM bytes / HBM bandwidth (None: the compiler gave no byte count)
    collective_seconds: float  # ICI bytes / ICI bandwidth
    step_seconds: float
    bound: str  # "compute", "memory" or "collectives": the largest of the three terms


def estimate_step(chip: Chip, flops: float, hbm_bytes: float | None, ici_bytes: float) -> StepEstimate:
    """max(FLOPs / peak, HBM bytes / HBM bandwidth) + ICI bytes / ICI bandwidth, all per chip per step."""
    compute = flops / chip.peak_flops
    memory = None if hbm_bytes is None else hbm_bytes / chip.hbm_bandwidth
    collectives = ici_bytes / chip.ici_bandwidth
    on_chip = max(compute, memory or 0.0)
    terms = {"compute": compute, "memory": memory or 0.0, "collectives": collectives}
    return StepEstimate(compute, memory, collectives, on_chip + collectives, max(terms, key=terms.get))


def model_flops_utilization(model_flops: float, step_seconds: float, chips: int, chip: Chip) -> float:
    """Model FLOPs of one step (all chips) / (step seconds · chips · peak FLOP/s)."""
    return model_flops / (step_seconds * chips * chip.peak_flops)


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
