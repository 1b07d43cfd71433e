"""One run's own resources while it trains, and its one ending.

A ``Member`` is what belongs to one run and to no other: its directory and
the user's config, its lease, its record, its checkpoints and its tracker.
The training loop (``train.Training``) drives a member; what the loop
shares (the program, the data pipeline, the ``Stop``) is the same for every
run of one shape, so one loop can later drive several members at once.

- The record is begun with the member (``config.json``, the user's config,
  is written then: the run id hashes it) and filled in as the run goes
  (``begin``: the resolved config, whose vocabulary is the tokenizer's, and
  the data's fingerprint). Its identity comes from the user's config, its
  parameter counts from the resolved one (None if the run failed before
  its data was read).
- ``ending()`` is the run's one end. Inside it the run either trains to its
  end and calls ``conclude`` or raises; ``scaling.ending`` decides the status
  and exit codes, and the member carries them out in one order, whatever
  ended the run: the metrics rows written (dropped once the lease is lost),
  the record written, the tracker finished with its exit code; then the
  checkpoints and whatever the loop registered (``on_close``) are closed.
  A failure while ending a run that already failed or stopped is a warning:
  it never replaces the first error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time

import jax
from etils import epath

from scaling import budget, optim as optim_lib, records, rundir
from scaling.checkpoints import Checkpoints
from scaling.config import TrainConfig, config_id, to_dict
from scaling.ending import Ending, as_raised, ending
from scaling.stopping import Preempted, Stop
from scaling.storage import write_atomic
from scaling.track import Tracker


class Member:
    """One run of a training loop: its directory, config, lease, record, checkpoints and tracker."""

    def __init__(self, run_dir: epath.Path, config: TrainConfig, lease, stop: Stop, estimate: dict | None = None):
        self.run_dir, self.config, self.lease, self.stop = run_dir, config, lease, stop
        self.estimate = dict(estimate or {})  # what the preflight expected of the run, kept in its record
        self.started = time.perf_counter()  # wall seconds: the whole run, loading the data included
        self.resolved: TrainConfig | None = None  # ``config`` with the tokenizer's vocabulary (``begin``)
        self.data_fingerprint = ""
        self.checkpoints: Checkpoints | None = None
        self.tracker: Tracker | None = None
        self.code_version = rundir.code_version()
        self._closing = contextlib.ExitStack()  # closed when the run has ended, the last opened first
        if jax.process_index() == 0:  # the user's config: what the run id hashes and a rerun compares
            write_atomic(run_dir / "config.json", json.dumps(to_dict(config), indent=2, sort_keys=True))

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
            **{"tokens_per_step": config.tokens_per_step, **self.estimate, **fields})

    def open_checkpoints(self, abstract_state) -> Checkpoints:
        """The run's checkpoints (closed when the run has ended); a stop abandons a wait for storage."""
        stop = self.stop
        self.checkpoints = Checkpoints(self.run_dir / "checkpoints", self.config.keep_checkpoints, abstract_state,
                                       should_stop=lambda: stop.requested, lease=self.lease)
        self.on_close(self.checkpoints.close)
        return self.checkpoints

    def open_tracker(self, start_step: int, meta: dict, resumed: bool, show_progress: bool) -> Tracker:
        """The run's tracker from ``start_step`` (``meta``: the checkpoint's, with the wandb id); rows past a
        restored step were logged by a segment whose later state is lost, and are redone."""
        config = self.resolved or self.config
        self.tracker = Tracker(
            self.run_dir, total_steps=config.steps, start_step=start_step, config=to_dict(config),
            name=config.name or self.run_dir.name, group=config.sweep_name, project=config.wandb_project,
            mode=config.wandb_mode, wandb_id=meta["wandb_id"], is_main_process=jax.process_index() == 0,
            show_progress=show_progress, keep_until_step=start_step if resumed else None)
        return self.tracker

    def on_close(self, close) -> None:
        """Call ``close()`` when the run has ended (after its record); it must not raise."""
        self._closing.callback(close)

    @contextlib.contextmanager
    def ending(self):
        """The run's one end (see the module): an exception inside is carried out as ``scaling.ending``
        maps it (``as_raised`` first), then raised as ``as_raised`` gives it."""
        with self._closing:
            try:
                yield self
            except BaseException as error:
                raised = as_raised(error, self.stop)
                self._end_by(raised)
                if raised is error:
                    raise
                raise raised from (None if isinstance(raised, Preempted) else error)

    def conclude(self, status: str, **fields) -> records.RunRecord:
        """End a run that trained to its end (``finished`` or ``diverged``) with the record's ``fields``;
        returns its record. ``LeaseLost`` first if the lease was taken over."""
        self.stop.check_lease(read_now=True)
        record = self.record(status, **fields)
        self.tracker.summary({"final_eval_loss": record.final_eval_loss, "status": record.status})
        self._carry_out(ending(None, status), record, quiet=False)
        return record

    def _end_by(self, error: BaseException) -> None:
        """Carry out the end of a run that ``error`` ended (called while it is being handled)."""
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
