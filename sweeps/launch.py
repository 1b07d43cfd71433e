"""Launch, inspect and resume a sweep.

    python -m sweeps.launch list      SWEEP_FILE --workdir DIR [--shard I/N] [--pack K] [--json]
    python -m sweeps.launch dry-run   SWEEP_FILE --workdir DIR [--shard I/N] [--pack K] [--pod-wide]
           [--device KIND] [--prices FILE] [--json]
    python -m sweeps.launch run       SWEEP_FILE --workdir DIR [--shard I/N] [--pack K] [--pod-wide]
    python -m sweeps.launch status    SWEEP_FILE --workdir DIR [--shard I/N] [--pack K] [--json]
    python -m sweeps.launch preflight SWEEP_FILE --topology v5e:4x4 [--pod-wide] [--jobs N] [--remat-search]
           [--compile-cache DIR|off] [--prices FILE] [--json]
    python -m sweeps.launch hosts     [--pod-wide] [--shard I/N] [--check] [--json]
    python -m sweeps.launch sky       SWEEP_FILE --workdir gs://... --accelerator TYPE [--shares N] [--spot] [--dry-run]

Every command takes ``--set key=value`` (repeatable), applied to the sweep's
base config before the grid is expanded, e.g. ``--set steps=100``, and
``--only GLOB`` (repeatable) to keep only the runs whose names match.

Runs live in ``<workdir>/<sweep name>/<run_id>/``. A run's status comes from
its directory: ``finished``, ``diverged`` or ``failed`` (its result.json),
``resumable`` (checkpoints but no result yet) or ``pending``. ``run`` trains
pending, resumable and failed runs, cheapest first, in this process
(``sweeps/run_loop.py``), and skips finished and diverged ones (a diverged
run would diverge again). A failed or diverged run is recorded and the sweep
goes on; the summary at the end gives counts, the results table and what the
analysis can say so far. Exit status: 0, or 1 if a run of this share failed,
or 75 (``scaling.run.stopping.PREEMPTED_EXIT_CODE``) after SIGTERM or Ctrl-C,
with a checkpoint saved; rerunning the same command resumes. A run that
another live launcher holds (its lease) is waited for, and taken over once
the lease goes stale; with ``--when-busy exit`` the launcher exits 75 naming
it instead (``sweeps/busy.py``). So 0 means every run of the share is done.
The command line itself is built in ``sweeps/launch_parser.py``.

Packs: with ``--pack K`` (or the sweep file's ``pack``) above 1, ``run``
trains up to K runs of one shape together as one program, grouped by
``sweeps/packing.py``; ``list``, ``status`` and ``dry-run`` then show the
pack each run to train would join (a ``pack`` column, and ``pack`` in every
run's JSON, null for runs with nothing to train). With 1 nothing changes.

Using many hosts (``sweeps.hosts`` decides, and lists where it reads what;
``hosts --json`` shows the decision):
- ``--shard I/N`` trains share I of N (disjoint, balanced by rough cost).
- Host-parallel (default on a multi-host TPU slice or a SLURM job): each host
  trains the share given by its index in the job on its own devices, without
  ``jax.distributed``: on TPU as a one-host slice of its own 4 chips, under
  SLURM with its own slice of the node's GPUs. The SkyPilot task
  ``tpu/sweep.sky.yaml`` passes ``--shard I/N`` explicitly, from SkyPilot's
  host rank. (Tested with a stub metadata server; not run on hardware.)
- ``--pod-wide``: ``jax.distributed`` spans every host (always initialised on
  TPU, coordinator on worker 0) and all hosts train every run together, in
  the order process 0 decides; only process 0 prints. SIGTERM on any host
  stops every host at the same step (or after the same run). A run that
  fails on only some hosts leaves the others waiting in a collective.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below need them: a missing package is one line, not a traceback
    from sweeps.piece.packages import exit_if_missing

    exit_if_missing("python -m sweeps.launch")

import collections
import json
import os
import sys

from scaling import cli, hardware
from scaling.store.storage import StorageAccessError, check_access, is_remote, write_atomic
from sweeps import busy as busy_lib
from sweeps import hosts, packing, tracking
from sweeps import spec as spec_lib
from sweeps.cloud import command as cloud_command
from sweeps.launch_parser import build_parser
from sweeps.preflight_plan import kept_estimates, planned_runs, preflight_estimates
from sweeps.spec import RunSpec, Sweep
from sweeps.state import (TO_TRAIN, RunState, agree_on_runs, agreed_start_steps, counts, counts_line, foreign_note,
                          read_states, run_table, skipped_lines, summary, text_table, unreadable_lines)

class LauncherError(ValueError):
    """Bad input to the launcher; printed as one line, exit status 2."""


# ---------------------------------------------------------------------------
# This process's runs


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
    runs = spec_lib.select(runs, getattr(args, "only", None))
    selected = f"{len(runs)} of {total} runs (--only)" if len(runs) != total else f"{total} runs"
    if share is None:
        return runs, selected if len(runs) != total else f"all {total} runs"
    mine = spec_lib.shard(runs, *share)
    source = "--shard" if args.shard is not None else "this host"
    return mine, f"share {share[0]}/{share[1]} ({source}): {len(mine)} of {selected}"


def _read_share(sweep: Sweep, args, allow_env: bool):
    """(all runs, skipped budgets, which share, the states of this process's runs) for list, status, dry-run."""
    runs, skipped = sweep.expand()
    mine, which = _my_runs(runs, _my_share(args, allow_env), args)
    return runs, skipped, which, read_states(mine, args.workdir)


# ---------------------------------------------------------------------------
# Reading commands: list, dry-run, status


def pack_size(sweep: Sweep, args) -> int:
    """The most runs per pack: ``--pack``, else the sweep file's ``pack``."""
    return sweep.pack if getattr(args, "pack", None) is None else args.pack


def cheapest_first(states: list[RunState]) -> list[RunState]:
    """The states of the runs to train, in the order ``run`` trains them: cheapest first (FLOPs, then run id)."""
    return sorted((s for s in states if s.status in TO_TRAIN), key=lambda s: (s.spec.flops, s.spec.run_id))


def plan_from_states(states: list[RunState], pack: int) -> list[packing.Pack]:
    """The packs ``run`` would train the runs of ``states`` in, each run starting from its newest checkpoint."""
    todo = cheapest_first(states)
    start = {s.spec.run_id: s.checkpoint_step or 0 for s in todo}
    return packing.plan_packs([s.spec for s in todo], pack, lambda run: start[run.run_id])


def _shown_packs(plan: list[packing.Pack], pack: int) -> dict[str, str] | None:
    """Run id -> pack label for tables: None (no ``pack`` column, the tables as they were) at pack size 1."""
    return packing.labels(plan) if pack > 1 else None


def _with_packs(rows: list[dict], states: list[RunState], plan: list[packing.Pack]) -> list[dict]:
    """JSON rows of ``states`` with each run's pack label (None for a run with nothing to train)."""
    labels = packing.labels(plan)
    return [{**row, "pack": labels.get(state.spec.run_id)} for row, state in zip(rows, states)]


def cmd_list(sweep: Sweep, args) -> int:
    runs, skipped, which, states = _read_share(sweep, args, allow_env=False)
    pack = pack_size(sweep, args)
    plan = plan_from_states(states, pack)
    if args.json:
        print(json.dumps({"sweep": sweep.name, "runs": _with_packs([s.to_dict() for s in states], states, plan),
                          "skipped": [s._asdict() for s in skipped]}, indent=2))
        return 0
    print(f"sweep {sweep.name}: {which}; run directories under {os.path.join(str(args.workdir), sweep.name)}")
    print(run_table(states, sweep.multiple_of, _shown_packs(plan, pack)))
    for line in skipped_lines(skipped) + unreadable_lines(states) + foreign_note(sweep, runs, args.workdir):
        print(line)
    return 0


def _throughput(states: list[RunState]) -> float | None:
    """FLOP/s the finished runs reached in wall time (``wall_seconds``: compiling, evaluation and the rest
    included), so that estimates from it are of the time a sweep takes. A packed run's ``wall_seconds`` is
    its whole pack's, so it counts for its share of it (``pack_size``), not once per run."""
    done = [s for s in states if s.status == "finished" and (s.record or {}).get("wall_seconds")]
    seconds = sum(s.record["wall_seconds"] / max(1, int(s.record.get("pack_size") or 1)) for s in done)
    return sum(s.spec.flops for s in done) / seconds if seconds > 0 else None


DRY_RUN_ACTIONS = {"pending": "train", "failed": "retry", "diverged": "skip (diverged)", "finished": "skip",
                   "unreadable": "train again (record unreadable)"}


def _action(state: RunState) -> str:
    return DRY_RUN_ACTIONS.get(state.status, f"resume from step {state.checkpoint_step}")


def cmd_dry_run(sweep: Sweep, args) -> int:
    from sweeps.preflight import prices, sweep_cost

    runs, skipped, which, states = _read_share(sweep, args, allow_env=True)
    todo = [s for s in states if s.status in TO_TRAIN]
    pack = pack_size(sweep, args)
    packs = plan_from_states(states, pack)
    flops, tokens = sum(s.spec.flops for s in todo), sum(s.spec.tokens for s in todo)
    kept = kept_estimates(args.workdir, sweep.name)
    estimates = kept.latest_for([s.spec for s in todo])
    plan = sweep_cost.plan([s.spec for s in todo], sweep, _throughput(read_states(runs, args.workdir)), estimates,
                           sweep_cost.canonical_device(getattr(args, "device", None)),
                           prices.load_prices(getattr(args, "prices", None)))
    fast, slow = plan.device_hours
    if args.json:
        rows = _with_packs([{**s.to_dict(), "action": _action(s), "flops": s.spec.flops} for s in states],
                           states, packs)
        extra = {"device_hours_range": [fast, slow]} if plan.is_range else {}
        print(json.dumps({"sweep": sweep.name, "share": which, "runs": rows, "to_train": len(todo),
                          "tokens": tokens, "flops": flops, "device_hours": slow,
                          "speed_flops_per_second": flops / slow / 3600 if slow else None, **extra,
                          "device": plan.device, "preflight_runs": plan.preflight_runs, "cost": plan.cost,
                          "pack_size": pack, "packs": [p.describe() for p in packs], "preflight_estimates": kept.where,
                          "pieces": pieces_lines(sweep, states, pack),
                          "skipped": [s._asdict() for s in skipped]}, indent=2))
        return 0
    print(f"dry run of sweep {sweep.name}: {which}")
    header = ["name", "L", "d", "N (12·L·d²)", "seed", "status", "action", "tokens", "FLOPs"]
    rows = [[s.spec.name, s.spec.depth, s.spec.width, f"{s.spec.params:.3g}", s.spec.seed, s.status, _action(s),
             f"{s.spec.tokens:.3g}", f"{s.spec.flops:.2g}"] for s in states]
    labels = _shown_packs(packs, pack)
    if labels is not None:  # a pack column after the action
        header.insert(7, "pack")
        for row, state in zip(rows, states):
            row.insert(7, labels.get(state.spec.run_id, "-"))
    print(text_table(header, rows))
    tally = collections.Counter(s.status for s in states)
    print(f"would train {len(todo)} run(s): {tally['pending']} new, {tally['resumable']} resumed, "
          f"{tally['failed']} retried; skip {tally['finished']} finished, {tally['diverged']} diverged")
    if pack > 1:
        print(packing.plan_line(packs, pack))
    print(f"cost: {tokens:.3g} training tokens, ≈{flops:.2g} FLOPs "
          f"(6·(12·L·d² + V·d) + 12·L·T·d per token) ≈ {plan.duration()} at {plan.how}")
    print(plan.price_line)
    for line in pieces_lines(sweep, states, pack):
        print(line)
    print(kept.describe([s.spec for s in states]))
    for line in skipped_lines(skipped) + unreadable_lines(states) + foreign_note(sweep, runs, args.workdir):
        print(line)
    return 0


def pieces_lines(sweep: Sweep, states: list[RunState], pack: int) -> list[str]:
    """A ``PieceSweep``'s plan as pieces (``sweeps.piece.plan``): its runs to train that its ledger does not
    hold, packed, cut into pieces at its assumed speed; then the ledger's state. Nothing for other sweeps."""
    from sweeps.piece import ledger as ledger_lib
    from sweeps.piece import plan as plan_lib
    from sweeps.piece.packages import REPO

    if not isinstance(sweep, plan_lib.PieceSweep):
        return []
    settings = sweep.piece
    ledger = ledger_lib.read(REPO / settings.ledger) if settings.ledger else ledger_lib.empty()
    done = ledger_lib.finished_ids(ledger)
    runs = [state.spec for state in cheapest_first(states) if state.spec.run_id not in done]
    model = plan_lib.SpeedModel(settings, hardware.nominal_peak_flops(sweep.base.peak_flops))
    packs = plan_lib.fitting(packing.plan_packs(runs, pack, lambda run: 0), model, settings.usable_seconds)
    lines = plan_lib.describe(*plan_lib.pieces(packs, model), model)
    if sweep.base.peak_flops == hardware.H200.peak_flops("bfloat16"):
        from sweeps.piece.bound import bound_line

        lines.append("  " + bound_line(runs, hardware.H200, settings.mfu))
    if settings.ledger:
        lines.append(ledger_lib.state_line(ledger, settings.ledger, [state.spec for state in states]))
    return lines




def cmd_status(sweep: Sweep, args) -> int:
    _, skipped, which, states = _read_share(sweep, args, allow_env=False)
    pack = pack_size(sweep, args)
    if args.json:
        print(status_json(sweep, states, skipped, which, args.workdir, pack))
        return 0
    print(summary(sweep, states, args.workdir, _shown_packs(plan_from_states(states, pack), pack)))
    for line in unreadable_lines(states):
        print(line)
    print(kept_estimates(args.workdir, sweep.name).describe([s.spec for s in states]))
    return 0


def status_json(sweep: Sweep, states: list[RunState], skipped, which: str, workdir, pack: int) -> str:
    """The ``status --json`` object: counts per status and one entry per run, with the pack (of at most
    ``pack`` runs) it would train in next (null for runs with nothing to train)."""
    runs = _with_packs([s.to_dict() for s in states], states, plan_from_states(states, pack))
    return json.dumps({"sweep": sweep.name, "workdir": str(workdir), "share": which, "total": len(states),
                       "counts": counts(states), "runs": runs, "skipped": [s._asdict() for s in skipped]}, indent=2)


# ---------------------------------------------------------------------------
# run: train this process's share


def cmd_run(sweep: Sweep, args) -> int:
    """Train this process's share, cheapest run first (``sweeps/run_loop.py``), then print the summary."""
    missing = tracking.wandb_missing(sweep)
    if missing:
        raise LauncherError(missing)
    runs, skipped = sweep.expand()
    share = _start_processes(args)
    mine, which = _my_runs(runs, share, args)
    import jax
    from etils import epath
    from tqdm.auto import tqdm

    from sweeps.run_loop import PREEMPTED_EXIT_CODE, RunLoop

    main_process = jax.process_index() == 0
    out = sys.stderr if args.json else sys.stdout  # with --json, stdout holds only the final JSON
    say = (lambda text: tqdm.write(text, file=out)) if main_process else (lambda *_: None)
    writes_sweep = main_process and (args.pod_wide or share is None or share[0] == 0)  # one writer per sweep
    if writes_sweep:
        _write_sweep_json(sweep, args.workdir)
    todo = _runs_to_train(sweep, runs, skipped, mine, which, args.workdir, say)
    pack = pack_size(sweep, args)
    # The preflight's choice (parallelism="auto": a mesh, or a pack of one run per chip) unless packs are asked
    # for (--pack, the sweep's pack): those keep their meshes.
    kept = kept_estimates(args.workdir, sweep.name)
    if todo:
        say(kept.describe([state.spec for state in todo]))
    specs, modes, sizes = planned_runs(sweep, [state.spec for state in todo], kept) if pack == 1 else (
        [state.spec for state in todo], {}, {})
    loop = RunLoop(args.workdir, say, show_progress=main_process and not args.no_progress, when_busy=args.when_busy,
                   train_arguments=preflight_estimates(kept, modes))  # each record keeps the preflight's estimate
    pack = max([pack, *sizes.values()])
    if pack > 1:
        size_of = (lambda run: sizes.get(run.run_id, 1)) if sizes else None  # the preflight's packs
        packs = packing.plan_packs(specs, pack, agreed_start_steps(todo), size_of)
        say(packing.plan_line(packs, pack))
        code = loop.train_packs(packs, desc=f"sweep {sweep.name}")
    else:
        code = loop.train(specs, desc=f"sweep {sweep.name}")
    if code is not None:
        return code
    all_states = read_states(runs, args.workdir)
    if main_process:
        print(status_json(sweep, all_states, skipped, f"all {len(runs)} runs", args.workdir, pack) if args.json
              else _run_summary(sweep, all_states, mine, args, pack), flush=True)
        if loop.busy:
            say(busy_lib.exit_message([run.name for run in loop.busy]))
        # Only when this launch had runs to train: a no-op rerun of a finished sweep would otherwise add
        # another (offline) wandb run holding the same table each time.
        if todo and writes_sweep:
            tracking.log_sweep(sweep, all_states, epath.Path(args.workdir) / sweep.name)
    mine_ids = {run.run_id for run in mine}
    if loop.failed or any(s.status == "failed" for s in all_states if s.spec.run_id in mine_ids):
        return 1
    return PREEMPTED_EXIT_CODE if loop.busy else 0  # busy: held elsewhere with --when-busy exit; retry later


def _run_summary(sweep: Sweep, states: list[RunState], mine: list, args, pack: int) -> str:
    """The end-of-run summary: of the whole sweep, or of this share's runs only when a share was run
    (``--shard``, ``--only``; ``status`` shows the whole sweep)."""
    ids = {run.run_id for run in mine}
    shown = [state for state in states if state.spec.run_id in ids]
    text = summary(sweep, shown, args.workdir, _shown_packs(plan_from_states(shown, pack), pack))
    if len(shown) == len(states):
        return text
    return (text + f"\nthis share's {len(shown)} of the sweep's {len(states)} runs; the whole sweep: "
            f"{cli.prog('python -m sweeps.launch')} status {args.sweep_file} --workdir {args.workdir}")


def _start_processes(args) -> tuple[int, int] | None:
    """Set this host up as ``sweeps.hosts`` decides, before JAX starts its backend; this process's share."""
    plan = hosts.decide(os.environ, pod_wide=args.pod_wide, shard=args.shard)
    hosts.apply(plan)  # before JAX starts its backend
    hosts.initialize(plan)
    from scaling.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()  # before JAX starts its CPU backend
    return plan.shard if plan.mode == "host-parallel" else None


def _write_sweep_json(sweep: Sweep, workdir) -> None:
    """``<workdir>/<sweep name>/sweep.json``: the sweep's description, beside its runs."""
    from etils import epath

    sweep_dir = epath.Path(workdir) / sweep.name
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(sweep_dir / "sweep.json", json.dumps(sweep.to_dict(), indent=2, sort_keys=True))
    except OSError as error:
        raise LauncherError(f"cannot write to the sweep directory {sweep_dir}: {error}") from None


def _runs_to_train(sweep: Sweep, runs, skipped, mine: list[RunSpec], which: str, workdir, say) -> list[RunState]:
    """This process's runs to train, cheapest first (process 0's list on every process); says how many."""
    import jax

    states = read_states(mine, workdir)
    todo = cheapest_first(states)
    if jax.process_count() > 1:  # hosts may read the work directory differently; process 0's reading counts
        todo = agree_on_runs(sweep, states, todo)
    say(f"sweep {sweep.name}: {which}; {len(todo)} to train, {counts_line(states)}")
    for line in skipped_lines(skipped) + foreign_note(sweep, runs, workdir):
        say(line)
    for state in states:
        if state.status == "unreadable":
            say(f"{state.spec.name}: {state.record['error']}; it will be trained again")
    return todo


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
    from sweeps.preflight import estimate_store

    runs, _ = sweep.expand()
    mine, _ = _my_runs(runs, args.shard, args)
    if args.jobs is not None and args.jobs < 1:
        raise LauncherError(f"--jobs {args.jobs}: allowed an integer >= 1")
    # With --workdir the estimates and choices are kept with the sweep too, where every host reads them.
    options = preflight.Options.from_args(
        args, jobs=args.jobs or preflight.default_jobs(),
        sweep_estimates=None if args.workdir is None else estimate_store.sweep_file(args.workdir, sweep.name))
    return preflight.main(options, mine, deal=spec_lib.shard)


def _resolve_workdir(text: str) -> str:
    """The work directory as an absolute path (URIs unchanged); ``LauncherError`` if it is a file."""
    if is_remote(text):
        return text
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(path) and not os.path.isdir(path):
        raise LauncherError(f"--workdir {text}: is a file, not a directory")
    return path


# The sweep commands; those that read or write the work directory here come first (preflight does not; sky's is
# read by the cluster).
COMMANDS = {"list": cmd_list, "dry-run": cmd_dry_run, "run": cmd_run, "status": cmd_status,
            "preflight": cmd_preflight, "sky": cloud_command.cmd_sky}
STORAGE_COMMANDS = ("list", "dry-run", "run", "status")


def main(argv=None) -> int:
    """Run the CLI; returns the exit status (2 for unusable input)."""
    from scaling.entry import prepare_process

    prepare_process()  # before JAX starts its backend or a storage client
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "hosts":
            return cmd_hosts(args)
        if args.workdir is not None:  # preflight's is optional
            args.workdir = _resolve_workdir(args.workdir)
        if args.command in STORAGE_COMMANDS or (args.command == "preflight" and args.workdir is not None):
            check_access(args.workdir)
        sweep = spec_lib.with_overrides(spec_lib.load_sweep(args.sweep_file), args.overrides)
        code = COMMANDS[args.command](sweep, args)
        if "scaling.store.checkpoints" in sys.modules:  # a run trained here: never wait on an abandoned write
            return sys.modules["scaling.store.checkpoints"].exit_now_if_abandoned(code)
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
