"""Writes that storage finishes behind the training loop: one thread, in order, each wait bounded.

A write to an object store takes a round trip or more (tens of ms within a
region, 100+ ms across regions or through a slow proxy). Most of the run's
writes need not be durable the moment they are made: a metrics row only has
to reach storage before the checkpoint that covers its step commits, and
before the run's record says it finished. ``WriteBehind`` runs such writes
on one background thread, in the order they were submitted, so the loop
pays for them only where it must wait (``wait``):

- before a checkpoint is saved (``Training.save``): the metrics rows up to
  its step, so a run resumed from it has every row before it;
- before the run's record is written, and when a run stops or fails
  (``Tracker.close``): every row, so the record and the log agree.

A write that fails is raised again, as ``WriteFailed`` naming it, by the
next ``submit`` or ``wait``: the run then stops as it would have at the
write itself. ``wait`` gives up after ``timeout`` seconds with ``WriteFailed``
instead of hanging on storage that does not answer. ``discard`` drops the
writes not yet started (the run is another process's now).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from scaling import settings

WAIT_SECONDS = 600.0  # as long as a checkpoint write may take (scaling.store.checkpoints.WRITE_TIMEOUT_SECONDS)


def wait_seconds() -> float:
    """The limit of a wait for background writes (seconds): ``SCALING_CHECKPOINT_TIMEOUT_SECONDS`` if set,
    the limit checkpoint writes have, else ``WAIT_SECONDS``."""
    return settings.seconds("SCALING_CHECKPOINT_TIMEOUT_SECONDS", WAIT_SECONDS)


class WriteFailed(RuntimeError):
    """A background write failed, or did not finish within the wait's limit; one line naming it."""


class WriteBehind:
    """A background thread that runs submitted writes one at a time, in order."""

    def __init__(self, name: str = "write-behind"):
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._unfinished = 0  # writes submitted and not yet done
        self._done = threading.Condition(self._lock)
        self._error: BaseException | None = None
        self._failed_write = ""
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            what, write = self._queue.get()
            try:
                if self._error is None:  # after a failure, later writes would leave a gap: skip them
                    write()
            except BaseException as error:  # noqa: BLE001 - handed to the training thread
                with self._lock:
                    self._error, self._failed_write = error, what
            finally:
                with self._lock:
                    self._unfinished -= 1
                    self._done.notify_all()

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise WriteFailed(f"{self._failed_write} failed: {type(error).__name__}: "
                              f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}") from error

    def submit(self, what: str, write: Callable[[], None]) -> None:
        """Run ``write()`` after the writes submitted before it; ``what`` names it in errors. Raises
        ``WriteFailed`` if an earlier write failed."""
        with self._lock:
            self._raise_failure()
            self._unfinished += 1
        self._queue.put((what, write))

    def wait(self, timeout: float) -> None:
        """Return once every submitted write is done; ``WriteFailed`` if one failed or if they are not
        done within ``timeout`` seconds (storage unreachable?)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._unfinished and time.monotonic() < deadline:
                self._done.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
            self._raise_failure()
            if self._unfinished:
                raise WriteFailed(f"{self._unfinished} write(s) not finished after {timeout:g} s "
                                  "(storage unreachable?)")

    def discard(self) -> None:
        """Drop the writes not yet started (one under way finishes)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                self._unfinished -= 1
                self._done.notify_all()
