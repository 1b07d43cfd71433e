"""Train runs: one run alone, or several runs of one shape as one program (a pack); one life cycle for both.

A run alone is a pack of one. ``run`` trains one config into its run
directory; ``run_pack`` trains k configs with equal ``run_program.pack_key``
(one program, one step count, one data source and one loop cadence; they
differ in their seeds and learning-rate numbers). Read top to bottom:

1. ``train_members``: the life cycle. Each run takes its lease and begins its
   ending (``member.Member``: lease, record, checkpoints, tracker, its own
   loop state); the data is read and each config resolved (the model's
   vocabulary is the tokenizer's) before its record is filled in; the
   program is built (``run_program``); each run restores its newest
   checkpoint that reads back whole (parameters, optimizer, step; the data
   position and per-step RNG are pure functions of (seed, step), the wandb
   id is in the checkpoint's metadata) or starts fresh; the loop trains
   (``loop.Training``, with its hooks); each run ends in one place.
2. A run of a pack whose newest checkpoint is at another step than most of
   the pack's leaves it before training (``ending.ResumesElsewhere``,
   nothing recorded): the launcher trains it alone.

Guarantees (for every run, alone or packed):
- A step whose loss or gradient norm is not finite is not applied, so
  a NaN state never reaches a checkpoint; the run stops as ``diverged``
  (in a pack, alone: the others go on).
- SIGTERM (how TPU preemption arrives) and Ctrl-C (SIGINT) make the loop
  save at the next step boundary, record the runs as ``stopped`` and raise
  ``Preempted`` (exit ``PREEMPTED_EXIT_CODE``); rerunning resumes there. A
  second Ctrl-C exits at once. A stop asked for at any moment of a run,
  its final evaluation included, also stops the sweep launcher that shares
  its ``Stop``.
- Damaged checkpoints are passed over (and set aside); a run resumes from
  the newest that reads back whole, as if it had not been interrupted (in a
  pack of another size: to float32 rounding, and its record lists the pack
  size of each segment, ``pack_segments``).
- A run whose lease another process took over stops without writing to it.
- With several processes (pod-wide, a run alone), all agree on the run's
  state: process 0's reading of the record, and one step at which all stop.
- A checkpoint write that storage does not finish within its deadline fails
  the run with one line (``checkpoints.py``); any other error records the
  run as ``failed``, with the traceback in ``error.log``.
- On object stores (one process), periodic checkpoints are saved behind the
  loop (``background_save.py``), for every run of a pack too.

The command line tunes glibc's allocator for XLA:CPU (``cpu_allocator.py``)
and prepares the process (``entry.py``) before JAX starts; importing this
module changes nothing process-wide.

Command line: ``python -m scaling.train --help`` (``scaling/train.py``); ``eval`` and ``sample`` use a
trained run (``scaling.run.evaluate``, ``scaling.run.generate``).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Sequence

import jax

from scaling.config import TrainConfig
from scaling.data import pipeline as data
from scaling.model.run_program import RunProgram, pack_key, build as build_program  # noqa: F401
from scaling.run import restore
from scaling.run.ending import REFUSED, AlreadyFinished, ResumesElsewhere  # noqa: F401 - raised by run
from scaling.run.loop import Evaluation, Hook, Profile, StepInfo, Training  # noqa: F401 - the hooks a user registers
from scaling.run.member import Member, Outcome, Start, fresh_meta
from scaling.run.stopping import Stop
from scaling.store import records, rundir
from scaling.store.checkpoints import Checkpoints


def run(config: TrainConfig, workdir, *, show_progress: bool = True, devices=None, stop: Stop | None = None,
        raise_if_finished: bool = False, estimate: dict | None = None, hooks: Sequence[Hook] = ()
        ) -> records.RunRecord:
    """Train ``config`` into the run directory ``workdir`` and return its run record: a pack of one.

    ``workdir`` may be relative (to the current directory) or a URI. Resumes
    from the newest readable checkpoint in ``workdir/checkpoints``; returns
    the existing record if the run already finished (raises ``AlreadyFinished`` with it instead when
    ``raise_if_finished``: a launcher then knows another process trained it). ``stop`` is asked between
    steps (default: a new one, listening while the run lasts); the sweep
    launcher passes its own, so it hears a signal that arrives at any moment.
    ``estimate``: the record's estimate fields (``estimated_step_seconds``, ``estimated_mfu``,
    ``estimate_source``: what the preflight expected of this run, kept beside the measured ``mfu``).
    ``hooks``: work between steps and at the end (``loop.Hook``; e.g. ``Hook(Evaluation("name", data), every)``).
    Raises ``rundir.ConfigMismatch`` if the directory holds another config's
    run, ``lease.RunBusy`` if another live process is training it,
    ``Preempted`` after SIGTERM or Ctrl-C (a checkpoint of the current step is
    saved first) and ``LeaseLost`` if another process took the run over. Any
    other error is recorded as status ``failed`` (traceback in ``error.log``) and re-raised
    (``ending.py`` maps each to the record's status and the exit codes).
    """
    outcome, = train_members([config], [workdir], show_progress=show_progress, devices=devices, stop=stop,
                             estimates=[estimate], hooks=hooks)
    if isinstance(outcome, AlreadyFinished) and not raise_if_finished:
        return outcome.record
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def run_pack(configs: Sequence[TrainConfig], run_dirs: Sequence, *, show_progress: bool = True, devices=None,
             stop: Stop | None = None, estimates: Sequence[dict | None] | None = None, runs_axis: int | None = None,
             batching: str | None = None, hooks: Sequence[Hook] = ()) -> list[Outcome]:
    """Train ``configs`` (equal ``pack_key``) together, each into its run directory; one outcome per run.

    An outcome is the run's record (``finished``, ``diverged`` or, read back, one finished earlier with
    ``AlreadyFinished`` instead), or the exception that ended it: ``rundir.ConfigMismatch``,
    ``lease.RunBusy``, ``ResumesElsewhere`` (nothing done to it), ``LeaseLost``, ``Preempted`` (checkpoint
    saved, recorded ``stopped``) or the error that failed it (recorded ``failed``). ``stop``, ``estimates``
    (one per run), ``devices`` and ``hooks`` as for ``run``; ``runs_axis``: the mesh's ``runs`` axis
    (default: the largest divisor of the device count that divides the pack, so each device group trains
    whole runs); ``batching``: ``packed.BATCHINGS``. Raises ValueError (before anything is touched) if the
    runs cannot share a pack, or with several runs and several processes.
    """
    estimates = [None] * len(configs) if estimates is None else list(estimates)
    return train_members(list(configs), list(run_dirs), show_progress=show_progress, devices=devices, stop=stop,
                         estimates=estimates, runs_axis=runs_axis, batching=batching, hooks=hooks)


def train_members(configs: list[TrainConfig], run_dirs: list, *, show_progress: bool, devices, stop: Stop | None,
                  estimates: list, runs_axis: int | None = None, batching: str | None = None,
                  hooks: Sequence[Hook] = ()) -> list[Outcome]:
    """The life cycle of ``run`` and ``run_pack`` (see the module): one outcome per config."""
    run_dirs = [rundir.absolute_path(d) for d in run_dirs]
    _check_pack(configs, run_dirs, estimates)
    for hook in hooks:  # before anything is touched
        if not isinstance(hook.every, int) or hook.every < 0:
            raise ValueError(f"every={hook.every!r} is invalid (hook {hook.name or hook.function!r}): allowed an "
                             "integer >= 0 (0: only at the end)")
    stop = Stop() if stop is None else stop
    outcomes: list[Outcome | None] = [None] * len(configs)
    # Listen from the start: a preemption while the data loads or the step compiles stops the runs too;
    # and first, so that the stop's grace period (stopping.py) also bounds releasing the leases.
    with stop.listening():
        members = []
        for index, (config, run_dir, estimate) in enumerate(zip(configs, run_dirs, estimates)):
            try:
                members.append(Member.open(config, run_dir, stop, estimate))
            except (AlreadyFinished, *REFUSED) as refused:
                outcomes[index] = refused
            else:
                members[-1].order = index
        try:
            if members:
                _train(members, stop, show_progress, devices, runs_axis, batching, hooks)
        except BaseException as error:  # noqa: BLE001 - every run still training ends by it, as its own
            for member in members:
                if member.active:
                    member.end(error)
        for member in members:
            outcomes[member.order] = member.outcome
    return outcomes


def _check_pack(configs: list[TrainConfig], run_dirs: list, estimates: list) -> None:
    """ValueError naming what keeps these runs from one pack."""
    if not configs or len(run_dirs) != len(configs) or len(estimates) != len(configs):
        raise ValueError(f"a pack needs one run directory and estimate per config: {len(configs)} configs, "
                         f"{len(run_dirs)} run directories, {len(estimates)} estimates")
    if len(configs) > 1 and jax.process_count() > 1:
        raise ValueError("packed runs train in one process; pod-wide, train each run alone (pack 1)")
    key = pack_key(configs[0])
    for index, config in enumerate(configs[1:], start=1):
        if pack_key(config) != key:
            differing = [f.name for f in dataclasses.fields(TrainConfig)
                         if getattr(pack_key(config)[0], f.name) != getattr(key[0], f.name)] or ["multipliers"]
            raise ValueError(f"configs[{index}] ({config.name}) cannot share a pack with configs[0] "
                             f"({configs[0].name}): they differ in {', '.join(differing)}")
    if len(set(map(str, run_dirs))) != len(run_dirs):
        raise ValueError("two runs of the pack share a run directory")


def _train(members: list[Member], stop: Stop, show_progress: bool, devices, runs_axis, batching, hooks) -> None:
    """Read the data, resolve the configs, build the program, start each run and train them."""
    pipeline = data.build(members[0].config.data)
    for position, member in enumerate(members):
        member.index = position  # its place on the program's run axis
        member.begin(resolve_config(member.config, pipeline), pipeline.fingerprint)  # before the record's counts
    program = build_program([member.resolved for member in members], devices, runs_axis=runs_axis,
                            batching=batching)
    start_step = _start(members, program)
    state = _initial_state(members, program)
    for position, member in enumerate(m for m in members if m.active):
        meta = member.start.meta  # a checkpoint's meta is updated at each save: read its clocks once, here
        member.earlier_seconds = (float(meta.get("wall_seconds", 0.0)), float(meta.get("train_seconds", 0.0)))
        member.open_tracker(start_step, meta, member.start.resumed, show_progress and position == 0)
        member.last_loss = member.tracker.pending(start_step).get("loss")  # a resume at the last step trains none
    if any(member.active for member in members):
        Training(program, pipeline, members, stop, state, start_step, hooks).train()


def resolve_config(config: TrainConfig, pipeline) -> TrainConfig:
    """``config`` with the model's vocabulary made the tokenizer's (the user's config is left as it is:
    the run id and ``config.json`` are the user's)."""
    if config.model.vocab_size != pipeline.vocab_size:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=pipeline.vocab_size))
    return config


