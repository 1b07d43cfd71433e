"""Run records -> one table of runs, each counted once and labelled with what it was trained with.

Two inputs are accepted, each a local path or a URL such as
``gs://bucket/sweeps/paper`` (read through ``etils.epath``; ``gs://`` needs
gcsfs, part of the ``tpu`` extra):

* a sweep directory, searched recursively for ``result.json`` records, each
  validated by ``scaling.store.records`` (the record's single definition; a record
  of an older schema version is refused with the command that upgrades it).
  Only ``finished`` runs enter the table; the others are listed per shape in
  ``RunTable.unfinished``. A record copied into a second directory has the
  same ``run_id`` and is counted once; two records of one ``run_id`` whose
  results or data differ are refused, as two CSV rows would be. A record
  that cannot be trusted (``scaling.store.record_checks``) is left out and named
  in ``RunTable.notes``: one in a directory named after another run id (a
  ``result.json`` copied over another run's), or a finished one whose
  ``final_eval_loss`` is not its metrics log's last evaluation.
* a CSV with the columns ``depth, width, params, seed, loss`` and optionally
  ``peak_lr``, ``steps``, ``lr_rule`` and ``data_fingerprint``. Repeated
  identical rows are collapsed (and said so); two rows for the same run with
  different losses are refused.

Runs trained on different data or for different numbers of steps are never
mixed: loading refuses unless one is chosen (``fingerprint=``, ``steps=``).
One exception: a ladder whose training length grows with size, every run
planned for the same tokens per parameter (each run's planned steps within one
step of ratio × N / tokens per step), is one design and is kept
whole (``RunTable.tokens_per_param``).
Learning rates may differ; ``analysis.points`` chooses one per shape.

Throughout, ``params`` is the non-embedding size N = 12·L·d² (parameters;
a record's own ``params_non_embedding``, a CSV's ``params`` column),
``width`` is d_x (channels) and ``loss`` is the eval loss (nats per token).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import posixpath

import numpy as np
import pandas as pd
from etils import epath

from analysis.errors import AnalysisInputError
from scaling.store import record_checks
from scaling.store import records as run_records

CSV_COLUMNS = ("depth", "width", "params", "seed", "loss")
# Optional CSV columns and the value a missing one stands for.
CSV_OPTIONAL = {"peak_lr": math.nan, "steps": math.nan, "lr_rule": "", "data_fingerprint": "",
                "tokens_per_step": math.nan}
# One row per finished run: what was trained, with what, and the result.
RUN_COLUMNS = CSV_COLUMNS + ("peak_lr", "lr_rule", "steps", "data", "point", "run_id", "name", "tokens_per_step")
# A CSV's params column may carry rounding; anything further off is not 12·L·d².
_PARAMS_TOLERANCE = 0.01


@dataclasses.dataclass(frozen=True)
class RunTable:
    """Finished runs, one row each, plus what was left out while loading.

    ``runs`` has the columns of ``RUN_COLUMNS``: params = 12·L·d²
    (parameters), loss in nats per token, ``peak_lr`` (NaN if unknown),
    ``steps`` (planned optimiser steps, NaN if unknown), ``data`` (data
    fingerprint), ``point`` (identical for runs that differ only by seed).
    ``tokens_per_step`` (NaN if unknown). ``tokens_per_param`` is the planned
    training tokens per parameter the runs share when their step counts differ
    only because of it (None otherwise).
    ``skipped`` counts left-out records by reason; ``unfinished`` lists runs
    that did not finish (depth, width, seed, status, name); ``notes`` holds
    one-line messages about what loading changed (duplicates collapsed...).
    """

    runs: pd.DataFrame
    source: str
    skipped: dict
    fingerprint: str | None = None
    steps: int | None = None
    unfinished: pd.DataFrame | None = None
    notes: tuple = ()
    tokens_per_param: float | None = None

    def describe(self) -> str:
        """One line: how many runs, depths and seeds were loaded, and what was skipped."""
        depths = sorted(self.runs["depth"].unique().tolist())
        seeds = self.runs["seed"].nunique()
        text = (f"loaded {len(self.runs)} runs from {self.source}: depths {depths}, "
                f"{self.runs.groupby('depth')['width'].nunique().max()} widths at most per depth, "
                f"{seeds} distinct seeds")
        if self.steps is not None:
            text += f", {self.steps} steps"
        if self.skipped:
            parts = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items()))
            text += f"; skipped {sum(self.skipped.values())} ({parts})"
        return text

    def unfinished_lines(self) -> list[str]:
        """One line per shape with runs that did not finish: which seeds and why."""
        if self.unfinished is None or self.unfinished.empty:
            return []
        lines = []
        for (depth, width), group in self.unfinished.groupby(["depth", "width"]):
            runs = ", ".join(f"seed {row.seed} {row.status}" for row in group.itertuples())
            lines.append(f"L={depth}, d={width}: {runs}")
        return lines


def open_source(source, missing: str = "no such file or directory") -> tuple[epath.Path, bool]:
    """``source`` as a path (local or URI) and whether it is a directory; ``AnalysisInputError`` (one line,
    ending in ``missing``) if it does not exist or cannot be opened."""
    path = epath.Path(source)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except (ImportError, ValueError) as error:  # e.g. gs:// without gcsfs installed
        raise AnalysisInputError(f"{source}: cannot open: {error}") from None
    if not exists:
        raise AnalysisInputError(f"{source}: {missing}")
    return path, is_dir


def load_runs(source, fingerprint: str | None = None, steps: int | None = None, told_apart_by=None) -> RunTable:
    """Load a sweep directory or a CSV file into a ``RunTable``.

    ``fingerprint`` selects the runs of one data fingerprint (a prefix is
    enough), ``steps`` the runs of one planned step count, when the input
    holds several. ``told_apart_by`` (run name -> label), for a sweep whose
    variants differ in a setting at one shape and rate: runs of different
    labels are not refused as hidden differences (the caller keeps them
    apart). Raises ``AnalysisInputError`` with a one-line reason for
    anything unusable.
    """
    path, is_dir = open_source(source)
    if is_dir:
        found, skipped, unfinished, notes = _read_sweep_dir(path, str(source))
    else:
        found, skipped, unfinished, notes = _load_csv(path, str(source)), {}, None, []
    return select(found, str(source), fingerprint, steps, skipped, unfinished, notes, told_apart_by)


def table_from_records(records, source: str = "records", fingerprint: str | None = None,
                       steps: int | None = None) -> RunTable:
    """A ``RunTable`` from ``scaling.store.records.RunRecord`` objects (or their dicts), e.g. the launcher's."""
    parsed = []
    for index, record in enumerate(records):
        if not isinstance(record, run_records.RunRecord):
            try:
                record = run_records.from_dict(record, f"{source} record {index}")
            except (run_records.RecordError, run_records.OutdatedRecord) as error:
                raise AnalysisInputError(str(error)) from None
        parsed.append((f"{source}/{record.run_id}", record))
    frame, skipped, unfinished, notes = _rows_from_records(parsed, source)
    return select(frame, source, fingerprint, steps, skipped, unfinished, notes)


