"""Ahead-of-time preflight: does every run of a sweep compile, fit, and run fast on a TPU slice?

    python -m sweeps.launch preflight SWEEP_FILE --topology v5e:4x4 [--mode quick|depths|full] [--pod-wide] [--json]

(the launcher hands this module its runs and how it deals them to hosts; nothing here reads a sweep file).

Needs the TPU compiler: ``pip install -e ".[tpu]"`` (libtpu). No TPU is
needed: libtpu describes any slice (``v5e:2x2``, ``v5e:16x16``, ``v4:2x2x4``,
``v5p:2x2x2``, ``v6e:4x4``, ...) as compile-only devices, and for each run we
build its mesh on them and compile exactly the sharded train step the trainer
runs (``scaling.model.run_program.lower_train_step``). Nothing is allocated and no data is read; the
model's vocabulary is ``config.model.vocab_size`` as given. The mesh is the
one the run will get: on a multi-host slice, one host's 2x2 chips (the
launcher's default, host-parallel), the whole slice with ``--pod-wide``.
Runs of one program shape (``scaling.model.program.ProgramShape``: seeds and
learning rates are arguments of the step, not part of it) compile once.

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
- ``flops`` (compiled, remat's recomputation included), ``hbm_bytes_accessed``
  and ``collective_bytes`` (ICI bytes sent), all per chip per step, summed
  over the compiled HLO by ``sweeps.preflight.hlo_cost`` with every while loop counted
  its trip count times (``loops_counted``). A loop it cannot count
  (``loops_uncounted`` > 0) or a kernel it cannot price
  (``kernels_uncounted``) makes every figure below None ("unknown" in the
  table), never a guess. Pallas kernels carry no cost in the HLO: the
  attention kernels are counted by a stated model, any other kernel by the
  ``pl.CostEstimate`` it declares (``kernels_analytic``: calls per kernel;
  ``kernel_cost_sources``: which of the two priced it; ``sweeps.preflight.kernels``).
- ``estimated_step_seconds``: the roofline of ``sweeps.preflight.roofline`` (per-op
  max(FLOPs / peak, bytes / bandwidth), collectives on the links of their
  mesh axis, overlapped as the compiled schedule allows), with ``bound``
  naming what dominates: ``compute_seconds`` or ``memory_seconds`` (ops
  bound by FLOPs or by HBM bytes) or ``exposed_collective_seconds``.
- ``estimated_mfu``: ``scaling.model.flops.model_flops_utilization``, the
  trainer's own MFU, at the estimated step time: model FLOPs, not compiled
  ones; ``mfu_upper_bound`` is the same with compiled FLOPs / peak as the
  step time (every op at peak, nothing else).
- two estimates per row and the range between them (``sweeps.preflight.estimate_range``):
  ``roofline_corrected_step_seconds`` (the roofline corrected for tile
  padding, a per-op floor, collective latency and attention's matrix-unit
  fill, ``sweeps.preflight.roofline_corrections``; ``corrections`` gives each one's
  seconds) and ``compiler_step_seconds`` (libtpu's ``estimated_cycles`` at the
  chip's clock, ``sweeps.preflight.compiler_estimate``; None and
  ``compiler_estimate_missing`` where the backend gave none);
  ``step_seconds_low``/``_high``, ``mfu_low``/``_high`` (attention's full
  square, the trainer's MFU) and ``mfu_causal_low``/``_high`` (its causal
  half). The summary gives ``chip_hours_low``/``_high`` and the median MFUs.
- ``remat_suggestion`` (``--remat-search``): the cheapest rematerialisation
  policy (none < dots < full) that fits, found by compiling the cheaper ones.
- ``method``: ``compiled``, ``re-priced`` (another depth of a compiled
  width, its layer loop's trip count changed: ``sweeps.preflight.layer_loop``) or
  ``interpolated`` (between compiled widths of the same tiling, with the
  measured ``interpolation_error``), as ``--mode`` chose (``sweeps.preflight.quick``:
  ``quick`` by default, ``depths``, ``full``); ``method_note`` says from what,
  ``fits_by`` how a run not compiled was judged to fit; ``per_layer`` (compiled
  rows) is what one more layer adds to each figure.
- ``parallelism`` (sweeps with ``parallelism="auto"``; compiled rows only): the run's modes of training
  (data, fsdp, packed) compiled and priced per run by both estimates, and the cheapest that fits
  (``sweeps.preflight.parallelism``).
- ``compile_cached``: the compiler's answer came from ``sweeps.preflight.compile_cache``
  (the same lowered program for the same slice and compiler was compiled by
  an earlier preflight), so ``compile_seconds`` is only the lookup.
The summary gives chip-hours, wall time, the runs' uncounted loops, and how
many programs were compiled and how many came from the cache; the chip-hours'
price on demand and spot (``sweeps.preflight.prices``: ``--prices FILE``, else
SkyPilot's downloaded catalog, else the shipped table, each named with its
date). Each run's estimate is kept beside the compile cache
(``sweeps.preflight.estimate_store``) for ``dry-run`` and for the run's record.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable

import jax
import numpy as np

from scaling.config import TrainConfig
from scaling.hardware import GIB, Accelerator
from scaling.model import budget, mesh as mesh_lib, program as program_lib, run_program
from scaling.model.flops import model_flops_utilization
from scaling.store.rundir import one_line
from sweeps.preflight import compile_cache, estimate_range, kernels, layer_loop, roofline
from sweeps.preflight.advice import FIT_FRACTION, Footprint, cheapest_remat, suggest
from sweeps.preflight.topology import Topology, checked_topology, parse_topology, topology_devices


# ---------------------------------------------------------------------------
# One run


def _shard_bytes(tree) -> int:
    """Bytes of one device's shard of every ShapeDtypeStruct in ``tree``."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


