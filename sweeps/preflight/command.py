"""The preflight's command: check a sweep's runs for a TPU slice, price the sweep, keep the estimates.

``check_runs`` compiles (or re-prices) each distinct program once (``report``), with the modes of training
compared when asked (``parallelism``, which builds on ``report``: it is called from here, so neither imports
the other back); ``main`` is what ``python -m sweeps.launch preflight`` runs, with its ``options.Options``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax

from scaling.config import TrainConfig
from sweeps.preflight import compile_cache, estimate_store, parallelism as parallelism_lib, prices, quick, report
from sweeps.preflight.options import Options
from sweeps.preflight.report import Deal, sweep_summary
from sweeps.preflight.table import format_table
from sweeps.preflight.topology import checked_topology, libtpu_installed, parse_topology


def check_runs(runs, topology_name: str, progress=None, pod_wide: bool = False, jobs: int = 1,
               remat_search: bool = False, cache_directory: str | None = None, mode: str = "full",
               parallelism: bool = False) -> list[dict]:
    """Preflight ``runs`` (pairs of name and TrainConfig) for the slice ``topology_name``; one row per run.

    Each run is compiled for the mesh it will train on (``checked_topology``);
    runs of one program (differing in seed or learning rate, say) are compiled once and share the row. With
    ``jobs`` > 1 the distinct programs are compiled in that many processes. With
    ``cache_directory``, programs compiled there before are not compiled again (``sweeps.preflight.compile_cache``).
    ``mode`` (``sweeps.preflight.quick.MODES``) says which programs are compiled: all (``full``), one per width
    (``depths``) or the fit check and anchor widths (``quick``); the others are re-priced or interpolated
    from them, and each row's ``method`` says which. With ``parallelism`` each compiled row also gets the modes
    of training the run compared and the cheapest chosen (``sweeps.preflight.parallelism``).
    """
    if not os.environ.get("JAX_PLATFORMS"):
        # Host-side work needs only the CPU; never claim (or wait for) a local TPU.
        jax.config.update("jax_platforms", "cpu")
    slice_topology = parse_topology(topology_name)
    topology = checked_topology(slice_topology, pod_wide)
    where = f"{topology.name} ({topology.chips} chips" + (
        f", one host of {slice_topology.name})" if topology != slice_topology else ")")
    first: dict[tuple, tuple[str, TrainConfig]] = {}
    for name, config in runs:
        first.setdefault(report.program_key(config), (name, config))
    programs = [quick.Program(key, name, config) for key, (name, config) in first.items()]
    compile_now = quick.to_compile(programs, mode)
    done: dict[tuple, dict] = {}
    while compile_now:
        batch = {program.key: (program.name, program.config) for program in compile_now}
        options = (remat_search, cache_directory, mode != "full")  # --full re-prices nothing
        done.update(report.compile_programs(batch, topology, where, jobs, options, progress))
        done, compile_now = quick.complete(programs, done, topology.chips, topology.chip)
    if parallelism:
        parallelism_lib.add_choices(done, programs, topology, cache_directory, progress)
    rows = []
    for name, config in runs:
        row = done[report.program_key(config)]
        rows.append(row if row["name"] == name else dict(row, name=name, same_program_as=row["name"]))
    return rows


def main(options: Options, runs, deal: Deal | None = None) -> int:
    """Entry point behind ``python -m sweeps.launch preflight``: 0 if every run passes, 1 if any fails, 2 on bad input.

    ``options``: the preflight's (``options.Options``; with ``json`` it prints ``{"runs": [rows], "summary":
    {...}}`` instead of the table).
    ``runs`` are the runs to check (the launcher's ``RunSpec``s, after ``--only``:
    ``name``, ``run_id``, ``config``); ``deal`` as for ``sweep_summary``.
    """
    try:  # a bad topology is reported first: it is wrong whatever is installed
        topology = parse_topology(options.topology)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not libtpu_installed():
        print('error: the preflight needs the TPU compiler (libtpu); install it with: pip install -e ".[tpu]"',
              file=sys.stderr)
        return 2
    try:  # a bad --prices file too, before any compile
        price_table = prices.load_prices(options.prices)
    except prices.PriceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    pod_wide, jobs, mode = options.pod_wide, options.jobs or 1, options.mode
    started = time.perf_counter()
    cache_directory = compile_cache.default_directory(options.compile_cache)
    rows = check_runs([(run.name, run.config) for run in runs], topology.name, pod_wide=pod_wide, jobs=jobs,
                      remat_search=options.remat_search, cache_directory=cache_directory,
                      progress=lambda text: print(text, file=sys.stderr, flush=True), mode=mode,
                      parallelism=options.parallelism)
    summary = sweep_summary(rows, runs, topology.name, pod_wide, deal)
    summary["preflight_mode"] = mode
    summary["preflight_seconds"] = round(time.perf_counter() - started, 1)
    summary["jobs"] = jobs
    summary["estimates_file"] = options.sweep_estimates  # with the sweep: every host reads it
    summary["estimates_kept"] = estimate_store.save(cache_directory, runs, rows, topology.name,
                                                    sweep_file=summary["estimates_file"])
    # Priced over the range of the two estimates (the corrected roofline and the compiler's own); where the
    # compiler gave no estimate, at the roofline's chip-hours only.
    low, high = summary.get("chip_hours_low"), summary.get("chip_hours_high")
    hours = summary["chip_hours"] if low is None else (low, low if high is None else high)
    summary["cost"] = prices.cost(price_table, topology.generation, hours)
    summary["price_line"] = prices.cost_line(summary["cost"], topology.generation, price_table)
    if options.json:
        print(json.dumps({"runs": rows, "summary": summary}, indent=2))
    else:
        print(format_table(rows, summary) + (f"\nestimates and choices kept with the sweep: {summary['estimates_file']}"
                                             if summary["estimates_file"] else ""))
    return 0 if all(row["status"] == "PASS" for row in rows) else 1
