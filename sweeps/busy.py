"""Runs of a launcher's share that another launcher holds: wait for them, or hand the share back.

A run whose lease another live process holds (``scaling.store.lease.RunBusy``), or
that another process took over (``LeaseLost``), is not this launcher's to
train now, but it is still unfinished. A launcher that exited 0 with such a
run would tell SkyPilot its job SUCCEEDED; SkyPilot then deletes the slice
and nothing retries the run if its holder dies. So ``sweeps.launch run``:

- ``--when-busy wait`` (default): polls every ``POLL_SECONDS`` until each such
  run is finished by its holder, or its lease is released or goes stale
  (``scaling.store.lease.STALE_SECONDS`` without a heartbeat: a preempted slice's
  launcher), and then trains it itself (the lease is taken over);
- ``--when-busy exit``: exits 75 (``PREEMPTED_EXIT_CODE``) naming the runs,
  which SkyPilot's ``recover_on_exit_codes: [75]`` restarts without counting
  it as an error, and SLURM's requeue or a rerun retries the same way.
"""

from __future__ import annotations

import time

from sweeps.state import read_state

POLL_SECONDS = 30.0  # a lease's heartbeat period: a stale or released lease is seen within one poll
WHEN_BUSY = ("wait", "exit")


def holder_text(run, workdir) -> str:
    """Who holds ``run``'s lease, as ``host pid N (heartbeat S s ago)``, or ``nobody now``."""
    from scaling.store.lease import Lease

    try:
        holder = Lease(run.run_dir(workdir)).holder()
    except Exception as error:  # noqa: BLE001 - storage trouble: say so and go on polling
        return f"unknown ({type(error).__name__})"
    if holder is None:
        return "nobody now"
    age = time.time() - float(holder.get("heartbeat", 0))
    return f"{holder.get('host')} pid {holder.get('pid')} (heartbeat {age:.0f} s ago)"


def exit_message(names: list[str]) -> str:
    return (f"{len(names)} run(s) of this share are held by another launcher: {', '.join(names)}; exiting 75 "
            "so that the job is retried later (--when-busy wait waits for them instead)")


def wait_once(runs: list, workdir, stop, say, poll_seconds: float | None = None) -> tuple[list, list]:
    """Sleep one poll (stopping early on a signal), then read each held run again.

    Returns (runs now done by their holder: finished or diverged, runs to try
    again: every other one; trying takes a stale or released lease, or finds
    it still held).
    """
    deadline = time.monotonic() + (POLL_SECONDS if poll_seconds is None else poll_seconds)
    while time.monotonic() < deadline and not stop.requested:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    done, again = [], []
    for run in runs:
        status = read_state(run, workdir).status
        (done if status in ("finished", "diverged") else again).append(run)
        if status in ("finished", "diverged"):
            say(f"{run.name}: {status} by the launcher that held it")
    return done, again
