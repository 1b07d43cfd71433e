"""The ``run`` command's loop: train a share's runs one after another in this process.

In-process keeps start-up cheap, lets the runs of one shape (seeds, learning
rates) share one compiled step (``scaling.model.program``), and lets pod-wide mode
start ``jax.distributed`` once for the whole sweep. The price: a hard crash
of the process (host out of memory, a segfault) stops the sweep; rerunning
resumes from the crashed run's last checkpoint.

Each run goes through ``scaling.run.train.run``, and how it ends decides what
the launcher does next (``Next``): go on with the next run, wait for a run
that another live launcher holds (``sweeps/busy.py``), or stop the sweep
with an exit status. A signal stops the sweep whenever it arrives: mid-run
at the next step, at the end of a run (its final evaluation) or between
runs before the next one starts, because the loop and its runs share one
``scaling.run.stopping.Stop``. Importing this module imports JAX and the
trainer; ``sweeps.launch`` does so only to train.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, NamedTuple

import jax

from scaling.cli import fmt
from scaling.run import progress, train
from scaling.run.ending import ResumesElsewhere
from scaling.run.stopping import PREEMPTED_EXIT_CODE, LeaseLost, Preempted, Stop
from scaling.store import checkpoints, lease, records, rundir
from sweeps import busy as busy_lib
from sweeps.packing import Pack
from sweeps.spec import RunSpec
from sweeps.state import read_state


class Next(NamedTuple):
    """What the launcher does after one attempt at a run (``RunLoop.attempt``)."""

    done: bool = True  # nothing more for this launch to do about the run: the progress bar counts it
    failed: bool = False  # the exit status is 1, whatever the run's record says
    held: bool = False  # another live launcher holds it: waited for, or exit 75 (--when-busy, sweeps/busy.py)
    exit_code: int | None = None  # stop the sweep now, with this exit status


DONE, HELD, FAILED = Next(), Next(done=False, held=True), Next(failed=True)
STOPPED = Next(done=False, exit_code=PREEMPTED_EXIT_CODE)  # a signal: the run saved a checkpoint
STORAGE_LOST = Next(done=False, failed=True, exit_code=1)  # writes abandoned: the other runs would hang too


class RunLoop:
    """Trains runs in order with one ``Stop``; ``say`` prints a line (a no-op off process 0), and
    ``train_arguments(run)`` gives ``scaling.run.train.run``'s further keyword arguments for a run.

    After ``train``: ``busy`` holds the runs left to other launchers (with
    ``when_busy="exit"``), ``failed`` the names of runs that failed here.
    """

    def __init__(self, workdir, say: Callable[[str], None], *, show_progress: bool, when_busy: str,
                 train_arguments: Callable[[RunSpec], dict] = lambda run: {}):
        self.workdir, self.say, self.show_progress, self.when_busy = workdir, say, show_progress, when_busy
        self.train_arguments = train_arguments
        self.stop = Stop()
        self.bar = None
        self.busy, self.failed, self.announced = [], [], set()

    def train(self, queue: list[RunSpec], desc: str) -> int | None:
        """Train ``queue`` in order, one run at a time, then wait for the runs other launchers hold, unless
        ``when_busy`` is ``exit``. An exit status if the sweep stops early, else None."""
        return self._train_groups([[run] for run in queue], desc)

    def train_one(self, run: RunSpec) -> int | None:
        """Attempt ``run`` and do what its outcome says; an exit status if the sweep stops here."""
        return self.carry_out(run, *self.attempt(run))

    def carry_out(self, run: RunSpec, step: Next, line: str | None, check_stop: bool = True) -> int | None:
        """Do what one attempt at ``run`` says (``step``), say ``line``; an exit status if the sweep stops
        here. ``check_stop``: stop the sweep after this run if a signal came (a pack checks once, after all)."""
        if step.held:
            self.busy.append(run)
            if run.run_id in self.announced:  # once, not at every poll
                line = None
            self.announced.add(run.run_id)
        if step.failed:
            self.failed.append(run.name)
        if line:
            self.say(line)
        if step.exit_code is not None:
            return step.exit_code
        if step.done:
            self.bar.update(1)
        if check_stop and self.stop.any_process():  # all stop together, or the others would wait in the next run
            self.say(f"stopping after {run.name}: {self.stop.signal or 'SIGTERM'} received; rerun the same command "
                     "to resume")
            return PREEMPTED_EXIT_CODE
        return None

    def train_packs(self, packs: list[Pack], desc: str) -> int | None:
        """Train ``packs`` (``sweeps.packing.plan_packs``) in order, each as one program
        (``scaling.run.train.run_pack``; a pack of one alone), then as ``train`` does. A run that left its pack to
        resume at its own step trains alone right after it."""
        return self._train_groups([list(pack.runs) for pack in packs], desc)

    def _train_groups(self, groups: list[list[RunSpec]], desc: str) -> int | None:
        """Train each group of runs (``train_pack``), then, with ``when_busy="wait"``, the runs other
        launchers held, one at a time as they come free."""
        # A terminal gets a bar; a log file one line per finished run (scaling/run/progress.py).
        total = sum(map(len, groups))  # none (a finished share): no "0/0 runs" display
        self.bar = progress.bar(total=total, desc=desc, unit="run", interval=0, dynamic_ncols=True,
                                file=sys.stderr, shown=self.show_progress and total > 0)
        with self.stop.listening(), contextlib.closing(self.bar):
            while groups:
                self.busy = []
                for group in groups:
                    code = self.train_pack(group)
                    if code is not None:
                        return code
                groups = []
                if self.busy and self.when_busy == "wait":
                    groups = [[run] for run in self.wait_for_held()]
                    if self.stop.requested:
                        self.say(f"stopped while waiting: {self.stop.signal} received; rerun the same command "
                                 "to resume")
                        return PREEMPTED_EXIT_CODE
        return None

    def train_pack(self, pack: list[RunSpec]) -> int | None:
        """Train one pack and do what each run's outcome says (``train_one`` for a pack of one)."""
        if len(pack) == 1:
            return self.train_one(pack[0])
        alone, codes = [], []
        for run, (step, line) in zip(pack, self.attempt_pack(pack)):
            if step is None:  # left the pack to resume at its own step
                alone.append(run)
                self.say(line)
                continue
            codes.append(self.carry_out(run, step, line, check_stop=False))  # every run's line is said
        code = next((code for code in codes if code is not None), None)
        if code is not None:
            return code
        if self.stop.any_process():
            self.say(f"stopping after the pack of {', '.join(run.name for run in pack)}: "
                     f"{self.stop.signal or 'SIGTERM'} received; rerun the same command to resume")
            return PREEMPTED_EXIT_CODE
        for run in alone:
            code = self.train_one(run)
            if code is not None:
                return code
        return None

    def attempt_pack(self, pack: list[RunSpec]) -> list[tuple[Next | None, str]]:
        """Train ``pack`` as one program; per run what to do next and the line saying why (``Next`` None: it
        left the pack and trains alone next)."""
        arguments = [self.train_arguments(run) for run in pack]
        names = ", ".join(run.name for run in pack)
        self.say(f"pack of {len(pack)} runs as one program: {names}")
        outcomes = train.run_pack([run.config for run in pack], [run.run_dir(self.workdir) for run in pack],
                                       show_progress=self.show_progress, stop=self.stop,
                                       estimates=[a.get("estimate") for a in arguments])
        results = []
        for run, outcome in zip(pack, outcomes):
            if isinstance(outcome, ResumesElsewhere):
                results.append((None, f"{run.name}: {outcome}"))
            else:
                results.append(self.outcome(run, outcome))
        return results

    def attempt(self, run: RunSpec) -> tuple[Next, str]:
        """Train ``run`` unless another launcher has finished it; what to do next, and the line saying why."""
        # Finished by another launcher since we looked? (Pod-wide, process 0's list is what counts.)
        if jax.process_count() == 1 and read_state(run, self.workdir).status == "finished":
            return DONE, f"{run.name}: already finished by another launcher"
        try:
            result = train.run(run.config, run.run_dir(self.workdir), show_progress=self.show_progress,
                               stop=self.stop, raise_if_finished=True, **self.train_arguments(run))
        except Exception as error:  # noqa: BLE001 - each is one outcome of the run (``outcome``)
            return self.outcome(run, error)
        return self.outcome(run, result)

    def outcome(self, run: RunSpec, result) -> tuple[Next, str]:
        """What to do after ``run`` ended with ``result``: its record, or the exception that ended it."""
        if isinstance(result, records.RunRecord):
            return DONE, (f"{run.name}: {result.status}, eval loss {fmt(result.final_eval_loss, '.4f')}, "
                          + progress.run_time(result.steps, result.train_seconds, result.wall_seconds))
        if isinstance(result, train.AlreadyFinished):  # finished by another launcher after the check above
            return DONE, f"{run.name}: already finished by another launcher"
        if isinstance(result, Preempted):
            return STOPPED, f"{run.name}: {result}; rerun the same command to resume"
        if isinstance(result, lease.RunBusy):
            return HELD, f"{run.name}: skipped, another launcher holds it: {result}"
        if isinstance(result, LeaseLost):
            return HELD, f"{run.name}: stopped: {result}"
        if isinstance(result, rundir.ConfigMismatch):
            return FAILED, f"{run.name}: not trained: {result}"
        if not isinstance(result, Exception):  # KeyboardInterrupt, SystemExit: not a run's outcome
            raise result
        if checkpoints.abandoned_writes():
            return STORAGE_LOST, f"{run.name}: failed: {rundir.one_line(result)}; stopping the sweep"
        log = run.run_dir(self.workdir) / "error.log"
        where = f"traceback in {log}" if log.exists() else f"run directory {run.run_dir(self.workdir)}"
        return FAILED, f"{run.name}: failed: {rundir.one_line(result)} ({where})"

    def wait_for_held(self) -> list[RunSpec]:
        """One poll of the runs other launchers hold (``sweeps/busy.py``); the runs to try again."""
        self.say(f"waiting for {len(self.busy)} run(s) held by another launcher: " + "; ".join(
            f"{run.name} by {busy_lib.holder_text(run, self.workdir)}" for run in self.busy))
        done, again = busy_lib.wait_once(self.busy, self.workdir, self.stop, self.say)
        self.bar.update(len(done))
        self.busy = []
        return again
