"""SkyPilot task files and ``python -m sweeps.launch sky`` (sweeps/cloud/).

Three layers, none of which needs cloud credentials or a network:
* the task files, parsed by SkyPilot's own parser (``sky.Task.from_yaml_config``,
  what ``sky jobs launch task.yaml --env ...`` uses), with their resources,
  spot, setup, run and envs checked;
* their ``run`` scripts, executed with bash and SkyPilot's variables and a
  recording ``python``, so the launcher commands a host would start are the
  ones ``--dry-run`` prints;
* the command itself: ``--dry-run`` for a sweep split into 4 shares (region,
  recovery strategy, lock file), the shares checked against runs × hosts or
  GPUs, the region read from the bucket (fake-gcs-server), and submission,
  ``--status``, ``--logs`` and ``--cancel`` at the SDK boundary: SkyPilot's
  client functions (``sky.jobs.launch``, ``queue_v2``, ``cancel``,
  ``tail_logs``, ``sky.get``) replaced by a stand-in controller that answers
  with SkyPilot's own ``ManagedJobRecord`` and ``ManagedJobStatus``, and the
  jobs record in a bucket on the emulator.
A real dry launch (SkyPilot's optimizer) and every real call of those client
functions need an API server, cloud credentials (`sky check`) and SkyPilot's
hosted catalog, so no test makes one.
Tests that need SkyPilot skip without the ``cloud`` extra; CI installs it.
"""

import json
import os
import sys

import pytest
import yaml

import helpers
from helpers import REPO
from sweeps import launch
from sweeps.cloud import jobs as cloud_jobs
from sweeps.cloud import lockfile
from sweeps.cloud import tasks as cloud

SWEEP = "sweeps/configs/smoke.py"  # 6 runs
TPU_TASK, GPU_TASK = cloud.TASK_FILES["tpu"], cloud.TASK_FILES["gpu"]


def sky_flags(*extra, workdir="gs://bucket/sweeps"):
    return ["sky", str(REPO / SWEEP), "--workdir", workdir, *extra]


def parsed(task_file, **envs):
    sky = pytest.importorskip("sky")
    config = yaml.safe_load(task_file.read_text())
    return sky.Task.from_yaml_config(config, env_overrides=list({"WORKDIR": "gs://bucket/sweeps", **envs}.items()))


# --- the task files, through SkyPilot's parser -----------------------------------------------------------

def test_tpu_task_file_parses_with_skypilot():
    task = parsed(TPU_TASK, SHARD="1", SHARES="4")
    (resources,) = task.resources
    assert str(resources.cloud) == "GCP" and resources.accelerators == {"tpu-v5litepod-8": 1}
    assert resources.accelerator_args["runtime_version"] == "v2-alpha-tpuv5-lite"
    assert resources.use_spot is False  # on demand unless asked (--spot / --use-spot)
    assert resources.job_recovery["recover_on_exit_codes"] == [75]  # SIGTERM with a checkpoint saved: resume
    assert resources.job_recovery["max_restarts_on_errors"] >= 1
    assert resources.job_recovery["strategy"] == "FAILOVER"
    assert task.num_nodes == 1  # one slice; SkyPilot runs `run` on each of its hosts
    assert task.workdir == "."
    assert 'uv venv' in task.setup and '-c "$LOCK" -e ".[tpu]"' in task.setup
    assert 'sweeps.launch run "$SWEEP" --workdir "$WORKDIR"' in task.run
    assert "SKYPILOT_NODE_RANK" in task.run and "SKYPILOT_NUM_NODES" in task.run
    assert task.envs == {"SWEEP": "sweeps/configs/paper.py", "WORKDIR": "gs://bucket/sweeps", "CACHE": "",
                         "SHARD": "1", "SHARES": "4", "MODE": "host-parallel", "ARGS": "", "CHECK": "0",
                         "PYTHON_VERSION": "3.11", "LOCK": "constraints.txt"}


def test_gpu_task_file_parses_with_skypilot():
    task = parsed(GPU_TASK)
    (resources,) = task.resources
    assert resources.accelerators == {"L4": 4} and resources.use_spot is False
    assert str(resources.cloud) == "GCP"  # the work directory is a gs:// bucket
    assert resources.job_recovery["recover_on_exit_codes"] == [75]
    assert resources.job_recovery["strategy"] == "FAILOVER"
    assert task.num_nodes == 1
    assert '-c "$LOCK" -e . "jax[cuda12]"' in task.setup and "gcsfs" in task.setup
    assert "SKYPILOT_NUM_GPUS_PER_NODE" in task.run and "CUDA_VISIBLE_DEVICES=$gpu" in task.run
    assert task.envs["MODE"] == "per-gpu" and task.envs["WORKDIR"] == "gs://bucket/sweeps"


@pytest.mark.parametrize("task_file", [TPU_TASK, GPU_TASK], ids=["tpu", "gpu"])
def test_workdir_is_required(task_file):
    sky = pytest.importorskip("sky")
    with pytest.raises(ValueError, match="WORKDIR"):  # `sky jobs launch` without --env WORKDIR=... refuses
        sky.Task.from_yaml(str(task_file))


