"""Tests of gpu/slurm_sweep.sbatch: shellcheck, and the srun command it builds.

The script runs as SLURM would run it (SLURM_* variables set), with ``srun``
replaced by a recorder that prints its arguments as JSON. No SLURM needed.
"""

import json
import os
import sys

import helpers
from helpers import REPO

SBATCH = REPO / "gpu" / "slurm_sweep.sbatch"


def test_shellcheck_clean():
    helpers.assert_shellcheck_clean(SBATCH, "-x")


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
    full_env = helpers.clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env)
    return helpers.run([SBATCH, *args], cwd=tmp_path, env=full_env, timeout=30)


SLURM_ENV = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2"}


def test_sbatch_host_parallel_and_pod_wide(tmp_path):
    result = run_sbatch(tmp_path, "--", "--set", "mesh.data=-1", **SLURM_ENV)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout.splitlines()[-1])
    assert argv == ["--output=logs/slurm-42/task-%t.log", "--open-mode=append", "--cpus-per-task=8", "python", "-m",
                    "sweeps.launch", "run",
                    "sweeps/configs/paper.py", "--workdir", f"{tmp_path}/runs", "--set", "mesh.data=-1"]
    assert (tmp_path / "logs" / "slurm-42").is_dir()

    result = run_sbatch(tmp_path, MODE="pod-wide", WORKDIR="gs://b/s", **SLURM_ENV)
    argv = json.loads(result.stdout.splitlines()[-1])
    assert "--kill-on-bad-exit=1" in argv[:4]
    assert argv[-3:] == ["--workdir", "gs://b/s", "--pod-wide"]
    argv = json.loads(run_sbatch(tmp_path, SLURM_CPUS_PER_TASK="12", **SLURM_ENV).stdout.splitlines()[-1])
    assert "--cpus-per-task=12" in argv[:3]  # srun gets the job's CPUs per task (Slurm >= 22.05 drops them)


def test_sbatch_rejects_bad_setups(tmp_path):
    outside = run_sbatch(tmp_path)
    assert outside.returncode != 0 and "sbatch" in outside.stderr
    bad_mode = run_sbatch(tmp_path, MODE="fast", **SLURM_ENV)
    assert bad_mode.returncode != 0 and "MODE" in bad_mode.stderr
    no_sweep = run_sbatch(tmp_path, SWEEP_FILE="nope.py", **SLURM_ENV)
    assert no_sweep.returncode != 0 and "nope.py" in no_sweep.stderr


def test_sbatch_warns_before_the_time_limit_and_appends_logs_on_requeue():
    """SIGTERM well before the time limit (a launcher needs time to save a checkpoint; KillWait alone is often
    30 s), sent to the tasks (no B:, which would signal only the batch shell); logs appended, not truncated,
    when a requeued job (same id, same log names) runs again."""
    import re

    header = [line for line in SBATCH.read_text().splitlines() if line.startswith("#SBATCH")]
    signals = [re.fullmatch(r"#SBATCH --signal=TERM@(\d+)", line) for line in header]
    (seconds,) = [int(match.group(1)) for match in signals if match]
    assert 60 <= seconds <= 600
    assert "#SBATCH --open-mode=append" in header and "#SBATCH --requeue" in header
