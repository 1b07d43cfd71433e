"""Launch a sweep's shares as SkyPilot managed jobs: ``python -m sweeps.launch sky``.

    python -m sweeps.launch sky SWEEP_FILE --workdir gs://BUCKET/sweeps --accelerator v5litepod-8 \\
        --shares 4 [--spot] [--dry-run]

A sweep split into N shares is N managed jobs, ``<sweep>-<i>-of-<N>``, each
running ``python -m sweeps.launch run SWEEP_FILE --workdir ... --shard i/N`` on
its own slice or node (disjoint shares, balanced by cost, as ``--shard``
always splits). The jobs are built from the task files ``tpu/sweep.sky.yaml``
(a TPU accelerator: ``v5litepod-8``, ``tpu-v6e-8``, ``v4-32``, ...) and
``gpu/sweep.sky.yaml`` (anything else: ``H100:8``, ``L4:4``), with SkyPilot's
own parser; this module only fills in their ``envs`` and ``resources``.

What SkyPilot does from here (its controller runs in the cloud, so nothing
needs to stay on on your machine): provision (queueing for capacity and
failing over between zones), copy this working tree to every host, run
``setup`` and ``run`` on every host, re-create a preempted slice and run them
again, restart a job whose launcher exited 75 (SIGTERM, checkpoint saved) or,
up to ``--max-restarts`` times, with an error, and delete the slice when its
job ends. What the project does: resume every run from its checkpoints in the
bucket, never train a run twice at once (run leases), and count the sweep's
runs: ``python -m sweeps.launch status SWEEP_FILE --workdir gs://...``.

On a multi-host TPU slice (``v5litepod-16``: 4 hosts) every host trains its
own part of the job's share on its own chips: host r of H gets
``--shard (i·H + r)/(N·H)`` (``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_NODES``).
``--pod-wide`` instead makes the hosts train every run together (one job).
On a GPU node, ``--gpu-mode per-gpu`` (default) starts one launcher per GPU
with a part of the share each; ``mesh`` one launcher over all of the GPUs.

SkyPilot is the optional extra ``cloud`` (``pip install -e ".[cloud]"``); it is
imported only here. Not run against a real cloud from this repository's
tests: they parse the tasks with SkyPilot and stop before submitting.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
import shlex
from pathlib import Path

from scaling.storage import is_remote
from sweeps import hosts

REPO = Path(__file__).resolve().parents[1]
TASK_FILES = {"tpu": REPO / "tpu" / "sweep.sky.yaml", "gpu": REPO / "gpu" / "sweep.sky.yaml"}
INSTALL_HINT = 'needs SkyPilot: pip install -e ".[cloud]", then `sky check` to set up cloud access'
# TPU VM software per family, as `gcloud compute tpus tpu-vm create --version`; SkyPilot's own default
# gives every v5 type v5p's runtime.
TPU_RUNTIMES = {"v5litepod": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
DEFAULT_TPU_RUNTIME = "tpu-ubuntu2204-base"  # v2, v3, v4
# Hosts of a v5e or v6e slice up to this many chips: one (v5litepod-8 is one host of 8 chips).
_ONE_HOST_CHIPS = 8
_TPU_PATTERN = re.compile(r"(?:tpu-)?(v\d+[a-z]*)-(\d+)")


class CloudError(ValueError):
    """Unusable input to ``sweeps.launch sky``; printed as one line, exit status 2."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """What to rent: ``kind`` tpu or gpu, ``name`` as SkyPilot spells it, ``hosts`` per slice or node."""

    kind: str
    name: str
    hosts: int = 1
    runtime: str | None = None


def parse_accelerator(text: str, runtime: str | None = None) -> Accelerator:
    """``v5litepod-8`` or ``tpu-v5litepod-8`` -> a TPU slice; anything else (``H100:8``) -> a GPU node."""
    match = _TPU_PATTERN.fullmatch(text.strip())
    if not match:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(:\d+)?", text.strip()):
            raise CloudError(f"--accelerator {text!r}: expected a TPU type like v5litepod-8 or a GPU like H100:8")
        return Accelerator("gpu", text.strip())
    family, number = match.group(1), int(match.group(2))
    chips = number // 2 if family in hosts._CORE_COUNTED else number
    one_host = chips <= (hosts.TPU_CHIPS_PER_HOST if family in hosts._CORE_COUNTED else _ONE_HOST_CHIPS)
    count = 1 if one_host else max(1, chips // hosts.TPU_CHIPS_PER_HOST)
    return Accelerator("tpu", f"tpu-{family}-{number}", count,
                       runtime or TPU_RUNTIMES.get(family, DEFAULT_TPU_RUNTIME))


@dataclasses.dataclass(frozen=True)
class Job:
    """One managed job: share ``index`` of ``count``, the task file and what this module sets in it."""

    name: str
    index: int
    count: int
    task_file: Path
    envs: dict
    resources: dict

    def launcher_commands(self, accelerator: Accelerator) -> list[str]:
        """The ``sweeps.launch run`` command(s) the task's ``run`` starts: one per host, or per GPU.

        Mirrors the ``run`` scripts of the task files (a test runs those with
        bash and compares).
        """
        envs = self.envs
        base = ["python", "-m", "sweeps.launch", "run", envs["SWEEP"], "--workdir", envs["WORKDIR"]]
        extra = (["--set", f"data.cache_dir={envs['CACHE']}"] if envs["CACHE"] else []) + shlex.split(envs["ARGS"])
        if envs["CHECK"] == "1":
            base, extra = ["python", "-m", "sweeps.launch", "hosts", "--check"], []
        mode, share, shares = envs["MODE"], int(envs["SHARD"]), int(envs["SHARES"])
        if mode == "pod-wide":
            return [shlex.join(base + ["--pod-wide"] + extra)]
        if mode == "mesh":
            mesh = [] if envs["CHECK"] == "1" else ["--set", "mesh.data=-1"]
            return [shlex.join(base + ["--shard", f"{share}/{shares}"] + mesh + extra)]
        parts = accelerator.hosts if accelerator.kind == "tpu" else gpu_count(accelerator.name)
        prefix = "" if accelerator.kind == "tpu" else "CUDA_VISIBLE_DEVICES={part} "
        return [prefix.format(part=part) + shlex.join(base + ["--shard", f"{share * parts + part}/{shares * parts}"]
                                                      + extra) for part in range(parts)]


def gpu_count(name: str) -> int:
    """GPUs per node in a SkyPilot accelerator spec: ``H100:8`` -> 8, ``L4`` -> 1."""
    return int(name.split(":")[1]) if ":" in name else 1


def job_stem(sweep_name: str, prefix: str | None = None) -> str:
    """``paper`` of ``paper-1-of-4``: lower case, letters, digits and dashes (SkyPilot names clusters after jobs)."""
    return re.sub(r"[^a-z0-9-]+", "-", (prefix or sweep_name).lower()).strip("-") or "sweep"


def plan(sweep_name: str, args) -> tuple[Accelerator, list[Job]]:
    """The jobs ``sky`` submits for ``args`` (see ``add_parser``); ``CloudError`` for unusable flags."""
    accelerator = parse_accelerator(args.accelerator, args.runtime_version)
    if not is_remote(args.workdir):
        raise CloudError(f"--workdir {args.workdir}: must be a bucket (gs://...); a slice's disks are deleted "
                         "with it, and each host sees only its own")
    if args.shares < 1:
        raise CloudError(f"--shares {args.shares}: must be at least 1")
    if args.pod_wide and (accelerator.kind != "tpu" or args.shares != 1):
        raise CloudError("--pod-wide trains every run on all hosts of one TPU slice: it takes a TPU accelerator "
                         "and --shares 1")
    if args.gpu_mode != "per-gpu" and accelerator.kind != "gpu":
        raise CloudError("--gpu-mode is for GPU accelerators (e.g. H100:8)")
    mode = "pod-wide" if args.pod_wide else ("host-parallel" if accelerator.kind == "tpu" else args.gpu_mode)
    recovery = ({"max_restarts_on_errors": 0, "recover_on_exit_codes": []} if args.check else
                {"max_restarts_on_errors": args.max_restarts, "recover_on_exit_codes": [75]})
    resources = {"accelerators": accelerator.name, "use_spot": args.spot, "job_recovery": recovery}
    if accelerator.runtime:
        resources["accelerator_args"] = {"runtime_version": accelerator.runtime}
    if args.infra:
        resources["infra"] = args.infra
    sweep_args = [word for glob in args.only for word in ("--only", glob)]
    sweep_args += [word for assignment in args.overrides for word in ("--set", assignment)]
    sweep_file = Path(args.sweep_file).resolve()
    try:  # the hosts run it from their copy of this working tree
        sweep_file = sweep_file.relative_to(REPO).as_posix()
    except ValueError:
        raise CloudError(f"{args.sweep_file}: the sweep file must be inside the repository ({REPO}), whose "
                         "working tree SkyPilot copies to the hosts") from None
    jobs = []
    for index in range(1 if args.check else args.shares):  # the check: one slice like the others, share 0
        envs = {"SWEEP": sweep_file, "WORKDIR": args.workdir, "CACHE": args.cache_dir or "", "SHARD": str(index),
                "SHARES": str(args.shares), "MODE": mode, "ARGS": shlex.join(sweep_args),
                "CHECK": "1" if args.check else "0"}
        stem = job_stem(sweep_name, args.name)
        name = f"{stem}-check" if args.check else f"{stem}-{index}-of-{args.shares}"
        jobs.append(Job(name, index, args.shares, TASK_FILES[accelerator.kind], envs, resources))
    return accelerator, jobs


def import_sky():
    """SkyPilot's ``sky`` package, or ``CloudError`` saying what to install."""
    try:
        import sky
    except ImportError:
        raise CloudError(INSTALL_HINT) from None
    return sky


