"""The GPU depth experiment: its sweep file (both stages), the stage-2 chooser on synthetic scout records,
dry-run's GPU-minutes, and gpu/run_stage.sh (shellcheck, packing, and the micro sweep end to end)."""

import dataclasses
import json
import math
import re
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import helpers
import tiny
from analysis.synthetic import expected_loss, planted_params
from helpers import REPO
from scaling.config import config_id
from scaling.store import records
from sweeps import launch
from sweeps.configs import gpu_depth

SCRIPT = REPO / "gpu" / "run_stage.sh"
SWEEP_FILE = REPO / "sweeps" / "configs" / "gpu_depth.py"
PLANTED_A, PLANTED_B = 5.1, 0.0555  # transitions 1.06× wider (1.13× larger) than the paper's fit: inside the scout


def test_scout_is_the_re_registered_design(monkeypatch):
    monkeypatch.delenv("GPU_DEPTH_MICRO", raising=False)
    monkeypatch.delenv("GPU_DEPTH_STAGE", raising=False)
    sweep = gpu_depth.sweep()
    runs, _ = sweep.expand()
    common = [r for r in runs if r.config.optim.peak_lr == 2e-3]
    assert sweep.name == "gpu_depth" and {r.seed for r in runs} == {0}
    assert sorted({r.depth for r in runs}) == [3, 6, 9, 12] and len(runs) == len(common) == 21
    for run in runs:  # 8 tokens per parameter, to within one step
        tokens_per_step = run.config.batch_size * run.config.data.seq_len
        assert abs(run.config.steps * tokens_per_step - 8 * run.params) <= tokens_per_step / 2
        assert run.config.data.seq_len == 512 and run.config.model.attention_impl == "flash"
    # Each pair's two depths are both trained across centre·2^-0.75 .. centre·2^0.75 of the shallower depth.
    for shallow, deep in gpu_depth.full_design().pairs:
        centre = gpu_depth.full_design().centres[shallow]
        for depth in (shallow, deep):
            sizes = [r.params for r in common if r.depth == depth]
            assert min(sizes) <= centre * 2 ** -0.75 * 1.2 and max(sizes) >= centre * 2 ** 0.75 / 1.2


