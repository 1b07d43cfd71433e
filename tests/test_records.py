"""Run records you can trust: one record type, leases between launchers, recovery from damage."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaling import lease, records, stopping, train
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def tiny(**changes) -> TrainConfig:
    base = TrainConfig(
        model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=32),
        data=DataConfig(source="builtin", seq_len=32),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=2),
        steps=20, batch_size=8, eval_every=0, eval_batches=2, checkpoint_every=5, keep_checkpoints=3,
        log_every=5, wandb_mode="disabled", name="tiny")
    return TrainConfig(**{**base.__dict__, **changes})


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true",
               PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    return env


SWEEP_FILE = """
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep

def sweep():
    base = TrainConfig(model=ModelConfig(head_dim=16, max_seq_len=32), data=DataConfig(seq_len=32),
                       optim=OptimConfig(peak_lr=3e-3, warmup_steps=2), steps={steps}, batch_size=8,
                       eval_every=0, eval_batches=2, checkpoint_every=5, log_every=5, wandb_mode="{wandb}")
    return Sweep(name="mini", base=base, depths=(1, 2), widths={{1: (16, 32), 2: (16,)}}, seeds=(0,),
                 multiple_of=16)
"""


def write_sweep(tmp_path, steps=20, wandb="disabled") -> Path:
    path = tmp_path / "mini.py"
    path.write_text(SWEEP_FILE.format(steps=steps, wandb=wandb))
    return path


def launch(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeps.launch", *map(str, args)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)


def run_dirs(workdir) -> list[Path]:
    return sorted(p for p in (Path(workdir) / "mini").iterdir() if p.is_dir() and p.name != "wandb")


def metric_steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------
# The record type


REQUIRED = dict(run_id="abc", status="finished", depth=2, width=32, seed=0, params_non_embedding=12 * 2 * 32**2,
                point_id="abc0", lr_rule="constant", peak_lr=1e-3, planned_steps=10, final_eval_loss=2.5)


def test_record_round_trip_and_validation(tmp_path):
    record = records.RunRecord(**REQUIRED, wall_seconds=1.5)
    records.write_record(tmp_path, record)
    assert records.read_record(tmp_path) == record
    assert json.loads((tmp_path / "result.json").read_text())["schema_version"] == records.SCHEMA_VERSION == 2
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed, not left behind
    with pytest.raises(ValueError, match="final_eval_loss"):
        record.replace(final_eval_loss=-1.0)
    with pytest.raises(ValueError, match="status"):
        record.replace(status="done")
    assert json.loads(record.replace(status="diverged", final_eval_loss=float("nan")).to_json())[
        "final_eval_loss"] is None


@pytest.mark.parametrize("field,value", [("point_id", ""), ("lr_rule", ""), ("peak_lr", 0.0),
                                         ("peak_lr", float("nan")), ("planned_steps", 0), ("planned_steps", 2.5)])
def test_version_2_requires_what_the_analysis_groups_runs_by(field, value):
    with pytest.raises(ValueError, match=f"^{field}="):
        records.RunRecord(**{**REQUIRED, field: value})
    with pytest.raises(TypeError, match=field):
        records.RunRecord(**{name: v for name, v in REQUIRED.items() if name != field})


@pytest.mark.parametrize("text,reason", [('{"run_id": "a", "sta', "not valid JSON"),
                                         ("[1, 2]", "expected an object"),
                                         ('{"run_id": "a", "schema_version": 2}', "missing"),
                                         ('{"run_id": "a", "status": "finished", "depth": 1, "width": 16, '
                                          '"seed": 0, "params_non_embedding": 3072, "point_id": "a0", '
                                          '"lr_rule": "constant", "peak_lr": 0.001, "planned_steps": 10, '
                                          '"final_eval_loss": -2, "schema_version": 2}', "final_eval_loss"),
                                         ('{"run_id": "a", "schema_version": 3}', "schema_version=3")])
def test_damaged_records_are_named(tmp_path, text, reason):
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(records.RecordError, match=reason) as caught:
        records.read_record(tmp_path)
    assert str(tmp_path / "result.json") in str(caught.value)


@pytest.mark.parametrize("version", [{"schema_version": 1}, {}])  # the earliest records have no version field
def test_a_version_1_record_is_refused_in_one_line_naming_the_migration(tmp_path, version):
    run_dir = tmp_path / "sweep" / "abc"
    run_dir.mkdir(parents=True)
    data = {k: v for k, v in json.loads(records.RunRecord(**REQUIRED).to_json()).items() if k != "schema_version"}
    (run_dir / "result.json").write_text(json.dumps({**data, **version}))
    with pytest.raises(records.OutdatedRecord) as caught:
        records.read_record(run_dir)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and str(run_dir / "result.json") in message
    assert message.endswith(f"python -m scaling.migrate_records {tmp_path / 'sweep'}")
    assert not isinstance(caught.value, records.RecordError)  # not "damaged": a launcher would train it again


def test_launcher_status_on_a_version_1_record_is_one_line_naming_the_migration(tmp_path):
    sweep_file = write_sweep(tmp_path)
    from sweeps import spec

    run = spec.load_sweep(sweep_file).expand().runs[0]
    run_dir = Path(str(run.run_dir(tmp_path / "runs")))
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"run_id": run.run_id, "status": "finished", "depth": 1,
                                                     "width": 16, "seed": 0, "params_non_embedding": 3072,
                                                     "final_eval_loss": 2.0}))
    done = launch("status", sweep_file, "--workdir", tmp_path / "runs", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"python -m sweeps.launch status: error: {run_dir}/result.json: "
                                                f"a run record of schema version 1, this code reads 2; upgrade the "
                                                f"records once with: python -m scaling.migrate_records "
                                                f"{run_dir.parent}"]


def test_find_records_lists_every_depth_in_the_callers_form(tmp_path, monkeypatch):
    for folder in ("a", "b/c", "b/c/d"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "result.json").write_text("{}")
    (tmp_path / "b" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert [str(p) for p in records.find_records("b")] == ["b/c/d/result.json", "b/c/result.json"]
    assert records.find_records("missing") == []


def test_records_import_without_jax():
    code = "import sys, scaling.records, scaling.lease; assert 'jax' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), check=True)


# ---------------------------------------------------------------------------
# Leases


def test_a_live_lease_blocks_and_a_stale_one_is_taken_over(tmp_path):
    holder = lease.Lease(tmp_path, heartbeat_seconds=0.05).acquire()
    with pytest.raises(lease.RunBusy, match="pid"):
        lease.Lease(tmp_path).acquire()
    time.sleep(0.3)
    assert (tmp_path / "lease.json").stat().st_mtime > time.time() - 60  # renewed by touching
    holder._stop.set()  # the holder stops renewing, as if hung
    holder._thread.join()
    renewed = (tmp_path / "lease.json").stat().st_mtime
    os.utime(tmp_path / "lease.json", (renewed - 1000, renewed - 1000))  # its last heartbeat, 1000 s ago
    with pytest.raises(lease.RunBusy):  # a lease renewed within stale_seconds is live
        lease.Lease(tmp_path, stale_seconds=2000).acquire()
    successor = lease.Lease(tmp_path, stale_seconds=60, heartbeat_seconds=0.05).acquire()
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == successor.token
    holder._stop.clear()
    holder._start_heartbeat()  # the old holder wakes up and finds the lease is no longer its own
    holder._thread.join(timeout=5)
    assert holder.lost
    holder.release()  # must not delete the successor's lease
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == successor.token
    successor.release()
    assert not (tmp_path / "lease.json").exists()


def test_a_gs_lease_is_taken_and_renewed_under_generation_preconditions(gcs):
    # Against the storage emulator through google-cloud-storage: its generations are the compare-and-swap.
    from google.cloud import storage

    run = f"{gcs}/sweep/run"
    holder = lease.Lease(run, heartbeat_seconds=3600).acquire()
    assert type(holder._store).__name__ == "_GcsStore"
    with pytest.raises(lease.RunBusy):
        lease.Lease(run).acquire()
    bucket = storage.Client().bucket(gcs[len("gs://"):])
    blob = bucket.get_blob("sweep/run/lease.json")  # a blob object stands for one generation
    store = holder._store
    # Compare-and-swap: of two writers holding the same generation, only the first wins.
    assert store.take_over(run, blob.generation, holder._content())
    assert not store.take_over(run, blob.generation, holder._content())
    # A heartbeat 1000 s old is stale: a successor takes over, and the old holder finds out.
    blob = bucket.get_blob("sweep/run/lease.json")
    blob.upload_from_string(json.dumps({**json.loads(blob.download_as_text()), "heartbeat": time.time() - 1000}),
                            if_generation_match=blob.generation)
    successor = lease.Lease(run, heartbeat_seconds=3600).acquire()
    assert json.loads(bucket.get_blob("sweep/run/lease.json").download_as_text())["token"] == successor.token
    assert holder.holder()["token"] == successor.token
    holder.release()  # not its lease any more: left alone
    assert bucket.get_blob("sweep/run/lease.json") is not None
    successor.release()
    assert bucket.get_blob("sweep/run/lease.json") is None


def test_a_holder_that_cannot_renew_gives_up_before_it_could_be_taken_over(tmp_path, monkeypatch):
    holder = lease.Lease(tmp_path, stale_seconds=0.4, heartbeat_seconds=0.05).acquire()

    def unreachable(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(holder._store, "read", unreachable)
    holder._thread.join(timeout=5)  # the heartbeat keeps retrying, then stops after stale_seconds / 2
    assert holder.lost and not holder.still_held()
    monkeypatch.undo()
    holder.release()


def test_a_trainer_whose_lease_was_taken_over_stops_without_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(lease.Lease, "still_held", lambda self: False)  # as if a successor took it
    with pytest.raises(stopping.LeaseLost):
        train.run(tiny(), tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run" / "result.json").exists()
    assert not [p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name[0].isdigit()]
    assert max(metric_steps(tmp_path / "run"), default=0) < 5  # nothing logged after the first check


def test_a_dead_holder_on_this_host_is_stale_at_once(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    import socket
    import time

    (tmp_path / "lease.json").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead),
                                                     "token": "x", "heartbeat": time.time()}))
    taken = lease.Lease(tmp_path).acquire()
    taken.release()


def test_two_launchers_on_one_workdir_train_each_run_once(tmp_path):
    sweep = write_sweep(tmp_path, steps=30, wandb="offline")
    procs = [subprocess.Popen([sys.executable, "-m", "sweeps.launch", "run", str(sweep), "--workdir", "runs"],
                              cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    dirs = run_dirs(tmp_path / "runs")
    assert len(dirs) == 3
    for run_dir in dirs:
        record = records.read_record(run_dir)
        assert record.status == "finished" and record.steps == 30
        steps = metric_steps(run_dir)
        assert steps == sorted(set(steps)) and steps[-1] == 30
        assert not list((run_dir / "checkpoints").glob("*tmp*"))
        assert not (run_dir / "lease.json").exists()
        assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1  # one training, one wandb run
        trained_by = [out.count(f"{record.name}: finished, eval loss") for out in outputs]
        assert sum(trained_by) == 1, outputs  # the other launcher skipped it or found it finished


# ---------------------------------------------------------------------------
# Resume past damage; refuse another config


def _largest_file(directory: Path) -> Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The tiny config trained once, undisturbed: (run directory, record)."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    return run_dir, train.run(tiny(), run_dir, show_progress=False)


@pytest.mark.parametrize("damage", ["truncate_array", "delete_state", "truncate_meta"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage, capsys, reference_run):
    config = tiny()
    reference_dir, reference = reference_run
    run_dir = tmp_path / "run"
    train.run(config, run_dir, show_progress=False)
    (run_dir / "result.json").unlink()  # as if the process died after its last checkpoint
    newest = run_dir / "checkpoints" / "20"
    if damage == "truncate_array":  # as a write cut off part-way leaves them
        for victim in (newest / "state").rglob("d/*"):
            victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif damage == "delete_state":
        import shutil

        shutil.rmtree(newest / "state")
    else:
        victim = next((newest / "meta").rglob("*metadata*"), None) or _largest_file(newest / "meta")
        victim.write_text(victim.read_text()[:5])
    resumed = train.run(config, run_dir, show_progress=False)
    assert "damaged checkpoint passed over, step 20" in capsys.readouterr().err
    assert [p.name.split("-")[0] for p in (run_dir / "checkpoints-set-aside").iterdir()] == ["20"]  # kept
    assert resumed.status == "finished" and resumed.steps == 20
    assert resumed.final_eval_loss == reference.final_eval_loss  # steps 15-20 redone exactly
    assert metric_steps(run_dir) == metric_steps(reference_dir)


def test_a_finished_run_dir_refuses_another_config(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(train.to_dict(tiny(steps=4))))
    cli = [sys.executable, "-m", "scaling.train", "--config", str(config_file), "--workdir", "run", "--no-progress"]
    subprocess.run(cli, cwd=tmp_path, env=_env(), check=True, capture_output=True)
    other = subprocess.run(cli + ["--set", "model.depth=2"], cwd=tmp_path, env=_env(), capture_output=True,
                           text=True)
    assert other.returncode == 2
    assert other.stderr.strip().count("\n") == 0 and "holds run" in other.stderr, other.stderr


# ---------------------------------------------------------------------------
# One bad run does not stop the sweep


def test_a_truncated_record_is_named_and_the_sweep_goes_on(tmp_path):
    sweep = write_sweep(tmp_path, steps=5)
    assert launch("run", sweep, "--workdir", "runs", cwd=tmp_path).returncode == 0
    damaged, removed = run_dirs(tmp_path / "runs")[:2]
    (damaged / "result.json").write_text('{"status": "fini')
    import shutil

    shutil.rmtree(removed)
    status = launch("status", sweep, "--workdir", "runs", cwd=tmp_path)
    assert status.returncode == 0 and str(damaged / "result.json") in status.stdout
    listed = launch("list", sweep, "--workdir", "runs", cwd=tmp_path)
    assert listed.returncode == 0 and "unreadable" in listed.stdout
    again = launch("run", sweep, "--workdir", "runs", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(records.read_record(d).status == "finished" for d in run_dirs(tmp_path / "runs"))


def test_an_unwritable_run_dir_is_reported_and_the_others_train(tmp_path):
    sweep = write_sweep(tmp_path, steps=5)
    listing = json.loads(launch("list", sweep, "--workdir", "runs", "--json", cwd=tmp_path).stdout)
    blocked = tmp_path / "runs" / "mini" / listing["runs"][0]["run_id"]
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where the run directory should be")
    out = launch("run", sweep, "--workdir", "runs", cwd=tmp_path)
    assert out.returncode == 1
    assert str(blocked) in out.stdout and "Traceback" not in out.stdout + out.stderr
    finished = [d for d in run_dirs(tmp_path / "runs") if records.read_record(d).status == "finished"]
    assert len(finished) == 2


@pytest.mark.parametrize("when", ["at_save", "in_background"])
def test_a_failed_checkpoint_stops_the_run_there_and_the_next_run_starts_clean(tmp_path, monkeypatch, capsys, when):
    """A checkpoint write that fails at step 5 stops that run at step 5 with one line; the next run
    logs into its own wandb run; the retried run ends with one metrics row per step."""
    from scaling import checkpoints
    from sweeps import launch as launcher

    sweep = write_sweep(tmp_path, steps=10, wandb="offline")
    monkeypatch.chdir(tmp_path)
    failing = {"dir": None}
    manager = checkpoints.ocp.CheckpointManager
    real_save, real_check = manager.save, manager.check_for_errors

    def save(self, step, *args, **kwargs):
        if failing["dir"] is None:
            failing["dir"] = str(self.directory)
        if str(self.directory) == failing["dir"] and when == "at_save":
            raise OSError(28, "No space left on device")
        return real_save(self, step, *args, **kwargs)

    def check_for_errors(self):  # what orbax reports when its background write failed
        if str(self.directory) == failing["dir"] and when == "in_background":
            raise OSError(28, "No space left on device")
        return real_check(self)

    monkeypatch.setattr(manager, "save", save)
    monkeypatch.setattr(manager, "check_for_errors", check_for_errors)
    assert launcher.main(["run", str(sweep), "--workdir", "runs"]) == 1
    out = capsys.readouterr().out
    failed_lines = [line for line in out.splitlines() if ": failed:" in line]
    assert len(failed_lines) == 1 and "checkpoint of step 5" in failed_lines[0] and "Traceback" not in out
    dirs = run_dirs(tmp_path / "runs")
    failed = next(d for d in dirs if str(d) in failing["dir"])
    assert records.read_record(failed).status == "failed"
    assert max(metric_steps(failed)) == 5  # stopped at the checkpoint, not after training
    assert "OSError" in (failed / "error.log").read_text()
    for run_dir in dirs:
        record = records.read_record(run_dir)
        if record.status == "finished":  # each later run has its own, complete wandb run
            assert [p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")] == [record.wandb_id]
            assert list((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    monkeypatch.setattr(manager, "save", real_save)
    monkeypatch.setattr(manager, "check_for_errors", real_check)
    assert launcher.main(["run", str(sweep), "--workdir", "runs"]) == 0
    assert records.read_record(failed).status == "finished"
    steps = metric_steps(failed)
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 10


# ---------------------------------------------------------------------------
# What the user reads


def test_the_progress_bar_clock_starts_after_compilation(tmp_path, capsys):
    import time

    from scaling.track import Tracker

    tracker = Tracker(tmp_path, total_steps=100, start_step=40, config={}, name="eta", mode="disabled",
                      show_progress=True, keep_until_step=40)
    opened = tracker.bar.start_t
    assert tracker.bar.postfix == "compiling"
    time.sleep(0.05)  # stands in for compilation
    tracker.advance()
    assert tracker.bar.start_t > opened  # the ETA is measured from the first trained step
    assert tracker.bar.n == 41 and "compiling" not in (tracker.bar.postfix or "")
    tracker.close()
    shown = capsys.readouterr().err
    # a resumed run never shows a count below where it resumed, nor a negative rate
    assert " 0/100" not in shown and "-" not in shown.replace("eta", "")


def test_piped_output_closes_quietly(tmp_path):
    sweep = write_sweep(tmp_path)
    # `true` exits without reading, so the launcher writes into a closed pipe.
    done = subprocess.run(["bash", "-c", f"{sys.executable} -m sweeps.launch list {sweep} --workdir runs | true"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


# ---------------------------------------------------------------------------
# Bad input: one line naming the field or argument


@pytest.mark.parametrize("setting, named", [
    ("model.num_heads=abc", "model.num_heads"), ("model=3", "model"), ("steps=1e400", "steps"),
    ("steps=abc", "steps"), ("optim.peak_lr=inf", "optim.peak_lr"), ("steps=10.7", "steps")])
def test_a_bad_override_is_one_line_naming_the_field(setting, named, tmp_path, capsys):
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path / "run"), "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_a_config_file_with_a_fractional_step_count_is_refused(tmp_path, capsys):
    config = train.to_dict(tiny())
    config["steps"] = 10.7
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert train.main(["--config", str(tmp_path / "config.json"), "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "steps" in err and "10.7" in err, err


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path / "taken")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    sweep = write_sweep(tmp_path)
    done = launch("run", sweep, "--workdir", "taken", cwd=tmp_path)
    assert done.returncode == 2 and "is a file" in done.stderr and "Traceback" not in done.stderr


def test_wall_seconds_add_up_over_resumed_segments(tmp_path, reference_run):
    import shutil

    reference_dir, first = reference_run
    shutil.copytree(reference_dir, tmp_path / "run")
    (tmp_path / "run" / "result.json").unlink()  # as if killed after the last checkpoint
    # earlier segments that took 1000 s, so the sum cannot be mistaken for the last segment alone
    last = max((tmp_path / "run" / "checkpoints").iterdir(), key=lambda path: int(path.name))
    meta = json.loads((last / "meta" / "metadata").read_text())
    checkpointed = meta["wall_seconds"] = 1000.0
    (last / "meta" / "metadata").write_text(json.dumps(meta))
    started = time.perf_counter()
    resumed = train.run(tiny(), tmp_path / "run", show_progress=False)
    segment = time.perf_counter() - started
    # the time after the last checkpoint died with the kill; what was checkpointed is kept and
    # the resumed segment is added (it is not compared with the uninterrupted run's total,
    # which also counted the lost time)
    assert resumed.steps == first.steps
    assert checkpointed < resumed.wall_seconds <= checkpointed + segment
    assert metric_steps(tmp_path / "run") == metric_steps(reference_dir)  # the last step once, not twice
    assert resumed.final_train_loss == first.final_train_loss is not None


def test_a_resumed_tracker_merges_into_the_restored_step(tmp_path):
    from scaling.track import Tracker

    rows = [{"step": s, "loss": 5.0 - s / 10} for s in range(0, 35, 5)]  # a segment that reached step 30
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3')
    tracker = Tracker(tmp_path, total_steps=40, start_step=20, config={}, name="t", mode="disabled",
                      show_progress=False, keep_until_step=20)
    assert tracker.pending(20) == {"loss": 3.0}
    tracker.log(20, {"eval_loss": 2.5})
    tracker.log(25, {"loss": 2.9})
    tracker.close()
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written] == [0, 5, 10, 15, 20, 25]
    assert written[4] == {"step": 20, "loss": 3.0, "eval_loss": 2.5}
