"""Train one model: a run's life cycle, and the training loop with its periodic work as hooks.

Read top to bottom (the compiled step is in ``program.py``, the optimizer in
``optim.py``, stopping in ``stopping.py``):
1. ``run``: the run's life cycle. It opens the run's resources once each
   (the lease, the checkpoints, the tracker: metrics file and wandb),
   restores the newest checkpoint that reads back whole (parameters,
   optimizer, step; the data position and the per-step RNG are pure
   functions of (seed, step), and the wandb id is in the checkpoint's
   metadata), trains, and writes the run record (``records.py``).
2. ``Training``: the loop. After every step it runs the periodic work as
   hooks on the step count (``Hook``: log, evaluate, check the lease,
   checkpoint, check for a stop), then evaluates and checkpoints the last step.

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
  0's reading of the record, and one step at which all stop.
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
before JAX starts; importing this module changes nothing process-wide.

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
import json
import math
import sys
import time
from typing import Callable, NamedTuple

import jax
import numpy as np
from etils import epath

from scaling import budget, data, lease as lease_lib, mesh as mesh_lib, optim as optim_lib, record_checks
from scaling import hardware, records, rundir
from scaling.background_save import BackgroundSaver
from scaling.checkpoints import CheckpointError, Checkpoints, abandoned_writes
from scaling.config import TrainConfig, config_id, to_dict
from scaling.flops import model_flops_utilization
from scaling.program import Program, build, evaluate, evaluate_metrics, hyperparameters
from scaling.stopping import PREEMPTED_EXIT_CODE, LeaseLost, Preempted, Stop
from scaling.storage import is_remote, write_atomic
from scaling.track import Tracker, new_wandb_id
from scaling.train_cli import PRESETS, load_config, main  # noqa: F401 - the command line's names, kept here


# ---------------------------------------------------------------------------
# The run's life cycle


class AlreadyFinished(Exception):
    """The run had finished before this call took its lease (``run(..., raise_if_finished=True)``)."""

    def __init__(self, record: records.RunRecord):
        super().__init__(f"run {record.run_id} had already finished")
        self.record = record


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
    other error is recorded as status ``failed`` (traceback in ``error.log``) and re-raised.
    """
    run_dir = rundir.absolute_path(workdir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.check_run_dir(run_dir, config)
    stop = Stop() if stop is None else stop
    with contextlib.ExitStack() as resources:
        # Listen from the start: a preemption while the data loads or the step compiles stops the run too;
        # and first, so that the stop's grace period (stopping.py) also bounds releasing the lease.
        resources.enter_context(stop.listening())
        run_lease = resources.enter_context(_run_lease(run_dir))
        finished = _finished_record(run_dir, config_id(config))
        if finished is not None:
            if raise_if_finished:
                raise AlreadyFinished(finished)
            return finished
        resources.enter_context(stop.watching(run_lease))
        started = time.perf_counter()  # wall seconds: the whole run, loading the data included
        outcome = resources.enter_context(
            Outcome(run_dir, _new_record(config, run_dir).replace(**(estimate or {})), stop).recorded())
        pipeline = data.build(config.data)
        outcome.record = outcome.record.replace(data_fingerprint=pipeline.fingerprint)
        config = resolve_config(config, pipeline)
        # The record was begun from the user's config; its parameter counts follow the tokenizer's vocabulary.
        outcome.record = outcome.record.replace(**_param_counts(config))
        program = _program_for(config, pipeline, devices)
        checkpoints = Checkpoints(run_dir / "checkpoints", config.keep_checkpoints, program.abstract_state,
                                  should_stop=lambda: stop.requested, lease=run_lease)
        resources.callback(checkpoints.close)
        start = _restore_or_init(checkpoints, program, config.seed, run_dir.name)
        tracker = resources.enter_context(_closed_on_error(_open_tracker(config, run_dir, start, show_progress),
                                                           stop))
        training = Training(Parts(config, program, pipeline, checkpoints, tracker, stop), start, started)
        resources.callback(training.close)
        training.train()
        record = training.finish(outcome.record)
        stop.check_lease(read_now=True)
        tracker.summary({"final_eval_loss": record.final_eval_loss, "status": record.status})
        tracker.close(exit_code=0 if record.status == "finished" else 1)
        outcome.write(record)
        return record


@contextlib.contextmanager
def _run_lease(run_dir: epath.Path):
    """The run's lease, held while inside. None with several processes: pod-wide jobs agree through the
    launcher instead, since only process 0 could hold a lease."""
    if jax.process_count() > 1:
        yield None
        return
    run_lease = lease_lib.Lease(run_dir).acquire()
    try:
        yield run_lease
    finally:
        if not run_lease.lost:
            run_lease.release()


def _finished_record(run_dir: epath.Path, run_id: str) -> records.RunRecord | None:
    """The run's record if it already finished (process 0's reading, on every process), else None.
    A record that is not run ``run_id``'s, or whose final loss the metrics log does not hold, is not trusted."""
    try:
        previous = record_checks.read_checked_record(run_dir, run_id)
    except records.RecordError as error:
        print(f"warning: {error}; training the run again (resuming from its checkpoints)", file=sys.stderr)
        previous = None
    finished = previous is not None and previous.status == "finished"
    if jax.process_count() > 1:  # hosts may see the record at different times; process 0's view counts
        from jax.experimental import multihost_utils

        agreed = bool(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(finished))))
        if agreed and not finished:
            raise RuntimeError(f"process 0 reports run {run_dir.name} finished, but this host cannot read "
                               "its result.json yet")
        finished = agreed
    return previous if finished else None


