"""Tests of the tpu/ shell scripts and gpu/slurm_sweep.sbatch.

Two layers:
* ``--dry-run`` output: the exact gcloud commands, parsed back with shlex as a
  shell would read them (so they really can be copy-pasted);
* the real-run path against a fake ``gcloud`` (a small Python script, chosen
  through the GCLOUD variable) whose ``tpu-vm ssh`` runs each --command with
  bash inside a per-worker home directory. The commands that would run on TPU
  workers therefore really run: git clone and checkout, the background
  launcher, its per-worker log and exit status, and the relaunch loop.
No test needs gcloud, network, or a TPU.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["create", "setup", "launch", "status", "teardown", "relaunch", "group"]
SLICE = ["--name", "my-tpu", "--zone", "us-west4-a", "--project", "my-proj"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SWEEP = "sweeps/configs/tiny.py"
WORKERS = ("w0", "w1")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "GCLOUD"))}
    env.update(extra)
    return env


def run(script, *args, tpu_dir=REPO / "tpu", env=None, timeout=60):
    return subprocess.run([str(tpu_dir / script), *args], capture_output=True, text=True,
                          env=env or clean_env(), stdin=subprocess.DEVNULL, timeout=timeout)


def commands(result):
    """The dry-run's stdout as a list of argv lists, one per printed line."""
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, "dry-run printed nothing"
    return [shlex.split(line) for line in lines]


def flag(argv, name):
    """Value of --name=VALUE or --name VALUE in argv."""
    for i, word in enumerate(argv):
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
        if word == name:
            return argv[i + 1]
    raise AssertionError(f"{name} not in {argv}")


def git(cwd, *args):
    env = clean_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
                    GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


# --- static checks -----------------------------------------------------------

def script_paths():
    return [REPO / "tpu" / s for s in SCRIPTS] + [REPO / "tpu" / "common.sh", REPO / "gpu" / "slurm_sweep.sbatch"]


@pytest.mark.parametrize("path", script_paths(), ids=lambda p: p.name)
def test_shellcheck_clean(path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck binary not installed (apt-get install shellcheck); CI installs it")
    out = subprocess.run(["shellcheck", "-x", str(path)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_strict_and_executable(script):
    path = REPO / "tpu" / script
    assert os.access(path, os.X_OK), f"{path} is not executable"
    assert "set -euo pipefail" in path.read_text()


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_zero_and_prints_usage(script):
    result = run(script, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: tpu/{script}")
    assert "--dry-run" in result.stdout


@pytest.mark.parametrize("script,args,missing", [
    ("create", [*SLICE], "--accelerator-type"),
    ("create", ["--name", "x", "--project", "p", "--accelerator-type", "v4-8"], "--zone"),
    ("setup", ["--zone", "z", "--project", "p", "--commit", COMMIT, "--repo-url", "u"], "--name"),
    ("launch", [*SLICE, "--workdir", "gs://b/x"], "SWEEP_FILE"),
    ("launch", [*SLICE, SWEEP], "--workdir"),
    ("status", [*SLICE, SWEEP], "--workdir"),
    ("teardown", ["--name", "x", "--zone", "z"], "--project"),
    ("relaunch", [*SLICE, SWEEP, "--workdir", "gs://b/x"], "--accelerator-type"),
])
def test_missing_required_argument_is_one_clear_error(script, args, missing):
    result = run(script, *args, "--dry-run")
    assert result.returncode != 0
    assert result.stdout == ""
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1 and "error" in error_lines[0] and missing in error_lines[0], result.stderr


def test_bad_input_is_rejected():
    assert "unknown argument" in run("create", *SLICE, "--acelerator-type", "v4-8", "--dry-run").stderr
    both = run("create", *SLICE, "--accelerator-type", "v4-8", "--spot", "--preemptible", "--dry-run")
    assert both.returncode != 0 and "exclude" in both.stderr
    local = run("relaunch", *SLICE, SWEEP, "--workdir", "/tmp/x", "--accelerator-type", "v4-8",
                "--commit", COMMIT, "--repo-url", "u", "--dry-run")
    assert local.returncode != 0 and "gs://" in local.stderr


def test_real_run_without_gcloud_fails_clearly():
    env = clean_env(GCLOUD="/nonexistent/gcloud")
    result = run("create", *SLICE, "--accelerator-type", "v4-8", env=env)
    assert result.returncode != 0
    assert "gcloud not found" in result.stderr


# --- dry-run output ----------------------------------------------------------

def test_create_dry_run():
    [argv] = commands(run("create", *SLICE, "--accelerator-type", "v5litepod-16", "--spot", "--dry-run"))
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "my-tpu"]
    assert flag(argv, "--zone") == "us-west4-a" and flag(argv, "--project") == "my-proj"
    assert flag(argv, "--accelerator-type") == "v5litepod-16"
    assert flag(argv, "--version") == "v2-alpha-tpuv5-lite"
    assert "--spot" in argv and "--preemptible" not in argv

    [argv] = commands(run("create", *SLICE, "--accelerator-type", "v4-32", "--preemptible",
                          "--version", "tpu-ubuntu2204-base", "--dry-run", "--", "--network=my net"))
    assert flag(argv, "--version") == "tpu-ubuntu2204-base" and "--preemptible" in argv
    assert argv[-1] == "--network=my net"


def test_create_queued_dry_run():
    [argv] = commands(run("create", *SLICE, "--accelerator-type", "v5p-8", "--spot", "--queued", "--dry-run"))
    assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "my-tpu"]
    assert flag(argv, "--node-id") == "my-tpu"
    assert flag(argv, "--runtime-version") == "v2-alpha-tpuv5"
    assert "--spot" in argv


def test_teardown_dry_run_needs_no_confirmation():
    [argv] = commands(run("teardown", *SLICE, "--dry-run"))
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "my-tpu"] and "--quiet" in argv
    [argv] = commands(run("teardown", *SLICE, "--queued", "--dry-run"))
    assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "my-tpu"]
    assert "--force" in argv


