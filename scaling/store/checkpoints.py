"""A run's orbax checkpoints: fail fast when they cannot be written, resume past damaged ones.

A checkpoint holds two items: ``state`` (parameters, optimizer state, step;
orbax's standard pytree format, restored straight into the run's shardings)
and ``meta`` (JSON: the wandb id, the initial eval loss, wall and training seconds so far).

- ``Checkpoints.check_writable`` writes and removes a probe file before
  training, so a directory that cannot take checkpoints stops the run at
  step 0 with one line, not after training.
- The first save of a process waits for its write to finish, and every later
  save first checks that the previous asynchronous write succeeded, so a
  failure stops the run at the checkpoint where it happened.
- Every call into orbax that may wait on storage (save, waiting for a
  write, restore's listing) runs in a helper thread with a deadline,
  ``write_timeout`` seconds (default ``WRITE_TIMEOUT_SECONDS``, 600, or the
  environment's ``SCALING_CHECKPOINT_TIMEOUT_SECONDS``): storage that does
  not answer for longer fails the run with one line naming the path
  (``WriteAbandoned``) instead of hanging it, and a stop request (SIGTERM,
  Ctrl-C) while it waits abandons the write at once. An abandoned write's
  thread cannot be cancelled, so the command-line entry points then end
  the process without waiting for it (``abandoned_writes``).
- With the run's lease (``lease=``), a step is written in the holder's own
  folder and moved into ``checkpoints/`` only while the lease is still held
  (``leased_commit.py``): a holder paused mid-write that lost the lease never
  lands a checkpoint in the run another process now owns.
- ``restore_newest`` tries checkpoints from the newest down and uses the
  first that reads back whole; damaged newer ones are reported and moved to
  ``<run dir>/checkpoints-set-aside/`` (they would otherwise block saving
  those steps again). With several processes they agree: process 0's
  reading decides, a step process 0 read but another could not stops the
  run, and steps are set aside after a barrier.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import uuid

import jax
import orbax.checkpoint as ocp
from etils import epath

from scaling import multihost, settings
from scaling.store import leased_commit
from scaling.store.rundir import one_line
from scaling.store.storage import move_folder, write_atomic


WRITE_TIMEOUT_SECONDS = 600.0
_abandoned: list[str] = []  # directories with a write given up on, in this process


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message is one line naming the path and the reason."""


class WriteAbandoned(CheckpointError):
    """A checkpoint write did not finish in time (or a stop was requested while it waited).
    ``stopped``: True when a stop request, not the deadline, gave it up."""

    def __init__(self, message: str, stopped: bool):
        super().__init__(message)
        self.stopped = stopped


def abandoned_writes() -> list[str]:
    """Checkpoint directories of this process whose write was given up on (its thread may still hang)."""
    return list(_abandoned)


def exit_now_if_abandoned(code: int) -> int:
    """``code``; but if a checkpoint write was given up on, end the process now with it (after flushing
    stdout and stderr): the write's thread cannot be cancelled, and a normal exit would wait for it."""
    if _abandoned:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def default_write_timeout() -> float:
    """``SCALING_CHECKPOINT_TIMEOUT_SECONDS`` if set, else ``WRITE_TIMEOUT_SECONDS`` (seconds)."""
    return settings.seconds("SCALING_CHECKPOINT_TIMEOUT_SECONDS", WRITE_TIMEOUT_SECONDS)


