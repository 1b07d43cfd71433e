"""Upgrade run records to the current schema version, in place and once.

    python -m scaling.migrate_records results/cpu_depth results/log_length
    python -m scaling.migrate_records gs://BUCKET/sweeps/paper --dry-run

Every ``result.json`` at any depth under each directory (local or ``gs://``)
is read; a record of an older schema version is rewritten at the current one
(``scaling.store.records.SCHEMA_VERSION``), one whose version is current is left
alone and not written, so running the command again, e.g. after more old
records arrived, costs one read per record and rewrites only the new ones.
Each rewrite is validated by ``scaling.store.records`` first and is atomic
(``scaling.store.storage.write_atomic``): a reader sees the old record or the new
one. Run ids never change: the record's ``run_id`` is copied, and the run id
hashes the config (``scaling.config.config_id``), which is not touched. Run
it while no trainer of the older code writes to the directory (a record
rewritten by that trainer in between would come back in the old version).

Version 1 -> 2: version 1 left ``point_id``, ``lr_rule``, ``peak_lr`` and
``planned_steps`` optional, and the earliest records lack them. A missing one
is taken from the ``config.json`` the trainer wrote beside the record, as the
trainer computes it (``scaling.run.train``): ``point_id`` is the run id of the
config with seed 0, ``peak_lr`` and ``lr_rule`` the optimiser's,
``planned_steps`` the config's ``steps``. Values the record has are kept.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import sys

from scaling import cli
from scaling.store import records
from scaling.store.storage import StorageAccessError, check_access

# Version 2's required fields that version 1 left optional, each as the config gives it.
_FROM_CONFIG = ("point_id", "lr_rule", "peak_lr", "planned_steps")
_READERS = 16  # records read at once: hides an object store's latency per request


class MigrationError(ValueError):
    """A record that cannot be upgraded; the message names the file and what is missing."""


def _from_config(config_text: str, source: str) -> dict:
    """``_FROM_CONFIG``'s fields as the trainer derives them from the run's config.json text."""
    from scaling.config import TrainConfig, config_id, from_dict

    try:
        config = from_dict(TrainConfig, json.loads(config_text))
    except ValueError as error:  # also JSONDecodeError
        raise MigrationError(f"{source}: its config.json cannot be read as a config ({error})") from None
    return {"point_id": config_id(dataclasses.replace(config, seed=0)), "lr_rule": config.optim.lr_rule,
            "peak_lr": config.optim.peak_lr, "planned_steps": config.steps}


def upgrade(data: dict, config_text, source: str = "<record>") -> dict:
    """The version-2 form of the version-1 record ``data`` (a decoded result.json).

    ``config_text`` is a function returning the run's config.json text (or None if there is none),
    called only when a field must be filled from it. Raises ``MigrationError`` if the record is not
    version 1 or a required field cannot be filled.
    """
    if not isinstance(data, dict) or data.get("schema_version", 1) != 1:
        found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise MigrationError(f"{source}: not a version-1 run record (schema_version {found!r})")
    upgraded = dict(data, schema_version=2)
    missing = [name for name in _FROM_CONFIG if upgraded.get(name) in (None, "")]
    if missing:
        text = config_text()
        if text is None:
            raise MigrationError(f"{source}: lacks {', '.join(missing)} and has no config.json beside it to "
                                 "take them from")
        filled = _from_config(text, source)
        upgraded.update({name: filled[name] for name in missing})
    return upgraded


def migrate_file(path, *, write: bool = True) -> str:
    """Bring the record at ``path`` (an ``etils.epath.Path`` to a result.json) to the current version.

    Returns ``"current"`` (nothing to do, nothing written) or ``"migrated"`` (rewritten, or only
    checked when ``write`` is False). Raises ``MigrationError`` or ``records.RecordError`` naming the file.
    """
    source = str(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise records.RecordError(f"{source}: cannot be read as JSON ({type(error).__name__}: {error})") from None
    if isinstance(data, dict) and data.get("schema_version") == records.SCHEMA_VERSION:
        return "current"

    def config_text():
        config = path.parent / "config.json"
        return config.read_text() if config.exists() else None

    record = records.from_dict(upgrade(data, config_text, source), source)
    if write:
        records.write_record(path.parent, record)
    return "migrated"


def migrate(root, *, write: bool = True) -> tuple[collections.Counter, list[str]]:
    """Migrate every record under ``root``: counts per outcome (``migrated``, ``current``, ``failed``)
    and one line per record that could not be migrated (the others are migrated regardless)."""
    counts, problems = collections.Counter(), []
    found = records.find_records(root)
    with concurrent.futures.ThreadPoolExecutor(_READERS) as pool:
        futures = [pool.submit(migrate_file, path, write=write) for path in found]
        for future in futures:
            try:
                counts[future.result()] += 1
            except (MigrationError, records.RecordError) as error:
                counts["failed"] += 1
                problems.append(str(error))
    return counts, problems


def main(argv=None) -> int:
    """Run the command line; returns 0 when every record is current afterwards, 1 otherwise, 2 for no records."""
    from scaling.entry import prepare_process

    prepare_process()  # before JAX starts its backend or a storage client
    parser = cli.Parser(
        prog="python -m scaling.migrate_records",
        description=f"Rewrite the run records (result.json) under each DIR at schema version "
                    f"{records.SCHEMA_VERSION}, in place; records already at it are left alone.")
    parser.add_argument("directories", nargs="+", metavar="DIR", help="a sweep directory (local or gs://)")
    parser.add_argument("--dry-run", action="store_true", help="check and count, write nothing")
    args = parser.parse_args(argv)
    try:
        check_access(*args.directories)  # one line for an unusable bucket, not a minute of client retries
    except StorageAccessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    code = 0
    for root in args.directories:
        counts, problems = migrate(root, write=not args.dry_run)
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        total = sum(counts.values())
        if not total:
            print(f"error: {root}: no {records.RECORD_FILE} records found under this directory", file=sys.stderr)
            code = max(code, 2)
            continue
        verb = "to migrate" if args.dry_run else "migrated"
        print(f"{root}: {total} records: {counts['migrated']} {verb} to version {records.SCHEMA_VERSION}, "
              f"{counts['current']} already current" + (f", {counts['failed']} failed" if counts["failed"] else ""))
        if counts["failed"]:
            code = max(code, 1)
    return code


if __name__ == "__main__":
    sys.exit(main())
