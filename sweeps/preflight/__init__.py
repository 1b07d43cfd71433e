"""The TPU cost model: compile a sweep's runs ahead of time for a TPU slice and say whether they fit and how fast.

Its public names, for the launcher (``python -m sweeps.launch preflight``),
benchmarks and tests; everything else is the modules' own:

- ``topology``: the slices (``parse_topology``, ``checked_topology``,
  ``topology_devices``: compile-only devices from libtpu, ``libtpu_installed``);
- ``report``: one row per run (``check_run``, ``check_runs``), the sweep's
  hours (``sweep_summary``), the command (``main``);
- ``table``: the rows as text (``format_table``);
- ``roofline``: step time from compiled HLO (``step_estimate``,
  ``collective_traffic``), over ``hlo`` (parse), ``hlo_ops`` (one op),
  ``collectives`` (one collective), ``hlo_cost`` (a whole program) and
  ``kernels`` (Pallas kernels, analytically);
- ``quick``: which programs a preflight compiles (``--mode quick|depths|full``) and how
  the others are priced from them; ``layer_loop``: a compiled program at another depth;
- ``parallelism``: the modes of training a run on the slice (data, fsdp, packed) compiled and priced by
  both estimates, the cheapest that fits (``compare_modes``, ``choose_mode``), and the mesh the launcher
  trains a run with when its sweep says ``parallelism="auto"`` (``planned_mesh``);
- ``advice``: how to make a run fit (``suggest``, ``cheapest_remat``);
- ``compile_cache``: the compiler's answers kept on disk.

It depends on ``scaling`` (the program, the mesh, ``scaling.hardware``'s
chips) and on nothing of the launcher: what it needs from there (the runs,
how they are dealt to hosts) is handed to it.
"""

from sweeps.preflight.advice import FIT_FRACTION, cheapest_remat, suggest
from sweeps.preflight.parallelism import choose as choose_mode, compare as compare_modes, planned_mesh
from sweeps.preflight.report import (check_run, check_runs, default_jobs, estimate_fields, main, parameter_count,
                                     program_arguments, program_key, step_estimate, sweep_summary)
from sweeps.preflight.roofline import collective_traffic
from sweeps.preflight.table import format_table
from sweeps.preflight.topology import (CHIPS, Topology, checked_topology, libtpu_installed, parse_topology,
                                       topology_devices)

__all__ = ["CHIPS", "FIT_FRACTION", "Topology", "check_run", "check_runs", "checked_topology", "cheapest_remat",
           "choose_mode", "collective_traffic", "compare_modes", "default_jobs", "estimate_fields", "format_table",
           "libtpu_installed", "main", "parameter_count", "parse_topology", "planned_mesh", "program_arguments",
           "program_key", "step_estimate", "suggest", "sweep_summary", "topology_devices"]