def assert_ssh_all(argv):
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
    assert "--worker=all" in argv
    assert flag(argv, "--zone") == "us-west4-a" and flag(argv, "--project") == "my-proj"
    return flag(argv, "--command")


def test_setup_and_launch_dry_run_pin_one_commit_on_all_workers():
    [setup] = commands(run("setup", *SLICE, "--commit", COMMIT, "--repo-url",
                           "https://example.com/org/repo.git", "--dry-run"))
    remote = assert_ssh_all(setup)
    assert f"git checkout --quiet --detach {COMMIT}" in remote
    assert "git clone --quiet https://example.com/org/repo.git depth-width-scaling" in remote
    assert "pip install --quiet -e '.[tpu]'" in remote

    [launch] = commands(run("launch", SWEEP, "--workdir", "gs://bucket/sweeps", *SLICE, "--commit", COMMIT,
                            "--ssh-arg=--tunnel-through-iap", "--dry-run", "--", "--pod-wide"))
    remote = assert_ssh_all(launch)
    assert "--tunnel-through-iap" in launch
    assert f'test "$(git rev-parse HEAD)" = {COMMIT}' in remote
    assert f".venv/bin/python -m sweeps.launch run {SWEEP} --workdir gs://bucket/sweeps --pod-wide" in remote
    assert "logs/tiny/$(hostname)" in remote  # one log per worker, named by its hostname
    # The commands must parse as shell, as a worker's shell will read them.
    for command in (flag(setup, "--command"), remote):
        assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0


def test_status_dry_run():
    tail, counts = commands(run("status", SWEEP, "--workdir", "gs://bucket/sweeps", *SLICE, "--dry-run"))
    assert "tail -n 5" in assert_ssh_all(tail)
    assert "--worker=0" in counts
    assert flag(counts, "--command").endswith(f"sweeps.launch status {SWEEP} --workdir gs://bucket/sweeps --json")