# ---------------------------------------------------------------- sweep directories
def _read_sweep_dir(directory: epath.Path, root: str):
    found = run_records.find_records(directory)  # one listing on an object store, not a walk
    if not found:
        raise AnalysisInputError(f"{root}: no result.json records found under this directory")
    parsed, notes = [], []
    unreadable = 0
    for file in found:
        try:
            data = json.loads(file.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            unreadable += 1
            notes.append(f"{file}: skipped, not valid JSON ({type(error).__name__})")
            continue
        try:
            record = run_records.from_dict(data, str(file))
        except (run_records.RecordError, run_records.OutdatedRecord) as error:  # bad data, not a partial write
            raise AnalysisInputError(str(error)) from None
        parsed.append((str(file), record))
    parsed, untrusted = _trusted(parsed)
    notes += [f"{file}: skipped, {problem}" for file, problem in untrusted]
    notes += _unchecked(parsed)
    frame, skipped, unfinished, more_notes = _rows_from_records(parsed, root)
    if unreadable:
        skipped["unreadable record"] = unreadable
    if untrusted:
        skipped["untrusted record"] = len(untrusted)
    return frame, skipped, unfinished, notes + more_notes


def _trusted(parsed):
    """(the records that can be trusted, [(file, problem)] of those that cannot): another run's record
    in a run directory, a final loss its metrics log does not hold (``scaling.store.record_checks``)."""
    from concurrent.futures import ThreadPoolExecutor

    def problem(item):
        file, record = item
        run_dir = posixpath.dirname(file)
        try:
            return record_checks.directory_problem(record, run_dir) or record_checks.metrics_problem(record, run_dir)
        except OSError:  # the metrics log cannot be read: nothing to judge by
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:  # one or two requests per record on an object store
        problems = list(pool.map(problem, parsed))
    kept = [item for item, found in zip(parsed, problems) if not found]
    return kept, [(item[0], found) for item, found in zip(parsed, problems) if found]


def _unchecked(parsed) -> list[str]:
    """A note for each finished record that nothing can check: its metrics log is missing
    (``scaling.store.record_checks.unlogged_problem``); the record is still read."""
    from concurrent.futures import ThreadPoolExecutor

    def note(item):
        file, record = item
        try:
            problem = record_checks.unlogged_problem(record, posixpath.dirname(file))
        except OSError:
            return None
        return None if problem is None else f"{file}: not checked, {problem}"

    with ThreadPoolExecutor(max_workers=16) as pool:
        return [found for found in pool.map(note, parsed) if found]


def _rows_from_records(parsed, root: str):
    """Rows of finished runs (each run_id once), skip counts, unfinished runs and notes."""
    skipped, notes = collections.Counter(), []
    seen: dict[str, str] = {}
    rows, unfinished = [], []
    first: dict[str, run_records.RunRecord] = {}
    for file, record in parsed:
        if record.run_id in seen:
            difference = _difference(first[record.run_id], record)
            if difference:
                raise AnalysisInputError(
                    f"{root}: {seen[record.run_id]} and {file} are records of one run ({record.run_id}) with "
                    f"different {difference}; keep the one that is right (or rerun the run)")
            skipped["duplicate run_id"] += 1
            notes.append(f"{file}: same run_id {record.run_id} as {seen[record.run_id]}; counted once")
            continue
        seen[record.run_id], first[record.run_id] = file, record
        name = record.name or posixpath.basename(posixpath.dirname(file))
        if record.status != "finished":
            skipped[record.status] += 1
            unfinished.append({"depth": record.depth, "width": record.width, "seed": record.seed,
                               "status": record.status, "name": name})
            continue
        rows.append({"depth": record.depth, "width": record.width, "params": float(record.params_non_embedding),
                     "seed": record.seed, "loss": record.final_eval_loss, "peak_lr": float(record.peak_lr),
                     "lr_rule": record.lr_rule, "steps": float(record.planned_steps),
                     "data": record.data_fingerprint or "unknown", "point": record.point_id,
                     "run_id": record.run_id, "name": name,
                     "tokens_per_step": float(record.tokens_per_step) if record.tokens_per_step else math.nan})
    if not rows:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))
        raise AnalysisInputError(f"{root}: no finished runs among {len(parsed)} records ({reasons})")
    frame = pd.DataFrame(rows)
    columns = ["depth", "width", "seed", "status", "name"]
    return frame[list(RUN_COLUMNS)], dict(skipped), pd.DataFrame(unfinished, columns=columns), notes


