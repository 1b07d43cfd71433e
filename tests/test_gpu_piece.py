"""A sweep in pieces (sweeps/piece/): the depth experiment's design v2 sized to one GPU command, the plan as
pieces, the speed model, the corpus and package checks, accepting what comes back, and a micro piece end
to end in a fresh virtual environment (slow)."""

import base64
import hashlib
import json
import re
import shutil
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import helpers
import tiny
from analysis import comparison
from analysis.projection import FIT_PRESETS, transition_params
from helpers import REPO
from sweeps import launch
from sweeps.configs import gpu_depth
from sweeps.packing import Pack, plan_packs
from sweeps.piece import accept as accept_lib
from sweeps.piece import ledger as ledger_lib
from sweeps.piece import packages, plan
from sweeps.piece.__main__ import main as piece_main
from test_gpu_depth import micro_corpus, write_scout_records

SWEEP_FILE = REPO / "sweeps" / "configs" / "gpu_depth.py"
README = REPO / "results" / "gpu_depth" / "README.md"


@pytest.fixture
def full(monkeypatch):
    monkeypatch.delenv("GPU_DEPTH_MICRO", raising=False)
    monkeypatch.delenv("GPU_DEPTH_STAGE", raising=False)


def compared_sizes(sweep, seeds_of=None) -> dict:
    """Per pair (shallow, deep): the shallower depth's sizes the analysis compares (rounding and its range rule
    applied by ``analysis.comparison.pair_data`` itself), from the common rate's runs."""
    runs = [r for r in sweep.expand().runs if r.config.optim.peak_lr == sweep.base.optim.peak_lr]
    points = pd.DataFrame([{"depth": r.depth, "width": r.width, "params": r.params} for r in runs]).drop_duplicates()
    out = {}
    for shallow, deep in zip(sweep.depths[:-1], sweep.depths[1:]):
        data = comparison.pair_data(points, shallow, deep)
        out[(shallow, deep)] = [] if data is None else sorted(np.exp(data.x))
    return out


def test_range_rule_is_the_analysis_one():
    assert gpu_depth.RANGE_TOLERANCE == comparison.RANGE_TOLERANCE


def test_stage_1_compares_four_sizes_two_on_each_side_of_the_prediction(full):
    scout = gpu_depth.sweep()
    for (shallow, deep), sizes in compared_sizes(scout).items():
        predicted = float(transition_params(shallow, FIT_PRESETS["levine2020"]))
        assert len(sizes) >= 4, (shallow, deep, sizes)
        assert sum(n < predicted for n in sizes) >= 2 and sum(n > predicted for n in sizes) >= 2, (shallow, sizes)


@pytest.mark.parametrize("factors", [(1.0, 1.0, 1.0), (0.6, 1.4, 0.8), (1.7, 0.7, 1.3)])
def test_stage_2_compares_four_sizes_two_on_each_side_of_its_centre(full, factors):
    """Stage 2 centred where a scout might put the crossings: the prediction, or off it by up to 1.7×."""
    design = gpu_depth.full_design()
    chosen = {"design": design.name, "pairs": [
        {"shallow_depth": s, "deep_depth": t, "centre_params": design.centres[s] * f}
        for (s, t), f in zip(design.pairs, factors)]}
    stage2 = gpu_depth.confirmation(chosen, design)
    assert {r.seed for r in stage2.expand().runs} == {1, 2, 3, 4}
    for pair in chosen["pairs"]:
        sizes = compared_sizes(stage2)[(pair["shallow_depth"], pair["deep_depth"])]
        centre = pair["centre_params"]
        assert sum(n < centre for n in sizes) >= 2 and sum(n > centre for n in sizes) >= 2, (pair, sizes)


def predicted_stage_2(design=None):
    """Stage 2 as if the scout found every crossing where the paper predicts it."""
    design = design or gpu_depth.full_design()
    chosen = {"design": design.name, "pairs": [{"shallow_depth": s, "deep_depth": t, "centre_params": design.centres[s]}
                                               for s, t in design.pairs]}
    return gpu_depth.confirmation(chosen, design)


def test_stage_2_checks_the_rate_at_each_depths_smallest_and_largest_width(full):
    stage2 = predicted_stage_2()
    runs = stage2.expand().runs
    for depth in stage2.depths:
        widths = sorted({r.width for r in runs if r.depth == depth})
        rates = {(r.width, r.config.optim.peak_lr, r.seed) for r in runs if r.depth == depth}
        assert (widths[0], 4e-3, 1) in rates and (widths[-1], 1e-3, 1) in rates  # the first seed, paired
        assert len(rates) == 4 * len(widths) + 2
    assert all(r.config.optim.peak_lr == 2e-3 for r in gpu_depth.sweep().expand().runs)  # the scout: one rate
    assert all(r.config.steps * r.config.tokens_per_step == pytest.approx(8 * r.params, abs=16384) for r in runs)


