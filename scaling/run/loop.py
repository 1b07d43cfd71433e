"""The training loop: one program advancing k >= 1 runs (members), with hooks between steps.

``Training`` is the one loop, for a run alone and for a pack (a run alone is
a pack of one: ``scaling.model.run_program``). Between steps, in order:

1. the log, when due (every ``log_every`` steps and before every
   checkpoint, so a checkpoint only ever follows steps found finite): each
   member's newest metrics row, or ``diverged`` at its first step whose loss
   or gradient norm is not finite (that member leaves the loop at once,
   its last good state checkpointed earlier; the others go on);
2. the hooks that are due (``Hook``, registered with ``add_hook``): the
   evaluation on the validation set (``eval_every``), each named evaluation
   a user registered (``Evaluation``), any other function a user registered,
   then the checkpoint (``checkpoint_every``);
3. the boundary checks: each member's lease (a member another process took
   over leaves alone, writing nothing more), a background save's error, and
   a stop (SIGTERM, Ctrl-C): every member saves this step and is recorded
   ``stopped``.

The end of training is the same work once more, forced (``StepInfo.final``):
the last log, the checks, then every hook: the final evaluation (a loss not
finite: ``diverged``) and the final checkpoint are the periodic ones, not a
second code path. Then each member concludes (``member.Member.conclude``).

Work that belongs to one member (its checkpoint, its lease) is guarded per
member (``each``): its failure ends that member alone, with its own
directory in the message; an error of the shared loop (data, compilation,
the step, a user's hook) ends every member still in it (``scaling.run.train``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from typing import Callable, Sequence

import jax

from scaling import hardware
from scaling.data import pipeline as data_lib
from scaling.model.flops import model_flops_utilization
from scaling.model.run_program import RunProgram
from scaling.run.member import Member
from scaling.run.stopping import Stop


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook is told: ``step`` (steps done), whether this is the end of training (``final``: every hook
    runs once more, forced), and the loop (``training``: its members, state and program)."""

    step: int
    final: bool
    training: "Training"

    @property
    def members(self) -> list[Member]:
        """The runs still in the loop."""
        return self.training.live()

    def params(self):
        """The parameters of every member (a pack's stacked on a leading run axis), as the program's
        ``evaluate`` takes them."""
        return self.training.state["params"]


@dataclasses.dataclass(frozen=True)
class Hook:
    """``function(StepInfo)`` every ``every`` steps (never between steps if 0) and once at the end."""

    function: Callable[[StepInfo], None]
    every: int = 0
    name: str = ""

    def due(self, done: int) -> bool:
        """Whether to run after ``done`` steps (not the last: the end runs every hook)."""
        return self.every > 0 and done % self.every == 0


class Evaluation:
    """A hook's function: evaluate every member on the validation split of ``data`` (a ``DataConfig``,
    default: the runs' own data) and log its loss under ``NAME/eval_loss`` (the runs' own: ``eval_loss``);
    at the end, each member's final value is kept in its record (``final_evaluations[NAME]``; the runs'
    own: ``final_eval_loss``, with accuracy and bits for classification). Its ``eval_batches`` batches of
    the runs' batch size."""

    def __init__(self, name: str = "", data: data_lib.DataConfig | None = None):
        self.name, self.data = name, data
        self.batches = None

    def batches_for(self, training: "Training") -> list:
        """The validation batches this evaluation reads (this process's rows), made once."""
        if self.batches is None:
            pipeline = training.pipeline if self.data is None else data_lib.build(self.data)
            self.batches = pipeline.validation_batches(training.config.batch_size, training.config.eval_batches,
                                                       jax.process_index(), jax.process_count())
        return self.batches

    def key(self, metric: str) -> str:
        return metric if not self.name else f"{self.name}/{metric}"

    def __call__(self, info: StepInfo) -> None:
        training = info.training
        results = training.program.evaluate(info.params(), self.batches_for(training), training.config.batch_size)
        for member in info.members:
            result = results[member.index]
            row = {self.key("eval_loss"): result["loss"]}
            if self.name:
                if info.final:
                    member.evaluations[self.name] = result["loss"]
            else:
                member.eval_loss = result["loss"]
                if info.final and training.pipeline.kind == "classification":
                    member.final_accuracy = result["accuracy"]  # the label's cross-entropy in bits, and accuracy
                    row.update(eval_accuracy=result["accuracy"], eval_bits=result["loss"] / math.log(2))
            member.tracker.log(info.step, row)