def test_dry_run_prints_stage_1_and_its_gpu_minutes(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GPU_DEPTH_MICRO", raising=False)
    monkeypatch.delenv("GPU_DEPTH_STAGE", raising=False)
    assert launch.main(["dry-run", str(SWEEP_FILE), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    runs = gpu_depth.sweep().expand().runs
    assert f"all {len(runs)} runs" in out and "L12-d" in out
    fast, slow = map(float, re.search(r"≈ (\d+)–(\d+) device-minutes at 10%–5% model FLOP", out).groups())
    flops = sum(r.flops for r in runs)
    assert fast == pytest.approx(flops / (0.10 * 989e12) / 60, abs=0.6)
    assert slow == pytest.approx(flops / (0.05 * 989e12) / 60, abs=0.6)
    assert launch.main(["dry-run", str(SWEEP_FILE), "--workdir", str(tmp_path), "--json"]) == 0
    low, high = json.loads(capsys.readouterr().out)["device_hours_range"]
    assert (low * 60, high * 60) == pytest.approx((fast, slow), abs=0.6)


def write_scout_records(root, sweep, loss_of) -> None:
    """Finished records of every scout run, as the trainer writes them, with the loss ``loss_of(run)``."""
    for run in sweep.expand().runs:
        config = run.config
        record = records.RunRecord(
            run_id=run.run_id, status="finished", depth=run.depth, width=run.width, seed=run.seed,
            params_non_embedding=run.params, name=run.name, sweep=sweep.name, final_eval_loss=float(loss_of(run)),
            point_id=config_id(dataclasses.replace(config, seed=0)), lr_rule=config.optim.lr_rule, peak_lr=config.optim.peak_lr,
            planned_steps=config.steps, steps=config.steps, tokens=run.tokens, data_fingerprint="corpus",
            tokens_per_step=config.batch_size * config.data.seq_len)
        run_dir = Path(str(run.run_dir(root)))
        run_dir.mkdir(parents=True)
        # A finished run's metrics log holds its final loss (scaling.store.record_checks).
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": config.steps, "eval_loss": record.final_eval_loss})
                                               + "\n")
        records.write_record(run_dir, record)


def test_chooser_centres_stage_2_on_the_planted_crossings(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPU_DEPTH_MICRO", raising=False)
    design = gpu_depth.full_design()
    scout = gpu_depth.scout(design)
    rng = np.random.default_rng(3)
    write_scout_records(tmp_path, scout, lambda run: expected_loss(run.depth, run.params, design.depths, PLANTED_A,
                                                                   PLANTED_B) + rng.normal(0, 0.002))
    out = tmp_path / "stage2.json"
    assert gpu_depth.main(["choose", str(tmp_path / scout.name), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    chosen = json.loads(out.read_text())
    assert [(p["shallow_depth"], p["deep_depth"]) for p in chosen["pairs"]] == design.pairs
    for pair in chosen["pairs"]:
        planted = float(planted_params(pair["shallow_depth"], PLANTED_A, PLANTED_B))
        assert pair["basis"].startswith("zero crossing")
        assert pair["centre_params"] == pytest.approx(planted, rel=0.15)
        assert np.allclose(np.diff(np.log(pair["sizes"])), math.log(math.sqrt(2)))
        assert math.exp(np.mean(np.log(pair["sizes"]))) == pytest.approx(pair["centre_params"])

    # The stage-2 sweep reads that file: four fresh seeds, five sizes per pair on both depths.
    monkeypatch.setenv("GPU_DEPTH_STAGE", "2")
    monkeypatch.setenv("GPU_DEPTH_SIZES", str(out))
    stage2 = gpu_depth.sweep()
    runs = stage2.expand().runs
    assert stage2.name == "gpu_depth_stage2" and {r.seed for r in runs} == {1, 2, 3, 4}
    for pair in chosen["pairs"]:
        for depth in (pair["shallow_depth"], pair["deep_depth"]):
            sizes = sorted({r.params for r in runs if r.depth == depth})
            near = [n for n in sizes if min(pair["sizes"]) / 1.3 <= n <= max(pair["sizes"]) * 1.3]
            assert len(near) >= (4 if depth == pair["shallow_depth"] else 3)  # the deeper: both ends and between
    assert launch.main(["dry-run", str(SWEEP_FILE), "--workdir", str(tmp_path)]) == 0
    assert "device-minutes" in capsys.readouterr().out


def test_rate_check_flags_a_depth_whose_checked_rate_wins_by_more_than_the_tolerance(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPU_DEPTH_MICRO", raising=False)
    design = gpu_depth.full_design()
    chosen = {"design": design.name, "pairs": [{"shallow_depth": s, "deep_depth": t, "centre_params": design.centres[s]}
                                               for s, t in design.pairs]}
    stage2 = gpu_depth.confirmation(chosen, design)
    widest = max(r.width for r in stage2.expand().runs if r.depth == 12)

    def loss(run):  # the checked 1e-3 wins by 0.05 nats at depth 12's widest, by 0.01 elsewhere
        gain = (0.05 if (run.depth, run.width) == (12, widest) else 0.01) if run.config.optim.peak_lr != 2e-3 else 0.0
        return 3.0 - 0.01 * run.depth - gain

    write_scout_records(tmp_path, stage2, loss)
    rows = gpu_depth.rate_check(tmp_path / stage2.name, design)
    assert len(rows) == 8 and {row["seed"] for row in rows} == {1}
    assert [(row["depth"], row["width"]) for row in rows if row["flagged"]] == [(12, widest)]
    assert gpu_depth.main(["rate-check", str(tmp_path / stage2.name)]) == 0
    assert "flagged depths: 12" in capsys.readouterr().out


def test_chooser_without_a_crossing_takes_the_smallest_gap(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_DEPTH_MICRO", raising=False)
    design = gpu_depth.full_design()
    scout = gpu_depth.scout(design)

    def loss(run):  # depth 12 is worse than depth 9 everywhere, by less at larger sizes
        base = expected_loss(run.depth if run.depth < 12 else 9, run.params, (3, 6, 9), PLANTED_A, PLANTED_B)
        return base + (0.3 / math.log(run.params) if run.depth == 12 else 0.0)

    write_scout_records(tmp_path, scout, loss)
    chosen = gpu_depth.choose(tmp_path / scout.name, design)
    last = chosen["pairs"][-1]
    assert last["basis"].startswith("no crossing in the scout's range")
    compared = sorted(r.params for r in scout.expand().runs if r.depth == 9)
    assert last["centre_params"] == pytest.approx(compared[-1])  # the gap shrinks with size: the largest
    assert chosen["pairs"][0]["basis"].startswith("zero crossing")


def test_stage_2_needs_chosen_sizes_of_its_own_design(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_DEPTH_STAGE", "2")
    monkeypatch.setenv("GPU_DEPTH_SIZES", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="choose them from the scout's records first"):
        gpu_depth.sweep()
    (tmp_path / "micro.json").write_text(json.dumps({"design": "gpu_depth_micro", "pairs": []}))
    monkeypatch.setenv("GPU_DEPTH_SIZES", str(tmp_path / "micro.json"))
    with pytest.raises(ValueError, match="chosen for design 'gpu_depth_micro'"):
        gpu_depth.sweep()
    monkeypatch.setenv("GPU_DEPTH_STAGE", "3")
    with pytest.raises(ValueError, match="GPU_DEPTH_STAGE='3' is invalid"):
        gpu_depth.sweep()


# ---------------------------------------------------------------- gpu/run_stage.sh


def test_shellcheck_clean():
    helpers.assert_shellcheck_clean(SCRIPT, "-x")


def run_stage(*args, timeout=900, **env):
    environment = tiny.env(PYTHON=sys.executable, GPU_DEPTH_MICRO="1", **env)
    return helpers.run([SCRIPT, *args], env=environment, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--stage", "3", "--budget", "1m", "--corpus", "x"], "--stage must be 1 or 2"),
    (["--stage", "1", "--budget", "soon", "--corpus", "x"], "--budget must look like"),
    (["--stage", "1", "--budget", "60", "--corpus", "x"], "leaves no time after the --reserve"),
    (["--stage", "1", "--budget", "5m"], "--corpus FILE.tar.xz|DIR is required"),
    (["--stage", "1", "--budget", "5m", "--corpus", "/no/such/file"], "no such file or directory"),
])
def test_run_stage_refuses_bad_arguments(args, message):
    result = run_stage(*args, timeout=60)
    assert result.returncode == 2 and message in result.stderr


def micro_corpus(tmp_path) -> Path:
    """A corpus built from a small folder of the built-in prose: its tokens.tar.xz."""
    from scaling import corpus as corpus_cli
    from scaling.data import corpus

    texts = tmp_path / "texts"
    texts.mkdir()
    for index, (_, text) in enumerate(corpus.builtin_documents()[:40]):
        (texts / f"doc{index:02d}.txt").write_text(text)
    corpus_cli.build_main(["--folder", str(texts), "--out", str(tmp_path / "corpus"), "--quiet"])
    return tmp_path / "corpus" / "tokens.tar.xz"


def test_run_stage_with_nothing_left_packs_the_finished_records_only(tmp_path, monkeypatch):
    """Every run already finished (records written by hand): the launcher trains nothing, and the
    archive holds sweep.json and each run's records, not its checkpoints or logs."""
    monkeypatch.setenv("GPU_DEPTH_MICRO", "1")
    monkeypatch.delenv("GPU_DEPTH_STAGE", raising=False)
    archive = micro_corpus(tmp_path)
    scout = gpu_depth.sweep()
    write_scout_records(tmp_path / "runs", scout, lambda run: 3.0 - 0.01 * run.depth)
    some_run = Path(str(scout.expand().runs[0].run_dir(tmp_path / "runs")))
    (some_run / "config.json").write_text("{}")
    (some_run / "checkpoints").mkdir()
    (some_run / "checkpoints" / "state").write_text("not packed")
    out = tmp_path / "records.tar.gz"
    result = run_stage("--stage", "1", "--budget", "10m", "--corpus", archive, "--workdir", tmp_path / "runs",
                       "--out", out, SCALING_DATA_DIR=str(tmp_path / "data"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    total = len(scout.expand().runs)
    assert "stage 1 is complete" in result.stdout and f"packed {total} finished run(s)" in result.stdout
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert "gpu_depth_micro/sweep.json" in names
    assert len([n for n in names if n.endswith("/result.json")]) == total
    assert f"gpu_depth_micro/{some_run.name}/config.json" in names and not any("checkpoints" in n for n in names)
    assert len(list((tmp_path / "data").glob("gpu-depth-corpus-*/tokens/metadata.json"))) == 1


@pytest.mark.slow
def test_micro_experiment_end_to_end_in_budgets(tmp_path, monkeypatch):
    """Both micro stages through gpu/run_stage.sh on CPU: a budget too short for stage 1 (2 s of training
    after the reserve, less than loading and compiling take on any machine) stops it with
    status 75 and a checkpoint, the next call finishes it; the chooser picks stage 2's sizes from the
    records; stage 2 runs; `analysis fit` reads the unpacked records. Several minutes on 2 busy cores."""
    from analysis.__main__ import main as analysis

    archive = micro_corpus(tmp_path)
    runs = tmp_path / "runs"
    common = ["--corpus", archive, "--workdir", runs, "--reserve", "5"]
    monkeypatch.setenv("GPU_DEPTH_MICRO", "1")
    monkeypatch.delenv("GPU_DEPTH_STAGE", raising=False)
    small = [f"--only={r.name}" for r in gpu_depth.sweep().expand().runs if r.width < 100]  # not the largest
    env = {"SCALING_DATA_DIR": str(tmp_path / "data")}
    first = run_stage("--stage", "1", "--budget", "7", *common, "--", *small, **env)
    assert first.returncode == 75, first.stdout + first.stderr
    assert "run the same command again" in first.stdout
    second = run_stage("--stage", "1", "--budget", "15m", *common, "--", *small, **env)
    assert second.returncode == 0, second.stdout + second.stderr
    sizes = tmp_path / "stage2.json"
    chooser = helpers.run_module("sweeps.configs.gpu_depth", "choose", runs / "gpu_depth_micro", "--out", sizes,
                                 "--loss-std", "0.02", env=tiny.env(GPU_DEPTH_MICRO="1"), timeout=120)
    assert chooser.returncode == 0, chooser.stderr
    third = run_stage("--stage", "2", "--budget", "30m", *common, "--out", tmp_path / "stage2.tar.gz",
                      GPU_DEPTH_SIZES=str(sizes), **env)
    assert third.returncode == 0, third.stdout + third.stderr
    copied = tmp_path / "copied"
    with tarfile.open(tmp_path / "stage2.tar.gz") as tar:
        tar.extractall(copied, filter="data")
    assert analysis(["fit", str(copied / "gpu_depth_micro_stage2"), "--json", "--bootstrap", "20"]) == 0
