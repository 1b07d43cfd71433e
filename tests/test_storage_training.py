"""A whole sweep and the trainer's runs on gs:// against a local Cloud Storage emulator.

Every process here finds storage through ``STORAGE_EMULATOR_HOST`` alone
(``gcs_emulator.emulator_env`` removes what the project derives from it),
talks to fake-gcs-server (the ``gcs`` fixture, conftest.py) through gcsfs,
google-cloud-storage and tensorstore, and runs in an empty local directory
that must stay empty. Runs: a whole sweep read back by status and the analysis, a SIGKILL and a
restart, damaged checkpoints in the bucket, two launchers at once, two processes as one job.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
from etils import epath

from gcs_emulator import emulator_env
from scaling import records, token_cache, train
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from scaling.track import read_metrics

REPO = Path(__file__).resolve().parents[1]


MICRO_SWEEP = '''
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep():
    base = TrainConfig(model=ModelConfig(head_dim=16, max_seq_len=32), data=DataConfig(source="builtin", seq_len=32),
                       optim=OptimConfig(peak_lr=3e-3, warmup_steps=2), steps={steps}, batch_size=8, eval_every=0,
                       eval_batches=1, checkpoint_every=3, log_every=1, wandb_mode="disabled")
    return Sweep(name="micro", base=base, depths=(1, 2), widths={widths}, seeds=(0,), multiple_of=16)
'''


def tiny(**changes) -> TrainConfig:
    base = dict(model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=32),
                data=DataConfig(source="builtin", seq_len=32), optim=OptimConfig(peak_lr=3e-3, warmup_steps=2),
                steps=8, batch_size=8, eval_every=0, eval_batches=1, checkpoint_every=4, keep_checkpoints=3,
                log_every=1, wandb_mode="disabled", name="tiny")
    return TrainConfig(**{**base, **changes})


def env_for(url: str, tmp_path, **extra) -> dict:
    """A child's environment: storage at ``url`` (STORAGE_EMULATOR_HOST only), CPU, no wandb."""
    env = emulator_env(url)
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="disabled", PYTHONPATH=str(REPO),
               XDG_CACHE_HOME=str(tmp_path / "xdg"), **extra)
    env.pop("XLA_FLAGS", None)
    return env


