"""The sweep launcher: expansion, budgets, shards, hosts, CLI errors, and real sweeps (run, kill, rerun, diverge)."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scaling import budget
from sweeps import launch, spec
from sweeps.spec import Sweep

REPO = Path(__file__).resolve().parents[1]

# A sweep file body: tiny byte-level models on the built-in corpus. {...} are filled per test.
SWEEP_FILE = '''"""Test sweep {name}.

    python -m sweeps.launch run {path} --workdir WORKDIR
"""
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep():
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=32),
        data=DataConfig(source="builtin", seq_len=32),
        optim=OptimConfig(warmup_steps=2, {optim}),
        steps={steps}, batch_size=8, eval_every=0, eval_batches=1, checkpoint_every={checkpoint_every},
        log_every={log_every}, wandb_mode="{wandb}")
    return Sweep(name="{name}", base=base, {grid}, multiple_of=16)
'''


def write_sweep(tmp_path, name, grid, steps=12, checkpoint_every=6, log_every=3, wandb="disabled",
                optim="peak_lr=3e-3") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(SWEEP_FILE.format(name=name, path=path, grid=grid, steps=steps, checkpoint_every=checkpoint_every,
                                      log_every=log_every, wandb=wandb, optim=optim))
    return path


def subprocess_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "SLURM_", "XLA_FLAGS"))}
    env.update(JAX_PLATFORMS="cpu", WANDB_SILENT="true", **extra)
    return env


def launcher(*args):
    return [sys.executable, "-m", "sweeps.launch", *map(str, args)]


def run_cli(*args, env=None, timeout=900):
    # Generous: a 4-run sweep takes about 1 minute alone, but over 5 minutes beside two training jobs on 2 cores.
    return subprocess.run(launcher(*args), cwd=REPO, env=env or subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)


def results(sweep_dir: Path) -> dict:
    """Run name -> result record of every run directory under ``sweep_dir``."""
    records = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    return {record["name"]: record for record in records}


def write_record(run, workdir, status="finished", loss=3.0, **fields):
    """Write ``run``'s record by hand, as the trainer would (no training)."""
    from scaling import records

    config = run.config
    record = records.RunRecord(
        run_id=run.run_id, status=status, depth=config.model.depth, width=config.model.width, seed=config.seed,
        params_non_embedding=12 * config.model.depth * config.model.width ** 2, name=run.name,
        sweep=config.sweep_name, final_eval_loss=loss if status == "finished" else None,
        point_id=run.run_id, lr_rule=config.optim.lr_rule, peak_lr=config.optim.peak_lr, planned_steps=config.steps,
        **fields)
    run_dir = Path(str(run.run_dir(workdir)))
    run_dir.mkdir(parents=True, exist_ok=True)
    records.write_record(run_dir, record)
    return record


def write_sweep_text(grid):
    """The ``sweep`` function of a test sweep file with this grid, without writing the file."""
    namespace = {}
    exec(SWEEP_FILE.format(name="unit", path="unit.py", grid=grid, steps=12, checkpoint_every=6, log_every=3,
                           wandb="disabled", optim="peak_lr=3e-3"), namespace)
    return namespace["sweep"]


# ---------------------------------------------------------------------------
# Real sweeps through the command line


