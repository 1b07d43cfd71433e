"""Train one model: sharded jit step, evaluation, checkpoints, exact resume.

Read top to bottom (the optimizer is in ``optim.py``):
1. ``build``: the model, the state's shardings on a mesh, and the jitted
   init / train / eval functions. The init is jitted with output shardings,
   so parameters are created already sharded and never whole on one host.
   ``benchmarks/`` and the TPU preflight compile exactly these functions.
2. ``run``: the run's life cycle. It takes the run's lease, restores the
   newest checkpoint that reads back whole (parameters, optimizer, step; the
   data position and the per-step RNG are pure functions of (seed, step),
   and the wandb id is in the checkpoint's metadata), trains, evaluates,
   checkpoints, and writes the run record (``records.py``).

Guarantees:
- A step whose loss or gradient norm is not finite is not applied, so
  a NaN state never reaches a checkpoint; the run stops as ``diverged``.
- SIGTERM (how TPU preemption arrives) and Ctrl-C (SIGINT) make the loop
  save at the next step boundary, record the run as ``stopped`` and exit
  with ``PREEMPTED_EXIT_CODE``; rerunning resumes there. A second Ctrl-C
  exits at once. A checkpoint write that storage does not finish within
  its deadline fails the run with one line (``checkpoints.py``).

The command line tunes glibc's allocator for XLA:CPU (``tune_cpu_allocator``,
in ``cpu_allocator.py``) before JAX starts; importing this module changes
nothing process-wide. Preemption and lost leases: ``stopping.py``.

Command line: ``python -m scaling.train --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import runpy
import signal
import sys
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath

from scaling import budget, cli, data, lease as lease_lib, mesh as mesh_lib, records, rundir
from scaling.checkpoints import Checkpoints, WriteAbandoned, exit_now_if_abandoned
from scaling.cpu_allocator import reuse_freed_memory, tune_cpu_allocator  # noqa: F401 - used by the CLIs
from scaling.storage import is_remote, write_atomic
from scaling.stopping import PREEMPTED_EXIT_CODE, LeaseLost, Preempted, StopCheck, check_lease
from scaling.optim import learning_rates, make_optimizer, make_schedule  # noqa: F401 - part of the API
from scaling.config import DataConfig, ModelConfig, TrainConfig, config_id, from_dict, override, to_dict
from scaling.flops import model_flops_utilization
from scaling.loss import compute_loss, loss_and_grads
from scaling.model import Transformer
from scaling.track import Tracker, new_wandb_id



PRESETS = {
    # L=2, d=64 on the built-in corpus: ~300 steps in well under 2 minutes on 2 CPU cores.
    "tiny": TrainConfig(
        model=ModelConfig(depth=2, width=64, head_dim=16, max_seq_len=128),
        data=DataConfig(source="builtin", seq_len=128),
        steps=300, batch_size=16, eval_every=100, eval_batches=8, checkpoint_every=50, log_every=10,
        name="tiny"),
}


# ---------------------------------------------------------------------------
# The sharded program


@dataclasses.dataclass
class Program:
    """Everything compiled for one config on one mesh."""

    model: Transformer
    mesh: jax.sharding.Mesh
    state_shardings: dict
    abstract_state: dict  # ShapeDtypeStructs carrying their shardings, for restore and AOT compilation
    init: callable  # rng -> state
    train_step: callable  # (state, batch) -> (state, metrics)
    eval_step: callable  # (params, batch, rng) -> (loss_sum, tokens, correct); correct is 0 without label_ids
    schedules: dict


def batch_spec(config: TrainConfig, mesh) -> dict:
    """ShapeDtypeStructs of one global batch (for ahead-of-time compilation)."""
    sharding = mesh_lib.batch_sharding(mesh)
    shape = (config.batch_size, config.data.seq_len)
    return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding),
            "weights": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
            "input_mask": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)}


def build(config: TrainConfig, mesh, *, mask_id: int | None = None, random_token_limit: int | None = None,
          label_ids: tuple[int, int] | None = None) -> Program:
    """Model, optimizer and jitted, sharded init/train/eval functions for ``config`` on ``mesh``.

    ``mask_id`` turns on on-device BERT masking for the masked objective on
    LM data (pass the data pipeline's mask token id); leave it None for
    causal models and for classification tasks. ``label_ids`` (classification
    tasks: the pipeline's ``LABEL_TOKENS``) reads labels from those two logits only.
    """
    mesh_lib.check_batch(mesh, config.batch_size, process_count=1, microbatches=config.microbatches)
    model = Transformer(config.model)
    tx, schedules = make_optimizer(config.optim, config.model, config.steps)
    sample = jnp.zeros((1, config.data.seq_len), jnp.int32)

    def boxed_state(rng):
        params = model.init(rng, sample)["params"]
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    abstract_boxed = jax.eval_shape(boxed_state, jax.random.PRNGKey(0))
    logical_specs = nn.get_partition_spec(abstract_boxed)
    abstract = nn.unbox(abstract_boxed)
    state_shardings = mesh_lib.tree_shardings(logical_specs, abstract, mesh, config.mesh.rules)
    abstract_state = jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        abstract, state_shardings)
    replicated = mesh_lib.replicated(mesh)
    batch_sharding = mesh_lib.batch_sharding(mesh)

    init = jax.jit(lambda rng: nn.unbox(boxed_state(rng)), out_shardings=state_shardings)
    base_key = jax.random.PRNGKey(config.seed)

    def train_step(state, batch):
        rng = jax.random.fold_in(base_key, state["step"])
        loss, aux, grads = loss_and_grads(model, state["params"], batch, rng=rng, microbatches=config.microbatches,
                                          deterministic=config.model.dropout == 0.0, mask_id=mask_id,
                                          random_token_limit=random_token_limit, label_ids=label_ids)
        grad_norm = optax.global_norm(grads)
        # A finite loss and gradient norm (which bounds every squared gradient
        # entry, so Adam's moments stay finite too) decide whether the step is
        # applied; judging the updated parameters instead would keep a second
        # copy of them alive. A step that fails keeps the old state: the loop
        # then stops as diverged, and the state it may checkpoint is the last good one.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        new_state = {"step": state["step"] + 1,
                     "params": jax.tree_util.tree_map(keep, params, state["params"]),
                     "opt_state": jax.tree_util.tree_map(keep, opt_state, state["opt_state"])}
        metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite,
                   "predicted_tokens": aux["tokens"], "lr": schedules["hidden"](state["step"])}
        return new_state, metrics

    def eval_step(params, batch, rng):
        loss, aux = compute_loss(model, params, batch, rng=rng, deterministic=True, mask_id=mask_id,
                                 random_token_limit=random_token_limit, label_ids=label_ids)
        return loss * aux["tokens"], aux["tokens"], aux.get("correct", jnp.zeros((), jnp.float32))

    def sharded_activations(step):
        # The model's activation constraints take effect while the step is traced.
        @functools.wraps(step)
        def traced(*args):
            with mesh_lib.activation_sharding(mesh, config.mesh.rules):
                return step(*args)
        return traced

    train_jit = jax.jit(sharded_activations(train_step), in_shardings=(state_shardings, batch_sharding),
                        out_shardings=(state_shardings, replicated), donate_argnums=0)
    eval_jit = jax.jit(sharded_activations(eval_step),
                       in_shardings=(state_shardings["params"], batch_sharding, replicated),
                       out_shardings=(replicated, replicated, replicated))
    return Program(model, mesh, state_shardings, abstract_state, init, train_jit, eval_jit, schedules)


def resolve_config(config: TrainConfig, pipeline) -> TrainConfig:
    """Make the model's vocabulary match the tokenizer's."""
    if config.model.vocab_size != pipeline.vocab_size:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=pipeline.vocab_size))
    return config


# ---------------------------------------------------------------------------
# The loop


def evaluate(program: Program, params, batches: list, batch_size: int) -> float:
    """Mean loss in nats per predicted token over fixed validation ``batches``."""
    return evaluate_metrics(program, params, batches, batch_size)["loss"]


def evaluate_metrics(program: Program, params, batches: list, batch_size: int) -> dict:
    """``loss``: mean nats per predicted token; ``accuracy``: fraction of predictions correct
    (meaningful for classification tasks, whose eval step counts correct labels; 0 otherwise)."""
    total, count, correct = 0.0, 0.0, 0.0
    for index, local in enumerate(batches):
        batch = mesh_lib.global_batch(local, program.mesh, batch_size)
        # A fixed key per batch: every run masks the validation set identically.
        loss_sum, tokens, right = program.eval_step(params, batch, jax.random.PRNGKey(10_000 + index))
        total += float(loss_sum)
        count += float(tokens)
        correct += float(right)
    return {"loss": total / max(count, 1.0), "accuracy": correct / max(count, 1.0)}


def run(config: TrainConfig, workdir, *, show_progress: bool = True, devices=None) -> records.RunRecord:
    """Train ``config`` into the run directory ``workdir`` and return its run record.

    ``workdir`` may be relative (to the current directory) or a URI. Resumes
    from the newest readable checkpoint in ``workdir/checkpoints``; returns
    the existing record if the run already finished. Raises
    ``rundir.ConfigMismatch`` if the directory holds another config's run,
    ``lease.RunBusy`` if another live process is training it, ``Preempted``
    after SIGTERM (a checkpoint of the current step is saved first) and
    ``LeaseLost`` if another process took the run over. Any other error is
    recorded as status ``failed`` (traceback in ``error.log``) and re-raised.
    """
    run_dir = rundir.absolute_path(workdir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.check_run_dir(run_dir, config)
    # One process per run: pod-wide jobs (several processes) agree through
    # the launcher instead, since only process 0 could hold a lease.
    run_lease = lease_lib.Lease(run_dir) if jax.process_count() == 1 else None
    if run_lease is not None:
        run_lease.acquire()
    try:
        try:
            previous = records.read_record(run_dir)
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
        if finished:
            return previous
        # Listen for SIGTERM and Ctrl-C from the start: a preemption during data
        # loading or compilation must stop the run too, not only one arriving mid-training.
        stop_requested = {"flag": False, "lease": run_lease}
        with stop_signals(stop_requested):
            return _prepare_and_train(config, run_dir, devices, show_progress, stop_requested)
    finally:
        if run_lease is not None and not run_lease.lost:
            run_lease.release()


@contextlib.contextmanager
def stop_signals(stop_requested: dict):
    """While inside, SIGTERM and SIGINT (Ctrl-C) ask the run to stop: ``stop_requested["flag"]`` is set and
    ``["signal"]`` names the signal; the loop saves a checkpoint and raises ``Preempted``. A second
    Ctrl-C exits the process at once (status 130), saving nothing more. Outside the main thread,
    where Python cannot install handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(number, _frame):
        name = signal.Signals(number).name
        if number == signal.SIGINT and stop_requested["flag"]:
            os.write(2, b"interrupted again: exiting now, without waiting for the checkpoint\n")
            os._exit(130)
        stop_requested["flag"], stop_requested["signal"] = True, name

    previous = {number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _prepare_and_train(config: TrainConfig, run_dir: epath.Path, devices, show_progress: bool,
                       stop_requested: dict) -> records.RunRecord:
    main_process = jax.process_index() == 0
    run_id = config_id(config)  # of the config as given: the same id names the directory
    counts = budget.count_params(config.model)
    record = records.RunRecord(
        run_id=run_id, status="running", depth=config.model.depth, width=config.model.width, seed=config.seed,
        params_non_embedding=budget.non_embedding_params(config.model.depth, config.model.width),
        name=config.name, sweep=config.sweep_name, point_id=config_id(dataclasses.replace(config, seed=0)),
        heads=config.model.heads, params_total=counts["total"], params_embedding=counts["embedding"],
        lr_rule=config.optim.lr_rule, peak_lr=config.optim.peak_lr,
        peak_lr_hidden=learning_rates(config.optim, config.model)["hidden"], code_version=rundir.code_version(),
        tokens_per_step=config.batch_size * config.data.seq_len, planned_steps=config.steps)
    if main_process:
        write_atomic(run_dir / "config.json", json.dumps(to_dict(config), indent=2, sort_keys=True))
    try:
        pipeline = data.build(config.data)
        record = record.replace(data_fingerprint=pipeline.fingerprint)
        resolved = resolve_config(config, pipeline)
        mesh = mesh_lib.make_mesh(resolved.mesh, devices)
        mesh_lib.check_batch(mesh, resolved.batch_size, microbatches=resolved.microbatches)
        return _train(resolved, run_dir, pipeline, mesh, record, show_progress, stop_requested)
    except Preempted as stop:
        if main_process:  # resumable, not failed
            records.write_record(run_dir, record.replace(status="stopped", error=str(stop)))
        raise
    except LeaseLost:
        raise
    except BaseException as error:
        if main_process and not (stop_requested["lease"] is not None and stop_requested["lease"].lost):
            failed = record.replace(status="failed", error=rundir.one_line(error), log_file=rundir.log_failure(run_dir, error))
            records.write_record(run_dir, failed)
        raise


def _train(config: TrainConfig, run_dir: epath.Path, pipeline, mesh, record: records.RunRecord,
           show_progress: bool, stop_requested: dict) -> records.RunRecord:
    started = time.perf_counter()
    main_process = jax.process_index() == 0
    mask_id = pipeline.mask_id if (config.model.objective == "masked" and pipeline.kind == "lm") else None
    label_ids = pipeline.LABEL_TOKENS if pipeline.kind == "classification" else None
    program = build(config, mesh, mask_id=mask_id, random_token_limit=pipeline.vocab_size, label_ids=label_ids)
    checkpoints = Checkpoints(run_dir / "checkpoints", config.keep_checkpoints, program.abstract_state,
                              should_stop=lambda: stop_requested["flag"])
    tracker = None
    try:
        restored = checkpoints.restore_newest()
        for line in checkpoints.skipped:
            print(f"warning: {run_dir.name}: damaged checkpoint passed over, {line}", file=sys.stderr)
        if restored is not None:
            state, meta, start_step = restored
        else:
            state, start_step = program.init(jax.random.PRNGKey(config.seed)), 0
            meta = {"wandb_id": new_wandb_id(), "initial_eval_loss": None, "wall_seconds": 0.0}
        # Rows past the restored step were logged by a segment whose later state is lost; they are redone.
        tracker = Tracker(run_dir, total_steps=config.steps, start_step=start_step, config=to_dict(config),
                          name=config.name or run_dir.name, group=config.sweep_name, project=config.wandb_project,
                          mode=config.wandb_mode, wandb_id=meta["wandb_id"], is_main_process=main_process,
                          show_progress=show_progress, keep_until_step=start_step if restored else None)
        record, state = _loop(config, run_dir, pipeline, program, checkpoints, tracker, state, meta, start_step,
                              record, started, stop_requested)
        checkpoints.finish()
    except BaseException as error:
        if tracker is not None:
            if isinstance(error, LeaseLost):
                tracker.discard_pending()  # the run's files belong to the new holder now
            tracker.close(exit_code=1)
        raise
    finally:
        checkpoints.close()
    try:
        check_lease(stop_requested, read_now=True)
    except LeaseLost:
        tracker.discard_pending()
        tracker.close(exit_code=1)
        raise
    tracker.summary({"final_eval_loss": record.final_eval_loss, "status": record.status})
    tracker.close(exit_code=0 if record.status == "finished" else 1)
    if main_process:
        records.write_record(run_dir, record)
    return record


@contextlib.contextmanager
def stop_if_abandoned(stop_requested: dict):
    """A checkpoint write given up on because a stop arrived while it hung becomes ``Preempted``."""
    try:
        yield
    except WriteAbandoned as error:
        if not error.stopped:
            raise
        raise Preempted(f"stopped by {stop_requested.get('signal', 'SIGTERM')} while waiting for a write that "
                        f"storage did not finish ({error}); resumes from the previous checkpoint") from None


def _loop(config, run_dir, pipeline, program, checkpoints, tracker, state, meta, start_step, record, started,
          stop_requested):
    """Train from ``start_step`` to the end; returns the final record and state."""
    mesh = program.mesh
    validation = pipeline.validation_batches(config.batch_size, config.eval_batches, jax.process_index(),
                                             jax.process_count())
    if meta.get("initial_eval_loss") is None and config.eval_at_start:
        meta["initial_eval_loss"] = evaluate(program, state["params"], validation, config.batch_size)
        tracker.log(start_step, {"eval_loss": meta["initial_eval_loss"]})
    earlier_seconds = float(meta.get("wall_seconds", 0.0))

    def save(step, force=False):
        check_lease(stop_requested, read_now=True)
        tracker.flush(through_step=step)
        meta["wall_seconds"] = earlier_seconds + time.perf_counter() - started
        with stop_if_abandoned(stop_requested):
            checkpoints.save(step, state, meta, force=force)

    stop_check = StopCheck(start_step)
    if stop_check.agree(stop_requested["flag"], start_step):  # SIGTERM while loading or compiling
        tracker.close(exit_code=PREEMPTED_EXIT_CODE)
        raise Preempted(f"stopped by {stop_requested.get('signal', 'SIGTERM')} before training resumed at step "
                        f"{start_step}")

    # Classification rows are padded to their split's longest string, not to seq_len.
    row_length = pipeline.row_length("train") if pipeline.kind == "classification" else config.data.seq_len
    tokens_per_step = config.batch_size * row_length
    # A resume at the last step trains nothing: its training loss is the one logged before.
    pending, status, last_loss, eval_loss = [], "finished", tracker.pending(start_step).get("loss"), None
    window_start, window_steps = time.perf_counter(), 0
    iterator = pipeline.train_iterator(config.seed, start_step, config.batch_size, jax.process_index(),
                                       jax.process_count())
    try:
        for step, local_batch in iterator:
            if step >= config.steps:
                break
            state, metrics = program.train_step(state, mesh_lib.global_batch(local_batch, mesh, config.batch_size))
            pending.append((step, metrics))
            window_steps += 1
            tracker.advance()  # the first call comes after compilation, so the ETA excludes it
            done = step + 1
            boundary = done % config.log_every == 0 or done % config.checkpoint_every == 0 or done == config.steps
            if boundary:
                fetched = jax.device_get([m for _, m in pending])
                if not all(bool(m["finite"]) for m in fetched):
                    status = "diverged"
                    bad = next(s for (s, _), m in zip(pending, fetched) if not bool(m["finite"]))
                    tracker.log(bad + 1, {"loss": None, "diverged": 1.0})
                    break
                elapsed = time.perf_counter() - window_start
                speed = window_steps * tokens_per_step / max(elapsed, 1e-9)
                last_loss = float(fetched[-1]["loss"])
                tracker.log(done, {"loss": last_loss, "grad_norm": float(fetched[-1]["grad_norm"]),
                                   "lr": float(fetched[-1]["lr"]), "tokens_per_second": speed,
                                   "mfu": model_flops_utilization(config.model, row_length, speed, config.peak_flops,
                                                                  jax.device_count()),
                                   "tokens": done * tokens_per_step})
                pending, window_start, window_steps = [], time.perf_counter(), 0
            if config.eval_every and done % config.eval_every == 0 and done != config.steps:
                eval_loss = evaluate(program, state["params"], validation, config.batch_size)
                tracker.log(done, {"eval_loss": eval_loss})
            check_lease(stop_requested)
            saved = done % config.checkpoint_every == 0 and done != config.steps
            if saved:
                save(done)
            if stop_check.due(done) and stop_check.agree(stop_requested["flag"], done):
                if not saved:  # a second save of the same step would fail
                    save(done, force=True)
                with stop_if_abandoned(stop_requested):
                    checkpoints.finish()
                tracker.close(exit_code=PREEMPTED_EXIT_CODE)
                raise Preempted(f"stopped by {stop_requested.get('signal', 'SIGTERM')} after step {done}; "
                                "checkpoint saved")
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()

    steps_done = int(jax.device_get(state["step"]))
    accuracy = {}
    if status == "finished":
        final = evaluate_metrics(program, state["params"], validation, config.batch_size)
        eval_loss = final["loss"]
        if pipeline.kind == "classification":  # the label's cross-entropy in bits, and accuracy
            accuracy = {"final_eval_accuracy": final["accuracy"], "final_eval_bits": eval_loss / math.log(2)}
        tracker.log(steps_done, {"eval_loss": eval_loss, **{k[len("final_"):]: v for k, v in accuracy.items()}})
        check_lease(stop_requested)
        if steps_done not in checkpoints.steps():
            save(steps_done, force=True)
    if status == "finished" and (eval_loss is None or not math.isfinite(eval_loss)):
        status = "diverged"
    record = record.replace(
        status=status, final_eval_loss=eval_loss if status == "finished" else None,
        initial_eval_loss=meta["initial_eval_loss"], final_train_loss=last_loss, steps=steps_done,
        tokens=steps_done * tokens_per_step, tokens_per_step=tokens_per_step,
        wall_seconds=earlier_seconds + time.perf_counter() - started,
        wandb_id=tracker.wandb_id, **(accuracy if status == "finished" else {}))
    return record, state


# ---------------------------------------------------------------------------
# Command line


def load_config(preset_or_file: str) -> TrainConfig:
    """A ``TrainConfig`` from a preset name, a ``config.json`` or a Python file defining ``config()``."""
    if preset_or_file in PRESETS:
        return PRESETS[preset_or_file]
    path = epath.Path(preset_or_file)
    if not path.exists():
        raise ValueError(f"--config {preset_or_file!r}: not a preset ({', '.join(PRESETS)}) and no such file")
    if path.suffix == ".json":
        return from_dict(TrainConfig, json.loads(path.read_text()))
    if path.suffix == ".py":
        namespace = runpy.run_path(str(path))
        if "config" not in namespace:
            raise ValueError(f"--config {preset_or_file}: a Python config file must define config() -> TrainConfig")
        return namespace["config"]()
    raise ValueError(f"--config {preset_or_file}: expected a preset, a .json or a .py file")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog=cli.prog("python -m scaling.train"),
        description="Train one transformer LM into a run directory. Rerunning the same command resumes from the "
                    "latest checkpoint, or does nothing if the run already finished.",
        epilog="Example: python -m scaling.train --config tiny --workdir runs/tiny --set optim.peak_lr=1e-3")
    parser.add_argument("--config", required=True,
                        help=f"a preset ({', '.join(PRESETS)}), a run's config.json, or a .py file defining config()")
    parser.add_argument("--workdir", required=True, help="run directory (local path or gs:// URI)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. model.depth=4 or optim.lr_rule=mup (repeatable)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--coordinator", help="multi-process start-up: coordinator host:port (on a pod, use "
                                              "python -m sweeps.launch run --pod-wide, which finds it)")
    parser.add_argument("--num-processes", type=int, help="with --coordinator: total number of processes")
    parser.add_argument("--process-id", type=int, help="with --coordinator: this process's index")
    args = parser.parse_args(argv)
    try:
        config = override(load_config(args.config), args.overrides)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not is_remote(args.workdir) and os.path.isfile(os.path.expanduser(args.workdir)):
        print(f"error: --workdir {args.workdir}: is a file, not a directory", file=sys.stderr)
        return 2
    tune_cpu_allocator()
    mesh_lib.initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    return exit_now_if_abandoned(_run_command(config, args))


def _run_command(config: TrainConfig, args) -> int:
    try:
        result = run(config, args.workdir, show_progress=not args.no_progress)
    except Preempted as stop:
        print(str(stop), file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    except (rundir.ConfigMismatch, lease_lib.RunBusy, LeaseLost, records.OutdatedRecord) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - the traceback is in the run's error.log
        where = rundir.absolute_path(args.workdir) / "error.log"
        print(f"error: run failed: {rundir.one_line(error)} (traceback in {where})", file=sys.stderr)
        return 1
    if jax.process_index() == 0:
        print(json.dumps({k: getattr(result, k) for k in ("status", "name", "final_eval_loss", "steps", "tokens",
                                                          "wall_seconds")}))
    return 0 if result.status == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