def test_relaunch_dry_run_prints_one_recovery_cycle():
    argv_list = commands(run("relaunch", SWEEP, "--workdir", "gs://bucket/sweeps", *SLICE,
                             "--accelerator-type", "v5litepod-16", "--spot", "--commit", COMMIT,
                             "--repo-url", "https://example.com/r.git", "--dry-run"))
    verbs = [argv[3:5] for argv in argv_list]
    assert verbs == [["tpu-vm", "describe"], ["tpu-vm", "delete"], ["tpu-vm", "create"],
                     ["tpu-vm", "ssh"], ["tpu-vm", "describe"], ["tpu-vm", "ssh"], ["tpu-vm", "ssh"]]
    assert "--spot" in argv_list[2]
    assert flag(argv_list[4], "--format") == "value(networkEndpoints[].ipAddress)"  # how many workers to launch
    setup, launch, states = argv_list[3], argv_list[5], argv_list[6]
    assert COMMIT in assert_ssh_all(setup) and "--worker=0" in launch and "--shard 0/1" in flag(launch, "--command")
    assert "WORKER_STATE" in assert_ssh_all(states)


# --- real-run path against a fake gcloud and fake workers ---------------------

FAKE_GCLOUD = r'''
import json, os, shutil, subprocess, sys
from pathlib import Path
cloud = Path(os.environ["FAKE_CLOUD"])
args = sys.argv[1:]
with open(cloud / "calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\n")
resource, verb = args[2], args[3]
state_file = cloud / "state"
if verb == "describe" and "--format=value(networkEndpoints[].ipAddress)" in args:
    print(";".join(f"10.0.0.{i}" for i, _ in enumerate((cloud / "workers").iterdir())))
elif verb == "describe":
    state = state_file.read_text().strip()
    if state == "MISSING":
        sys.exit(print("ERROR: (gcloud) NOT_FOUND: resource not found", file=sys.stderr) or 1)
    if resource == "queued-resources":  # a preempted spot request is suspended
        state = "SUSPENDED" if state == "PREEMPTED" else "ACTIVE"
    print(state)
elif verb == "delete":
    state_file.write_text("MISSING")
    for home in (cloud / "workers").iterdir():  # disks die with the slice
        shutil.rmtree(home)
        home.mkdir()
elif verb == "create":
    state_file.write_text("READY")
elif verb == "ssh":
    worker = next(a for a in args if a.startswith("--worker=")).split("=")[1]
    command = args[args.index("--command") + 1]
    names = sorted(p.name for p in (cloud / "workers").iterdir())
    status = 0
    for name in names if worker == "all" else [names[int(worker)]]:
        home = cloud / "workers" / name
        env = dict(os.environ, HOME=str(home), FAKE_HOST=name,
                   PATH=str(cloud / "bin") + os.pathsep + os.environ["PATH"])
        status |= subprocess.run(["bash", "-c", command], cwd=home, env=env).returncode
    sys.exit(status)
'''

FAKE_BIN = {
    "hostname": '#!/bin/sh\necho "$FAKE_HOST"\n',
    # `uv venv ... DIR` makes a venv whose python is the fake below.
    "uv": '#!/bin/sh\nfor last; do :; done\nmkdir -p "$last/bin" && cp "$FAKE_CLOUD/fake_python" "$last/bin/python"\n',
}
FAKE_PYTHON = r'''#!/usr/bin/env bash
echo "$*" >> "$HOME/python_calls"
case "$*" in
  *"sweeps.launch run"*)
    echo "fake launcher on $FAKE_HOST, WANDB_MODE=${WANDB_MODE:-unset}"
    # Stays running until the test creates $FAKE_LAUNCH_UNTIL (at most 2 minutes), if set.
    for _ in $(seq 2400); do [ -z "${FAKE_LAUNCH_UNTIL:-}" ] || [ -f "$FAKE_LAUNCH_UNTIL" ] && break; sleep 0.05; done
    # The first launch on a worker may exit differently (e.g. 75: preempted), later ones as FAKE_LAUNCH_EXIT.
    if [ -n "${FAKE_FIRST_LAUNCH_EXIT:-}" ] && [ ! -f "$HOME/launched_once" ]; then
      touch "$HOME/launched_once"; exit "$FAKE_FIRST_LAUNCH_EXIT"
    fi
    exit "${FAKE_LAUNCH_EXIT:-0}" ;;
  *"sweeps.launch status"*) echo '[{"status": "finished"}, {"status": "finished"}, {"status": "pending"}]' ;;
esac
'''