def full_plan(sweep):
    model = plan.SpeedModel(sweep.piece, sweep.base.peak_flops)
    runs = sorted(sweep.expand().runs, key=lambda r: (r.flops, r.run_id))
    packs = plan.fitting(plan_packs(runs, sweep.pack, lambda run: 0), model, sweep.piece.usable_seconds)
    return plan.pieces(packs, model)


def test_stage_1_fits_two_pieces_and_stage_2_six_at_the_assumed_mfu(full):
    pieces, too_long = full_plan(gpu_depth.sweep())
    assert not too_long and len(pieces) <= 2
    pieces, too_long = full_plan(predicted_stage_2())
    assert not too_long and len(pieces) <= 6


def test_dry_run_prints_the_plan_as_pieces_and_the_ledger(tmp_path, capsys, full):
    assert launch.main(["dry-run", str(SWEEP_FILE), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "in pieces of 8 min" in out and "10% MFU of 989 TFLOP/s (assumed, not measured)" in out
    minutes = [float(m) for m in re.findall(r"piece \d+: .* ≈(\d+\.\d) device-minutes", out)]
    assert 1 <= len(minutes) <= 2 and all(m <= 8.0 for m in minutes)
    runs = len(gpu_depth.sweep().expand().runs)
    assert f"ledger results/gpu_depth/ledger.json: 0 of {runs} runs finished; no piece has come back" in out


def test_speed_model_assumes_then_scales_from_what_it_measured():
    settings = plan.PieceSettings(seconds=100, startup_seconds=10, reserve_seconds=10, mfu=0.5,
                                  min_step_seconds=0.01, pack_overhead_seconds=5, margin=1.0)
    model = plan.SpeedModel(settings, peak_flops=1e12)
    assert model.step_seconds(1e9) == pytest.approx(0.01)  # the floor
    assert model.step_seconds(1e11) == pytest.approx(0.2)  # 1e11 / (0.5 · 1e12)
    model.add(plan.Measured(flops_per_step=1e10, step_seconds=0.1, overhead_seconds=8))
    assert model.step_seconds(4e10) == pytest.approx(0.4)  # scaled up from the nearest smaller pack
    assert model.step_seconds(1e9) == pytest.approx(0.1)  # never faster than a larger measured pack
    assert model.overhead_seconds() == 8


def test_packs_too_long_for_a_piece_are_split_and_single_runs_reported(full):
    runs = sorted(predicted_stage_2().expand().runs, key=lambda r: r.flops)
    biggest = [r for r in runs if (r.depth, r.width) == (runs[-1].depth, runs[-1].width)]
    assert len(biggest) == 5  # the largest shape's four seeds and its rate check
    settings = plan.PieceSettings(seconds=600, startup_seconds=0, reserve_seconds=0, mfu=0.1)
    model = plan.SpeedModel(settings, 989e12)
    one = model.seconds(Pack("p1", (biggest[0],)))
    tight = plan.PieceSettings(seconds=one * 1.5, startup_seconds=0, reserve_seconds=0, mfu=0.1)
    split = plan.fitting([Pack("p1", tuple(biggest))], plan.SpeedModel(tight, 989e12), tight.usable_seconds)
    assert [len(p.runs) for p in split] == [1, 1, 1, 1, 1] and [p.label for p in split][-1] == "p5"
    too_small = plan.PieceSettings(seconds=one / 2, startup_seconds=0, reserve_seconds=0, mfu=0.1)
    done, too_long = plan.pieces(split, plan.SpeedModel(too_small, 989e12))
    assert not done and len(too_long) == 5


def test_piece_script_is_shellcheck_clean_and_help_needs_no_jax():
    helpers.assert_shellcheck_clean(REPO / "gpu" / "piece.sh")
    done = helpers.run([sys.executable, "-X", "importtime", "-m", "sweeps.piece", "run", "--help"], timeout=120)
    assert done.returncode == 0 and "75 runs remain" in done.stdout and "--budget" in done.stdout
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "argparse" in imported and not imported & {"jax", "pydantic", "flax"}


# ---------------------------------------------------------------- the pre-registration


def test_the_analysis_commit_is_pinned_to_the_commit_that_added_the_re_registration():
    marker = re.search(r"PIN: (gpu-depth-v2-[0-9a-z-]+)", README.read_text()).group(1)
    found = helpers.run(["git", "log", "--format=%H", "-S", marker, "--", "results/gpu_depth/README.md"])
    if found.returncode != 0 or not found.stdout.strip():
        pytest.skip("not a git checkout holding the re-registration's commit")
    commits = found.stdout.split()
    assert len(commits) == 1  # added once, never removed: that commit is the pin
    listed = helpers.run(["git", "ls-tree", "-r", "--name-only", commits[0], "--", "analysis/transition.py"])
    assert listed.stdout.strip() == "analysis/transition.py"


def test_debian_versions_in_the_build_command_are_the_fingerprints():
    from scaling.data import corpus_build

    fingerprint = json.loads((REPO / "results/gpu_depth/corpus_fingerprint.json").read_text())
    command = corpus_build.__doc__.split("python -m scaling.corpus build")[0]
    pins = dict(re.findall(r"([a-z0-9.+-]+)=(\S+)", command))
    assert pins == {s["package"]: s["version"] for s in fingerprint["sources"].values()}


def test_fingerprint_verifies_and_overwrites_only_when_asked(tmp_path, capsys):
    from scaling.corpus import first_difference, keep_fingerprint

    built = {"sources": {"a": {"version": "2"}}, "archive": {"sha256": "x"}}
    path = tmp_path / "fingerprint.json"
    assert keep_fingerprint(built, path, overwrite=False) is None and json.loads(path.read_text()) == built
    assert keep_fingerprint(built, path, overwrite=False) is None
    changed = {"sources": {"a": {"version": "3"}}, "archive": {"sha256": "x"}}
    problem = keep_fingerprint(changed, path, overwrite=False)
    assert "sources.a.version: built '3', committed '2'" in problem and "\n" not in problem
    assert json.loads(path.read_text()) == built
    assert keep_fingerprint(changed, path, overwrite=True) is None and json.loads(path.read_text()) == changed
    assert first_difference(built, built) is None


# ---------------------------------------------------------------- packages, corpus, wandb


def test_missing_packages_without_wheels_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(packages, "CARRIED", packages.CARRIED + (packages.Requirement("tabulate", "tabulate", "99"),))
    with pytest.raises(packages.PackagesError) as caught:
        packages.ensure(tmp_path / "no-wheels")
    assert "missing tabulate==" in str(caught.value) and "python -m sweeps.piece wheels" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_wrong_archive_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPU_DEPTH_MICRO", "1")
    fingerprint = tmp_path / "fingerprint.json"
    fingerprint.write_text(json.dumps({"archive": {"sha256": "0" * 64}, "data_fingerprint": "x"}))
    archive = tmp_path / "tokens.tar.xz"
    archive.write_bytes(b"not the corpus")
    code = piece_main(["run", "--out", str(tmp_path / "out"), "--corpus", str(archive), "--fingerprint",
                       str(fingerprint), "--ledger", str(tmp_path / "ledger.json")])
    err = capsys.readouterr().err
    assert code == 4 and "is not the committed 00000000" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "piece.json").exists()


def test_launcher_refuses_offline_wandb_without_wandb_before_any_run(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    sweep_file = tiny.write_sweep(tmp_path)
    code = launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs"), "--set", "wandb_mode=offline"])
    err = capsys.readouterr().err
    assert code == 2 and "wandb_mode=offline needs wandb, which is not installed" in err
    assert "--set wandb_mode=disabled" in err and not (tmp_path / "runs" / "mini").exists()


# ---------------------------------------------------------------- accept


def micro_piece_out(tmp_path, monkeypatch) -> tuple[Path, object]:
    """A piece's $OUT as the piece writes it, with records written by hand for every micro scout run."""
    monkeypatch.setenv("GPU_DEPTH_MICRO", "1")
    monkeypatch.delenv("GPU_DEPTH_STAGE", raising=False)
    scout = gpu_depth.sweep()
    out = tmp_path / "out"
    write_scout_records(out / "records", scout, lambda run: 3.0 - 0.01 * run.depth)
    for run in scout.expand().runs:
        (out / "records" / scout.name / run.run_id / "config.json").write_text(json.dumps(_config_dict(run.config)))
    summary = {"format": "piece-v1", "sweep": scout.name, "commit": "", "source_digest": "x", "device": "cpu",
               "budget_seconds": 120, "wall_seconds": 100, "timing": []}
    (out / "piece.json").write_text(json.dumps(summary))
    return out, scout


def _config_dict(config):
    from scaling.config import to_dict

    return to_dict(config)


def git_repo_of_this_tree(tmp_path) -> tuple[Path, str]:
    """A git repository holding this tree's Python sources as one commit (its source digest is the tree's)."""
    repo = tmp_path / "repo"
    for folder in ledger_lib.SOURCE_FOLDERS:
        shutil.copytree(REPO / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for command in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree"]):
        helpers.run(["git", *command], cwd=repo, check=True)
    head = helpers.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True).stdout.strip()
    return repo, head


def test_accept_refuses_dirty_malformed_and_mismatched_records(tmp_path, monkeypatch):
    out, scout = micro_piece_out(tmp_path, monkeypatch)
    repo, head = git_repo_of_this_tree(tmp_path)
    lines = []
    kwargs = dict(results=tmp_path / "results", ledger_path=tmp_path / "ledger.json", data_fingerprint="corpus",
                  repo=repo, say=lines.append)
    assert accept_lib.accept(out, scout, **kwargs) == 1  # no commit named: every record is dirty
    assert all("dirty: the piece names no commit" in line for line in lines[:-1]) and "accepted 0" in lines[-1]
    summary = json.loads((out / "piece.json").read_text())
    digest = ledger_lib.source_digest(REPO)
    (out / "piece.json").write_text(json.dumps({**summary, "commit": head, "source_digest": digest}))
    run_dirs = sorted((out / "records" / scout.name).iterdir())
    for run_dir in run_dirs:  # trained by the commit the piece names (SCALING_CODE_VERSION there)
        record = json.loads((run_dir / "result.json").read_text())
        (run_dir / "result.json").write_text(json.dumps({**record, "code_version": head[:12]}))
    (run_dirs[0] / "result.json").write_text("{not json")
    bogus = run_dirs[1].with_name("0123456789ab")
    run_dirs[1].rename(bogus)
    lines.clear()
    assert accept_lib.accept(out, scout, **kwargs) == 1
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == 2 and any("malformed" in line for line in refused)
    assert any("0123456789ab" in line and ("mismatched" in line or "malformed" in line) for line in refused)
    ledger = ledger_lib.read(tmp_path / "ledger.json")
    assert len(ledger["runs"]) == len(run_dirs) - 2 and len(ledger["pieces"]) == 1
    accepted = next(iter(ledger["runs"]))
    assert (tmp_path / "results" / scout.name / accepted / "result.json").exists()
    lines.clear()
    (run_dirs[0] / "result.json").unlink()
    assert accept_lib.accept(out, scout, **{**kwargs, "data_fingerprint": "another"}) == 1
    assert all("already in the ledger" in line or "mismatched: trained on data" in line or "malformed" in line
               for line in lines if line.startswith("refused"))


# ---------------------------------------------------------------- a micro piece, end to end


def image_closure() -> set[str]:
    """Distributions of this environment an image with JAX, Flax, Optax and Orbax holds: those and what they
    need (extras followed), by normalised name."""
    from packaging.requirements import Requirement

    def normal(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    todo = [(normal(r.distribution), frozenset()) for r in packages.IMAGE]
    seen: dict[str, set] = {}
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in (seen[name] or {""})]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                todo.append((normal(requirement.name), frozenset(requirement.extras)))
    return set(seen)


def site_view(target: Path, keep: set[str]) -> None:
    """``target``: links to the top-level files of this environment's distributions named in ``keep`` only."""
    target.mkdir()
    for dist in metadata.distributions():
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower() not in keep:
            continue
        root = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if (root / top).exists() and not (target / top).exists():
                (target / top).symlink_to(root / top)


def repack_wheel(distribution: str, out: Path) -> Path:
    """A wheel of the installed ``distribution``, rebuilt from its installed files (no network)."""
    dist = metadata.distribution(distribution)
    root = Path(dist.locate_file(""))
    files = [str(f) for f in dist.files if not str(f).startswith("..") and "__pycache__" not in str(f)
             and not str(f).endswith(".dist-info/RECORD")]
    tag = re.search(r"^Tag: (\S+)$", dist.read_text("WHEEL"), re.M).group(1)
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    info = f"{name}-{dist.version}.dist-info"
    info = next((f.split("/")[0] for f in files if f.endswith(".dist-info/METADATA")), info)
    wheel = out / f"{name}-{dist.version}-{tag}.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in files:
            data = (root / relative).read_bytes()
            archive.writestr(relative, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{relative},sha256={digest},{len(data)}")
        archive.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return wheel


@pytest.mark.slow
def test_a_micro_piece_end_to_end_in_a_fresh_environment(tmp_path):
    """A fresh venv that sees only an image's packages: the launcher stops in one line without pydantic; the
    piece without wheels stops in one line; with them it installs them offline, refuses a wrong archive,
    then trains under a 2-minute budget only the packs that fit (the micro design's largest shape never
    does), and its records are accepted and read by `analysis fit`. Minutes on 2 busy cores."""
    view, wheels = tmp_path / "view", tmp_path / "wheels"
    site_view(view, image_closure())
    wheels.mkdir()
    for requirement in packages.CARRIED:
        repack_wheel(requirement.distribution, wheels)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(helpers.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True).stdout.strip())
    (site / "image.pth").write_text(str(view) + "\n")
    sizes = tmp_path / "stage2_sizes.json"  # stage 2 (seeds 1, 2 and the rate check: packs of 2 and 3)
    sizes.write_text(json.dumps({"design": "gpu_depth_micro",
                                 "pairs": [{"shallow_depth": 1, "deep_depth": 2, "centre_params": 8e3}]}))
    env = tiny.env(GPU_DEPTH_MICRO="1", GPU_DEPTH_STAGE="2", GPU_DEPTH_SIZES=str(sizes), PIP_NO_INDEX="1")
    listed = helpers.run([python, "-m", "sweeps.launch", "list", "sweeps/configs/smoke.py"], env=env)
    assert listed.returncode == 3 and "missing packages pydantic" in listed.stderr
    assert len(listed.stderr.strip().splitlines()) == 1

    corpus = micro_corpus(tmp_path)
    stage = helpers.run([REPO / "gpu" / "run_stage.sh", "--stage", "1", "--budget", "5m", "--corpus", corpus],
                        env={**env, "PYTHON": str(python)})
    assert stage.returncode == 3 and stage.stderr.startswith("run_stage.sh: error: missing packages pydantic")
    assert len(stage.stderr.strip().splitlines()) == 1
    fingerprint = corpus.parent / "fingerprint.json"
    common = ["--fingerprint", fingerprint, "--ledger", tmp_path / "ledger.json"]
    no_wheels = helpers.run([python, "-m", "sweeps.piece", "run", "--out", tmp_path / "o1", "--corpus", corpus,
                             "--wheels", tmp_path / "none", *common, "--data-dir", tmp_path], env=env)
    assert no_wheels.returncode == 3 and "missing pydantic==" in no_wheels.stderr
    wrong = tmp_path / "wrong.tar.xz"
    wrong.write_bytes(corpus.read_bytes() + b"\0")
    refused = helpers.run([python, "-m", "sweeps.piece", "run", "--out", tmp_path / "o2", "--corpus", wrong,
                           "--wheels", wheels, *common, "--data-dir", tmp_path], env=env)
    assert refused.returncode == 4 and "refusing to train on another corpus" in refused.stderr
    assert "installing pydantic==" in refused.stdout

    repo, head = git_repo_of_this_tree(tmp_path)
    out = tmp_path / "out"
    piece = helpers.run([python, "-m", "sweeps.piece", "run", "--budget", "2m", "--out", out, "--corpus", corpus,
                         "--wheels", wheels, "--commit", head, *common, "--data-dir", tmp_path], env=env, timeout=600)
    assert piece.returncode == 75, piece.stdout[-3000:] + piece.stderr[-3000:]
    print(piece.stdout)
    summary = json.loads((out / "piece.json").read_text())
    assert summary["wall_seconds"] <= 120 and summary["trained"] and summary["installed"] == []
    for row in summary["timing"]:
        assert row["predicted_seconds"] <= row["remaining_seconds"]
    assert summary["left"][0]["predicted_seconds"] > summary["left"][0]["remaining_seconds"]
    assert any("d296" in name for pack in summary["left"] for name in pack["runs"])  # never started
    assert any(row["runs"] > 1 for row in summary["timing"])  # seeds and rate checks trained packed
    probe = summary["probe"]  # the first piece on a card: solo against 4 packed, at the cheapest shape
    assert probe["runs"] == 4 and probe["solo_tokens_per_second"] > 0 and probe["packed_tokens_per_second"] > 0
    assert "probe L2-d8" in (out / "timing.md").read_text()
    assert (out / "timing.md").read_text().count("\n") > 5

    accepted = helpers.run([sys.executable, "-m", "sweeps.piece", "accept", out, "--results", tmp_path / "results",
                            "--repo", repo, *common], env=env)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert f"accepted {len(summary['trained'])} run(s), refused 0" in accepted.stdout
    fit = helpers.run([sys.executable, "-m", "analysis", "fit", tmp_path / "results" / "gpu_depth_micro_stage2",
                       "--json", "--bootstrap", "20"], env=env)
    assert fit.returncode == 0, fit.stderr
