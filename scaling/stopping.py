"""Stopping a run early: preemption (SIGTERM) and a lease taken over by another process.

- ``Preempted``: raised after SIGTERM once a checkpoint of the current step
  is saved; the process exits with ``PREEMPTED_EXIT_CODE`` so that relaunch
  loops know the run can resume.
- ``LeaseLost``: another launcher judged this process dead and took the run
  over; this process stops writing to the run at once.
- ``StopCheck``: when to look for SIGTERM so that, with several processes,
  they all stop at the same step without a transfer on every step.
"""

from __future__ import annotations

import time

import jax
import numpy as np

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"; the sweep relaunch loop keys on it


class Preempted(Exception):
    """Raised by ``run`` after SIGTERM, once a checkpoint of the current step is saved."""


class LeaseLost(Exception):
    """Another process took this run's lease over (it judged this one dead); stop writing to the run."""


def check_lease(stop_requested: dict, *, read_now: bool = False) -> None:
    """``LeaseLost`` if this run's lease was taken over: from the heartbeat's flag every step, and
    with ``read_now`` from the lease itself (before a checkpoint or the record is written)."""
    run_lease = stop_requested["lease"]
    if run_lease is not None and (run_lease.lost or (read_now and not run_lease.still_held())):
        raise LeaseLost("another process took over this run's lease; stopped without writing to it")


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
    Python SIGTERM handler that ``run`` and the sweep launcher install, so it
    would never hear the signal; and it wants every call, from the same
    first step, to be made by every process.
    """

    CHECK_SECONDS = 5.0
    MAX_INTERVAL = 1000  # steps

    def __init__(self, start_step: int):
        self.next_step = start_step
        self._last_step, self._last_time = start_step, time.perf_counter()

    def due(self, step: int) -> bool:
        """True when ``step`` is a check step (always with one process)."""
        return jax.process_count() == 1 or step >= self.next_step

    def agree(self, flag: bool, step: int) -> bool:
        """True on every process if any process saw SIGTERM; with several processes, call only when ``due``."""
        if jax.process_count() == 1:
            return flag
        from jax.experimental import multihost_utils

        now = time.perf_counter()
        proposal = 1  # nothing measured yet
        if step > self._last_step:
            seconds_per_step = max((now - self._last_time) / (step - self._last_step), 1e-6)
            proposal = int(min(max(self.CHECK_SECONDS / seconds_per_step, 1), self.MAX_INTERVAL))
        shared = np.asarray(multihost_utils.process_allgather(np.array([int(flag), proposal], np.int32)))
        shared = shared.reshape(-1, 2)
        self.next_step = step + int(shared[:, 1].min())
        self._last_step, self._last_time = step, now
        return bool(shared[:, 0].any())
