"""Metric tracking: one seam for JSONL files, wandb and the progress bar.

Every metric always goes to the run's metrics log (``metrics.jsonl`` in the
run directory, one JSON object per line, with ``step``; on object stores one
new object per flush: see ``metrics_log.py``). wandb is used on process 0 only; it runs
offline unless online mode is asked for *and* an API key is configured, so a
laptop or CI run never needs an account. The wandb run id is chosen by us and
stored with the checkpoint, so a resumed run continues the same wandb run.
"""

from __future__ import annotations

import math
import os
import pathlib
import shutil
import struct
import sys
import tempfile
import time
from typing import Callable

from etils import epath

from scaling.run import progress
from scaling.store.metrics_log import MetricsLog
from scaling.store.storage import is_remote
from scaling.store.write_behind import WriteBehind, wait_seconds


def wandb_mode(requested: str) -> str:
    """Resolve ``auto`` to ``online`` only when an API key is available, else ``offline``."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = pathlib.Path.home() / ".netrc"
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (netrc.exists() and "api.wandb.ai" in netrc.read_text())
    return "online" if has_key else "offline"


def new_wandb_id() -> str:
    """A fresh wandb run id (12 hex characters); stored with the checkpoint so resumes reuse it."""
    import secrets

    return secrets.token_hex(6)


# What the progress display's time counts: the run record's train_seconds (scaling/store/records.py).
STEPS_CLOCK = "of training (compiling excluded)"


class Tracker:
    """Writes metrics to JSONL (always), wandb (process 0, unless disabled) and a progress display.

    The display is a tqdm bar on a terminal and plain periodic lines otherwise
    (``scaling.run.progress``).

    ``metrics.jsonl`` reads back as exactly one row per step: metrics logged
    at the same step (training loss, then an evaluation) are merged into one
    row, written once a later step is logged or at ``flush``. When a run
    resumes from a checkpoint at step S (``keep_until_step=S``), rows after S,
    left by the interrupted segment, are removed first and the row of step S
    is held so that what the resumed run logs at S merges into it. That row
    stays on disk until the merged one replaces it (``metrics_log.py``), so a
    resume killed before its first write loses nothing. A fresh start (``keep_until_step=None``)
    clears the file. Non-finite values are written as null, so the file is
    strict JSON.

    On object stores the rows are uploaded behind the training loop
    (``write_behind.py``), in order; ``flush(wait=True)`` and ``close`` wait
    for them (at most ``wait_seconds()``): before a checkpoint and before the
    run's record. Local files are appended to at once.
    """

    def __init__(self, run_dir, *, total_steps: int, start_step: int, config: dict, name: str,
                 group: str = "", project: str = "depth-width-scaling", mode: str = "auto",
                 wandb_id: str | None = None, is_main_process: bool = True, show_progress: bool = True,
                 keep_until_step: int | None = None, may_write: Callable[[], bool] | None = None):
        self.run_dir = epath.Path(run_dir)
        # Read before each write of rows: False once another process owns the run (its lease taken over),
        # and the rows are dropped, so a process paused past its lease never writes into the new holder's log.
        self._may_write = may_write or (lambda: True)
        self.is_main = is_main_process
        self._log = MetricsLog(self.run_dir)
        self._rows: dict[int, dict] = {}  # step -> merged metrics not yet written
        self._local = not is_remote(run_dir)  # gs://, s3://, memory:// ... are object stores
        self._writer = None if self._local or not is_main_process else WriteBehind("metrics-writer")
        self.wandb_run = None
        self.wandb_id = wandb_id
        self.mode = wandb_mode(mode)
        if self.is_main:
            self._cut_metrics(keep_until_step)
        if self.is_main:
            self.wandb_run = open_wandb_run(self.run_dir, mode=self.mode, project=project, group=group or None,
                                            name=name, id=wandb_id, config=config)
            self.wandb_id = self.wandb_run.id if self.wandb_run is not None else wandb_id
        self.bar = None
        self._bar_args = None
        if self.is_main and show_progress:
            self._bar_args = dict(total=total_steps, desc=name or "train", unit="step", dynamic_ncols=True,
                                  file=sys.stderr, mininterval=1.0, clock=STEPS_CLOCK)
            self._start_step = start_step
            # The bar shown while compiling is replaced by a fresh one at the first trained step, so the
            # rate and ETA exclude compilation; tqdm's reset() would redraw it at step 0 first.
            self.bar = progress.bar(initial=start_step, leave=False, **self._bar_args)
            self.bar.set_postfix_str("compiling", refresh=True)
            self._bar_timed = False

    def _cut_metrics(self, keep_until_step: int | None) -> None:
        held = self._log.cut(keep_until_step)
        if held is not None:  # pending again: what the resumed run logs there merges in
            self._rows[keep_until_step] = held

    def log(self, step: int, metrics: dict) -> None:
        """Record ``metrics`` (floats, or None for a missing value) at ``step``: JSONL, wandb, progress bar."""
        if not self.is_main:
            return
        values = {k: _plain(v) for k, v in metrics.items()}
        self._rows.setdefault(int(step), {}).update(values)
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in values.items() if v is not None}, step=int(step))
        if self.bar is not None:
            shown = {k: f"{values[k]:.4g}" for k in ("loss", "eval_loss", "tokens_per_second")
                     if isinstance(values.get(k), float)}
            if shown:
                self.bar.set_postfix(shown, refresh=False)
        self.flush(through_step=int(step) - 1)

    def advance(self, steps: int = 1) -> None:
        """Move the progress bar; the first call (after compilation) restarts its clock, so the ETA is real."""
        if self.bar is None:
            return
        if not self._bar_timed:
            self.bar.close()
            self.bar = progress.bar(initial=self._start_step, **self._bar_args)
            self._bar_timed = True
        self.bar.update(steps)

    def end_of_steps(self) -> None:
        """The last step is done: the progress display prints its final line now, so the time it shows is
        the steps' (the run record's ``train_seconds``), not the final evaluation's and checkpoint's too."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def flush(self, through_step: int | None = None, *, wait: bool = False) -> None:
        """Write the rows of steps up to ``through_step`` (all rows if None) to the metrics log; on object
        stores in the background, and with ``wait`` until they are written (``write_behind.WriteFailed``
        if that fails or takes longer than ``wait_seconds()``)."""
        steps = sorted(s for s in self._rows if through_step is None or s <= through_step)
        rows = [{"step": s, **{k: _json_value(v) for k, v in self._rows.pop(s).items()}} for s in steps]
        if self._writer is None:
            if rows and self._may_write():
                self._log.append(rows)
            return
        if rows:
            self._writer.submit(f"metrics rows of steps {steps[0]}-{steps[-1]} in {self.run_dir}",
                                lambda: self._log.append(rows) if self._may_write() else None)
        if wait:
            self._writer.wait(wait_seconds())

    def wait_for_writes(self) -> None:
        """Wait for the rows already flushed to be written (no new ones are flushed: safe from another
        thread than the one logging); ``write_behind.WriteFailed`` as ``flush(wait=True)``."""
        if self._writer is not None:
            self._writer.wait(wait_seconds())

    def discard_pending(self) -> None:
        """Drop rows not yet written (this process no longer owns the run's files)."""
        self._rows.clear()
        if self._writer is not None:
            self._writer.discard()

    def pending(self, step: int) -> dict:
        """The metrics logged at ``step`` and not yet written (a copy; empty if none)."""
        return dict(self._rows.get(int(step), {}))

    def summary(self, values: dict) -> None:
        """Set wandb summary values (final metrics) for this run; no-op without wandb."""
        if self.wandb_run is not None:
            for key, value in values.items():
                self.wandb_run.summary[key] = _plain(value)

    def close(self, exit_code: int = 0) -> None:
        """Write every pending row, wait for them, and finish the wandb run (safe to call twice, and after a
        failure)."""
        try:
            self.flush(wait=True)
        finally:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            if self.wandb_run is not None:
                run, self.wandb_run = self.wandb_run, None
                finish_wandb_run(run, self.run_dir, exit_code)


