"""The SkyPilot tasks of a sweep's shares: which accelerator, which jobs, their envs, region and recovery.

``plan`` turns ``sweeps.launch sky``'s flags into one ``Job`` per share,
``build_task`` parses its task file (``tpu/sweep.sky.yaml`` or
``gpu/sweep.sky.yaml``) with SkyPilot's own parser and fills in the job's
``envs`` and ``resources``, ``resolve_infra`` pins it to the bucket's region,
and ``describe`` is what ``--dry-run`` prints. The command itself:
``sweeps/cloud/command.py``; the record of submitted jobs:
``sweeps/cloud/jobs.py``.
"""

from __future__ import annotations

import dataclasses
import json
import netrc
import os
import re
import shlex
from pathlib import Path

from scaling.store.storage import is_remote
from sweeps import hosts
from sweeps import spec as spec_lib
from sweeps.cloud import lockfile, regions

REPO = Path(__file__).resolve().parents[2]
HOST_PYTHON = "~/scaling-venv/bin/python"  # the hosts' Python: the venv the task files' setup makes
TASK_FILES = {"tpu": REPO / "tpu" / "sweep.sky.yaml", "gpu": REPO / "gpu" / "sweep.sky.yaml"}
INSTALL_HINT = 'needs SkyPilot: pip install -e ".[cloud]", then `sky check` to set up cloud access'
# TPU VM software per family, as `gcloud compute tpus tpu-vm create --version`; SkyPilot's own default
# gives every v5 type v5p's runtime.
TPU_RUNTIMES = {"v5litepod": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
DEFAULT_TPU_RUNTIME = "tpu-ubuntu2204-base"  # v2, v3, v4
# Hosts of a v5e or v6e slice up to this many chips: one (v5litepod-8 is one host of 8 chips).
_ONE_HOST_CHIPS = 8
_TPU_PATTERN = re.compile(r"(?:tpu-)?(v\d+[a-z]*)-(\d+)")
# SkyPilot's job_recovery strategy: relaunch in the region the job ran in (the default, EAGER_NEXT_REGION,
# tears the slice down and tries every other allowed region first).
RECOVERY_STRATEGY = "FAILOVER"
WANDB_SECRET = "WANDB_API_KEY"  # passed to the hosts as a SkyPilot secret when the submitter has a key


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
        mode = envs["MODE"]
        if mode == "pod-wide":
            return [shlex.join(base + ["--pod-wide"] + extra)]
        mesh = ["--set", "mesh.data=-1"] if mode == "mesh" and envs["CHECK"] != "1" else []
        prefix = "CUDA_VISIBLE_DEVICES={part} " if accelerator.kind == "gpu" and mode != "mesh" else ""
        return [prefix.format(part=part) + shlex.join(base + ["--shard", f"{index}/{count}"] + mesh + extra)
                for part, (index, count) in enumerate(self.shards(accelerator))]

    def shards(self, accelerator: Accelerator) -> list[tuple[int, int]]:
        """The ``--shard`` (index, count) of each of the job's launchers: its share split among its hosts or
        GPUs, or the share itself for one launcher (mesh)."""
        share, shares = int(self.envs["SHARD"]), int(self.envs["SHARES"])
        parts = launchers_per_job(accelerator, self.envs["MODE"])
        return [(share * parts + part, shares * parts) for part in range(parts)]


def work(envs: dict) -> tuple:
    """What a job with ``envs`` trains apart from its share: two live jobs with the same work and share are one
    too many (a ``Job``'s or a recorded ``jobs.Submitted``'s envs)."""
    return tuple(envs.get(key, "") for key in ("SWEEP", "ARGS", "CACHE", "CHECK"))


def gpu_count(name: str) -> int:
    """GPUs per node in a SkyPilot accelerator spec: ``H100:8`` -> 8, ``L4`` -> 1."""
    return int(name.split(":")[1]) if ":" in name else 1


def job_stem(sweep_name: str, prefix: str | None = None) -> str:
    """``paper`` of ``paper-1-of-4``: lower case, letters, digits and dashes (SkyPilot names clusters after jobs)."""
    return re.sub(r"[^a-z0-9-]+", "-", (prefix or sweep_name).lower()).strip("-") or "sweep"


def plan(sweep_name: str, args) -> tuple[Accelerator, list[Job]]:
    """The jobs ``sky`` submits for ``args`` (its options: ``sweeps/launch_parser.py``); ``CloudError`` for
    unusable flags.

    Their ``infra`` is ``--infra`` as given (else the task file's ``gcp``);
    ``cmd_sky`` then pins it to the bucket's region (``resolve_infra``).
    """
    if not args.accelerator:
        raise CloudError("--accelerator: required to submit, e.g. v5litepod-8 or H100:8")
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
    if not (REPO / "pyproject.toml").exists():  # a `pip install .` copy: no task files, lock or sweep files
        raise CloudError(f"{REPO}: an installed copy of the project, not its repository; sky needs a clone (git "
                         "clone, then pip install -e .), whose working tree SkyPilot copies to the hosts")
    if not lockfile.LOCK_FILE.exists():
        raise CloudError(f"{lockfile.LOCK_FILE}: missing; the hosts install with it (python -m sweeps.lockfile)")
    mode = "pod-wide" if args.pod_wide else ("host-parallel" if accelerator.kind == "tpu" else args.gpu_mode)
    recovery = ({"max_restarts_on_errors": 0, "recover_on_exit_codes": []} if args.check else
                {"max_restarts_on_errors": args.max_restarts, "recover_on_exit_codes": [75]})
    recovery = {"strategy": RECOVERY_STRATEGY, **recovery}
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
                "CHECK": "1" if args.check else "0", "LOCK": lockfile.LOCK_FILE.relative_to(REPO).as_posix()}
        stem = job_stem(sweep_name, args.name)
        name = f"{stem}-check" if args.check else f"{stem}-{index}-of-{args.shares}"
        jobs.append(Job(name, index, args.shares, TASK_FILES[accelerator.kind], envs, resources))
    return accelerator, jobs


