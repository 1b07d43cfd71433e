"""Launch a sweep's shares as SkyPilot managed jobs: ``python -m sweeps.launch sky``.

    python -m sweeps.launch sky SWEEP_FILE --workdir gs://BUCKET/sweeps --accelerator v5litepod-8 \\
        --shares 4 [--infra gcp/REGION] [--spot] [--dry-run] [--missing]
    python -m sweeps.launch sky SWEEP_FILE --workdir gs://BUCKET/sweeps --status | --logs JOB | --cancel

A sweep split into N shares is N managed jobs, ``<sweep>-<i>-of-<N>``, each
running ``python -m sweeps.launch run SWEEP_FILE --workdir ... --shard i/N`` on
its own slice or node (disjoint shares, balanced by cost, as ``--shard``
always splits). The jobs are built from the task files ``tpu/sweep.sky.yaml``
(a TPU accelerator: ``v5litepod-8``, ``tpu-v6e-8``, ``v4-32``, ...) and
``gpu/sweep.sky.yaml`` (anything else: ``H100:8``, ``L4:4``), with SkyPilot's
own parser; this module only fills in their ``envs`` and ``resources``.

Where: every job is pinned to the bucket's region (``--infra gcp/REGION``,
else the bucket's location as Cloud Storage reports it; a multi-region
bucket needs ``--infra``), with the recovery strategy ``FAILOVER``, which
relaunches in the region the job ran in; SkyPilot's default
(``EAGER_NEXT_REGION``) would move a recovered job to another region, away
from its checkpoints and token cache. What: every host installs with the
lock file ``constraints.txt`` (``sweeps/cloud/lockfile.py``), so shares started at
different times run the same jax, libtpu and orbax.

Submitting is idempotent: the jobs of a sweep are recorded in
``<workdir>/<sweep>/jobs.json`` (``sweeps/cloud/jobs.py``), a share whose job
is still live in SkyPilot's queue is never submitted again, and
``--missing`` resubmits the shares whose job ended with runs unfinished.
``--status``, ``--logs`` and ``--cancel`` act on the recorded jobs only, by
job id.

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
tests: they parse the tasks with SkyPilot and replace its client calls
(``sky.jobs.launch``, ``queue_v2``, ``cancel``, ``tail_logs``) at the SDK boundary.
"""

from __future__ import annotations

import dataclasses

from sweeps.cloud import jobs as jobs_record
from sweeps.cloud import regions
from sweeps.cloud.tasks import (build_task, check_shares, describe, first_line, import_sky, plan, resolve_infra,
                                selected_runs)


def preflight_line(workdir: str, sweep_name: str, runs: list) -> str:
    """Whether the hosts will find the preflight's estimates and choices with the sweep in the bucket (they
    never see the submitting machine's cache): ``estimate_store.Kept.describe``'s line, or why it is unknown."""
    from scaling.store.storage import check_access
    from sweeps.preflight import estimate_store

    try:
        check_access(workdir)  # one line in seconds where the bucket cannot be read from here
        kept = estimate_store.load(workdir, sweep_name, None)
    except (OSError, ValueError) as error:
        return f"note: the hosts' preflight estimates not looked for ({first_line(error)})"
    return kept.describe(runs)


def cmd_sky(sweep, args) -> int:
    """Submit the sweep's shares not already live (``--dry-run``: print them); or ``--status``/``--logs``/``--cancel``."""
    if args.status or args.logs is not None or args.cancel:
        return jobs_record.act(sweep, args)
    accelerator, jobs = plan(sweep.name, args)
    runs = selected_runs(sweep, args.only)
    note = None if args.check else check_shares(args.shares, accelerator, jobs[0].envs["MODE"], len(runs))
    import_sky()  # before asking the bucket for its region: without SkyPilot, say what to install
    notes = []  # what could not be checked, printed after the jobs
    infra = resolve_infra(args.infra, args.workdir, notes)  # last: it may ask Cloud Storage
    offered = regions.check_offered(accelerator.name.split(":")[0], infra)  # ValueError where it is not
    notes += ([offered] if offered.startswith("note:") else []) + [preflight_line(args.workdir, sweep.name, runs)]
    jobs = [dataclasses.replace(job, resources={**job.resources, "infra": infra}) for job in jobs]
    tasks = [build_task(job) for job in jobs]
    if note:
        print(note)
    if args.dry_run:
        for job, task in zip(jobs, tasks):
            print(describe(job, task, accelerator))
        print("\n".join(notes + [""]), end="")
        print(f"dry run: nothing submitted; without --dry-run this submits, with sky.jobs.launch, those of these "
              f"{len(jobs)} task(s) whose share has no live job in {jobs_record.jobs_path(args.workdir, sweep.name)}")
        return 0
    print("\n".join(notes + [""]), end="")
    return jobs_record.submit(sweep, args, accelerator, jobs, tasks, runs)
