"""The run record: what one training run leaves behind in ``<run dir>/result.json``.

This module is the record's single definition. The trainer writes it, the
launcher writes it when a run fails before the trainer could, and the
analysis reads it; all of them go through ``RunRecord``, ``write_record``
and ``read_record`` here. It imports neither JAX nor anything heavy, so the
analysis and the launcher's ``status`` can use it on a laptop.

Guarantees:
- ``write_record`` is atomic: a reader sees the old record or the new one,
  never half of one (a temporary file renamed over the old one locally; a
  single object upload, which object stores apply whole, on ``gs://``).
- ``read_record`` validates types and values and raises ``RecordError``
  naming the file and the problem, so one damaged record can be reported
  and skipped instead of stopping a whole sweep.
- ``schema_version`` says which fields a record has. Version 2 (this one)
  requires what the analysis groups runs by (``point_id``, ``lr_rule``,
  ``peak_lr``, ``planned_steps``), which version 1 left optional. A
  version-1 record is refused with one line naming the command that
  upgrades it in place, once (``python -m scaling.migrate_records DIR``).
  Optional fields added later (``train_seconds``, ``mfu``, the ``estimate*``
  fields, ``parallelism``) keep the version: a record
  without one reads as before, with the field None.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

SCHEMA_VERSION = 2
MIGRATE_COMMAND = "python -m scaling.migrate_records"
RECORD_FILE = "result.json"
# "stopped": SIGTERM or Ctrl-C ended it after saving a checkpoint (resumable); not a failure.
STATUSES = ("running", "finished", "diverged", "failed", "stopped")


class RecordError(ValueError):
    """A run record that cannot be read or is not valid; the message names the file."""


class OutdatedRecord(ValueError):
    """A record of an older schema version: valid once, to be upgraded (``MIGRATE_COMMAND``), never
    read as if it were damaged (a launcher would train its run again)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run's outcome and identity.

    Units: losses in nats per predicted token (``*_bits`` in bits), sizes in
    parameters (``params_non_embedding`` is N = 12·L·d²), ``tokens`` in
    training tokens actually consumed. Time, in seconds of wall clock summed
    over every segment of a resumed run (an interrupted segment's time after
    its last checkpoint is lost with it), comes in two measures:
    ``wall_seconds`` is the whole run: loading the data, compiling, every
    evaluation and checkpoint, the steps; ``train_seconds`` only the steps,
    from the moment the train step had compiled to the last step (the
    periodic logging, evaluations and checkpoints between steps included,
    the first evaluation and the final one with its checkpoint not). Records
    written before ``train_seconds`` existed have None. ``mfu`` is the
    trainer's model FLOP utilisation over ``train_seconds``
    (``scaling.model.flops.model_flops_utilization``); ``estimated_step_seconds`` and
    ``estimated_mfu`` what the preflight expected of the run on the slice
    ``estimate_source`` names ("" when no preflight estimate was kept, like
    ``data_fingerprint`` and ``code_version``; ``sweeps.preflight.estimate_store``). The three numbers are
    None, and the source "", in records written before them. ``parallelism`` is the mode the preflight
    chose and the run trained in (``data``, ``fsdp``, ``packed``: ``sweeps.preflight.parallelism``), "" when
    the run trained on its sweep's own mesh (and in records written before the field). ``point_id`` is the run id of the
    same config with the seed left out: runs that share it differ only by
    seed, so the analysis may pool them. ``peak_lr`` is the config's peak
    learning rate (``lr_rule`` scales it per width: the config's
    ``optim.lr_rule``, or ``parametrization=mup`` / ``parametrization=completep``
    when a parametrization sets the rates), ``planned_steps`` the
    optimiser steps the config asks for (``steps``: those taken).
    """

    run_id: str
    status: str
    depth: int
    width: int
    seed: int
    params_non_embedding: int
    point_id: str
    lr_rule: str
    peak_lr: float
    planned_steps: int
    name: str = ""
    sweep: str = ""
    heads: int | None = None
    params_total: int | None = None
    params_embedding: int | None = None
    peak_lr_hidden: float | None = None
    data_fingerprint: str = ""
    code_version: str = ""
    tokens_per_step: int | None = None
    # What training reached: steps and tokens, then losses in nats per token (accuracy and bits: classification).
    steps: int = 0
    tokens: int = 0
    initial_eval_loss: float | None = None
    final_eval_loss: float | None = None
    final_train_loss: float | None = None
    final_eval_accuracy: float | None = None
    final_eval_bits: float | None = None
    # How long it took (wall: everything; train: the steps alone) and the model FLOP utilisation reached.
    wall_seconds: float = 0.0
    train_seconds: float | None = None
    mfu: float | None = None
    # Runs trained together as one program with this one, itself included (``scaling.run.train.run_pack``; 1: alone).
    # A packed run's ``mfu`` and tokens per second are its own tokens over the pack's time: its share.
    pack_size: int = 1
    # [[first step, pack size], ...]: the pack size each segment of a resumed run trained in (None in records
    # written before the field). A run that resumes in a pack of another size follows its uninterrupted
    # course to float32 rounding only (the batched step sums in another order).
    pack_segments: list | None = None
    # Final losses (nats per token) of the evaluations registered on other data (``scaling.run.loop.Evaluation``),
    # by name; None without any. Their rows are ``NAME/eval_loss`` in the metrics log.
    final_evaluations: dict | None = None
    # The run whose parameters this one started from (``TrainConfig.init_from``), by run id; None: its own init.
    parent_run_id: str | None = None
    # What the preflight expected of it (``sweeps.preflight.estimate_store``), beside the measured ``mfu``.
    estimated_step_seconds: float | None = None
    estimated_mfu: float | None = None
    estimate_source: str = ""
    parallelism: str = ""  # the preflight's mode the run trained in; "" for the sweep's own mesh
    wandb_id: str | None = None
    error: str | None = None
    log_file: str | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is invalid: allowed one of {', '.join(STATUSES)}")
        for name in ("depth", "width", "params_non_embedding", "planned_steps"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
        for name in ("seed", "steps", "tokens"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 0")
        for name in ("run_id", "point_id", "lr_rule"):
            value = getattr(self, name)
            if not (isinstance(value, str) and value):
                raise ValueError(f"{name}={value!r} is invalid: allowed a non-empty string")
        if not (isinstance(self.peak_lr, (int, float)) and not isinstance(self.peak_lr, bool)
                and math.isfinite(self.peak_lr) and self.peak_lr > 0):
            raise ValueError(f"peak_lr={self.peak_lr!r} is invalid: allowed a finite number > 0")
        for name in ("initial_eval_loss", "final_eval_loss", "final_train_loss", "final_eval_bits"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
                raise ValueError(f"{name}={value!r} is invalid: allowed a number or null")
        for name in ("wall_seconds", "train_seconds"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and value >= 0):
                raise ValueError(f"{name}={value!r} is invalid: allowed a number of seconds >= 0"
                                 + (" or null" if name == "train_seconds" else ""))
        for name in ("mfu", "estimated_step_seconds", "estimated_mfu"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r} is invalid: allowed a finite number > 0 or null")
        for name in ("estimate_source", "parallelism"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: allowed a string")
        if self.status == "finished":
            loss = self.final_eval_loss
            if loss is None or not math.isfinite(loss) or loss < 0:
                raise ValueError(f"final_eval_loss={loss!r} is invalid for a finished run: allowed a finite "
                                 "number >= 0")
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version={self.schema_version!r} is not supported: this code writes and "
                             f"reads version {SCHEMA_VERSION}")

    def to_json(self) -> str:
        """Strict JSON (non-finite numbers become null), keys sorted."""
        return json.dumps({k: _finite_or_none(v) for k, v in dataclasses.asdict(self).items()},
                          indent=2, sort_keys=True, allow_nan=False)

    def replace(self, **changes) -> "RunRecord":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


FIELDS = tuple(field.name for field in dataclasses.fields(RunRecord))


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _path(path):
    from etils import epath

    return epath.Path(path)


def record_path(run_dir):
    """``<run_dir>/result.json`` as an ``etils.epath.Path``."""
    return _path(run_dir) / RECORD_FILE


def migrate_hint(source: str) -> str:
    """The command that upgrades the record ``source`` names (with the folder holding its run when
    ``source`` is a ``result.json`` path)."""
    if source.endswith("/" + RECORD_FILE):
        runs = source[:-len(RECORD_FILE) - 1].rstrip("/").rpartition("/")[0]
        return f"{MIGRATE_COMMAND} {runs or '.'}"
    return f"{MIGRATE_COMMAND} DIR"


def from_dict(data: Any, source: str = "<record>") -> RunRecord:
    """Validate a decoded record; raises ``RecordError`` naming ``source``, or ``OutdatedRecord`` (one
    line naming the upgrade command) for a record of an older schema version."""
    if not isinstance(data, dict):
        raise RecordError(f"{source}: not a run record (a JSON {type(data).__name__}, expected an object)")
    version = data.get("schema_version", 1)  # records before the field existed are version 1
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        raise OutdatedRecord(f"{source}: a run record of schema version {version}, this code reads "
                             f"{SCHEMA_VERSION}; upgrade the records once with: {migrate_hint(source)}")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise RecordError(f"{source}: schema_version={version} is newer than this code reads "
                          f"({SCHEMA_VERSION}); update the code")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise RecordError(f"{source}: unknown field(s) {unknown}; is it from a newer version of this code?")
    try:
        return RunRecord(**data)
    except TypeError as error:  # a required field is missing
        raise RecordError(f"{source}: {error}") from None
    except ValueError as error:
        raise RecordError(f"{source}: {error}") from None


def read_record(run_dir) -> RunRecord | None:
    """The run's record, None if it has none yet, ``RecordError`` if it is damaged or invalid,
    ``OutdatedRecord`` if it is of an older schema version."""
    path = record_path(run_dir)
    try:
        if not path.exists():
            return None
        text = path.read_text()
    except OSError as error:
        raise RecordError(f"{path}: cannot be read: {error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise RecordError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}); truncated?") from None
    return from_dict(data, str(path))


def find_records(root) -> list:
    """The ``result.json`` files at any depth under ``root`` (local or ``gs://``), as
    ``etils.epath.Path``s, sorted; one listing on an object store."""
    from scaling.store.storage import find

    return find(root, RECORD_FILE)


def write_record(run_dir, record: RunRecord) -> None:
    """Write ``record`` atomically to ``<run_dir>/result.json`` (``scaling.store.storage.write_atomic``)."""
    from scaling.store.storage import write_atomic

    write_atomic(record_path(run_dir), record.to_json())