def _new_record(config: TrainConfig, run_dir: epath.Path) -> records.RunRecord:
    """The record of a run about to train (status ``running``); writes its ``config.json``."""
    if jax.process_index() == 0:
        write_atomic(run_dir / "config.json", json.dumps(to_dict(config), indent=2, sort_keys=True))
    return records.RunRecord(
        run_id=config_id(config), status="running", depth=config.model.depth, width=config.model.width,
        seed=config.seed, params_non_embedding=budget.non_embedding_params(config.model.depth, config.model.width),
        name=config.name, sweep=config.sweep_name, point_id=config_id(dataclasses.replace(config, seed=0)),
        heads=config.model.heads, **_param_counts(config),
        lr_rule=optim_lib.rule_name(config.optim), peak_lr=config.optim.peak_lr,
        peak_lr_hidden=optim_lib.learning_rates(config.optim, config.model)["hidden"],
        code_version=rundir.code_version(), tokens_per_step=config.batch_size * config.data.seq_len,
        planned_steps=config.steps)


def _param_counts(config: TrainConfig) -> dict:
    """The record's exact parameter counts of ``config``'s model (total and embedding tables)."""
    counts = budget.count_params(config.model)
    return {"params_total": counts["total"], "params_embedding": counts["embedding"]}


@dataclasses.dataclass
class Outcome:
    """The run's record as it becomes known (written by process 0 only)."""

    run_dir: epath.Path
    record: records.RunRecord
    stop: Stop

    @contextlib.contextmanager
    def recorded(self):
        """Record a run that ends by an exception: ``stopped`` (resumable) after ``Preempted``, nothing
        once the lease is lost (the run is another process's now), else ``failed`` with ``error.log``."""
        try:
            yield self
        except Preempted as stopped:
            self.write(self.record.replace(status="stopped", error=str(stopped)))
            raise
        except BaseException as error:
            if not (isinstance(error, LeaseLost) or self.stop.lease_lost):
                log_file = rundir.log_failure(self.run_dir, error) if jax.process_index() == 0 else None
                # For the command line's one line: the traceback's file, only if it was written.
                error.error_log = str(self.run_dir / log_file) if log_file else None
                try:
                    self.write(self.record.replace(status="failed", error=rundir.one_line(error), log_file=log_file))
                except Exception:  # noqa: BLE001 - a directory that takes no record must not hide the first error
                    pass
            raise

    def write(self, record: records.RunRecord) -> None:
        """Keep ``record`` and write it as the run's ``result.json``."""
        self.record = record
        if jax.process_index() == 0:
            records.write_record(self.run_dir, record)


def resolve_config(config: TrainConfig, pipeline) -> TrainConfig:
    """Make the model's vocabulary match the tokenizer's."""
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


def _restore_or_init(checkpoints: Checkpoints, program: Program, seed: int, name: str) -> Start:
    """The newest checkpoint that reads back whole (damaged newer ones are reported), else a fresh state."""
    restored = checkpoints.restore_newest()
    for line in checkpoints.skipped:
        print(f"warning: {name}: damaged checkpoint passed over, {line}", file=sys.stderr)
    if restored is not None:
        return Start(*restored, resumed=True)
    meta = {"wandb_id": new_wandb_id(), "initial_eval_loss": None, "wall_seconds": 0.0, "train_seconds": 0.0}
    return Start(program.init(jax.random.PRNGKey(seed)), meta, 0, resumed=False)