@pytest.fixture
def cloud(tmp_path):
    """A git project holding the tpu/ scripts, its pushed origin, and a fake cloud."""
    src = tmp_path / "project"
    shutil.copytree(REPO / "tpu", src / "tpu")
    (src / "sweeps" / "configs").mkdir(parents=True)
    (src / SWEEP).write_text("# a sweep file\n")
    git(src, "init", "-q", "-b", "main")
    git(src, "add", ".")
    git(src, "commit", "-q", "-m", "first")
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(origin))
    git(src, "remote", "add", "origin", str(origin))
    git(src, "fetch", "-q", "origin")

    fake = tmp_path / "cloud"
    (fake / "bin").mkdir(parents=True)
    for name in WORKERS:
        (fake / "workers" / name).mkdir(parents=True)
    gcloud = fake / "gcloud"
    gcloud.write_text(f"#!{sys.executable}\n{FAKE_GCLOUD}")
    (fake / "fake_python").write_text(FAKE_PYTHON)
    for name, text in FAKE_BIN.items():
        (fake / "bin" / name).write_text(text)
    for path in [gcloud, fake / "fake_python", *(fake / "bin").iterdir()]:
        path.chmod(0o755)
    (fake / "state").write_text("READY")

    class Cloud:
        project, tpu = src, src / "tpu"
        head = git(src, "rev-parse", "HEAD")
        # COLUMNS=80: `gcloud ... ssh --command` gives the worker no terminal, so tools
        # such as ps cut their output at 80 columns there, whatever the caller's terminal.
        env = clean_env(GCLOUD=str(gcloud), FAKE_CLOUD=str(fake), COLUMNS="80")

        def run(self, script, *args, **env):
            return run(script, *args, tpu_dir=self.tpu, env={**self.env, **env})

        def calls(self):
            lines = (fake / "calls.jsonl").read_text().splitlines()
            return [json.loads(line) for line in lines]

        def home(self, worker):
            return fake / "workers" / worker

        def set_state(self, state):
            (fake / "state").write_text(state)

    return Cloud()


def wait_for_exit_files(cloud, timeout=10.0):
    import time
    deadline = time.time() + timeout
    paths = [cloud.home(w) / "depth-width-scaling" / "logs" / "tiny" / f"{w}.exit" for w in WORKERS]
    while not all(p.exists() and p.read_text().strip() for p in paths):
        assert time.time() < deadline, "launcher never finished on the fake workers"
        time.sleep(0.05)
    return [p.read_text().strip() for p in paths]


def test_setup_defaults_to_local_head_and_origin(cloud):
    [argv] = commands(cloud.run("setup", *SLICE, "--dry-run"))
    remote = flag(argv, "--command")
    assert f"--detach {cloud.head}" in remote
    assert str(cloud.project.parent / "origin.git") in remote


def test_setup_without_origin_asks_for_repo_url(cloud):
    git(cloud.project, "remote", "remove", "origin")
    result = cloud.run("setup", *SLICE, "--dry-run")
    assert result.returncode != 0 and "--repo-url" in result.stderr


def push_new_commit(cloud):
    (cloud.project / "new.txt").write_text("x")
    git(cloud.project, "add", "new.txt")
    git(cloud.project, "commit", "-q", "-m", "second")
    git(cloud.project, "push", "-q", "origin", "main")
    return git(cloud.project, "rev-parse", "HEAD")


def test_setup_pins_the_commit_on_every_worker(cloud):
    first, second = cloud.head, push_new_commit(cloud)
    for commit, extra in ((first, ["--commit", first[:10]]), (second, [])):  # clone, then fetch
        result = cloud.run("setup", *SLICE, *extra)
        assert result.returncode == 0, result.stderr
        for worker in WORKERS:
            assert git(cloud.home(worker) / "depth-width-scaling", "rev-parse", "HEAD") == commit
            assert f"{worker}: installed at commit {commit}" in result.stdout
    assert "-m pip install --quiet -e .[tpu]" in (cloud.home("w1") / "python_calls").read_text()


