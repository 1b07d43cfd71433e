"""Ahead-of-time preflight: does every run of a sweep compile, fit, and run fast on a TPU slice?

    python -m sweeps.launch preflight SWEEP_FILE --topology v5e:4x4 [--pod-wide] [--only GLOB] [--json]

Needs the TPU compiler: ``pip install -e ".[tpu]"`` (libtpu). No TPU is
needed: libtpu describes any slice (``v5e:2x2``, ``v5e:16x16``, ``v4:2x2x4``,
``v5p:2x2x2``, ``v6e:4x4``, ...) as compile-only devices, and for each run we
build its mesh on them and compile exactly the sharded train step the trainer
runs (``scaling.train.build``). Nothing is allocated and no data is read; the
model's vocabulary is ``config.model.vocab_size`` as given. The mesh is the
one the run will get: on a multi-host slice, one host's 2x2 chips (the
launcher's default, host-parallel), the whole slice with ``--pod-wide``.
Runs that differ only in seed compile once.

What is reported per run, and where each number comes from:
- ``hbm_bytes_per_device``: ``memory_analysis()`` of the compiled step,
  arguments + outputs - aliased + temporaries. Arguments are the resident
  state shard and the batch, the donated state is aliased to the outputs, so
  this is what one chip holds while the step runs. The compiler's own
  liveness peak is also given (``compiler_peak_bytes``). When the compiler
  itself refuses the program for lack of HBM, the figure is rebuilt from its
  error message (temporaries) plus the argument shards.
- ``fits``: those bytes are at most ``FIT_FRACTION`` of the chip's HBM. The
  5% margin covers what the runtime keeps for itself (libtpu reports 15.75 of
  16 GiB usable on v5e), the program code, and fragmentation.
- ``flops``, ``hbm_bytes_accessed`` (``cost_analysis()``) and
  ``collective_bytes`` (ICI bytes sent, read from the compiled HLO by
  ``sweeps.roofline.collective_traffic``), all per chip per step. The
  compiler counts a loop body once, so for scanned layers we compile the run
  unrolled at depths 1 and 2 and extrapolate linearly in depth, and for the
  sliced cross-entropy once more with half-size slices
  (``roofline.whole_step_costs``); those compiles are shared by every run of
  the same width.
- ``estimated_step_seconds``: the roofline of ``sweeps.roofline``,
  max(FLOPs / peak, HBM bytes / bandwidth) + ICI bytes / bandwidth, with
  ``bound`` naming the term that dominates (``compute_seconds``,
  ``memory_seconds``, ``collective_seconds``).
- ``estimated_mfu``: model FLOPs per step / (step seconds · chips · peak),
  the model FLOPs being ``scaling.flops.training_flops_per_token`` ×
  tokens_per_step, the count the trainer's own MFU uses;
  ``mfu_upper_bound`` is the same with FLOPs / peak as the step time.
The summary gives chip-hours and wall time of the whole sweep on the slice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import time

import jax
import numpy as np

from scaling import budget, mesh as mesh_lib, train
from scaling.config import TrainConfig, to_dict
from scaling.flops import training_flops_per_token
from sweeps import roofline
from sweeps.roofline import CHIPS, GIB, Chip  # noqa: F401 - the chip table is part of this module's API

FIT_FRACTION = 0.95
CHIPS_PER_HOST = 4  # every host of a multi-host v4, v5e, v5p or v6e slice


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice named like ``v5e:4x4``: generation and chip grid."""

    name: str
    generation: str
    shape: tuple[int, ...]

    @property
    def chip(self) -> Chip:
        return CHIPS[self.generation]

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def hosts(self) -> int:
        """TPU VMs of the slice: one for up to 8 chips in a 2-D grid (v5e:2x4) or 4 in 3-D, else 4 chips each."""
        single_host = 8 if self.chip.dims == 2 else CHIPS_PER_HOST
        return 1 if self.chips <= single_host else self.chips // CHIPS_PER_HOST

    def one_host(self) -> "Topology":
        """The 2x2 (2x2x1) slice of one host's chips: what each run gets in host-parallel mode."""
        shape = (2, 2) if self.chip.dims == 2 else (2, 2, 1)
        return Topology(f"{self.generation}:{'x'.join(map(str, shape))}", self.generation, shape)


