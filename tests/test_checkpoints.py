"""Checkpoints: a damaged newest one falls back to the previous, a failed write stops the run there,
and the wall time adds up over resumed segments."""

import json
import shutil
import time
from pathlib import Path

import pytest

import tiny
from scaling.store import records


def _largest_file(directory: Path) -> Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["truncate_array", "delete_state", "truncate_meta"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage, capsys, tiny_reference):
    reference_dir, reference = tiny_reference
    run_dir = tmp_path / "run"
    shutil.copytree(reference_dir, run_dir)
    (run_dir / "result.json").unlink()  # as if the process died after its last checkpoint
    newest = run_dir / "checkpoints" / str(tiny.STEPS)
    if damage == "truncate_array":  # as a write cut off part-way leaves them
        for victim in (newest / "state").rglob("d/*"):
            victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif damage == "delete_state":
        shutil.rmtree(newest / "state")
    else:
        victim = next((newest / "meta").rglob("*metadata*"), None) or _largest_file(newest / "meta")
        victim.write_text(victim.read_text()[:5])
    resumed = tiny.run(tiny.config(), run_dir)
    assert f"damaged checkpoint passed over, step {tiny.STEPS}" in capsys.readouterr().err
    set_aside = [p.name.split("-")[0] for p in (run_dir / "checkpoints-set-aside").iterdir()]
    assert set_aside == [str(tiny.STEPS)]  # kept
    assert resumed.status == "finished" and resumed.steps == tiny.STEPS
    assert resumed.final_eval_loss == reference.final_eval_loss  # the steps after checkpoint 4 redone exactly
    assert tiny.metric_steps(run_dir) == tiny.metric_steps(reference_dir)


@pytest.mark.parametrize("when", ["at_save", "in_background"])
def test_a_failed_checkpoint_stops_the_run_there_and_the_next_run_starts_clean(tmp_path, monkeypatch, capsys, when):
    """A checkpoint write that fails at step 4 stops that run at step 4 with one line; the next run
    logs into its own wandb run; the retried run ends with one metrics row per step."""
    from scaling.store import checkpoints
    from sweeps import launch as launcher

    sweep = tiny.write_sweep(tmp_path, grid="depths=(1,), widths={1: (16, 32)}", wandb="offline")
    monkeypatch.chdir(tmp_path)
    tiny.on_one_device(monkeypatch)
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
    assert len(failed_lines) == 1 and "checkpoint of step 4" in failed_lines[0] and "Traceback" not in out
    dirs = tiny.run_dirs(tmp_path / "runs")
    failed = next(d for d in dirs if str(d) in failing["dir"])
    assert records.read_record(failed).status == "failed"
    assert max(tiny.metric_steps(failed)) == 4  # stopped at the checkpoint, not after training
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
    steps = tiny.metric_steps(failed)
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == tiny.STEPS


def test_wall_and_training_seconds_add_up_over_resumed_segments(tmp_path, tiny_reference):
    reference_dir, first = tiny_reference
    shutil.copytree(reference_dir, tmp_path / "run")
    (tmp_path / "run" / "result.json").unlink()  # as if killed after the last checkpoint
    # earlier segments that took 1000 s, so the sum cannot be mistaken for the last segment alone
    saved = sorted((tmp_path / "run" / "checkpoints").iterdir(), key=lambda path: int(path.name))
    shutil.rmtree(saved[-1])  # killed before the last step's checkpoint: the resumed segment trains steps
    last = saved[-2]
    meta = json.loads((last / "meta" / "metadata").read_text())
    checkpointed = meta["wall_seconds"] = 1000.0
    trained = meta["train_seconds"] = 500.0  # of which training steps
    (last / "meta" / "metadata").write_text(json.dumps(meta))
    started = time.perf_counter()
    resumed = tiny.run(tiny.config(), tmp_path / "run")
    segment = time.perf_counter() - started
    # the time after the last checkpoint died with the kill; what was checkpointed is kept and
    # the resumed segment is added (it is not compared with the uninterrupted run's total,
    # which also counted the lost time)
    assert resumed.steps == first.steps
    assert checkpointed < resumed.wall_seconds <= checkpointed + segment
    # so do the training seconds, which leave out what the segment spent loading data and compiling
    assert trained < resumed.train_seconds < trained + segment
    assert resumed.train_seconds - trained < resumed.wall_seconds - checkpointed
    assert tiny.metric_steps(tmp_path / "run") == tiny.metric_steps(reference_dir)  # the last step once, not twice
    assert resumed.final_train_loss == first.final_train_loss is not None