def test_setup_then_launch_on_fake_workers(cloud):
    result = cloud.run("setup", *SLICE)
    assert result.returncode == 0, result.stderr
    result = cloud.run("launch", SWEEP, "--workdir", "gs://bucket/sweeps", *SLICE, "--env", "WANDB_MODE=online")
    assert result.returncode == 0, result.stderr
    assert wait_for_exit_files(cloud) == ["0", "0"]
    for worker in WORKERS:
        log = (cloud.home(worker) / "depth-width-scaling" / "logs" / "tiny" / f"{worker}.log").read_text()
        assert f"commit {cloud.head}" in log and f"fake launcher on {worker}, WANDB_MODE=online" in log
        calls = (cloud.home(worker) / "python_calls").read_text()
        assert f"-m sweeps.launch run {SWEEP} --workdir gs://bucket/sweeps" in calls

    status = cloud.run("status", SWEEP, "--workdir", "gs://bucket/sweeps", *SLICE)
    assert status.returncode == 0, status.stderr
    assert "w0 done" in status.stdout and "w1 done" in status.stdout
    assert "w1| fake launcher on w1" in status.stdout
    assert "finished: 2" in status.stdout and "pending: 1" in status.stdout and "total: 3" in status.stdout


def test_launch_refuses_a_worker_on_another_commit(cloud):
    assert cloud.run("setup", *SLICE).returncode == 0
    other = "f" * 40
    result = cloud.run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--commit", other)
    assert result.returncode != 0
    assert "run tpu/setup first" in result.stderr
    assert not (cloud.home("w0") / "depth-width-scaling" / "logs" / "tiny" / "w0.log").exists()
    missing = cloud.run("launch", "sweeps/configs/nope.py", "--workdir", "gs://b/s", *SLICE, "--dry-run")
    assert missing.returncode != 0 and "is not in commit" in missing.stderr


def test_setup_warns_about_an_unpushed_commit(cloud):
    (cloud.project / "new.txt").write_text("x")
    git(cloud.project, "add", "new.txt")
    git(cloud.project, "commit", "-q", "-m", "local only")
    result = cloud.run("setup", *SLICE, "--dry-run")
    assert result.returncode == 0 and "push it first" in result.stderr


def test_launch_leaves_a_running_launcher_alone(cloud):
    assert cloud.run("setup", *SLICE).returncode == 0
    args = ("launch", SWEEP, "--workdir", "gs://b/s", *SLICE)
    release = cloud.project.parent / "release-the-launchers"
    assert cloud.run(*args, FAKE_LAUNCH_UNTIL=str(release)).returncode == 0
    again = cloud.run(*args)
    assert again.returncode == 0 and "already running" in again.stdout
    release.touch()
    wait_for_exit_files(cloud)
    runs = (cloud.home("w0") / "python_calls").read_text().count("sweeps.launch run")
    assert runs == 1


def test_teardown_asks_unless_yes(cloud):
    refused = cloud.run("teardown", *SLICE)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert not (cloud.home("w0").parent.parent / "calls.jsonl").exists()
    assert cloud.run("teardown", *SLICE, "--yes").returncode == 0
    assert cloud.calls()[-1][:5] == ["compute", "tpus", "tpu-vm", "delete", "my-tpu"]


def relaunch(cloud, *flags, **env):
    return cloud.run("relaunch", SWEEP, "--workdir", "gs://bucket/sweeps", *SLICE,
                     "--accelerator-type", "v5litepod-16", "--spot", "--interval", "0", *flags, **env)


@pytest.mark.parametrize("queued", [False, True], ids=["tpu-vm", "queued"])
def test_relaunch_recreates_a_preempted_slice_and_finishes(cloud, queued):
    cloud.set_state("PREEMPTED")
    result = relaunch(cloud, *(["--queued"] if queued else []))
    assert result.returncode == 0, result.stderr
    assert "finished" in result.stderr
    calls = cloud.calls()
    resource = "queued-resources" if queued else "tpu-vm"
    delete = next(i for i, c in enumerate(calls) if c[2:4] == [resource, "delete"])
    create = next(i for i, c in enumerate(calls) if c[2:4] == [resource, "create"])
    setup = next(i for i, c in enumerate(calls) if c[3] == "ssh" and "git clone" in c[-1])
    launch = next(i for i, c in enumerate(calls) if c[3] == "ssh" and "sweeps.launch run" in c[-1])
    assert delete < create < setup < launch
    assert "--spot" in calls[create]
    for worker in WORKERS:  # re-created disks got the pinned commit again
        assert git(cloud.home(worker) / "depth-width-scaling", "rev-parse", "HEAD") == cloud.head


