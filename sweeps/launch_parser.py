"""The ``python -m sweeps.launch`` command line: its commands, their arguments and their --help.

Building the parser imports nothing heavy (no JAX), so ``--help`` and bad
arguments answer at once; ``sweeps.launch.main`` runs the command parsed.
"""

from __future__ import annotations

import argparse
import re

from scaling import cli
from sweeps import busy as busy_lib
from sweeps.preflight.options import add_arguments as add_preflight_arguments


def _shard_arg(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise argparse.ArgumentTypeError(f"--shard wants I/N with 0 <= I < N, e.g. 0/4; got {text!r}")
    return int(match.group(1)), int(match.group(2))


def _pack_arg(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--pack wants an integer >= 1 (1 trains every run alone); got {text!r}")
    return int(text)


COMMAND_HELP = {  # the sweep commands, one line each in --help
    "list": "table of the sweep's runs: name, L, d, N = 12·L·d², seed, status",
    "dry-run": "what run would do: runs to train, resume or skip; the cost",
    "run": "train the pending runs (resume interrupted ones), then summarise",
    "status": "counts per status, results table and the analysis so far",
    "preflight": "compile every run for a TPU slice ahead of time (no TPU needed); with --workdir its "
                 "estimates and choices are kept with the sweep (WORKDIR/<sweep>/preflight.json), where run, "
                 "status and dry-run on any machine read them",
}

HOSTS_EPILOG = ("Reads the GCE metadata server on Cloud TPU VMs (GCE_METADATA_IP overrides its address), "
                "TPU_WORKER_HOSTNAMES/TPU_WORKER_ID on GKE, SLURM_* under SLURM, and "
                "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID otherwise; see sweeps/hosts.py.")


# --help is for a user at a terminal: short and plain (the module docstring is for readers of the code).
DESCRIPTION = ("Launch, inspect and resume a sweep: the training runs a sweep file describes, each in "
               "WORKDIR/<sweep name>/<run id>/. Rerunning a command resumes it: finished runs are skipped, "
               "interrupted ones go on from their last checkpoint.")
EPILOG = ("Each sweep command also takes --workdir DIR (local or gs://), --set KEY=VALUE (change the base "
          "config, e.g. steps=100), --only GLOB (runs by name) and --shard I/N (share I of N).\n"
          "Exit status: 0; 1 if a run failed; 2 for bad input; 3 if a package is missing; 75 after Ctrl-C or "
          "SIGTERM (checkpoint saved: rerun to resume).\n"
          "Example: {prog} run sweeps/configs/smoke.py --workdir runs   (then: {prog} COMMAND --help)")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sweeps.launch`` argument parser (imports nothing heavy: no JAX)."""
    prog = cli.prog("python -m sweeps.launch")
    parser = cli.Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG.format(prog=prog),
                        formatter_class=cli.ParagraphHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMAND_HELP.items():
        # A parent parser's actions are shared by reference: one per command, so that a command's own
        # defaults (the preflight's --workdir) never leak into the others'.
        _add_options(commands.add_parser(name, parents=[_sweep_arguments()], help=help_text,
                                         description=help_text), name)
    _add_hosts(commands)
    _add_sky(commands)
    return parser


def _sweep_arguments() -> argparse.ArgumentParser:
    """The arguments every sweep command but ``sky`` takes, as a parent parser."""
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
    return common


def _add_options(sub, command: str) -> None:
    """The options of the sweep command ``command`` besides those every sweep command takes."""
    if command == "run":
        sub.add_argument("--no-progress", action="store_true",
                         help="no progress display (a terminal otherwise shows bars, a log file a line "
                              "every 30 s per run and one per finished run)")
        sub.add_argument("--when-busy", choices=busy_lib.WHEN_BUSY, default="wait",
                         help="a run of the share that another live launcher holds: wait for it to finish "
                              "(taking it over if its lease goes stale; default), or exit 75 naming it so "
                              "that the job is retried later; never exit 0 while it is unfinished")
    if command in ("list", "dry-run", "run", "status"):
        sub.add_argument("--pack", type=_pack_arg, metavar="K",
                         help="train up to K runs of one shape (differing only in seed and learning rate) "
                              "together as one program; runs resuming from different steps never share a "
                              "pack (default: the sweep file's pack, else 1: every run alone)"
                              + ("" if command == "run" else "; shows the pack each run to train would join"))
    if command in ("run", "dry-run"):
        sub.add_argument("--pod-wide", action="store_true",
                         help="all hosts train every run together (jax.distributed); default on a "
                              "multi-host slice or SLURM job: each host trains its own share")
    if command in ("dry-run", "preflight"):
        sub.add_argument("--prices", metavar="FILE",
                         help="US dollars per device-hour from this CSV (header device,on_demand,spot; e.g. "
                              "v5e,1.20,0.24-0.60) or a SkyPilot vms.csv; default: SkyPilot's downloaded "
                              "catalog (~/.sky/catalogs/*/gcp/vms.csv), else the project's table")
    if command == "dry-run":
        sub.add_argument("--device", metavar="KIND",
                         help="the accelerator the sweep trains on, for its peak FLOP/s and price when no "
                              "preflight has run: v4, v5e, v5p, v6e, H100, H200, A100, A100-80GB "
                              "(default: the preflight's TPU, else the device whose peak is peak_flops)")
    if command == "preflight":
        add_preflight_arguments(sub)


def _add_hosts(commands) -> None:
    """The ``hosts`` command: no sweep file, JAX not started."""
    hosts_help = "where this process runs: mode, share, hosts, TPU/GPU variables"
    sub = commands.add_parser("hosts", help=hosts_help,
                              description=hosts_help + " (JAX not started). " + HOSTS_EPILOG)
    sub.add_argument("--pod-wide", action="store_true", help="decide for pod-wide mode (all hosts train every run)")
    sub.add_argument("--shard", type=_shard_arg, metavar="I/N", help="an explicit share, as given to run")
    sub.add_argument("--json", action="store_true",
                     help='print {"mode", "shard": [i, n], "env", "distributed", "cluster"} as JSON')
    sub.add_argument("--check", action="store_true",
                     help="also start JAX as run would and print device_count, process_count and the share; "
                          "exit 1 if they contradict the mode (run it on every worker before the sweep)")


SKY_DESCRIPTION = (
    "Launch the sweep's shares as SkyPilot managed jobs on TPU slices or GPU nodes: --shares N gives N jobs, "
    "each training its share (run --shard i/N) on its own slice or node. SkyPilot provisions, copies this "
    "working tree, re-creates a preempted slice and restarts the job, which resumes from the checkpoints "
    "in the bucket; follow the runs with the status command. --dry-run prints each job's task and submits "
    "nothing. SkyPilot is the optional extra cloud: pip install -e \".[cloud]\".")


def _add_sky(commands) -> None:
    """The ``sky`` command (``sweeps/cloud/command.py``)."""
    help_text = "launch the shares as SkyPilot managed jobs (needs .[cloud])"
    sub = commands.add_parser("sky", help=help_text, description=SKY_DESCRIPTION)
    sub.add_argument("sweep_file", metavar="SWEEP_FILE",
                     help="the sweep: a Python file defining sweep(), inside this repository")
    sub.add_argument("--workdir", required=True,
                     help="root of the run directories, a bucket the hosts write to, e.g. gs://my-bucket/sweeps")
    sub.add_argument("--only", action="append", default=[], metavar="GLOB",
                     help="only runs whose name matches this shell pattern (repeatable), passed to every job")
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a base-config field, e.g. steps=100 (repeatable), passed to every job")
    sub.add_argument("--accelerator",
                     help="required to submit: a TPU slice (v5litepod-8, v6e-8, v4-32, ...) or a GPU node as "
                          "SkyPilot writes it (H100:8, L4:4)")
    sub.add_argument("--shares", type=int, default=1,
                     help="split the sweep into this many managed jobs, one slice or node each (default 1); "
                          "at most one launcher per run (shares × hosts or GPUs)")
    sub.add_argument("--spot", action="store_true",
                     help="spot capacity: a fraction of the price; SkyPilot re-creates a preempted slice")
    sub.add_argument("--dry-run", action="store_true",
                     help="print each job's task (region, recovery, lock file, resources, envs, run command with "
                          "its --shard) and submit nothing")
    sub.add_argument("--pod-wide", action="store_true",
                     help="one job on a multi-host TPU slice whose hosts train every run together")
    sub.add_argument("--gpu-mode", choices=("per-gpu", "mesh"), default="per-gpu",
                     help="GPU nodes: one launcher per GPU (default) or one mesh over all of them")
    sub.add_argument("--cache-dir", help="token cache in the bucket (built by the data command's cache "
                                         "--cache-dir); sets data.cache_dir")
    sub.add_argument("--infra", help="gcp/REGION the jobs run and recover in: the bucket's region (default: read "
                                     "from the bucket; required for a multi-region bucket)")
    sub.add_argument("--runtime-version", help="TPU VM software version (default by family, e.g. "
                                               "v2-alpha-tpuv5-lite for v5litepod)")
    sub.add_argument("--max-restarts", type=int, default=2,
                     help="restarts of a job whose launcher exits with an error (default 2); preemptions and "
                          "exit 75 are always recovered")
    sub.add_argument("--name", help="job name prefix (default: the sweep's name)")
    sub.add_argument("--check", action="store_true",
                     help="first minutes on a new slice type: one job, <name>-check, that runs the hosts --check "
                          "command on every host (as its share 0 would train) instead of the sweep; read it with "
                          "--logs check")
    sub.add_argument("--missing", action="store_true",
                     help="also resubmit the shares whose recorded job ended (succeeded, failed, cancelled) with "
                          "runs of the share unfinished in the bucket")
    acts = sub.add_mutually_exclusive_group()
    acts.add_argument("--status", action="store_true",
                      help="this sweep's recorded jobs: SkyPilot's state beside the bucket's run counts per share")
    acts.add_argument("--logs", metavar="JOB",
                      help="one recorded job's log, by share index, job name, job id, or 'check'; exits with "
                           "SkyPilot's code for the job: 0 SUCCEEDED, 100 FAILED (its other codes: "
                           "sky.exceptions.JobExitCode)")
    acts.add_argument("--cancel", action="store_true", help="cancel this sweep's live recorded jobs (by id)")