class Profile:
    """A hook's function (``every=1``): a ``jax.profiler`` trace of the ``steps`` steps after the first
    ``start`` (the first step compiles, so ``start`` >= 1), written into ``directory`` (TensorBoard's profile
    plugin or Perfetto read it: ``perfetto_trace.json.gz`` beside the ``.xplane.pb``). Ends with training if
    that comes first. ValueError naming ``start`` or ``steps`` when out of range."""

    def __init__(self, start: int, steps: int, directory):
        if not isinstance(start, int) or start < 1:
            raise ValueError(f"start={start!r} is invalid: allowed an integer >= 1 (step 0 compiles the program)")
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps={steps!r} is invalid: allowed an integer >= 1")
        self.start, self.steps, self.directory = start, steps, str(directory)
        self.tracing = False

    def __call__(self, info: StepInfo) -> None:
        if not self.tracing and info.step == self.start and not info.final:
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
            self.tracing = True
        elif self.tracing and (info.step >= self.start + self.steps or info.final):
            jax.block_until_ready(info.training.state)  # the traced steps' work, not only their dispatch
            jax.profiler.stop_trace()
            self.tracing = False
            print(f"profile of steps {self.start}-{info.step - 1}: {self.directory}", file=sys.stderr)


class Training:
    """One segment of training of ``members`` (resolved, restored or fresh: ``start``) on ``program``."""

    def __init__(self, program: RunProgram, pipeline, members: list[Member], stop: Stop, state, start_step: int,
                 hooks: Sequence[Hook] = ()):
        self.program, self.pipeline, self.members, self.stop = program, pipeline, members, stop
        self.configs = [member.resolved for member in members]
        self.config = config = self.configs[0]  # what the members share: shape, steps, cadence
        self.state, self.start_step = state, start_step
        self.hparams = program.hyperparameters(self.configs)
        # Classification rows are padded to their split's longest string, not to seq_len.
        self.row_length = pipeline.row_length("train") if pipeline.kind == "classification" else config.data.seq_len
        self.steps_started: float | None = None  # when this segment's first step had compiled
        self.steps_ended: float | None = None
        self.pending: list = []  # (step, metrics still on the device) since the last log
        self.window_start, self.window_steps = time.perf_counter(), 0  # of the speed measurement
        self.hooks: list[Hook] = [Hook(Evaluation(), config.eval_every, "evaluate")]
        for hook in hooks:
            self.add_hook(hook.function, every=hook.every, name=hook.name)
        self.checkpoint_hook = Hook(self.checkpoint, config.checkpoint_every, "checkpoint")

    def add_hook(self, function: Callable[[StepInfo], None], *, every: int = 0, name: str = "") -> Hook:
        """Run ``function(StepInfo)`` every ``every`` steps and once at the end (after the evaluations
        registered before it, before the checkpoint). ValueError naming ``every`` if it is negative."""
        if not isinstance(every, int) or every < 0:
            raise ValueError(f"every={every!r} is invalid: allowed an integer >= 0 (0: only at the end)")
        hook = Hook(function, every, name or getattr(function, "__name__", "hook"))
        self.hooks.append(hook)
        return hook

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.row_length

    def live(self) -> list[Member]:
        """The members still training."""
        return [member for member in self.members if member.active]

    def each(self, work: Callable[[Member], None]) -> None:
        """``work(member)`` for every member still training; an error ends that member alone (its own)."""
        for member in self.live():
            try:
                work(member)
            except Exception as error:  # noqa: BLE001 - the member's outcome, not the loop's
                member.end(error)

    # -- the loop -----------------------------------------------------------------------------------------

    def train(self) -> None:
        """Train every member from the start step to the last, then end them (``end``)."""
        if self.config.eval_at_start and any(m.start.meta.get("initial_eval_loss") is None for m in self.live()):
            results = self.program.evaluate(self.state["params"], self._validation(), self.config.batch_size)
            for member in self.live():
                member.eval_loss = results[member.index]["loss"]
                member.tracker.log(self.start_step, {"eval_loss": member.eval_loss})
                if member.start.meta.get("initial_eval_loss") is None:
                    member.start.meta["initial_eval_loss"] = member.eval_loss
        self.stop.start(self.start_step)
        if self.stop.agreed(self.start_step):  # a stop while the data loaded or the step compiled
            raise self.stop.preempted(f"before training resumed at step {self.start_step}")
        try:
            self.end(self.steps())
        finally:
            self.end_steps()  # (when training ended by an exception; else end did it)

    def _validation(self) -> list:
        """The runs' own validation batches (the built-in evaluation's)."""
        return self.hooks[0].function.batches_for(self)

    def steps(self) -> int | None:
        """Train to the last step, with the work between steps (see the module) after each other step.
        Returns the number of steps done at the end (None if this segment trained none)."""
        config, program, done = self.config, self.program, None
        with contextlib.ExitStack() as iterators:
            batches = [iterators.enter_context(contextlib.closing(self.pipeline.train_iterator(
                c.seed, self.start_step, c.batch_size, jax.process_index(), jax.process_count())))
                for c in self.configs]
            for step in range(self.start_step, config.steps):
                local = []
                for iterator in batches:
                    batch_step, rows = next(iterator)
                    assert batch_step == step, (batch_step, step)  # every member's data at the loop's step
                    local.append(rows)
                self.state, metrics = program.train_step(self.state, program.global_batch(local, config.batch_size),
                                                         self.hparams)
                if self.steps_started is None:  # the first call compiled the step (or found it compiled)
                    self.steps_started = time.perf_counter()
                self.pending.append((step, metrics))
                self.window_steps += 1
                for member in self.live():
                    member.tracker.advance()  # the first call comes after compilation, so the ETA excludes it
                done = step + 1
                if done == config.steps:
                    break
                self.between_steps(done)
                if not self.live():
                    break
        return done

    def between_steps(self, done: int) -> None:
        """The work after ``done`` steps (not the last): log, hooks, checks (see the module)."""
        config = self.config
        if done % config.log_every == 0 or (config.checkpoint_every and done % config.checkpoint_every == 0):
            self.log(done)
        info = StepInfo(done, False, self)
        for hook in [*self.hooks, self.checkpoint_hook]:
            if hook.due(done) and self.live():
                hook.function(info)
        self.check(done)

    def check(self, done: int) -> None:
        """Each member's lease and background save; a stop agreed by every process ends every member."""
        self.each(lambda member: (member.check_lease(), member.raise_save_error()))
        if self.live() and self.stop.agreed(done):
            self.stop_all(done)

    def end(self, done: int | None) -> None:
        """After the loop (see the module): after a last step trained in this segment, its log and the
        checks; the training clock stops; every hook once more, forced; each member concluded."""
        if done == self.config.steps:
            self.log(done)
            if self.live():
                self.check(done)
        self.end_steps()
        if not self.live():
            return
        info = StepInfo(self.start_step if done is None else done, True, self)
        for hook in [*self.hooks, self.checkpoint_hook]:
            if self.live():
                hook.function(info)
        for member in self.live():
            self.conclude(member, "finished" if math.isfinite(member.eval_loss) else "diverged")

    def end_steps(self) -> None:
        """The end of the steps (last step, divergence or a stop): the training clock stops and the progress
        displays print their final line, so both show the steps' time alone. Once."""
        if self.steps_ended is None:
            self.steps_ended = time.perf_counter()
            for member in self.live():
                member.tracker.end_of_steps()

    # -- the work between steps ---------------------------------------------------------------------------

    def log(self, done: int) -> None:
        """Each member's newest metrics row since the last log, or ``diverged`` at its first bad step."""
        if not self.pending:
            return
        steps, fetched = [s for s, _ in self.pending], jax.device_get([m for _, m in self.pending])
        self.pending = []
        speed = self.window_steps * self.tokens_per_step / max(time.perf_counter() - self.window_start, 1e-9)
        for member in self.live():
            values = [self.program.member_metrics(m, member.index) for m in fetched]
            bad = [s for s, v in zip(steps, values) if not bool(v["finite"])]
            if bad:
                member.tracker.log(bad[0] + 1, {"loss": None, "diverged": 1.0})
                self.conclude(member, "diverged")
                continue
            newest = values[-1]
            member.last_loss = float(newest["loss"])
            member.tracker.log(done, {"loss": member.last_loss, "grad_norm": float(newest["grad_norm"]),
                                      "lr": float(newest["lr"]), "tokens_per_second": speed, "mfu": self.mfu(speed),
                                      "tokens": done * self.tokens_per_step})
        self.window_start, self.window_steps = time.perf_counter(), 0

    def checkpoint(self, info: StepInfo) -> None:
        """The checkpoint hook: each member's state at ``info.step``; periodic ones behind the loop where a
        member has a background saver (object stores), the final one always here (once per step)."""
        def one(member: Member) -> None:
            state = self.program.member_state(self.state, member.index)
            if info.final:
                member.settle_checkpoints()
                if info.step not in member.checkpoints.steps():
                    member.save(info.step, state, self.meta_of(member), force=True)
            elif member.saver is not None:
                member.save_behind(info.step, jax.device_get(state), self.meta_of(member))
            else:
                member.save(info.step, state, self.meta_of(member))
        self.each(one)

    def meta_of(self, member: Member) -> dict:
        """``member``'s checkpoint metadata now: its clocks and the pack sizes of its segments so far."""
        meta = member.start.meta
        meta["wall_seconds"], meta["train_seconds"] = self.wall_seconds(member), self.train_seconds(member)
        meta["pack_segments"] = self.pack_segments(member)
        return dict(meta)

    def stop_all(self, done: int) -> None:
        """A stop: save every member at ``done`` (unless just saved), wait for the writes, end each ``stopped``."""
        self.end_steps()

        def save(member: Member) -> None:
            member.settle_checkpoints()
            if member.saved_step != done:  # a second save of the same step would fail
                member.save(done, self.program.member_state(self.state, member.index), self.meta_of(member),
                            force=True)
        self.each(save)
        self.each(lambda member: member.checkpoints.finish())
        for member in self.live():
            member.end(self.stop.preempted(f"after step {done}; checkpoint saved"))

    def conclude(self, member: Member, status: str) -> None:
        """End ``member`` normally: its checkpoint writes waited for, then its record."""
        steps_done = self.program.member_steps(self.state)[member.index]
        try:
            member.settle_checkpoints()  # a diverged run keeps the checkpoints it saved before
            member.checkpoints.finish()
        except Exception as error:  # noqa: BLE001 - the member's own outcome
            member.end(error)
            return
        finished = status == "finished"
        accuracy = {}
        if finished and member.final_accuracy is not None:
            accuracy = {"final_eval_accuracy": member.final_accuracy,
                        "final_eval_bits": member.eval_loss / math.log(2)}
        seconds = self.train_seconds(member)
        member.conclude(status, final_eval_loss=member.eval_loss if finished else None,
                        initial_eval_loss=member.start.meta["initial_eval_loss"], final_train_loss=member.last_loss,
                        steps=steps_done, tokens=steps_done * self.tokens_per_step,
                        tokens_per_step=self.tokens_per_step, wall_seconds=self.wall_seconds(member),
                        train_seconds=seconds, wandb_id=member.tracker.wandb_id, pack_size=self.program.size,
                        pack_segments=self.pack_segments(member), final_evaluations=dict(member.evaluations) or None,
                        mfu=self.mfu(steps_done * self.tokens_per_step / seconds) if steps_done and seconds else None,
                        **accuracy)

    # -- measures -----------------------------------------------------------------------------------------

    def pack_segments(self, member: Member) -> list[list[int]]:
        """``[[first step, pack size], ...]``: the pack size each segment of ``member``'s run trained in,
        merged where the size did not change (a run alone: one segment of size 1)."""
        earlier = [list(segment) for segment in member.start.meta.get("pack_segments") or []]
        if not earlier or earlier[-1][1] != self.program.size:
            earlier.append([self.start_step, self.program.size])
        return earlier

    def mfu(self, tokens_per_second: float) -> float:
        """One member's model FLOP utilisation at ``tokens_per_second`` of its own (its share of the step)."""
        config = self.config
        peak = hardware.mfu_peak_flops(config.peak_flops, config.model.compute_dtype)  # the device's, or the config's
        return model_flops_utilization(config.model, self.row_length, tokens_per_second, peak, jax.device_count())

    def wall_seconds(self, member: Member) -> float:
        """Wall seconds of every segment of ``member``'s run so far, this one included."""
        return member.earlier_seconds[0] + time.perf_counter() - member.started

    def train_seconds(self, member: Member) -> float:
        """Seconds of training steps (compilation excluded) of every segment of ``member``'s run so far."""
        earlier = member.earlier_seconds[1]
        if self.steps_started is None:
            return earlier
        ended = time.perf_counter() if self.steps_ended is None else self.steps_ended
        return earlier + ended - self.steps_started
