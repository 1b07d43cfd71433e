"""The sweep launcher: real sweeps (run, kill, rerun, diverge), hosts and shares, status and list, runs
that fail without stopping the sweep, and one-line errors."""

import json
import os
import shutil
import signal
import sys
import textwrap
from pathlib import Path

import pytest

import helpers
import tiny
from helpers import REPO
from scaling import train as train_cli
from scaling.run import train
from scaling.store import records
from sweeps import launch, spec

write_sweep = tiny.write_sweep  # (directory, name, grid, steps=..., ...): a sweep file of the tiny runs


def run_cli(*args, env=None):
    """``python -m sweeps.launch args`` in a trainer's environment (default ``tiny.env()``)."""
    return helpers.run_module("sweeps.launch", *args, env=env or tiny.env())


def results(sweep_dir: Path) -> dict:
    """Run name -> result record of every run directory under ``sweep_dir``."""
    records = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    return {record["name"]: record for record in records}


def write_record(run, workdir, status="finished", loss=3.0, **fields):
    """Write ``run``'s record by hand, as the trainer would (no training)."""
    from scaling.store import records

    config = run.config
    record = records.RunRecord(
        run_id=run.run_id, status=status, depth=config.model.depth, width=config.model.width, seed=config.seed,
        params_non_embedding=12 * config.model.depth * config.model.width ** 2, name=run.name,
        sweep=config.sweep_name, final_eval_loss=loss if status == "finished" else None,
        point_id=run.run_id, lr_rule=config.optim.lr_rule, peak_lr=config.optim.peak_lr, planned_steps=config.steps,
        **fields)
    run_dir = Path(str(run.run_dir(workdir)))
    run_dir.mkdir(parents=True, exist_ok=True)
    if status == "finished":  # a finished run's metrics log holds its final loss (scaling.store.record_checks)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": record.steps, "eval_loss": loss}) + "\n")
    records.write_record(run_dir, record)
    return record