def test_relaunch_starts_idle_workers_without_recreating(cloud):
    assert cloud.run("setup", *SLICE).returncode == 0
    result = relaunch(cloud)
    assert result.returncode == 0, result.stderr
    verbs = [c[3] for c in cloud.calls()]
    assert "create" not in verbs and "delete" not in verbs
    assert wait_for_exit_files(cloud) == ["0", "0"]


def test_relaunch_stops_when_the_launcher_fails(cloud):
    cloud.set_state("MISSING")
    result = relaunch(cloud, FAKE_LAUNCH_EXIT="3")
    assert result.returncode == 1
    assert "failed on: w0 w1" in result.stderr


def launcher_calls(cloud, worker):
    return [line for line in (cloud.home(worker) / "python_calls").read_text().splitlines()
            if "sweeps.launch run" in line]


def test_launch_gives_each_worker_its_shard(cloud):
    assert cloud.run("setup", *SLICE).returncode == 0
    result = cloud.run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE)
    assert result.returncode == 0, result.stderr
    wait_for_exit_files(cloud)
    assert launcher_calls(cloud, "w0") == [f"-m sweeps.launch run {SWEEP} --workdir gs://b/s --shard 0/2"]
    assert launcher_calls(cloud, "w1") == [f"-m sweeps.launch run {SWEEP} --workdir gs://b/s --shard 1/2"]
    ssh = [c for c in cloud.calls() if c[3] == "ssh"]
    assert ["--worker=0" in ssh[-2], "--worker=1" in ssh[-1]] == [True, True]

    # Slice 1 of a group of 3 two-worker slices: its workers hold shares 2 and 3 of 6.
    for worker in WORKERS:
        (cloud.home(worker) / "depth-width-scaling" / "logs" / "tiny" / f"{worker}.exit").unlink()
    result = cloud.run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--group-shard", "1/3", "--", "--set",
                       "steps=5")
    assert result.returncode == 0, result.stderr
    wait_for_exit_files(cloud)
    assert launcher_calls(cloud, "w0")[-1].endswith("--set steps=5 --shard 2/6")
    assert launcher_calls(cloud, "w1")[-1].endswith("--set steps=5 --shard 3/6")


def test_launch_pod_wide_is_one_command_without_shard_and_shard_is_refused():
    [argv] = commands(run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--commit", COMMIT, "--dry-run",
                          "--", "--pod-wide"))
    assert "--shard" not in assert_ssh_all(argv)
    argv_list = commands(run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--commit", COMMIT, "--workers", "4",
                             "--dry-run"))
    assert [flag(a, "--worker") for a in argv_list] == ["0", "1", "2", "3"]
    assert [flag(a, "--command").split("--shard ")[1].split(";")[0] for a in argv_list] == ["0/4", "1/4", "2/4", "3/4"]
    refused = run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--dry-run", "--", "--shard", "0/2")
    assert refused.returncode == 2 and "tpu/group" in refused.stderr
    both = run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--group-shard", "0/2", "--dry-run", "--",
               "--pod-wide")
    assert both.returncode == 2 and "--pod-wide" in both.stderr


def test_relaunch_resumes_a_launcher_that_exited_75(cloud):
    assert cloud.run("setup", *SLICE).returncode == 0
    result = relaunch(cloud, FAKE_FIRST_LAUNCH_EXIT="75")
    assert result.returncode == 0, result.stderr
    assert "preempted (exit 75) on: w0 w1; resuming" in result.stderr and "finished" in result.stderr
    for worker in WORKERS:  # launched twice: preempted, then resumed to the end
        assert len(launcher_calls(cloud, worker)) == 2
    verbs = [c[3] for c in cloud.calls()]
    assert "create" not in verbs and "delete" not in verbs  # the slice itself was fine


def test_status_shows_a_preempted_worker(cloud):
    assert cloud.run("setup", *SLICE).returncode == 0
    assert cloud.run("launch", SWEEP, "--workdir", "gs://b/s", *SLICE, FAKE_LAUNCH_EXIT="75").returncode == 0
    assert wait_for_exit_files(cloud) == ["75", "75"]
    status = cloud.run("status", SWEEP, "--workdir", "gs://b/s", *SLICE)
    assert "w0 preempted" in status.stdout and "w1 preempted" in status.stdout