def _difference(one: run_records.RunRecord, other: run_records.RunRecord) -> str:
    """What two records of one run_id disagree on, among what the analysis uses ("" if nothing): a copy is
    counted once, but two different results of one run cannot both be right."""
    differ = [name for name in ("status", "data_fingerprint", "planned_steps", "steps")
              if getattr(one, name) != getattr(other, name)]
    losses = (one.final_eval_loss, other.final_eval_loss)
    if (None in losses and losses[0] != losses[1]) or (
            None not in losses and not math.isclose(*losses, rel_tol=record_checks.RELATIVE_TOLERANCE)):
        differ.append(f"final_eval_loss ({losses[0]} and {losses[1]})")
    return ", ".join(differ)


def _setting_key(row) -> tuple:
    return (row.depth, row.width, row.lr_rule, _lr_text(row.peak_lr), row.steps, row.data)


def _lr_text(value) -> str:
    return "unknown" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.6g}"


# ---------------------------------------------------------------- CSV files
def _load_csv(file: epath.Path, path: str) -> pd.DataFrame:
    if file.stat().length == 0:
        raise AnalysisInputError(f"{path}: file is empty")
    try:
        with file.open("rb") as handle:
            frame = pd.read_csv(handle)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise AnalysisInputError(f"{path}: not a readable CSV ({first_line})") from None
    frame.columns = [str(column).strip().lower() for column in frame.columns]
    missing = [column for column in CSV_COLUMNS if column not in frame.columns]
    if missing:
        raise AnalysisInputError(
            f"{path}: missing column(s) {', '.join(missing)}; need {', '.join(CSV_COLUMNS)}")
    if frame.empty:
        raise AnalysisInputError(f"{path}: has a header but no rows")
    for column, default in CSV_OPTIONAL.items():
        if column not in frame.columns:
            frame[column] = default
    frame["line"] = np.arange(len(frame)) + 2  # +1 header, +1 one-based
    for column in CSV_COLUMNS + ("peak_lr", "steps", "tokens_per_step"):
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() & frame[column].notna()
        if bad.any():
            index = int(np.flatnonzero(bad.to_numpy())[0])
            raise AnalysisInputError(f"{path}: column {column} has a non-numeric value "
                                     f"{frame[column].iloc[index]!r} on line {index + 2}")
        frame[column] = values
    _check_values(frame, path)
    _check_params_column(frame, path)
    frame["lr_rule"] = frame["lr_rule"].fillna("").astype(str)
    frame["data"] = frame["data_fingerprint"].fillna("").astype(str).replace("", "unknown")
    frame = _collapse_repeated_rows(frame, path)
    frame["depth"] = frame["depth"].astype(int)
    frame["width"] = frame["width"].astype(int)
    frame["seed"] = frame["seed"].astype(int)
    frame["point"] = [f"csv-{_setting_key(row)}" for row in frame.itertuples()]
    frame["run_id"] = [f"line{line}" for line in frame["line"]]
    frame["name"] = [f"{path} line {line}" for line in frame["line"]]
    return frame


