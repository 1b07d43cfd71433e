"""Launch, inspect and resume a sweep.

    python -m sweeps.launch list      SWEEP_FILE --workdir DIR [--shard I/N] [--json]
    python -m sweeps.launch dry-run   SWEEP_FILE --workdir DIR [--shard I/N] [--pod-wide] [--json]
    python -m sweeps.launch run       SWEEP_FILE --workdir DIR [--shard I/N] [--pod-wide]
    python -m sweeps.launch status    SWEEP_FILE --workdir DIR [--shard I/N] [--json]
    python -m sweeps.launch preflight SWEEP_FILE --topology v5e:4x4 [--pod-wide] [--jobs N] [--remat-search]
           [--compile-cache DIR|off] [--json]
    python -m sweeps.launch hosts     [--pod-wide] [--shard I/N] [--check] [--json]
    python -m sweeps.launch sky       SWEEP_FILE --workdir gs://... --accelerator TYPE [--shares N] [--spot] [--dry-run]

Every command takes ``--set key=value`` (repeatable), applied to the sweep's
base config before the grid is expanded, e.g. ``--set steps=100``, and
``--only GLOB`` (repeatable) to keep only the runs whose names match.

Runs live in ``<workdir>/<sweep name>/<run_id>/``. A run's status comes from
its directory: ``finished``, ``diverged`` or ``failed`` (its result.json),
``resumable`` (checkpoints but no result yet) or ``pending``. ``run`` trains
pending, resumable and failed runs, cheapest first, and skips finished and
diverged ones (a diverged run would diverge again). A failed or diverged run
is recorded and the sweep goes on; the summary at the end gives counts, the
results table and what the analysis can say so far. Exit status: 0, or 1 if
a run of this share failed, or 75 (``scaling.stopping.PREEMPTED_EXIT_CODE``)
after SIGTERM or Ctrl-C, with a checkpoint saved; rerunning the same command
resumes. A run that another live launcher holds (its lease) is waited for,
and taken over once the lease goes stale; with ``--when-busy exit`` the
launcher exits 75 naming it instead (``sweeps/busy.py``). So 0 means every
run of the share is done. A signal stops the sweep whenever it arrives: mid-run at the next
step, at the end of a run (its final evaluation) or between runs before the
next one starts (the launcher and its runs share one ``scaling.stopping.Stop``).

Runs train in this process, one after another, through
``scaling.train.run``. In-process keeps start-up cheap, lets the runs of one
shape (seeds, learning rates) share one compiled step (``scaling.program``),
and lets pod-wide mode start ``jax.distributed`` once for the whole sweep. The price: a hard crash
of the process (host out of memory, a segfault) stops the sweep; rerunning
resumes from the crashed run's last checkpoint.

Using many hosts (``sweeps.hosts`` decides; ``hosts --json`` shows the decision):
- ``--shard I/N`` trains share I of N (disjoint, balanced by rough cost).
- Host-parallel (default on a multi-host TPU slice or a SLURM job): each host
  takes the share given by its index (the GCE metadata server's
  ``agent-worker-number`` of ``worker-network-endpoints`` on a Cloud TPU VM,
  ``TPU_WORKER_ID`` of ``TPU_WORKER_HOSTNAMES`` on GKE, ``SLURM_PROCID`` of
  ``SLURM_NTASKS``) and trains it on its own devices, without
  ``jax.distributed``. The SkyPilot task ``tpu/sweep.sky.yaml`` also passes
  ``--shard I/N`` explicitly, from SkyPilot's host rank.
  On TPU the launcher first makes the host a one-host slice of its own 4
  chips by setting the libtpu topology variables before JAX starts (listed,
  with their sources, in ``sweeps/hosts.py``). Under SLURM with several tasks
  per node, each task keeps its own slice of the node's ``CUDA_VISIBLE_DEVICES``.
  (Tested with a stub metadata server; not run on hardware.)
- ``--pod-wide``: ``jax.distributed`` spans every host (always initialised on
  TPU, coordinator on worker 0) and all hosts train every run together, in
  the order process 0 decides; only process 0 prints. SIGTERM on any host
  stops every host at the same step (or after the same run). A run that
  fails on only some hosts leaves the others waiting in a collective.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fnmatch
import json
import os
import re
import sys

from scaling import cli
from scaling.cli import fmt
from scaling.storage import StorageAccessError, check_access, is_remote, write_atomic
from sweeps import busy as busy_lib
from sweeps import cloud, hosts
from sweeps import spec as spec_lib
from sweeps.spec import RunSpec, Sweep
from sweeps.state import (TO_TRAIN, RunState, counts, counts_line, foreign_note, read_state, read_states,
                          run_table, skipped_lines, summary, text_table, unreadable_lines)

# Assumed utilisation for time estimates when no run of the sweep has finished yet.
GUESSED_UTILISATION = 0.3


class LauncherError(ValueError):
    """Bad input to the launcher; printed as one line, exit status 2."""


# ---------------------------------------------------------------------------
# Commands


def _my_share(args, allow_env: bool) -> tuple[int, int] | None:
    """(index, count) of this process's share: --shard, else the host's place in a multi-host job."""
    if args.shard is not None or not allow_env or getattr(args, "pod_wide", False):
        return args.shard
    plan = hosts.decide(os.environ)
    return plan.shard if plan.mode == "host-parallel" else None


def _my_runs(runs: list[RunSpec], share, args) -> tuple[list[RunSpec], str]:
    """This process's runs and a phrase saying which share they are.

    ``--only`` narrows the sweep before it is shared out, so every host
    applies the same filter and the shares stay disjoint.
    """
    total = len(runs)
    if getattr(args, "only", None):
        runs = [run for run in runs if any(fnmatch.fnmatchcase(run.name, glob) for glob in args.only)]
        if not runs:
            raise LauncherError(f"--only {' '.join(args.only)}: matches none of the {total} run names "
                                "(see `python -m sweeps.launch list`)")
    selected = f"{len(runs)} of {total} runs (--only)" if len(runs) != total else f"{total} runs"
    if share is None:
        return runs, selected if len(runs) != total else f"all {total} runs"
    mine = spec_lib.shard(runs, *share)
    source = "--shard" if args.shard is not None else "this host"
    return mine, f"share {share[0]}/{share[1]} ({source}): {len(mine)} of {selected}"


def cmd_list(sweep: Sweep, args) -> int:
    runs, skipped = sweep.expand()
    mine, which = _my_runs(runs, _my_share(args, allow_env=False), args)
    states = read_states(mine, args.workdir)
    if args.json:
        print(json.dumps({"sweep": sweep.name, "runs": [s.to_dict() for s in states],
                          "skipped": [s._asdict() for s in skipped]}, indent=2))
        return 0
    print(f"sweep {sweep.name}: {which}; run directories under {os.path.join(str(args.workdir), sweep.name)}")
    print(run_table(states, sweep.multiple_of))
    for line in skipped_lines(skipped) + unreadable_lines(states) + foreign_note(sweep, runs, args.workdir):
        print(line)
    return 0


def _throughput(states: list[RunState]) -> float | None:
    """FLOP/s the finished runs reached in wall time (``wall_seconds``: compiling, evaluation and the rest
    included), so that estimates from it are of the time a sweep takes."""
    done = [s for s in states if s.status == "finished" and (s.record or {}).get("wall_seconds")]
    seconds = sum(s.record["wall_seconds"] for s in done)
    return sum(s.spec.flops for s in done) / seconds if seconds > 0 else None


def cmd_dry_run(sweep: Sweep, args) -> int:
    runs, skipped = sweep.expand()
    mine, which = _my_runs(runs, _my_share(args, allow_env=True), args)
    states = read_states(mine, args.workdir)
    actions = {"pending": "train", "failed": "retry", "diverged": "skip (diverged)", "finished": "skip",
               "unreadable": "train again (record unreadable)"}
    todo = [s for s in states if s.status in TO_TRAIN]
    flops = sum(s.spec.flops for s in todo)
    measured = _throughput(read_states(runs, args.workdir))
    base = sweep.base
    # The slow end of the range is the estimate; the sweep's own expected MFU gives a fast end too.
    fast = None
    if measured:
        speed, how = measured, ("the speed this sweep's finished runs reached in wall time (compiling and "
                                "evaluation included)")
    elif sweep.expected_mfu:
        low, high = sweep.expected_mfu
        speed, fast = low * base.peak_flops, high * base.peak_flops
        how = (f"{high:.0%}–{low:.0%} model FLOP utilisation of peak_flops={base.peak_flops:.3g} FLOP/s "
               "(the sweep's expected_mfu); compilation and evaluation add to this")
    else:
        speed, how = (GUESSED_UTILISATION * base.peak_flops,
                      f"{GUESSED_UTILISATION:.0%} of peak_flops={base.peak_flops:.3g} FLOP/s, a guess; compilation "
                      "and evaluation add to this")
    if args.json:
        rows = [{**s.to_dict(), "action": actions.get(s.status, f"resume from step {s.checkpoint_step}"),
                 "flops": s.spec.flops} for s in states]
        extra = {"device_hours_range": [flops / fast / 3600, flops / speed / 3600]} if fast else {}
        print(json.dumps({"sweep": sweep.name, "share": which, "runs": rows, "to_train": len(todo),
                          "tokens": sum(s.spec.tokens for s in todo), "flops": flops,
                          "device_hours": flops / speed / 3600, "speed_flops_per_second": speed, **extra,
                          "skipped": [s._asdict() for s in skipped]}, indent=2))
        return 0
    print(f"dry run of sweep {sweep.name}: {which}")
    header = ["name", "L", "d", "N (12·L·d²)", "seed", "status", "action", "tokens", "FLOPs"]
    rows = [[s.spec.name, s.spec.depth, s.spec.width, f"{s.spec.params:.3g}", s.spec.seed, s.status,
             actions.get(s.status, f"resume from step {s.checkpoint_step}"), f"{s.spec.tokens:.3g}",
             f"{s.spec.flops:.2g}"] for s in states]
    print(text_table(header, rows))
    tally = collections.Counter(s.status for s in states)
    print(f"would train {len(todo)} run(s): {tally['pending']} new, {tally['resumable']} resumed, "
          f"{tally['failed']} retried; skip {tally['finished']} finished, {tally['diverged']} diverged")
    duration = (f"{flops / speed / 3600:.3g} device-hours" if not fast else
                f"{flops / fast / 60:.0f}–{flops / speed / 60:.0f} device-minutes")
    print(f"cost: {sum(s.spec.tokens for s in todo):.3g} training tokens, ≈{flops:.2g} FLOPs "
          f"(6·(12·L·d² + V·d) + 12·L·T·d per token) ≈ {duration} at {how}")
    for line in skipped_lines(skipped) + unreadable_lines(states) + foreign_note(sweep, runs, args.workdir):
        print(line)
    return 0


def cmd_status(sweep: Sweep, args) -> int:
    runs, skipped = sweep.expand()
    mine, which = _my_runs(runs, _my_share(args, allow_env=False), args)
    states = read_states(mine, args.workdir)
    if args.json:
        print(status_json(sweep, states, skipped, which, args.workdir))
        return 0
    print(summary(sweep, states, args.workdir))
    for line in unreadable_lines(states):
        print(line)
    return 0


def status_json(sweep: Sweep, states: list[RunState], skipped, which: str, workdir) -> str:
    """The ``status --json`` object: counts per status and one entry per run."""
    return json.dumps({"sweep": sweep.name, "workdir": str(workdir), "share": which, "total": len(states),
                       "counts": counts(states), "runs": [s.to_dict() for s in states],
                       "skipped": [s._asdict() for s in skipped]}, indent=2)


def _log_sweep_to_wandb(sweep: Sweep, states: list[RunState], sweep_dir) -> None:
    """One wandb run of job_type "sweep" in the sweep's group: the sweep config and the results table.

    Opened only after the training runs are done, because wandb keeps one
    active run per process and the trainer's runs come first.
    """
    from scaling.track import wandb_mode

    mode = wandb_mode(sweep.base.wandb_mode)
    if mode == "disabled":
        return
    import wandb

    local = not is_remote(sweep_dir)
    run = wandb.init(project=sweep.base.wandb_project, group=sweep.name, job_type="sweep", name=f"{sweep.name}-sweep",
                     id=f"sweep-{sweep.digest()}", resume="allow", config=sweep.to_dict(), mode=mode,
                     dir=str(sweep_dir) if local else None, settings=wandb.Settings(silent=True, console="off"))
    columns = ["name", "run_id", "depth", "width", "params", "seed", "peak_lr", "status", "final_eval_loss"]
    table = wandb.Table(columns=columns, data=[[s.to_dict()[c] for c in columns] for s in states])
    run.log({"runs": table, **{f"runs_{status}": n for status, n in counts(states).items()}})
    run.finish()


def cmd_run(sweep: Sweep, args) -> int:
    runs, skipped = sweep.expand()
    plan = hosts.decide(os.environ, pod_wide=args.pod_wide, shard=args.shard)
    hosts.apply(plan)  # before JAX starts its backend
    hosts.initialize(plan)
    share = plan.shard if plan.mode == "host-parallel" else None
    mine, which = _my_runs(runs, share, args)

    from scaling.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()  # before JAX starts its CPU backend
    import jax
    from etils import epath
    from tqdm.auto import tqdm

    from scaling import checkpoints, lease, progress, rundir, train
    from scaling.stopping import PREEMPTED_EXIT_CODE, LeaseLost, Preempted, Stop

    main_process = jax.process_index() == 0
    out = sys.stderr if args.json else sys.stdout  # with --json, stdout holds only the final JSON
    say = (lambda text: tqdm.write(text, file=out)) if main_process else (lambda *_: None)
    first_share = share is None or share[0] == 0
    sweep_dir = epath.Path(args.workdir) / sweep.name
    if main_process and (args.pod_wide or first_share):
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(sweep_dir / "sweep.json", json.dumps(sweep.to_dict(), indent=2, sort_keys=True))
        except OSError as error:
            raise LauncherError(f"cannot write to the sweep directory {sweep_dir}: {error}") from None

    states = read_states(mine, args.workdir)
    todo = sorted((s for s in states if s.status in TO_TRAIN), key=lambda s: (s.spec.flops, s.spec.run_id))
    if jax.process_count() > 1:  # hosts may read the work directory differently; process 0's reading counts
        todo = agree_on_runs(sweep, states, todo)
    say(f"sweep {sweep.name}: {which}; {len(todo)} to train, {counts_line(states)}")
    for line in skipped_lines(skipped) + foreign_note(sweep, runs, args.workdir):
        say(line)
    for state in states:
        if state.status == "unreadable":
            say(f"{state.spec.name}: {state.record['error']}; it will be trained again")

    # One Stop for the whole sweep, handed to every run: a signal that arrives while a run finishes
    # (its final evaluation, its record) or between runs still stops the sweep before the next run.
    stop = Stop()
    show_progress = main_process and not args.no_progress
    # A terminal gets a bar; a log file one line per finished run (scaling/progress.py).
    bar = progress.bar(total=len(todo), desc=f"sweep {sweep.name}", unit="run", interval=0, dynamic_ncols=True,
                       file=sys.stderr, shown=show_progress)
    busy, not_trained = [], []  # not_trained: failed before the trainer could write a record
    # busy: held by another live launcher. Waited for (sweeps/busy.py) unless --when-busy exit, so this
    # launcher never exits 0 while runs of its share are unfinished.
    queue, announced, when_busy = [s.spec for s in todo], set(), getattr(args, "when_busy", "wait")
    with stop.listening(), contextlib.closing(bar):
        while queue:
            busy = []
            for run in queue:
                run_dir, held = run.run_dir(args.workdir), False
                # Finished by another launcher since we looked? (Pod-wide, process 0's list is what counts.)
                if jax.process_count() == 1 and read_state(run, args.workdir).status == "finished":
                    say(f"{run.name}: already finished by another launcher")
                    bar.update(1)
                    continue
                try:
                    result = train.run(run.config, run_dir, show_progress=show_progress, stop=stop,
                                       raise_if_finished=True)
                except train.AlreadyFinished:  # finished by another launcher after the check above
                    say(f"{run.name}: already finished by another launcher")
                except Preempted as stopped:
                    say(f"{run.name}: {stopped}; rerun the same command to resume")
                    return PREEMPTED_EXIT_CODE
                except (lease.RunBusy, LeaseLost) as error:
                    busy.append(run)
                    held = True
                    if run.run_id not in announced:  # once, not at every poll
                        announced.add(run.run_id)
                        what = "skipped, another launcher holds it" if isinstance(error, lease.RunBusy) else "stopped"
                        say(f"{run.name}: {what}: {error}")
                except rundir.ConfigMismatch as error:
                    not_trained.append(run.name)
                    say(f"{run.name}: not trained: {error}")
                except Exception as error:  # noqa: BLE001 - the trainer recorded it; report one line, go on
                    not_trained.append(run.name)
                    if checkpoints.abandoned_writes():  # storage stopped answering: the other runs would hang too
                        say(f"{run.name}: failed: {rundir.one_line(error)}; stopping the sweep")
                        return 1
                    log = run_dir / "error.log"
                    where = f"traceback in {log}" if log.exists() else f"run directory {run_dir}"
                    say(f"{run.name}: failed: {rundir.one_line(error)} ({where})")
                else:
                    say(f"{run.name}: {result.status}, eval loss {fmt(result.final_eval_loss, '.4f')}, "
                        + progress.run_time(result.steps, result.train_seconds, result.wall_seconds))
                if not held:
                    bar.update(1)
                if stop.any_process():  # all stop together, or the others would wait in the next run
                    say(f"stopping after {run.name}: {stop.signal or 'SIGTERM'} received; rerun the same command "
                        "to resume")
                    return PREEMPTED_EXIT_CODE
            queue = []
            if busy and when_busy == "wait":
                say(f"waiting for {len(busy)} run(s) held by another launcher: " + "; ".join(
                    f"{run.name} by {busy_lib.holder_text(run, args.workdir)}" for run in busy))
                done, queue = busy_lib.wait_once(busy, args.workdir, stop, say)
                bar.update(len(done))
                busy = []
                if stop.requested:
                    say(f"stopped while waiting: {stop.signal} received; rerun the same command to resume")
                    return PREEMPTED_EXIT_CODE

    all_states = read_states(runs, args.workdir)
    mine_now = [s for s in all_states if s.spec.run_id in {r.run_id for r in mine}]
    if main_process:
        text = status_json(sweep, all_states, skipped, f"all {len(runs)} runs", args.workdir) if args.json else summary(
            sweep, all_states, args.workdir)
        print(text, flush=True)
        if busy:
            say(busy_lib.exit_message([run.name for run in busy]))
        # Only when this launch had runs to train: a no-op rerun of a finished sweep would otherwise add
        # another (offline) wandb run holding the same table each time.
        if todo and (args.pod_wide or first_share):
            _log_sweep_to_wandb(sweep, all_states, sweep_dir)
    if not_trained or any(s.status == "failed" for s in mine_now):
        return 1
    return PREEMPTED_EXIT_CODE if busy else 0  # busy: held elsewhere with --when-busy exit; retry later


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
        raise LauncherError("the processes expanded different sweeps (sweep file, --set or code differ); "
                            "run the same commit and command on every host")
    position = {state.spec.run_id: i for i, state in enumerate(states)}
    agreed = multihost.broadcast_ints_from_process_0([position[state.spec.run_id] for state in todo])
    return [states[i] for i in agreed]


def cmd_hosts(args) -> int:
    """Print this process's mode, share, environment and jax.distributed settings (``--check``: and start JAX)."""
    plan = hosts.decide(os.environ, pod_wide=args.pod_wide, shard=args.shard)
    if args.check:
        import socket

        facts, problems = hosts.check(plan)
        if args.json:
            print(json.dumps({**plan.to_dict(), "check": facts, "problems": problems}, indent=2, sort_keys=True))
        else:
            print(f"{socket.gethostname()}: mode {plan.mode}, shard {plan.shard[0]}/{plan.shard[1]}, process "
                  f"{facts['process_index']} of {facts['process_count']}, {facts['device_count']} "
                  f"{facts['platform']} devices ({facts['local_device_count']} local)"
                  + "".join(f"\n  PROBLEM: {p}" for p in problems))
        return 1 if problems else 0
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
    else:
        print(plan.describe())
    return 0


