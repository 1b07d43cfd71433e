"""Periodic checkpoints saved behind the training loop: one thread, the newest checkpoint only.

On a slow or distant bucket one orbax checkpoint is tens of sequential
requests (each a round trip: 200 ms through a slow proxy makes ~10 s), longer
than a checkpoint interval of a small model. Saved from the loop, every save
waits for the previous write, so the loop runs at the bucket's pace.
``BackgroundSaver`` takes that wait off the loop:

- ``submit(step, state, meta)`` hands over a host copy of the state (the
  train step donates its input buffers, so the caller copies it first) and
  returns at once. One thread saves what it is handed, one at a time: the
  lease read, the wait for the metrics rows up to the step, the orbax save
  and the wait for its write (``save`` given to the constructor).
- Only the newest checkpoint waits: one handed over while another waits is
  dropped (``skipped``; said once on stderr). So a bucket slower than the
  checkpoint interval costs checkpoints, never steps.
- A failure of a save (``CheckpointError``, ``LeaseLost``, a metrics write
  that failed) is raised again by the next ``raise_error``, ``submit`` or
  ``wait_idle`` on the training thread: the run fails there, as it would have
  at the save itself.
- ``wait_idle`` is where the loop waits: before the final checkpoint and
  before the checkpoint of a stop. A stop (SIGTERM, Ctrl-C) during that wait
  bounds it to ``stop_wait_seconds()``, half the stop's grace period: a write
  storage does not finish by then is given up on (``WriteAbandoned``,
  ``stopped=True``), leaving time to record the stop.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from scaling.settings import stop_grace_seconds


def stop_wait_seconds() -> float | None:
    """How long a stop waits for a checkpoint write in flight (seconds): half the stop's grace period
    (``settings.stop_grace_seconds``); None (no limit but the write's own deadline) without a grace period."""

    grace = stop_grace_seconds()
    return grace / 2 if grace > 0 else None


class BackgroundSaver:
    """One thread that runs ``save(step, state, meta)`` for the newest checkpoint handed to it."""

    def __init__(self, save: Callable[[int, dict, dict], None], name: str = "checkpoint-saver"):
        self._save = save
        self._changed = threading.Condition()
        self._pending: tuple | None = None  # (step, state, meta) not yet started
        self._busy_step: int | None = None  # the step being saved
        self._error: BaseException | None = None  # of a failed save, until raised on the training thread
        self._failed = False  # a save failed: the run is ending, nothing more is saved
        self._closed = False
        self.skipped: list[int] = []  # steps dropped for a newer one
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            with self._changed:
                while self._pending is None and not self._closed:
                    self._changed.wait()
                if self._pending is None:
                    return
                (step, state, meta), self._pending = self._pending, None
                self._busy_step = step
            try:
                if not self._failed:
                    self._save(step, state, meta)
            except BaseException as error:  # noqa: BLE001 - handed to the training thread
                with self._changed:
                    self._error, self._failed = error, True
            finally:
                del state
                with self._changed:
                    self._busy_step = None
                    self._changed.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def raise_error(self) -> None:
        """Raise the error of a save that failed since the last call, if any."""
        with self._changed:
            self._raise_error()

    def submit(self, step: int, state, meta: dict) -> None:
        """Save ``state`` (a copy the caller no longer changes) and ``meta`` at ``step`` behind the caller,
        in place of a save handed over before and not started yet. Raises the error of an earlier save."""
        with self._changed:
            self._raise_error()
            if self._pending is not None:
                if not self.skipped:
                    print(f"warning: checkpoint of step {self._pending[0]} skipped for step {step}: storage is "
                          "slower than the checkpoint interval (said once)", file=sys.stderr)
                self.skipped.append(self._pending[0])
            self._pending = (step, state, dict(meta))
            self._changed.notify_all()

    def drop_pending(self) -> None:
        """Drop the save handed over and not started (a newer checkpoint is about to be saved)."""
        with self._changed:
            if self._pending is not None:
                self.skipped.append(self._pending[0])
                self._pending = None

    def wait_idle(self, should_stop: Callable[[], bool], give_up: Callable[[int], BaseException]) -> None:
        """Wait until nothing is pending or being saved, then raise a save's error if one failed. Once
        ``should_stop()`` is true, wait at most ``stop_wait_seconds()`` more; then raise ``give_up(step)``
        (the step whose write is still under way)."""
        limit, stop_seen = stop_wait_seconds(), None
        with self._changed:
            while self._pending is not None or self._busy_step is not None:
                if stop_seen is None and should_stop():
                    stop_seen = time.monotonic()
                if stop_seen is not None and limit is not None and time.monotonic() - stop_seen > limit:
                    if self._busy_step is None:  # the pending one has not started: nothing to wait for
                        self._pending = None
                        break
                    raise give_up(self._busy_step)
                self._changed.wait(0.1)
            self._raise_error()

    def close(self, timeout: float) -> None:
        """Drop what is pending and end the thread once the save under way is done (at most ``timeout``
        seconds; a write still hanging then is left to the checkpoints' own deadline)."""
        with self._changed:
            self._pending, self._closed = None, True
            self._changed.notify_all()
        self._thread.join(timeout)