def build_task(job: Job):
    """``job`` as a ``sky.Task``: its task file parsed by SkyPilot, with the job's envs and resources."""
    sky = import_sky()
    import yaml  # a dependency of SkyPilot

    config = yaml.safe_load(job.task_file.read_text())
    config["name"] = job.name
    config["workdir"] = str(REPO)  # the file's `workdir: .` means the directory sky runs in
    config["resources"] = {**config.get("resources", {}), **job.resources}
    return sky.Task.from_yaml_config(config, env_overrides=list(job.envs.items()))


def describe(job: Job, task, accelerator: Accelerator) -> str:
    """What ``--dry-run`` prints for one job: name, task file, resources, envs and launcher command(s)."""
    resources = task.to_yaml_config()["resources"]
    hosts_note = (f", {accelerator.hosts} hosts" if accelerator.kind == "tpu" and accelerator.hosts > 1 else "")
    lines = [f"job {job.name}: share {job.index}/{job.count}, task {job.task_file.relative_to(REPO)}{hosts_note}",
             f"  resources: {json.dumps(resources, sort_keys=True)}",
             f"  envs: {shlex.join(f'{k}={v}' for k, v in job.envs.items())}"]
    where = {"tpu": "host", "gpu": "GPU"}[accelerator.kind]
    commands = job.launcher_commands(accelerator)
    for number, command in enumerate(commands):
        label = f"{where} {number}: " if len(commands) > 1 else ""
        lines.append(f"  run: {label}{command}")
    return "\n".join(lines)