@pytest.mark.parametrize("task_file", [TPU_TASK, GPU_TASK], ids=["tpu", "gpu"])
@pytest.mark.parametrize("part", ["setup", "run"])
def test_task_scripts_are_shellcheck_clean(task_file, part, tmp_path):
    script = tmp_path / f"{part}.sh"
    # SkyPilot sets the envs and its own variables; shellcheck would call them unassigned.
    script.write_text("#!/usr/bin/env bash\n# shellcheck disable=SC2154\n" + yaml.safe_load(task_file.read_text())[part])
    helpers.assert_shellcheck_clean(script)


# --- the run scripts, executed ------------------------------------------------------------------------------

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([os.environ.get("CUDA_VISIBLE_DEVICES"), sys.argv[1:]]) + "\\n")
sys.exit(int(os.environ.get("EXIT_" + str(os.environ.get("CUDA_VISIBLE_DEVICES")), "0")))
"""


def run_script(task_file, tmp_path, envs, **skypilot):
    """Runs the task's `run` as SkyPilot would on one host; returns (exit status, recorded launcher calls)."""
    home = tmp_path / "home"
    python = home / "scaling-venv" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(RECORDER.format(python=sys.executable))
    python.chmod(0o755)
    record = tmp_path / "record.jsonl"
    record.unlink(missing_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "RECORD": str(record), **envs, **skypilot}
    script = yaml.safe_load(task_file.read_text())["run"]
    done = helpers.run(["bash", "-c", script], env=env, timeout=30)
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return done.returncode, calls


def as_commands(calls):
    """Recorded calls in the form `Job.launcher_commands` prints them."""
    import shlex

    return sorted((f"CUDA_VISIBLE_DEVICES={gpu} " if gpu is not None else "") + shlex.join(["python", *argv])
                  for gpu, argv in calls)


def plan(*flags):
    args = launch.build_parser().parse_args(sky_flags(*flags))
    return cloud.plan("smoke", args)


def test_tpu_run_script_starts_the_commands_the_dry_run_prints(tmp_path):
    accelerator, jobs = plan("--accelerator", "v5litepod-8", "--shares", "4", "--cache-dir", "gs://bucket/tok",
                             "--set", "data.text=hello world", "--only", "L1-*")
    job = jobs[1]
    status, calls = run_script(TPU_TASK, tmp_path, job.envs, SKYPILOT_NODE_RANK="0", SKYPILOT_NUM_NODES="1")
    assert status == 0
    assert as_commands(calls) == job.launcher_commands(accelerator)
    argv = calls[0][1]
    assert argv[:6] == ["-m", "sweeps.launch", "run", SWEEP, "--workdir", "gs://bucket/sweeps"]
    assert argv[6:] == ["--shard", "1/4", "--set", "data.cache_dir=gs://bucket/tok", "--only", "L1-*",
                        "--set", "data.text=hello world"]

    # A 4-host slice: host r of the job's share 1 of 2 trains part 1·4 + r of 8.
    accelerator, jobs = plan("--accelerator", "v5litepod-16", "--shares", "2")
    assert accelerator.hosts == 4
    commands = []
    for rank in range(4):
        status, calls = run_script(TPU_TASK, tmp_path, jobs[1].envs, SKYPILOT_NODE_RANK=str(rank),
                                   SKYPILOT_NUM_NODES="4")
        assert status == 0
        commands += as_commands(calls)
    assert commands == jobs[1].launcher_commands(accelerator)
    assert [c.split("--shard ")[1] for c in commands] == ["4/8", "5/8", "6/8", "7/8"]

    accelerator, (job,) = plan("--accelerator", "v5litepod-16", "--pod-wide")
    status, calls = run_script(TPU_TASK, tmp_path, job.envs, SKYPILOT_NODE_RANK="3", SKYPILOT_NUM_NODES="4")
    assert status == 0 and calls[0][1][-1] == "--pod-wide" and "--shard" not in calls[0][1]
    status, _ = run_script(TPU_TASK, tmp_path, {**job.envs, "SHARES": "2"})
    assert status == 2  # pod-wide cannot share


@pytest.mark.parametrize("accelerator_flag,env,expected", [
    ("v5litepod-16", {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "4"}, [[None, "--shard", "1/8"]]),
    ("H100:2", {"SKYPILOT_NUM_GPUS_PER_NODE": "2"}, [["0", "--shard", "0/4"], ["1", "--shard", "1/4"]]),
])
def test_check_runs_hosts_check_where_the_sweep_would_train(tmp_path, accelerator_flag, env, expected):
    accelerator, (job,) = plan("--accelerator", accelerator_flag, "--shares", "2", "--check", "--set", "steps=1")
    assert job.name == "smoke-check" and job.envs["CHECK"] == "1"
    assert job.resources["job_recovery"] == {"strategy": "FAILOVER", "max_restarts_on_errors": 0,
                                             "recover_on_exit_codes": []}
    task_file = TPU_TASK if accelerator.kind == "tpu" else GPU_TASK
    status, calls = run_script(task_file, tmp_path, job.envs, **env)
    assert status == 0
    assert sorted([gpu, *argv[4:]] for gpu, argv in calls) == expected
    assert all(argv[:4] == ["-m", "sweeps.launch", "hosts", "--check"] for _, argv in calls)
    if accelerator.kind == "gpu":
        assert as_commands(calls) == job.launcher_commands(accelerator)