def _check_values(frame: pd.DataFrame, path: str) -> None:
    """Refuse missing, non-finite or impossible values, naming the file and line."""
    checks = [(column, "a missing, NaN or infinite", lambda v: ~np.isfinite(v)) for column in CSV_COLUMNS]
    checks += [("loss", "a negative", lambda v: v < 0), ("depth", "a non-positive", lambda v: v < 1),
               ("width", "a non-positive", lambda v: v < 1), ("seed", "a negative", lambda v: v < 0),
               ("depth", "a fractional", lambda v: v % 1 != 0), ("width", "a fractional", lambda v: v % 1 != 0),
               ("seed", "a fractional", lambda v: v % 1 != 0),
               ("peak_lr", "a non-positive or infinite", lambda v: ~np.isnan(v) & ~(np.isfinite(v) & (v > 0))),
               ("steps", "a non-positive or infinite", lambda v: ~np.isnan(v) & ~(np.isfinite(v) & (v > 0)))]
    for column, what, is_bad in checks:
        with np.errstate(invalid="ignore"):
            bad = is_bad(frame[column].to_numpy(float))
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            raise AnalysisInputError(f"{path}: line {index + 2} has {what} {column} "
                                     f"({frame[column].iloc[index]}); {int(bad.sum())} such line(s)")