def parameter_count(program) -> int:
    """Parameters of a built program's model (embeddings, padding ids and norms included)."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(program.abstract_state["params"]))


def _full_bytes(tree) -> int:
    """Bytes of every ShapeDtypeStruct in ``tree`` unsharded (the whole model state)."""
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree_util.tree_leaves(tree))


_SIZE_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes_in(message: str, pattern: str) -> int | None:
    # XLA prints sizes like "865.96G" with binary units.
    match = re.search(pattern + r"\s*\(?([\d.]+)\s*([KMGT]?)i?B?\)?", message)
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)]) if match else None


def is_out_of_memory(error: Exception) -> bool:
    """Whether a compile failed for lack of HBM (its answer depends on the program alone: worth caching)."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text


def program_arguments(config: TrainConfig) -> dict:
    """``program.build``'s data arguments for ``config``, from the one function the trainer uses too."""
    return program_lib.arguments_of(config)


def program_key(config: TrainConfig) -> tuple:
    """What a run's compiled program depends on: its ``ProgramShape`` (the trainer's) and its mesh.

    Runs with the same key compile to the same program, so the preflight compiles one of them.
    """
    return program_lib.ProgramShape.of(config, **program_arguments(config)), config.mesh


def check_run(name: str, config: TrainConfig, topology: Topology, devices: list, remat_search: bool = False,
              cache: compile_cache.CompileCache | None = None, per_layer: bool = True) -> dict:
    """Compile one run's train step for the slice and report memory, FLOPs, speed, and PASS/FAIL.

    Returns a JSON-ready dict (bytes per device, FLOPs per device per step,
    seconds per step); a compile error becomes a FAIL row with the error,
    never an exception. With ``remat_search``, a run that fits also gets
    ``remat_suggestion``: the cheapest policy that fits (``advice.cheapest_remat``).
    Compiles go through ``cache`` (default: none, every program is compiled). With ``per_layer`` the row also
    says what one more layer adds to each figure (``sweeps.preflight.layer_loop``), for re-pricing other depths.
    """
    cache = cache or compile_cache.CompileCache(None)
    row = _check_one(name, config, topology, devices, cache, per_layer)
    if remat_search and row["fits"]:
        found = cheapest_remat(config, lambda candidate: _check_one(name, candidate, topology, devices, cache))
        chosen = found["row"] if found else row
        row["remat_suggestion"] = {"remat": found["remat"] if found else config.model.remat,
                                   **{key: chosen[key] for key in ("hbm_bytes_per_device", "estimated_step_seconds",
                                                                   "estimated_mfu", "bound")}}
    return row


