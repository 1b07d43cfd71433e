"""Train one model: a run's life cycle, and the training loop with its periodic work as hooks.

Read top to bottom (the compiled step is in ``program.py``, the optimizer in
``optim.py``, stopping in ``stopping.py``, a run's own resources and its
one ending in ``member.py`` and ``ending.py``):
1. ``run``: the run's life cycle. It takes the run's lease, reads the data
   and resolves the config (the model's vocabulary is the tokenizer's)
   before the run's record is filled in, opens the run's resources once each
   (``member.Member``: the checkpoints, the tracker: metrics file and wandb),
   restores the newest checkpoint that reads back whole (parameters,
   optimizer, step; the data position and the per-step RNG are pure
   functions of (seed, step), and the wandb id is in the checkpoint's
   metadata), trains, and ends the run in one place (``Member.ending``:
   its record, ``records.py``, and its exit codes, ``ending.py``).
2. ``Training``: the loop. After every step but the last it runs the
   periodic work as hooks on the step count (``Hook``: log, evaluate, check
   the lease, checkpoint, check for a stop); ``Training.end`` alone decides
   what happens after the loop (the last step's log, lease and stop check,
   the final evaluation and checkpoint). The loop shares its program and
   data with nothing run-specific, so it can later drive several members.

Guarantees:
- A step whose loss or gradient norm is not finite is not applied, so
  a NaN state never reaches a checkpoint; the run stops as ``diverged``.
- SIGTERM (how TPU preemption arrives) and Ctrl-C (SIGINT) make the loop
  save at the next step boundary, record the run as ``stopped`` and exit
  with ``PREEMPTED_EXIT_CODE``; rerunning resumes there. A second Ctrl-C
  exits at once. A stop asked for at any moment of a run, its final
  evaluation included, also stops the sweep launcher that shares its ``Stop``.
- Damaged checkpoints are passed over (and set aside); the run resumes from
  the newest that reads back whole, exactly as if it had not been interrupted.
- A run whose lease another process took over stops without writing to it.
- With several processes (pod-wide), all agree on the run's state: process
  0's reading of the record, and one step at which all stop (``multihost.py``).
- A checkpoint write that storage does not finish within its deadline fails
  the run with one line (``checkpoints.py``); any other error records the run
  as ``failed``, with the traceback in ``error.log``, and is re-raised.
- On object stores (one process), periodic checkpoints are saved behind the
  loop (``background_save.py``): the loop copies the state to the host and
  goes on; a bucket slower than the checkpoint interval skips intermediate
  checkpoints (said once), never steps. The loop waits for storage only for
  the final checkpoint and the record, and at a stop (for the write under
  way at most half the grace period, then for the stop's checkpoint). A
  background save that failed fails the run at the next step, with one line.

The command line tunes glibc's allocator for XLA:CPU (``cpu_allocator.py``)
and prepares the process (``entry.py``) before JAX starts; importing this
module changes nothing process-wide.

Command line: ``python -m scaling.train --help`` (``train_cli.py``); ``eval`` and ``sample`` use a
trained run (``scaling.evaluate``, ``scaling.generate``).
"""

from __future__ import annotations

if __name__ == "__main__":
    # `python -m scaling.train`: the command line reads its arguments before this module (and JAX) is
    # imported, so --help and bad input answer at once; it imports scaling.train itself to train.
    import sys

    from scaling.train_cli import main

    sys.exit(main())

import contextlib
import dataclasses
import math
import sys
import time
from typing import Callable, NamedTuple

import jax
from etils import epath

from scaling import data, hardware, lease as lease_lib, mesh as mesh_lib, multihost, record_checks, records
from scaling import rundir
from scaling.background_save import BackgroundSaver
from scaling.checkpoints import Checkpoints, abandoned_writes
from scaling.config import TrainConfig, config_id
from scaling.ending import AlreadyFinished  # noqa: F401 - raised by run; the launcher catches it as train's
from scaling.flops import model_flops_utilization
from scaling.member import Member
from scaling.program import Program, build, evaluate_metrics, hyperparameters
from scaling.stopping import Stop
from scaling.storage import is_remote
from scaling.track import new_wandb_id
from scaling.train_cli import PRESETS, load_config, main  # noqa: F401 - the command line's names, kept here


