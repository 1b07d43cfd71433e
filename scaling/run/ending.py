"""How a run ends: one mapping from what ended it to its record's status and its exit codes.

A run ends normally, ``finished`` or ``diverged``, or by an exception.
``ending`` decides, in this one place, what each end means for the three
parties that hear of it (``Ending``):

- the run record (``result.json``): its status, or none at all;
- the tracker: the exit code wandb's run finishes with;
- the process: the exit code of the command line that trained the run.

| what ended the run                                   | record    | tracker | process |
|------------------------------------------------------|-----------|---------|---------|
| trained to the last step, final evaluation finite    | finished  | 0       | 0       |
| a step or the final evaluation not finite            | diverged  | 1       | 1       |
| ``Preempted`` (SIGTERM, Ctrl-C; checkpoint saved)     | stopped   | 75      | 75      |
| ``LeaseLost`` (another process owns the run now)      | none      | 1       | 2       |
| refused before it began (``REFUSED``)                 | none      | -       | 2       |
| ``AlreadyFinished`` (another launcher trained it)     | none      | -       | 0       |
| any other error                                      | failed    | 1       | 1       |

``as_raised`` first says what an exception means for the run, so that the
table sees one kind of exception per end: any error once the lease was lost
is ``LeaseLost``, and a checkpoint write given up on because a stop arrived
while storage hung is ``Preempted``. 75 is ``PREEMPTED_EXIT_CODE``.
"""

from __future__ import annotations

from typing import NamedTuple

from scaling.run.stopping import PREEMPTED_EXIT_CODE, LeaseLost, Preempted, Stop
from scaling.store import lease as lease_lib, records, rundir
from scaling.store.checkpoints import WriteAbandoned

USAGE_EXIT_CODE = 2  # the input or the run directory cannot be used as given (argparse's code for bad usage)


class AlreadyFinished(Exception):
    """The run had finished before this call took its lease (``run(..., raise_if_finished=True)``)."""

    def __init__(self, record: records.RunRecord):
        super().__init__(f"run {record.run_id} had already finished")
        self.record = record


class ResumesElsewhere(Exception):
    """A run of a pack (``scaling.run.train.run_pack``) whose newest checkpoint is at another step than the pack's:
    it leaves the pack before it trains, with nothing recorded, and trains alone or in another pack."""


# Raised before a run begins (nothing of it is recorded): a directory holding another config's run, a run
# another live process trains, a record of an older schema that must be migrated first, a run that leaves its
# pack to resume at its own step.
REFUSED = (rundir.ConfigMismatch, lease_lib.RunBusy, records.OutdatedRecord, ResumesElsewhere)


class Ending(NamedTuple):
    """What one end of a run means: the record's ``status`` (None: no record is written), the exit code
    the tracker (wandb) finishes with, and the exit code of the process that trained the run."""

    status: str | None
    tracker_exit_code: int
    exit_code: int


def ending(error: BaseException | None, status: str = "finished") -> Ending:
    """The ``Ending`` of a run that ended by ``error`` (as ``as_raised`` gives it), or, when ``error`` is
    None, of one that trained to its end with ``status`` (``finished`` or ``diverged``). See the module."""
    if error is None:
        code = 0 if status == "finished" else 1
        return Ending(status, code, code)
    if isinstance(error, Preempted):
        return Ending("stopped", PREEMPTED_EXIT_CODE, PREEMPTED_EXIT_CODE)
    if isinstance(error, AlreadyFinished):
        return Ending(None, 0, 0)
    if isinstance(error, (LeaseLost, *REFUSED)):
        return Ending(None, 1, USAGE_EXIT_CODE)
    return Ending("failed", 1, 1)


def as_raised(error: BaseException, stop: Stop, lease_lost: bool) -> BaseException:
    """What ``error`` means for a run that ``stop`` stops, as the exception the run raises: ``LeaseLost``
    for any error once its lease was lost (``lease_lost``: the run's files are another process's now),
    ``Preempted`` for a checkpoint write given up on because a stop arrived while it hung; else ``error``."""
    if lease_lost and not isinstance(error, LeaseLost):
        return LeaseLost(f"another process took over this run's lease; stopped without writing to it "
                         f"(then: {rundir.one_line(error)})")
    if isinstance(error, WriteAbandoned) and error.stopped:
        return stop.preempted(f"while waiting for a write that storage did not finish ({error}); resumes "
                              "from the previous checkpoint")
    return error
