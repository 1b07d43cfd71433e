"""Whether a run record can be trusted: it is its directory's run, and its result is the metrics log's.

``records.read_record`` checks that a ``result.json`` is a valid record; this
module checks that it belongs where it lies, for the readers that decide what
to train (the launcher's ``status``/``run``, the trainer's "already finished?")
and the analysis:

- ``run_id_problem``: a record whose ``run_id`` is not the run's (a
  ``result.json`` copied from another run's directory) would make a run that
  never trained count as finished, with another run's loss.
- ``metrics_problem``: a finished record's ``final_eval_loss`` must be the
  ``eval_loss`` that the metrics log holds at the record's last step (both are
  the same float, written by the trainer); a record edited by hand disagrees.
  A run without that row (metrics written by older code, or removed) is not
  judged: there is nothing to compare with.

``read_checked_record`` raises ``records.RecordError`` for either, so callers
treat such a record exactly as a damaged one: ``status`` names it, ``run``
trains the run again (resuming from its checkpoints, which rewrites the
record). Imports neither JAX nor the model.
"""

from __future__ import annotations

import math
import re

from scaling.store import records
from scaling.store.metrics_log import MetricsLog, read_part

RUN_ID_PATTERN = re.compile(r"[0-9a-f]{12}")  # scaling.config.config_id's form; sweeps name run directories so
RELATIVE_TOLERANCE = 1e-9  # the two numbers are one float written twice; allow the last digit only


def run_id_problem(record: records.RunRecord, run_id: str) -> str | None:
    """Why ``record`` is not run ``run_id``'s (one phrase), or None if it is."""
    if record.run_id == run_id:
        return None
    return f"holds run {record.run_id}'s record, not run {run_id}'s (copied from another run's directory?)"


def directory_problem(record: records.RunRecord, run_dir) -> str | None:
    """``run_id_problem`` against the name of ``run_dir`` when that name is a run id (as in a sweep), else None."""
    name = str(run_dir).rstrip("/").rsplit("/", 1)[-1]
    return run_id_problem(record, name) if RUN_ID_PATTERN.fullmatch(name) else None


def logged_final_eval_loss(run_dir, step: int) -> float | None:
    """The ``eval_loss`` of the metrics log's row at ``step`` (nats/token), or None if there is none.

    Reads the log's parts from the newest back (on object stores the last part
    holds the last step: one request, not the whole log)."""
    for part in reversed(MetricsLog(run_dir).parts()):
        rows = read_part(part)
        found = [row.get("eval_loss") for row in rows if row["step"] == step and "eval_loss" in row]
        if found:
            value = found[-1]
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if rows and min(row["step"] for row in rows) <= step:
            return None  # the part that would hold the step has no evaluation there
    return None


def metrics_problem(record: records.RunRecord, run_dir) -> str | None:
    """Why a finished record's ``final_eval_loss`` is not the metrics log's, or None if it agrees
    (or the log has no evaluation at the record's last step to compare with; ``unlogged_problem`` says
    when there is no log at all)."""
    if record.status != "finished" or record.final_eval_loss is None:
        return None
    logged = logged_final_eval_loss(run_dir, record.steps)
    if logged is None or math.isclose(logged, record.final_eval_loss, rel_tol=RELATIVE_TOLERANCE):
        return None
    return (f"final_eval_loss={record.final_eval_loss!r} disagrees with the metrics log's eval_loss={logged!r} "
            f"at step {record.steps} (edited by hand?)")


def unlogged_problem(record: records.RunRecord, run_dir) -> str | None:
    """Why a finished record cannot be checked at all: its run directory holds no metrics log (a finished
    run always writes its log before its record, so the log was deleted); else None."""
    if record.status != "finished" or record.final_eval_loss is None or MetricsLog(run_dir).parts():
        return None
    return f"final_eval_loss={record.final_eval_loss!r} has no metrics log to agree with (deleted?)"


def read_checked_record(run_dir, run_id: str) -> records.RunRecord | None:
    """``records.read_record(run_dir)``, also raising ``records.RecordError`` (naming the file) when the record is
    not run ``run_id``'s, its final eval loss is not the metrics log's, or there is no metrics log to say."""
    record = records.read_record(run_dir)
    if record is None:
        return None
    problem = run_id_problem(record, run_id)
    try:
        problem = problem or metrics_problem(record, run_dir) or unlogged_problem(record, run_dir)
    except OSError:  # the log cannot be read now: nothing to judge by, not a reason to train again
        pass
    if problem:
        raise records.RecordError(f"{records.record_path(run_dir)}: {problem}")
    return record
