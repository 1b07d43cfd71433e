"""``sweeps.launch run --pack K``: the runs of one shape train as one program, and a pack killed or stopped
mid-run resumes with every run where it was.

The reference is the same sweep packed and never interrupted, in a launcher subprocess as well (one
device, the same program): a resumed pack must give its losses bitwise.
"""

import os
import signal
from pathlib import Path

import pytest

import helpers
import tiny
from scaling.store import records
from sweeps import launch, spec

GRID = "depths=(1,), widths={1: (16,)}, seeds=(0, 1, 2)"


def run_cli(*args):
    return helpers.run_module("sweeps.launch", *args, env=tiny.env())


def run_dirs(sweep_file, workdir) -> list[Path]:
    runs = sorted(spec.load_sweep(sweep_file).expand().runs, key=lambda run: run.name)
    return [Path(str(run.run_dir(workdir))) for run in runs]


@pytest.fixture(scope="module")
def packed_sweep(tmp_path_factory):
    """(sweep file, run directories of the same sweep packed and never interrupted)."""
    root = tmp_path_factory.mktemp("packed")
    sweep_file = tiny.write_sweep(root, "packed", GRID)
    workdir = root / "reference"
    done = run_cli("run", sweep_file, "--workdir", workdir, "--pack", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pack of 3 runs as one program" in done.stdout
    return sweep_file, run_dirs(sweep_file, workdir)


def check_resumed_exactly(dirs, reference_dirs) -> None:
    for run_dir, expected_dir in zip(dirs, reference_dirs):
        record, expected = records.read_record(run_dir), records.read_record(expected_dir)
        assert (record.status, record.steps, record.pack_size) == ("finished", tiny.STEPS, 3)
        assert tiny.metric_steps(run_dir) == list(range(tiny.STEPS + 1))  # one row per step
        assert tiny.losses(run_dir) == tiny.losses(expected_dir)
        assert record.final_eval_loss == expected.final_eval_loss


def paused_launcher(tmp_path, sweep_file):
    """A packed launcher into ``tmp_path/runs``, paused once the first run logged step 6 (every run has
    checkpointed step 4): (process, pause file, run directories)."""
    dirs = run_dirs(sweep_file, tmp_path / "runs")
    pause = tmp_path / "paused"
    command = tiny.paused_command(pause, f"{dirs[0].name}@6", "sweeps.launch", "run", sweep_file,
                                  "--workdir", tmp_path / "runs", "--pack", "3")
    proc = helpers.start(command, env=tiny.env(), merge_stderr=True, start_new_session=True)
    tiny.wait_for(lambda: pause.exists() and all((d / "checkpoints" / "4").exists() for d in dirs), 300, proc)
    return proc, pause, dirs


def rerun(sweep_file, tmp_path):
    again = run_cli("run", sweep_file, "--workdir", tmp_path / "runs", "--pack", "3")
    assert again.returncode == 0, again.stderr[-3000:]
    return again


def test_a_pack_killed_mid_run_resumes_every_run_exactly(tmp_path, packed_sweep):
    sweep_file, reference_dirs = packed_sweep
    proc, _, dirs = paused_launcher(tmp_path, sweep_file)
    os.killpg(proc.pid, signal.SIGKILL)  # the machine dies mid-pack
    proc.wait()
    assert not any((d / "result.json").exists() for d in dirs)
    assert "resuming: p1 at step 4" in rerun(sweep_file, tmp_path).stdout
    check_resumed_exactly(dirs, reference_dirs)


def test_sigterm_checkpoints_every_run_of_the_pack_and_a_rerun_finishes_them(tmp_path, packed_sweep):
    sweep_file, reference_dirs = packed_sweep
    proc, pause, dirs = paused_launcher(tmp_path, sweep_file)
    os.kill(proc.pid, signal.SIGTERM)  # a preemption notice, while every run is between steps 6 and 7
    pause.unlink()
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 75, output[-3000:]
    for run_dir in dirs:  # each run said so, was recorded stopped and saved the step it stopped after
        assert f"{records.read_record(run_dir).name}: stopped by SIGTERM after step 6" in output
        assert records.read_record(run_dir).status == "stopped" and (run_dir / "checkpoints" / "6").exists()
    rerun(sweep_file, tmp_path)
    check_resumed_exactly(dirs, reference_dirs)


def test_a_sweep_files_pack_default_packs_in_process(tmp_path, capsys, monkeypatch):
    sweep_file = tmp_path / "packed.py"
    sweep_file.write_text(tiny.sweep_text("packed", GRID + ", pack=2", sweep_file))
    tiny.on_one_device(monkeypatch)  # the run left alone trains with train.run
    from scaling.run import train as pack_train

    real = pack_train.run_pack
    sizes = []

    def one_device(configs, run_dirs, **kwargs):
        sizes.append(len(configs))
        return real(configs, run_dirs, **{**kwargs, "devices": tiny.one_device()})

    monkeypatch.setattr(pack_train, "run_pack", one_device)
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert sizes == [2]  # two seeds together; the third alone (train.run)
    assert "== sweep packed: 3 finished (of 3 runs)" in out
    assert sorted(records.read_record(d).pack_size for d in run_dirs(sweep_file, tmp_path / "runs")) == [1, 2, 2]
