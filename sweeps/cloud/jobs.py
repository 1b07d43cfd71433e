"""The managed jobs of a sweep, recorded in its work directory: submit each share once, then watch them.

``<workdir>/<sweep>/jobs.json`` lists every job ``sweeps.launch sky`` has
submitted for the sweep: name, SkyPilot's job id, share, accelerator and the
envs its task got. It lives in the bucket beside the runs, so whoever
submits next (another machine, a colleague) sees it too.

- Submitting asks SkyPilot's queue about the recorded job ids
  (``sky.jobs.queue_v2``) and skips every share whose job is still live
  (not SUCCEEDED, FAILED*, or CANCELLED): running the same command twice
  submits nothing new. Shares never submitted (a submission that stopped
  part way) are submitted. A share whose job ended is resubmitted only with
  ``--missing``, and only if runs of the share are unfinished in the bucket.
- ``--status``, ``--logs`` and ``--cancel`` act on the recorded job ids only:
  SkyPilot resolves a job *name* among running jobs alone (``sky jobs logs
  -n`` fails once a job ended, and refuses duplicated names), and
  ``sky jobs cancel -a`` would cancel every job of the user.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time

from sweeps import spec as spec_lib
from sweeps.cloud.tasks import (Accelerator, CloudError, Job, first_line, import_sky, job_runs, parse_accelerator,
                                selected_runs, work)
from sweeps.state import TO_TRAIN, counts_line, read_states, text_table

JOBS_FILE = "jobs.json"


@dataclasses.dataclass(frozen=True)
class Submitted:
    """One submitted managed job, as recorded in ``jobs.json``."""

    name: str
    job_id: int
    share: int
    shares: int
    accelerator: str
    envs: dict
    submitted_at: float

    def as_job(self) -> tuple[Accelerator, Job]:
        """The accelerator and ``cloud.Job`` it was submitted as (envs only; no task file or resources)."""
        return parse_accelerator(self.accelerator), Job(self.name, self.share, self.shares, None, self.envs, {})


def jobs_path(workdir: str, sweep_name: str):
    """``<workdir>/<sweep>/jobs.json`` as an ``epath.Path`` (local or ``gs://``)."""
    from etils import epath

    return epath.Path(workdir) / sweep_name / JOBS_FILE


def read_jobs(path) -> list[Submitted]:
    """The recorded jobs, oldest first ([] if none were recorded); ``CloudError`` for an unreadable file."""
    if not path.exists():
        return []
    try:
        return [Submitted(**entry) for entry in json.loads(path.read_text())["jobs"]]
    except (ValueError, KeyError, TypeError) as error:
        raise CloudError(f"{path}: not a jobs record ({error}); move it aside to submit afresh") from None


def write_jobs(path, jobs: list[Submitted]) -> None:
    """Replace the record with ``jobs`` in one write."""
    from scaling.store.storage import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"jobs": [dataclasses.asdict(job) for job in jobs]}, indent=2))


# The queue entry of every recorded job while SkyPilot's jobs controller is stopped: ended.
CONTROLLER_STOPPED = {"status": None, "recovery_count": 0}


def controller_stopped(error: Exception) -> bool:
    """True for SkyPilot's ``ClusterNotUpError``: its jobs controller is not up.

    The controller stops itself after some idle minutes with no job in
    progress (10 in SkyPilot 0.14), and ``queue_v2(refresh=False)`` then
    raises this error ("No in-progress managed jobs.") instead of answering:
    every job it managed has ended.
    """
    try:
        from sky.exceptions import ClusterNotUpError
    except ImportError:
        return False
    return isinstance(error, ClusterNotUpError)