def _check_one(name: str, config: TrainConfig, topology: Topology, devices: list,
               cache: compile_cache.CompileCache, per_layer: bool = False) -> dict:
    chip = topology.chip
    row = {"name": name, "topology": topology.name, "chips": len(devices), "status": "FAIL", "fits": False,
           "hbm_bytes_per_device": None, "hbm_capacity_bytes": chip.hbm_bytes, "compiler_peak_bytes": None,
           "argument_bytes": None, "temporary_bytes": None, "flops": None, "hbm_bytes_accessed": None,
           "collective_bytes": None, "estimated_step_seconds": None, "bound": None, "compute_seconds": None,
           "memory_seconds": None, "collective_seconds": None, "exposed_collective_seconds": None,
           "estimated_mfu": None, "mfu_upper_bound": None, "loops_counted": None, "loops_uncounted": None,
           "kernels_analytic": None, "kernels_uncounted": None, "collectives": None, "compile_seconds": None,
           "compile_cached": False, "remat": config.model.remat, "attention_impl": config.model.attention_impl,
           "remat_suggestion": None, **estimate_range.EMPTY_FIELDS, "method": "compiled", "method_note": None,
           "per_layer": None,
           "parameters": None,
           "tokens_per_step": config.batch_size * config.data.seq_len,
           "params_non_embedding": budget.non_embedding_params(config.model.depth, config.model.width),
           "suggestion": None, "error": None}
    try:
        mesh = mesh_lib.make_mesh(config.mesh, devices)
        hosts = len({device.process_index for device in devices})
        mesh_lib.check_batch(mesh, config.batch_size, process_count=hosts)
        program, lowered = run_program.lower_train_step(config, mesh, arguments=program_arguments(config))
        program = program.solo
    except Exception as error:  # noqa: BLE001 - e.g. a mesh or batch the slice cannot take: a FAIL row
        row["error"] = one_line(error)
        return row
    batch = program_lib.batch_spec(config, mesh)
    row["parameters"] = parameter_count(program)
    state_per_chip = _shard_bytes(program.abstract_state) + _shard_bytes(batch)
    state_total = _full_bytes(program.abstract_state) + _full_bytes(batch)

    started, hits = time.perf_counter(), cache.hits
    try:
        compiled = cache.compile(lowered, topology.name, is_out_of_memory)
    except Exception as error:  # noqa: BLE001 - a run that cannot compile is a FAIL row, not a crash
        row["compile_seconds"] = round(time.perf_counter() - started, 2)
        row["compile_cached"] = cache.hits > hits
        text = str(error).strip()
        row["error"] = one_line(error)
        if is_out_of_memory(error):
            temporaries, used = _bytes_in(text, r"temporaries"), _bytes_in(text, r"Used")
            row.update(argument_bytes=state_per_chip, temporary_bytes=temporaries,
                       hbm_bytes_per_device=used or (state_per_chip + temporaries if temporaries else None),
                       suggestion=suggest(config, mesh, Footprint(state_per_chip, state_total, temporaries),
                                          chip.hbm_bytes))
        return row
    row["compile_seconds"] = round(time.perf_counter() - started, 2)
    row["compile_cached"] = cache.hits > hits

    row.update(memory_fields(compiled, chip))
    if not row["fits"]:
        footprint = Footprint(row["argument_bytes"], state_total, row["temporary_bytes"])
        row["suggestion"] = suggest(config, mesh, footprint, chip.hbm_bytes)

    hlo_text = compiled.as_text()
    row.update(cost_fields(config, hlo_text, topology, list(mesh.devices.flat)))
    if per_layer and row.get("estimated_step_seconds") is not None:
        row["per_layer"] = layer_loop.per_layer(config, hlo_text, lambda priced, text: cost_fields(
            priced, text, topology, list(mesh.devices.flat)))
    return row


def memory_fields(compiled, chip: Accelerator) -> dict:
    """A row's memory fields from a compiled step's ``memory_analysis()``: bytes one chip holds while the step
    runs (arguments + outputs - aliased + temporaries), its parts, and whether it ``fits`` (``FIT_FRACTION``)."""
    stats = compiled.memory_analysis()
    planned = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
               + stats.temp_size_in_bytes)
    fits = planned <= FIT_FRACTION * chip.hbm_bytes
    return {"hbm_bytes_per_device": int(planned), "argument_bytes": int(stats.argument_size_in_bytes),
            "temporary_bytes": int(stats.temp_size_in_bytes), "fits": fits, "status": "PASS" if fits else "FAIL",
            "compiler_peak_bytes": int(getattr(stats, "peak_memory_in_bytes", 0)) or None}