def parse_topology(name: str) -> Topology:
    """``"v5e:4x4"`` -> Topology; ValueError naming the allowed forms otherwise."""
    generation, _, grid = name.partition(":")
    if generation not in CHIPS:
        raise ValueError(f"--topology {name!r}: unknown TPU generation {generation!r}; allowed "
                         f"{', '.join(CHIPS)} (e.g. v5e:4x4, v4:2x2x4, v5p:2x2x2, v6e:4x4)")
    dims = CHIPS[generation].dims
    example = "x".join(["4"] * dims)
    try:
        shape = tuple(int(part) for part in grid.split("x"))
    except ValueError:
        shape = ()
    if len(shape) != dims or min(shape) < 1:
        raise ValueError(f"--topology {name!r}: {generation} slices are named by a {dims}-D chip grid, "
                         f"e.g. {generation}:{example}")
    return Topology(name, generation, shape)


def libtpu_installed() -> bool:
    """True when the TPU compiler is importable (the ``tpu`` extra is installed)."""
    return importlib.util.find_spec("libtpu") is not None


@contextlib.contextmanager
def _quiet_libtpu_start(topology: Topology):
    # Off a TPU VM, libtpu looks for the VM's metadata and prints errors about
    # missing TPU_* variables. Naming a slice of the wanted kind silences that;
    # variables a real TPU VM sets are left alone. ALLOW_MULTIPLE_LIBTPU_LOAD
    # lets the preflight run beside a training job that holds libtpu's lock.
    chip = topology.chip
    names = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
             "TPU_ACCELERATOR_TYPE": f"{chip.accelerator_prefix}{topology.chips * chip.cores_per_chip}"}
    added = [key for key in names if key not in os.environ]
    os.environ.update({key: names[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def topology_devices(topology: Topology) -> list:
    """Compile-only JAX devices of the slice, one per chip, with their host (process) numbers."""
    from jax.experimental import topologies

    # Hosts own 2x2 chips on multi-host v4, v5e, v5p and v6e slices. (A single-host
    # 2x4 slice counts as two hosts here; that only makes the batch check stricter.)
    per_host = tuple(min(2, size) for size in topology.shape[:2]) + (1,)
    with _quiet_libtpu_start(topology):
        return list(topologies.get_topology_desc(
            platform="tpu", topology_name=f"{topology.generation}:{'x'.join(map(str, topology.shape))}",
            chip_config_name=topology.chip.chip_config, chips_per_host_bounds=per_host, num_slices=1).devices)


# ---------------------------------------------------------------------------
# One run


def _shard_bytes(tree) -> int:
    """Bytes of one device's shard of every ShapeDtypeStruct in ``tree``."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


def _full_bytes(tree) -> int:
    """Bytes of every ShapeDtypeStruct in ``tree`` unsharded (the whole model state)."""
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree_util.tree_leaves(tree))


_SIZE_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes_in(message: str, pattern: str) -> int | None:
    # XLA prints sizes like "865.96G" with binary units.
    match = re.search(pattern + r"\s*\(?([\d.]+)\s*([KMGT]?)i?B?\)?", message)
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)]) if match else None


def _one_line(error: Exception) -> str:
    text = str(error).strip()
    if isinstance(error, ValueError) and text:  # our own config checks already read as one sentence
        return text.splitlines()[0]
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _is_out_of_memory(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text


def _compile(config: TrainConfig, mesh):
    program = train.build(config, mesh, **_masking(config))
    return program.train_step.lower(program.abstract_state, train.batch_spec(config, mesh)).compile()


def _masking(config: TrainConfig) -> dict:
    # The masked objective masks on device; any token id gives the same program.
    if config.model.objective == "masked" and config.data.source not in ("parity", "first"):
        return {"mask_id": config.model.vocab_size - 1, "random_token_limit": config.model.vocab_size}
    return {}


def _whole_step_costs(config: TrainConfig, mesh, compiled) -> dict:
    """Per-chip flops, HBM bytes and collective bytes of one whole train step (``roofline.whole_step_costs``)."""
    return roofline.whole_step_costs(config, mesh, compiled, _compile)


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Where one chip's HBM goes, in bytes: the state shard, the whole state, and the temporaries."""

    state_per_chip: int  # parameters + optimizer state + batch held by one chip
    state_total: int  # the same, unsharded
    temporaries: int | None  # activations and scratch the compiler plans (None: unknown)


def suggest(config: TrainConfig, mesh, footprint: Footprint, hbm_bytes: int) -> str:
    """What to change for a run that does not fit one chip's ``hbm_bytes``: more fsdp, remat, or a smaller batch.

    The larger of state and temporaries is addressed; both are when each
    alone overflows. State that fsdp should have sharded but did not (a width
    the fsdp axis does not divide stays whole on every chip) gets the fsdp
    size that does divide it.
    """
    state, temporaries = footprint.state_per_chip, footprint.temporaries
    devices, fsdp, tensor = mesh.devices.size, mesh.shape["fsdp"], mesh.shape["tensor"]
    width = config.model.width
    activations_dominate = temporaries is not None and temporaries > state
    fixes = []
    if state > FIT_FRACTION * hbm_bytes or not activations_dominate:
        dividing = math.gcd(width, devices // tensor)  # largest fsdp that divides the width and the chips
        what = f"parameters and optimizer state take {state / GIB:.1f} GiB per chip"
        if fsdp > 1 and state > 1.5 * footprint.state_total / fsdp:
            fixes.append(f"{what}, mostly unsharded: fsdp={fsdp} does not divide width {width}, so those "
                         f"dimensions stay whole; use mesh.fsdp={dividing} mesh.data={devices // tensor // dividing}"
                         f" or a width that is a multiple of {fsdp}")
        elif dividing > fsdp:
            fixes.append(f"{what}: shard them over more chips with mesh.fsdp={dividing} "
                         f"mesh.data={devices // tensor // dividing} (now fsdp={fsdp})")
        else:
            fixes.append(f"{what} with fsdp={fsdp}: use a larger slice")
    if activations_dominate:
        if config.model.remat == "none":
            fixes.append(f"activations take {temporaries / GIB:.1f} GiB per chip: recompute them in the "
                         f"backward pass with model.remat=full (or dots)")
        else:
            per_chip = config.batch_size / mesh_lib.batch_axes_size(mesh)
            fixes.append(f"activations take {temporaries / GIB:.1f} GiB per chip even with remat="
                         f"{config.model.remat}: lower the per-chip batch ({per_chip:g} sequences now; halve "
                         f"batch_size or use a larger slice)")
    return "; and ".join(fixes)


def check_run(name: str, config: TrainConfig, topology: Topology, devices: list) -> dict:
    """Compile one run's train step for the slice and report memory, FLOPs, speed, and PASS/FAIL.

    Returns a JSON-ready dict (bytes per device, FLOPs per device per step,
    seconds per step); a compile error becomes a FAIL row with the error,
    never an exception.
    """
    chip = topology.chip
    row = {"name": name, "topology": topology.name, "chips": len(devices), "status": "FAIL", "fits": False,
           "hbm_bytes_per_device": None, "hbm_capacity_bytes": chip.hbm_bytes, "compiler_peak_bytes": None,
           "argument_bytes": None, "temporary_bytes": None, "flops": None, "hbm_bytes_accessed": None,
           "collective_bytes": None, "estimated_step_seconds": None, "bound": None, "compute_seconds": None,
           "memory_seconds": None, "collective_seconds": None, "estimated_mfu": None, "mfu_upper_bound": None,
           "compile_seconds": None,
           "tokens_per_step": config.batch_size * config.data.seq_len,
           "params_non_embedding": budget.non_embedding_params(config.model.depth, config.model.width),
           "suggestion": None, "error": None}
    try:
        mesh = mesh_lib.make_mesh(config.mesh, devices)
        hosts = len({device.process_index for device in devices})
        mesh_lib.check_batch(mesh, config.batch_size, process_count=hosts)
        program = train.build(config, mesh, **_masking(config))
    except Exception as error:  # noqa: BLE001 - e.g. a mesh or batch the slice cannot take: a FAIL row
        row["error"] = _one_line(error)
        return row
    batch = train.batch_spec(config, mesh)
    state_per_chip = _shard_bytes(program.abstract_state) + _shard_bytes(batch)
    state_total = _full_bytes(program.abstract_state) + _full_bytes(batch)

    started = time.perf_counter()
    try:
        compiled = program.train_step.lower(program.abstract_state, batch).compile()
    except Exception as error:  # noqa: BLE001 - a run that cannot compile is a FAIL row, not a crash
        row["compile_seconds"] = round(time.perf_counter() - started, 2)
        text = str(error).strip()
        row["error"] = _one_line(error)
        if _is_out_of_memory(error):
            temporaries, used = _bytes_in(text, r"temporaries"), _bytes_in(text, r"Used")
            row.update(argument_bytes=state_per_chip, temporary_bytes=temporaries,
                       hbm_bytes_per_device=used or (state_per_chip + temporaries if temporaries else None),
                       suggestion=suggest(config, mesh, Footprint(state_per_chip, state_total, temporaries),
                                          chip.hbm_bytes))
        return row
    row["compile_seconds"] = round(time.perf_counter() - started, 2)

    stats = compiled.memory_analysis()
    planned = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
               + stats.temp_size_in_bytes)
    fits = planned <= FIT_FRACTION * chip.hbm_bytes
    row.update(hbm_bytes_per_device=int(planned), argument_bytes=int(stats.argument_size_in_bytes),
               temporary_bytes=int(stats.temp_size_in_bytes), fits=fits, status="PASS" if fits else "FAIL",
               compiler_peak_bytes=int(getattr(stats, "peak_memory_in_bytes", 0)) or None)
    if not fits:
        footprint = Footprint(int(stats.argument_size_in_bytes), state_total, int(stats.temp_size_in_bytes))
        row["suggestion"] = suggest(config, mesh, footprint, chip.hbm_bytes)

    try:
        costs = _whole_step_costs(config, mesh, compiled)
    except Exception as error:  # noqa: BLE001 - the cost estimate is a bonus; the fit verdict stands
        row["error"] = f"cost estimate unavailable: {_one_line(error)}"
        return row
    row.update(flops=costs["flops"], hbm_bytes_accessed=costs["hbm_bytes"], collective_bytes=costs["collective_bytes"])
    if costs["flops"] is None:
        return row
    estimate = roofline.estimate_step(chip, costs["flops"], costs["hbm_bytes"], costs["collective_bytes"])
    model_flops = training_flops_per_token(config.model, config.data.seq_len).total * row["tokens_per_step"]
    row.update(estimated_step_seconds=estimate.step_seconds, bound=estimate.bound,
               compute_seconds=estimate.compute_seconds, memory_seconds=estimate.memory_seconds,
               collective_seconds=estimate.collective_seconds,
               estimated_mfu=roofline.model_flops_utilization(model_flops, estimate.step_seconds, len(devices), chip),
               mfu_upper_bound=roofline.model_flops_utilization(model_flops, estimate.compute_seconds, len(devices),
                                                                 chip))
    return row


# ---------------------------------------------------------------------------
# Many runs, and the command line


def checked_topology(topology: Topology, pod_wide: bool = False) -> Topology:
    """The slice each run is compiled for: the whole slice pod-wide or on one host, else one host's chips.

    In host-parallel mode (the launcher's default on a multi-host slice) every
    host trains its own runs on its own 2x2 chips, so that is the mesh to check.
    """
    return topology if pod_wide or topology.hosts == 1 else topology.one_host()


def _seedless(config: TrainConfig) -> str:
    # Runs that differ only in seed (and so in name) compile to the same program.
    fields = to_dict(config)
    fields.update(seed=0, name="")
    return json.dumps(fields, sort_keys=True)


def check_runs(runs, topology_name: str, progress=None, pod_wide: bool = False) -> list[dict]:
    """Preflight ``runs`` (pairs of name and TrainConfig) for the slice ``topology_name``; one row per run.

    Each run is compiled for the mesh it will train on (``checked_topology``);
    runs that differ only in seed are compiled once and share the row.
    """
    if not os.environ.get("JAX_PLATFORMS"):
        # Host-side work needs only the CPU; never claim (or wait for) a local TPU.
        jax.config.update("jax_platforms", "cpu")
    slice_topology = parse_topology(topology_name)
    topology = checked_topology(slice_topology, pod_wide)
    devices = topology_devices(topology)
    rows, done = [], {}
    for name, config in runs:
        key = _seedless(config)
        if key in done:
            rows.append(dict(done[key], name=name, same_program_as=done[key]["name"]))
            continue
        if progress is not None:
            progress(f"compiling {name} for {topology.name} ({len(devices)} chips"
                     + (f", one host of {slice_topology.name})" if topology != slice_topology else ")") + " ...")
        done[key] = check_run(name, config, topology, devices)
        rows.append(done[key])
    return rows


def sweep_summary(rows: list[dict], runs, topology_name: str, pod_wide: bool = False) -> dict:
    """Chip-hours and wall time (``roofline.sweep_time``) of the ``runs`` (``RunSpec``s, one per row) that fit."""
    slice_topology = parse_topology(topology_name)
    topology = checked_topology(slice_topology, pod_wide)
    parallel = 1 if topology == slice_topology else slice_topology.hosts
    step_seconds = {run.run_id: row["estimated_step_seconds"] for run, row in zip(runs, rows) if row["fits"]}
    mode = "host-parallel" if parallel > 1 else ("pod-wide" if slice_topology.hosts > 1 else "single host")
    return {"topology": slice_topology.name, "checked_topology": topology.name, "mode": mode,
            "runs": len(rows), "runs_failing": sum(not row["fits"] for row in rows),
            **roofline.sweep_time(step_seconds, runs, topology.chips, parallel)}


def _gib(value) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def _cell(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def format_table(rows: list[dict], summary: dict | None = None) -> str:
    """A plain-text table of preflight rows (GiB per chip, TFLOP and GB per chip per step, seconds), then notes."""
    header = ("run", "HBM GiB/chip", "of GiB", "fits", "TFLOP/chip", "ICI GB/chip", "step s", "bound", "MFU est",
              "MFU max", "compile s", "result")
    lines = [header]
    for row in rows:
        lines.append((row["name"], _gib(row["hbm_bytes_per_device"]), _gib(row["hbm_capacity_bytes"]),
                      "yes" if row["fits"] else "no",
                      _cell(row["flops"] and row["flops"] / 1e12, ".3g"),
                      _cell(row["collective_bytes"] and row["collective_bytes"] / 1e9, ".3g"),
                      _cell(row["estimated_step_seconds"], ".3g"), row["bound"] or "-",
                      _cell(row["estimated_mfu"], ".1%"), _cell(row["mfu_upper_bound"], ".1%"),
                      "same as " + row["same_program_as"] if row.get("same_program_as") else
                      _cell(row["compile_seconds"], ".1f"), row["status"]))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = ["  ".join(str(cell).ljust(width) if i == 0 else str(cell).rjust(width)
                      for i, (cell, width) in enumerate(zip(line, widths))) for line in lines]
    for row in rows:
        if row["status"] == "FAIL" and not row.get("same_program_as"):
            text.append(f"{row['name']}: {row['suggestion'] or row['error']}")
    text.append("step s = max(FLOPs / peak, HBM bytes / HBM bandwidth) + ICI bytes / ICI bandwidth "
                "(sweeps/roofline.py); MFU max takes FLOPs / peak alone as the step time")
    if summary:
        text.append(f"sweep on {summary['topology']} ({summary['mode']}, each run on {summary['checked_topology']}): "
                    f"{summary['runs_estimated']} of {summary['runs']} runs estimated, "
                    f"{summary['chip_hours']:.1f} chip-hours, {summary['wall_hours']:.1f} h wall "
                    f"({summary['in_parallel']} in parallel; training steps only)")
    return "\n".join(text)


def main(sweep, args, runs=None) -> int:
    """Entry point behind ``python -m sweeps.launch preflight``: 0 if every run passes, 1 if any fails, 2 on bad input.

    ``args`` carries ``topology`` (e.g. ``"v5e:4x4"``), ``json`` (print
    ``{"runs": [rows], "summary": {...}}`` instead of the table) and
    ``pod_wide``. ``runs`` (``RunSpec``s; default: the whole sweep) are the
    runs to check, e.g. after ``--only``.
    """
    try:  # a bad topology is reported first: it is wrong whatever is installed
        topology = parse_topology(args.topology)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not libtpu_installed():
        print('error: the preflight needs the TPU compiler (libtpu); install it with: pip install -e ".[tpu]"',
              file=sys.stderr)
        return 2
    runs = sweep.expand().runs if runs is None else runs
    pod_wide = getattr(args, "pod_wide", False)
    rows = check_runs([(run.name, run.config) for run in runs], topology.name, pod_wide=pod_wide,
                      progress=lambda text: print(text, file=sys.stderr, flush=True))
    summary = sweep_summary(rows, runs, topology.name, pod_wide)
    if getattr(args, "json", False):
        print(json.dumps({"runs": rows, "summary": summary}, indent=2))
    else:
        print(format_table(rows, summary))
    return 0 if all(row["status"] == "PASS" for row in rows) else 1
