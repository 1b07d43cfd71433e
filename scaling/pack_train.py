"""Train several runs of one shape together: one loop, one packed program, every run its own member.

``run_pack`` is ``train.run`` for k runs with equal ``pack_key``: one program
(``packed.py`` stacks their states on a run axis), one step count, one data
source and one loop cadence; they differ in their seeds and learning-rate
numbers. Each run keeps everything a solo run has (``member.Member``):

- its lease, record, metrics rows, wandb run and orbax checkpoints. Its
  checkpoint is its slice of the packed state, exactly a solo run's state
  (``packed.member_state``), so it resumes alone or in any other pack;
- its data order (its own seed's ``train_iterator``) and hyperparameters;
- its own end. A run whose step is not finite stops updating (the packed
  step leaves its state as it was) and is recorded ``diverged`` at once, while
  the others go on. A run whose lease another process took over stops writing
  and leaves the pack. SIGTERM or Ctrl-C checkpoints every run at the next
  step and records each ``stopped``. An error of the shared loop (data,
  compilation, storage) ends every run ``failed``.

A run whose newest readable checkpoint is at another step than most of the
pack's leaves it before training (``ending.ResumesElsewhere``, nothing
recorded): the launcher trains it alone. The slots of runs that left keep
being computed (the compiled program's size is fixed); their results are
not used.

What is shared is decided once: the resolved configs' vocabulary comes from the one pipeline, the
validation set is the same for every run, and timings are the pack's (a run's ``tokens_per_second``
and ``mfu`` are its own tokens over the pack's time: its share). One process only: a pod-wide job
trains one run at a time (``train.run``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import time
from typing import Sequence, Union

import jax

from scaling import data, hardware, mesh as mesh_lib, optim as optim_lib, packed as packed_lib, parametrization
from scaling import records, rundir, train
from scaling.config import TrainConfig, config_id
from scaling.ending import REFUSED, AlreadyFinished, ResumesElsewhere
from scaling.flops import model_flops_utilization
from scaling.member import Member
from scaling.program import hyperparameters
from scaling.stopping import LeaseLost, MemberStop, Stop

# What ``run_pack`` gives for each run: its record, or the exception that ended it.
Outcome = Union[records.RunRecord, BaseException]


def pack_key(config: TrainConfig):
    """What runs must share to train in one pack: ``config`` without the numbers a run hands its
    compiled step as arguments (seed, learning rates and schedule numbers; ``program.hyperparameters``)
    and without its name. Runs whose keys are equal have one program, one step count, one data source
    and one loop cadence (evaluation, checkpoints, logging); hashable."""
    return (dataclasses.replace(config, seed=0, name="", optim=optim_lib.without_numbers(config.optim)),
            parametrization.multipliers(config.optim, config.model))


def run_pack(configs: Sequence[TrainConfig], run_dirs: Sequence, *, show_progress: bool = True, devices=None,
             stop: Stop | None = None, estimates: Sequence[dict | None] | None = None, runs_axis: int | None = None,
             batching: str | None = None) -> list[Outcome]:
    """Train ``configs`` (equal ``pack_key``) together, each into its run directory; one ``Outcome`` per run.

    An outcome is the run's record (``finished``, ``diverged`` or, read back, one finished earlier with
    ``AlreadyFinished`` instead), or the exception that ended it: ``rundir.ConfigMismatch``,
    ``lease.RunBusy``, ``ResumesElsewhere`` (nothing done to it), ``LeaseLost``, ``Preempted`` (checkpoint
    saved, recorded ``stopped``) or the error that failed it (recorded ``failed``). ``stop``, ``estimates``
    (one per run) and ``devices`` as for ``train.run``; ``runs_axis``: the mesh's ``runs`` axis (default:
    the largest divisor of the device count that divides the pack, so each device group trains whole
    runs); ``batching``: ``packed.BATCHINGS``. Raises ValueError (before anything is touched) if the runs
    cannot share a pack, or with several processes.
    """
    configs, run_dirs = list(configs), [rundir.absolute_path(d) for d in run_dirs]
    estimates = [None] * len(configs) if estimates is None else list(estimates)
    _check_pack(configs, run_dirs, estimates)
    stop = Stop() if stop is None else stop
    outcomes: list[Outcome | None] = [None] * len(configs)
    with stop.listening():
        slots = []
        for index, (config, run_dir, estimate) in enumerate(zip(configs, run_dirs, estimates)):
            try:
                slots.append(_Slot.open(index, config, run_dir, stop, estimate))
            except (AlreadyFinished, *REFUSED) as refused:
                outcomes[index] = refused
        try:
            if slots:
                PackTraining(slots, stop, show_progress, devices, runs_axis, batching).train()
        except BaseException as error:  # noqa: BLE001 - every run still in the pack ends by it, as its own
            for slot in slots:
                if slot.outcome is None:
                    slot.end(error)
        for slot in slots:
            outcomes[slot.index] = slot.outcome
    return outcomes


def _check_pack(configs: list[TrainConfig], run_dirs: list, estimates: list) -> None:
    """ValueError naming what keeps these runs from one pack."""
    if not configs or len(run_dirs) != len(configs) or len(estimates) != len(configs):
        raise ValueError(f"a pack needs one run directory and estimate per config: {len(configs)} configs, "
                         f"{len(run_dirs)} run directories, {len(estimates)} estimates")
    if jax.process_count() > 1:
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


class _Slot:
    """One run of the pack: its ``Member`` inside the contexts a solo run has (lease, ending), and where
    it stands in the loop. ``outcome`` is set once it has left the pack."""

    def __init__(self, index: int, member: Member, contexts: contextlib.ExitStack):
        self.index, self.member, self.contexts = index, member, contexts
        self.outcome: Outcome | None = None
        self.start: train.Start | None = None
        self.last_loss = self.eval_loss = None
        self.saved_step: int | None = None
        self.index_in_pack = index
        self.earlier_seconds = (0.0, 0.0)  # (wall, training) seconds of earlier segments of the run

    @classmethod
    def open(cls, index: int, config: TrainConfig, run_dir, stop: Stop, estimate: dict | None) -> "_Slot":
        """Take the run's lease and begin its member, as ``train.run`` does; ``AlreadyFinished`` or a
        ``REFUSED`` error (nothing held) if it cannot train here."""
        contexts = contextlib.ExitStack()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            rundir.check_run_dir(run_dir, config)
            lease = contexts.enter_context(train.run_lease(run_dir))
            finished = train.finished_record(run_dir, config_id(config))
            if finished is not None:
                raise AlreadyFinished(finished)
            member = contexts.enter_context(Member(run_dir, config, lease, MemberStop(stop, lease), estimate).ending())
        except BaseException:
            contexts.close()
            raise
        return cls(index, member, contexts)

    @property
    def active(self) -> bool:
        return self.outcome is None

    def conclude(self, status: str, fields: dict) -> None:
        """End the run normally (``finished`` or ``diverged``): its record, then its contexts."""
        try:
            record = self.member.conclude(status, **fields)
        except BaseException as error:  # noqa: BLE001 - e.g. LeaseLost: ends this run alone
            self.end(error)
            return
        self.contexts.close()
        self.outcome = record

    def end(self, error: BaseException) -> None:
        """End the run by ``error``, as its ``Member.ending`` maps it; the outcome is what that raises."""
        try:
            self.contexts.__exit__(type(error), error, error.__traceback__)
        except BaseException as raised:  # noqa: BLE001 - the ending re-raises (mapped): that is the outcome
            self.outcome = raised
            return
        self.outcome = error


class PackTraining:
    """The loop of a pack: ``train.Training``'s steps and periodic work, once for all ``slots``."""

    def __init__(self, slots: list[_Slot], stop: Stop, show_progress: bool, devices, runs_axis, batching):
        self.slots, self.stop = slots, stop
        for position, slot in enumerate(slots):
            slot.index_in_pack = position  # its place on the run axis (runs refused earlier have none)
        first = slots[0].member.config
        self.pipeline = data.build(first.data)
        for slot in slots:
            slot.member.begin(train.resolve_config(slot.member.config, self.pipeline), self.pipeline.fingerprint)
        self.configs = [slot.member.resolved for slot in slots]
        self.config = config = self.configs[0]  # what the runs share: shape, steps, cadence
        self.packed = _packed_program(self.configs, self.pipeline, len(slots), devices, runs_axis, batching)
        self._restore(show_progress)
        self.hparams = jax.device_put(
            packed_lib.stack_hyperparameters([hyperparameters(c) for c in self.configs]),
            jax.tree_util.tree_map(lambda leaf: leaf.sharding, self.packed.abstract_hparams))
        self.validation = self.pipeline.validation_batches(config.batch_size, config.eval_batches)
        self.row_length = (self.pipeline.row_length("train") if self.pipeline.kind == "classification"
                           else config.data.seq_len)
        self.started = time.perf_counter()
        self.steps_started = self.steps_ended = None
        self.pending: list = []
        self.last_accuracy = [None] * len(slots)
        self.window_start, self.window_steps = time.perf_counter(), 0

    # -- the start: each run's checkpoint or a fresh state, packed ----------------------------------------

    def _restore(self, show_progress: bool) -> None:
        """Each run's newest checkpoint (runs at another step than most leave the pack), the packed state,
        each run's tracker."""
        packed, slots = self.packed, self.slots
        for slot in slots:
            checkpoints = slot.member.open_checkpoints(packed_lib.member_abstract_state(packed, slot.index_in_pack))
            slot.start = train.restore_newest(checkpoints, slot.member.run_dir.name)
        steps = collections.Counter(slot.start.step if slot.start else 0 for slot in slots)
        self.start_step = min(steps, key=lambda step: (-steps[step], step))  # the most runs' step
        for slot in slots:
            step = slot.start.step if slot.start else 0
            if step != self.start_step:
                slot.end(ResumesElsewhere(f"resumes from step {step}, the rest of its pack from step "
                                          f"{self.start_step}: train it alone"))
            elif slot.start is None:
                slot.start = train.Start(None, train.fresh_meta(), 0, resumed=False)
        self.state = self._packed_state()
        for position, slot in enumerate(self.live()):
            # Wall and training seconds of the segments before this one (a checkpoint's meta is updated at
            # each save, so they are read once, here).
            meta = slot.start.meta
            slot.earlier_seconds = (float(meta.get("wall_seconds", 0.0)), float(meta.get("train_seconds", 0.0)))
            slot.member.open_tracker(self.start_step, slot.start.meta, slot.start.resumed,
                                     show_progress and position == 0)  # one progress display per pack
            slot.last_loss = slot.member.tracker.pending(self.start_step).get("loss")

    def _packed_state(self):
        """The runs' states on the run axis: a fresh run's from the packed init, a resumed one's restored (the
        slot of a run that left the pack holds a fresh state, unused)."""
        packed, slots = self.packed, self.slots
        fresh = None
        if any(not slot.active or not slot.start.resumed for slot in slots):
            fresh = packed.init(packed_lib.stack_keys([config.seed for config in self.configs]))
        if all(slot.active and not slot.start.resumed for slot in slots):
            return fresh  # a pack that starts afresh is the packed init itself: nothing to slice and stack
        return packed_lib.stack_states(packed, [
            slot.start.state if slot.active and slot.start.resumed else
            packed_lib.member_state(packed, fresh, slot.index_in_pack) for slot in slots])

    def live(self) -> list[_Slot]:
        """The runs still in the pack."""
        return [slot for slot in self.slots if slot.active]

    # -- the loop -----------------------------------------------------------------------------------------

    def train(self) -> None:
        """Train every run still in the pack from the start step to the last, then end them (``end``)."""
        config = self.config
        if config.eval_at_start and any(s.start.meta.get("initial_eval_loss") is None for s in self.live()):
            for slot, loss in zip(self.slots, self.evaluate_all(self.start_step)):
                if slot.active and slot.start.meta.get("initial_eval_loss") is None:
                    slot.start.meta["initial_eval_loss"] = loss
        self.stop.start(self.start_step)
        if self.stop.agreed(self.start_step):
            raise self.stop.preempted(f"before training resumed at step {self.start_step}")
        done = None
        with contextlib.ExitStack() as iterators:
            batches = [iterators.enter_context(contextlib.closing(self.pipeline.train_iterator(
                c.seed, self.start_step, c.batch_size))) for c in self.configs]
            for step in range(self.start_step, config.steps):
                local = []
                for batch in batches:
                    batch_step, rows = next(batch)
                    assert batch_step == step, (batch_step, step)  # every run's data at the pack's step
                    local.append(rows)
                batch = packed_lib.global_batch(local, self.packed, config.batch_size)
                self.state, metrics = self.packed.train_step(self.state, batch, self.hparams)
                if self.steps_started is None:  # the first call compiled the step
                    self.steps_started = time.perf_counter()
                self.pending.append((step, metrics))
                self.window_steps += 1
                for slot in self.live():
                    slot.member.tracker.advance()
                done = step + 1
                if done == config.steps or not self.live():
                    break
                self.between_steps(done)
                if not self.live():
                    return
        self.end(done)

    def between_steps(self, done: int) -> None:
        """``train.Training.hooks``'s work after ``done`` steps, for every run still in the pack."""
        config = self.config
        if done % config.log_every == 0 or done % config.checkpoint_every == 0:
            self.log(done)
        if config.eval_every and done % config.eval_every == 0:
            self.evaluate_all(done)
        for slot in self.live():
            self.guarded(slot, lambda s: s.member.stop.check_lease())
        if done % config.checkpoint_every == 0:
            for slot in self.live():
                self.guarded(slot, lambda s: self.save(s, done))
        if self.stop.agreed(done):
            self.stop_all(done)

    def stop_all(self, done: int) -> None:
        """A stop: save every run still in the pack at ``done``, wait for the writes, end each ``stopped``."""
        self.end_steps()
        for slot in self.live():
            self.guarded(slot, lambda s: self.save(s, done, force=True) if s.saved_step != done else None)
        for slot in self.live():
            self.guarded(slot, lambda s: s.member.checkpoints.finish())
        for slot in self.live():
            slot.end(self.stop.preempted(f"after step {done}; checkpoint saved"))

    def guarded(self, slot: _Slot, work) -> None:
        """``work(slot)``; a ``LeaseLost`` ends that run alone (another process owns it now)."""
        try:
            work(slot)
        except LeaseLost as error:
            slot.end(error)

    def log(self, done: int) -> None:
        """Each run's metrics since the last log: its newest row, or ``diverged`` at its first bad step."""
        if not self.pending:
            return
        steps, fetched = [s for s, _ in self.pending], jax.device_get([m for _, m in self.pending])
        self.pending = []
        seconds = max(time.perf_counter() - self.window_start, 1e-9)
        speed = self.window_steps * self.tokens_per_step / seconds  # each run's own tokens
        for slot in self.live():
            i = slot.index_in_pack
            bad = [s for s, m in zip(steps, fetched) if not bool(m["finite"][i])]
            if bad:
                slot.member.tracker.log(bad[0] + 1, {"loss": None, "diverged": 1.0})
                self.end_run(slot, "diverged")
                continue
            newest = {name: float(values[i]) for name, values in fetched[-1].items()}
            slot.last_loss = newest["loss"]
            slot.member.tracker.log(done, {"loss": newest["loss"], "grad_norm": newest["grad_norm"],
                                           "lr": newest["lr"], "tokens_per_second": speed,
                                           "mfu": self.mfu(speed), "tokens": done * self.tokens_per_step})
        self.window_start, self.window_steps = time.perf_counter(), 0

    def evaluate_all(self, done: int) -> list[float]:
        """Evaluate every run on the shared validation set; log each live run's loss at ``done``."""
        metrics = packed_lib.evaluate_members(self.packed, self.state["params"], self.validation,
                                              self.config.batch_size)
        for slot in self.live():
            slot.eval_loss = metrics[slot.index_in_pack]["loss"]
            slot.member.tracker.log(done, {"eval_loss": slot.eval_loss})
        self.last_accuracy = [m["accuracy"] for m in metrics]
        return [m["loss"] for m in metrics]

    def save(self, slot: _Slot, step: int, force: bool = False) -> None:
        """Checkpoint ``slot``'s run at ``step``: its slice of the packed state, after its metrics rows."""
        member = slot.member
        member.stop.check_lease(read_now=True)
        member.tracker.flush(through_step=step, wait=True)
        meta = slot.start.meta
        meta["wall_seconds"], meta["train_seconds"] = self.wall_seconds(slot), self.train_seconds(slot)
        member.checkpoints.save(step, packed_lib.member_state(self.packed, self.state, slot.index_in_pack), meta,
                                force=force)
        slot.saved_step = step

    # -- the end ------------------------------------------------------------------------------------------

    def end(self, done: int | None) -> None:
        """After the loop: the last log and stop check, the final evaluation and checkpoint of each run
        still in the pack, each run concluded (a final loss not finite: ``diverged``)."""
        if done == self.config.steps:
            self.log(done)
            for slot in self.live():
                self.guarded(slot, lambda s: s.member.stop.check_lease())
            if self.stop.agreed(done):
                self.stop_all(done)
        self.end_steps()
        if not self.live():
            return
        self.evaluate_all(self.start_step if done is None else done)
        for slot in self.live():
            self.end_run(slot, "finished" if math.isfinite(slot.eval_loss) else "diverged")

    def end_run(self, slot: _Slot, status: str) -> None:
        """Conclude one run: the final checkpoint of a finished run, its writes waited for, its record."""
        steps_done = int(jax.device_get(self.state["step"])[slot.index_in_pack])
        accuracy = {}
        if status == "finished":
            if self.pipeline.kind == "classification":
                correct = self.last_accuracy[slot.index_in_pack]
                accuracy = {"final_eval_accuracy": correct, "final_eval_bits": slot.eval_loss / math.log(2)}
            if steps_done not in slot.member.checkpoints.steps():
                self.guarded(slot, lambda s: self.save(s, steps_done, force=True))
            if not slot.active:
                return
        slot.member.checkpoints.finish()
        tokens_per_step = self.tokens_per_step
        train_seconds = self.train_seconds(slot)
        slot.conclude(status, dict(
            final_eval_loss=slot.eval_loss if status == "finished" else None,
            initial_eval_loss=slot.start.meta["initial_eval_loss"], final_train_loss=slot.last_loss,
            steps=steps_done, tokens=steps_done * tokens_per_step, tokens_per_step=tokens_per_step,
            wall_seconds=self.wall_seconds(slot), train_seconds=train_seconds,
            wandb_id=slot.member.tracker.wandb_id, pack_size=self.packed.size,
            mfu=self.mfu(steps_done * tokens_per_step / train_seconds) if steps_done and train_seconds else None,
            **accuracy))

    def end_steps(self) -> None:
        """The steps are over: the training clock stops, the progress displays print their last line."""
        if self.steps_ended is None:
            self.steps_ended = time.perf_counter()
            for slot in self.live():
                slot.member.tracker.end_of_steps()

    # -- measures -----------------------------------------------------------------------------------------

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.row_length

    def mfu(self, tokens_per_second: float) -> float:
        """One run's model FLOP utilisation at ``tokens_per_second`` of its own (its share of the pack's)."""
        config = self.config
        peak = hardware.mfu_peak_flops(config.peak_flops, config.model.compute_dtype)
        return model_flops_utilization(config.model, self.row_length, tokens_per_second, peak, jax.device_count())

    def wall_seconds(self, slot: _Slot) -> float:
        """Wall seconds of every segment of ``slot``'s run so far, this one included."""
        return slot.earlier_seconds[0] + time.perf_counter() - slot.member.started

    def train_seconds(self, slot: _Slot) -> float:
        """Seconds of training steps (compilation excluded) of every segment of ``slot``'s run so far."""
        earlier = slot.earlier_seconds[1]
        if self.steps_started is None:
            return earlier
        ended = time.perf_counter() if self.steps_ended is None else self.steps_ended
        return earlier + ended - self.steps_started


def _packed_program(configs: list[TrainConfig], pipeline, size: int, devices, runs_axis, batching):
    """The pack's program: its mesh (``runs`` groups of the configs' mesh) and the batch checked first."""
    config = configs[0]
    devices = list(jax.devices() if devices is None else devices)
    runs = math.gcd(size, len(devices)) if runs_axis is None else runs_axis
    mesh = mesh_lib.make_packed_mesh(config.mesh, runs, devices)
    arguments = data.program_arguments(config.data, config.model.objective, config.model.vocab_size)
    shape = packed_lib.pack_shape(configs, **arguments)
    return packed_lib.build_packed(shape, mesh, size, batching)
