"""The TPU cost model: compile a sweep's runs ahead of time for a TPU slice and say whether they fit and how fast.

Its public names, for the launcher (``python -m sweeps.launch preflight``),
benchmarks and tests; everything else is the modules' own:

- ``topology``: the slices (``parse_topology``, ``checked_topology``,
  ``topology_devices``: compile-only devices from libtpu, ``libtpu_installed``);
- ``report``: one row per run (``check_run``), the sweep's hours (``sweep_summary``);
- ``command``: the runs checked together (``check_runs``) and the command (``main``), with its
  options (``options``: ``Options``, the flags it adds to the launcher's ``preflight``);
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
- ``compile_cache``: the compiler's answers kept on disk;
- ``calibration``: the preflight's estimate of each run against what it measured (``status``).

It depends on ``scaling`` (the program, the mesh, ``scaling.hardware``'s
chips) and on nothing of the launcher: what it needs from there (the runs,
how they are dealt to hosts) is handed to it.
"""

import importlib

# Public name -> (module, its name there). Loaded on first use (PEP 562), so that importing one module of the
# package (the launcher's parser imports ``options``) starts no JAX.
_PUBLIC = {
    "FIT_FRACTION": ("advice", "FIT_FRACTION"), "cheapest_remat": ("advice", "cheapest_remat"),
    "suggest": ("advice", "suggest"),
    "choose_mode": ("parallelism", "choose"), "compare_modes": ("parallelism", "compare"),
    "planned_mesh": ("parallelism", "planned_mesh"),
    "check_run": ("report", "check_run"), "default_jobs": ("report", "default_jobs"),
    "estimate_fields": ("report", "estimate_fields"), "parameter_count": ("report", "parameter_count"),
    "program_arguments": ("report", "program_arguments"), "program_key": ("report", "program_key"),
    "step_estimate": ("report", "step_estimate"), "sweep_summary": ("report", "sweep_summary"),
    "check_runs": ("command", "check_runs"), "main": ("command", "main"), "Options": ("options", "Options"),
    "collective_traffic": ("roofline", "collective_traffic"), "format_table": ("table", "format_table"),
    "CHIPS": ("topology", "CHIPS"), "Topology": ("topology", "Topology"),
    "checked_topology": ("topology", "checked_topology"), "libtpu_installed": ("topology", "libtpu_installed"),
    "parse_topology": ("topology", "parse_topology"), "topology_devices": ("topology", "topology_devices"),
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value  # found directly from now on
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC})
