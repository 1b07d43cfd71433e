"""The preflight's per-run estimates, kept so that later commands can use them without compiling again.

The preflight (``python -m sweeps.launch preflight``) writes, for every run whose step time it could
estimate, one small JSON file ``<cache>/estimates/<run_id>.json`` beside its compile cache
(``sweeps.compile_cache.default_directory``: ``--compile-cache DIR``, ``$SCALING_PREFLIGHT_CACHE``, else
``~/.cache/scaling/preflight``; "off" keeps nothing). The file maps each slice the run was checked for
(``v5e:2x4``, ...) to its estimate: seconds per step, MFU, the chips of the mesh it was compiled for, and
when. Run ids are content hashes of the run's config, so an estimate is found for the same run whatever
sweep file or work directory names it, and never for a changed run.

Readers take the newest estimate of a run (``latest``):
- ``dry-run`` prices the runs to train with them instead of a guessed utilisation;
- ``run`` hands each run's to the trainer, which keeps it in the run record
  (``estimated_step_seconds``, ``estimated_mfu``, ``estimate_source``), so ``status`` can set the first
  runs on hardware against what the preflight expected.

Where the preflight compared the modes of training a run (``sweeps.preflight.parallelism``), the estimate keeps
them too (``parallelism``: the choice and each mode's figures); a sweep with ``parallelism="auto"`` trains the
run in the mode chosen (``parallelism.planned_mesh``), and its record then holds that mode's estimate and name.

On another machine (a TPU VM) the estimates are found where the cache is: point ``$SCALING_PREFLIGHT_CACHE``
at a copy of it.
"""

from __future__ import annotations

import datetime
import json
import os

from scaling.storage import write_atomic

SUBDIRECTORY = "estimates"
# Row fields kept per run (sweeps.preflight.check_run's names).
ROW_FIELDS = ("estimated_step_seconds", "estimated_mfu", "bound", "chips", "topology")


def _path(cache_directory: str, run_id: str) -> str:
    return os.path.join(cache_directory, SUBDIRECTORY, f"{run_id}.json")


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):  # absent or damaged: as if never estimated
        return {}
    return data if isinstance(data, dict) else {}


def save(cache_directory: str | None, runs, rows: list[dict], slice_name: str, now: datetime.datetime | None = None
         ) -> int:
    """Keep the estimate of each run (``RunSpec``) from its preflight row for ``slice_name``; returns how many.

    A run that no longer fits, or whose step time is unknown, loses any earlier estimate for that slice.
    Nothing is kept without a cache directory; a disk that refuses the write costs the estimate, never the
    preflight.
    """
    if cache_directory is None:
        return 0
    written = (now or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds")
    kept = 0
    for run, row in zip(runs, rows):
        path = _path(cache_directory, run.run_id)
        entries = _load(path)
        if row.get("fits") and row.get("estimated_step_seconds"):
            entries[slice_name] = {**{key: row.get(key) for key in ROW_FIELDS}, "slice": slice_name,
                                   "written": written,
                                   **({"parallelism": row["parallelism"]} if row.get("parallelism") else {})}
            kept += 1
        elif slice_name in entries:
            del entries[slice_name]
        else:
            continue
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, json.dumps(entries, indent=1, sort_keys=True))
        except OSError:
            pass
    return kept


def latest(cache_directory: str | None, run_id: str) -> dict | None:
    """The newest estimate kept for ``run_id`` (any slice), or None."""
    if cache_directory is None:
        return None
    entries = [entry for entry in _load(_path(cache_directory, run_id)).values()
               if isinstance(entry, dict) and entry.get("estimated_step_seconds")]
    return max(entries, key=lambda entry: entry.get("written", "")) if entries else None


def latest_for(cache_directory: str | None, runs) -> dict:
    """run id -> newest estimate, for the ``runs`` that have one."""
    found = {run.run_id: latest(cache_directory, run.run_id) for run in runs}
    return {run_id: entry for run_id, entry in found.items() if entry}


def device_of(entry: dict) -> str:
    """The TPU generation an estimate was made for: ``v5e`` of ``v5e:2x2``."""
    return str(entry.get("topology") or entry.get("slice") or "").partition(":")[0]


def record_fields(entry: dict | None, mode: str | None = None) -> dict:
    """The run record's estimate fields from a kept estimate ({} without one). With ``mode``, the parallelism
    mode the run trains in (``parallelism.planned_mesh``), they are that mode's: the step of the program it
    trains (a pack's, for all its runs), and ``parallelism`` names it."""
    if not entry:
        return {}
    figures = entry
    if mode is not None:
        compared = (entry.get("parallelism") or {}).get("modes") or ()
        figures = next((row for row in compared if row.get("mode") == mode and row.get("estimated_step_seconds")),
                       None)
        if figures is None:
            raise ValueError(f"mode={mode!r} is invalid: the kept estimate has no figures for it")
    trained = "" if mode is None else f", trained {mode}" + (
        f" ({figures['pack_size']} runs per program)" if figures.get("pack_size", 1) > 1 else "")
    return {"estimated_step_seconds": float(figures["estimated_step_seconds"]),
            "estimated_mfu": None if figures.get("estimated_mfu") is None else float(figures["estimated_mfu"]),
            "estimate_source": f"preflight for {entry.get('slice')} (each run on {entry.get('topology')}, "
                               f"{entry.get('chips')} chips){trained}, {str(entry.get('written', ''))[:10]}",
            **({"parallelism": mode} if mode is not None else {})}
