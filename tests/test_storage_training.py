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
import uuid
from pathlib import Path

import fsspec
import pytest
from etils import epath

import helpers
import tiny
from gcs_emulator import checkpoint_steps, env_for, keys, metric_steps
from scaling.config import DataConfig
from scaling.data import pipeline as data, __main__ as data_cli, token_cache
from scaling.store import records, storage
from sweeps import launch


def logged_through(run_dir: str) -> int:
    """The last step in the run's metrics objects, from one listing (0 if none yet)."""
    names = [key for key in keys(run_dir) if key.startswith("metrics/")] if epath.Path(run_dir).exists() else []
    return max((int(key.rsplit("-", 1)[1].split(".")[0]) for key in names), default=0)


def copy_run(source: str, destination: str) -> None:
    """Copy a run directory within the storage (object by object, as written)."""
    fs, root = fsspec.core.url_to_fs(source)
    fs.invalidate_cache()
    for name in fs.find(root):
        fs.copy(name, destination.rstrip("/") + "/" + name[len(root) + 1:])
    fs.invalidate_cache()


@pytest.fixture(scope="module")
def gs_reference(gcs_emulator):
    """``tiny.config()`` trained once, undisturbed, on gs:// in this process: (run URL, run record).
    Tests that damage a run in the bucket copy it there instead of training again."""
    with pytest.MonkeyPatch.context() as patch:  # as the gcs fixture sets storage up for one test
        patch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
        for name in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"):
            patch.delenv(name, raising=False)
        storage.use_emulator()
        bucket = f"reference-{uuid.uuid4().hex[:12]}"
        gcs_emulator.create_bucket(bucket)
        run_dir = f"gs://{bucket}/run"
        return run_dir, tiny.run(tiny.config(), run_dir)


