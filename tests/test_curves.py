"""``python -m analysis curves``: loss against step and tokens per run (analysis/curves.py), drawn from the
metrics of the session's tiny reference run, local and on the Cloud Storage emulator."""

from __future__ import annotations

import json
import shutil

import pytest
from etils import epath

import tiny
from analysis import curves
from analysis.__main__ import main
from scaling.store.metrics_log import MetricsLog, read_metrics

TOKENS_PER_STEP = tiny.config().batch_size * tiny.config().data.seq_len


def as_shape(run_dir, target, depth: int, width: int, loss_shift: float):
    """A copy of the run at ``run_dir`` relabelled as depth ``depth`` and width ``width`` (its config),
    every loss moved by ``loss_shift`` nats, so a sweep of several shapes needs one training run only."""
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("checkpoints"))
    config = json.loads((target / "config.json").read_text())
    config["model"].update(depth=depth, width=width)
    (target / "config.json").write_text(json.dumps(config))
    rows = read_metrics(target)
    for row in rows:
        for key in ("loss", "eval_loss"):
            if key in row:
                row[key] += loss_shift
    (target / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return target


@pytest.fixture
def sweep(tiny_reference, tmp_path):
    """A sweep directory of three runs: L1-d16 (the tiny run itself), L1-d32 and L2-d16."""
    run_dir, _ = tiny_reference
    root = tmp_path / "runs" / "mini"
    root.mkdir(parents=True)
    shutil.copytree(run_dir, root / "a", ignore=shutil.ignore_patterns("checkpoints"))
    as_shape(run_dir, root / "b", 1, 32, -0.1)
    as_shape(run_dir, root / "c", 2, 16, -0.2)
    return root


def test_a_run_reads_as_its_metrics_with_tokens(tiny_reference):
    run_dir, record = tiny_reference
    runs, notes = curves.load_curves(run_dir)
    assert notes == [] and len(runs) == 1
    run = runs[0]
    assert (run.depth, run.width, run.status) == (1, 16, "finished")
    rows = read_metrics(run_dir)
    assert run.train[:, 0].tolist() == [row["step"] for row in rows if "loss" in row]
    assert run.train[:, 2].tolist() == [row["loss"] for row in rows if "loss" in row]
    assert run.train[:, 1].tolist() == [row["tokens"] for row in rows if "loss" in row]
    # Evaluations at steps 0 (before training) and the last; tokens from the logged tokens per step.
    assert run.eval[:, 0].tolist() == [0, tiny.STEPS]
    assert run.eval[:, 1].tolist() == [0, tiny.STEPS * TOKENS_PER_STEP]
    assert run.eval[-1, 2] == pytest.approx(record.final_eval_loss)


def test_one_run_gives_one_figure(tiny_reference, tmp_path, capsys):
    run_dir, _ = tiny_reference
    out = tmp_path / "figures"
    assert main(["curves", str(run_dir), "--out", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["runs"] == [str(run_dir)]
    assert sorted(p.name for p in out.iterdir()) == ["curves_L1.pdf", "curves_L1.png"]
    assert (out / "curves_L1.png").read_bytes().startswith(b"\x89PNG")


def test_a_sweeps_run_by_its_name(tiny_reference, tmp_path, capsys):
    run_dir, _ = tiny_reference
    shutil.copytree(run_dir, tmp_path / "smoke" / "0123456789ab")
    assert main(["curves", str(tmp_path / "smoke" / "tiny"), "--out", str(tmp_path / "figures"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == [str(tmp_path / "smoke" / "0123456789ab")]
    assert main(["curves", str(tmp_path / "smoke" / "tiyn"), "--out", str(tmp_path / "figures")]) == 2
    assert "nearest run names: tiny" in capsys.readouterr().err


@pytest.mark.parametrize("by, stems", [("depth", ["curves_L1", "curves_L2"]), ("width", ["curves_d16", "curves_d32"])])
def test_a_sweep_gives_one_figure_per_depth_or_width(sweep, tmp_path, capsys, by, stems):
    out = tmp_path / "figures"
    assert main(["curves", str(sweep), "--out", str(out), "--by", by]) == 0
    printed = capsys.readouterr().out
    assert "read 3 runs" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}.{kind}" for stem in stems
                                                           for kind in ("png", "pdf"))


def test_a_figure_labels_its_axes_and_tells_runs_and_train_from_eval(sweep):
    runs, _ = curves.load_curves(sweep)
    depth_one = [run for run in runs if run.depth == 1]
    fig = curves.plot_curves(depth_one, "depth", 1, source="mini")
    by_step, by_tokens = fig.axes
    assert by_step.get_xlabel() == "optimizer step"
    assert "tokens" in by_tokens.get_xlabel()
    assert "nats/token" in by_step.get_ylabel()
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels[:2] == ["d = 16", "d = 32"]
    assert any(label.startswith("train loss") for label in labels)
    assert any(label.startswith("eval loss") for label in labels)
    # Per run and panel: the train curve, the evaluation before training, the later evaluations.
    styles = [line.get_linestyle() for line in by_step.get_lines()]
    assert styles.count("-") == 2 and styles.count("--") == 2 and styles.count("None") == 2
    # The tokens panel is the step panel times the tokens per step.
    for step_line, token_line in zip(by_step.get_lines(), by_tokens.get_lines()):
        assert list(token_line.get_xdata()) == [x * TOKENS_PER_STEP for x in step_line.get_xdata()]
    assert "L = 1" in fig._suptitle.get_text()


def test_log_axes_leave_out_step_zero(sweep, tmp_path):
    runs, _ = curves.load_curves(sweep)
    fig = curves.plot_curves(runs[:1], "depth", 1, log=True)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    assert all(min(line.get_xdata()) > 0 for line in fig.axes[0].get_lines())


def test_unfinished_runs_and_several_seeds_say_so_in_the_legend(sweep):
    config_file = sweep / "b" / "config.json"
    config = json.loads(config_file.read_text())
    config["model"]["width"], config["seed"] = 16, 1
    config_file.write_text(json.dumps(config))
    record_file = sweep / "b" / "result.json"
    record_file.write_text(json.dumps({**json.loads(record_file.read_text()), "status": "stopped"}))
    runs, _ = curves.load_curves(sweep)
    fig = curves.plot_curves([run for run in runs if run.depth == 1], "depth", 1)
    assert [text.get_text() for text in fig.legends[0].get_texts()][0] == "d = 16, 2 seeds, 1 stopped"


def test_a_run_without_losses_is_left_out_with_a_note(sweep, tmp_path, capsys):
    (sweep / "c" / "metrics.jsonl").write_text("")
    out = tmp_path / "figures"
    assert main(["curves", str(sweep), "--out", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert len(written["runs"]) == 2 and len(written["notes"]) == 1 and "/c" in written["notes"][0]


@pytest.mark.parametrize("problem", ["out is a file", "no source", "source is a file", "no runs"])
def test_bad_input_gives_one_line(tiny_reference, tmp_path, capsys, problem):
    run_dir, _ = tiny_reference
    source, out = str(run_dir), tmp_path / "figures"
    if problem == "out is a file":
        out.write_text("not a folder")
    elif problem == "no source":
        source = str(tmp_path / "missing")
    elif problem == "source is a file":
        source = str(run_dir / "metrics.jsonl")
    else:
        source = str(tmp_path)
    assert main(["curves", source, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("python -m analysis curves: error: ")
    if problem == "out is a file":
        assert "is a file" in captured.err and str(out) in captured.err


def test_curves_of_a_sweep_on_cloud_storage(tiny_reference, gcs, capsys):
    run_dir, _ = tiny_reference
    rows = read_metrics(run_dir)
    for name, width in (("a", 16), ("b", 32)):
        remote = epath.Path(f"{gcs}/runs/mini/{name}")
        config = json.loads((run_dir / "config.json").read_text())
        config["model"]["width"] = width
        (remote / "config.json").write_text(json.dumps(config))
        log = MetricsLog(remote)  # the object-store layout: one object per flush under metrics/
        log.append(rows[:4])
        log.append(rows[4:])
    out = f"{gcs}/figures/curves"
    assert main(["curves", f"{gcs}/runs", "--out", out, "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert len(written["runs"]) == 2
    assert written["figures"] == [f"{out}/curves_L1.png", f"{out}/curves_L1.pdf"]
    assert epath.Path(f"{out}/curves_L1.png").read_bytes().startswith(b"\x89PNG")
    runs, _ = curves.load_curves(f"{gcs}/runs")
    assert [run.train[:, 2].tolist() for run in runs] == [[row["loss"] for row in rows if "loss" in row]] * 2


def test_without_logged_tokens_the_record_says_the_tokens_per_step(tmp_path):
    # Rows of a classification task are shorter than seq_len: the record's tokens per step is what was
    # trained, never the config's batch_size × seq_len (analysis reads records only).
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"model": {"depth": 1, "width": 16}, "batch_size": 16,
                                                     "data": {"seq_len": 128}}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 3.0}) + "\n")
    (run_dir / "result.json").write_text(json.dumps({"status": "finished", "tokens_per_step": 16 * 9}))
    run = curves.read_run(run_dir)
    assert run.train.tolist() == [[10, 10 * 16 * 9, 3.0]]
