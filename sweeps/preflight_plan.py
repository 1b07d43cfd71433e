"""What the preflight kept, applied to the runs ``run`` trains: each record's estimate, each run's mesh.

- ``preflight_estimates``: the record fields of each run's newest kept estimate
  (``sweeps.preflight.estimate_store``), beside the trainer's measured ``mfu``;
- ``planned_runs``: in a sweep with ``parallelism="auto"``, each run on the mode
  ``preflight --parallelism`` chose for it (a mesh, or a pack of one run per chip).
"""

from __future__ import annotations

import dataclasses
import json
import zlib

from sweeps.spec import RunSpec, Sweep


class PlanError(ValueError):
    """The processes of one job read different plans (``planned_runs``)."""


def preflight_estimates(modes: dict | None = None):
    """``estimate_of(run)``: ``train.run``'s ``estimate`` argument (the record fields of the newest preflight
    estimate kept for ``run``, ``sweeps.preflight.estimate_store``; those of its parallelism mode where ``modes``,
    run id -> mode, has one: ``planned_runs``), or no argument where there is none."""
    from sweeps.preflight import compile_cache, estimate_store

    directory, modes = compile_cache.default_directory(None), modes or {}

    def estimate_of(run) -> dict:
        fields = estimate_store.record_fields(estimate_store.latest(directory, run.run_id), modes.get(run.run_id))
        return {"estimate": fields} if fields else {}

    return estimate_of


def planned_runs(sweep: Sweep, specs: list[RunSpec]) -> tuple[list[RunSpec], dict[str, str], dict[str, int]]:
    """``specs`` with the meshes the preflight chose (``sweep.parallelism == "auto"``), run id -> mode of those
    it changed, and run id -> pack size of those it packs (one run per chip: ``packing.plan_packs``'s
    ``size_of``); unchanged for a pinned sweep or a run without a kept choice. The mesh is no part of the run
    id. Pod-wide (several processes) packs are not trained, so there the cheapest solo mode is taken."""
    if sweep.parallelism != "auto":
        return specs, {}, {}
    import jax

    from sweeps.preflight import compile_cache, estimate_store, planned_mesh

    directory, planned, modes, sizes = compile_cache.default_directory(None), [], {}, {}
    for spec in specs:
        plan = planned_mesh(spec.config, estimate_store.latest(directory, spec.run_id),
                            solo=jax.process_count() > 1)
        if plan is not None:
            spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, mesh=plan[0]))
            modes[spec.run_id] = plan[2]
            if plan[1] > 1:
                sizes[spec.run_id] = plan[1]
        planned.append(spec)
    if jax.process_count() > 1:  # hosts that read different estimates would build different meshes and hang
        from scaling import multihost

        if not multihost.all_agree(zlib.crc32(json.dumps(sorted(modes.items())).encode()) & 0x7FFFFFFF):
            raise PlanError("the processes read different preflight estimates (parallelism=\"auto\"); point "
                                "$SCALING_PREFLIGHT_CACHE at one copy of the estimates on every host")
    return planned, modes, sizes