def cmd_preflight(sweep: Sweep, args) -> int:
    from sweeps import preflight

    runs, _ = sweep.expand()
    mine, _ = _my_runs(runs, args.shard, args)
    if args.jobs is None:
        args.jobs = preflight.default_jobs()
    elif args.jobs < 1:
        raise LauncherError(f"--jobs {args.jobs}: allowed an integer >= 1")
    return preflight.main(sweep, args, runs=mine)


# ---------------------------------------------------------------------------
# Command line


def _shard_arg(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise argparse.ArgumentTypeError(f"--shard wants I/N with 0 <= I < N, e.g. 0/4; got {text!r}")
    return int(match.group(1)), int(match.group(2))


COMMANDS = {  # one line each in --help
    "list": (cmd_list, "table of the sweep's runs: name, L, d, N = 12·L·d², seed, status"),
    "dry-run": (cmd_dry_run, "what run would do: runs to train, resume or skip; the cost"),
    "run": (cmd_run, "train the pending runs (resume interrupted ones), then summarise"),
    "status": (cmd_status, "counts per status, results table and the analysis so far"),
    "preflight": (cmd_preflight, "compile every run for a TPU slice ahead of time (no TPU needed)"),
}


# The commands that read or write the work directory here (preflight does not; sky's is read by the cluster).
STORAGE_COMMANDS = ("list", "dry-run", "run", "status")

HOSTS_EPILOG = ("Reads the GCE metadata server on Cloud TPU VMs (GCE_METADATA_IP overrides its address), "
                "TPU_WORKER_HOSTNAMES/TPU_WORKER_ID on GKE, SLURM_* under SLURM, and "
                "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID otherwise; see sweeps/hosts.py.")


# --help is for a user at a terminal: short and plain (the module docstring is for readers of the code).
DESCRIPTION = ("Launch, inspect and resume a sweep: the training runs a sweep file describes, each in "
               "WORKDIR/<sweep name>/<run id>/. Rerunning a command resumes it: finished runs are skipped, "
               "interrupted ones go on from their last checkpoint.")
EPILOG = ("Each sweep command also takes --workdir DIR (local or gs://), --set KEY=VALUE (change the base "
          "config, e.g. steps=100), --only GLOB (runs by name) and --shard I/N (share I of N).\n"
          "Exit status: 0; 1 if a run failed; 2 for bad input; 75 after Ctrl-C or SIGTERM (a checkpoint is "
          "saved: rerun the same command to resume).\n"
          "Example: {prog} run sweeps/configs/smoke.py --workdir runs   (then: {prog} COMMAND --help)")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sweeps.launch`` argument parser (imports nothing heavy: no JAX)."""
    prog = cli.prog("python -m sweeps.launch")
    parser = cli.Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG.format(prog=prog),
                        formatter_class=cli.ParagraphHelpFormatter)
    common = cli.Parser(add_help=False)
    common.add_argument("sweep_file", metavar="SWEEP_FILE",
                        help="the sweep: a Python file defining sweep(), e.g. sweeps/configs/smoke.py")
    common.add_argument("--workdir", default="runs",
                        help="root of the run directories, local or gs:// (default: runs); runs go to "
                             "WORKDIR/<sweep name>/<run id>/")
    common.add_argument("--shard", type=_shard_arg, metavar="I/N",
                        help="only share I of N of the runs (disjoint, balanced by cost), e.g. 0/4")
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    common.add_argument("--only", action="append", default=[], metavar="GLOB",
                        help="only runs whose name matches this shell pattern, e.g. 'L6-*-s0' (repeatable: "
                             "any pattern may match); applied before --shard")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a base-config field before expansion, e.g. steps=100 (repeatable)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (function, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(function=function)
        if name == "run":
            sub.add_argument("--no-progress", action="store_true",
                             help="no progress display (a terminal otherwise shows bars, a log file a line "
                                  "every 30 s per run and one per finished run)")
        if name == "run":
            sub.add_argument("--when-busy", choices=busy_lib.WHEN_BUSY, default="wait",
                             help="a run of the share that another live launcher holds: wait for it to finish "
                                  "(taking it over if its lease goes stale; default), or exit 75 naming it so "
                                  "that the job is retried later; never exit 0 while it is unfinished")
        if name in ("run", "dry-run"):
            sub.add_argument("--pod-wide", action="store_true",
                             help="all hosts train every run together (jax.distributed); default on a "
                                  "multi-host slice or SLURM job: each host trains its own share")
        if name == "preflight":
            sub.add_argument("--topology", required=True,
                             help="TPU slice the sweep will run on, e.g. v5e:4x4 (16 chips, 4 hosts); on a "
                                  "multi-host slice each run is checked on one host's 2x2 chips, as run "
                                  "trains it by default")
            sub.add_argument("--pod-wide", action="store_true",
                             help="check each run on the whole slice, as run --pod-wide trains it")
            sub.add_argument("--jobs", type=int, default=None, metavar="N",
                             help="compile the distinct programs in N processes (default: as memory and cores "
                                  "allow, at most 4)")
            sub.add_argument("--remat-search", action="store_true",
                             help="for each run that fits, also compile the cheaper remat policies (none < dots "
                                  "< full) and report the cheapest that fits (up to 2 more compiles a run)")
            sub.add_argument("--compile-cache", default=None, metavar="DIR",
                             help="where the TPU compiler's answers are kept, so a repeated preflight compiles "
                                  "only programs that changed; 'off' compiles everything (default: "
                                  "$SCALING_PREFLIGHT_CACHE, else ~/.cache/scaling/preflight)")
    hosts_help = "where this process runs: mode, share, hosts, TPU/GPU variables"
    sub = commands.add_parser("hosts", help=hosts_help,
                              description=hosts_help + " (JAX not started). " + HOSTS_EPILOG)
    sub.set_defaults(function=cmd_hosts)
    sub.add_argument("--pod-wide", action="store_true", help="decide for pod-wide mode (all hosts train every run)")
    sub.add_argument("--shard", type=_shard_arg, metavar="I/N", help="an explicit share, as given to run")
    sub.add_argument("--json", action="store_true",
                     help='print {"mode", "shard": [i, n], "env", "distributed", "cluster"} as JSON')
    sub.add_argument("--check", action="store_true",
                     help="also start JAX as run would and print device_count, process_count and the share; "
                          "exit 1 if they contradict the mode (run it on every worker before the sweep)")
    cloud.add_parser(commands)
    return parser


def _resolve_workdir(text: str) -> str:
    """The work directory as an absolute path (URIs unchanged); ``LauncherError`` if it is a file."""
    if is_remote(text):
        return text
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(path) and not os.path.isdir(path):
        raise LauncherError(f"--workdir {text}: is a file, not a directory")
    return path


def main(argv=None) -> int:
    """Run the CLI; returns the exit status (2 for unusable input)."""
    from scaling.entry import prepare_process

    prepare_process()  # before JAX starts its backend or a storage client
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "hosts":
            return args.function(args)
        args.workdir = _resolve_workdir(args.workdir)
        if args.command in STORAGE_COMMANDS:
            check_access(args.workdir)
        sweep = spec_lib.with_overrides(spec_lib.load_sweep(args.sweep_file), args.overrides)
        code = args.function(sweep, args)
        if "scaling.checkpoints" in sys.modules:  # a run trained here: never wait on an abandoned write
            return sys.modules["scaling.checkpoints"].exit_now_if_abandoned(code)
        return code
    except (ValueError, StorageAccessError) as error:  # SweepFileError, LauncherError, config validation errors
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `launch list | head`: the reader has gone, so stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
