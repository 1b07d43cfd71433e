"""gs:// work directories go through one path layer: etils.epath over gcsfs, against a real storage API.

Every test here runs against fake-gcs-server (the ``gcs`` fixture in
conftest.py: a fresh bucket on a local emulator) through the real clients:
gcsfs for records, metrics, the token cache and the analysis,
google-cloud-storage for leases, tensorstore for orbax's arrays. Nothing
may land on the local disk (the fixture checks).
"""

import dataclasses
import json
import os

import pytest
from etils import epath

import tiny
from analysis.results import load_runs
from helpers import REPO
from scaling.config import DataConfig
from scaling.data import corpus, pipeline as data, __main__ as data_cli, token_cache
from scaling.run import train
from scaling.run.track import Tracker
from scaling.store import records
from scaling.store.metrics_log import read_metrics
from sweeps import launch, spec


def keys(bucket) -> set[str]:
    """Every object name in the bucket (without the bucket)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(bucket)
    fs.invalidate_cache()
    return {name[len(root) + 1:] for name in fs.find(root)}


def text(bucket, key) -> str:
    return epath.Path(f"{bucket}/{key}").read_text()


def spy_on_training_batches(monkeypatch) -> dict:
    """step -> ``data.batch_digest`` of every training batch the trainer's pipeline makes."""
    seen, real_build = {}, data.build

    def build(config):
        pipeline = real_build(config)
        real_batch = pipeline.train_batch

        def train_batch(seed, step, *args):
            batch = real_batch(seed, step, *args)
            seen[step] = data.batch_digest(batch)
            return batch

        pipeline.train_batch = train_batch
        return pipeline

    monkeypatch.setattr(data, "build", build)
    return seen


def test_a_run_trains_from_a_gs_token_cache_alone_and_writes_its_records_to_gs(gcs, tmp_path, monkeypatch,
                                                                               own_cache_home):
    # Tokens: a local jsonl file, cached once on gs:// and then deleted; the run
    # must see the very batches the file gave, with the hub switched off.
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps({"text": f"Line {i}: " + "words and more words " * (1 + i % 5)}) + "\n"
                              for i in range(80)))
    from_file = DataConfig(source="local", paths=(str(source),), seq_len=32, validation_fraction=0.1)
    before = data.build(from_file)
    expected = {step: data.batch_digest(before.train_batch(0, step, 8)) for step in range(tiny.STEPS)}
    data_cli.main(token_cache.cache_command(from_file, f"{gcs}/tokens").split()[3:]
              + ["--quiet", "--shard-documents", "20"])
    assert {"tokens/metadata.json", "tokens/train-00001.npy"} <= keys(gcs)
    source.unlink()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(corpus, "load_documents", lambda *a, **k: pytest.fail("the corpus source was read"))
    seen = spy_on_training_batches(monkeypatch)

    config = tiny.config(data=dataclasses.replace(from_file, cache_dir=f"{gcs}/tokens"), log_every=2, name="remote")
    workdir = f"{gcs}/sweep/remote"
    result = tiny.run(config, workdir)

    assert result.status == "finished"
    assert {step: seen[step] for step in range(tiny.STEPS)} == expected
    assert result.data_fingerprint == before.fingerprint
    assert not os.path.exists(source)
    stored = keys(gcs)
    assert {"sweep/remote/config.json", "sweep/remote/result.json"} <= stored
    assert {"sweep/remote/checkpoints/4/state/_METADATA", "sweep/remote/checkpoints/8/meta/metadata"} <= stored
    assert not any(key.endswith(".tmp") or "lease" in key for key in stored)  # written whole; lease released
    assert json.loads(text(gcs, "sweep/remote/config.json"))["name"] == "remote"
    steps = [row["step"] for row in read_metrics(workdir)]
    assert steps == sorted(set(steps)) and 2 in steps and tiny.STEPS in steps
    assert any(key.startswith("sweep/remote/metrics/") for key in stored)  # one object per flush
    assert records.read_record(workdir) == result
    assert train.run(config, workdir, show_progress=False) == result  # finished: read back, not retrained


def _tracker(run, start_step: int = 0) -> Tracker:
    """A 4-step run's tracker without wandb or a display; resumed at ``start_step`` if it is not 0."""
    return Tracker(run, total_steps=4, start_step=start_step, config={}, name="t", mode="disabled",
                   show_progress=False, keep_until_step=start_step or None)