def test_end_to_end_sweep_is_read_by_the_analysis(tmp_path, capsys, monkeypatch):
    from analysis.__main__ import main as analysis

    # μP-style rates (optim.lr_rule='mup') as in the shipped sweeps; one seed, so no transition test.
    sweep_file = write_sweep(tmp_path, "e2e", wandb="offline", optim="peak_lr=3e-3, lr_rule='mup', base_width=32")
    workdir = tmp_path / "runs"
    done = run_cli("run", sweep_file, "--workdir", workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== sweep e2e: 4 finished (of 4 runs)" in done.stdout
    for name in ("L1-d16-s0", "L1-d32-s0", "L2-d16-s0", "L2-d32-s0"):
        assert name in done.stdout
    assert "analysis:" in done.stdout and "not enough points" in done.stdout  # one seed: no noise estimate
    # stderr is a pipe here, as in a log file: plain progress lines, no bar redraws or escape codes.
    assert "\x1b" not in done.stderr and "\r" not in done.stderr, done.stderr[-2000:]
    steps = f"{tiny.STEPS}/{tiny.STEPS} steps (100%)"
    assert f"L1-d16-s0: {steps}" in done.stderr and "sweep e2e: 4/4 runs (100%)" in done.stderr

    sweep_dir = workdir / "e2e"
    records = results(sweep_dir)
    assert {r["status"] for r in records.values()} == {"finished"} and len(records) == 4
    assert all(r["sweep"] == "e2e" for r in records.values())  # the wandb group of every run
    assert {r["width"]: r["peak_lr_hidden"] for r in records.values()} == {16: 6e-3, 32: 3e-3}

    assert launch.main(["status", str(sweep_file), "--workdir", str(workdir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {"finished": 4} and data["total"] == 4
    assert {run["name"]: run["final_eval_loss"] for run in data["runs"]} == {
        name: record["final_eval_loss"] for name, record in records.items()}
    assert set(data["runs"][0]) >= {"name", "run_id", "depth", "width", "params", "seed", "status", "final_eval_loss"}

    assert analysis(["fit", str(sweep_dir), "--json", "--loss-std", "0.05"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"] == 4 and report["skipped"] == {}
    assert [(t["shallow_depth"], t["deep_depth"]) for t in report["transitions"]] == [(1, 2)]

    # The sweep config is saved beside the runs and logged to wandb as a "sweep" run of the same group.
    expected = spec.load_sweep(sweep_file)
    assert json.loads((sweep_dir / "sweep.json").read_text()) == json.loads(json.dumps(expected.to_dict()))
    from scaling.run.track import transaction_log_records

    [log] = sweep_dir.glob(f"wandb/offline-run-*-sweep-{expected.digest()}/run-*.wandb")
    [run_record] = [r.run for r in transaction_log_records(log) if r.WhichOneof("record_type") == "run"]
    assert (run_record.run_group, run_record.job_type) == ("e2e", "sweep")
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
    assert config["depths"] == [1, 2] and len(config["runs"]) == 4

    # Running the finished sweep again trains nothing and adds no wandb run, the sweep's included.
    wandb_runs = sorted(p.name for p in sweep_dir.glob("**/offline-run-*"))
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == 0
    again = capsys.readouterr()
    assert "0 to train" in again.out, again.err[-3000:]
    assert sorted(p.name for p in sweep_dir.glob("**/offline-run-*")) == wandb_runs
    assert "\x1b" not in again.err and "\r" not in again.err


def test_killed_sweep_resumes_without_retraining_finished_runs(tmp_path):
    # Cheapest first: L1-d16 finishes, then L2-d16 trains; the launcher is killed once L2-d16 has
    # checkpointed step 4 and logged past it (it waits there, tests/pause.py).
    sweep_file = write_sweep(tmp_path, "killed", "depths=(1, 2), widths={1: (16,), 2: (16,)}")
    workdir = tmp_path / "runs"
    sweep = spec.load_sweep(sweep_file)
    small, big = sorted(sweep.expand().runs, key=lambda run: run.flops)
    small_dir, big_dir = Path(str(small.run_dir(workdir))), Path(str(big.run_dir(workdir)))
    pause = tmp_path / "paused"
    command = tiny.paused_command(pause, f"{big_dir.name}@6", "sweeps.launch", "run", sweep_file, "--workdir",
                                  workdir)
    proc = helpers.start(command, env=tiny.env(), merge_stderr=True, start_new_session=True)
    tiny.wait_for(lambda: pause.exists() and (big_dir / "checkpoints" / "4").exists(), 300, proc)
    assert (small_dir / "result.json").exists()
    os.killpg(proc.pid, signal.SIGKILL)  # the machine dies: launcher and everything it started
    proc.wait()
    assert not (big_dir / "result.json").exists()
    small_bytes, small_mtime = (small_dir / "result.json").read_bytes(), (small_dir / "result.json").stat().st_mtime_ns

    again = run_cli("run", sweep_file, "--workdir", workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 to train, 1 resumable, 1 finished" in again.stdout
    assert "== sweep killed: 2 finished (of 2 runs)" in again.stdout
    # The finished run was not touched...
    assert (small_dir / "result.json").read_bytes() == small_bytes
    assert (small_dir / "result.json").stat().st_mtime_ns == small_mtime
    # ...and the interrupted one continued from its checkpoint instead of starting over.
    record = json.loads((big_dir / "result.json").read_text())
    assert record["status"] == "finished" and record["steps"] == tiny.STEPS
    rows = [json.loads(line) for line in (big_dir / "metrics.jsonl").read_text().splitlines()]
    loss_steps = [row["step"] for row in rows if "loss" in row]
    assert loss_steps.count(1) == 1  # a restart from scratch would log step 1 twice
    assert [row["step"] for row in rows] == sorted({row["step"] for row in rows})  # one row per step
    assert len([row for row in rows if "eval_loss" in row and row["step"] == 0]) == 1
    assert sorted(set(loss_steps)) == list(range(1, tiny.STEPS + 1))


def test_diverging_run_is_recorded_and_the_others_finish(tmp_path, capsys, monkeypatch):
    sweep_file = write_sweep(tmp_path, "diverge", "depths=(1,), widths={1: (16,)}, lr_grid=(3e-3, 1e9)")
    workdir = tmp_path / "runs"
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert "L1-d16-s0-lr1e+09: diverged" in out
    assert "L1-d16-s0-lr3e-03: finished" in out
    assert "== sweep diverge: 1 diverged, 1 finished (of 2 runs)" in out
    records = results(workdir / "diverge")
    assert records["L1-d16-s0-lr1e+09"]["status"] == "diverged"
    assert records["L1-d16-s0-lr3e-03"]["status"] == "finished"
    # A rerun does not retry the diverged run (it would diverge again) and trains nothing.
    assert launch.main(["dry-run", str(sweep_file), "--workdir", str(workdir)]) == 0
    assert "would train 0 run(s)" in capsys.readouterr().out


def test_failures_are_recorded_and_preemption_stops_the_sweep(tmp_path, capsys, monkeypatch):
    # The control flow around train.run, with a stand-in trainer (real training is covered above).
    from scaling.run import train
    from scaling.run.stopping import PREEMPTED_EXIT_CODE, Preempted

    sweep_file = write_sweep(tmp_path, "flow", "depths=(1,), widths={1: (16, 32, 48)}")
    workdir = tmp_path / "runs"
    calls = []

    by_name = {run.name: run for run in spec.load_sweep(sweep_file).expand().runs}

    def fake_run(config, run_dir, show_progress=True, devices=None, stop=None, raise_if_finished=False):
        calls.append(config.name)
        if config.model.width == 16:  # the trainer records the failure, then re-raises
            write_record(by_name[config.name], workdir, status="failed",
                         error="RuntimeError: RESOURCE_EXHAUSTED: out of memory")
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nallocation details")
        if config.model.width == 32 and behaviour == "preempt":
            raise Preempted("stopped by SIGTERM after step 5; checkpoint saved")
        if config.model.width == 32 and behaviour == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while no trainer handler is installed
        return write_record(by_name[config.name], workdir, loss=4.0, steps=12)

    monkeypatch.setattr(train, "run", fake_run)
    behaviour = "preempt"
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == PREEMPTED_EXIT_CODE
    assert calls == ["L1-d16-s0", "L1-d32-s0"]  # cheapest first; the sweep stopped at the preemption
    out = capsys.readouterr().out
    assert "L1-d16-s0: failed: RuntimeError: RESOURCE_EXHAUSTED: out of memory (run directory" in out
    assert "L1-d32-s0: stopped by SIGTERM" in out and "== sweep" not in out
    failed = results(workdir / "flow")["L1-d16-s0"]
    assert (failed["status"], failed["error"]) == ("failed", "RuntimeError: RESOURCE_EXHAUSTED: out of memory")

    calls.clear()
    behaviour = "sigterm"
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == PREEMPTED_EXIT_CODE
    assert calls == ["L1-d16-s0", "L1-d32-s0"]  # the failed run is retried; stop after the run in hand
    assert "stopping after L1-d32-s0: SIGTERM received" in capsys.readouterr().out

    calls.clear()
    behaviour = "finish"
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == 1  # a run of the share failed
    assert calls == ["L1-d16-s0", "L1-d48-s0"]
    assert "== sweep flow: 1 failed, 2 finished (of 3 runs)" in capsys.readouterr().out


def test_the_result_line_says_which_time_is_training_and_which_wall(tmp_path, capsys, monkeypatch):
    sweep_file = write_sweep(tmp_path, "timed", "depths=(1,), widths={1: (16,)}")
    workdir = tmp_path / "runs"
    (run,) = spec.load_sweep(sweep_file).expand().runs

    def fake_run(config, run_dir, show_progress=True, devices=None, stop=None, raise_if_finished=False):
        return write_record(run, workdir, steps=500, train_seconds=19.2, wall_seconds=60.4)

    monkeypatch.setattr(train, "run", fake_run)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == 0
    assert ("L1-d16-s0: finished, eval loss 3.0000, 500 steps in 19 s of training (+41 s loading data, compiling, "
            "final evaluation and checkpoint; 60 s wall)") in capsys.readouterr().out
    assert launch.main(["status", str(sweep_file), "--workdir", str(workdir), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    assert (listed["train_seconds"], listed["wall_seconds"]) == (19.2, 60.4)


def test_the_table_explains_budget_beside_n(tmp_path, capsys):
    budgets = write_sweep(tmp_path, "budgets", "depths=(1,), budgets=(2e4,)")  # width 48: N = 2.76e4
    assert launch.main(["list", str(budgets), "--workdir", str(tmp_path / "runs")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the footnote is wrapped
    assert "2.76e+04" in out and "2e+04" in out
    assert "budget: the N the sweep file asks for" in out and "multiple of 16 channels" in out
    widths = write_sweep(tmp_path, "widths", "depths=(1,), widths={1: (16,)}")  # no budgets: nothing to explain
    assert launch.main(["list", str(widths), "--workdir", str(tmp_path / "runs")]) == 0
    assert "budget:" not in capsys.readouterr().out


def test_shard_flag_selects_the_same_share(tmp_path, capsys):
    sweep_file = write_sweep(tmp_path, "sharded", "depths=(1, 2, 4), budgets=(3e4, 1e5, 3e5), seeds=(0, 1)")
    runs = spec.load_sweep(sweep_file).expand().runs
    names = []
    for index in range(3):
        assert launch.main(["list", str(sweep_file), "--workdir", str(tmp_path), "--shard", f"{index}/3",
                            "--json"]) == 0
        listed = [run["name"] for run in json.loads(capsys.readouterr().out)["runs"]]
        assert listed == [run.name for run in spec.shard(runs, index, 3)]
        names += listed
    assert sorted(names) == sorted(run.name for run in runs)


def test_only_narrows_the_sweep_before_it_is_shared(tmp_path, capsys):
    sweep_file = write_sweep(tmp_path, "narrowed", "depths=(1, 2, 4), budgets=(3e4, 1e5, 3e5), seeds=(0, 1)")
    runs = spec.load_sweep(sweep_file).expand().runs
    wanted = [run for run in runs if run.depth in (2, 4) and run.seed == 0]
    names = []
    for index in range(2):
        assert launch.main(["list", str(sweep_file), "--workdir", str(tmp_path), "--only", "L2-*-s0",
                            "--only", "L4-*-s0", "--shard", f"{index}/2", "--json"]) == 0
        listed = [run["name"] for run in json.loads(capsys.readouterr().out)["runs"]]
        assert listed == [run.name for run in spec.shard(wanted, index, 2)]
        names += listed
    assert sorted(names) == sorted(run.name for run in wanted)
    assert launch.main(["list", str(sweep_file), "--workdir", str(tmp_path), "--only", "L3-*"]) == 2
    assert "--only L3-*: matches none of the 18 run names" in capsys.readouterr().err


def test_dry_run_takes_the_host_share_and_list_shows_all(tmp_path, capsys, monkeypatch):
    sweep_file = write_sweep(tmp_path, "hosts", "depths=(1, 2), budgets=(3e4, 1e5), seeds=(0, 1)")
    runs = spec.load_sweep(sweep_file).expand().runs
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "h0,h1,h2")
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    assert launch.main(["dry-run", str(sweep_file), "--workdir", str(tmp_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["share"].startswith("share 1/3 (this host)")
    assert [run["name"] for run in plan["runs"]] == [run.name for run in spec.shard(runs, 1, 3)]
    assert launch.main(["dry-run", str(sweep_file), "--workdir", str(tmp_path), "--json", "--pod-wide"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == len(runs)
    assert launch.main(["list", str(sweep_file), "--workdir", str(tmp_path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == len(runs)


def test_run_takes_the_host_share_then_hides_the_other_hosts(tmp_path, capsys, monkeypatch):
    sweep_file = write_sweep(tmp_path, "hostrun", "depths=(1, 2), budgets=(3e4, 1e5), seeds=(0, 1)")
    runs = spec.load_sweep(sweep_file).expand().runs
    workdir = tmp_path / "runs"
    mine = spec.shard(runs, 1, 3)
    for run in mine:  # this host's share is already done, so `run` trains nothing here
        write_record(run, workdir)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "SLURM_"))}
    environ.update(TPU_WORKER_HOSTNAMES="h0,h1,h2", TPU_WORKER_ID="1")
    monkeypatch.setattr(os, "environ", environ)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert f"share 1/3 (this host): {len(mine)} of {len(runs)} runs; 0 to train" in out
    assert (environ["TPU_WORKER_HOSTNAMES"], environ["TPU_PROCESS_BOUNDS"]) == ("localhost", "1,1,1")
    assert not (workdir / "hostrun" / "sweep.json").exists()  # the first share writes it
    assert [Path(str(run.run_dir(workdir))).exists() for run in runs] == [run in mine for run in runs]


@pytest.mark.parametrize("flags, shown", [([], True), (["--no-progress"], False)])
def test_no_progress_reaches_the_trainer(tmp_path, capsys, monkeypatch, flags, shown):
    from scaling.run import train

    sweep_file = write_sweep(tmp_path, "quiet", "depths=(1,), widths={1: (16,)}")
    seen = []

    def fake_run(config, run_dir, show_progress=True, devices=None, stop=None, raise_if_finished=False):
        seen.append(show_progress)
        raise RuntimeError("not trained in this test")

    monkeypatch.setattr(train, "run", fake_run)
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs"), *flags]) == 1
    assert seen == [shown]
    err = capsys.readouterr().err
    assert ("sweep quiet: 1/1 runs" in err) == shown


def _fake_runs(tmp_path):
    sweep_file = write_sweep(tmp_path, "status", "depths=(1, 2), widths={1: (16, 32), 2: (16, 32)}")
    runs = spec.load_sweep(sweep_file).expand().runs
    workdir = tmp_path / "runs"
    finished, resumable, failed, _ = (run.run_dir(workdir) for run in runs)
    write_record(runs[0], workdir, loss=2.5)
    (resumable / "checkpoints" / "20").mkdir(parents=True)
    (resumable / "checkpoints" / "30.orbax-checkpoint-tmp-1").mkdir()  # unfinished save: not a checkpoint
    write_record(runs[2], workdir, status="failed", error="boom")
    return sweep_file, workdir, runs


def test_status_json_counts_and_lists_runs(tmp_path, capsys):
    sweep_file, workdir, runs = _fake_runs(tmp_path)
    assert launch.main(["status", str(sweep_file), "--workdir", str(workdir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {"pending": 1, "resumable": 1, "failed": 1, "finished": 1}
    by_name = {run["name"]: run for run in data["runs"]}
    assert list(by_name) == [run.name for run in runs]
    first = by_name[runs[0].name]
    assert (first["status"], first["final_eval_loss"], first["depth"], first["width"], first["params"]) == (
        "finished", 2.5, 1, 16, 12 * 16 ** 2)
    assert by_name[runs[1].name]["checkpoint_step"] == 20
    assert [by_name[run.name]["status"] for run in runs] == ["finished", "resumable", "failed", "pending"]
    # The table shows each run's folder beside its name.
    assert launch.main(["status", str(sweep_file), "--workdir", str(workdir)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [runs[0].name, runs[0].run_id] in [row[:2] for row in rows]
    # The plan: train the pending one, resume one, retry the failed one, skip the finished one.
    assert launch.main(["dry-run", str(sweep_file), "--workdir", str(workdir)]) == 0
    assert "would train 3 run(s): 1 new, 1 resumed, 1 retried; skip 1 finished" in capsys.readouterr().out


def test_list_prints_one_row_per_run(tmp_path, capsys):
    sweep_file, workdir, runs = _fake_runs(tmp_path)
    (workdir / "status" / "0123456789ab").mkdir()
    (workdir / "status" / "0123456789ab" / "config.json").write_text("{}")
    assert launch.main(["list", str(sweep_file), "--workdir", str(workdir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["name", "folder", "L", "d", "N", "(12·L·d²)", "budget", "seed", "status", "eval",
                                "loss"]
    rows = {line.split()[0]: line.split() for line in lines[2:6]}
    assert rows[runs[0].name][:5] == [runs[0].name, runs[0].run_id, "1", "16", "3.07e+03"]
    assert rows[runs[0].name][-2:] == ["finished", "2.5000"]
    assert rows[runs[1].name][-3:-1] == ["resumable", "@20"]
    assert rows[runs[3].name][-2:] == ["pending", "-"]
    assert "1 run directory" in lines[-1] and "belong to no run of this sweep" in lines[-1]


def test_listing_never_starts_a_jax_backend(tmp_path):
    # `status` may run on a TPU host whose chips a training process holds.
    paper = str(REPO / "sweeps" / "configs" / "paper.py")
    code = textwrap.dedent(f"""
        from sweeps import launch
        from jax._src import xla_bridge
        for command in ("list", "status", "dry-run"):
            assert launch.main([command, {paper!r}, "--workdir", {str(tmp_path)!r}]) == 0
        assert not xla_bridge._backends, xla_bridge._backends
    """)
    done = helpers.run_python(code, env=tiny.env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "L48-d1600-s2" in done.stdout


@pytest.mark.parametrize("value", ["3/3", "1/0", "a/b", "-1/2", "1", "2/1", "0/2/3"])
def test_bad_shard_values_give_one_error_line(tmp_path, capsys, value):
    sweep_file = write_sweep(tmp_path, "unit", "depths=(1,), widths={1: (16,)}")
    with pytest.raises(SystemExit) as stop:
        launch.main(["list", str(sweep_file), f"--shard={value}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--shard wants I/N" in err


def test_sweep_file_errors_give_one_error_line(tmp_path, capsys):
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    raising = tmp_path / "raising.py"
    raising.write_text("def sweep():\n    raise RuntimeError('bad grid\\nsecond line')\n")
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def sweep():\n    return 42\n")
    invalid = write_sweep(tmp_path, "invalid", "depths=(1,), budgets=(1e5,), widths={1: (16,)}")
    cases = {tmp_path / "missing.py": "no such file", empty: "defines neither sweep() nor SWEEP",
             raising: "RuntimeError: bad grid", wrong: "gave a int, not a sweeps.spec.Sweep",
             invalid: "give exactly one of budgets"}
    for path, message in cases.items():
        assert launch.main(["list", str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err and str(path) in err, err
    grid_field = write_sweep(tmp_path, "unit", "depths=(1,), widths={1: (16,)}")
    assert launch.main(["list", str(grid_field), "--set", "model.depth=3"]) == 2
    assert "set per run by the sweep grid" in capsys.readouterr().err
    # Through the real entry point too: one line, no traceback.
    done = run_cli("status", tmp_path / "missing.py", "--workdir", tmp_path)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "no such file" in done.stderr


def test_preflight_is_dispatched_lazily(tmp_path, monkeypatch):
    # Importing the launcher must not import the preflight (and, through it, libtpu's compiler path): only its
    # options (the flags of its command), which import nothing but the standard library.
    probe = helpers.run_python("import sys, sweeps.launch; print('sweeps.preflight.report' in sys.modules, "
                               "'jax' in sys.modules)", check=True)
    assert probe.stdout.strip() == "False False"
    from sweeps import preflight

    sweep_file = write_sweep(tmp_path, "unit", "depths=(1, 2), widths={1: (16,), 2: (16,)}")
    seen = {}
    monkeypatch.setattr(preflight, "main", lambda args, runs, deal: seen.update(
        steps={r.config.steps for r in runs}, topology=args.topology, json=args.json, pod_wide=args.pod_wide,
        runs=[r.name for r in runs], deal=deal) or 0)
    assert launch.main(["preflight", str(sweep_file), "--topology", "v5e:4x4", "--json", "--set", "steps=5"]) == 0
    assert seen["topology"] == "v5e:4x4" and seen["json"] and seen["steps"] == {5} and seen["deal"] is spec.shard
    assert seen["runs"] == ["L1-d16-s0", "L2-d16-s0"] and not seen["pod_wide"]
    assert launch.main(["preflight", str(sweep_file), "--topology", "v5e:4x4", "--only", "L2-*", "--pod-wide"]) == 0
    assert seen["runs"] == ["L2-d16-s0"] and seen["pod_wide"]
    with pytest.raises(SystemExit):
        launch.main(["preflight", str(sweep_file)])  # --topology is required


# Two runs of the tiny sweep, trained in this process.
PAIR = "depths=(1,), widths={1: (16, 32)}"


def test_a_truncated_record_is_named_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    sweep = str(write_sweep(tmp_path, "mini", PAIR))
    monkeypatch.chdir(tmp_path)
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", sweep, "--workdir", "runs"]) == 0
    damaged, removed = tiny.run_dirs(tmp_path / "runs")[:2]
    (damaged / "result.json").write_text('{"status": "fini')
    shutil.rmtree(removed)
    capsys.readouterr()
    assert launch.main(["status", sweep, "--workdir", "runs"]) == 0
    assert str(damaged / "result.json") in capsys.readouterr().out
    assert launch.main(["list", sweep, "--workdir", "runs"]) == 0
    assert "unreadable" in capsys.readouterr().out
    assert launch.main(["run", sweep, "--workdir", "runs"]) == 0, capsys.readouterr()
    assert all(records.read_record(d).status == "finished" for d in tiny.run_dirs(tmp_path / "runs"))


def test_an_unwritable_run_dir_is_reported_and_the_others_train(tmp_path, capsys, monkeypatch):
    sweep = str(write_sweep(tmp_path, "mini", PAIR))
    monkeypatch.chdir(tmp_path)
    tiny.on_one_device(monkeypatch)
    assert launch.main(["list", sweep, "--workdir", "runs", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    blocked = tmp_path / "runs" / "mini" / listing["runs"][0]["run_id"]
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where the run directory should be")
    assert launch.main(["run", sweep, "--workdir", "runs"]) == 1
    out, err = capsys.readouterr()
    assert str(blocked) in out and "Traceback" not in out + err
    finished = [d for d in tiny.run_dirs(tmp_path / "runs") if records.read_record(d).status == "finished"]
    assert len(finished) == 1


def test_piped_output_closes_quietly(tmp_path):
    sweep = write_sweep(tmp_path, "mini", PAIR)
    # `true` exits without reading, so the launcher writes into a closed pipe.
    done = helpers.run(["bash", "-c", f"{sys.executable} -m sweeps.launch list {sweep} --workdir runs | true"],
                       cwd=tmp_path, env=tiny.env(), timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "taken").write_text("")
    assert train_cli.main(["--config", "tiny", "--workdir", str(tmp_path / "taken")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    sweep = str(write_sweep(tmp_path, "mini", PAIR))
    monkeypatch.chdir(tmp_path)
    assert launch.main(["run", sweep, "--workdir", "taken"]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and err.strip().count("\n") == 0 and "Traceback" not in err


def test_a_run_another_launcher_finishes_after_the_check_is_not_reported_as_trained(tmp_path, capsys, monkeypatch):
    """The window between the launcher's "finished already?" check and the trainer's lease: the run's
    record appears there, and the launcher says another launcher finished it, not that it trained it."""

    sweep = str(write_sweep(tmp_path, "mini", PAIR))
    monkeypatch.chdir(tmp_path)
    tiny.on_one_device(monkeypatch)
    assert launch.main(["run", sweep, "--workdir", "runs"]) == 0
    capsys.readouterr()
    from sweeps import run_loop

    real_states, real_state = launch.read_states, run_loop.read_state
    calls = []

    def stale_at_first(*args, **kwargs):  # the work directory as it was before the other launcher finished
        calls.append(1)
        states = real_states(*args, **kwargs)
        return [state._replace(status="pending") for state in states] if len(calls) == 1 else states

    monkeypatch.setattr(launch, "read_states", stale_at_first)
    monkeypatch.setattr(run_loop, "read_state", lambda *args: real_state(*args)._replace(status="pending"))
    assert launch.main(["run", sweep, "--workdir", "runs"]) == 0
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert text.count("already finished by another launcher") == len(tiny.run_dirs(tmp_path / "runs")), text
    assert "finished, eval loss" not in text, text


def test_a_finished_share_says_so_and_shows_its_own_runs(tmp_path, capsys):
    sweep_file = write_sweep(tmp_path, "done", "depths=(1, 2), widths={1: (16, 32), 2: (16, 32)}")
    runs = spec.load_sweep(sweep_file).expand().runs
    workdir = tmp_path / "runs"
    for run in runs:
        write_record(run, workdir, loss=2.5)
    assert launch.main(["run", str(sweep_file), "--workdir", str(workdir), "--shard", "0/2"]) == 0
    out, err = capsys.readouterr()
    assert "0/0 runs" not in out + err
    table_names = {line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in
                   {run.name for run in runs}}
    assert 1 <= len(table_names) < 4  # this share's runs, not the whole sweep's
    assert f"this share's {len(table_names)} of the sweep's 4 runs" in out and f"status {sweep_file}" in out


def test_each_command_keeps_its_own_workdir_default():
    """The preflight keeps no workdir unless given one; that default must not leak into the other commands
    (they shared the parent parser's action, so `dry-run SWEEP_FILE` crashed on a None workdir)."""
    from sweeps.launch_parser import build_parser

    parser = build_parser()
    assert parser.parse_args(["preflight", "sweeps/configs/smoke.py", "--topology", "v5e:2x4"]).workdir is None
    for command in ("list", "dry-run", "run", "status"):
        assert parser.parse_args([command, "sweeps/configs/smoke.py"]).workdir == "runs", command


def test_a_packs_wall_time_is_counted_once_not_once_per_run():
    """Each run of a pack records the pack's wall time; the dry run's speed divides it by the pack's size,
    so 15 runs trained together in 300 s count as 300 s, not 4,500 s."""
    from types import SimpleNamespace

    from sweeps.state import RunState

    def finished(pack_size, wall):
        return RunState(SimpleNamespace(flops=1e12), "finished", None,
                        {"wall_seconds": wall, "pack_size": pack_size})

    packed = [finished(15, 300.0) for _ in range(15)]
    assert launch._throughput(packed) == pytest.approx(15 * 1e12 / 300.0)
    without_the_field = RunState(SimpleNamespace(flops=1e12), "finished", None, {"wall_seconds": 20.0})
    alone = [finished(1, 20.0), without_the_field]  # records from before pack_size count whole
    assert launch._throughput(alone) == pytest.approx(2e12 / 40.0)