# ---------------------------------------------------------------------------
# The run's life cycle


def run(config: TrainConfig, workdir, *, show_progress: bool = True, devices=None,
        stop: Stop | None = None, raise_if_finished: bool = False, estimate: dict | None = None
        ) -> records.RunRecord:
    """Train ``config`` into the run directory ``workdir`` and return its run record.

    ``workdir`` may be relative (to the current directory) or a URI. Resumes
    from the newest readable checkpoint in ``workdir/checkpoints``; returns
    the existing record if the run already finished (raises ``AlreadyFinished`` with it instead when
    ``raise_if_finished``: a launcher then knows another process trained it). ``stop`` is asked between
    steps (default: a new one, listening while the run lasts); the sweep
    launcher passes its own, so it hears a signal that arrives at any moment.
    ``estimate``: the record's estimate fields (``estimated_step_seconds``, ``estimated_mfu``,
    ``estimate_source``: what the preflight expected of this run, kept beside the measured ``mfu``).
    Raises ``rundir.ConfigMismatch`` if the directory holds another config's
    run, ``lease.RunBusy`` if another live process is training it,
    ``Preempted`` after SIGTERM or Ctrl-C (a checkpoint of the current step is
    saved first) and ``LeaseLost`` if another process took the run over. Any
    other error is recorded as status ``failed`` (traceback in ``error.log``) and re-raised
    (``ending.py`` maps each to the record's status and the exit codes).
    """
    run_dir = rundir.absolute_path(workdir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.check_run_dir(run_dir, config)
    stop = Stop() if stop is None else stop
    # Listen from the start: a preemption while the data loads or the step compiles stops the run too;
    # and first, so that the stop's grace period (stopping.py) also bounds releasing the lease.
    with stop.listening(), run_lease(run_dir) as held:
        finished = finished_record(run_dir, config_id(config))
        if finished is not None:
            if raise_if_finished:
                raise AlreadyFinished(finished)
            return finished
        with stop.watching(held), Member(run_dir, config, held, stop, estimate).ending() as member:
            pipeline = data.build(config.data)
            resolved = resolve_config(config, pipeline)  # before the record is filled in: its counts follow it
            member.begin(resolved, pipeline.fingerprint)
            program = _program_for(resolved, pipeline, devices)
            checkpoints = member.open_checkpoints(program.abstract_state)
            start = _restore_or_init(checkpoints, program, resolved.seed, run_dir.name)
            member.open_tracker(start.step, start.meta, start.resumed, show_progress)
            training = Training(resolved, program, pipeline, member, start)
            member.on_close(training.close)
            status, fields = training.train()
            return member.conclude(status, **fields)


@contextlib.contextmanager
def run_lease(run_dir: epath.Path):
    """The run's lease, held while inside. None with several processes: pod-wide jobs agree through the
    launcher instead, since only process 0 could hold a lease."""
    if multihost.process_count() > 1:
        yield None
        return
    held = lease_lib.Lease(run_dir).acquire()
    try:
        yield held
    finally:
        if not held.lost:
            held.release()


def finished_record(run_dir: epath.Path, run_id: str) -> records.RunRecord | None:
    """The run's record if it already finished (process 0's reading, on every process), else None.
    A record that is not run ``run_id``'s, or whose final loss the metrics log does not hold, is not trusted."""
    try:
        previous = record_checks.read_checked_record(run_dir, run_id)
    except records.RecordError as error:
        print(f"warning: {error}; training the run again (resuming from its checkpoints)", file=sys.stderr)
        previous = None
    finished = previous is not None and previous.status == "finished"
    agreed = multihost.broadcast_from_process_0(finished)  # hosts may see the record at different times
    if agreed and not finished:
        raise RuntimeError(f"process 0 reports run {run_dir.name} finished, but this host cannot read "
                           "its result.json yet")
    return previous if agreed else None


def resolve_config(config: TrainConfig, pipeline) -> TrainConfig:
    """``config`` with the model's vocabulary made the tokenizer's (the user's config is left as it is:
    the run id and ``config.json`` are the user's)."""
    if config.model.vocab_size != pipeline.vocab_size:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=pipeline.vocab_size))
    return config


