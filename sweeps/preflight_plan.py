"""What the preflight kept, applied to the runs ``run`` trains: each record's estimate, each run's mesh.

- ``kept_estimates``: where they are read from: the sweep's ``preflight.json`` in the work
  directory (every host reads the same), else this machine's cache (``sweeps.preflight.estimate_store``);
- ``preflight_estimates``: the record fields of each run's newest kept estimate, beside the trainer's
  measured ``mfu``;
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


def kept_estimates(workdir, sweep_name: str):
    """The preflight's kept estimates and choices for the sweep (``estimate_store.load``): its file in the work
    directory, where every host reads the same, else this machine's preflight cache."""
    from sweeps.preflight import compile_cache, estimate_store

    return estimate_store.load(workdir, sweep_name, compile_cache.default_directory(None))


def preflight_estimates(kept, modes: dict | None = None):
    """``estimate_of(run)``: ``train.run``'s ``estimate`` argument (the record fields of the newest preflight
    estimate of ``run`` in ``kept``, an ``estimate_store.Kept``; those of its parallelism mode where ``modes``,
    run id -> mode, has one: ``planned_runs``), or no argument where there is none."""
    from sweeps.preflight import estimate_store

    modes = modes or {}

    def estimate_of(run) -> dict:
        fields = estimate_store.record_fields(kept.latest(run.run_id), modes.get(run.run_id))
        return {"estimate": fields} if fields else {}

    return estimate_of


def planned_runs(sweep: Sweep, specs: list[RunSpec], kept) -> tuple[list[RunSpec], dict[str, str], dict[str, int]]:
    """``specs`` with the meshes the preflight chose (``sweep.parallelism == "auto"``; ``kept``, an
    ``estimate_store.Kept``), run id -> mode of those it changed, and run id -> pack size of those it packs (one
    run per chip: ``packing.plan_packs``'s ``size_of``); unchanged for a pinned sweep or a run without a kept
    choice. The mesh is no part of the run id. Pod-wide (several processes) packs are not trained, so there the
    cheapest solo mode is taken."""
    if sweep.parallelism != "auto":
        return specs, {}, {}
    import jax

    from sweeps.preflight import planned_mesh

    planned, modes, sizes = [], {}, {}
    for spec in specs:
        plan = planned_mesh(spec.config, kept.latest(spec.run_id), solo=jax.process_count() > 1)
        if plan is not None:
            spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, mesh=plan[0]))
            modes[spec.run_id] = plan[2]
            if plan[1] > 1:
                sizes[spec.run_id] = plan[1]
        planned.append(spec)
    if jax.process_count() > 1:  # hosts that read different estimates would build different meshes and hang
        from scaling import multihost

        if not multihost.all_agree(zlib.crc32(json.dumps(sorted(modes.items())).encode()) & 0x7FFFFFFF):
            raise PlanError("the processes read different preflight estimates (parallelism=\"auto\"); keep them "
                            "with the sweep (preflight --workdir WORKDIR), where every host reads the same file")
    return planned, modes, sizes