def launchers_per_job(accelerator: Accelerator, mode: str) -> int:
    """``sweeps.launch run`` processes one job starts: one per host or GPU, one for pod-wide or mesh."""
    if mode in ("pod-wide", "mesh"):
        return 1
    return accelerator.hosts if accelerator.kind == "tpu" else gpu_count(accelerator.name)


def check_shares(shares: int, accelerator: Accelerator, mode: str, run_count: int) -> str | None:
    """``CloudError`` if ``shares`` jobs start more launchers than there are runs and fewer shares would do;
    with one share that is still too wide, a note to print (its idle hosts or GPUs), else None."""
    per_job = launchers_per_job(accelerator, mode)
    launchers = shares * per_job
    if launchers <= run_count:
        return None
    unit = "host" if accelerator.kind == "tpu" else "GPU"
    idle = f"{launchers - run_count} would idle on billed {unit}s"
    narrower = "--pod-wide or a smaller slice" if accelerator.kind == "tpu" else "--gpu-mode mesh or fewer GPUs"
    what = f"{shares} job(s) × {per_job} launcher(s) (one per {unit}) = {launchers}"
    if shares > 1:
        fits = run_count // per_job
        hint = f"--shares {fits}" if fits >= 1 else f"--shares 1 with {narrower}"
        raise CloudError(f"--shares {shares}: {what} launchers, but the sweep has only {run_count} runs ({idle}); "
                         f"use {hint}")
    return f"note: {what} launchers for {run_count} runs: {idle}; {narrower} would use them"


def job_runs(job: Job, accelerator: Accelerator, runs: list) -> list:
    """The runs ``job``'s launchers train, out of ``runs`` (the sweep after ``--only``), as its ``run`` splits them."""
    if job.envs["CHECK"] == "1":
        return []
    if job.envs["MODE"] == "pod-wide":
        return list(runs)
    mine = {run.run_id for index, count in job.shards(accelerator) for run in spec_lib.shard(runs, index, count)}
    return [run for run in runs if run.run_id in mine]


def bucket_location(workdir: str) -> tuple[str, str]:
    """(location, location type) of a ``gs://`` work directory's bucket, as Cloud Storage reports them,
    e.g. ("US-WEST4", "region") or ("US", "multi-region"). Needs credentials that may read the bucket."""
    from google.cloud import storage as gcs

    from scaling.store.storage import check_access

    check_access(workdir)  # a one-line StorageAccessError instead of a minute of client retries
    bucket = gcs.Client().get_bucket(workdir[len("gs://"):].split("/", 1)[0])
    return bucket.location or "", (bucket.location_type or "").lower()


