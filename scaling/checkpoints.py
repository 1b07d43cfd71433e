"""A run's orbax checkpoints: fail fast when they cannot be written, resume past damaged ones.

A checkpoint holds two items: ``state`` (parameters, optimizer state, step;
orbax's standard pytree format, restored straight into the run's shardings)
and ``meta`` (JSON: the wandb id, the initial eval loss, wall seconds so far).

- ``Checkpoints.check_writable`` writes and removes a probe file before
  training, so a directory that cannot take checkpoints stops the run at
  step 0 with one line, not after training.
- The first save of a process waits for its write to finish, and every later
  save first checks that the previous asynchronous write succeeded, so a
  failure stops the run at the checkpoint where it happened.
- ``restore_newest`` tries checkpoints from the newest down and uses the
  first that reads back whole; damaged newer ones are reported and moved to
  ``<run dir>/checkpoints-set-aside/`` (they would otherwise block saving
  those steps again).
"""

from __future__ import annotations

import gc
import logging
import sys
import uuid

import jax
import orbax.checkpoint as ocp
from etils import epath

from scaling.rundir import one_line
from scaling.storage import move_folder


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message is one line naming the path and the reason."""


class Checkpoints:
    """The checkpoints of one run in ``directory`` (absolute local path or URI)."""

    def __init__(self, directory, keep: int, abstract_state):
        self.directory = epath.Path(directory)
        self.abstract_state = abstract_state
        self.skipped: list[str] = []  # "step S: reason" for every damaged checkpoint passed over
        self._saved_once = False
        self._unraisable_hook = None  # set while noise from failed reads is filtered
        self.check_writable()
        try:
            self.manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                     enable_async_checkpointing=True),
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
            probe.write_text("ok")
            probe.unlink()
        except Exception as error:  # noqa: BLE001 - OSError locally, other types from object stores
            raise CheckpointError(f"cannot write checkpoints to {self.directory}: {one_line(error)}") from None

    def restore_newest(self):
        """``(state, meta, step)`` from the newest checkpoint that reads back whole, or None if none does."""
        self.manager.reload()
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(self.abstract_state), meta=ocp.args.JsonRestore()))
                meta = restored["meta"]
                if not isinstance(meta, dict) or "wandb_id" not in meta:
                    raise ValueError(f"meta holds {type(meta).__name__} without a wandb_id")
                restored_step = int(jax.device_get(restored["state"]["step"]))
                if restored_step != step:
                    raise ValueError(f"state says step {restored_step}")
                return restored["state"], meta, step
            except Exception as error:  # noqa: BLE001 - any failure to read back means "damaged"
                self.skipped.append(f"step {step}: {one_line(error)}")
                del error
                if self._unraisable_hook is None:
                    self._quiet_failed_reads()
                gc.collect()  # the abandoned read tasks report here, while their noise is filtered
                self._set_aside(step)
        return None

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

    def _set_aside(self, step: int) -> None:
        # Moved, not deleted: a read can fail for reasons that pass (a storage
        # error, a model change that breaks the restore), and the step's
        # directory must be out of orbax's way so the run can save it again.
        if jax.process_index() == 0:
            aside = self.directory.parent / "checkpoints-set-aside" / f"{step}-{uuid.uuid4().hex[:6]}"
            move_folder(self.directory / str(step), aside)  # on object stores: copies, then deletes
        self.manager.reload()

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, as orbax sees them now."""
        return list(self.manager.all_steps())

    def save(self, step: int, state, meta: dict, *, force: bool = False) -> None:
        """Save asynchronously; raises ``CheckpointError`` if this or the previous write failed."""
        try:
            self.manager.check_for_errors()
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                            meta=ocp.args.JsonSave(dict(meta))), force=force)
            if not self._saved_once:  # surface a broken path at the first checkpoint, not at the end
                self.manager.wait_until_finished()
                self.manager.check_for_errors()
                self._saved_once = True
        except Exception as error:  # noqa: BLE001
            raise CheckpointError(f"checkpoint of step {step} in {self.directory} failed: {one_line(error)}") from None

    def finish(self) -> None:
        """Wait for pending writes; ``CheckpointError`` if one failed."""
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        except Exception as error:  # noqa: BLE001
            raise CheckpointError(f"checkpoint write in {self.directory} failed: {one_line(error)}") from None

    def close(self) -> None:
        """Release orbax's threads (safe after a failure; never raises)."""
        try:
            self.manager.close()
        except Exception:  # noqa: BLE001 - closing after a failed write must not mask the first error
            pass
        if self._unraisable_hook is not None:
            sys.unraisablehook = self._unraisable_hook
            self._asyncio_logger.setLevel(self._asyncio_level)
            self._unraisable_hook = None