def restore_newest(checkpoints: Checkpoints, name: str) -> Start | None:
    """The newest checkpoint that reads back whole as a ``Start`` (damaged newer ones are reported), or None."""
    restored = checkpoints.restore_newest()
    for line in checkpoints.skipped:
        print(f"warning: {name}: damaged checkpoint passed over, {line}", file=sys.stderr)
    return None if restored is None else Start(*restored, resumed=True)


def _start(members: list[Member], program: RunProgram) -> int:
    """Each run's newest checkpoint, or a fresh start; the step the loop starts from (most runs'). A run of a
    pack at another step leaves it (``ResumesElsewhere``)."""
    for member in members:
        checkpoints = member.open_checkpoints(program.member_abstract_state(member.index))
        member.start = restore_newest(checkpoints, member.run_dir.name)
    steps = collections.Counter(member.start.step if member.start else 0 for member in members)
    start_step = min(steps, key=lambda step: (-steps[step], step))
    for member in members:
        step = member.start.step if member.start else 0
        if step != start_step:
            member.end(ResumesElsewhere(f"resumes from step {step}, the rest of its pack from step "
                                        f"{start_step}: train it alone"))
        elif member.start is None:
            member.start = Start(None, fresh_meta(), 0, resumed=False)
    return start_step


def _initial_state(members: list[Member], program: RunProgram):
    """The program's state: each run's restored state, or its fresh one from the (packed) init, with the
    parameters of the run it continues (``init_from``) when it names one (the slot of a run that left the
    pack holds a fresh state, unused)."""
    seeds = [member.resolved.seed for member in members]
    fresh_runs = [member for member in members if member.active and not member.start.resumed]
    inherited = {member.index: _parent_params(member, program) for member in fresh_runs if member.config.init_from}
    if len(fresh_runs) == len(members) and not inherited:
        return program.init(seeds)  # a fresh start is the init itself: nothing to slice and stack
    fresh = program.init(seeds) if any(not (m.active and m.start.resumed) for m in members) else None
    states = []
    for member in members:
        if member.active and member.start.resumed:
            states.append(member.start.state)
            continue
        state = program.member_state(fresh, member.index)
        if member.index in inherited:
            state = {**state, "params": inherited[member.index]}
        states.append(state)
    return program.stack_states(states)


def _parent_params(member: Member, program: RunProgram):
    """The parameters ``member`` starts from: those of the run it continues (``restore.parent_params``)."""
    parent_id, step, params = restore.parent_params(member.config.init_from, member.resolved,
                                                    program.member_abstract_state(member.index))
    member.parent_run_id = parent_id
    print(f"{member.config.name or member.run_dir.name}: starting from the parameters of run {parent_id} "
          f"(step {step}, {member.config.init_from})", file=sys.stderr)
    return params