def cost_fields(config: TrainConfig, hlo_text: str, topology: Topology, mesh_devices: list) -> dict:
    """A row's cost fields (the roofline's, then the two estimates and their range) for one compiled step.

    A failing estimate is no exception: its fields stay out and ``error`` says why (the fit verdict stands).
    """
    chip, chips = topology.chip, len(mesh_devices)
    try:
        estimate = roofline.step_estimate(hlo_text, chip, mesh_devices, kernels.kernel_cost(config.model))
    except Exception as error:  # noqa: BLE001 - the cost estimate is a bonus; the fit verdict stands
        return {"error": f"cost estimate unavailable: {one_line(error)}"}
    fields = estimate_fields(config, estimate, chips, chip)
    try:
        fields.update(estimate_range.row_fields(config, hlo_text, topology.generation, mesh_devices,
                                                kernels.kernel_cost(config.model), chips))
    except Exception as error:  # noqa: BLE001 - like the roofline above, a bonus: the fit verdict stands
        fields["error"] = f"estimate range unavailable: {one_line(error)}"
    return fields


def step_estimate(config: TrainConfig, mesh, compiled, chip: Accelerator) -> roofline.StepEstimate:
    """The roofline of one compiled train step on ``mesh`` (attention kernels priced by ``kernels``)."""
    return roofline.step_estimate(compiled.as_text(), chip, mesh.devices.flat, kernels.kernel_cost(config.model))


def estimate_fields(config: TrainConfig, estimate: roofline.StepEstimate, chips: int, chip: Accelerator) -> dict:
    """A row's cost fields from a ``StepEstimate``: None wherever a loop or kernel went uncounted."""
    tokens = config.batch_size * config.data.seq_len

    def mfu(seconds):
        if not seconds:
            return None
        return model_flops_utilization(config.model, config.data.seq_len, tokens / seconds, chip.bf16_flops, chips)

    return {"flops": estimate.flops, "hbm_bytes_accessed": estimate.hbm_bytes,
            "collective_bytes": estimate.collective_bytes, "estimated_step_seconds": estimate.step_seconds,
            "bound": estimate.bound, "compute_seconds": estimate.compute_seconds,
            "memory_seconds": estimate.memory_seconds, "collective_seconds": estimate.collective_seconds,
            "exposed_collective_seconds": estimate.exposed_collective_seconds,
            "estimated_mfu": mfu(estimate.step_seconds),
            "mfu_upper_bound": mfu(estimate.flops / chip.bf16_flops if estimate.flops else None),
            "loops_counted": estimate.loops_counted, "loops_uncounted": estimate.loops_uncounted,
            "kernels_analytic": {name: calls for name, (calls, _) in estimate.kernels.items()},
            "kernel_cost_sources": {name: kernels.cost_source(name) for name in estimate.kernels},
            "kernels_uncounted": estimate.kernels_uncounted,
            "collectives": {kind: {"count": c, "buffer_bytes": b, "bytes_sent": s, "seconds": t}
                            for kind, (c, b, s, t) in estimate.collectives.items()}}


# ---------------------------------------------------------------------------
# Many runs, and the command line


def compile_programs(first: dict, topology: Topology, where: str, jobs: int, options: tuple, progress) -> dict:
    """``check_run`` of each program (key -> (name, config)), in ``jobs`` processes when there are several."""
    if jobs > 1 and len(first) > 1:
        return _check_in_processes(first, topology.name, jobs, options, progress, where)
    remat_search, cache_directory, per_layer = options
    devices = topology_devices(topology)
    cache = compile_cache.CompileCache(cache_directory)
    done = {}
    for key, (name, config) in first.items():
        if progress is not None:
            progress(f"compiling {name} for {where} ...")
        done[key] = check_run(name, config, topology, devices, remat_search, cache, per_layer)
    return done


_WORKER_DEVICES: dict = {}


def _check_in_worker(name: str, config: TrainConfig, topology_name: str, options: tuple) -> dict:
    # One compile in a worker process; its compile-only devices are made once per process.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    remat_search, cache_directory, per_layer = options
    topology = parse_topology(topology_name)
    if topology_name not in _WORKER_DEVICES:
        _WORKER_DEVICES[topology_name] = topology_devices(topology)
    return check_run(name, config, topology, _WORKER_DEVICES[topology_name], remat_search,
                     compile_cache.CompileCache(cache_directory), per_layer)


