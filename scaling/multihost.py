"""How the processes of one JAX job agree: process 0 decides, the others follow.

The hosts of a pod read shared storage each at their own moment: one may see
a ``result.json`` or a checkpoint that another does not see yet. Wherever
every process must act alike (train the same runs, resume the same step,
stop after the same step), they agree with one of these functions.

With several processes each call is a collective (``jax.experimental.multihost_utils``):
every process must make the same calls in the same order, and each is a host
round trip that drains the dispatch queue, so none belongs on every training
step. With one process each is the identity or does nothing, at no cost.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np


def process_count() -> int:
    """Processes of this JAX job (1 unless ``jax.distributed`` started several)."""
    return jax.process_count()


def broadcast_from_process_0(value: bool | int) -> bool | int:
    """Process 0's ``value`` (a bool, or an int that fits 32 bits), on every process; ``value`` itself
    with one process."""
    if process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    shared = int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(value))))
    return bool(shared) if isinstance(value, (bool, np.bool_)) else shared


def broadcast_ints_from_process_0(values: Sequence[int]) -> list[int]:
    """Process 0's list of ints (each fits 32 bits), on every process, whatever the length of the
    others' lists; ``values`` itself (as a list) with one process. Two transfers: the length, then the values."""
    if process_count() == 1:
        return [int(v) for v in values]
    from jax.experimental import multihost_utils

    count = broadcast_from_process_0(len(values))
    padded = np.full(max(count, 1), -1, np.int32)  # a process whose list is longer sends only its head
    padded[:min(count, len(values))] = list(values)[:count]
    return [int(v) for v in np.asarray(multihost_utils.broadcast_one_to_all(padded))[:count]]


def gather(value: bool | int | Sequence[int]) -> np.ndarray:
    """Every process's ``value`` (the same shape on each), stacked by process index: shape
    ``(processes, *shape)``, int32; one transfer (none with one process)."""
    local = np.asarray(value, np.int32)
    if process_count() == 1:
        return local[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local)).reshape(process_count(), *local.shape)


def any_process(flag: bool) -> bool:
    """True on every process if ``flag`` is true on any; ``flag`` itself with one process."""
    return bool(gather(flag).any())


def all_agree(value: int) -> bool:
    """True on every process if every process holds the same ``value`` (an int that fits 32 bits, such as
    a digest's prefix); always True with one process."""
    return len(set(gather(value).tolist())) == 1


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (the same name on all); nothing with one process."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