def test_group_runs_each_slice_with_its_name_and_share():
    argv_list = commands(run("group", "3", "launch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--commit", COMMIT,
                             "--workers", "1", "--dry-run", "--", "--set", "steps=5"))
    assert [a[5] for a in argv_list] == ["my-tpu-0", "my-tpu-1", "my-tpu-2"]
    assert [flag(a, "--command").split("--shard ")[1].split(";")[0] for a in argv_list] == ["0/3", "1/3", "2/3"]
    assert all("--set steps=5" in flag(a, "--command") for a in argv_list)
    creates = commands(run("group", "2", "create", "--name=my-tpu", "--zone", "z", "--project", "p",
                           "--accelerator-type", "v5litepod-8", "--spot", "--dry-run"))
    assert [a[5] for a in creates] == ["my-tpu-0", "my-tpu-1"] and all("--spot" in a for a in creates)
    cycles = commands(run("group", "2", "relaunch", SWEEP, "--workdir", "gs://b/s", *SLICE, "--accelerator-type",
                          "v5litepod-8", "--commit", COMMIT, "--repo-url", "u", "--workers", "1", "--dry-run"))
    assert {a[0] for a in cycles} == {"[my-tpu-0]", "[my-tpu-1]"}  # the babysitters run side by side
    launches = sorted(flag(a, "--command").split("--shard ")[1].split(";")[0] for a in cycles
                      if a[5] == "ssh" and "sweeps.launch run" in flag(a, "--command"))
    assert launches == ["0/2", "1/2"]
    assert run("group", "0", "launch", "--dry-run").returncode == 2
    assert "--name" in run("group", "2", "status", SWEEP, "--workdir", "gs://b/s", "--dry-run").stderr


# --- the SLURM example ---------------------------------------------------------

def run_sbatch(tmp_path, *args, **env):
    """Runs the sbatch script as SLURM would, with srun replaced by a recorder."""
    (tmp_path / "sweeps" / "configs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "sweeps" / "configs" / "paper.py").write_text("# sweep\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    srun.chmod(0o755)
    full_env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env)
    return subprocess.run([str(REPO / "gpu" / "slurm_sweep.sbatch"), *args], capture_output=True,
                          text=True, cwd=tmp_path, env=full_env, stdin=subprocess.DEVNULL, timeout=30)


SLURM_ENV = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2"}


def test_sbatch_host_parallel_and_pod_wide(tmp_path):
    result = run_sbatch(tmp_path, "--", "--set", "mesh.data=-1", **SLURM_ENV)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout.splitlines()[-1])
    assert argv == ["--output=logs/slurm-42/task-%t.log", "--cpus-per-task=8", "python", "-m", "sweeps.launch", "run",
                    "sweeps/configs/paper.py", "--workdir", f"{tmp_path}/runs", "--set", "mesh.data=-1"]
    assert (tmp_path / "logs" / "slurm-42").is_dir()

    result = run_sbatch(tmp_path, MODE="pod-wide", WORKDIR="gs://b/s", **SLURM_ENV)
    argv = json.loads(result.stdout.splitlines()[-1])
    assert "--kill-on-bad-exit=1" in argv[:3]
    assert argv[-3:] == ["--workdir", "gs://b/s", "--pod-wide"]
    argv = json.loads(run_sbatch(tmp_path, SLURM_CPUS_PER_TASK="12", **SLURM_ENV).stdout.splitlines()[-1])
    assert "--cpus-per-task=12" in argv[:2]  # srun gets the job's CPUs per task (Slurm >= 22.05 drops them)


def test_sbatch_rejects_bad_setups(tmp_path):
    outside = run_sbatch(tmp_path)
    assert outside.returncode != 0 and "sbatch" in outside.stderr
    bad_mode = run_sbatch(tmp_path, MODE="fast", **SLURM_ENV)
    assert bad_mode.returncode != 0 and "MODE" in bad_mode.stderr
    no_sweep = run_sbatch(tmp_path, SWEEP_FILE="nope.py", **SLURM_ENV)
    assert no_sweep.returncode != 0 and "nope.py" in no_sweep.stderr