def python(*args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def keys(prefix: str) -> set[str]:
    """Object names under ``prefix`` (a gs:// URL), relative to it."""
    fs, root = fsspec.core.url_to_fs(prefix)
    fs.invalidate_cache()
    return {name[len(root) + 1:] for name in fs.find(root)}


def checkpoint_steps(run_dir: str) -> list[int]:
    return sorted({int(key.split("/")[1]) for key in keys(run_dir) if key.startswith("checkpoints/")
                   and key.split("/")[1].isdigit() and key.endswith("commit_success.txt")})


def train_cli(config: TrainConfig, workdir: str, tmp_path) -> list[str]:
    config_file = tmp_path / f"config-{abs(hash(workdir))}.json"
    config_file.write_text(json.dumps(train.to_dict(config)))
    return [sys.executable, "-m", "scaling.train", "--config", str(config_file), "--workdir", workdir, "--no-progress"]


def wait_for(predicate, timeout: float, proc=None, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.communicate()[0][-3000:]}")
        time.sleep(interval)
    raise AssertionError("timed out")


def logged_through(run_dir: str) -> int:
    """The last step in the run's metrics objects, from one listing (0 if none yet)."""
    names = [key for key in keys(run_dir) if key.startswith("metrics/")] if epath.Path(run_dir).exists() else []
    return max((int(key.rsplit("-", 1)[1].split(".")[0]) for key in names), default=0)


def metric_steps(run_dir: str) -> list[int]:
    fs, _ = fsspec.core.url_to_fs(run_dir)
    fs.invalidate_cache()
    return [row["step"] for row in read_metrics(run_dir)]


def test_a_whole_sweep_on_gs_is_read_back_by_status_and_the_analysis(gcs, gcs_emulator, tmp_path):
    env = env_for(gcs_emulator.url, tmp_path)
    tokens = f"{gcs}/tokens/builtin"
    cache = token_cache.cache_command(DataConfig(source="builtin", seq_len=32), tokens).split()[1:]
    built = python(*cache, "--quiet", env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    sweep_file = tmp_path / "micro.py"
    sweep_file.write_text(MICRO_SWEEP.format(steps=6, widths="{1: (16, 32), 2: (16, 32)}"))
    workdir = f"{gcs}/sweeps"
    done = python("-m", "sweeps.launch", "run", sweep_file, "--workdir", workdir, "--set",
                  f"data.cache_dir={tokens}", env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== sweep micro: 4 finished (of 4 runs)" in done.stdout

    stored = keys(f"{workdir}/micro")
    run_ids = {key.split("/")[0] for key in stored if key.endswith("/result.json")}
    assert len(run_ids) == 4 and "sweep.json" in stored
    for run_id in run_ids:
        run_dir = f"{workdir}/micro/{run_id}"
        record = records.read_record(run_dir)
        assert record.status == "finished" and record.steps == 6
        assert {f"{run_id}/config.json", f"{run_id}/checkpoints/6/state/_METADATA",
                f"{run_id}/checkpoints/3/meta/metadata"} <= stored
        assert f"{run_id}/lease.json" not in stored  # released
        assert metric_steps(run_dir) == [0, 1, 2, 3, 4, 5, 6]  # initial eval, then one row per step

    status = python("-m", "sweeps.launch", "status", sweep_file, "--workdir", workdir, "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"] == {"finished": 4}
    fit = python("-m", "analysis", "fit", f"{workdir}/micro", "--json", "--loss-std", "0.05", env=env)
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)["runs"] == 4

    # A classification run of the log-length sweep, cut short, read back by `analysis log-length`.
    length = python("-m", "sweeps.launch", "run", REPO / "sweeps/configs/log_length.py", "--workdir", workdir,
                    "--only", "first-n10-standard-L2-d16-s0", "--set", "steps=4", "--set", "checkpoint_every=2",
                    "--set", "eval_batches=1", "--set", "log_every=2", env=env)
    assert length.returncode == 0, length.stdout[-3000:] + length.stderr[-3000:]
    table = python("-m", "analysis", "log-length", f"{workdir}/log_length", "--format", "json", env=env)
    assert table.returncode == 0, table.stderr
    [cell] = json.loads(table.stdout)["cells"]
    assert (cell["task"], cell["train_length"], cell["arm"], cell["seeds"]) == ("first", 10, "standard", 1)


def test_sigkill_mid_run_then_resume_matches_an_undisturbed_run(gcs, gcs_emulator, tmp_path):
    config = tiny(steps=40, checkpoint_every=10, log_every=1)
    env = env_for(gcs_emulator.url, tmp_path)
    reference = f"{gcs}/reference"
    assert subprocess.run(train_cli(config, reference, tmp_path), env=env, capture_output=True).returncode == 0
    killed = f"{gcs}/killed"
    proc = subprocess.Popen(train_cli(config, killed, tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # Kill once rows past the checkpoint of step 10 are in the bucket, so the resume must cut them.
    wait_for(lambda: 10 in checkpoint_steps(killed) and logged_through(killed) >= 14, 300, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert records.read_record(killed) is None and 40 not in checkpoint_steps(killed)
    restarted = subprocess.run(train_cli(config, killed, tmp_path), env=env, capture_output=True, text=True)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert records.read_record(killed).final_eval_loss == records.read_record(reference).final_eval_loss
    steps = metric_steps(killed)
    assert steps == metric_steps(reference) == list(range(41))  # one row per step, none repeated


@pytest.mark.parametrize("damage", ["truncate_array", "delete_state"])
def test_a_damaged_newest_checkpoint_in_the_bucket_falls_back_and_is_set_aside(gcs, damage, capsys):
    config = tiny(steps=8, checkpoint_every=4)
    reference = train.run(config, f"{gcs}/reference", show_progress=False)
    run_dir = f"{gcs}/run"
    train.run(config, run_dir, show_progress=False)
    epath.Path(f"{run_dir}/result.json").unlink()  # as if the process died after its last checkpoint
    fs, root = fsspec.core.url_to_fs(f"{run_dir}/checkpoints/8")
    if damage == "truncate_array":  # every array object cut to half, as a write cut off part-way
        victims = [name for name in fs.find(root) if "/state/" in name and "/d/" in name]
        assert victims
        for name in victims:
            data = fs.cat_file(name)
            fs.pipe_file(name, data[: len(data) // 2])
    else:  # the state item's objects gone, the rest of the step left
        fs.rm(f"{root}/state", recursive=True)
    fs.invalidate_cache()
    resumed = train.run(config, run_dir, show_progress=False)
    assert "damaged checkpoint passed over, step 8" in capsys.readouterr().err
    aside = keys(f"{run_dir}/checkpoints-set-aside")
    assert {key.split("/")[0].split("-")[0] for key in aside} == {"8"}  # moved aside in the bucket, kept
    assert any(key.endswith("commit_success.txt") for key in aside)
    assert resumed.status == "finished" and resumed.steps == 8
    assert resumed.final_eval_loss == reference.final_eval_loss  # steps 5-8 redone exactly
    assert metric_steps(run_dir) == list(range(9))


def test_two_launchers_on_one_gs_workdir_train_each_run_once(gcs, gcs_emulator, tmp_path):
    sweep_file = tmp_path / "micro.py"
    sweep_file.write_text(MICRO_SWEEP.format(steps=12, widths="{1: (16, 32), 2: (16,)}"))
    env = env_for(gcs_emulator.url, tmp_path)
    command = [sys.executable, "-m", "sweeps.launch", "run", str(sweep_file), "--workdir", f"{gcs}/sweeps"]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    run_dirs = sorted({key.split("/")[0] for key in keys(f"{gcs}/sweeps/micro") if key.endswith("/result.json")})
    assert len(run_dirs) == 3
    for run_id in run_dirs:
        record = records.read_record(f"{gcs}/sweeps/micro/{run_id}")
        assert record.status == "finished" and record.steps == 12
        trained_by = [out.count(f"{record.name}: finished, eval loss") for out in outputs]
        assert sum(trained_by) == 1, outputs  # the other launcher skipped it or found it finished
        assert metric_steps(f"{gcs}/sweeps/micro/{run_id}") == list(range(13))


POD_DRIVER = '''
import os, sys
from scaling import checkpoints, train

# "PROCESS:STEP": what that process read of that step is rejected (a transient error, seen by one host only)
fail = os.environ.get("FAIL_RESTORE")
if fail:
    process, step = map(int, fail.split(":"))
    real = checkpoints.Checkpoints._restore

    def _restore(self, s):
        import jax
        restored = real(self, s)  # orbax's own restore ends in a barrier of all processes: pass it first
        if jax.process_index() == process and s == step:
            raise OSError("injected read error")
        return restored

    checkpoints.Checkpoints._restore = _restore
sys.exit(train.main(sys.argv[1:]))
'''


def _two_processes(config, run_dir, tmp_path, env) -> list[subprocess.CompletedProcess]:
    from gcs_emulator import free_port

    driver = tmp_path / "pod_driver.py"
    driver.write_text(POD_DRIVER)
    command = train_cli(config, run_dir, tmp_path)
    command[1:3] = [str(driver)]  # the driver instead of `-m scaling.train`
    port = free_port()
    procs = [subprocess.Popen(command + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                         "--process-id", str(i)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=400)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def test_two_processes_agree_on_the_checkpoint_to_resume_from(gcs, gcs_emulator, tmp_path):
    config = tiny(steps=8, checkpoint_every=4)
    run_dir = f"{gcs}/pod"
    env = env_for(gcs_emulator.url, tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    first = _two_processes(config, run_dir, tmp_path, env)
    assert [r.returncode for r in first] == [0, 0], [r.stderr[-2000:] for r in first]
    epath.Path(f"{run_dir}/result.json").unlink()
    fs, root = fsspec.core.url_to_fs(f"{run_dir}/checkpoints/8")
    for name in [n for n in fs.find(root) if "/state/" in n and "/d/" in n]:  # step 8 damaged for everyone
        fs.pipe_file(name, fs.cat_file(name)[:10])

    # Process 1 cannot read step 4, which process 0 reads: both stop, one line each, nothing set aside.
    refused = _two_processes(config, run_dir, tmp_path, dict(env, FAIL_RESTORE="1:4"))
    assert [r.returncode for r in refused] == [1, 1], [r.stderr[-8000:] for r in refused]
    for result in refused:
        [line] = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert "process(es) [1] could not read checkpoint step 4" in line and "which process 0 read whole" in line
    assert not epath.Path(f"{run_dir}/checkpoints-set-aside").exists()

    # Without the injected error: step 8 is damaged on process 0's reading, both resume from 4, step 8 is
    # set aside once, in the bucket.
    resumed = _two_processes(config, run_dir, tmp_path, env)
    assert [r.returncode for r in resumed] == [0, 0], [r.stderr[-2000:] for r in resumed]
    assert all("damaged checkpoint passed over, step 8" in r.stderr for r in resumed)
    aside = {key.split("/")[0] for key in keys(f"{run_dir}/checkpoints-set-aside")}
    assert len(aside) == 1 and next(iter(aside)).startswith("8-")
    record = records.read_record(run_dir)
    assert record.status == "finished" and record.steps == 8
    assert metric_steps(run_dir) == list(range(9))
