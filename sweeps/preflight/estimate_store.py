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

With ``--workdir`` the preflight also keeps them **with the sweep**, in one file
``<workdir>/<sweep>/preflight.json`` (local or ``gs://``, through ``scaling.store.storage``): run id -> slice ->
estimate, as above. ``run`` on every host of a cloud job, ``status`` and ``dry-run`` then read that file
(``load``), so they all see the same estimates and choices; the cache on the machine that ran the preflight is
only its copy, read where the work directory has no such file.
"""

from __future__ import annotations

import datetime
import json
import os

from scaling.store.storage import is_remote, read_text, write_atomic

SUBDIRECTORY = "estimates"
SWEEP_FILE = "preflight.json"  # <workdir>/<sweep>/preflight.json: the estimates kept with the sweep
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


def save(cache_directory: str | None, runs, rows: list[dict], slice_name: str, now: datetime.datetime | None = None,
         sweep_file: str | None = None) -> int:
    """Keep the estimate of each run (``RunSpec``) from its preflight row for ``slice_name``; returns how many.

    A run that no longer fits, or whose step time is unknown, loses any earlier estimate for that slice.
    Kept in the cache (nothing without a cache directory; a disk that refuses the write costs the estimate, never
    the preflight) and, with ``sweep_file``, with the sweep too (``save_with_sweep``; its errors are raised).
    """
    if sweep_file is not None:
        kept = save_with_sweep(sweep_file, runs, rows, slice_name, now)
        if cache_directory is not None:
            save(cache_directory, runs, rows, slice_name, now)
        return kept
    if cache_directory is None:
        return 0
    written = _now(now)
    kept = 0
    for run, row in zip(runs, rows):
        path = _path(cache_directory, run.run_id)
        entries = _load(path)
        before = dict(entries)
        kept += _keep(entries, row, slice_name, written)
        if entries == before:  # nothing kept, nothing dropped
            continue
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, json.dumps(entries, indent=1, sort_keys=True))
        except OSError:
            pass
    return kept


def _now(now: datetime.datetime | None) -> str:
    return (now or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds")


def _keep(entries: dict, row: dict, slice_name: str, written: str) -> bool:
    """Update one run's ``entries`` (slice -> estimate) from its preflight ``row``; True if an estimate was kept.
    A run that no longer fits, or whose step time is unknown, loses its estimate for ``slice_name``."""
    if row.get("fits") and row.get("estimated_step_seconds"):
        entries[slice_name] = {**{key: row.get(key) for key in ROW_FIELDS}, "slice": slice_name, "written": written,
                               **({"parallelism": row["parallelism"]} if row.get("parallelism") else {})}
        return True
    entries.pop(slice_name, None)
    return False


def sweep_file(workdir, sweep_name: str) -> str:
    """``<workdir>/<sweep>/preflight.json``, local or ``gs://``."""
    from etils import epath

    return os.fspath(epath.Path(workdir) / sweep_name / SWEEP_FILE)


def _read_sweep_file(path: str) -> dict | None:
    """run id -> slice -> estimate from the sweep's file; None if there is none; ``ValueError`` if damaged."""
    from etils import epath

    if not epath.Path(path).exists():
        return None
    try:
        data = json.loads(read_text(path))
        runs = data["runs"]
        if not isinstance(runs, dict):
            raise TypeError("runs is not an object")
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not the preflight's estimates ({error}); rerun the preflight with --workdir "
                         "or move the file aside") from None
    return runs


def save_with_sweep(path: str, runs, rows: list[dict], slice_name: str,
                    now: datetime.datetime | None = None) -> int:
    """Keep each run's estimate from its row for ``slice_name`` in the sweep's file ``path`` (``sweep_file``),
    beside those of other runs and slices there; returns how many were kept. One read and one atomic write."""
    from etils import epath

    kept_runs = _read_sweep_file(path) or {}
    written, kept = _now(now), 0
    for run, row in zip(runs, rows):
        entries = kept_runs.setdefault(run.run_id, {})
        kept += _keep(entries, row, slice_name, written)
        if not entries:
            del kept_runs[run.run_id]
    if not is_remote(path):
        epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"runs": kept_runs}, indent=1, sort_keys=True))
    return kept


class Kept:
    """The kept estimates one command reads (``load``): the sweep's file, this machine's cache, or none."""

    def __init__(self, where: str | None, runs: dict | None = None, cache_directory: str | None = None,
                 sweep_path: str | None = None):
        self.where, self.runs, self.cache_directory = where, runs, cache_directory
        self.sweep_path = sweep_path  # the sweep's file looked for (absent unless ``with_sweep``)

    @property
    def with_sweep(self) -> bool:
        """True when read from the sweep's file in the work directory (what every host reads)."""
        return self.runs is not None

    def latest(self, run_id: str) -> dict | None:
        """The newest estimate of ``run_id`` (any slice), or None."""
        if self.runs is None:
            return latest(self.cache_directory, run_id)
        entries = [entry for entry in (self.runs.get(run_id) or {}).values()
                   if isinstance(entry, dict) and entry.get("estimated_step_seconds")]
        return max(entries, key=lambda entry: entry.get("written", "")) if entries else None

    def latest_for(self, runs) -> dict:
        """run id -> newest estimate, for the ``runs`` that have one."""
        found = {run.run_id: self.latest(run.run_id) for run in runs}
        return {run_id: entry for run_id, entry in found.items() if entry}

    def describe(self, runs) -> str:
        """One line: where the estimates and parallelism choices of ``runs`` come from, and how many there are."""
        found = self.latest_for(runs)
        chosen = sum(1 for entry in found.values() if (entry.get("parallelism") or {}).get("choice"))
        counts = f"{len(found)} of {len(runs)} runs estimated, parallelism chosen for {chosen}"
        if self.with_sweep:
            return f"preflight estimates: {self.where} (kept with the sweep; {counts})"
        if not found:
            cache = ", none in this machine's cache" if self.where else ""
            return (f"preflight estimates: none (no {self.sweep_path or 'file with the sweep'}{cache}; "
                    "preflight --workdir keeps them there)")
        return (f"preflight estimates: this machine's cache {self.where} ({counts}; other machines do not see it: "
                "preflight --workdir WORKDIR keeps them with the sweep)")


def load(workdir, sweep_name: str, cache_directory: str | None) -> Kept:
    """The estimates a command reads: ``<workdir>/<sweep>/preflight.json`` where it exists (every host reads the
    same), else the cache ``cache_directory`` on this machine, else none. ``ValueError`` for a damaged file."""
    path = None if workdir is None else sweep_file(workdir, sweep_name)
    runs = None if path is None else _read_sweep_file(path)
    if runs is not None:
        return Kept(path, runs, sweep_path=path)
    return Kept(cache_directory, cache_directory=cache_directory, sweep_path=path)


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
