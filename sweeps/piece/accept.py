"""``python -m sweeps.piece accept OUT``: a piece's records, copied back from a lent machine, checked and
added to the results folder and the ledger.

Each run directory under ``OUT/records/<sweep>/`` is accepted only if its record reads and validates,
says ``finished``, agrees with its metrics log (``scaling.store.record_checks``), is a run of the sweep
as this checkout expands it (its run id, and its ``config.json`` hashing to that id), was trained on
the committed corpus (the fingerprint's data fingerprint) and by clean code: the piece names the commit
it was started from and its source digest equals that commit's. Everything else is refused, one line
each; the accepted runs are copied to ``RESULTS/<sweep>/<run id>/`` and listed in the ledger, with the
piece's timing table.
"""

from __future__ import annotations

import json
import pathlib

from sweeps.piece import ledger as ledger_lib
from sweeps.piece.ledger import LedgerError

PIECE_FORMAT = "piece-v1"
PIECE_KEYS = ("format", "sweep", "commit", "source_digest", "device", "budget_seconds", "wall_seconds", "timing")


def read_piece(out: pathlib.Path) -> dict:
    """``OUT/piece.json``, checked for the keys ``accept`` needs (``LedgerError``, one line, if not)."""
    path = out / "piece.json"
    try:
        piece = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise LedgerError(f"{path}: malformed: {error}") from None
    missing = [key for key in PIECE_KEYS if not isinstance(piece, dict) or key not in piece]
    if missing or piece.get("format") != PIECE_FORMAT:
        raise LedgerError(f"{path}: malformed: not a {PIECE_FORMAT} piece summary (missing {', '.join(missing)})")
    return piece


def dirty_reason(piece: dict, repo: pathlib.Path) -> str | None:
    """Why the piece's code is not the commit it names (one phrase), or None when it is."""
    commit = piece.get("commit") or ""
    if not commit:
        return "the piece names no commit (start it with --commit)"
    try:
        expected = ledger_lib.commit_digest(repo, commit)
    except LedgerError as error:
        return f"commit {commit} is not in this repository ({error})"
    if expected != piece["source_digest"]:
        return f"its code differs from commit {commit} (source digest {piece['source_digest'][:12]}, the commit's " \
               f"{expected[:12]})"
    return None


def check_run(run_dir: pathlib.Path, expected: dict, data_fingerprint: str, commit: str = "") -> str | None:
    """Why the run directory ``run_dir`` cannot be accepted (one phrase), or None."""
    from scaling.config import TrainConfig, config_id, from_dict
    from scaling.store import record_checks, records

    run_id = run_dir.name
    try:
        record = record_checks.read_checked_record(run_dir, run_id)
    except (records.RecordError, records.OutdatedRecord) as error:
        return f"malformed: {error}"
    if record is None:
        return "malformed: no result.json"
    if record.status != "finished":
        return f"not finished (status {record.status})"
    if run_id not in expected:
        return (f"mismatched: {record.name or run_id} is not a run of sweep {record.sweep or '?'} as this checkout "
                "expands it")
    try:
        config = from_dict(TrainConfig, json.loads((run_dir / "config.json").read_text()))
    except (OSError, ValueError) as error:
        return f"malformed: config.json: {error}"
    if config_id(config) != run_id:
        return f"mismatched: config.json hashes to {config_id(config)}, not to its run id"
    if record.data_fingerprint != data_fingerprint:
        return (f"mismatched: trained on data {record.data_fingerprint[:12]}, not the committed corpus "
                f"{data_fingerprint[:12]}")
    if record.code_version.endswith("+dirty") or (commit and record.code_version != commit[:12]):
        return f"dirty: code version {record.code_version}, not the piece's commit {commit[:12]}"
    return None


def accept(out: pathlib.Path, sweep, results: pathlib.Path, ledger_path: pathlib.Path, data_fingerprint: str,
           repo: pathlib.Path, say=print) -> int:
    """Check and add the piece at ``out`` (see the module); returns the exit status: 0 when every record was
    accepted, 1 when any was refused (the others are added all the same)."""
    piece = read_piece(out)
    if piece["sweep"] != sweep.name:
        raise LedgerError(f"{out}: the piece trained sweep {piece['sweep']}, not {sweep.name} (set GPU_DEPTH_STAGE?)")
    ledger = ledger_lib.read(ledger_path)
    expected = {run.run_id: run for run in sweep.expand().runs}
    dirty = dirty_reason(piece, repo)
    accepted, refused = [], 0
    for run_dir in sorted(p for p in (out / "records" / sweep.name).glob("*") if p.is_dir()):
        reason = f"dirty: {dirty}" if dirty else check_run(run_dir, expected, data_fingerprint, piece["commit"])
        if reason is None and run_dir.name in ledger["runs"]:
            reason = "already in the ledger"
        if reason:
            say(f"refused {run_dir}: {reason}")
            refused += 1
            continue
        ledger_lib.copy_record(run_dir, results / sweep.name / run_dir.name)
        record = json.loads((run_dir / "result.json").read_text())
        ledger["runs"][run_dir.name] = {"name": record.get("name", ""), "sweep": sweep.name,
                                        "final_eval_loss": record.get("final_eval_loss"),
                                        "piece": len(ledger["pieces"]) + 1}
        accepted.append(record.get("name") or run_dir.name)
    if accepted or not refused:
        entry = {key: piece.get(key) for key in ("sweep", "stage", "commit", "device", "budget_seconds",
                                                 "wall_seconds", "exit_code", "timing", "left")}
        ledger["pieces"].append({**entry, "accepted": accepted})
        ledger_lib.write(ledger_path, ledger)
    say(f"accepted {len(accepted)} run(s), refused {refused}; ledger {ledger_path}: {len(ledger['runs'])} runs, "
        f"{len(ledger['pieces'])} piece(s)")
    return 1 if refused else 0