class Checkpoints:
    """The checkpoints of one run in ``directory`` (absolute local path or URI)."""

    def __init__(self, directory, keep: int, abstract_state, *, write_timeout: float | None = None,
                 should_stop=lambda: False, lease=None):
        self.directory = epath.Path(directory)
        self.abstract_state = abstract_state
        self.write_timeout = default_write_timeout() if write_timeout is None else write_timeout
        self.should_stop = should_stop  # polled while waiting on storage: True abandons the wait
        self.skipped: list[str] = []  # "step S: reason" for every damaged checkpoint passed over
        self._saved_once = False
        self._unraisable_hook = None  # set while noise from failed reads is filtered
        self.check_writable()
        path_class, self._lease_token = None, None if lease is None else lease.token
        if lease is not None:  # steps written privately, moved into the run only while the lease is held
            def still_held() -> bool:
                held = lease.still_held()
                lease.lost = lease.lost or not held  # the run is not ours: write nothing more to it
                return held

            path_class = leased_commit.leased_path_class(self.directory, lease.token, still_held)
            if jax.process_index() == 0:
                leased_commit.remove_others_pending(self.directory, lease.token)
        try:
            self.manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=keep, create=True, enable_async_checkpointing=True, temporary_path_class=path_class,
                    # orbax would remove a step's existing folder when a save starts; with the lease the commit
                    # does that, after reading the lease (a paused holder must not delete its successor's step)
                    file_options=ocp.options.FileOptions(skip_sync_file_validations=path_class is not None)),
                item_names=("state", "meta"))
        except Exception as error:  # noqa: BLE001 - orbax raises many kinds; the user needs one line
            raise CheckpointError(f"cannot use checkpoint directory {self.directory}: {one_line(error)}") from None

    def check_writable(self) -> None:
        """Create the directory and a probe file in it; ``CheckpointError`` if either fails."""
        if jax.process_index() != 0:
            return
        probe = self.directory / f".write-probe-{jax.process_index()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(probe, "ok")
            probe.unlink()
        except Exception as error:  # noqa: BLE001 - OSError locally, other types from object stores
            raise CheckpointError(f"cannot write checkpoints to {self.directory}: {one_line(error)}") from None

    def restore_newest(self):
        """``(state, meta, step)`` from the newest checkpoint that reads back whole, or None if none does.

        With several processes, the steps tried are process 0's listing, and every process tries
        the same step at the same time; process 0's reading decides whether a step is damaged. If
        process 0 reads a step whole but another process cannot, every process stops with one line
        (``CheckpointError``) instead of resuming from different steps or setting a good step
        aside. Damaged steps are set aside after every process has finished reading.
        Limitation: orbax's restore ends in a barrier of all processes, so a read error that only
        some processes meet inside it leaves the others waiting there until orbax's barrier
        timeout; errors met after it (the checks below) are agreed on at once.
        """
        self.manager.reload()
        steps = sorted(self.manager.all_steps(), reverse=True)
        steps = multihost.broadcast_ints_from_process_0(steps)  # hosts may list a bucket at different moments
        found, damaged = None, []
        for step in steps:
            error = None
            try:
                found = self._restore(step)
            except Exception as caught:  # noqa: BLE001 - any failure to read back means "damaged"
                error = one_line(caught)
                del caught
                found = None
                if self._unraisable_hook is None:
                    self._quiet_failed_reads()
                gc.collect()  # the abandoned read tasks report here, while their noise is filtered
            readers = [bool(ok) for ok in multihost.gather(error is None)]
            if readers[0] and all(readers):
                break
            if readers[0]:  # process 0 read it whole: not damaged, but this host could not read it
                failed = [i for i, ok in enumerate(readers) if not ok]
                raise CheckpointError(f"process(es) {failed} could not read checkpoint step {step} in "
                                      f"{self.directory}, which process 0 read whole"
                                      + (f" ({error})" if error else "") + "; stopping: rerun to resume")
            self.skipped.append(f"step {step}: {error or 'process 0 could not read it'}")
            damaged.append(step)
            found = None
        if damaged:
            multihost.barrier("checkpoints-read")  # no process still reading what is moved
            for step in damaged:
                self._set_aside(step)
            multihost.barrier("checkpoints-set-aside")
            self.manager.reload()
        return found

    def _restore(self, step: int):
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(self.abstract_state), meta=ocp.args.JsonRestore()))
        meta = restored["meta"]
        if not isinstance(meta, dict) or "wandb_id" not in meta:
            raise ValueError(f"meta holds {type(meta).__name__} without a wandb_id")
        restored_step = int(jax.device_get(restored["state"]["step"]))
        if restored_step != step:
            raise ValueError(f"state says step {restored_step}")
        return restored["state"], meta, step

    def _quiet_failed_reads(self) -> None:
        # A failed restore leaves orbax's other read tasks to fail later on
        # closed event loops; each would print a traceback (through asyncio's
        # logger and the unraisable hook) that buries the one-line warning.
        # From the first failed read until this run closes, asyncio's error
        # log is silenced and the unraisable hook drops only these messages.
        self._asyncio_logger = logging.getLogger("asyncio")
        self._asyncio_level = self._asyncio_logger.level
        self._asyncio_logger.setLevel(logging.CRITICAL)
        self._unraisable_hook = previous = sys.unraisablehook

        def hook(unraisable):
            message = str(unraisable.exc_value)
            if not ("Event loop is closed" in message or "error while reading array" in message):
                previous(unraisable)

        sys.unraisablehook = hook
        # The same abandoned reads can also fail in orbax's helper threads once their loop is closed.
        self._thread_hook = previous_thread_hook = threading.excepthook

        def thread_hook(args):
            if "Event loop is closed" not in str(args.exc_value):
                previous_thread_hook(args)

        threading.excepthook = thread_hook

    def _set_aside(self, step: int) -> None:
        # Moved, not deleted: a read can fail for reasons that pass (a storage
        # error, a model change that breaks the restore), and the step's
        # directory must be out of orbax's way so the run can save it again.
        if jax.process_index() == 0:
            aside = self.directory.parent / "checkpoints-set-aside" / f"{step}-{uuid.uuid4().hex[:6]}"
            move_folder(self.directory / str(step), aside)  # on object stores: copies, then deletes

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, as orbax sees them now."""
        return list(self.manager.all_steps())

    def abandon(self, what: str) -> WriteAbandoned:
        """The ``WriteAbandoned`` (``stopped=True``) of a write under way that a stop no longer waits for;
        the directory counts as abandoned from now on (``abandoned_writes``)."""
        _abandoned.append(str(self.directory))
        return WriteAbandoned(f"{what}: abandoned after a stop request", stopped=True)

    def _bounded(self, what: str, function, abandon_on_stop: bool = True):
        """``function()`` in a helper thread, waited for at most ``write_timeout`` seconds, and no longer
        once ``should_stop()`` turns true during the wait (if ``abandon_on_stop``); ``WriteAbandoned``
        naming ``what`` then (the thread is left behind). An error of ``function`` comes back as
        ``CheckpointError``."""
        if str(self.directory) in _abandoned:
            raise WriteAbandoned(f"{what}: an earlier write to {self.directory} never finished", stopped=False)
        outcome = {}

        def target():
            try:
                outcome["value"] = function()
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
                outcome["error"] = error

        worker = threading.Thread(target=target, name="checkpoint-write", daemon=True)
        worker.start()
        deadline = time.monotonic() + self.write_timeout
        stop_before = self.should_stop()  # the save a stop asks for is waited for; a stop during a wait is new
        while worker.is_alive():
            worker.join(0.1)
            stopped = abandon_on_stop and not stop_before and self.should_stop()
            if worker.is_alive() and (stopped or time.monotonic() > deadline):
                _abandoned.append(str(self.directory))
                reason = ("abandoned after a stop request" if stopped else
                          f"not finished after {self.write_timeout:g} s (storage unreachable?)")
                raise WriteAbandoned(f"{what}: {reason}", stopped=stopped)
        error = outcome.get("error")
        if isinstance(error, Exception):
            raise CheckpointError(f"{what} failed: {one_line(error)}") from None
        if error is not None:  # KeyboardInterrupt, SystemExit: not a checkpoint failure
            raise error
        return outcome.get("value")

    def save(self, step: int, state, meta: dict, *, force: bool = False, abandon_on_stop: bool = True) -> None:
        """Save asynchronously; raises ``CheckpointError`` if this or the previous write failed
        (``WriteAbandoned`` if storage did not answer in time). A background saver, whose waits a stop
        bounds itself, passes ``abandon_on_stop=False``."""
        what = f"checkpoint of step {step} in {self.directory}"

        def write():
            self.manager.check_for_errors()
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                            meta=ocp.args.JsonSave(dict(meta))), force=force)
            if not self._saved_once:  # surface a broken path at the first checkpoint, not at the end
                self.manager.wait_until_finished()
                self.manager.check_for_errors()
                self._saved_once = True

        self._bounded(what, write, abandon_on_stop)

    def finish(self, abandon_on_stop: bool = True, step: int | None = None) -> None:
        """Wait for pending writes; ``CheckpointError`` if one failed (``WriteAbandoned``: not in time).
        ``step``: the step being written, named in errors."""
        what = f"checkpoint {'write' if step is None else f'of step {step}'} in {self.directory}"

        def wait():
            self.manager.wait_until_finished()
            self.manager.check_for_errors()

        self._bounded(what, wait, abandon_on_stop)

    def close(self) -> None:
        """Release orbax's threads (safe after a failure; never raises; skipped after an abandoned write,
        which it would wait for). Closing waits for a write still under way: at most ``write_timeout``
        seconds, in a helper thread, after which the write counts as abandoned (``abandoned_writes``)."""
        if str(self.directory) not in _abandoned:
            def close_manager():
                try:
                    self.manager.close()  # waits for the background write, with no limit of its own
                except Exception:  # noqa: BLE001 - closing after a failed write must not mask the first error
                    pass

            closer = threading.Thread(target=close_manager, name="checkpoint-close", daemon=True)
            closer.start()
            closer.join(self.write_timeout)
            if closer.is_alive():
                _abandoned.append(str(self.directory))
            elif self._lease_token is not None and jax.process_index() == 0:
                leased_commit.tidy(self.directory, self._lease_token)
        if self._unraisable_hook is not None:
            sys.unraisablehook = self._unraisable_hook
            threading.excepthook = self._thread_hook
            self._asyncio_logger.setLevel(self._asyncio_level)
            self._unraisable_hook = None
