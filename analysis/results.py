"""Run records -> one table of (depth, width, params, seed, loss), then seed means.

Two inputs are accepted, each a local path or a URL such as
``gs://bucket/sweeps/paper`` (read through fsspec, the layer under the
trainer's ``etils.epath``; ``gs://`` needs gcsfs, part of the ``tpu`` extra):

* a sweep directory, searched recursively for the ``result.json`` records the
  trainer writes. Only runs with ``status == "finished"`` enter the table; the
  others are counted by status so the caller can say what was skipped. Runs
  trained on different text (distinct ``data_fingerprint``) are never mixed:
  loading refuses unless one fingerprint is selected.
* a CSV with the columns ``depth, width, params, seed, loss``.

Throughout, ``params`` is the non-embedding size N = 12·L·d² (parameters),
``width`` is d_x (channels) and ``loss`` is the eval loss (nats per token).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import posixpath

import fsspec
import numpy as np
import pandas as pd

from analysis.errors import AnalysisInputError

CSV_COLUMNS = ("depth", "width", "params", "seed", "loss")
RECORD_FIELDS = ("status", "depth", "width", "seed", "final_eval_loss")
# A CSV's params column may carry rounding; anything further off is not 12·L·d².
_PARAMS_TOLERANCE = 0.01


@dataclasses.dataclass(frozen=True)
class RunTable:
    """Per-run rows plus what was left out while loading.

    ``runs`` has one row per finished run with the columns of ``CSV_COLUMNS``
    (params = 12·L·d² in parameters, loss in nats per token). ``skipped``
    counts left-out runs by reason (e.g. ``{"diverged": 2}``).
    """

    runs: pd.DataFrame
    source: str
    skipped: dict
    fingerprint: str | None = None

    def describe(self) -> str:
        """One line: how many runs, depths and seeds were loaded, and what was skipped."""
        depths = sorted(self.runs["depth"].unique().tolist())
        seeds = self.runs["seed"].nunique()
        text = (f"loaded {len(self.runs)} runs from {self.source}: depths {depths}, "
                f"{self.runs.groupby('depth')['width'].nunique().max()} widths at most per depth, "
                f"{seeds} distinct seeds")
        if self.skipped:
            parts = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items()))
            text += f"; skipped {sum(self.skipped.values())} ({parts})"
        return text


def non_embedding_params(depth, width):
    """N = 12·L·d² (parameters) for depth L (layers) and width d (channels); broadcasts."""
    return 12.0 * np.asarray(depth, dtype=float) * np.asarray(width, dtype=float) ** 2


def load_runs(source, fingerprint: str | None = None) -> RunTable:
    """Load a sweep directory or a CSV file into a ``RunTable``.

    ``fingerprint`` selects the runs of one ``data_fingerprint`` (a prefix is
    enough) when a sweep directory holds several. Raises ``AnalysisInputError``
    with a one-line reason for anything unusable.
    """
    try:
        fs, path = fsspec.core.url_to_fs(str(source))
    except (ImportError, ValueError) as error:  # e.g. gs:// without gcsfs installed
        raise AnalysisInputError(f"{source}: cannot open: {error}") from None
    if not fs.exists(path):
        raise AnalysisInputError(f"{source}: no such file or directory")
    if fs.isdir(path):
        table = _load_sweep_dir(fs, path, str(source), fingerprint)
    else:
        table = _load_csv(fs, path, str(source))
    _validate(table.runs, str(source))
    return table


def _load_csv(fs, file: str, path: str) -> RunTable:
    if fs.size(file) == 0:
        raise AnalysisInputError(f"{path}: file is empty")
    try:
        with fs.open(file, "rb") as handle:
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
    frame = frame[list(CSV_COLUMNS)].copy()
    for column in CSV_COLUMNS:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() & frame[column].notna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0]) + 2  # +1 header, +1 one-based
            raise AnalysisInputError(
                f"{path}: column {column} has a non-numeric value {frame[column].iloc[row - 2]!r} on line {row}")
        frame[column] = values
    _check_params_column(frame, path)
    return RunTable(runs=frame, source=path, skipped={})


def _check_params_column(frame: pd.DataFrame, path: str) -> None:
    expected = non_embedding_params(frame["depth"], frame["width"])
    relative = np.abs(frame["params"].to_numpy(float) / expected - 1.0)
    bad = np.flatnonzero(relative > _PARAMS_TOLERANCE)
    if bad.size:
        row = frame.iloc[bad[0]]
        raise AnalysisInputError(
            f"{path}: params must be the non-embedding size 12·L·d², but line {bad[0] + 2} has "
            f"params={row['params']:.4g} for depth={row['depth']:g}, width={row['width']:g} "
            f"(12·L·d² = {expected[bad[0]]:.4g})")


def _load_sweep_dir(fs, directory: str, root: str, fingerprint: str | None) -> RunTable:
    # One recursive listing (a single request on an object store), not a walk.
    found = sorted(fs.glob(directory.rstrip("/") + "/**/result.json"))
    if not found:
        raise AnalysisInputError(f"{root}: no result.json records found under this directory")
    records, skipped = [], collections.Counter()
    for found_file in found:
        file = root.rstrip("/") + found_file[len(directory.rstrip("/")):]  # as the caller named it
        try:
            record = json.loads(fs.cat_file(found_file))
        except (json.JSONDecodeError, UnicodeDecodeError):
            skipped["unreadable record"] += 1
            continue
        if not isinstance(record, dict):
            skipped["unreadable record"] += 1
            continue
        status = record.get("status", "no status")
        if status != "finished":
            skipped[str(status)] += 1
            continue
        missing = [field for field in RECORD_FIELDS if record.get(field) is None]
        if missing:
            raise AnalysisInputError(f"{file}: finished record lacks {', '.join(missing)}")
        records.append((file, record))
    if not records:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))
        raise AnalysisInputError(f"{root}: no finished runs among {len(found)} records ({reasons})")

    records, chosen = _select_fingerprint(records, fingerprint, root, skipped)
    rows = [{"depth": record["depth"], "width": record["width"], "seed": record["seed"],
             "loss": record["final_eval_loss"],
             "name": record.get("name", posixpath.basename(posixpath.dirname(file)))}
            for file, record in records]
    frame = pd.DataFrame(rows)
    for column in ("depth", "width", "seed", "loss"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["params"] = non_embedding_params(frame["depth"], frame["width"])
    frame = frame[list(CSV_COLUMNS) + ["name"]]
    return RunTable(runs=frame, source=root, skipped=dict(skipped), fingerprint=chosen)


def _select_fingerprint(records, wanted, root, skipped):
    by_print = collections.defaultdict(list)
    for file, record in records:
        by_print[record.get("data_fingerprint") or "unknown"].append((file, record))
    if wanted is None:
        if len(by_print) > 1:
            counts = ", ".join(f"{key} ({len(value)} runs)" for key, value in sorted(by_print.items()))
            raise AnalysisInputError(
                f"{root}: runs were trained on different data (fingerprints {counts}); "
                f"pick one with --fingerprint")
        (only,) = by_print
        return records, (None if only == "unknown" else only)
    matches = [key for key in by_print if key.startswith(wanted)]
    if len(matches) != 1:
        known = ", ".join(sorted(by_print))
        what = "matches no" if not matches else "is ambiguous among the"
        raise AnalysisInputError(f"--fingerprint {wanted} {what} fingerprints present: {known}")
    for key, value in by_print.items():
        if key != matches[0]:
            skipped["other data_fingerprint"] += len(value)
    return by_print[matches[0]], matches[0]


def _validate(frame: pd.DataFrame, source: str) -> None:
    for column in CSV_COLUMNS:
        nan_rows = frame[column].isna() | ~np.isfinite(frame[column].to_numpy(float))
        if nan_rows.any():
            first = frame[nan_rows].iloc[0]
            where = first["name"] if "name" in frame.columns else f"depth={first['depth']}, width={first['width']}"
            raise AnalysisInputError(f"{source}: {int(nan_rows.sum())} run(s) have a missing, NaN or "
                                     f"infinite {column} (first: {where})")
    if (frame["depth"] < 1).any() or (frame["width"] < 1).any():
        raise AnalysisInputError(f"{source}: depth and width must be positive integers")
    if (frame["depth"] % 1 != 0).any() or (frame["width"] % 1 != 0).any():
        raise AnalysisInputError(f"{source}: depth and width must be whole numbers")
    frame["depth"] = frame["depth"].astype(int)
    frame["width"] = frame["width"].astype(int)


def require_depths(table: RunTable, minimum: int = 2) -> None:
    """Raise ``AnalysisInputError`` unless the table holds at least ``minimum`` depths."""
    depths = sorted(table.runs["depth"].unique().tolist())
    if len(depths) < minimum:
        raise AnalysisInputError(
            f"{table.source}: need runs at {minimum} or more depths to compare, found only depth "
            f"{', '.join(map(str, depths))}")


def aggregate_seeds(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard deviation and count of the loss over seeds, per (depth, width).

    Returns columns depth, width, params (12·L·d²), loss_mean and loss_std
    (nats per token; std uses ddof=1 and is NaN for a single seed), n_seeds,
    sorted by depth then params.
    """
    grouped = runs.groupby(["depth", "width"], as_index=False).agg(
        params=("params", "first"), loss_mean=("loss", "mean"),
        loss_std=("loss", "std"), n_seeds=("loss", "size"))
    return grouped.sort_values(["depth", "params"]).reset_index(drop=True)


def pooled_seed_std(runs: pd.DataFrame) -> tuple[float, int]:
    """Seed-to-seed standard deviation of the loss pooled over all (depth, width) points.

    Pools the within-point variances weighted by their degrees of freedom.
    Returns (std in nats per token, degrees of freedom); (nan, 0) when no point
    has two or more seeds.
    """
    groups = runs.groupby(["depth", "width"])["loss"]
    dof = (groups.size() - 1).clip(lower=0)
    squares = groups.var(ddof=1).fillna(0.0) * dof
    total_dof = int(dof.sum())
    if total_dof == 0:
        return math.nan, 0
    return float(np.sqrt(squares.sum() / total_dof)), total_dof


def seed_losses(runs: pd.DataFrame) -> dict:
    """Map (depth, width) to the array of per-seed losses (nats per token)."""
    return {key: group.to_numpy(float) for key, group in runs.groupby(["depth", "width"])["loss"]}
