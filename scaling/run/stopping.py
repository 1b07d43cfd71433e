"""Stopping a run early: preemption (SIGTERM), Ctrl-C, and a lease taken over by another process.

- ``Stop``: the one object a run asks, between steps, whether to stop. It
  listens for SIGTERM and SIGINT, and with several
  processes makes them agree (``StopCheck``). One ``Stop`` can serve many
  runs: the sweep launcher listens with one for the whole sweep and hands it
  to every run, so a signal is never lost between or at the end of runs.
- ``Preempted``: raised once a checkpoint of the current step is saved; the
  process exits with ``PREEMPTED_EXIT_CODE`` so that relaunch loops know the
  run can resume.
- ``LeaseLost``: another launcher judged this process dead and took the run
  over; this process stops writing to the run at once.
- A stop ends in bounded time: from a SIGTERM, the process has
  ``stop_grace_seconds()`` (``SCALING_STOP_GRACE_SECONDS``, default 25 s;
  a preempted TPU VM gets about 30 s, SLURM's default KillWait is 30 s) to
  save, record and exit. Storage that does not answer (a bucket outage, a
  write that hangs) must not keep it past that: the process then says so in
  one line and ends with ``PREEMPTED_EXIT_CODE``, without the checkpoint and
  record of the stop; a rerun resumes from the last complete checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from scaling import multihost
from scaling.settings import STOP_GRACE_SECONDS, stop_grace_seconds  # noqa: F401 - the stop's names

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"; the sweep relaunch loop keys on it


class Preempted(Exception):
    """Raised by ``run`` after SIGTERM or Ctrl-C, once a checkpoint of the current step is saved."""


class LeaseLost(Exception):
    """Another process took this run's lease over (it judged this one dead); stop writing to the run."""


class Stop:
    """Whether to stop, asked at step boundaries: a signal, agreed by every process. (A run's lease is its
    own: ``scaling.run.member.Member.check_lease``.)

    - ``listening()``: while inside, SIGTERM and SIGINT (Ctrl-C) set ``signal``
      (their name); a second Ctrl-C ends the process at once (status 130),
      saving nothing more. SIGTERM also starts the grace period (see the
      module): if the outermost ``listening`` block is still open when it
      runs out, the process ends at once with ``PREEMPTED_EXIT_CODE``.
      Nested ``listening`` blocks install the handlers once. Outside the
      main thread, where Python cannot install handlers, nothing is listened for.
    - ``agreed(step)``: whether to stop after ``step``, the same answer on
      every process, with a transfer between them only on check steps
      (``StopCheck``); ``start(step)`` begins a run segment's schedule.
    """

    def __init__(self):
        self.signal: str | None = None  # "SIGTERM" or "SIGINT" once one arrived
        self._check = StopCheck(0)
        self._listeners = 0
        self._deadline: threading.Timer | None = None  # ends the process once the grace period is over

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived (on this process)."""
        return self.signal is not None

    @contextlib.contextmanager
    def listening(self):
        """Listen for SIGTERM and SIGINT while inside (see the class)."""
        if self._listeners or threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(number, _frame):
            if number == signal.SIGINT and self.requested:
                os.write(2, b"interrupted again: exiting now, without waiting for the checkpoint\n")
                os._exit(130)
            self.signal = signal.Signals(number).name
            if number == signal.SIGTERM:
                self._start_grace_period()

        previous = {number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGINT)}
        self._listeners += 1
        try:
            yield self
        finally:
            self._listeners -= 1
            for number, old in previous.items():
                signal.signal(number, old)
            if self._deadline is not None:  # ended in time (what follows is bounded: see Checkpoints.close)
                self._deadline.cancel()
                self._deadline = None

    def _start_grace_period(self) -> None:
        """After SIGTERM: end the process in ``stop_grace_seconds()`` unless the stop has ended by then."""
        grace = stop_grace_seconds()
        if self._deadline is not None or grace <= 0:
            return

        def expire():
            os.write(2, (f"stopped by {self.signal}: not ended within {grace:g} s of the signal "
                         "(SCALING_STOP_GRACE_SECONDS; storage slow or unreachable?); exiting now without the "
                         "checkpoint and record of this stop; a rerun resumes from the last complete "
                         "checkpoint\n").encode())
            os._exit(PREEMPTED_EXIT_CODE)

        self._deadline = threading.Timer(grace, expire)
        self._deadline.daemon = True
        self._deadline.start()

    def start(self, step: int) -> None:
        """Begin the check schedule of a run segment whose first step is ``step``."""
        self._check = StopCheck(step)

    def agreed(self, step: int) -> bool:
        """True, on every process, when any process was asked to stop; with several processes this is
        answered only on check steps (False between them, with no transfer)."""
        return self._check.due(step) and self._check.agree(self.requested, step)

    def any_process(self) -> bool:
        """True on every process if any was asked to stop (one transfer with several processes);
        for moments every process reaches together, such as the end of a run."""
        return multihost.any_process(self.requested)

    def preempted(self, when: str) -> Preempted:
        """The ``Preempted`` to raise: ``"stopped by SIGTERM <when>"``."""
        return Preempted(f"stopped by {self.signal or 'SIGTERM'} {when}")


class StopCheck:
    """Whether to stop for SIGTERM, agreed by all processes at steps they all know in advance.

    One process: the local flag, read on every step, costs nothing. Several
    processes (pod-wide): they must save the same step, so they share their
    flags with one ``process_allgather``; that is a host round trip which
    drains the dispatch queue, so it happens only on *check steps*, never on
    the steps between. Each check also agrees on the next check step: every
    process proposes as many steps as fit in ``CHECK_SECONDS`` at the speed
    it measured since the last check, and all take the smallest proposal,
    so checks come every few seconds whatever the model size, well inside
    the short notice a preempted spot VM gets (about 30 s on GCE).

    JAX's own ``multihost_utils.reached_preemption_sync_point`` (which orbax's
    ``reached_preemption`` wraps) would make the check free on every step,
    but its SIGTERM listener (tsl/distributed_runtime/preemption/
    preemption_notifier.cc, a C ``std::signal`` handler) is replaced by the
    Python SIGTERM handler that ``Stop.listening`` installs, so it would
    never hear the signal; and it wants every call, from the same first
    step, to be made by every process.
    """

    CHECK_SECONDS = 5.0
    MAX_INTERVAL = 1000  # steps

    def __init__(self, start_step: int):
        self.next_step = start_step
        self._last_step, self._last_time = start_step, time.perf_counter()

    def due(self, step: int) -> bool:
        """True when ``step`` is a check step (always with one process)."""
        return multihost.process_count() == 1 or step >= self.next_step

    def agree(self, flag: bool, step: int) -> bool:
        """True on every process if any process saw SIGTERM; with several processes, call only when ``due``."""
        if multihost.process_count() == 1:
            return flag
        now = time.perf_counter()
        proposal = 1  # nothing measured yet
        if step > self._last_step:
            seconds_per_step = max((now - self._last_time) / (step - self._last_step), 1e-6)
            proposal = int(min(max(self.CHECK_SECONDS / seconds_per_step, 1), self.MAX_INTERVAL))
        shared = multihost.gather([int(flag), proposal])  # (processes, 2)
        self.next_step = step + int(shared[:, 1].min())
        self._last_step, self._last_time = step, now
        return bool(shared[:, 0].any())