@pytest.mark.parametrize("killed_first", [False, True], ids=["resumed", "killed-then-resumed"])
def test_metrics_are_new_objects_per_flush_and_a_resume_cuts_them(gcs, killed_first):
    # Object stores cannot append: each flush writes a new object, never rewriting earlier ones,
    # and a tracker resumed at step 2 drops rows after it and merges into row 2. Row 2 stays stored
    # until the resumed run writes it again: a resume killed before its first write loses nothing.
    run = f"{gcs}/run"
    tracker = _tracker(run)
    for step in (1, 2, 3):
        tracker.log(step, {"loss": 1.0 / step})
    tracker.close()
    assert sorted(k for k in keys(gcs) if k.startswith("run/metrics/")) == [
        "run/metrics/0000000001-0000000001.jsonl", "run/metrics/0000000002-0000000002.jsonl",
        "run/metrics/0000000003-0000000003.jsonl"]
    if killed_first:
        _tracker(run, start_step=2).discard_pending()  # killed before its first write
        assert read_metrics(run) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
    resumed = _tracker(run, start_step=2)
    resumed.log(2, {"eval_loss": 9.0})
    resumed.log(4, {"loss": 0.25})
    resumed.close()
    assert read_metrics(run) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5, "eval_loss": 9.0},
                                 {"step": 4, "loss": 0.25}]
    assert sorted(k for k in keys(gcs) if k.startswith("run/metrics/"))[-2:] == [
        "run/metrics/0000000002-0000000002.jsonl", "run/metrics/0000000004-0000000004.jsonl"]


def write_record(directory, name, depth, width, loss):
    run = epath.Path(directory) / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "result.json").write_text(json.dumps({
        "status": "finished", "name": name, "run_id": name, "depth": depth, "width": width, "seed": 0,
        "params_non_embedding": 12 * depth * width ** 2, "final_eval_loss": loss, "data_fingerprint": "fp",
        "schema_version": 2, "point_id": f"L{depth}-d{width}", "lr_rule": "constant", "peak_lr": 1e-3,
        "planned_steps": 10}))


def test_analysis_loads_a_sweep_and_a_csv_from_gs(gcs):
    for depth in (2, 4):
        for width in (32, 64):
            write_record(f"{gcs}/sweeps/demo", f"L{depth}-d{width}", depth, width, 3.0 - 0.01 * width)
    write_record(f"{gcs}/sweeps/demo/nested", "L6-d32", 6, 32, 2.5)  # found however deep
    table = load_runs(f"{gcs}/sweeps/demo")
    assert sorted(table.runs["name"]) == ["L2-d32", "L2-d64", "L4-d32", "L4-d64", "L6-d32"]
    assert table.source == f"{gcs}/sweeps/demo"

    epath.Path(f"{gcs}/runs.csv").write_text("depth,width,params,seed,loss\n2,32,24576,0,3.0\n")
    assert load_runs(f"{gcs}/runs.csv").runs["loss"].tolist() == [3.0]
    with pytest.raises(Exception, match="no such file"):
        load_runs(f"{gcs}/missing")


def test_analysis_writes_its_csv_fit_and_figures_to_gs(gcs, capsys):
    from analysis.__main__ import main

    assert main(["synthetic", "--out", f"{gcs}/synthetic.csv", "--depths", "2", "4", "6", "--seeds", "2"]) == 0
    assert main(["fit", f"{gcs}/synthetic.csv", "--save", f"{gcs}/fit.json", "--bootstrap", "20"]) == 0
    assert main(["optimal", "--params", "1e9", "--fit", f"{gcs}/fit.json"]) == 0
    assert main(["plot", f"{gcs}/synthetic.csv", "--out", f"{gcs}/figures", "--bootstrap", "20"]) == 0
    capsys.readouterr()
    stored = keys(gcs)
    assert {"synthetic.csv", "fit.json"} <= stored and "figures/loss_vs_size.png" in stored
    assert epath.Path(f"{gcs}/figures/loss_vs_size.pdf").read_bytes().startswith(b"%PDF")


def test_launcher_status_reads_run_records_from_gs(gcs, capsys):
    sweep_file = REPO / "sweeps" / "configs" / "smoke.py"
    runs = spec.load_sweep(sweep_file).expand().runs
    done = runs[0].run_dir(f"{gcs}/runs")
    done.mkdir(parents=True)
    model = runs[0].config.model
    (done / "metrics.jsonl").write_text('{"step": 0, "eval_loss": 2.0}\n')  # a finished run's log holds its loss
    records.write_record(done, records.RunRecord(
        run_id=runs[0].run_id, status="finished", depth=model.depth, width=model.width, seed=0,
        params_non_embedding=12 * model.depth * model.width ** 2, name=runs[0].name, final_eval_loss=2.0,
        point_id=runs[0].run_id, lr_rule="constant", peak_lr=1e-3, planned_steps=10))
    assert launch.main(["status", str(sweep_file), "--workdir", f"{gcs}/runs", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"]["finished"] == 1 and status["total"] == len(runs)
    finished = [row["name"] for row in status["runs"] if row["status"] == "finished"]
    assert finished == [runs[0].name]