def _check_in_processes(programs: dict, topology_name: str, jobs: int, options: tuple, progress,
                        where: str) -> dict:
    """``check_run`` of each distinct program in ``jobs`` spawned processes (each compile is mostly one thread)."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # JAX's threads do not survive fork
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(_check_in_worker, name, config, topology_name, options): key
                   for key, (name, config) in programs.items()}
        if progress is not None:
            progress(f"compiling {len(futures)} programs for {where} in {jobs} processes ...")
        done = {}
        for future in concurrent.futures.as_completed(futures):
            done[futures[future]] = row = future.result()
            if progress is not None:
                cached = ", from the compile cache" if row["compile_cached"] else ""
                progress(f"  {row['name']}: {row['status']} ({row['compile_seconds']} s{cached})")
    return done


def default_jobs() -> int:
    """Compile processes the machine can take: one per two cores' worth of memory (4 GiB each), at most 4."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 * GIB
    return max(1, min(4, os.cpu_count() or 1, int(memory // (4 * GIB))))


Deal = Callable[[list, int, int], list]  # (runs, index, count) -> the runs host ``index`` of ``count`` trains


def sweep_summary(rows: list[dict], runs, topology_name: str, pod_wide: bool = False,
                  deal: Deal | None = None) -> dict:
    """Chip-hours and wall time (``roofline.sweep_time``) of the ``runs`` (``RunSpec``s, one per row) that fit.

    In host-parallel mode ``deal`` is how the launcher shares the runs out to
    the slice's hosts (``sweeps.spec.shard``); it is required there. Runs that
    fit but whose step time is unknown (a loop or kernel the roofline could
    not count) make the hours unknown (None): they are counted in
    ``runs_unknown`` and their loops in ``loops_uncounted``.
    """
    slice_topology = parse_topology(topology_name)
    topology = checked_topology(slice_topology, pod_wide)
    parallel = 1 if topology == slice_topology else slice_topology.hosts
    if parallel > 1 and deal is None:
        raise ValueError(f"host-parallel on {slice_topology.name}: sweep_summary needs deal, how runs go to hosts")
    shares = [deal(list(runs), index, parallel) for index in range(parallel)] if parallel > 1 else None
    step_seconds = {run.run_id: row["estimated_step_seconds"] for run, row in zip(runs, rows) if row["fits"]}
    mode = "host-parallel" if parallel > 1 else ("pod-wide" if slice_topology.hosts > 1 else "single host")
    distinct = [row for row in rows if not row.get("same_program_as") and row.get("method", "compiled") == "compiled"]
    priced = [row for row in rows if not row.get("same_program_as") and row.get("method", "compiled") != "compiled"]
    errors = [row["interpolation_error"] for row in priced if row.get("interpolation_error") is not None]
    unknown = sum(1 for row in rows if row["fits"] and row.get("estimated_step_seconds") is None)
    hours = roofline.sweep_time(step_seconds, runs, topology.chips, shares)
    if unknown:
        hours.update(chip_hours=None, wall_hours=None)
    return {"topology": slice_topology.name, "checked_topology": topology.name, "mode": mode,
            "runs": len(rows), "runs_failing": sum(not row["fits"] for row in rows), "runs_unknown": unknown,
            "loops_counted": sum(row.get("loops_counted") or 0 for row in distinct),
            "loops_uncounted": sum(row.get("loops_uncounted") or 0 for row in distinct),
            "programs_compiled": sum(not row.get("compile_cached") for row in distinct),
            "programs_from_cache": sum(bool(row.get("compile_cached")) for row in distinct),
            "programs_repriced": sum(row["method"] == "re-priced" for row in priced),
            "programs_interpolated": sum(row["method"] == "interpolated" for row in priced),
            "largest_interpolation_error": max(errors) if errors else None,
            "median_estimated_mfu": _median([row.get("estimated_mfu") for row in rows if row["fits"]]), **hours,
            **estimate_range.summary_fields(rows, runs, topology.chips, shares)}


def _median(values: list):
    known = sorted(value for value in values if value is not None)
    if not known or len(known) < len(values):
        return None
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2
