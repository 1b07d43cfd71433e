"""A run's metrics log on disk: one JSON row per step, appended as training goes, read back in order.

Local run directories keep one file, ``metrics.jsonl``, appended to. Object
stores cannot append, and rewriting the whole file at every flush would
upload O(steps²) bytes over a run; there each flush becomes a new object,
``metrics/<first step>-<last step>.jsonl`` (steps zero-padded to 10 digits,
so name order is step order), and bytes written grow linearly with the run.
A ``metrics.jsonl`` on an object store (written by older code) is read
first, as the earliest part.

``read_metrics(run_dir)`` returns the rows in step order from either layout;
lines cut short by a crash are skipped.
"""

from __future__ import annotations

import json

from etils import epath

from scaling.storage import is_remote, write_atomic

LOG_FILE = "metrics.jsonl"
PARTS_FOLDER = "metrics"


def _parse(text: str) -> list[tuple[str, dict]]:
    """(line, row) for each whole line of ``text`` that is a JSON object with an integer ``step``."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append((line, row))
    return rows


class MetricsLog:
    """The metrics log of the run directory ``run_dir`` (local path or URI)."""

    def __init__(self, run_dir):
        self.run_dir = epath.Path(run_dir)
        self.remote = is_remote(run_dir)
        self.file = self.run_dir / LOG_FILE
        self.folder = self.run_dir / PARTS_FOLDER

    def parts(self) -> list[epath.Path]:
        """The files holding rows, in step order (one locally; on object stores, one per flush)."""
        found = [self.file] if self.file.exists() else []
        if self.remote and self.folder.exists():
            found += sorted((p for p in self.folder.iterdir() if p.name.endswith(".jsonl")), key=lambda p: p.name)
        return found

    def cut(self, keep_until_step: int | None) -> dict | None:
        """Drop rows after ``keep_until_step`` (all rows if None); return the row of that step, removed too,
        so that what a resumed run logs there merges into it (None if there is none)."""
        held = None
        for part in self.parts():
            rows = _parse(part.read_text()) if keep_until_step is not None else []
            kept = [line for line, row in rows if row["step"] < keep_until_step]
            for _, row in rows:
                if row["step"] == keep_until_step:
                    held = {k: v for k, v in row.items() if k != "step"}
            if part == self.file and not self.remote:
                write_atomic(part, "".join(line + "\n" for line in kept))
            elif not kept:
                part.unlink()
            elif len(kept) != len(rows):
                write_atomic(part, "".join(line + "\n" for line in kept))
        return held

    def append(self, rows: list[dict]) -> None:
        """Add ``rows`` (each with an integer ``step``, in step order, after every row written so far)."""
        if not rows:
            return
        text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
        if not self.remote:
            with self.file.open("a") as handle:
                handle.write(text)
            return
        name = f"{rows[0]['step']:010d}-{rows[-1]['step']:010d}.jsonl"
        write_atomic(self.folder / name, text)  # object stores need no folder made first


def read_metrics(run_dir) -> list[dict]:
    """Every row of the run's metrics log, in the order written (step order), from either layout."""
    rows = []
    for part in MetricsLog(run_dir).parts():
        rows.extend(row for _, row in _parse(part.read_text()))
    return rows