def cmd_sky(sweep, args) -> int:
    """Build every share's task with SkyPilot; print them (``--dry-run``) or submit them as managed jobs."""
    accelerator, jobs = plan(sweep.name, args)
    runs, _ = sweep.expand()
    if args.only:  # every job applies the same filter before sharing out; refuse one that keeps nothing
        runs = [run for run in runs if any(fnmatch.fnmatchcase(run.name, glob) for glob in args.only)]
        if not runs:
            raise CloudError(f"--only {' '.join(args.only)}: matches none of the sweep's run names "
                             "(see `python -m sweeps.launch list`)")
    if args.shares > len(runs):
        raise CloudError(f"--shares {args.shares}: the sweep has only {len(runs)} runs")
    tasks = [build_task(job) for job in jobs]
    if args.dry_run:
        for job, task in zip(jobs, tasks):
            print(describe(job, task, accelerator))
        print(f"dry run: nothing submitted; without --dry-run this submits these {len(jobs)} task(s) with "
              "sky.jobs.launch")
        return 0
    sky = import_sky()
    submitted = []
    for job, task in zip(jobs, tasks):
        print(f"submitting {job.name} (share {job.index}/{job.count}) ...", flush=True)
        try:
            job_ids, _ = sky.stream_and_get(sky.jobs.launch(task, name=job.name))
        except Exception as error:  # noqa: BLE001 - SkyPilot's errors are of many types; report one line
            done = f"; submitted before it: {', '.join(submitted)}" if submitted else ""
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CloudError(f"sky.jobs.launch {job.name}: {first}{done}") from None
        submitted.append(job.name)
        print(f"{job.name}: managed job {', '.join(map(str, job_ids or []))}", flush=True)
    print(f"watch: sky jobs queue; sky jobs logs JOB_ID; python -m sweeps.launch status {args.sweep_file} "
          f"--workdir {args.workdir}")
    return 0