def open_wandb_run(directory, *, mode: str, **fields):
    """The wandb run ``fields`` describe (``project``, ``group``, ``name``, ``id``, ``config``, ...), opened
    as every run of this project opens one: resumed if its id exists, quiet, its files under ``directory``
    when that is local (else wandb's default). None when ``mode`` resolves to disabled (``wandb_mode``) or
    wandb keeps refusing the id (``_init_wandb``)."""
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    import wandb

    # A gs:// run's files are written to a local folder first (wandb writes only local files), and
    # finish_wandb_run copies an offline run's beside the run's records.
    local = tempfile.mkdtemp(prefix="scaling-wandb-") if is_remote(directory) else str(directory)
    # create_new: the runs of a pack (scaling.run.train.run_pack) are open at once, each its own wandb run.
    return _init_wandb(dict(resume="allow", mode=mode, dir=local, reinit="create_new",
                            settings=wandb.Settings(silent=True, console="off"), **fields))


def finish_wandb_run(run, directory, exit_code: int = 0) -> None:
    """Finish the wandb ``run`` opened for ``directory`` (``open_wandb_run``). An offline run of a ``gs://``
    directory is then copied there, to ``<directory>/wandb/offline-run-.../``: the disk it was written to
    (a cloud slice's) goes with the machine, the bucket stays, and ``wandb sync`` uploads it later."""
    folder = pathlib.Path(run.dir).parent  # <dir>/wandb/offline-run-<time>-<id>, holding files/ and run-<id>.wandb
    transaction_log = pathlib.Path(run.settings.sync_file)
    run.finish(exit_code=exit_code)
    # finish() returns once wandb's service has the exit record, but the service writes its buffered records
    # to the run's .wandb file only when it closes the run's stream, which it does after finish() returns
    # (the close request is not waited on). Under load that write comes seconds later, so a copy made (or a
    # file read) at once would lack the history: wait until the file holds the exit record. Once a wait
    # has timed out (the service is stuck), later runs of this process do not wait: a pack's runs finish
    # one after another, and a stuck service must not hold each of them up.
    global _SERVICE_STUCK
    if run.offline and not _SERVICE_STUCK and not wait_for_transaction_log(transaction_log, FINISH_WRITE_SECONDS):
        _SERVICE_STUCK = True
        print(f"warning: wandb's log {transaction_log} still lacks its exit record {FINISH_WRITE_SECONDS:.0f} s "
              "after the run finished (later runs of this process will not wait); metrics.jsonl holds every "
              "logged metric", file=sys.stderr)
    if not (is_remote(directory) and run.offline):
        return
    from scaling.store.storage import copy_folder_to

    try:
        copy_folder_to(folder, f"{os.fspath(directory).rstrip('/')}/wandb/{folder.name}")
    except OSError as error:  # the records and metrics.jsonl hold everything: never fail a run over this
        print(f"warning: offline wandb run {folder} not copied to {directory}: {error}", file=sys.stderr)
        return
    shutil.rmtree(folder.parent.parent, ignore_errors=True)  # open_wandb_run's local folder