def test_a_whole_sweep_on_gs_is_read_back_by_status_and_the_analysis(gcs, gcs_emulator, tmp_path, capsys,
                                                                     monkeypatch, own_cache_home):
    from analysis.__main__ import main as analysis

    tokens = f"{gcs}/tokens/builtin"
    data_cli.main(token_cache.cache_command(DataConfig(source="builtin", seq_len=32), tokens).split()[3:] + ["--quiet"])
    sweep_file = tiny.write_sweep(tmp_path, "micro")
    workdir = f"{gcs}/sweeps"
    # The sweep's own process finds the storage through STORAGE_EMULATOR_HOST alone.
    done = helpers.run_module("sweeps.launch", "run", sweep_file, "--workdir", workdir, "--set",
                              f"data.cache_dir={tokens}", env=env_for(gcs_emulator.url, tmp_path), cwd=Path.cwd(),
                              timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== sweep micro: 4 finished (of 4 runs)" in done.stdout

    stored = keys(f"{workdir}/micro")
    run_ids = {key.split("/")[0] for key in stored if key.endswith("/result.json")}
    assert len(run_ids) == 4 and "sweep.json" in stored
    for run_id in run_ids:
        run_dir = f"{workdir}/micro/{run_id}"
        record = records.read_record(run_dir)
        assert record.status == "finished" and record.steps == tiny.STEPS
        assert {f"{run_id}/config.json", f"{run_id}/checkpoints/{tiny.STEPS}/state/_METADATA",
                f"{run_id}/checkpoints/{tiny.CHECKPOINT_EVERY}/meta/metadata"} <= stored
        assert f"{run_id}/lease.json" not in stored  # released
        assert metric_steps(run_dir) == list(range(tiny.STEPS + 1))  # initial eval, then one row per step

    capsys.readouterr()
    assert launch.main(["status", str(sweep_file), "--workdir", workdir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"finished": 4}
    assert analysis(["fit", f"{workdir}/micro", "--json", "--loss-std", "0.05"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == 4

    # A classification run of the log-length sweep, cut short, read back by `analysis log-length`.
    tiny.on_one_device(monkeypatch)
    length = launch.main(["run", str(helpers.REPO / "sweeps/configs/log_length.py"), "--workdir", workdir, "--only",
                          "first-n10-standard-L2-d16-s0", "--no-progress", "--set", "steps=4", "--set",
                          "checkpoint_every=2", "--set", "eval_batches=1", "--set", "log_every=2"])
    assert length == 0, capsys.readouterr()
    capsys.readouterr()
    assert analysis(["log-length", f"{workdir}/log_length", "--format", "json"]) == 0
    [cell] = json.loads(capsys.readouterr().out)["cells"]
    assert (cell["task"], cell["train_length"], cell["arm"], cell["seeds"]) == ("first", 10, "standard", 1)


def test_sigkill_mid_run_then_resume_matches_an_undisturbed_run(gcs, gcs_emulator, tmp_path):
    config, env = tiny.config(), env_for(gcs_emulator.url, tmp_path)
    # The reference runs in the same kind of process as the killed run (one CPU device); where it is stored
    # changes nothing it computes.
    reference = str(tmp_path / "reference")
    helpers.run(tiny.train_command(config, reference, tmp_path / "reference.json"), env=env, cwd=Path.cwd(),
                check=True)
    killed = f"{gcs}/killed"
    proc, _ = tiny.paused_run(config, killed, tmp_path, pause_step=6, environment=env, stderr=subprocess.STDOUT,
                              start_new_session=True)
    # Killed once rows past the checkpoint of step 4 are in the bucket, so the resume must cut them.
    tiny.wait_for(lambda: 4 in checkpoint_steps(killed) and logged_through(killed) > 4, 300, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert records.read_record(killed) is None and tiny.STEPS not in checkpoint_steps(killed)
    restarted = helpers.run(tiny.train_command(config, killed, tmp_path / "config.json"), env=env, cwd=Path.cwd())
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert records.read_record(killed).final_eval_loss == records.read_record(reference).final_eval_loss
    steps = metric_steps(killed)
    assert steps == metric_steps(reference) == list(range(tiny.STEPS + 1))  # one row per step, none repeated


@pytest.mark.parametrize("damage", ["truncate_array", "delete_state"])
def test_a_damaged_newest_checkpoint_in_the_bucket_falls_back_and_is_set_aside(gcs, damage, capsys, gs_reference):
    reference_dir, reference = gs_reference
    run_dir = f"{gcs}/run"
    copy_run(reference_dir, run_dir)
    epath.Path(f"{run_dir}/result.json").unlink()  # as if the process died after its last checkpoint
    fs, root = fsspec.core.url_to_fs(f"{run_dir}/checkpoints/{tiny.STEPS}")
    if damage == "truncate_array":  # every array object cut to half, as a write cut off part-way
        victims = [name for name in fs.find(root) if "/state/" in name and "/d/" in name]
        assert victims
        for name in victims:
            data = fs.cat_file(name)
            fs.pipe_file(name, data[: len(data) // 2])
    else:  # the state item's objects gone, the rest of the step left
        fs.rm(f"{root}/state", recursive=True)
    fs.invalidate_cache()
    resumed = tiny.run(tiny.config(), run_dir)
    assert f"damaged checkpoint passed over, step {tiny.STEPS}" in capsys.readouterr().err
    aside = keys(f"{run_dir}/checkpoints-set-aside")
    assert {key.split("/")[0].split("-")[0] for key in aside} == {str(tiny.STEPS)}  # moved aside in the bucket, kept
    assert any(key.endswith("commit_success.txt") for key in aside)
    assert resumed.status == "finished" and resumed.steps == tiny.STEPS
    assert resumed.final_eval_loss == reference.final_eval_loss  # steps 5-8 redone exactly
    assert metric_steps(run_dir) == list(range(tiny.STEPS + 1))


def test_two_launchers_on_one_gs_workdir_train_each_run_once(gcs, gcs_emulator, tmp_path):
    sweep_file = tiny.write_sweep(tmp_path, "micro", grid="depths=(1, 2), widths={1: (16, 32), 2: (16,)}")
    env = env_for(gcs_emulator.url, tmp_path)
    command = helpers.module_command("sweeps.launch", "run", sweep_file, "--workdir", f"{gcs}/sweeps")
    procs = [helpers.start(command, env=env, cwd=Path.cwd(), merge_stderr=True) for _ in range(2)]
    outputs = [done.stdout for done in helpers.finish(procs, timeout=600)]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    run_dirs = sorted({key.split("/")[0] for key in keys(f"{gcs}/sweeps/micro") if key.endswith("/result.json")})
    assert len(run_dirs) == 3
    for run_id in run_dirs:
        record = records.read_record(f"{gcs}/sweeps/micro/{run_id}")
        assert record.status == "finished" and record.steps == tiny.STEPS
        trained_by = [out.count(f"{record.name}: finished, eval loss") for out in outputs]
        assert sum(trained_by) == 1, outputs  # the other launcher skipped it or found it finished
        assert metric_steps(f"{gcs}/sweeps/micro/{run_id}") == list(range(tiny.STEPS + 1))


POD_DRIVER = '''
import os, sys
from scaling import train
from scaling.store import checkpoints

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
    driver = tmp_path / "pod_driver.py"
    driver.write_text(POD_DRIVER)
    command = tiny.train_command(config, run_dir, tmp_path / "config.json")
    command[1:3] = [str(driver)]  # the driver instead of `-m scaling.train`
    port = helpers.free_port()
    return helpers.finish([helpers.start(command + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                                    "--process-id", str(i)], env=env, cwd=Path.cwd())
                           for i in range(2)], timeout=400)


def test_two_processes_agree_on_the_checkpoint_to_resume_from(gcs, gcs_emulator, tmp_path, gs_reference):
    # The run to resume: one written by a single process (restoring reshards it for the two).
    config, run_dir = tiny.config(), f"{gcs}/pod"
    copy_run(gs_reference[0], run_dir)
    env = env_for(gcs_emulator.url, tmp_path, devices=1)
    epath.Path(f"{run_dir}/result.json").unlink()
    fs, root = fsspec.core.url_to_fs(f"{run_dir}/checkpoints/8")
    for name in [n for n in fs.find(root) if "/state/" in n and "/d/" in n]:  # step 8 damaged for everyone
        fs.pipe_file(name, fs.cat_file(name)[:10])

    # Process 1 cannot read step 4, which process 0 reads: both stop, one line each, nothing set aside.
    refused = _two_processes(config, run_dir, tmp_path, dict(env, FAIL_RESTORE="1:4"))
    assert [r.returncode for r in refused] == [1, 1], [r.stderr[-8000:] for r in refused]
    for result in refused:
        [line] = [line for line in result.stderr.splitlines() if line.startswith("python -m scaling.train: error")]
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