def _check_params_column(frame: pd.DataFrame, path: str) -> None:
    """A CSV row carries no run record (whose ``params_non_embedding`` the trainer computed), so its
    params column is checked against the paper's accounting itself: a total count would pass otherwise."""
    expected = 12.0 * frame["depth"].to_numpy(float) * frame["width"].to_numpy(float) ** 2
    relative = np.abs(frame["params"].to_numpy(float) / expected - 1.0)
    bad = np.flatnonzero(relative > _PARAMS_TOLERANCE)
    if bad.size:
        row = frame.iloc[bad[0]]
        raise AnalysisInputError(
            f"{path}: params must be the non-embedding size 12·L·d², but line {bad[0] + 2} has "
            f"params={row['params']:.4g} for depth={row['depth']:g}, width={row['width']:g} "
            f"(12·L·d² = {expected[bad[0]]:.4g})")


def _collapse_repeated_rows(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """Keep one of several identical rows (with a note); refuse one run with two different losses."""
    identity = ["depth", "width", "seed", "peak_lr", "lr_rule", "steps", "data"]
    exact = frame.duplicated(identity + ["loss"], keep="first")
    kept = frame[~exact]
    clash = kept.duplicated(identity, keep=False)
    if clash.any():
        lines = kept.loc[clash, "line"].tolist()
        raise AnalysisInputError(
            f"{path}: lines {', '.join(map(str, lines[:4]))} give the same run (depth, width, seed and settings) "
            "different losses; keep one row per run, or add a peak_lr/steps column that tells them apart")
    if exact.any():
        lines = frame.loc[exact, "line"].tolist()
        kept = kept.copy()
        kept.attrs["note"] = (f"{path}: {len(lines)} repeated identical row(s) counted once "
                              f"(line(s) {', '.join(map(str, lines[:6]))}{'...' if len(lines) > 6 else ''})")
    return kept


# ---------------------------------------------------------------- selection
def select(frame: pd.DataFrame, source: str, fingerprint, steps, skipped, unfinished, notes,
           told_apart_by=None) -> RunTable:
    """Keep the runs of one data fingerprint and one step count; refuse to mix them otherwise."""
    skipped = collections.Counter(skipped)
    notes = list(notes)
    if frame.attrs.get("note"):
        notes.append(frame.attrs["note"])
    frame, chosen_print = _choose(frame, "data", fingerprint, source, skipped, "other data_fingerprint",
                                  "trained on different data (fingerprints {counts}); pick one with --fingerprint",
                                  prefix=True)
    per_param = _tokens_per_param(frame) if steps is None and frame["steps"].nunique(dropna=False) > 1 else None
    if per_param is None:
        frame, chosen_steps = _choose(frame, "steps", steps, source, skipped, "other step count",
                                      "trained for different numbers of steps ({counts}); pick one with --steps")
    else:
        chosen_steps = None
        notes.append(f"{source}: every run planned for {per_param:.3g} training tokens per parameter, so step "
                     f"counts grow with size ({frame['steps'].min():.0f} to {frame['steps'].max():.0f}); "
                     "analysed as one design")
    _refuse_hidden_differences(frame, source, told_apart_by)
    runs = frame[list(RUN_COLUMNS)].sort_values(["depth", "params", "peak_lr", "seed"]).reset_index(drop=True)
    return RunTable(runs=runs, source=source, skipped=dict(skipped),
                    fingerprint=None if chosen_print in (None, "unknown") else chosen_print,
                    steps=None if chosen_steps is None or math.isnan(chosen_steps) else int(chosen_steps),
                    unfinished=unfinished, notes=tuple(notes), tokens_per_param=per_param)


def _tokens_per_param(frame: pd.DataFrame) -> float | None:
    """The planned training tokens per parameter that every run shares: a ratio r with every run's
    planned steps within one step of r·N / tokens per step (rounded either way); else None.

    Each run allows r in [(steps - 1), (steps + 1)] × tokens per step / N; the runs share one when these
    intervals overlap, and the middle of the overlap is returned (the longest runs pin it down)."""
    steps = frame["steps"].to_numpy(float)
    per_step = frame["tokens_per_step"].to_numpy(float)
    params = frame["params"].to_numpy(float)
    if not (np.isfinite(steps).all() and np.isfinite(per_step).all() and (per_step > 0).all()):
        return None
    low = float(np.max((steps - 1) * per_step / params))
    high = float(np.min((steps + 1) * per_step / params))
    return 0.5 * (low + high) if low <= high else None


def _choose(frame, column, wanted, source, skipped, skip_reason, refusal, prefix=False):
    values = frame[column].fillna(-1.0) if column == "steps" else frame[column]
    present = sorted(set(values.tolist()), key=str)
    if wanted is None:
        if len(present) > 1:
            counts = ", ".join(f"{_show(value)}: {int((values == value).sum())} runs" for value in present)
            raise AnalysisInputError(f"{source}: runs were " + refusal.format(counts=counts))
        only = present[0]
        return frame, (math.nan if only == -1.0 else only) if column == "steps" else only
    if column == "data" and set(present) == {"unknown"}:
        raise AnalysisInputError(f"{source}: the runs carry no data fingerprint (for a CSV: no "
                                 "data_fingerprint column), so --fingerprint cannot select among them")
    if prefix:
        matches = [value for value in present if str(value).startswith(str(wanted))]
    else:
        matches = [value for value in present if value == float(wanted)]
    if len(matches) != 1:
        known = ", ".join(_show(value) for value in present)
        what = "matches none of" if not matches else "is ambiguous among"
        raise AnalysisInputError(f"--{'fingerprint' if column == 'data' else column} {wanted} {what} the "
                                 f"values present: {known}")
    keep = values == matches[0]
    if (~keep).any():
        skipped[skip_reason] += int((~keep).sum())
    return frame[keep.to_numpy()], matches[0]


def _show(value) -> str:
    if isinstance(value, float):
        return "unknown" if value == -1.0 or math.isnan(value) else f"{value:g}"
    return str(value)


def _refuse_hidden_differences(frame: pd.DataFrame, source: str, told_apart_by=None) -> None:
    """Runs at one shape and learning rate must share one point: otherwise another setting differs
    (unless ``told_apart_by`` gives their names different labels)."""
    label = frame["name"].map(told_apart_by) if told_apart_by else pd.Series("", index=frame.index)
    groups = frame.groupby(["depth", "width", "lr_rule", frame["peak_lr"].fillna(-1.0), label])["point"]
    for key, points in groups:
        if points.nunique() > 1:
            names = frame.loc[points.index, "name"].tolist()
            raise AnalysisInputError(
                f"{source}: runs at L={key[0]}, d={key[1]} with the same learning rate differ in another "
                f"setting (e.g. {names[0]} and {names[-1]}); analyse them separately")


def require_depths(table: RunTable, minimum: int = 2) -> None:
    """Raise ``AnalysisInputError`` unless the table holds at least ``minimum`` depths."""
    depths = sorted(table.runs["depth"].unique().tolist())
    if len(depths) < minimum:
        raise AnalysisInputError(
            f"{table.source}: need runs at {minimum} or more depths to compare, found only depth "
            f"{', '.join(map(str, depths))}")
