"""The ledger of a sweep trained in pieces, and the check that adds a piece's records to it.

The ledger (``results/gpu_depth/ledger.json`` for the depth experiment) is committed. It lists every
finished run that was accepted (by run id: name, sweep, loss, the piece that trained it) and every
piece that came back (its card, commit, budget, wall clock, and timing table: ``sweeps.piece.run``).
A piece reads it to skip the finished runs and to start from the speed earlier pieces measured on
the same card; ``accept`` adds what a piece wrote under ``$OUT`` once it is copied back here,
refusing, one line each, what is malformed (unreadable, not finished, disagreeing with its metrics
log), dirty (trained by code other than the commit the piece names) or mismatched (not a run of
the sweep, another config, another corpus).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess

from sweeps.piece.plan import Measured

FORMAT = "piece-ledger-v1"
RECORD_FILES = ("config.json", "result.json", "metrics.jsonl")
SOURCE_FOLDERS = ("scaling", "sweeps", "analysis")  # the code a piece's source digest covers


class LedgerError(ValueError):
    """A ledger or a piece's output that cannot be read; one line."""


def empty() -> dict:
    return {"format": FORMAT, "runs": {}, "pieces": []}


def read(path: pathlib.Path) -> dict:
    """The ledger at ``path`` (an empty one if the file does not exist)."""
    if not path.exists():
        return empty()
    try:
        ledger = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise LedgerError(f"ledger {path}: unreadable: {error}") from None
    if not isinstance(ledger, dict) or ledger.get("format") != FORMAT or not isinstance(ledger.get("runs"), dict) \
            or not isinstance(ledger.get("pieces"), list):
        raise LedgerError(f"ledger {path}: not a {FORMAT} ledger (format, runs, pieces)")
    return ledger


def write(path: pathlib.Path, ledger: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n")


def finished_ids(ledger: dict) -> set[str]:
    return set(ledger["runs"])


def measured(ledger: dict, device: str) -> list[Measured]:
    """The packs earlier pieces timed on ``device`` (their timing tables), for the speed model."""
    rows = []
    for piece in ledger["pieces"]:
        if piece.get("device") != device:
            continue
        for row in piece.get("timing", []):
            rows.append(Measured(row["flops_per_step"], row["step_seconds"], row["overhead_seconds"]))
    return rows


def state_line(ledger: dict, path, runs) -> str:
    """One line for dry-run: how many of ``runs`` the ledger holds, and which pieces came back."""
    ids = {run.run_id for run in runs}
    done = len(ids & finished_ids(ledger))
    devices = sorted({piece.get("device", "?") for piece in ledger["pieces"]})
    records = (f"{len(ledger['pieces'])} piece(s) came back ({', '.join(devices)})" if ledger["pieces"]
               else "no piece has come back: no records from a device")
    return f"ledger {path}: {done} of {len(ids)} runs finished; {records}"


def _digest(files) -> str:
    """SHA-256 over (relative path, bytes) pairs, in the order given."""
    digest = hashlib.sha256()
    for relative, data in files:
        digest.update(f"{relative}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def source_digest(root: pathlib.Path) -> str:
    """SHA-256 over the ``.py`` files of ``SOURCE_FOLDERS`` under ``root`` (sorted relative paths and bytes):
    what a piece ran, on a machine without git."""
    paths = sorted(p.relative_to(root).as_posix() for folder in SOURCE_FOLDERS
                   for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)
    return _digest((relative, (root / relative).read_bytes()) for relative in paths)


def _git(root: pathlib.Path, *arguments: str) -> bytes:
    done = subprocess.run(["git", *arguments], cwd=root, capture_output=True)
    if done.returncode != 0:
        raise LedgerError(f"git {' '.join(arguments)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _committed_python_files(root: pathlib.Path, commit: str) -> list[str]:
    listed = _git(root, "ls-tree", "-r", "--name-only", commit, "--", *SOURCE_FOLDERS).decode().splitlines()
    return sorted(path for path in listed if path.endswith(".py"))


def commit_digest(root: pathlib.Path, commit: str) -> str:
    """``source_digest`` of ``commit``'s files (read with git, not from the work tree)."""
    paths = _committed_python_files(root, commit)
    return _digest((relative, _git(root, "show", f"{commit}:{relative}")) for relative in paths)


def copy_record(source: pathlib.Path, destination: pathlib.Path) -> None:
    """A run's record files (``RECORD_FILES``) from ``source`` into ``destination``."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, destination / name)
