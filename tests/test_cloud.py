"""SkyPilot task files and ``python -m sweeps.launch sky`` (sweeps/cloud.py).

Three layers, none of which needs cloud credentials or a network:
* the task files, parsed by SkyPilot's own parser (``sky.Task.from_yaml_config``,
  what ``sky jobs launch task.yaml --env ...`` uses), with their resources,
  spot, setup, run and envs checked;
* their ``run`` scripts, executed with bash and SkyPilot's variables and a
  recording ``python``, so the launcher commands a host would start are the
  ones ``--dry-run`` prints;
* the command itself: ``--dry-run`` for a sweep split into 4 shares, and a
  submission with ``sky.jobs.launch`` replaced by a recorder.
A real dry launch (SkyPilot's optimizer) needs `sky check` to find cloud
credentials and SkyPilot's hosted catalog, so no test does one.
Tests that need SkyPilot skip without the ``cloud`` extra; CI installs it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweeps import cloud, launch

REPO = Path(__file__).resolve().parents[1]
SWEEP = "sweeps/configs/smoke.py"  # 6 runs
TPU_TASK, GPU_TASK = cloud.TASK_FILES["tpu"], cloud.TASK_FILES["gpu"]


def sky_flags(*extra):
    return ["sky", str(REPO / SWEEP), "--workdir", "gs://bucket/sweeps", *extra]


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
    assert task.num_nodes == 1  # one slice; SkyPilot runs `run` on each of its hosts
    assert task.workdir == "."
    assert 'uv venv' in task.setup and '-e ".[tpu]"' in task.setup
    assert 'sweeps.launch run "$SWEEP" --workdir "$WORKDIR"' in task.run
    assert "SKYPILOT_NODE_RANK" in task.run and "SKYPILOT_NUM_NODES" in task.run
    assert task.envs == {"SWEEP": "sweeps/configs/paper.py", "WORKDIR": "gs://bucket/sweeps", "CACHE": "",
                         "SHARD": "1", "SHARES": "4", "MODE": "host-parallel", "ARGS": "", "CHECK": "0",
                         "PYTHON_VERSION": "3.11"}


def test_gpu_task_file_parses_with_skypilot():
    task = parsed(GPU_TASK)
    (resources,) = task.resources
    assert resources.accelerators == {"L4": 4} and resources.use_spot is False
    assert resources.job_recovery["recover_on_exit_codes"] == [75]
    assert task.num_nodes == 1
    assert '"jax[cuda12]"' in task.setup and "gcsfs" in task.setup
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
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck binary not installed (apt-get install shellcheck); CI installs it")
    script = tmp_path / f"{part}.sh"
    # SkyPilot sets the envs and its own variables; shellcheck would call them unassigned.
    script.write_text("#!/usr/bin/env bash\n# shellcheck disable=SC2154\n" + yaml.safe_load(task_file.read_text())[part])
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


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
    done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
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
    assert job.resources["job_recovery"] == {"max_restarts_on_errors": 0, "recover_on_exit_codes": []}
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

def test_dry_run_prints_each_of_four_shares_and_submits_nothing(capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    monkeypatch.setattr(sky.jobs, "launch", lambda *a, **k: pytest.fail("--dry-run submitted a job"))
    code = launch.main(sky_flags("--accelerator", "v5litepod-8", "--shares", "4", "--spot", "--dry-run",
                                 "--cache-dir", "gs://bucket/tokens/c4"))
    out = capsys.readouterr().out
    assert code == 0, out
    blocks = out.split("\njob ")
    assert len(blocks) == 4 and out.startswith("job smoke-0-of-4: share 0/4, task tpu/sweep.sky.yaml")
    for index, block in enumerate(blocks):
        lines = block.splitlines()
        assert f"smoke-{index}-of-4: share {index}/4" in lines[0]
        resources = json.loads(lines[1].split("resources: ", 1)[1])
        assert resources["accelerators"] == {"tpu-v5litepod-8": 1} and resources["use_spot"] is True
        assert resources["accelerator_args"] == {"runtime_version": "v2-alpha-tpuv5-lite"}
        assert f"SHARD={index} SHARES=4 MODE=host-parallel" in lines[2]
        run_lines = [line for line in lines if line.startswith("  run: ")]
        assert run_lines == [f"  run: python -m sweeps.launch run {SWEEP} --workdir gs://bucket/sweeps --shard "
                             f"{index}/4 --set data.cache_dir=gs://bucket/tokens/c4"]
    assert out.rstrip().endswith("nothing submitted; without --dry-run this submits these 4 task(s) with "
                                 "sky.jobs.launch")


def test_submits_one_managed_job_per_share(capsys, monkeypatch):
    sky = pytest.importorskip("sky")
    submitted = []
    monkeypatch.setattr(sky.jobs, "launch", lambda task, name: submitted.append((task, name)) or name)
    monkeypatch.setattr(sky, "stream_and_get", lambda request: ([len(submitted)], None))
    assert launch.main(sky_flags("--accelerator", "H100:8", "--shares", "2", "--spot", "--set", "steps=5")) == 0
    assert [name for _, name in submitted] == ["smoke-0-of-2", "smoke-1-of-2"]
    for index, (task, _) in enumerate(submitted):
        (resources,) = task.resources
        assert resources.accelerators == {"H100": 8} and resources.use_spot is True
        assert task.envs["SHARD"] == str(index) and task.envs["ARGS"] == "--set steps=5"
        assert task.workdir == str(REPO) and task.name == f"smoke-{index}-of-2"
    out = capsys.readouterr().out
    assert "smoke-1-of-2: managed job 2" in out and "sweeps.launch status" in out

    # A SkyPilot error (here: no cloud access) is one line naming the job and what was already submitted.
    def refuse(task, name):
        if name.endswith("1-of-2"):
            raise RuntimeError("Cloud access is not set up. Run: sky check\nmore detail")
        return name
    monkeypatch.setattr(sky.jobs, "launch", refuse)
    assert launch.main(sky_flags("--accelerator", "H100:8", "--shares", "2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "smoke-1-of-2: Cloud access is not set up" in err and "smoke-0-of-2" in err


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
    done = subprocess.run([sys.executable, "-m", "sweeps.launch", "sky", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--accelerator", "--shares", "--spot", "--dry-run", "--pod-wide", "managed jobs"):
        assert flag in done.stdout
