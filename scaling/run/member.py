"""One run's own resources while it trains, where it stands in the loop, and its one ending.

A ``Member`` is everything that belongs to one run and to no other, whether
it trains alone or in a pack (``scaling.run.loop``): its directory and the
user's config, its lease, its record, its checkpoints and their background
saver, its tracker, and its loop state (where it started, its losses, its
last saved step, its clocks). What the loop shares (the program, the data
pipeline, the signal ``Stop``) belongs to no member.

- ``Member.open`` takes the run's lease and begins its ending; ``begin``
  fills in the resolved config (its vocabulary is the tokenizer's) and the
  data's fingerprint. The record's identity comes from the user's config
  (``config.json``, written at once: the run id hashes it), its parameter
  counts from the resolved one.
- The lease is the member's own: ``check_lease`` raises ``LeaseLost`` once
  another process took the run over, and the tracker writes no metrics row
  once the lease is not held (read before each write), so a holder paused
  past its lease never writes into a run it no longer owns.
- ``conclude`` (a run that trained to its end: ``finished`` or ``diverged``)
  and ``end`` (a run ended by an exception) are its one end: ``scaling.run.ending``
  decides the status and exit codes, and the member carries them out in one
  order: the metrics rows written (dropped once the lease is lost), the
  record written, the tracker finished with its exit code; then the
  checkpoints, the saver and the lease are closed. A failure while ending a
  run that already failed or stopped is a warning: it never replaces the
  first error. ``outcome`` is then the record, or the exception that ended it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import threading
import time
from typing import NamedTuple, Union

import jax
from etils import epath

from scaling import multihost
from scaling.config import TrainConfig, config_id, to_dict
from scaling.model import budget, optim as optim_lib
from scaling.run.ending import AlreadyFinished, Ending, as_raised, ending
from scaling.run.stopping import LeaseLost, Preempted, Stop
from scaling.run.track import Tracker, new_wandb_id
from scaling.store import lease as lease_lib, record_checks, records, rundir
from scaling.store.background_save import BackgroundSaver
from scaling.store.checkpoints import Checkpoints, abandoned_writes
from scaling.store.storage import is_remote, write_atomic

# The runs of a pack save behind the loop on threads of their own. Their orbax writes to one bucket at once
# failed on the storage emulator ("Error reading byte range" of the OCDBT files a write had just made), so
# they take turns: the loop still never waits, and each run's saver still keeps only its newest checkpoint.
_BEHIND = threading.Lock()

# What a member ends with: its record, or the exception that ended it.
Outcome = Union[records.RunRecord, BaseException]


class Start(NamedTuple):
    """Where a run segment starts: the state, the checkpoint's ``meta`` (wandb id, initial eval loss,
    wall and training seconds so far, pack segments), its step, and whether it was restored."""

    state: dict | None
    meta: dict
    step: int
    resumed: bool


def fresh_meta() -> dict:
    """A new run's checkpoint metadata: a new wandb id, nothing measured yet."""
    return {"wandb_id": new_wandb_id(), "initial_eval_loss": None, "wall_seconds": 0.0, "train_seconds": 0.0}


@contextlib.contextmanager
def run_lease(run_dir: epath.Path):
    """The run's lease, held while inside. None with several processes: pod-wide jobs agree through the
    launcher instead, since only process 0 could hold a lease."""
    if multihost.process_count() > 1:
        yield None
        return
    held = lease_lib.Lease(run_dir).acquire()
    try:
        yield held
    finally:
        if not held.lost:
            held.release()


def finished_record(run_dir: epath.Path, run_id: str) -> records.RunRecord | None:
    """The run's record if it already finished (process 0's reading, on every process), else None.
    A record that is not run ``run_id``'s, or whose final loss the metrics log does not hold, is not trusted."""
    try:
        previous = record_checks.read_checked_record(run_dir, run_id)
    except records.RecordError as error:
        print(f"warning: {error}; training the run again (resuming from its checkpoints)", file=sys.stderr)
        previous = None
    finished = previous is not None and previous.status == "finished"
    agreed = multihost.broadcast_from_process_0(finished)  # hosts may see the record at different times
    if agreed and not finished:
        raise RuntimeError(f"process 0 reports run {run_dir.name} finished, but this host cannot read "
                           "its result.json yet")
    return previous if agreed else None


