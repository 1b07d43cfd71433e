"""Settings read from environment variables: durations that tests and slow storage tune."""

from __future__ import annotations

import os


def seconds(variable: str, default: float) -> float:
    """The number of seconds in environment variable ``variable``, or ``default`` when it is unset or
    empty; ``ValueError`` naming the variable when it is not a number."""
    text = os.environ.get(variable)
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{variable}={text!r}: expected a number of seconds") from None


STOP_GRACE_SECONDS = 25.0  # within a preempted TPU VM's ~30 s notice and SLURM's default KillWait of 30 s


def stop_grace_seconds() -> float:
    """Seconds a process may take to end after SIGTERM: ``SCALING_STOP_GRACE_SECONDS`` if set (0 or less: no
    limit), else ``STOP_GRACE_SECONDS``. Read by the stop (``stopping.py``) and by the background saver, which
    gives a write in flight half of it."""
    return seconds("SCALING_STOP_GRACE_SECONDS", STOP_GRACE_SECONDS)
