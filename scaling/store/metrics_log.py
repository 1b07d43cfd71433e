"""A run's metrics log on disk: one JSON row per step, appended as training goes, read back in order.

Local run directories keep one file, ``metrics.jsonl``, appended to. Object
stores cannot append, and rewriting the whole file at every flush would
upload O(steps²) bytes over a run; there each flush becomes a new object,
``metrics/<first step>-<last step>.jsonl`` (steps zero-padded to 10 digits,
so name order is step order), and bytes written grow linearly with the run.
A ``metrics.jsonl`` on an object store (written by older code) is read
first, as the earliest part.

``read_metrics(run_dir)`` returns one row per step, in step order, from
either layout; lines cut short by a crash are skipped. A resumed run keeps
the row of its resume step on disk until it writes that row again, with
what it logs there merged in (locally one atomic rewrite; on object stores
the new part first, then the old row removed), so a run killed in between
loses nothing. Should a kill leave a step written twice on an object store,
the reader merges the two, the one written later winning field by field.
"""

from __future__ import annotations

import json
import os

from etils import epath

from scaling.store.storage import file_sizes, is_remote, read_text, write_atomic

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


def _part_name(first: dict, last: dict) -> str:
    """The object name of a part holding the rows ``first`` to ``last`` (zero-padded: name order is step order)."""
    return f"{first['step']:010d}-{last['step']:010d}.jsonl"


def read_part(part) -> list[dict]:
    """The whole rows of one part of a metrics log (a file or an object), in the order written."""
    return [row for _, row in _parse(read_text(part))]


class MetricsLog:
    """The metrics log of the run directory ``run_dir`` (local path or URI)."""

    def __init__(self, run_dir):
        self.run_dir = epath.Path(run_dir)
        self.remote = is_remote(run_dir)
        self.file = self.run_dir / LOG_FILE
        self.folder = self.run_dir / PARTS_FOLDER
        self.held_step: int | None = None  # the step whose row ``cut`` held; ``append`` replaces it

    def parts(self) -> list[epath.Path]:
        """The files holding rows, in step order (one locally; on object stores, one per flush)."""
        found = [self.file] if self.file.exists() else []
        if self.remote:
            try:  # a fresh listing: this process's own writes and deletions go through another client
                names = file_sizes(self.folder)
            except FileNotFoundError:
                names = {}
            found += [self.folder / name for name in sorted(names) if name.endswith(".jsonl")]
        return found

    def cut(self, keep_until_step: int | None) -> dict | None:
        """Drop rows after ``keep_until_step`` (all rows if None); return the row of that step (a copy), so
        that what a resumed run logs there merges into it (None if there is none).

        The row itself stays on disk until the resumed run writes it again (``append`` then replaces it):
        a run killed in between, before its first flush, would otherwise lose that step's row for good."""
        held = None
        if keep_until_step is not None:
            for part in self.parts():
                for row in read_part(part):
                    if row["step"] == keep_until_step:
                        held = {**(held or {}), **{k: v for k, v in row.items() if k != "step"}}
        self._drop_from(None if keep_until_step is None else keep_until_step + 1)
        self.held_step = keep_until_step if held is not None else None
        return held

    def _drop_from(self, first_step: int | None, spare=None) -> None:
        """Remove the rows of steps ``first_step`` and later (every row if None) from every part but ``spare``.
        A part cut short is renamed to the steps it still holds, written before the old name goes: name
        order stays write order when a resumed run's first part starts at the step it kept."""
        for part in self.parts():
            if part == spare:
                continue
            rows = _parse(read_text(part)) if first_step is not None else []
            kept = [(line, row) for line, row in rows if row["step"] < first_step]
            text = "".join(line + "\n" for line, _ in kept)
            if part == self.file and not self.remote:
                # A fresh start (``first_step`` None) empties the file: no row of the old start survives.
                if len(kept) != len(rows) or (first_step is None and os.path.getsize(str(part)) > 0):
                    write_atomic(part, text)
            elif not kept:
                part.unlink()
            elif len(kept) != len(rows):
                renamed = part if part == self.file else self.folder / _part_name(kept[0][1], kept[-1][1])
                write_atomic(renamed, text)
                if renamed != part:
                    part.unlink()

    def append(self, rows: list[dict]) -> None:
        """Add ``rows`` (each with an integer ``step``, in step order, after every row written so far; the
        first may be the step ``cut`` held, which it then replaces)."""
        if not rows:
            return
        text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
        replaces = self.held_step is not None and rows[0]["step"] <= self.held_step
        self.held_step = None
        if not self.remote:
            if replaces:  # one atomic rewrite: the held row is on disk until its replacement is
                kept = [line for line, row in _parse(read_text(self.file)) if row["step"] < rows[0]["step"]]
                write_atomic(self.file, "".join(line + "\n" for line in kept) + text)
                return
            with self.file.open("a") as handle:
                handle.write(text)
            return
        written = self.folder / _part_name(rows[0], rows[-1])
        write_atomic(written, text)  # object stores need no folder made first
        if replaces:  # then the held row goes (killed in between, the reader merges the two)
            self._drop_from(rows[0]["step"], spare=written)


def read_metrics(run_dir) -> list[dict]:
    """One row per step of the run's metrics log, in step order, from either layout; rows of one step
    written twice (a resume) are merged, the later one winning field by field."""
    by_step: dict[int, dict] = {}
    for part in MetricsLog(run_dir).parts():
        for row in read_part(part):
            by_step.setdefault(row["step"], {}).update(row)
    return [by_step[step] for step in sorted(by_step)]
