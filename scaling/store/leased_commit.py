"""Checkpoint steps written in the lease holder's own folder, moved into the run only while it holds the lease.

orbax writes a step asynchronously: the arrays go to storage from a background
thread while training goes on, and a last "finalize" makes the step complete.
By default the step is written where it will stay, under a name other writers
know: ``checkpoints/<step>.orbax-checkpoint-tmp`` renamed to
``checkpoints/<step>`` on local disks, and on Cloud Storage straight into
``checkpoints/<step>/``, made complete by a ``commit_success.txt``. A process
that was paused (SIGSTOP, a VM frozen for live migration, a long GC) while its
write was in flight loses its lease to another launcher, and when it wakes
its background write goes on, landing in the run the other launcher now owns
(or the other launcher has removed its temporary folder and its write fails).

``leased_path_class`` gives orbax (``CheckpointManagerOptions.temporary_path_class``,
orbax's documented hook for how a step is created and finalized) another place
and another commit:

- a step is written under ``<run dir>/checkpoints-pending/<lease token>/<step>``,
  a folder only this holder writes and nobody reads; a write that goes on
  after the lease is lost lands there, never among the run's checkpoints;
- a save leaves ``checkpoints/<step>`` alone until it commits (orbax would
  remove a folder there when the save starts: a paused holder would remove
  its successor's step);
- finalizing reads the lease afresh and moves the step into
  ``checkpoints/<step>`` only if it is still held: locally one rename (atomic);
  on object stores every object is copied server-side, the lease is read once
  more, and ``commit_success.txt`` is written last, so an interrupted move is
  an incomplete step that orbax passes over. A holder that lost the lease
  fails the write (``LeaseLostBeforeCommit``) and removes its folder.

Limit: the lease read and the move are two operations; a holder paused in
the moment between them (microseconds locally, one request on Cloud Storage)
could still commit a step after losing the lease. Storage offers no
compare-and-swap across two objects, so only that window is left.

Items inside a step (``state``, ``meta``) are left to orbax's defaults: the
step's folder is already private. A run without a lease (several processes,
which agree through the launcher) keeps orbax's defaults throughout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from typing import Callable

from etils import epath
from orbax.checkpoint._src.metadata import checkpoint as checkpoint_metadata
from orbax.checkpoint._src.path import async_path, atomicity, atomicity_defaults

from scaling.store.storage import is_remote

PENDING_FOLDER = "checkpoints-pending"  # beside the run's checkpoints folder: <run dir>/checkpoints-pending/<token>/
COMMIT_FILE = atomicity.COMMIT_SUCCESS_FILE


class LeaseLostBeforeCommit(RuntimeError):
    """The run's lease was lost while a checkpoint was being written: the step was not moved into the run."""


def pending_folder(checkpoints_dir, token: str) -> epath.Path:
    """The holder ``token``'s private folder for steps being written."""
    return epath.Path(checkpoints_dir).parent / PENDING_FOLDER / token


def remove_others_pending(checkpoints_dir, token: str) -> None:
    """Remove steps left in the pending folders of other holders (dead, or paused and replaced): never read,
    they only take space. Best effort: a holder still writing may add to its folder afterwards."""
    root = epath.Path(checkpoints_dir).parent / PENDING_FOLDER
    try:
        others = [folder for folder in root.iterdir() if folder.name != token] if root.exists() else []
        for folder in others:
            folder.rmtree()
    except OSError:
        pass


def tidy(checkpoints_dir, token: str) -> None:
    """Remove the holder ``token``'s pending folder, and the folder of pending folders, where they are
    empty (local disks; object stores have no empty folders)."""
    folder = pending_folder(checkpoints_dir, token)
    if is_remote(str(folder)):
        return
    for empty in (folder, folder.parent):
        try:
            os.rmdir(empty)
        except OSError:  # not empty (another holder's steps), or already gone
            return