# How long finish_wandb_run waits for wandb's service to write a finished offline run's .wandb file
# (seconds), and whether a wait of this process has already timed out.
FINISH_WRITE_SECONDS = 60.0
_SERVICE_STUCK = False


def transaction_log_records(path):
    """The records of a wandb transaction log (a run's ``run-<id>.wandb`` file), in order, as
    ``wandb_internal_pb2.Record`` messages. The file is a 7-byte header, then 32 KiB blocks of chunks, each
    framed by a 4-byte checksum, a 2-byte length and a 1-byte kind (full, first, middle, last), the
    leveldb log format; wandb ships no Python reader of it since its service moved to Go. A chunk cut off
    at the end of a file still being written ends the records."""
    from wandb.proto import wandb_internal_pb2

    raw, position, block, pending = pathlib.Path(path).read_bytes(), 7, 32768, b""
    while position + 7 <= len(raw):
        if block - position % block < 7:  # too little room left in the block for a chunk header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        if position + 7 + length > len(raw):
            return
        chunk = raw[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        elif kind in (2, 3):  # the first or a middle chunk of a record spanning blocks
            pending += chunk


def wait_for_transaction_log(path, seconds: float) -> bool:
    """Wait up to ``seconds`` until the wandb transaction log at ``path`` holds its run's exit record (what
    ``run.finish`` sends last); True when it does."""
    from google.protobuf.message import DecodeError

    deadline, parsed_size = time.monotonic() + seconds, None
    while True:
        try:
            size = os.path.getsize(path)
            if size != parsed_size:  # parse again only once the file has grown
                parsed_size = size
                if any(record.WhichOneof("record_type") == "exit" for record in transaction_log_records(path)):
                    return True
        except (OSError, DecodeError):  # not written yet, or caught mid-write
            parsed_size = None
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _init_wandb(kwargs: dict, attempts: int = 6, wait_seconds: float = 5.0):
    """``wandb.init`` that survives a crashed predecessor.

    After a hard kill, the dead process's wandb service can hold the run id
    for a little while ("run ID ... is in use"). Retry for ~30 s, then carry
    on without wandb (metrics.jsonl still has everything) rather than lose
    the training run.
    """
    import wandb

    for attempt in range(attempts):
        try:
            return wandb.init(**kwargs)
        except Exception as error:  # noqa: BLE001 - wandb raises several private error types
            if "in use" not in str(error) or attempt == attempts - 1:
                print(f"warning: wandb disabled for this run: {error}", file=sys.stderr)
                return None
            time.sleep(wait_seconds)
    return None


def _plain(value):
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
