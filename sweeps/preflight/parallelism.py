"""Parallelism per run: which way of spreading a run over its slice's chips costs least, by both estimates.

A run can use the chips the preflight checks it on (``topology.checked_topology``) in three ways (``MODES``):

- ``data``: alone on every chip, parameters and optimizer state replicated, the batch split
  (``MeshConfig(data=-1, fsdp=1)``): one gradient all-reduce per step;
- ``fsdp``: alone on every chip with parameters and optimizer state sharded too (``MeshConfig(data=1,
  fsdp=-1)``): each layer's weights gathered and its gradients scattered, every step;
- ``packed``: one run per group of chips (one chip by default), as many runs of the same shape as there are
  groups trained as one program (``scaling.model.packed``, its run axis over the groups, each group data-parallel
  within): no collective between the runs.

Each mode's train step is compiled ahead of time for the slice (the packed one by
``scaling.model.run_program.lower_train_step``) and priced as any preflight row is (``report.cost_fields``): by the
corrected roofline and by the compiler's own cycle estimate. Modes compare in chip-time: a solo mode holds every
chip for one run's step, a pack holds them for ``pack_size`` runs' steps, so a run's cost per step is the step's
seconds divided by the runs it trains (``run_roofline_seconds``, ``run_compiler_seconds``): seconds per step as
if the run had all the chips to itself. A pack's MFU fields count all its runs' model FLOPs (it is priced as one
run of pack_size·B sequences per step, which has exactly those FLOPs).

``choose`` takes the mode that fits (memory as the preflight checks it, ``FIT_FRACTION``) whose per-run cost is
least by its slower estimate (the roofline alone where the compiler gave none): a mode is judged by the
pessimistic end of its range. A mode that does not fit, or could not be compiled or priced, is never chosen.

The choice goes into the preflight's row (``parallelism``), the estimate kept for the run
(``sweeps.preflight.estimate_store``) and, through ``planned_mesh``, the mesh the launcher trains the run with
when its sweep says ``parallelism="auto"`` (the mesh is a presentation field: run ids do not change).
"""

from __future__ import annotations

import dataclasses

from scaling.config import MeshConfig, TrainConfig
from scaling.model import mesh as mesh_lib, run_program
from scaling.store.rundir import one_line
from sweeps.preflight import compile_cache, report
from sweeps.preflight.topology import Topology, topology_devices

MODES = ("data", "fsdp", "packed")  # on a tie in cost, the earlier is chosen


@dataclasses.dataclass(frozen=True)
class Mode:
    """One way to train a run on a slice: the run's mesh axes (a pack's: each group's) and the runs per program."""

    name: str  # one of MODES
    data: int  # mesh.data of the run (-1: the rest of its chips)
    fsdp: int  # mesh.fsdp of the run
    pack_size: int = 1  # runs trained as one program (the slice's groups of chips); 1 for data and fsdp

    def __post_init__(self):
        if self.name not in MODES:
            raise ValueError(f"name={self.name!r} is invalid: allowed one of {', '.join(MODES)}")
        for field in ("data", "fsdp"):
            value = getattr(self, field)
            if not (isinstance(value, int) and (value == -1 or value >= 1)):
                raise ValueError(f"{field}={value!r} is invalid: allowed -1 or an integer >= 1")
        allowed = range(2, 1 << 20) if self.name == "packed" else (1,)
        if self.pack_size not in allowed:
            raise ValueError(f"pack_size={self.pack_size!r} is invalid: allowed "
                             + ("an integer >= 2 for packed" if self.name == "packed" else f"1 for {self.name}"))

    def mesh(self, base: MeshConfig) -> MeshConfig:
        """``base`` (its sharding rules kept) with this mode's axes and no tensor parallelism."""
        return dataclasses.replace(base, data=self.data, fsdp=self.fsdp, tensor=1)