def _move_into_place(pending: epath.Path, final: epath.Path, still_held: Callable[[], bool]) -> None:
    """Move the finished step ``pending`` to ``final`` if the lease is still held (see the module)."""
    step = final.name
    if not still_held():
        raise LeaseLostBeforeCommit(f"lease lost while checkpoint step {step} was written; not moved into {final}")
    # An existing folder at the step is an unfinished one (orbax saves only steps it has no complete
    # checkpoint of): replaced, as orbax itself does when a save starts, but only now, under the lease.
    if not is_remote(str(final)):
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.rename(pending, final)  # one atomic step, as orbax's own rename
        return
    import fsspec

    fs, pending_key = fsspec.core.url_to_fs(str(pending))
    _, final_key = fsspec.core.url_to_fs(str(final))
    fs.invalidate_cache()
    if fs.find(final_key):
        fs.rm(final_key, recursive=True)
    names = [name for name in fs.find(pending_key) if not name.endswith("/" + COMMIT_FILE)]
    fs.copy(names, [final_key + name[len(pending_key):] for name in names])  # server-side copies, concurrent
    if not still_held():  # copied, not committed: an incomplete step that orbax passes over
        raise LeaseLostBeforeCommit(f"lease lost while checkpoint step {step} was moved; {final} left uncommitted")
    fs.pipe_file(f"{final_key}/{COMMIT_FILE}", f"Checkpoint commit was successful to {final}".encode())
    fs.rm(pending_key, recursive=True)
    fs.invalidate_cache()


def leased_path_class(checkpoints_dir, token: str, still_held: Callable[[], bool]):
    """An orbax ``TemporaryPath`` class for the checkpoints in ``checkpoints_dir``: steps are written under
    ``pending_folder(checkpoints_dir, token)`` and moved into place only while ``still_held()`` is True."""
    steps_dir = str(epath.Path(checkpoints_dir)).rstrip("/")
    pending_root = pending_folder(checkpoints_dir, token)

    class LeasedTemporaryPath(atomicity.TemporaryPathBase):
        """A step in this holder's pending folder, committed into the run only while the lease is held."""

        @classmethod
        def from_final(cls, final_path, *, checkpoint_metadata_store=None, file_options=None, snapshot_type=None):
            final_path = epath.Path(final_path)
            if str(final_path.parent).rstrip("/") != steps_dir:  # an item inside a step: orbax's own way
                default = atomicity_defaults.get_item_default_temporary_path_class(final_path)
                return default.from_final(final_path, checkpoint_metadata_store=checkpoint_metadata_store,
                                          file_options=file_options)
            return cls(pending_root / final_path.name, final_path, checkpoint_metadata_store=checkpoint_metadata_store,
                       file_options=file_options)

        @classmethod
        def from_temporary(cls, temporary_path, *, file_options=None, snapshot_type=None):
            temporary_path = epath.Path(temporary_path)
            return cls(temporary_path, epath.Path(steps_dir) / temporary_path.name, file_options=file_options)

        @classmethod
        async def validate(cls, temporary_path):
            """A step folder that is not complete (orbax lists such folders as unfinished)."""
            try:
                await cls.validate_final(temporary_path)
            except atomicity.ValidationError:
                return
            raise atomicity.ValidationError(f"{temporary_path} is a complete checkpoint")

        @classmethod
        async def validate_final(cls, final_path):
            """Complete: not orbax's temporary name, and its ``commit_success.txt`` written (last, on every store)."""
            final_path = epath.Path(final_path)
            if atomicity.TMP_DIR_SUFFIX in final_path.name or not await async_path.exists(final_path / COMMIT_FILE):
                raise atomicity.ValidationError(f"{final_path} is not a complete checkpoint")

        def get_final(self) -> epath.Path:
            return self._final_path

        async def create(self) -> epath.Path:
            return await atomicity._create_tmp_directory(  # orbax's own: makes the folder, writes its metadata
                async_path.mkdir, self._tmp_path, path_permission_mode=self._path_permission_mode,
                checkpoint_metadata_store=self._checkpoint_metadata_store)

        async def finalize(self) -> None:
            """Stamp the step's metadata (as orbax does), then move it into the run if the lease is held."""
            store = self._checkpoint_metadata_store
            if store:
                await asyncio.to_thread(store.wait_until_finished)
                await asyncio.to_thread(store.update,
                                        file_path=checkpoint_metadata.step_metadata_file_path(self._tmp_path),
                                        commit_timestamp_nsecs=time.time_ns())
                await asyncio.to_thread(store.wait_until_finished)
            if not is_remote(str(self._tmp_path)):  # the rename carries it; on object stores it is written last
                await async_path.write_text(self._tmp_path / COMMIT_FILE,
                                            f"Checkpoint commit was successful to {self._final_path}")
            try:
                await asyncio.to_thread(_move_into_place, self._tmp_path, self._final_path, still_held)
            except LeaseLostBeforeCommit:
                await asyncio.to_thread(_remove_quietly, self._tmp_path)
                raise

    return LeasedTemporaryPath


def _remove_quietly(folder: epath.Path) -> None:
    try:
        folder.rmtree()
    except OSError:
        pass