def test_gpu_run_script_one_launcher_per_gpu_or_one_mesh(tmp_path):
    accelerator, jobs = plan("--accelerator", "H100:2", "--shares", "3")
    status, calls = run_script(GPU_TASK, tmp_path, jobs[2].envs, SKYPILOT_NUM_GPUS_PER_NODE="2")
    assert status == 0
    assert as_commands(calls) == jobs[2].launcher_commands(accelerator)
    assert sorted((gpu, argv[argv.index("--shard") + 1]) for gpu, argv in calls) == [("0", "4/6"), ("1", "5/6")]

    # The job's exit status: any error wins over 75 (SIGTERM, checkpoint saved), which wins over 0.
    for codes, expected in [({"EXIT_0": "75"}, 75), ({"EXIT_0": "75", "EXIT_1": "1"}, 1), ({"EXIT_1": "1"}, 1)]:
        status, calls = run_script(GPU_TASK, tmp_path, {**jobs[0].envs, **codes}, SKYPILOT_NUM_GPUS_PER_NODE="2")
        assert (status, len(calls)) == (expected, 2)

    accelerator, jobs = plan("--accelerator", "H100:8", "--gpu-mode", "mesh")
    status, calls = run_script(GPU_TASK, tmp_path, jobs[0].envs, SKYPILOT_NUM_GPUS_PER_NODE="8")
    assert status == 0 and as_commands(calls) == jobs[0].launcher_commands(accelerator)
    assert calls[0][0] is None and calls[0][1][-4:] == ["--shard", "0/1", "--set", "mesh.data=-1"]


# --- the command ---------------------------------------------------------------------------------------------

def test_task_files_recover_in_the_region_and_install_from_the_lock():
    sky = pytest.importorskip("sky")
    from sky.jobs import recovery_strategy
    from sky.utils import registry

    strategies = registry.JOBS_RECOVERY_STRATEGY_REGISTRY
    # Without a strategy SkyPilot recovers with EAGER_NEXT_REGION, which tears the slice down and moves on.
    assert strategies.from_str(strategies.default) is recovery_strategy.EagerFailoverStrategyExecutor
    assert strategies.from_str(cloud.RECOVERY_STRATEGY) is recovery_strategy.FailoverStrategyExecutor
    for task_file in (TPU_TASK, GPU_TASK):
        task = parsed(task_file)
        (resources,) = task.resources
        assert strategies.from_str(resources.job_recovery["strategy"]) is recovery_strategy.FailoverStrategyExecutor
        assert task.envs["LOCK"] == "constraints.txt" and (REPO / task.envs["LOCK"]).is_file()
        assert task.envs["PYTHON_VERSION"] == lockfile.PYTHON_VERSION  # the Python the lock was resolved for
        installs = [line for line in task.setup.splitlines() if "pip install" in line]
        assert installs and all('-c "$LOCK"' in line for line in installs), installs
    # --infra gcp/REGION becomes SkyPilot's region constraint, which every recovery keeps to.
    accelerator, (job,) = plan("--accelerator", "v5litepod-8", "--infra", "gcp/us-west4")
    (resources,) = cloud.build_task(job).resources
    assert (str(resources.cloud), resources.region) == ("GCP", "us-west4")