def _open_tracker(config: TrainConfig, run_dir: epath.Path, start: Start, show_progress: bool) -> Tracker:
    # Rows past the restored step were logged by a segment whose later state is lost; they are redone.
    return Tracker(run_dir, total_steps=config.steps, start_step=start.step, config=to_dict(config),
                   name=config.name or run_dir.name, group=config.sweep_name, project=config.wandb_project,
                   mode=config.wandb_mode, wandb_id=start.meta["wandb_id"], is_main_process=jax.process_index() == 0,
                   show_progress=show_progress, keep_until_step=start.step if start.resumed else None)


@contextlib.contextmanager
def _closed_on_error(tracker: Tracker, stop: Stop):
    """Close ``tracker`` if the block raises (exit code ``PREEMPTED_EXIT_CODE`` after a stop, else 1);
    after a lost lease without writing what is pending, since the run's files are another's now."""
    try:
        yield tracker
    except BaseException as error:
        if isinstance(error, LeaseLost) or stop.lease_lost:
            tracker.discard_pending()
        tracker.close(exit_code=PREEMPTED_EXIT_CODE if isinstance(error, Preempted) else 1)
        raise


# ---------------------------------------------------------------------------
# The loop


class Parts(NamedTuple):
    """What a run segment trains with, each opened once by ``run``."""

    config: TrainConfig  # its vocabulary resolved to the pipeline's
    program: Program
    pipeline: data.Pipeline
    checkpoints: Checkpoints
    tracker: Tracker
    stop: Stop


@dataclasses.dataclass(frozen=True)
class Hook:
    """Work between steps: ``callback(steps done)`` every ``every`` steps (never if 0); after the last
    step only if ``at_end`` (the end has its own evaluation and checkpoint)."""

    every: int
    callback: Callable[[int], None]
    at_end: bool = False

    def due(self, done: int, last: int) -> bool:
        """Whether to run after ``done`` steps of ``last``."""
        if done == last:
            return self.at_end
        return self.every > 0 and done % self.every == 0