def sky_records(sky, job_ids: list[int]) -> dict:
    """SkyPilot's queue entries (``ManagedJobRecord``) of ``job_ids``, by job id; absent ids are not in its queue.

    With the jobs controller stopped, every id maps to ``CONTROLLER_STOPPED``
    (ended, not live), and a note says so: asking with ``refresh=True`` would
    start the controller (a VM, minutes) only to learn that nothing runs.
    """
    if not job_ids:
        return {}
    try:
        records, *_ = sky.get(sky.jobs.queue_v2(refresh=False, all_users=True, job_ids=sorted(set(job_ids))))
    except Exception as error:  # noqa: BLE001 - no API server, no controller, no credentials: one line
        if controller_stopped(error):
            print("SkyPilot's jobs controller is stopped (it stops itself when no job is in progress): "
                  "no recorded job is live")
            return {job_id: CONTROLLER_STOPPED for job_id in job_ids}
        raise CloudError(f"sky.jobs.queue_v2: {first_line(error)}") from None
    found = {}
    for record in records:  # one entry per task; the jobs here have one task each
        found.setdefault(record["job_id"], record)
    return found


def is_live(record) -> bool:
    """True while SkyPilot still manages the job (PENDING ... RECOVERING, CANCELLING); False once it ended."""
    return record is not None and record["status"] is not None and not record["status"].is_terminal()


def status_text(record) -> str:
    if record is None:
        return "not in SkyPilot's queue"
    if record is CONTROLLER_STOPPED:
        return "(jobs controller stopped)"
    status = record["status"].value if record["status"] is not None else "?"
    recoveries = record["recovery_count"] or 0
    return status + (f" ({recoveries} recoveries)" if recoveries else "")


def runs_of(job: Submitted, sweep_file: str) -> list:
    """The runs ``job`` trains: the sweep file expanded with the job's own ``--set``/``--only`` (its ARGS)."""
    words = shlex.split(job.envs.get("ARGS", ""))
    overrides = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--set"]
    only = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--only"]
    sweep = spec_lib.with_overrides(spec_lib.load_sweep(sweep_file), overrides)
    accelerator, as_job = job.as_job()
    return job_runs(as_job, accelerator, selected_runs(sweep, only))


def unfinished(runs: list, workdir: str) -> list:
    """The runs a launcher would still train (pending, resumable, unreadable, failed)."""
    return [state.spec for state in read_states(runs, workdir) if state.status in TO_TRAIN]


def submit(sweep, args, accelerator: Accelerator, jobs: list[Job], tasks: list, runs: list) -> int:
    """Submit the jobs whose share has no live recorded job; record each one as soon as SkyPilot accepts it."""
    from scaling.store.storage import check_access

    sky = import_sky()
    check_access(args.workdir)  # the record goes there: fail before submitting anything
    path = jobs_path(args.workdir, sweep.name)
    recorded = read_jobs(path)
    queue = sky_records(sky, [job.job_id for job in recorded])
    live = [job for job in recorded if is_live(queue.get(job.job_id))]
    clash = [old for old in live if work(old.envs) == work(jobs[0].envs) and old.shares != jobs[0].count]
    if clash:
        raise CloudError(f"{path}: live jobs of this sweep were submitted as {clash[0].shares} shares "
                         f"({', '.join(f'{old.name} #{old.job_id}' for old in clash)}); their runs overlap "
                         f"--shares {jobs[0].count}: use --shares {clash[0].shares}, or --cancel them first")
    submitted = []
    for job, task in zip(jobs, tasks):
        same = [old for old in recorded
                if work(old.envs) == work(job.envs) and (old.share, old.shares) == (job.index, job.count)]
        if any(old in live for old in same):
            old = next(old for old in reversed(same) if old in live)
            print(f"{job.name}: skipped, managed job {old.job_id} is {status_text(queue[old.job_id])}")
            continue
        if same:
            old = same[-1]
            if not args.missing:
                print(f"{job.name}: skipped, managed job {old.job_id} ended {status_text(queue.get(old.job_id))}; "
                      "--missing resubmits it if runs of its share are unfinished")
                continue
            left = unfinished(job_runs(job, accelerator, runs), args.workdir)
            if not left:
                print(f"{job.name}: skipped, every run of its share is done (managed job {old.job_id} "
                      f"{status_text(queue.get(old.job_id))})")
                continue
            print(f"{job.name}: managed job {old.job_id} ended {status_text(queue.get(old.job_id))} with "
                  f"{len(left)} run(s) unfinished: {', '.join(run.name for run in left)}")
        print(f"submitting {job.name} (share {job.index}/{job.count}) ...", flush=True)
        try:
            job_ids, _ = sky.stream_and_get(sky.jobs.launch(task, name=job.name))
        except Exception as error:  # noqa: BLE001 - SkyPilot's errors are of many types; report one line
            done = f"; submitted before it: {', '.join(submitted)}" if submitted else ""
            raise CloudError(f"sky.jobs.launch {job.name}: {first_line(error)}{done}") from None
        if not job_ids:
            raise CloudError(f"sky.jobs.launch {job.name}: SkyPilot returned no job id")
        recorded.append(Submitted(job.name, int(job_ids[0]), job.index, job.count, args.accelerator, job.envs,
                                  time.time()))
        write_jobs(path, recorded)
        submitted.append(job.name)
        print(f"{job.name}: managed job {job_ids[0]}", flush=True)
    print(f"{len(submitted)} job(s) submitted, recorded in {path}" if submitted else
          f"nothing submitted: every share has a job (recorded in {path})")
    print(f"watch: python -m sweeps.launch sky {args.sweep_file} --workdir {args.workdir} --status")
    return 0