SKY_DESCRIPTION = (
    "Launch the sweep's shares as SkyPilot managed jobs on TPU slices or GPU nodes: --shares N gives N jobs, "
    "each training its share (run --shard i/N) on its own slice or node. SkyPilot provisions, copies this "
    "working tree, re-creates a preempted slice and restarts the job, which resumes from the checkpoints "
    "in the bucket; follow the runs with the status command. --dry-run prints each job's task and submits "
    "nothing. SkyPilot is the optional extra cloud: pip install -e \".[cloud]\".")


def add_parser(commands) -> None:
    """The ``sky`` subcommand of ``python -m sweeps.launch``."""
    help_text = "launch the shares as SkyPilot managed jobs (needs .[cloud])"
    sub = commands.add_parser("sky", help=help_text, description=SKY_DESCRIPTION)
    sub.set_defaults(function=cmd_sky)
    sub.add_argument("sweep_file", metavar="SWEEP_FILE",
                     help="the sweep: a Python file defining sweep(), inside this repository")
    sub.add_argument("--workdir", required=True,
                     help="root of the run directories, a bucket the hosts write to, e.g. gs://my-bucket/sweeps")
    sub.add_argument("--only", action="append", default=[], metavar="GLOB",
                     help="only runs whose name matches this shell pattern (repeatable), passed to every job")
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a base-config field, e.g. steps=100 (repeatable), passed to every job")
    sub.add_argument("--accelerator", required=True,
                     help="a TPU slice (v5litepod-8, v6e-8, v4-32, ...) or a GPU node as SkyPilot writes it "
                          "(H100:8, L4:4)")
    sub.add_argument("--shares", type=int, default=1,
                     help="split the sweep into this many managed jobs, one slice or node each (default 1)")
    sub.add_argument("--spot", action="store_true",
                     help="spot capacity: a fraction of the price; SkyPilot re-creates a preempted slice")
    sub.add_argument("--dry-run", action="store_true",
                     help="print each job's task (resources, envs, run command with its --shard) and submit nothing")
    sub.add_argument("--pod-wide", action="store_true",
                     help="one job on a multi-host TPU slice whose hosts train every run together")
    sub.add_argument("--gpu-mode", choices=("per-gpu", "mesh"), default="per-gpu",
                     help="GPU nodes: one launcher per GPU (default) or one mesh over all of them")
    sub.add_argument("--cache-dir", help="token cache in the bucket (built by the data command's cache "
                                         "--cache-dir); sets data.cache_dir")
    sub.add_argument("--infra", help="where SkyPilot may look, e.g. gcp/us-west4 (near the bucket: no egress)")
    sub.add_argument("--runtime-version", help="TPU VM software version (default by family, e.g. "
                                               "v2-alpha-tpuv5-lite for v5litepod)")
    sub.add_argument("--max-restarts", type=int, default=2,
                     help="restarts of a job whose launcher exits with an error (default 2); preemptions and "
                          "exit 75 are always recovered")
    sub.add_argument("--name", help="job name prefix (default: the sweep's name)")
    sub.add_argument("--check", action="store_true",
                     help="first minutes on a new slice type: one job, <name>-check, that runs the hosts "
                          "--check command on every host (as its share 0 would train) instead of the sweep; "
                          "read it with: sky jobs logs")