class Training:
    """One run segment: the steps from ``start`` to the last, with ``hooks`` between them; then ``finish``."""

    def __init__(self, parts: Parts, start: Start, started: float):
        self.parts, self.state, self.meta, self.start_step = parts, start.state, start.meta, start.step
        config, pipeline = parts.config, parts.pipeline
        self.hparams = jax.device_put(hyperparameters(config), mesh_lib.replicated(parts.program.mesh))
        self.validation = pipeline.validation_batches(config.batch_size, config.eval_batches, jax.process_index(),
                                                      jax.process_count())
        # Classification rows are padded to their split's longest string, not to seq_len.
        self.row_length = pipeline.row_length("train") if pipeline.kind == "classification" else config.data.seq_len
        self.started, self.earlier_seconds = started, float(start.meta.get("wall_seconds", 0.0))
        # Training seconds (records.RunRecord.train_seconds): from the end of the first step's compilation
        # to the last step. Checkpoints written before they were counted hold none: they count from here.
        self.earlier_train_seconds = float(start.meta.get("train_seconds", 0.0))
        self.steps_started: float | None = None  # when this segment's first step had compiled
        self.steps_ended: float | None = None
        self.status, self.eval_loss, self.saved_step = "finished", None, None
        # A resume at the last step trains nothing: its training loss is the one logged before.
        self.last_loss = parts.tracker.pending(start.step).get("loss")
        self.pending: list = []  # (step, metrics still on the device) since the last log
        self.window_start, self.window_steps = time.perf_counter(), 0  # of the speed measurement
        # On object stores periodic checkpoints are saved behind the loop (background_save.py); on local disks
        # orbax's own asynchronous write is quick. Not with several processes: a save is collective there,
        # and processes must not skip different steps.
        behind = is_remote(str(parts.checkpoints.directory)) and jax.process_count() == 1
        self.saver = BackgroundSaver(self.write_checkpoint) if behind else None

    @property
    def tokens_per_step(self) -> int:
        return self.parts.config.batch_size * self.row_length

    def hooks(self) -> list[Hook]:
        """The periodic work, in the order it runs after a step."""
        config = self.parts.config
        return [Hook(config.log_every, self.log, at_end=True),
                Hook(config.checkpoint_every, self.log),  # a checkpoint only ever follows steps found finite
                Hook(config.eval_every, self.evaluate),
                Hook(1, self.check_lease, at_end=True),
                Hook(config.checkpoint_every, self.checkpoint),
                Hook(1, self.check_stop, at_end=True)]

    def train(self) -> None:
        """Train from the start step to the last, running the hooks after each step; stop early on divergence."""
        config, program, stop = self.parts.config, self.parts.program, self.parts.stop
        if self.meta.get("initial_eval_loss") is None and config.eval_at_start:
            self.meta["initial_eval_loss"] = self.evaluate(self.start_step)
        stop.start(self.start_step)
        if stop.agreed(self.start_step):  # a stop while the data loaded or the step compiled
            raise stop.preempted(f"before training resumed at step {self.start_step}")
        hooks, self.window_start = self.hooks(), time.perf_counter()
        iterator = self.parts.pipeline.train_iterator(config.seed, self.start_step, config.batch_size,
                                                      jax.process_index(), jax.process_count())
        with contextlib.closing(iterator), self.timing_steps():
            for step, local_batch in iterator:
                if step >= config.steps:
                    return
                batch = mesh_lib.global_batch(local_batch, program.mesh, config.batch_size)
                self.state, metrics = program.train_step(self.state, batch, self.hparams)
                if self.steps_started is None:  # the first call compiled the step (or found it compiled)
                    self.steps_started = time.perf_counter()
                self.pending.append((step, metrics))
                self.window_steps += 1
                self.parts.tracker.advance()  # the first call comes after compilation, so the ETA excludes it
                done = step + 1
                for hook in hooks:
                    if hook.due(done, config.steps):
                        hook.callback(done)
                    if self.status == "diverged":
                        return

    @contextlib.contextmanager
    def timing_steps(self):
        """Around the loop: when it ends (last step, divergence or a stop), the training clock stops and
        the progress display prints its final line, so both show the steps' time alone."""
        try:
            yield
        finally:
            self.steps_ended = time.perf_counter()
            self.parts.tracker.end_of_steps()

    def log(self, done: int) -> None:
        """Fetch the metrics of the steps since the last log and log the newest, or stop as ``diverged``."""
        if not self.pending:
            return
        config, tracker = self.parts.config, self.parts.tracker
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
        config = self.parts.config
        self.eval_loss = evaluate(self.parts.program, self.state["params"], self.validation, config.batch_size)
        self.parts.tracker.log(done, {"eval_loss": self.eval_loss})
        return self.eval_loss

    def check_lease(self, done: int) -> None:
        """``LeaseLost`` if the heartbeat found the lease taken over; the error of a background save."""
        self.parts.stop.check_lease()
        if self.saver is not None:
            with self.checkpoint_errors():
                self.saver.raise_error()

    def check_stop(self, done: int) -> None:
        """If every process agrees to stop: save this step, wait for the write, raise ``Preempted``."""
        stop = self.parts.stop
        if not stop.agreed(done):
            return
        self.settle_checkpoints()
        if self.saved_step != done:  # a second save of the same step would fail
            self.save(done, force=True)
        self.wait_for_writes()
        raise stop.preempted(f"after step {done}; checkpoint saved")

    def checkpoint(self, step: int) -> None:
        """The periodic checkpoint at ``step``: handed to the background saver (a host copy of the state,
        since the next step donates its buffers; the metrics rows up to it flushed, written behind), or
        saved here with several processes."""
        if self.saver is None:
            self.save(step)
            return
        self.parts.stop.check_lease()
        self.parts.tracker.flush(through_step=step)  # the saver waits for these before the checkpoint
        self.meta["wall_seconds"], self.meta["train_seconds"] = self.wall_seconds(), self.train_seconds()
        with self.checkpoint_errors():
            self.saver.submit(step, jax.device_get(self.state), self.meta)

    def write_checkpoint(self, step: int, state, meta: dict) -> None:
        """On the saver's thread: read the lease, wait for the metrics rows up to ``step``, save and wait
        for the write (its own deadline; a stop bounds the wait for it in ``settle_checkpoints``)."""
        self.parts.stop.check_lease(read_now=True)
        self.parts.tracker.wait_for_writes()
        checkpoints = self.parts.checkpoints
        checkpoints.save(step, state, meta, abandon_on_stop=False)
        checkpoints.finish(abandon_on_stop=False, step=step)
        self.saved_step = step

    def settle_checkpoints(self) -> None:
        """Before a checkpoint saved here (the stop's, the last): drop the background save not started,
        wait for the one under way (a stop bounds this wait), raise its error if it failed."""
        if self.saver is None:
            return
        stop, checkpoints = self.parts.stop, self.parts.checkpoints
        self.saver.drop_pending()
        with self.checkpoint_errors():
            self.saver.wait_idle(lambda: stop.requested,
                                 lambda step: checkpoints.abandon(f"checkpoint of step {step} in "
                                                                  f"{checkpoints.directory}"))

    def close(self) -> None:
        """End the background saver (what is pending is dropped; a save under way is waited for, at most
        the checkpoints' write deadline)."""
        if self.saver is not None:  # a write given up on is not waited for (exit_now_if_abandoned)
            abandoned = str(self.parts.checkpoints.directory) in abandoned_writes()
            self.saver.close(0 if abandoned else self.parts.checkpoints.write_timeout)

    def save(self, step: int, force: bool = False) -> None:
        """Checkpoint the state at ``step`` (after reading the lease and writing the metrics up to it)."""
        stop = self.parts.stop
        stop.check_lease(read_now=True)
        self.parts.tracker.flush(through_step=step, wait=True)  # a resume from this step finds every row before it
        self.meta["wall_seconds"], self.meta["train_seconds"] = self.wall_seconds(), self.train_seconds()
        with self.checkpoint_errors():
            self.parts.checkpoints.save(step, self.state, self.meta, force=force)
        self.saved_step = step

    def wait_for_writes(self) -> None:
        """Wait for the checkpoint writes under way (``CheckpointError`` if one failed)."""
        with self.checkpoint_errors():
            self.parts.checkpoints.finish()

    @contextlib.contextmanager
    def checkpoint_errors(self):
        """A write given up on after a stop is ``Preempted``; one refused because the lease was lost
        (``leased_commit.py``) is ``LeaseLost``."""
        stop = self.parts.stop
        try:
            with stop.write_abandoned_means_stop():
                yield
        except CheckpointError:
            stop.check_lease()
            raise

    def wall_seconds(self) -> float:
        """Seconds of wall clock of every segment so far, this one included."""
        return self.earlier_seconds + time.perf_counter() - self.started

    def train_seconds(self) -> float:
        """Seconds of training steps (compilation excluded) of every segment so far, this one included."""
        if self.steps_started is None:
            return self.earlier_train_seconds
        ended = time.perf_counter() if self.steps_ended is None else self.steps_ended
        return self.earlier_train_seconds + ended - self.steps_started

    def finish(self, record: records.RunRecord) -> records.RunRecord:
        """Unless diverged, evaluate and checkpoint the last step; wait for the writes; the final record."""
        config, pipeline, tracker = self.parts.config, self.parts.pipeline, self.parts.tracker
        steps_done = int(jax.device_get(self.state["step"]))
        accuracy = {}
        if self.status == "finished":
            final = evaluate_metrics(self.parts.program, self.state["params"], self.validation, config.batch_size)
            self.eval_loss = final["loss"]
            if pipeline.kind == "classification":  # the label's cross-entropy in bits, and accuracy
                accuracy = {"final_eval_accuracy": final["accuracy"], "final_eval_bits": final["loss"] / math.log(2)}
            tracker.log(steps_done, {"eval_loss": self.eval_loss,
                                     **{key[len("final_"):]: value for key, value in accuracy.items()}})
            self.parts.stop.check_lease()
            self.settle_checkpoints()
            if steps_done not in self.parts.checkpoints.steps():
                self.save(steps_done, force=True)
            if not math.isfinite(self.eval_loss):
                self.status, accuracy = "diverged", {}
        self.settle_checkpoints()  # a diverged run keeps the checkpoints it saved before
        self.wait_for_writes()
        return record.replace(
            status=self.status, final_eval_loss=self.eval_loss if self.status == "finished" else None,
            initial_eval_loss=self.meta["initial_eval_loss"], final_train_loss=self.last_loss, steps=steps_done,
            tokens=steps_done * self.tokens_per_step, tokens_per_step=self.tokens_per_step,
            wall_seconds=self.wall_seconds(), train_seconds=self.train_seconds(), wandb_id=tracker.wandb_id,
            mfu=self.measured_mfu(steps_done), **accuracy)

    def measured_mfu(self, steps_done: int) -> float | None:
        """The trainer's MFU over the whole run: its tokens over ``train_seconds`` (None before any step)."""
        seconds = self.train_seconds()
        if not steps_done or not seconds:
            return None
        config = self.parts.config
        return model_flops_utilization(config.model, self.row_length, steps_done * self.tokens_per_step / seconds,
                                       hardware.mfu_peak_flops(config.peak_flops, config.model.compute_dtype),
                                       jax.device_count())