def test_end_to_end_sweep_is_read_by_the_analysis(tmp_path):
    # μP-style rates (optim.lr_rule='mup') as in the shipped sweeps; one seed, so no transition test.
    sweep_file = write_sweep(tmp_path, "e2e", "depths=(1, 2), widths={1: (16, 32), 2: (16, 32)}", wandb="offline",
                             optim="peak_lr=3e-3, lr_rule='mup', base_width=32")
    workdir = tmp_path / "runs"
    done = run_cli("run", sweep_file, "--workdir", workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== sweep e2e: 4 finished (of 4 runs)" in done.stdout
    for name in ("L1-d16-s0", "L1-d32-s0", "L2-d16-s0", "L2-d32-s0"):
        assert name in done.stdout
    assert "analysis:" in done.stdout and "not enough points" in done.stdout  # one seed: no noise estimate
    # stderr is a pipe here, as in a log file: plain progress lines, no bar redraws or escape codes.
    assert "\x1b" not in done.stderr and "\r" not in done.stderr, done.stderr[-2000:]
    assert "L1-d16-s0: 12/12 steps (100%)" in done.stderr and "sweep e2e: 4/4 runs (100%)" in done.stderr

    sweep_dir = workdir / "e2e"
    records = results(sweep_dir)
    assert {r["status"] for r in records.values()} == {"finished"} and len(records) == 4
    assert all(r["sweep"] == "e2e" for r in records.values())  # the wandb group of every run
    assert {r["width"]: r["peak_lr_hidden"] for r in records.values()} == {16: 6e-3, 32: 3e-3}

    status = run_cli("status", sweep_file, "--workdir", workdir, "--json")
    data = json.loads(status.stdout)
    assert data["counts"] == {"finished": 4} and data["total"] == 4
    assert {run["name"]: run["final_eval_loss"] for run in data["runs"]} == {
        name: record["final_eval_loss"] for name, record in records.items()}
    assert set(data["runs"][0]) >= {"name", "run_id", "depth", "width", "params", "seed", "status", "final_eval_loss"}

    fit = subprocess.run([sys.executable, "-m", "analysis", "fit", str(sweep_dir), "--json", "--loss-std", "0.05"],
                         cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0, fit.stderr
    report = json.loads(fit.stdout)
    assert report["runs"] == 4 and report["skipped"] == {}
    assert [(t["shallow_depth"], t["deep_depth"]) for t in report["transitions"]] == [(1, 2)]

    # The sweep config is saved beside the runs and logged to wandb as a "sweep" run of the same group.
    expected = spec.load_sweep(sweep_file)
    assert json.loads((sweep_dir / "sweep.json").read_text()) == json.loads(json.dumps(expected.to_dict()))
    from test_train import _wandb_records

    [log] = sweep_dir.glob(f"wandb/offline-run-*-sweep-{expected.digest()}/run-*.wandb")
    [run_record] = [r.run for r in _wandb_records(log) if r.WhichOneof("record_type") == "run"]
    assert (run_record.run_group, run_record.job_type) == ("e2e", "sweep")
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
    assert config["depths"] == [1, 2] and len(config["runs"]) == 4

    # Running the finished sweep again trains nothing and adds no wandb run, the sweep's included.
    wandb_runs = sorted(p.name for p in sweep_dir.glob("**/offline-run-*"))
    again = run_cli("run", sweep_file, "--workdir", workdir)
    assert again.returncode == 0 and "0 to train" in again.stdout, again.stderr[-3000:]
    assert sorted(p.name for p in sweep_dir.glob("**/offline-run-*")) == wandb_runs
    assert "\x1b" not in again.stderr and "\r" not in again.stderr


def _checkpoint_steps(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def test_killed_sweep_resumes_without_retraining_finished_runs(tmp_path):
    # Cheapest first: L1-d16 finishes quickly, then L2-d64 trains 300 steps, checkpointing every 50.
    sweep_file = write_sweep(tmp_path, "killed", "depths=(1, 2), widths={1: (16,), 2: (64,)}", steps=300,
                             checkpoint_every=50, log_every=10)
    workdir = tmp_path / "runs"
    sweep = spec.load_sweep(sweep_file)
    small, big = sorted(sweep.expand().runs, key=lambda run: run.flops)
    small_dir, big_dir = Path(str(small.run_dir(workdir))), Path(str(big.run_dir(workdir)))
    env = subprocess_env(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"))
    proc = subprocess.Popen(launcher("run", sweep_file, "--workdir", workdir), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 240
    while not ((small_dir / "result.json").exists() and _checkpoint_steps(big_dir)):
        assert proc.poll() is None, f"launcher ended early: {proc.communicate()[0][-3000:]}"
        assert time.time() < deadline, "timed out waiting for a finished run and a checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the machine dies: launcher and everything it started
    proc.wait()
    assert not (big_dir / "result.json").exists(), "the second run finished before the kill; make it longer"
    small_bytes, small_mtime = (small_dir / "result.json").read_bytes(), (small_dir / "result.json").stat().st_mtime_ns

    again = run_cli("run", sweep_file, "--workdir", workdir, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 to train, 1 resumable, 1 finished" in again.stdout
    assert "== sweep killed: 2 finished (of 2 runs)" in again.stdout
    # The finished run was not touched...
    assert (small_dir / "result.json").read_bytes() == small_bytes
    assert (small_dir / "result.json").stat().st_mtime_ns == small_mtime
    # ...and the interrupted one continued from its checkpoint instead of starting over.
    record = json.loads((big_dir / "result.json").read_text())
    assert record["status"] == "finished" and record["steps"] == 300
    rows = [json.loads(line) for line in (big_dir / "metrics.jsonl").read_text().splitlines()]
    loss_steps = [row["step"] for row in rows if "loss" in row]
    assert loss_steps.count(10) == 1  # a restart from scratch would log step 10 twice
    assert [row["step"] for row in rows] == sorted({row["step"] for row in rows})  # one row per step
    assert len([row for row in rows if "eval_loss" in row and row["step"] == 0]) == 1
    assert sorted(set(loss_steps)) == list(range(10, 301, 10))


def test_diverging_run_is_recorded_and_the_others_finish(tmp_path, capsys):
    sweep_file = write_sweep(tmp_path, "diverge", "depths=(1,), widths={1: (16,)}, lr_grid=(3e-3, 1e9)",
                             optim="peak_lr=3e-3, grad_clip=0.0, weight_decay=0.0")
    workdir = tmp_path / "runs"
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
    from scaling import train
    from scaling.stopping import PREEMPTED_EXIT_CODE, Preempted

    sweep_file = write_sweep(tmp_path, "flow", "depths=(1,), widths={1: (16, 32, 48)}")
    workdir = tmp_path / "runs"
    calls = []

    by_name = {run.name: run for run in spec.load_sweep(sweep_file).expand().runs}

    def fake_run(config, run_dir, show_progress=True, devices=None, stop=None):
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


# ---------------------------------------------------------------------------
# Expansion, budgets, shards


def test_expansion_names_ids_and_configs():
    sweep = write_sweep_text("depths=(1, 2), budgets=(2e4, 6e4), seeds=(0, 3), lr_grid=(1e-3, 3.5e-3)")()
    runs = sweep.expand().runs
    assert len(runs) == 2 * 2 * 2 * 2
    assert runs[0].name == "L1-d48-s0-lr1e-03" and "L2-d48-s3-lr3.5e-03" in {r.name for r in runs}
    assert len({r.run_id for r in runs}) == len(runs)
    for run in runs:
        assert run.config.sweep_name == "unit" and run.config.name == run.name
        assert (run.config.model.depth, run.config.model.width, run.config.seed) == (run.depth, run.width, run.seed)
        assert run.name.endswith(f"-lr{spec.lr_tag(run.config.optim.peak_lr)}")
    # Ids are a pure function of the resolved config: expanding again gives the same ones.
    assert [r.run_id for r in sweep.expand().runs] == [r.run_id for r in runs]
    # Presentation fields keep run ids, anything that changes training changes them.
    quiet = spec.with_overrides(sweep, ["log_every=7"])
    longer = spec.with_overrides(sweep, ["steps=13"])
    assert [r.run_id for r in quiet.expand().runs] == [r.run_id for r in runs]
    assert not {r.run_id for r in longer.expand().runs} & {r.run_id for r in runs}


def test_variants_cross_the_grid_with_their_own_overrides_and_seeds():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}, seeds=(0, 1, 2)")()
    variants = (spec.Variant("a", ("model.attention_scale=log_length",)),
                spec.Variant("b", ("steps=13", "data.seq_len=32"), seeds=(5,)))
    sweep = Sweep(name="unit", base=base.base, depths=(1,), widths={1: (16,)}, seeds=(0, 1, 2), variants=variants)
    runs = sweep.expand().runs
    assert [r.name for r in runs] == ["a-L1-d16-s0", "a-L1-d16-s1", "a-L1-d16-s2", "b-L1-d16-s5"]
    assert all(r.config.model.attention_scale == "log_length" for r in runs[:3])
    assert (runs[3].config.steps, runs[3].config.data.seq_len, runs[3].seed) == (13, 32, 5)
    assert len({r.run_id for r in runs}) == 4
    assert sweep.to_dict()["variants"][1] == {"tag": "b", "overrides": ["steps=13", "data.seq_len=32"], "seeds": [5]}
    # A sweep without variants describes itself (and hashes) as before variants existed.
    assert "variants" not in base.to_dict()
    with pytest.raises(ValueError, match="seed"):
        spec.Variant("c", ("seed=3",))
    with pytest.raises(ValueError, match="distinct"):
        Sweep(name="unit", base=base.base, depths=(1,), widths={1: (16,)}, variants=variants[:1] * 2)


def test_log_length_sweep_expands_to_the_documented_grid():
    """Two grids: learned positions on a fixed set of 100 strings (2,000 steps of 10), and FIRST as its
    authors trained it (indicator positions, a fresh string at each of 10,000 steps of 1)."""
    runs = spec.load_sweep(REPO / "sweeps" / "configs" / "log_length.py").expand().runs
    cells = {}
    for run in runs:
        c = run.config
        key = (c.model.position, c.data.source, c.data.synthetic_max_length, c.model.attention_scale)
        cells.setdefault(key, []).append(run.seed)
        assert c.data.synthetic_min_length == c.data.synthetic_max_length
        assert c.data.synthetic_eval_min_length == c.data.synthetic_eval_max_length == 1000
        assert c.eval_batches * c.batch_size == 1000  # the same 1,000 test strings for every run
        assert c.model.heads == (1 if c.data.source == "first" else 2)
        shape = (c.model.depth, c.model.width, c.model.ff_width, c.model.norm, c.optim.peak_lr)
        assert shape == (2, 16, 64, "post", 3e-4)
        if c.model.position == "learned":
            assert c.steps * c.batch_size == 200 * c.data.synthetic_train_size == 200 * 100
        else:
            assert (c.model.position, c.data.source, c.data.synthetic_train_size) == ("first_indicator", "first", 0)
            assert (c.steps, c.batch_size) == (10_000, 1)
    learned = {key[1:]: seeds for key, seeds in cells.items() if key[0] == "learned"}
    authors = {key[1:]: seeds for key, seeds in cells.items() if key[0] == "first_indicator"}
    assert len(learned) == 12 and len(authors) == 8
    assert all(len(seeds) == (5 if task == "parity" or n == 300 else 10) for (task, n, _), seeds in learned.items())
    assert all(sorted(seeds) == list(range(20)) for seeds in authors.values())
    assert len({run.run_id for run in runs}) == len(runs) == 90 + 160


@pytest.mark.parametrize("sweep_file", ["smoke.py", "cpu_mini.py", "paper.py"])
def test_realised_sizes_are_within_rounding_of_their_budgets(sweep_file, monkeypatch):
    from scaling import data

    def no_data(*_):
        raise AssertionError("expanding a sweep must not build the data pipeline")

    monkeypatch.setattr(data, "build", no_data)
    sweep = spec.load_sweep(REPO / "sweeps" / "configs" / sweep_file)
    runs, skipped = sweep.expand()
    assert runs
    for run in runs:
        ratio = max(run.params / run.budget, run.budget / run.params)
        assert ratio <= budget.rounding_tolerance(run.width, sweep.multiple_of), run.name
        assert run.params == 12 * run.depth * run.width ** 2
        assert run.width % sweep.base.model.head_dim == 0
    # Every (depth, budget) pair gave a run or is reported as skipped.
    for depth in sweep.depths:
        budgets = sweep.budgets[depth] if isinstance(sweep.budgets, dict) else sweep.budgets
        given = {r.budget for r in runs if r.depth == depth} | {s.budget for s in skipped if s.depth == depth}
        assert given == set(budgets)


def test_too_small_budget_is_reported_not_fatal(tmp_path, capsys):
    sweep = write_sweep_text("depths=(1, 8), budgets=(50, 1e5)")()
    runs, skipped = sweep.expand()
    assert {(s.depth, s.budget) for s in skipped} == {(1, 50.0), (8, 50.0)}
    assert all("too small" in s.reason for s in skipped)
    assert {(r.depth, r.budget) for r in runs} == {(1, 1e5), (8, 1e5)}
    sweep_file = write_sweep(tmp_path, "small", "depths=(1, 8), budgets=(50, 1e5)")
    assert launch.main(["list", str(sweep_file), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped: depth 8, budget 50: budget params=50 is too small for depth=8" in out
    assert "L8-d32-s0" in out


def test_shards_are_disjoint_cover_the_sweep_and_balance_cost():
    runs = write_sweep_text("depths=(1, 2, 4), budgets=(3e4, 1e5, 3e5, 1e6), seeds=(0, 1)")().expand().runs
    assert len(runs) == 24
    for count in (2, 3):
        shares = [spec.shard(runs, index, count) for index in range(count)]
        ids = [run.run_id for share in shares for run in share]
        assert len(ids) == len(set(ids)) == len(runs)  # disjoint, and together the whole sweep
        loads = [sum(run.flops for run in share) for share in shares]
        assert max(loads) - min(loads) <= max(run.flops for run in runs)
        shuffled = random.Random(count).sample(runs, len(runs))  # a host's view never depends on order
        assert [{r.run_id for r in spec.shard(shuffled, i, count)} for i in range(count)] == [
            {r.run_id for r in share} for share in shares]
    assert spec.shard(runs, 0, 1) == runs


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


# ---------------------------------------------------------------------------
# Hosts


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
    from scaling import train

    sweep_file = write_sweep(tmp_path, "quiet", "depths=(1,), widths={1: (16,)}")
    seen = []

    def fake_run(config, run_dir, show_progress=True, devices=None, stop=None):
        seen.append(show_progress)
        raise RuntimeError("not trained in this test")

    monkeypatch.setattr(train, "run", fake_run)
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs"), *flags]) == 1
    assert seen == [shown]
    err = capsys.readouterr().err
    assert ("sweep quiet: 1/1 runs" in err) == shown


# ---------------------------------------------------------------------------
# Status, list and errors (no training: run directories are written by hand)


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
    # The plan: train the pending one, resume one, retry the failed one, skip the finished one.
    assert launch.main(["dry-run", str(sweep_file), "--workdir", str(workdir)]) == 0
    assert "would train 3 run(s): 1 new, 1 resumed, 1 retried; skip 1 finished" in capsys.readouterr().out


def test_list_prints_one_row_per_run(tmp_path, capsys):
    sweep_file, workdir, runs = _fake_runs(tmp_path)
    (workdir / "status" / "0123456789ab").mkdir()
    (workdir / "status" / "0123456789ab" / "config.json").write_text("{}")
    assert launch.main(["list", str(sweep_file), "--workdir", str(workdir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["name", "L", "d", "N", "(12·L·d²)", "budget", "seed", "status", "eval", "loss"]
    rows = {line.split()[0]: line.split() for line in lines[2:6]}
    assert rows[runs[0].name][:4] == [runs[0].name, "1", "16", "3.07e+03"]
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
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
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


def test_sweep_validation():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base
    bad = [dict(depths=(1, 1), budgets=(1e5,)), dict(depths=(1,), budgets=(-1.0,)),
           dict(depths=(1, 2), widths={1: (16,)}), dict(depths=(1,), budgets=(1e5,), seeds=()),
           dict(depths=(1,), widths={1: (24,)}),  # 24 channels do not split into 16-channel heads
           dict(depths=(0,), budgets=(1e5,))]
    for fields in bad:
        with pytest.raises(ValueError):
            Sweep(name="bad", base=base, multiple_of=16, **fields)
    with pytest.raises(ValueError, match="name"):
        Sweep(name="a/b", base=base, depths=(1,), budgets=(1e5,))


def test_a_peak_rate_per_depth():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base
    sweep = Sweep(name="per_depth", base=base, depths=(1, 2), widths={1: (16, 32), 2: (16,)}, seeds=(0, 1),
                  peak_lr_by_depth={1: 4e-3, 2: 2e-3}, multiple_of=16)
    runs, _ = sweep.expand()
    assert {(r.config.model.depth, r.config.optim.peak_lr) for r in runs} == {(1, 4e-3), (2, 2e-3)}
    plain = Sweep(name="per_depth", base=base, depths=(1, 2), widths={1: (16, 32), 2: (16,)}, seeds=(0, 1),
                  multiple_of=16)
    assert "peak_lr_by_depth" not in plain.to_dict()  # other sweeps' descriptions are unchanged
    # A run with the rate its depth was given is the same run as one configured by hand.
    by_hand = dataclasses.replace(plain.expand().runs[0].config,
                                  optim=dataclasses.replace(base.optim, peak_lr=4e-3))
    assert runs[0].run_id == spec.config_id(by_hand)
    for fields in (dict(peak_lr_by_depth={1: 4e-3}), dict(peak_lr_by_depth={1: 4e-3, 2: -1.0}),
                   dict(peak_lr_by_depth={1: 4e-3, 2: 2e-3}, lr_grid=(1e-3, 2e-3))):
        with pytest.raises(ValueError, match="peak_lr_by_depth|lr_grid"):
            Sweep(name="bad", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)}, multiple_of=16, **fields)
    with pytest.raises(ValueError, match="optim.peak_lr"):
        spec.with_overrides(sweep, ["optim.peak_lr=1e-3"])



def test_a_learning_rate_grid_per_depth():
    base = write_sweep_text("depths=(1,), widths={1: (16,)}")().base
    grid = {1: (1e-3, 2e-3), 2: (2e-3, 4e-3, 8e-3)}
    sweep = Sweep(name="grid_per_depth", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)}, lr_grid=grid,
                  multiple_of=16)
    runs, _ = sweep.expand()
    assert sorted((r.depth, r.config.optim.peak_lr) for r in runs) == sorted(
        (depth, lr) for depth, rates in grid.items() for lr in rates)
    assert {r.name for r in runs if r.depth == 2} == {"L2-d16-s0-lr2e-03", "L2-d16-s0-lr4e-03", "L2-d16-s0-lr8e-03"}
    assert sweep.to_dict()["lr_grid"] == {"1": [1e-3, 2e-3], "2": [2e-3, 4e-3, 8e-3]}
    # A shared grid describes and expands as before.
    shared = Sweep(name="grid_per_depth", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)},
                   lr_grid=(1e-3, 2e-3), multiple_of=16)
    assert shared.to_dict()["lr_grid"] == [1e-3, 2e-3] and len(shared.expand().runs) == 4
    for bad in ({1: (1e-3,)}, {1: (1e-3,), 2: (0.0,)}):
        with pytest.raises(ValueError, match="lr_grid"):
            Sweep(name="bad", base=base, depths=(1, 2), widths={1: (16,), 2: (16,)}, lr_grid=bad, multiple_of=16)


def test_preflight_is_dispatched_lazily(tmp_path, monkeypatch):
    # Importing the launcher must not import the preflight (and, through it, libtpu's compiler path).
    probe = subprocess.run([sys.executable, "-c", "import sys, sweeps.launch; print('sweeps.preflight' in sys.modules)"],
                           capture_output=True, text=True, check=True, cwd=REPO)
    assert probe.stdout.strip() == "False"
    from sweeps import preflight

    sweep_file = write_sweep(tmp_path, "unit", "depths=(1, 2), widths={1: (16,), 2: (16,)}")
    seen = {}
    monkeypatch.setattr(preflight, "main", lambda sweep, args, runs: seen.update(
        sweep=sweep, topology=args.topology, json=args.json, pod_wide=args.pod_wide, runs=[r.name for r in runs]) or 0)
    assert launch.main(["preflight", str(sweep_file), "--topology", "v5e:4x4", "--json", "--set", "steps=5"]) == 0
    assert seen["topology"] == "v5e:4x4" and seen["json"] and seen["sweep"].base.steps == 5
    assert seen["runs"] == ["L1-d16-s0", "L2-d16-s0"] and not seen["pod_wide"]
    assert launch.main(["preflight", str(sweep_file), "--topology", "v5e:4x4", "--only", "L2-*", "--pod-wide"]) == 0
    assert seen["runs"] == ["L2-d16-s0"] and seen["pod_wide"]
    with pytest.raises(SystemExit):
        launch.main(["preflight", str(sweep_file)])  # --topology is required
