"""What a sweep's work directory says: each run's state, tables of runs, and the end-of-sweep summary.

Reading never imports the trainer or starts JAX, so ``list`` and ``status``
work on a TPU worker whose chips a training process holds. In a job of several
processes, ``agree_on_runs`` and ``agreed_start_steps`` then share process 0's
reading with every process (through JAX, which ``run`` has started by then).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import textwrap

from scaling.cli import fmt, text_table
from scaling.store.rundir import COMMIT_FILE, checkpoint_steps  # noqa: F401 - COMMIT_FILE: read by the tests
from sweeps.spec import RunSpec, Sweep


STATUSES = ("pending", "resumable", "unreadable", "failed", "diverged", "finished")
TO_TRAIN = ("pending", "resumable", "unreadable", "failed")


# ---------------------------------------------------------------------------
# What is on disk


class RunState(collections.namedtuple("RunState", "spec status checkpoint_step record")):
    """A run and what its directory says: status, latest checkpoint step (or None), result record."""

    def to_dict(self) -> dict:
        record = self.record or {}
        return {**self.spec.describe(), "status": self.status, "steps": self.spec.config.steps,
                "checkpoint_step": self.checkpoint_step, "final_eval_loss": record.get("final_eval_loss"),
                "train_seconds": record.get("train_seconds"), "wall_seconds": record.get("wall_seconds"),
                **{key: record.get(key) for key in ("mfu", "estimated_step_seconds", "estimated_mfu")}}


def resume_step(run_dir) -> int:
    """The step a run in ``run_dir`` would resume from: its newest committed checkpoint's step, 0 if it has
    none or its checkpoints cannot be listed (the trainer passes over a damaged one and resumes earlier)."""
    try:
        steps = checkpoint_steps(run_dir)
    except OSError:
        steps = []
    return steps[-1] if steps else 0


def read_state(run: RunSpec, workdir) -> RunState:
    """The run's status from its directory, without importing the trainer or starting JAX.

    A record that cannot be read, or cannot be trusted (``scaling.store.record_checks``:
    another run's record, a final loss the metrics log does not hold) gives status
    ``unreadable`` (with the reason in ``record["error"]``); ``run`` trains such a run again, resuming from
    its checkpoints, and the others are unaffected.
    """
    from scaling.store import record_checks, records

    run_dir = run.run_dir(workdir)
    try:  # a record of another run, or with a final loss its metrics log does not hold, counts as damaged
        found = record_checks.read_checked_record(run_dir, run.run_id)
        record = dataclasses.asdict(found) if found is not None else None
        status = found.status if found is not None else None
    except records.RecordError as error:
        record, status = {"error": str(error)}, "unreadable"
    try:
        steps = checkpoint_steps(run_dir)
    except OSError:
        steps = []
    step = steps[-1] if steps else None
    if status not in ("finished", "diverged", "failed", "unreadable"):  # running, stopped or no record
        status = "resumable" if step is not None else "pending"
    return RunState(run, status, step, record)


def read_states(runs: list[RunSpec], workdir) -> list[RunState]:
    """``read_state`` of every run, in order; threads hide the latency of gs:// lookups."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda run: read_state(run, workdir), runs))


def foreign_run_dirs(sweep: Sweep, runs: list[RunSpec], workdir) -> list[str]:
    """Run directories under the sweep's directory that this expansion does not produce."""
    from etils import epath

    sweep_dir = epath.Path(workdir) / sweep.name
    if not sweep_dir.exists():
        return []
    ours = {run.run_id for run in runs}
    return sorted(p.name for p in sweep_dir.iterdir()
                  if p.name not in ours and ((p / "config.json").exists() or (p / "result.json").exists()))


# ---------------------------------------------------------------------------
# Tables


# ---------------------------------------------------------------------------
# One reading for every process of a multi-process job


class SweepMismatch(ValueError):
    """The processes of one job expanded different sweeps."""


def agree_on_runs(sweep: Sweep, states: list[RunState], todo: list[RunState]) -> list[RunState]:
    """Process 0's list of runs to train, in its order, on every process of a multi-process job.

    Each host reads run records from the shared work directory itself, and a
    host may see a ``result.json`` that another does not yet; if they then
    trained different runs, they would wait for each other forever in the
    first collective. Every process must also have expanded the same sweep
    (same code, sweep file and ``--set``); otherwise all of them stop here.
    """
    from scaling import multihost

    if not multihost.all_agree(int(sweep.digest()[:7], 16)):
        raise SweepMismatch("the processes expanded different sweeps (sweep file, --set or code differ); "
                            "run the same commit and command on every host")
    position = {state.spec.run_id: i for i, state in enumerate(states)}
    agreed = multihost.broadcast_ints_from_process_0([position[state.spec.run_id] for state in todo])
    return [states[i] for i in agreed]


def agreed_start_steps(todo: list[RunState]):
    """``start_step(run)`` for ``packing.plan_packs``: the step each run of ``todo`` resumes from (its newest
    checkpoint, 0 for none), as process 0 read it, so that every process plans the same packs (the trainer
    restores from process 0's listing too)."""
    from scaling import multihost

    steps = multihost.broadcast_ints_from_process_0([state.checkpoint_step or 0 for state in todo])
    by_id = {state.spec.run_id: int(step) for state, step in zip(todo, steps)}
    return lambda run: by_id[run.run_id]



def run_table(states: list[RunState], multiple_of: int | None = None, packs: dict[str, str] | None = None) -> str:
    """One line per run: name, folder (the run directory under the sweep's, a hash of the run's config;
    ``runs/<sweep>/<name>`` finds it too), L, d, N = 12·L·d², budget, seed, status, eval loss (nats/token); when the
    runs have budgets, a footnote on how N follows from the budget (widths rounded to ``multiple_of``).
    ``packs`` (run id -> pack label, ``sweeps.packing.labels``) adds a ``pack`` column after the status."""
    header = ["name", "folder", "L", "d", "N (12·L·d²)", "budget", "seed", "status", "eval loss"]
    if packs is not None:
        header.insert(8, "pack")
    rows = []
    for state in states:
        run, record = state.spec, state.record or {}
        status = state.status + (f" @{state.checkpoint_step}" if state.status == "resumable" else "")
        rows.append([run.name, run.run_id, run.depth, run.width, f"{run.params:.3g}", fmt(run.budget, ".3g"), run.seed,
                     status, fmt(record.get("final_eval_loss"), ".4f")])
        if packs is not None:
            rows[-1].insert(8, packs.get(run.run_id, "-"))
    table = text_table(header, rows)
    if any(state.spec.budget is not None for state in states):
        table += "\n" + budget_note(multiple_of)
    return table


def budget_note(multiple_of: int | None) -> str:
    """Why a run's N is not its budget (``scaling.model.budget.width_for_budget`` says how the width is chosen)."""
    channels = f"{multiple_of} channels" if multiple_of else "the sweep's multiple_of"
    return textwrap.fill(f"budget: the N the sweep file asks for; N: the run's own 12·L·d², its width being "
                         f"the multiple of {channels} whose N is nearest the budget (in log N). They differ by "
                         "up to 2x at the narrowest width.", width=100)


def counts(states: list[RunState]) -> dict:
    tally = collections.Counter(state.status for state in states)
    return {status: tally[status] for status in STATUSES if tally[status]}


def counts_line(states) -> str:
    return ", ".join(f"{n} {status}" for status, n in counts(states).items()) or "no runs"


def skipped_lines(skipped) -> list[str]:
    return [f"skipped: depth {s.depth}, budget {s.budget:.3g}: {s.reason}" for s in skipped]


def unreadable_lines(states) -> list[str]:
    return [f"unreadable record: {s.record['error']}" for s in states if s.status == "unreadable"]


def foreign_note(sweep, runs, workdir) -> list[str]:
    others = foreign_run_dirs(sweep, runs, workdir)
    if not others:
        return []
    return [f"note: {len(others)} run director{'y' if len(others) == 1 else 'ies'} in "
            f"{os.path.join(str(workdir), sweep.name)} belong to no run of this sweep (changed settings?); "
            "`python -m analysis fit` on that directory would read them too"]


# ---------------------------------------------------------------------------
# Analysis summary (only this sweep's records, never other runs in the directory)


def analysis_lines(states: list[RunState], sweep_dir: str) -> list[str]:
    """What ``analysis.summarize`` says about this sweep's records (seed means, transitions, fits)."""
    from analysis.summary import Outcome, summarize

    result = summarize([s.record for s in states if s.status in ("finished", "diverged", "failed")],
                       source=sweep_dir)
    lines = result.lines()
    if result.outcome is Outcome.NO_SEED_NOISE:
        lines.append(f"to assume a seed noise anyway: python -m analysis fit {sweep_dir} --loss-std 0.02")
    return lines


def summary(sweep: Sweep, states: list[RunState], workdir, packs: dict[str, str] | None = None) -> str:
    """Counts per status, the results table (with a ``pack`` column when ``packs`` is given, as in
    ``run_table``), loss at equal size and the analysis."""
    sweep_dir = os.path.join(str(workdir), sweep.name)
    from sweeps.preflight import calibration

    parts = [f"== sweep {sweep.name}: {counts_line(states)} (of {len(states)} runs)",
             run_table(states, sweep.multiple_of, packs), *calibration.lines(states)]
    parts += ["", "analysis:"] + ["  " + line for line in analysis_lines(states, sweep_dir)]
    parts.append(f"\nrecords: {sweep_dir}  (python -m analysis fit {sweep_dir})")
    return "\n".join(parts)