def resolve_infra(infra: str | None, workdir: str, notes: list | None = None) -> str:
    """``gcp/<region>[/<zone>]`` for the jobs: ``infra`` if it names a region, else the bucket's region.

    The work directory is a ``gs://`` bucket, so the cloud is GCP; the region
    must be the bucket's, or checkpoints and the token cache are read across
    regions (slower, and billed as egress). ``CloudError`` when the region
    cannot be had: another cloud, a multi-region bucket, or a bucket that
    cannot be read here (say ``--infra gcp/REGION`` then).
    """
    parts = [part for part in (infra or "").strip().strip("/").split("/") if part]
    if parts and parts[0].lower() != "gcp":
        raise CloudError(f"--infra {infra}: the work directory is a gs:// bucket, so the jobs run on GCP "
                         "(--infra gcp/REGION, the bucket's region)")
    if len(parts) >= 2:
        try:
            location, kind = bucket_location(workdir)
        except Exception as error:  # noqa: BLE001 - no credentials here, say: the named region is taken as is
            (notes if notes is not None else []).append(
                f"note: --infra {infra} not compared with {workdir}'s region ({first_line(error)})")
        else:
            regions.check_infra_region(parts[1], location, kind, workdir)
        return "/".join(["gcp", *parts[1:]])
    example = "--infra gcp/REGION with the bucket's region (e.g. gcp/us-west4)"
    try:
        location, kind = bucket_location(workdir)
    except Exception as error:  # noqa: BLE001 - no credentials, no network, no such bucket: one line
        raise CloudError(f"{example}: could not read the location of {workdir}'s bucket ({first_line(error)}); "
                         "restarts must stay in the bucket's region") from None
    if kind != "region":
        raise CloudError(f"{example}: {workdir}'s bucket is {kind or 'of unknown type'} {location}; name one "
                         "region in it, where the slices will run")
    return f"gcp/{location.lower()}"


def first_line(error: Exception) -> str:
    """The first line of ``error``'s message (its type's name if it has none): SkyPilot's can run to pages."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def import_sky():
    """SkyPilot's ``sky`` package, or ``CloudError`` saying what to install."""
    try:
        import sky
    except ImportError:
        raise CloudError(INSTALL_HINT) from None
    return sky


def wandb_key(environ=None) -> str | None:
    """The wandb API key of whoever submits: ``$WANDB_API_KEY``, else the one ``wandb login`` wrote to
    ``~/.netrc`` (machine api.wandb.ai); None without one."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY"):
        return environ["WANDB_API_KEY"]
    try:
        found = netrc.netrc(os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".netrc"))
        login = found.authenticators("api.wandb.ai")
    except (OSError, netrc.NetrcParseError):
        return None
    return login[2] if login and login[2] else None


def build_task(job: Job, environ=None):
    """``job`` as a ``sky.Task``: its task file parsed by SkyPilot, with the job's envs and resources, and the
    submitter's wandb key (``wandb_key``) as a SkyPilot secret: the hosts' wandb runs are then online, and the
    key is kept out of the job's envs, logs and dashboard (without one they are offline and kept in the bucket,
    ``scaling.run.track.finish_wandb_run``)."""
    sky = import_sky()
    import yaml  # a dependency of SkyPilot

    config = yaml.safe_load(job.task_file.read_text())
    config["name"] = job.name
    config["workdir"] = str(REPO)  # the file's `workdir: .` means the directory sky runs in
    config["resources"] = {**config.get("resources", {}), **job.resources}
    key = wandb_key(environ)
    return sky.Task.from_yaml_config(config, env_overrides=list(job.envs.items()),
                                     secrets_overrides=[(WANDB_SECRET, key)] if key else None)


def describe(job: Job, task, accelerator: Accelerator) -> str:
    """What ``--dry-run`` prints for one job: name, task file, where and how it recovers, the lock file,
    resources, envs and launcher command(s)."""
    resources = task.to_yaml_config()["resources"]
    (parsed,) = task.resources
    recovery = parsed.job_recovery or {}
    hosts_note = (f", {accelerator.hosts} hosts" if accelerator.kind == "tpu" and accelerator.hosts > 1 else "")
    lines = [f"job {job.name}: share {job.index}/{job.count}, task {job.task_file.relative_to(REPO)}{hosts_note}",
             f"  region: {parsed.region or 'any (not pinned)'} (infra {resources.get('infra')}); recovery: "
             f"{recovery.get('strategy') or 'EAGER_NEXT_REGION (default)'}, exit codes "
             f"{recovery.get('recover_on_exit_codes')} always, {recovery.get('max_restarts_on_errors')} restart(s) "
             "on errors",
             f"  lock: {lockfile.summary(REPO / task.envs['LOCK'])}",
             f"  resources: {json.dumps(resources, sort_keys=True)}",
             f"  envs: {shlex.join(f'{k}={v}' for k, v in job.envs.items())}",
             "  wandb: " + ("online (your WANDB_API_KEY, as a SkyPilot secret)" if WANDB_SECRET in task.secrets else
                            "offline (no WANDB_API_KEY here): each run's kept in the bucket, <run>/wandb/, for "
                            "wandb sync")]
    where = {"tpu": "host", "gpu": "GPU"}[accelerator.kind]
    commands = job.launcher_commands(accelerator)
    for number, command in enumerate(commands):
        label = f"{where} {number}: " if len(commands) > 1 else ""
        lines.append(f"  run: {label}{command.replace('python -m ', f'{HOST_PYTHON} -m ', 1)}")
    return "\n".join(lines)


def selected_runs(sweep, only: list[str]) -> list:
    """The sweep's runs after ``--only`` (every job applies the same filter before sharing out)."""
    return spec_lib.select(sweep.expand().runs, only)