def _program_for(config: TrainConfig, pipeline, devices) -> Program:
    """The run's program on its mesh; the mesh and batch are checked first, before anything compiles."""
    mesh = mesh_lib.make_mesh(config.mesh, devices)
    mesh_lib.check_batch(mesh, config.batch_size, microbatches=config.microbatches)
    arguments = data.program_arguments(config.data, config.model.objective, config.model.vocab_size)
    return build(config, mesh, **arguments)


class Start(NamedTuple):
    """Where a run segment starts: the state, the checkpoint's ``meta`` (wandb id, initial eval loss,
    wall and training seconds so far), its step, and whether it was restored from a checkpoint."""

    state: dict
    meta: dict
    step: int
    resumed: bool


def restore_newest(checkpoints: Checkpoints, name: str) -> Start | None:
    """The newest checkpoint that reads back whole as a ``Start`` (damaged newer ones are reported), or None."""
    restored = checkpoints.restore_newest()
    for line in checkpoints.skipped:
        print(f"warning: {name}: damaged checkpoint passed over, {line}", file=sys.stderr)
    return None if restored is None else Start(*restored, resumed=True)


def fresh_meta() -> dict:
    """A new run's checkpoint metadata: a new wandb id, nothing measured yet."""
    return {"wandb_id": new_wandb_id(), "initial_eval_loss": None, "wall_seconds": 0.0, "train_seconds": 0.0}


def _restore_or_init(checkpoints: Checkpoints, program: Program, seed: int, name: str) -> Start:
    """The newest checkpoint that reads back whole, else a fresh state."""
    restored = restore_newest(checkpoints, name)
    if restored is not None:
        return restored
    return Start(program.init(jax.random.PRNGKey(seed)), fresh_meta(), 0, resumed=False)


# ---------------------------------------------------------------------------
# The loop


@dataclasses.dataclass(frozen=True)
class Hook:
    """Periodic work between steps: ``callback(steps done)`` every ``every`` steps (never if 0). Not after
    the last step: what happens then is ``Training.end``'s alone."""

    every: int
    callback: Callable[[int], None]

    def due(self, done: int) -> bool:
        """Whether to run after ``done`` steps (not the last)."""
        return self.every > 0 and done % self.every == 0