def test_dry_run_prints_each_of_four_shares_and_submits_nothing(capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    monkeypatch.setattr(sky.jobs, "launch", lambda *a, **k: pytest.fail("--dry-run submitted a job"))
    code = launch.main(sky_flags("--accelerator", "v5litepod-8", "--shares", "4", "--spot", "--dry-run",
                                 "--cache-dir", "gs://bucket/tokens/c4", "--infra", "gcp/us-west4"))
    out = capsys.readouterr().out
    assert code == 0, out
    blocks = out.split("\njob ")
    assert len(blocks) == 4 and out.startswith("job smoke-0-of-4: share 0/4, task tpu/sweep.sky.yaml")
    pins = lockfile.read_pins()
    for index, block in enumerate(blocks):
        lines = block.splitlines()
        assert f"smoke-{index}-of-4: share {index}/4" in lines[0]
        assert lines[1].startswith("  region: us-west4 (infra gcp/us-west4); recovery: FAILOVER, exit codes [75]")
        assert lines[2].startswith("  lock: constraints.txt (") and f"jax=={pins['jax']}" in lines[2]
        assert f"libtpu=={pins['libtpu']}" in lines[2] and f"orbax-checkpoint=={pins['orbax-checkpoint']}" in lines[2]
        resources = json.loads(lines[3].split("resources: ", 1)[1])
        assert resources["accelerators"] == {"tpu-v5litepod-8": 1} and resources["use_spot"] is True
        assert resources["accelerator_args"] == {"runtime_version": "v2-alpha-tpuv5-lite"}
        assert resources["infra"] == "gcp/us-west4" and resources["job_recovery"]["strategy"] == "FAILOVER"
        assert f"SHARD={index} SHARES=4 MODE=host-parallel" in lines[4] and "LOCK=constraints.txt" in lines[4]
        run_lines = [line for line in lines if line.startswith("  run: ")]
        assert run_lines == [f"  run: ~/scaling-venv/bin/python -m sweeps.launch run {SWEEP} --workdir "
                             f"gs://bucket/sweeps --shard {index}/4 --set data.cache_dir=gs://bucket/tokens/c4"]
    assert "dry run: nothing submitted" in out.splitlines()[-1]


def test_the_wandb_key_reaches_the_hosts_as_a_secret_and_nowhere_else(capsys, monkeypatch, tmp_path):
    pytest.importorskip("sky")
    key = "0123456789abcdef" * 2 + "01234567"
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_API_KEY", key)
    flags = sky_flags("--accelerator", "v5litepod-8", "--shares", "2", "--dry-run", "--infra", "gcp/us-west4")
    _, jobs = plan("--accelerator", "v5litepod-8", "--shares", "2")
    task = cloud.build_task(jobs[0])
    assert task.secrets[cloud.WANDB_SECRET].get_secret_value() == key and cloud.WANDB_SECRET not in task.envs
    assert key not in json.dumps(task.envs) and key not in str(jobs[0])  # nor in jobs.json, which records envs
    assert launch.main(flags) == 0
    out = capsys.readouterr().out
    assert key not in out and out.count("  wandb: online (your WANDB_API_KEY, as a SkyPilot secret)") == 2

    monkeypatch.delenv("WANDB_API_KEY")
    assert not cloud.build_task(jobs[0]).secrets
    assert launch.main(flags) == 0
    assert "  wandb: offline (no WANDB_API_KEY here): each run's kept in the bucket" in capsys.readouterr().out


def test_the_wandb_key_of_wandb_login_is_read_from_netrc(tmp_path):
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    assert cloud.wandb_key({"HOME": str(tmp_path)}) == "abc123"
    assert cloud.wandb_key({"HOME": str(tmp_path), "WANDB_API_KEY": "fromenv"}) == "fromenv"
    assert cloud.wandb_key({"HOME": str(tmp_path / "nobody")}) is None


def test_region_is_the_buckets(gcs, capsys, monkeypatch):
    """Without --infra the jobs are pinned to the region Cloud Storage reports for the bucket (the emulator
    says US-CENTRAL1); a multi-region bucket or one that cannot be read needs --infra."""
    pytest.importorskip("sky")
    from google.cloud import storage as gcs_client

    flags = sky_flags("--accelerator", "H100:2", "--shares", "3", "--dry-run", workdir=f"{gcs}/sweeps")
    assert launch.main(flags) == 0
    out = capsys.readouterr().out
    assert out.count("  region: us-central1 (infra gcp/us-central1); recovery: FAILOVER") == 3, out
    assert f"preflight estimates: none (no {gcs}/sweeps/smoke/preflight.json" in out  # what the hosts will read
    assert launch.main(flags + ["--infra", "gcp"]) == 0  # a cloud without a region: the bucket's region too
    assert "infra gcp/us-central1" in capsys.readouterr().out
    assert launch.main(flags + ["--infra", "aws/us-east-1"]) == 2
    assert "gs:// bucket, so the jobs run on GCP" in capsys.readouterr().err

    def multi_region(client, name, *args, **kwargs):
        bucket = gcs_client.Bucket(client, name)
        bucket._properties.update({"location": "US", "locationType": "multi-region"})
        return bucket
    monkeypatch.setattr(gcs_client.Client, "get_bucket", multi_region)
    assert launch.main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "multi-region US" in err and "--infra gcp/REGION" in err
    assert launch.main(flags + ["--infra", "gcp/us-east5"]) == 0  # named: not looked up
    assert "infra gcp/us-east5" in capsys.readouterr().out

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{helpers.free_port()}")  # nothing listens there
    assert launch.main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--infra gcp/REGION" in err and "could not read the location" in err


def test_an_explicit_region_must_be_the_buckets(gcs, capsys):
    """The emulator's buckets are in US-CENTRAL1: --infra names that region, or the job is refused."""
    pytest.importorskip("sky")
    flags = sky_flags("--accelerator", "H100:2", "--dry-run", workdir=f"{gcs}/sweeps")
    assert launch.main(flags + ["--infra", "gcp/us-west4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bucket is in us-central1" in err and "--infra gcp/us-central1" in err
    assert launch.main(flags + ["--infra", "gcp/us-central1"]) == 0


def test_a_region_without_the_accelerator_is_refused_by_skypilots_catalog(tmp_path):
    from sweeps.cloud import regions
    from test_prices import write_catalog

    assert regions.check_offered("tpu-v6e-8", "gcp/us-west4", home=str(tmp_path)).startswith("note: not checked")
    write_catalog(tmp_path)
    with pytest.raises(ValueError, match="tpu-v6e-8: not offered in us-west4 .* it is in us-central1, us-central2"):
        regions.check_offered("tpu-v6e-8", "gcp/us-west4", home=str(tmp_path))
    assert "offered in us-east5" in regions.check_offered("tpu-v5litepod-8", "gcp/us-east5/us-east5-a",
                                                          home=str(tmp_path))
    assert "offered in us-east4" in regions.check_offered("H100", "gcp/us-east4", home=str(tmp_path))
    with pytest.raises(ValueError, match="tpu-v4-8: not in SkyPilot's catalog"):
        regions.check_offered("tpu-v4-8", "gcp/us-central2", home=str(tmp_path))


def test_an_infra_region_outside_the_buckets_multi_region_is_refused():
    from sweeps.cloud import regions

    regions.check_infra_region("us-east5", "US", "multi-region", "gs://b")
    regions.check_infra_region("us-east5", "NAM4", "dual-region", "gs://b")  # not checked
    with pytest.raises(ValueError, match="multi-region EU; name a region in it"):
        regions.check_infra_region("us-east5", "EU", "multi-region", "gs://b")
    with pytest.raises(ValueError, match="bucket is in us-west4"):
        regions.check_infra_region("us-east5", "US-WEST4", "region", "gs://b")


@pytest.mark.parametrize("flags,message", [
    (["--accelerator", "H100:8", "--shares", "4"], "--shares 4: 4 job(s) × 8 launcher(s) (one per GPU) = 32 "
     "launchers, but the sweep has only 6 runs (26 would idle on billed GPUs); use --shares 1 with --gpu-mode mesh"),
    (["--accelerator", "H100:2", "--shares", "4"], "= 8 launchers, but the sweep has only 6 runs (2 would idle on "
     "billed GPUs); use --shares 3"),
    (["--accelerator", "v5litepod-16", "--shares", "2"], "use --shares 1"),
    (["--accelerator", "v5litepod-8", "--shares", "4", "--only", "L1-*"], "only 3 runs"),
])
def test_shares_are_checked_against_runs_times_hosts_or_gpus(flags, message, capsys):
    assert launch.main(sky_flags(*flags, "--dry-run", "--infra", "gcp/us-west4")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_one_share_wider_than_the_sweep_is_a_note(capsys):
    pytest.importorskip("sky")
    assert launch.main(sky_flags("--accelerator", "H100:8", "--dry-run", "--infra", "gcp/us-west4")) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: 1 job(s) × 8 launcher(s) (one per GPU) = 8 launchers for 6 runs: 2 would idle")
    assert launch.main(sky_flags("--accelerator", "H100:8", "--gpu-mode", "mesh", "--shares", "6", "--dry-run",
                                 "--infra", "gcp/us-west4")) == 0  # one launcher per job: 6 for 6 runs
    assert "launchers for" not in capsys.readouterr().out


def write_record(run, workdir):
    """A finished record for ``run`` in the (gs://) work directory, as the trainer writes it (no training)."""
    from scaling.store import records
    from scaling.store.storage import write_atomic

    config = run.config
    # A finished run's metrics log holds its final loss (scaling.store.record_checks).
    write_atomic(run.run_dir(workdir) / "metrics.jsonl", '{"step": 0, "eval_loss": 3.0}\n')
    records.write_record(run.run_dir(workdir), records.RunRecord(
        run_id=run.run_id, status="finished", depth=config.model.depth, width=config.model.width, seed=config.seed,
        params_non_embedding=12 * config.model.depth * config.model.width ** 2, name=run.name,
        sweep=config.sweep_name, final_eval_loss=3.0, point_id=run.run_id, lr_rule=config.optim.lr_rule,
        peak_lr=config.optim.peak_lr, planned_steps=config.steps))


class Controller:
    """SkyPilot's client functions as a jobs controller would answer them, with SkyPilot's own record and
    status classes: ``launch`` queues a job (PENDING), ``queue_v2``/``cancel``/``tail_logs`` act on ids."""

    def __init__(self, sky, monkeypatch):
        from sky.jobs import ManagedJobStatus
        from sky.schemas.api.responses import ManagedJobRecord

        self.status, self.record_class = ManagedJobStatus, ManagedJobRecord
        self.jobs, self.launched, self.cancelled, self.logs, self.refuse = {}, [], [], [], set()
        self.stopped = False  # the jobs controller stopped itself (idle, no job in progress)
        monkeypatch.setattr(sky.jobs, "launch", self.launch)
        monkeypatch.setattr(sky.jobs, "queue_v2", self.queue_v2)
        monkeypatch.setattr(sky.jobs, "cancel", self.cancel)
        monkeypatch.setattr(sky.jobs, "tail_logs", self.tail_logs)
        monkeypatch.setattr(sky, "stream_and_get", lambda request: request())
        monkeypatch.setattr(sky, "get", lambda request: request())

    def launch(self, task, name):
        def answer():
            if name in self.refuse:
                raise RuntimeError("Cloud access is not set up. Run: sky check\nmore detail")
            job_id = len(self.jobs) + 1
            self.jobs[job_id] = self.record_class(job_id=job_id, task_id=0, job_name=name, task_name=name,
                                                  status=self.status.PENDING, recovery_count=0)
            self.launched.append((task, name))
            return [job_id], None
        return answer

    def queue_v2(self, refresh, skip_finished=False, all_users=False, job_ids=None, **_):
        def answer():
            if self.stopped and not refresh:  # as sky/jobs/server/core.py answers with its controller stopped
                from sky.exceptions import ClusterNotUpError

                raise ClusterNotUpError("No in-progress managed jobs.")
            records = [r for i, r in self.jobs.items() if job_ids is None or i in job_ids]
            return records, len(records), {}, len(self.jobs)
        return answer

    def cancel(self, name=None, job_ids=None, all=False, **_):  # noqa: A002 - SkyPilot's parameter name
        assert name is None and not all, "cancel by job id only"
        self.cancelled += list(job_ids)
        return lambda: None

    def tail_logs(self, name=None, job_id=None, follow=True, **_):
        assert name is None, "logs by job id only: names resolve among running jobs alone"
        self.logs.append(job_id)
        return 0

    def set(self, job_id, status, recoveries=0):
        self.jobs[job_id] = self.jobs[job_id].model_copy(update={"status": getattr(self.status, status),
                                                                 "recovery_count": recoveries})


def test_submitting_twice_submits_each_share_once(gcs, capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    controller = Controller(sky, monkeypatch)
    workdir = f"{gcs}/sweeps"
    flags = sky_flags("--accelerator", "H100:2", "--shares", "2", "--spot", "--set", "steps=5", workdir=workdir)
    assert launch.main(flags) == 0
    assert [name for _, name in controller.launched] == ["smoke-0-of-2", "smoke-1-of-2"]
    for index, (task, _) in enumerate(controller.launched):
        (resources,) = task.resources
        assert resources.accelerators == {"H100": 2} and resources.use_spot is True
        assert (str(resources.cloud), resources.region) == ("GCP", "us-central1")  # the bucket's region
        assert resources.job_recovery["strategy"] == "FAILOVER"
        assert task.envs["SHARD"] == str(index) and task.envs["ARGS"] == "--set steps=5"
        assert task.workdir == str(REPO) and task.name == f"smoke-{index}-of-2"
    record = cloud_jobs.read_jobs(cloud_jobs.jobs_path(workdir, "smoke"))
    assert [(job.name, job.job_id, job.share) for job in record] == [("smoke-0-of-2", 1, 0), ("smoke-1-of-2", 2, 1)]
    assert "2 job(s) submitted" in capsys.readouterr().out

    # Again, with both jobs live: nothing new.
    controller.set(1, "RUNNING")
    controller.set(2, "RECOVERING", recoveries=1)
    assert launch.main(flags) == 0
    out = capsys.readouterr().out
    assert len(controller.launched) == 2
    assert "smoke-0-of-2: skipped, managed job 1 is RUNNING" in out
    assert "smoke-1-of-2: skipped, managed job 2 is RECOVERING (1 recoveries)" in out
    assert "nothing submitted" in out

    # Other shares over the same runs while these are live: refused, nothing submitted.
    assert launch.main(sky_flags("--accelerator", "H100:1", "--shares", "3", "--set", "steps=5",
                                 workdir=workdir)) == 2
    assert "submitted as 2 shares" in capsys.readouterr().err and len(controller.launched) == 2

    # Job 2 ended with its runs unfinished: only --missing resubmits it, and only it.
    controller.set(2, "FAILED")
    assert launch.main(flags) == 0
    assert "smoke-1-of-2: skipped, managed job 2 ended FAILED; --missing" in capsys.readouterr().out
    assert len(controller.launched) == 2
    assert launch.main(flags + ["--missing"]) == 0
    out = capsys.readouterr().out
    assert [name for _, name in controller.launched[2:]] == ["smoke-1-of-2"]
    assert "smoke-1-of-2: managed job 2 ended FAILED with 4 run(s) unfinished" in out  # 2 GPUs: 2 of 4 parts
    record = cloud_jobs.read_jobs(cloud_jobs.jobs_path(workdir, "smoke"))
    assert [(job.name, job.job_id) for job in record][-1] == ("smoke-1-of-2", 3)

    # A share whose job ended with every run finished is not resubmitted, even with --missing.
    sweep = launch.spec_lib.with_overrides(launch.spec_lib.load_sweep(REPO / SWEEP), ["steps=5"])
    accelerator, jobs = cloud.plan("smoke", launch.build_parser().parse_args(flags))
    for run in cloud.job_runs(jobs[0], accelerator, sweep.expand()[0]):
        write_record(run, workdir)
    controller.set(1, "SUCCEEDED")
    controller.set(3, "RUNNING")
    assert launch.main(flags + ["--missing"]) == 0
    assert "smoke-0-of-2: skipped, every run of its share is done" in capsys.readouterr().out
    assert len(controller.launched) == 3


def test_the_job_commands_work_after_the_jobs_controller_stopped(gcs, capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    controller = Controller(sky, monkeypatch)
    workdir = f"{gcs}/sweeps"
    flags = sky_flags("--accelerator", "v5litepod-8", "--shares", "2", workdir=workdir)
    assert launch.main(flags) == 0
    for job_id in (1, 2):
        controller.set(job_id, "FAILED")
    controller.stopped = True  # every job ended, and ten idle minutes later the controller stopped
    capsys.readouterr()
    assert launch.main(flags + ["--missing"]) == 0  # the shares with unfinished runs: resubmitted
    out = capsys.readouterr().out
    assert "jobs controller is stopped" in out
    assert "managed job 1 ended (jobs controller stopped) with 3 run(s) unfinished" in out
    assert [name for _, name in controller.launched[2:]] == ["smoke-0-of-2", "smoke-1-of-2"]
    controller.stopped = True
    assert launch.main(sky_flags("--status", workdir=workdir)) == 0
    assert capsys.readouterr().out.count("(jobs controller stopped)") == 4
    assert launch.main(sky_flags("--cancel", workdir=workdir)) == 0
    assert "no live job among the 4 recorded" in capsys.readouterr().out and controller.cancelled == []


def test_a_stopped_controller_is_no_live_job_at_the_sdk_boundary(monkeypatch):
    """The queue raises SkyPilot's own ``ClusterNotUpError`` (a stand-in of its class without the cloud extra)."""
    import types

    try:
        from sky.exceptions import ClusterNotUpError
    except ImportError:
        ClusterNotUpError = type("ClusterNotUpError", (Exception,), {})
        package, module = types.ModuleType("sky"), types.ModuleType("sky.exceptions")
        module.ClusterNotUpError = ClusterNotUpError
        monkeypatch.setitem(sys.modules, "sky", package)
        monkeypatch.setitem(sys.modules, "sky.exceptions", module)

    def stopped_queue(**_):
        raise ClusterNotUpError("No in-progress managed jobs.")

    sky = types.SimpleNamespace(jobs=types.SimpleNamespace(queue_v2=stopped_queue), get=lambda request: request)
    queue = cloud_jobs.sky_records(sky, [3, 4])
    assert set(queue) == {3, 4} and not any(cloud_jobs.is_live(record) for record in queue.values())
    assert cloud_jobs.status_text(queue[3]) == "(jobs controller stopped)"

    def unreachable(**_):
        raise ConnectionError("Could not connect to SkyPilot API server\nhint")

    sky.jobs.queue_v2 = unreachable  # any other error: still one line, exit 2
    with pytest.raises(cloud.CloudError, match="sky.jobs.queue_v2: Could not connect to SkyPilot API server$"):
        cloud_jobs.sky_records(sky, [3])


def test_a_submission_that_stops_part_way_is_completed_by_the_next(gcs, capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    controller = Controller(sky, monkeypatch)
    flags = sky_flags("--accelerator", "v5litepod-8", "--shares", "3", workdir=f"{gcs}/sweeps")
    controller.refuse = {"smoke-1-of-3"}
    assert launch.main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "smoke-1-of-3: Cloud access is not set up" in err and "smoke-0-of-3" in err
    controller.refuse = set()
    assert launch.main(flags) == 0
    assert [name for _, name in controller.launched] == ["smoke-0-of-3", "smoke-1-of-3", "smoke-2-of-3"]


def test_status_logs_and_cancel_act_on_this_sweeps_jobs_by_id(gcs, capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    controller = Controller(sky, monkeypatch)
    workdir = f"{gcs}/sweeps"
    base = sky_flags(workdir=workdir)
    assert launch.main(base + ["--status"]) == 0
    assert "no jobs recorded" in capsys.readouterr().out
    assert launch.main(sky_flags("--accelerator", "v5litepod-8", "--shares", "2", workdir=workdir)) == 0
    # Another sweep's job in the same queue (e.g. submitted by hand with the same name): never touched.
    controller.jobs[99] = controller.record_class(job_id=99, job_name="smoke-0-of-2", status=controller.status.RUNNING)
    controller.set(1, "RUNNING")
    controller.set(2, "SUCCEEDED")
    sweep = launch.spec_lib.load_sweep(REPO / SWEEP)
    accelerator, jobs = cloud.plan("smoke", launch.build_parser().parse_args(
        sky_flags("--accelerator", "v5litepod-8", "--shares", "2", workdir=workdir)))
    share_1 = cloud.job_runs(jobs[1], accelerator, sweep.expand()[0])
    for run in share_1:
        write_record(run, workdir)
    write_record(cloud.job_runs(jobs[0], accelerator, sweep.expand()[0])[0], workdir)
    capsys.readouterr()

    assert launch.main(base + ["--status"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("smoke-")}
    assert "RUNNING" in lines["smoke-0-of-2"] and "2 pending, 1 finished (of 3)" in lines["smoke-0-of-2"]
    assert "SUCCEEDED" in lines["smoke-1-of-2"] and f"{len(share_1)} finished (of {len(share_1)})" in \
        lines["smoke-1-of-2"]
    assert "all recorded jobs' runs: 2 pending, 4 finished" in out

    assert launch.main(base + ["--logs", "smoke-1-of-2"]) == 0  # a finished job's log: by its id
    assert launch.main(base + ["--logs", "0"]) == 0
    assert controller.logs == [2, 1]
    assert launch.main(base + ["--logs", "7"]) == 2
    assert "no recorded job matches" in capsys.readouterr().err

    assert launch.main(base + ["--cancel"]) == 0
    assert controller.cancelled == [1]  # the live one of this sweep; not 99, not the finished 2
    assert "cancelled 1 job(s): smoke-0-of-2 #1" in capsys.readouterr().out


def test_an_installed_copy_says_sky_needs_a_clone(tmp_path, monkeypatch):
    monkeypatch.setattr(cloud, "REPO", tmp_path / "site-packages")  # `pip install .`: no pyproject.toml beside it
    with pytest.raises(cloud.CloudError, match="an installed copy of the project, not its repository; sky needs a "
                                               "clone"):
        plan("--accelerator", "v5litepod-8")


def test_tpu_readme_says_what_one_hosts_exit_does_to_the_others():
    """SkyPilot ends every host's run when one host's exits non-zero (sky/backends/task_codegen.py)."""
    table = (REPO / "tpu" / "README.md").read_text().split("## Preemptions and failures", 1)[1].split("\n## ", 1)[0]
    row_75 = next(line for line in table.splitlines() if line.startswith("| launcher exits 75"))
    assert "other hosts" in row_75 and "--when-busy exit" in row_75
    row_1 = next(line for line in table.splitlines() if line.startswith("| launcher exits 1"))
    assert "other hosts" in row_1


def test_without_skypilot_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sky", None)  # `import sky` raises ImportError
    assert launch.main(sky_flags("--accelerator", "v5litepod-8", "--dry-run")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install -e ".[cloud]"' in err


@pytest.mark.parametrize("flags,message", [
    (["--accelerator", "v5litepod-16", "--pod-wide", "--shares", "2"], "--shares 1"),
    (["--accelerator", "H100:8", "--pod-wide"], "TPU"),
    (["--accelerator", "v5litepod-8", "--gpu-mode", "mesh"], "GPU"),
    (["--accelerator", "v5litepod-8", "--shares", "7"], "only 6 runs"),
    (["--shares", "2"], "--accelerator: required to submit"),
    (["--accelerator", "v5litepod-8", "--shares", "0"], "at least 1"),
    (["--accelerator", "not a type"], "TPU type"),
    (["--accelerator", "v5litepod-8", "--only", "nothing-*"], "matches none"),
])
def test_bad_flags_are_one_line_errors(flags, message, capsys):
    assert launch.main(sky_flags(*flags)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_workdir_must_be_a_bucket_and_the_sweep_inside_the_repository(capsys, tmp_path):
    args = ["sky", str(REPO / SWEEP), "--workdir", str(tmp_path), "--accelerator", "v5litepod-8"]
    assert launch.main(args) == 2 and "must be a bucket" in capsys.readouterr().err
    outside = tmp_path / "mine.py"
    outside.write_text((REPO / SWEEP).read_text())
    assert launch.main(["sky", str(outside), "--workdir", "gs://b/s", "--accelerator", "v5litepod-8"]) == 2
    assert "inside the repository" in capsys.readouterr().err


@pytest.mark.parametrize("text,kind,name,hosts,runtime", [
    ("v5litepod-8", "tpu", "tpu-v5litepod-8", 1, "v2-alpha-tpuv5-lite"),
    ("tpu-v5litepod-16", "tpu", "tpu-v5litepod-16", 4, "v2-alpha-tpuv5-lite"),
    ("v5litepod-64", "tpu", "tpu-v5litepod-64", 16, "v2-alpha-tpuv5-lite"),
    ("v6e-8", "tpu", "tpu-v6e-8", 1, "v2-alpha-tpuv6e"),
    ("v4-8", "tpu", "tpu-v4-8", 1, "tpu-ubuntu2204-base"),
    ("v4-32", "tpu", "tpu-v4-32", 4, "tpu-ubuntu2204-base"),
    ("v5p-8", "tpu", "tpu-v5p-8", 1, "v2-alpha-tpuv5"),
    ("H100:8", "gpu", "H100:8", 1, None),
    ("L4", "gpu", "L4", 1, None),
])
def test_parse_accelerator(text, kind, name, hosts, runtime):
    assert cloud.parse_accelerator(text) == cloud.Accelerator(kind, name, hosts, runtime)


def test_help_explains_the_command():
    done = helpers.run_module("sweeps.launch", "sky", "--help", timeout=60)
    assert done.returncode == 0
    assert "100 FAILED" in " ".join(done.stdout.split())  # what --logs exits with
    for flag in ("--accelerator", "--shares", "--spot", "--dry-run", "--pod-wide", "managed jobs"):
        assert flag in done.stdout
