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