class Training:
    """One run segment of ``member``: the steps from ``start`` to the last, with ``hooks`` between them;
    then ``end``. ``config`` is the resolved one (its vocabulary is the pipeline's)."""

    def __init__(self, config: TrainConfig, program: Program, pipeline: data.Pipeline, member: Member, start: Start):
        self.config, self.program, self.pipeline, self.member = config, program, pipeline, member
        self.stop, self.checkpoints, self.tracker = member.stop, member.checkpoints, member.tracker
        self.state, self.meta, self.start_step = start.state, start.meta, start.step
        self.hparams = jax.device_put(hyperparameters(config), mesh_lib.replicated(program.mesh))
        self.validation = pipeline.validation_batches(config.batch_size, config.eval_batches, jax.process_index(),
                                                      jax.process_count())
        # Classification rows are padded to their split's longest string, not to seq_len.
        self.row_length = pipeline.row_length("train") if pipeline.kind == "classification" else config.data.seq_len
        self.earlier_seconds = float(start.meta.get("wall_seconds", 0.0))
        # Training seconds (records.RunRecord.train_seconds): from the end of the first step's compilation
        # to the last step. Checkpoints written before they were counted hold none: they count from here.
        self.earlier_train_seconds = float(start.meta.get("train_seconds", 0.0))
        self.steps_started: float | None = None  # when this segment's first step had compiled
        self.steps_ended: float | None = None
        self.status, self.eval_loss, self.saved_step = "finished", None, None
        # A resume at the last step trains nothing: its training loss is the one logged before.
        self.last_loss = self.tracker.pending(start.step).get("loss")
        self.pending: list = []  # (step, metrics still on the device) since the last log
        self.window_start, self.window_steps = time.perf_counter(), 0  # of the speed measurement
        # On object stores periodic checkpoints are saved behind the loop (background_save.py); on local disks
        # orbax's own asynchronous write is quick. Not with several processes: a save is collective there,
        # and processes must not skip different steps.
        behind = is_remote(str(self.checkpoints.directory)) and multihost.process_count() == 1
        self.saver = BackgroundSaver(self.write_checkpoint) if behind else None

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.row_length

    def hooks(self) -> list[Hook]:
        """The periodic work, in the order it runs after a step."""
        config = self.config
        return [Hook(config.log_every, self.log),
                Hook(config.checkpoint_every, self.log),  # a checkpoint only ever follows steps found finite
                Hook(config.eval_every, self.evaluate),
                Hook(1, self.check_lease),
                Hook(config.checkpoint_every, self.checkpoint),
                Hook(1, self.check_stop)]

    def train(self) -> tuple[str, dict]:
        """Train from the start step to the last, then end (``end``): the run's status and its record's fields."""
        if self.meta.get("initial_eval_loss") is None and self.config.eval_at_start:
            self.meta["initial_eval_loss"] = self.evaluate(self.start_step)
        self.stop.start(self.start_step)
        if self.stop.agreed(self.start_step):  # a stop while the data loaded or the step compiled
            raise self.stop.preempted(f"before training resumed at step {self.start_step}")
        try:
            return self.end(self.steps())
        finally:
            self.end_steps()  # (when training ended by an exception; else end did it)

    def steps(self) -> int | None:
        """The loop: train to the last step, running the hooks after each other step; stop early on
        divergence. Returns the number of steps done at the end (None if this segment trained none)."""
        config, program = self.config, self.program
        hooks, self.window_start, done = self.hooks(), time.perf_counter(), None
        iterator = self.pipeline.train_iterator(config.seed, self.start_step, config.batch_size,
                                                jax.process_index(), jax.process_count())
        with contextlib.closing(iterator):
            for step, local_batch in iterator:
                if step >= config.steps:
                    return done
                batch = mesh_lib.global_batch(local_batch, program.mesh, config.batch_size)
                self.state, metrics = program.train_step(self.state, batch, self.hparams)
                if self.steps_started is None:  # the first call compiled the step (or found it compiled)
                    self.steps_started = time.perf_counter()
                self.pending.append((step, metrics))
                self.window_steps += 1
                self.tracker.advance()  # the first call comes after compilation, so the ETA excludes it
                done = step + 1
                if done == config.steps:
                    return done
                for hook in hooks:
                    if hook.due(done):
                        hook.callback(done)
                    if self.status == "diverged":
                        return done
        return done

    def end(self, done: int | None) -> tuple[str, dict]:
        """Everything after the loop, decided here alone, in order: after a last step trained in this
        segment, its log (not finite: ``diverged``), the lease and a stop (``Preempted`` once its checkpoint
        is saved); the training clock stops; unless diverged, the final evaluation and the last checkpoint
        (an evaluation not finite: ``diverged``); the checkpoint writes waited for. Returns the status and
        the record's fields."""
        if done == self.config.steps:
            self.log(done)
            if self.status != "diverged":
                self.check_lease(done)
                self.check_stop(done)
        self.end_steps()
        steps_done = int(jax.device_get(self.state["step"]))
        accuracy = self.final_evaluation(steps_done) if self.status == "finished" else {}
        self.settle_checkpoints()  # a diverged run keeps the checkpoints it saved before
        self.wait_for_writes()
        return self.status, dict(
            final_eval_loss=self.eval_loss if self.status == "finished" else None,
            initial_eval_loss=self.meta["initial_eval_loss"], final_train_loss=self.last_loss, steps=steps_done,
            tokens=steps_done * self.tokens_per_step, tokens_per_step=self.tokens_per_step,
            wall_seconds=self.wall_seconds(), train_seconds=self.train_seconds(), wandb_id=self.tracker.wandb_id,
            mfu=self.measured_mfu(steps_done), **accuracy)

    def measured_mfu(self, steps_done: int) -> float | None:
        """The trainer's MFU over the whole run: its tokens over ``train_seconds`` (None before any step)."""
        seconds = self.train_seconds()
        if not steps_done or not seconds:
            return None
        peak = hardware.mfu_peak_flops(self.config.peak_flops, self.config.model.compute_dtype)
        return model_flops_utilization(self.config.model, self.row_length, steps_done * self.tokens_per_step / seconds,
                                       peak, jax.device_count())

    def final_evaluation(self, steps_done: int) -> dict:
        """Evaluate and checkpoint the last step; the record's accuracy fields (classification), or
        ``diverged`` if the loss is not finite."""
        final = evaluate_metrics(self.program, self.state["params"], self.validation, self.config.batch_size)
        self.eval_loss, accuracy = final["loss"], {}
        if self.pipeline.kind == "classification":  # the label's cross-entropy in bits, and accuracy
            accuracy = {"final_eval_accuracy": final["accuracy"], "final_eval_bits": final["loss"] / math.log(2)}
        self.tracker.log(steps_done, {"eval_loss": self.eval_loss,
                                      **{key[len("final_"):]: value for key, value in accuracy.items()}})
        self.stop.check_lease()
        self.settle_checkpoints()
        if steps_done not in self.checkpoints.steps():
            self.save(steps_done, force=True)
        if not math.isfinite(self.eval_loss):
            self.status, accuracy = "diverged", {}
        return accuracy

    def end_steps(self) -> None:
        """The end of the steps (last step, divergence or a stop): the training clock stops and the progress
        display prints its final line, so both show the steps' time alone. Once."""
        if self.steps_ended is None:
            self.steps_ended = time.perf_counter()
            self.tracker.end_of_steps()

    def log(self, done: int) -> None:
        """Fetch the metrics of the steps since the last log and log the newest, or stop as ``diverged``."""
        if not self.pending:
            return
        config, tracker = self.config, self.tracker
        steps, fetched = [s for s, _ in self.pending], jax.device_get([m for _, m in self.pending])
        self.pending = []
        bad = [s for s, m in zip(steps, fetched) if not bool(m["finite"])]
        if bad:
            self.status = "diverged"
            tracker.log(bad[0] + 1, {"loss": None, "diverged": 1.0})
            return
        newest = fetched[-1]
        speed = self.window_steps * self.tokens_per_step / max(time.perf_counter() - self.window_start, 1e-9)
        self.last_loss = float(newest["loss"])
        peak = hardware.mfu_peak_flops(config.peak_flops, config.model.compute_dtype)  # the device's, or the config's
        mfu = model_flops_utilization(config.model, self.row_length, speed, peak, jax.device_count())
        tracker.log(done, {"loss": self.last_loss, "grad_norm": float(newest["grad_norm"]),
                           "lr": float(newest["lr"]), "tokens_per_second": speed, "mfu": mfu,
                           "tokens": done * self.tokens_per_step})
        self.window_start, self.window_steps = time.perf_counter(), 0

    def evaluate(self, done: int) -> float:
        """Evaluate the current parameters on the validation set and log the loss at ``done``."""
        metrics = evaluate_metrics(self.program, self.state["params"], self.validation, self.config.batch_size)
        self.eval_loss = metrics["loss"]
        self.tracker.log(done, {"eval_loss": self.eval_loss})
        return self.eval_loss

    def check_lease(self, done: int) -> None:
        """``LeaseLost`` if the heartbeat found the lease taken over; the error of a background save."""
        self.stop.check_lease()
        if self.saver is not None:
            self.saver.raise_error()

    def check_stop(self, done: int) -> None:
        """If every process agrees to stop: save this step, wait for the write, raise ``Preempted``."""
        if not self.stop.agreed(done):
            return
        self.settle_checkpoints()
        if self.saved_step != done:  # a second save of the same step would fail
            self.save(done, force=True)
        self.wait_for_writes()
        raise self.stop.preempted(f"after step {done}; checkpoint saved")

    def checkpoint(self, step: int) -> None:
        """The periodic checkpoint at ``step``: handed to the background saver (a host copy of the state,
        since the next step donates its buffers; the metrics rows up to it flushed, written behind), or
        saved here with several processes."""
        if self.saver is None:
            self.save(step)
            return
        self.stop.check_lease()
        self.tracker.flush(through_step=step)  # the saver waits for these before the checkpoint
        self.meta["wall_seconds"], self.meta["train_seconds"] = self.wall_seconds(), self.train_seconds()
        self.saver.submit(step, jax.device_get(self.state), self.meta)

    def write_checkpoint(self, step: int, state, meta: dict) -> None:
        """On the saver's thread: read the lease, wait for the metrics rows up to ``step``, save and wait
        for the write (its own deadline; a stop bounds the wait for it in ``settle_checkpoints``)."""
        self.stop.check_lease(read_now=True)
        self.tracker.wait_for_writes()
        self.checkpoints.save(step, state, meta, abandon_on_stop=False)
        self.checkpoints.finish(abandon_on_stop=False, step=step)
        self.saved_step = step

    def settle_checkpoints(self) -> None:
        """Before a checkpoint saved here (the stop's, the last): drop the background save not started,
        wait for the one under way (a stop bounds this wait: ``WriteAbandoned``), raise its error if it failed."""
        if self.saver is None:
            return
        stop, checkpoints = self.stop, self.checkpoints
        self.saver.drop_pending()
        self.saver.wait_idle(lambda: stop.requested,
                             lambda step: checkpoints.abandon(f"checkpoint of step {step} in {checkpoints.directory}"))

    def close(self) -> None:
        """End the background saver (what is pending is dropped; a save under way is waited for, at most
        the checkpoints' write deadline)."""
        if self.saver is not None:  # a write given up on is not waited for (exit_now_if_abandoned)
            abandoned = str(self.checkpoints.directory) in abandoned_writes()
            self.saver.close(0 if abandoned else self.checkpoints.write_timeout)

    def save(self, step: int, force: bool = False) -> None:
        """Checkpoint the state at ``step`` (after reading the lease and writing the metrics up to it)."""
        self.stop.check_lease(read_now=True)
        self.tracker.flush(through_step=step, wait=True)  # a resume from this step finds every row before it
        self.meta["wall_seconds"], self.meta["train_seconds"] = self.wall_seconds(), self.train_seconds()
        self.checkpoints.save(step, self.state, self.meta, force=force)
        self.saved_step = step

    def wait_for_writes(self) -> None:
        """Wait for the checkpoint writes under way (``CheckpointError`` if one failed)."""
        self.checkpoints.finish()

    def wall_seconds(self) -> float:
        """Seconds of wall clock of every segment so far, this one included."""
        return self.earlier_seconds + time.perf_counter() - self.member.started

    def train_seconds(self) -> float:
        """Seconds of training steps (compilation excluded) of every segment so far, this one included."""
        if self.steps_started is None:
            return self.earlier_train_seconds
        ended = time.perf_counter() if self.steps_ended is None else self.steps_ended
        return self.earlier_train_seconds + ended - self.steps_started