def modes(chips: int, group_chips: tuple[int, ...] = (1,)) -> list[Mode]:
    """The modes compared on ``chips`` chips: data, fsdp, and a pack of one run per group of each of
    ``group_chips`` chips (those that divide ``chips`` into at least two groups)."""
    if chips < 1:
        raise ValueError(f"chips={chips!r} is invalid: allowed an integer >= 1")
    found = [Mode("data", -1, 1), Mode("fsdp", 1, -1)]
    found += [Mode("packed", -1, 1, chips // group) for group in group_chips
              if chips % group == 0 and chips // group > 1]
    return found


# ---------------------------------------------------------------------------
# Compiling and pricing each mode


def compare(name: str, config: TrainConfig, topology: Topology, devices: list,
            cache: compile_cache.CompileCache | None = None, base_row: dict | None = None,
            group_chips: tuple[int, ...] = (1,)) -> dict:
    """Every mode of ``config`` on the slice compiled and priced: ``{"choice": the chosen mode's name or None,
    "modes": [one dict per mode]}`` (keys in ``summary``; seconds per step). ``base_row``, the preflight's row of
    ``config`` as it is, stands for the solo mode whose mesh it already has (no second compile)."""
    cache = cache or compile_cache.CompileCache(None)
    rows = []
    for mode in modes(len(devices), group_chips):
        if mode.name == "packed":
            row = _packed_row(config, mode, topology, devices, cache)
        elif base_row is not None and _same_mesh(config.mesh, mode.mesh(config.mesh), len(devices)):
            row = base_row
        else:
            row = report.check_run(name, dataclasses.replace(config, mesh=mode.mesh(config.mesh)), topology, devices,
                                   cache=cache, per_layer=False)
        rows.append(summary(mode, row, len(devices)))
    chosen = choose(rows)
    return {"choice": chosen["mode"] if chosen else None, "modes": rows}


def _same_mesh(a: MeshConfig, b: MeshConfig, chips: int) -> bool:
    try:
        return a.rules == b.rules and mesh_lib.mesh_shape(a, chips) == mesh_lib.mesh_shape(b, chips)
    except ValueError:
        return False


def _packed_row(config: TrainConfig, mode: Mode, topology: Topology, devices: list,
                cache: compile_cache.CompileCache) -> dict:
    """Memory and cost fields of a pack of ``mode.pack_size`` runs of ``config``'s shape, one per group of chips."""
    try:
        mesh = mesh_lib.make_packed_mesh(mode.mesh(config.mesh), runs=mode.pack_size, devices=devices)
        _, lowered = run_program.lower_train_step(config, mesh, size=mode.pack_size,
                                                  arguments=report.program_arguments(config))
        compiled = cache.compile(lowered, topology.name, report.is_out_of_memory)
    except Exception as error:  # noqa: BLE001 - a mode the slice cannot take (out of memory included) is no choice
        return {"fits": False, "error": one_line(error)}
    row = report.memory_fields(compiled, topology.chip)
    # The pack does its runs' model FLOPs each step: priced as one run of pack_size·B sequences, which has exactly
    # those FLOPs, so its MFU fields are the pack's (the same as each run's share of the chip-time).
    as_one_run = dataclasses.replace(config, batch_size=mode.pack_size * config.batch_size)
    row.update(report.cost_fields(as_one_run, compiled.as_text(), topology, list(mesh.devices.flat)))
    return row


def summary(mode: Mode, row: dict, chips: int) -> dict:
    """One mode's figures from its preflight ``row``: its mesh, whether it fits, the compiled FLOPs per chip, the
    step of the program it trains (``estimated_step_seconds``: the plain roofline; ``roofline_step_seconds``:
    corrected; ``compiler_step_seconds``) and the per-run cost of a step by each estimate (those over
    ``pack_size``)."""
    per_run = lambda seconds: None if seconds is None else seconds / mode.pack_size  # noqa: E731
    roofline, compiler = row.get("roofline_corrected_step_seconds"), row.get("compiler_step_seconds")
    return {"mode": mode.name, "mesh": {"data": mode.data, "fsdp": mode.fsdp, "tensor": 1},
            "pack_size": mode.pack_size, "chips": chips, "fits": bool(row.get("fits")),
            "hbm_bytes_per_device": row.get("hbm_bytes_per_device"), "flops": row.get("flops"),
            "estimated_step_seconds": row.get("estimated_step_seconds"), "estimated_mfu": row.get("estimated_mfu"),
            "roofline_step_seconds": roofline, "compiler_step_seconds": compiler,
            "run_roofline_seconds": per_run(roofline), "run_compiler_seconds": per_run(compiler),
            "error": row.get("error")}


# ---------------------------------------------------------------------------
# The choice, and what the launcher makes of it


def run_cost(mode_row: dict) -> float | None:
    """A mode's per-run seconds per step by its slower estimate (the roofline's where the compiler gave none);
    None where the roofline gave none."""
    roofline, compiler = mode_row.get("run_roofline_seconds"), mode_row.get("run_compiler_seconds")
    if roofline is None:
        return None
    return roofline if compiler is None else max(roofline, compiler)


def choose(mode_rows: list[dict]) -> dict | None:
    """The mode that fits with the least ``run_cost`` (the earlier of ``MODES`` on a tie); None if none fits."""
    eligible = [row for row in mode_rows if row.get("fits") and run_cost(row) is not None]
    if not eligible:
        return None
    return min(eligible, key=lambda row: (run_cost(row), MODES.index(row["mode"])))


def planned_mesh(config: TrainConfig, entry: dict | None, solo: bool = False) -> tuple[MeshConfig, int, str] | None:
    """``(mesh, pack_size, mode)`` the preflight chose for the run of ``config`` (its kept estimate ``entry``,
    ``estimate_store.latest``), or None where it chose nothing (no entry, or no mode compared or fitting).

    ``mesh`` is ``config.mesh`` (its rules kept) with the mode's axes, for a pack each group's; ``pack_size`` the
    runs to train as one program (1 for a solo mode). ``solo=True`` chooses among the solo modes only, for a
    launcher that trains one run at a time.
    """
    compared = (entry or {}).get("parallelism") or {}
    candidates = [row for row in compared.get("modes") or () if isinstance(row, dict) and row.get("mode") in MODES
                  and not (solo and row["mode"] == "packed")]
    chosen = choose(candidates)
    if chosen is None:
        return None
    mode = Mode(chosen["mode"], chosen["mesh"]["data"], chosen["mesh"]["fsdp"], chosen.get("pack_size", 1))
    return mode.mesh(config.mesh), mode.pack_size, mode.name


def add_choices(rows: dict, programs: list, topology: Topology, cache_directory: str | None, progress=None) -> None:
    """Give each compiled row of ``rows`` (program key -> row, ``report.check_runs``) its ``parallelism``
    (``compare``); ``programs`` are the ``quick.Program``s behind the keys. Rows priced from other programs
    (re-priced, interpolated) get none: their modes were not compiled."""
    devices, cache = None, compile_cache.CompileCache(cache_directory)
    for program in programs:
        row = rows.get(program.key)
        if row is None or row.get("method", "compiled") != "compiled" or row.get("same_program_as"):
            continue
        if devices is None:
            devices = topology_devices(topology)
        if progress is not None:
            progress(f"comparing parallelism modes of {program.name} on {topology.name} ...")
        row["parallelism"] = compare(program.name, program.config, topology, devices, cache, base_row=row)