class Member:
    """One run of a training loop: its resources (see the module) and its place in the loop's program."""

    def __init__(self, run_dir: epath.Path, config: TrainConfig, lease, stop: Stop, estimate: dict | None = None):
        self.run_dir, self.config, self.lease, self.stop = run_dir, config, lease, stop
        self.estimate = dict(estimate or {})  # what the preflight expected of the run, kept in its record
        self.started = time.perf_counter()  # wall seconds: the whole run, loading the data included
        self.resolved: TrainConfig | None = None  # ``config`` with the tokenizer's vocabulary (``begin``)
        self.data_fingerprint = ""
        self.checkpoints: Checkpoints | None = None
        self.saver: BackgroundSaver | None = None
        self.tracker: Tracker | None = None
        self.code_version = rundir.code_version()
        self.outcome: Outcome | None = None
        # The loop's state of this run (scaling.run.loop): its position in the program, where it started, ...
        self.index = 0  # its place on the program's run axis
        self.order = 0  # its place in the caller's list of runs
        self.start: Start | None = None
        self.last_loss = self.eval_loss = None
        self.final_accuracy: float | None = None
        self.evaluations: dict[str, float | None] = {}  # named evaluations' final losses (scaling.run.loop)
        self.saved_step: int | None = None
        self.parent_run_id: str | None = None  # the run whose parameters a fresh start took (init_from)
        self.earlier_seconds = (0.0, 0.0)  # (wall, training) seconds of the run's earlier segments
        self._closing = contextlib.ExitStack()  # closed when the run has ended, the last opened first
        if jax.process_index() == 0:  # the user's config: what the run id hashes and a rerun compares
            write_atomic(run_dir / "config.json", json.dumps(to_dict(config), indent=2, sort_keys=True))

    @classmethod
    def open(cls, config: TrainConfig, run_dir: epath.Path, stop: Stop, estimate: dict | None = None) -> "Member":
        """Take the run's lease and begin its ending; ``AlreadyFinished`` (with the record) or an
        ``ending.REFUSED`` error, with nothing held, if it cannot train here."""
        contexts = contextlib.ExitStack()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            rundir.check_run_dir(run_dir, config)
            lease = contexts.enter_context(run_lease(run_dir))
            finished = finished_record(run_dir, config_id(config))
            if finished is not None:
                raise AlreadyFinished(finished)
            member = cls(run_dir, config, lease, stop, estimate)
        except BaseException:
            contexts.close()
            raise
        member._closing.push(contexts)  # the lease is released last
        return member

    @property
    def active(self) -> bool:
        """True until the run has ended (``outcome`` set)."""
        return self.outcome is None

    @property
    def lease_lost(self) -> bool:
        """True once the heartbeat (or a read) found the run's lease taken over."""
        return self.lease is not None and self.lease.lost

    def check_lease(self, *, read_now: bool = False) -> None:
        """``LeaseLost`` if the run's lease was taken over: from the heartbeat's flag (free, every step),
        and with ``read_now`` from the lease itself (before a checkpoint or the record is written)."""
        if self.lease is not None and (self.lease.lost or (read_now and not self.lease.still_held())):
            raise LeaseLost(f"another process took over the lease of {self.run_dir}; stopped without writing to it")

    def may_write(self) -> bool:
        """Whether this process still owns the run's files (its lease read now; always without a lease)."""
        return self.lease is None or self.lease.still_held()

    def begin(self, resolved: TrainConfig, data_fingerprint: str) -> None:
        """The run's resolved config (its model's vocabulary is the tokenizer's) and its data's fingerprint."""
        self.resolved, self.data_fingerprint = resolved, data_fingerprint

    def record(self, status: str, **fields) -> records.RunRecord:
        """The run's record with ``status`` and ``fields``: its identity from the user's config, its sizes
        from the resolved config (parameter counts None before the config is resolved)."""
        config, model = self.config, (self.resolved or self.config).model
        counts = budget.count_params(model) if self.resolved is not None else {}
        return records.RunRecord(
            run_id=config_id(config), status=status, depth=model.depth, width=model.width, seed=config.seed,
            params_non_embedding=budget.non_embedding_params(model.depth, model.width), name=config.name,
            sweep=config.sweep_name, point_id=config_id(_without_seed(config)), heads=model.heads,
            params_total=counts.get("total"), params_embedding=counts.get("embedding"),
            lr_rule=optim_lib.rule_name(config.optim), peak_lr=config.optim.peak_lr,
            peak_lr_hidden=optim_lib.learning_rates(config.optim, model)["hidden"],
            code_version=self.code_version, data_fingerprint=self.data_fingerprint, planned_steps=config.steps,
            parent_run_id=self.parent_run_id, **{"tokens_per_step": config.tokens_per_step, **self.estimate, **fields})

    def open_checkpoints(self, abstract_state) -> Checkpoints:
        """The run's checkpoints (closed when the run has ended); a stop abandons a wait for storage. On
        object stores (one process) periodic checkpoints are saved behind the loop (``save_behind``)."""
        stop = self.stop
        self.checkpoints = Checkpoints(self.run_dir / "checkpoints", self.config.keep_checkpoints, abstract_state,
                                       should_stop=lambda: stop.requested, lease=self.lease)
        self.on_close(self.checkpoints.close)
        # Not with several processes: a save is collective there, and processes must not skip different steps.
        if is_remote(str(self.checkpoints.directory)) and multihost.process_count() == 1:
            self.saver = BackgroundSaver(self._write_behind, name=f"checkpoint-saver-{self.run_dir.name}")
            self.on_close(self._close_saver)
        return self.checkpoints

    def open_tracker(self, start_step: int, meta: dict, resumed: bool, show_progress: bool) -> Tracker:
        """The run's tracker from ``start_step`` (``meta``: the checkpoint's, with the wandb id); rows past a
        restored step were logged by a segment whose later state is lost, and are redone."""
        config = self.resolved or self.config
        self.tracker = Tracker(
            self.run_dir, total_steps=config.steps, start_step=start_step, config=to_dict(config),
            name=config.name or self.run_dir.name, group=config.sweep_name, project=config.wandb_project,
            mode=config.wandb_mode, wandb_id=meta["wandb_id"], is_main_process=jax.process_index() == 0,
            show_progress=show_progress, keep_until_step=start_step if resumed else None,
            may_write=self.may_write)
        return self.tracker

    def on_close(self, close) -> None:
        """Call ``close()`` when the run has ended (after its record); it must not raise."""
        self._closing.callback(close)

    # -- checkpoints --------------------------------------------------------------------------------------

    def save(self, step: int, state, meta: dict, force: bool = False) -> None:
        """Checkpoint ``state`` (this run's, a solo run's) at ``step``, after reading the lease and writing
        the metrics rows up to it (a resume from this step finds every row before it)."""
        self.check_lease(read_now=True)
        self.tracker.flush(through_step=step, wait=True)
        self.checkpoints.save(step, state, meta, force=force)
        self.saved_step = step

    def save_behind(self, step: int, host_state, meta: dict) -> None:
        """Hand the periodic checkpoint at ``step`` (a host copy of the state, since the next step donates its
        buffers) to the background saver, the metrics rows up to it flushed first (written behind)."""
        self.check_lease()
        self.tracker.flush(through_step=step)  # the saver waits for these before the checkpoint
        self.saver.submit(step, host_state, meta)

    def _write_behind(self, step: int, state, meta: dict) -> None:
        """On the saver's thread: read the lease, wait for the metrics rows up to ``step``, save and wait
        for the write (its own deadline; a stop bounds the wait for it in ``settle_checkpoints``)."""
        self.check_lease(read_now=True)
        self.tracker.wait_for_writes()
        with _BEHIND:  # one write behind the loop at a time in the process (see _BEHIND)
            self.checkpoints.save(step, state, meta, abandon_on_stop=False)
            self.checkpoints.finish(abandon_on_stop=False, step=step)
        self.saved_step = step

    def settle_checkpoints(self) -> None:
        """Before a checkpoint saved on the loop's thread (a stop's, the last): drop the background save not
        started, wait for the one under way (a stop bounds this wait: ``WriteAbandoned``), raise its error."""
        if self.saver is None:
            return
        stop, checkpoints = self.stop, self.checkpoints
        self.saver.drop_pending()
        self.saver.wait_idle(lambda: stop.requested,
                             lambda step: checkpoints.abandon(f"checkpoint of step {step} in {checkpoints.directory}"))

    def raise_save_error(self) -> None:
        """The error of a background save that failed, if any."""
        if self.saver is not None:
            self.saver.raise_error()

    def _close_saver(self) -> None:
        """End the background saver (what is pending is dropped; a save under way is waited for, at most the
        checkpoints' write deadline; a write given up on is not waited for)."""
        abandoned = str(self.checkpoints.directory) in abandoned_writes()
        self.saver.close(0 if abandoned else self.checkpoints.write_timeout)

    # -- the end ------------------------------------------------------------------------------------------

    def conclude(self, status: str, **fields) -> records.RunRecord | None:
        """End a run that trained to its end (``finished`` or ``diverged``) with the record's ``fields``:
        its record, then its resources closed. A failure (e.g. ``LeaseLost`` first, if the lease was taken
        over) ends it as ``end`` does. Returns the outcome's record (None if it ended otherwise)."""
        try:
            self.check_lease(read_now=True)
            record = self.record(status, **fields)
            self.tracker.summary({"final_eval_loss": record.final_eval_loss, "status": record.status})
            self._carry_out(ending(None, status), record, quiet=False)
        except BaseException as error:  # noqa: BLE001 - ends this run alone, as its own outcome
            self.end(error)
            return None
        self.outcome = record
        self._closing.close()
        return record

    def end(self, error: BaseException) -> None:
        """End the run by ``error`` (see the module); ``outcome`` is the exception as ``as_raised`` gives it."""
        raised = as_raised(error, self.stop, self.lease_lost)
        try:
            self._end_by(raised)
        finally:
            self.outcome = raised
            if raised is not error and raised.__cause__ is None and not isinstance(raised, Preempted):
                raised.__cause__ = error
            self._closing.close()

    def _end_by(self, error: BaseException) -> None:
        """Carry out the end of a run that ``error`` ended."""
        end = ending(error)
        record = None
        if end.status == "stopped":
            record = self.record("stopped", error=str(error))
        elif end.status == "failed":
            log_file = rundir.log_failure(self.run_dir, error) if jax.process_index() == 0 else None
            # For the command line's one line: the traceback's file, only if it was written.
            error.error_log = str(self.run_dir / log_file) if log_file else None
            record = self.record("failed", error=rundir.one_line(error), log_file=log_file)
        self._carry_out(end, record, quiet=True)

    def _carry_out(self, end: Ending, record: records.RunRecord | None, *, quiet: bool) -> None:
        """In order: the metrics rows written (dropped if no record is written), ``record`` written (process 0),
        the tracker finished with the end's exit code. ``quiet``: a failure of the first two is a warning."""
        with self._warned_if(quiet):
            if self.tracker is not None and record is None:
                self.tracker.discard_pending()  # the run's files are another's, or nothing of it was written
            elif self.tracker is not None:
                self.tracker.flush(wait=True)  # the record's losses are in the metrics log before it
            if record is not None and jax.process_index() == 0:
                records.write_record(self.run_dir, record)
        with self._warned_if(True):  # the record is written: its end is decided
            if self.tracker is not None:
                tracker, self.tracker = self.tracker, None
                tracker.close(exit_code=end.tracker_exit_code)

    @contextlib.contextmanager
    def _warned_if(self, quiet: bool):
        """With ``quiet``, an error inside is one line on stderr instead of an exception."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 - a run ending another way must not hide what ended it
            if not quiet:
                raise
            print(f"warning: {self.run_dir}: while ending the run: {rundir.one_line(error)}", file=sys.stderr)


def _without_seed(config: TrainConfig) -> TrainConfig:
    """``config`` with seed 0: runs that differ only by seed share its id (``RunRecord.point_id``)."""
    return dataclasses.replace(config, seed=0)