def _choose(recorded: list[Submitted], which: str) -> Submitted:
    """The newest recorded job matching ``which``: a share index, a job name, a job id, or ``check``."""
    for job in reversed(recorded):
        if which in (job.name, str(job.job_id)) or (which == "check" and job.envs.get("CHECK") == "1"):
            return job
    for job in reversed(recorded):
        if which == str(job.share) and job.envs.get("CHECK") != "1":
            return job
    names = ", ".join(f"{job.name} (#{job.job_id})" for job in recorded)
    raise CloudError(f"--logs {which}: no recorded job matches; recorded: {names}")


def act(sweep, args) -> int:
    """``--status``, ``--logs JOB`` or ``--cancel`` on the jobs recorded for the sweep in the work directory."""
    path = jobs_path(args.workdir, sweep.name)
    recorded = read_jobs(path)
    if not recorded:
        print(f"no jobs recorded in {path}: nothing submitted for sweep {sweep.name} with this --workdir")
        return 0 if args.status else 1
    sky = import_sky()
    if args.logs is not None:
        job = _choose(recorded, args.logs)
        print(f"{job.name}: managed job {job.job_id}", flush=True)
        # refresh: a stopped jobs controller is started again to read the log (SkyPilot says so as it does).
        code = sky.jobs.tail_logs(job_id=job.job_id, follow=True, refresh=True)
        return 0 if code is None else int(code)
    queue = sky_records(sky, [job.job_id for job in recorded])
    if args.cancel:
        live = [job for job in recorded if is_live(queue.get(job.job_id))]
        if not live:
            print(f"no live job among the {len(recorded)} recorded in {path}")
            return 0
        try:
            sky.get(sky.jobs.cancel(job_ids=[job.job_id for job in live]))
        except Exception as error:  # noqa: BLE001 - one line
            raise CloudError(f"sky.jobs.cancel: {first_line(error)}") from None
        print(f"cancelled {len(live)} job(s): {', '.join(f'{job.name} #{job.job_id}' for job in live)}")
        return 0
    rows, all_runs = [], {}
    for job in recorded:
        runs = runs_of(job, args.sweep_file)
        states = read_states(runs, args.workdir)
        all_runs.update((state.spec.run_id, state) for state in states)
        rows.append([job.name, job.job_id, "check" if job.envs.get("CHECK") == "1" else f"{job.share}/{job.shares}",
                     job.accelerator, status_text(queue.get(job.job_id)),
                     counts_line(states) + (f" (of {len(states)})" if states else "")])
    print(text_table(["job", "id", "share", "accelerator", "SkyPilot", "runs in the bucket"], rows))
    print(f"sweep {sweep.name}, all recorded jobs' runs: {counts_line(list(all_runs.values()))}; jobs: {path}")
    return 0
