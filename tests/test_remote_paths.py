"""gs:// work directories go through one path layer: etils.epath over fsspec.

A fake ``gs`` protocol, an fsspec in-memory filesystem that names paths the
way gcsfs does (``bucket/key``), stands in for Google Cloud Storage. epath
hands ``gs://`` paths to fsspec, so the trainer's run records, the metrics
log, the token cache, the launcher's status and the analysis loader all run
their real code against it; nothing may land on the local disk.

Orbax checkpoints cannot use the fake: for ``gs://`` orbax asks
google-cloud-storage about the bucket itself (``gcs_utils.get_bucket``) and
tensorstore writes arrays with its own GCS driver, neither through fsspec.
The end-to-end test therefore points only the CheckpointManager at a local
directory; every other file of the run goes to gs://.
"""

import dataclasses
import json
import os
import sys
from pathlib import Path

import fsspec.registry  # noqa: F401 - the module whose table we patch
import jax
import orbax.checkpoint as ocp
import pytest
from etils import epath
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from analysis.results import load_runs
from scaling import corpus, data, records, token_cache, train
from scaling.config import DataConfig, ModelConfig, TrainConfig
from scaling.track import Tracker
from sweeps import launch, spec

REPO = Path(__file__).resolve().parents[1]


class FakeGCS(MemoryFileSystem):
    """In-memory stand-in for gcsfs: ``gs://bucket/key`` is stored under ``bucket/key``."""

    protocol = ("gs", "gcs")
    root_marker = ""
    store = {}
    pseudo_dirs = [""]

    def __init__(self, *args, finalize_on_close=None, **kwargs):  # epath passes gcsfs's finalize_on_close
        super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        for prefix in ("gs://", "gcs://"):
            if path.startswith(prefix):
                path = path[len(prefix):]
        return path.strip("/")


@pytest.fixture
def gcs(monkeypatch, tmp_path):
    """The fake bucket store (a dict of key -> file); the test runs in an empty local directory."""
    registry = sys.modules["fsspec.registry"]._registry  # fsspec.registry the attribute is a read-only view
    for name in FakeGCS.protocol:
        monkeypatch.setitem(registry, name, FakeGCS)  # undone after the test
    epath_backend.fsspec_backend._get_filesystem.cache_clear()  # epath caches the gcs filesystem it made
    FakeGCS.store.clear()
    FakeGCS.pseudo_dirs[:] = [""]
    local = tmp_path / "cwd"
    local.mkdir()
    monkeypatch.chdir(local)
    yield FakeGCS.store
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    assert not any(local.iterdir()), f"files landed on the local disk: {list(local.iterdir())}"


def text(store, key) -> str:
    return bytes(store[key].getvalue()).decode()


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


def test_a_run_trains_from_a_gs_token_cache_alone_and_writes_its_records_to_gs(gcs, tmp_path, monkeypatch):
    # Tokens: a local jsonl file, cached once on gs:// and then deleted; the run
    # must see the very batches the file gave, with the hub switched off.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps({"text": f"Line {i}: " + "words and more words " * (1 + i % 5)}) + "\n"
                              for i in range(80)))
    from_file = DataConfig(source="local", paths=(str(source),), seq_len=32, validation_fraction=0.1)
    before = data.build(from_file)
    expected = {step: data.batch_digest(before.train_batch(0, step, 4)) for step in range(4)}
    data.main(token_cache.cache_command(from_file, "gs://bucket/tokens").split()[3:]
              + ["--quiet", "--shard-documents", "20"])
    assert "bucket/tokens/metadata.json" in gcs and "bucket/tokens/train-00001.npy" in gcs
    source.unlink()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(corpus, "load_documents", lambda *a, **k: pytest.fail("the corpus source was read"))
    seen = spy_on_training_batches(monkeypatch)

    checkpoints = tmp_path / "checkpoints"  # orbax only; see the module docstring
    real_manager = ocp.CheckpointManager
    from scaling import checkpoints as checkpoints_lib

    monkeypatch.setattr(checkpoints_lib.ocp, "CheckpointManager",
                        lambda directory, **kwargs: real_manager(checkpoints, **kwargs))
    config = TrainConfig(model=ModelConfig(depth=1, width=32, head_dim=16, max_seq_len=32),
                         data=dataclasses.replace(from_file, cache_dir="gs://bucket/tokens"), steps=4, batch_size=4,
                         eval_every=0, eval_batches=1, checkpoint_every=2, log_every=2, wandb_mode="disabled",
                         name="remote")
    workdir = "gs://bucket/sweep/remote"
    result = train.run(config, workdir, show_progress=False, devices=jax.devices()[:1])

    assert result.status == "finished"
    assert {step: seen[step] for step in range(4)} == expected
    assert result.data_fingerprint == before.fingerprint
    assert not os.path.exists(source)
    assert {"bucket/sweep/remote/config.json", "bucket/sweep/remote/metrics.jsonl",
            "bucket/sweep/remote/result.json"} <= set(gcs)
    assert not any(key.endswith(".tmp") for key in gcs)  # written then renamed into place
    assert json.loads(text(gcs, "bucket/sweep/remote/config.json"))["name"] == "remote"
    steps = [json.loads(line)["step"] for line in text(gcs, "bucket/sweep/remote/metrics.jsonl").splitlines()]
    assert steps == sorted(steps) and 2 in steps and 4 in steps
    assert records.read_record(workdir) == result
    assert train.run(config, workdir, show_progress=False) == result  # finished: read back, not retrained


def test_metrics_log_keeps_earlier_lines_when_rewritten(gcs):
    # Object stores cannot append: each flush rewrites the file, and a resumed
    # tracker must keep what the previous one wrote.
    for step in (1, 2):
        tracker = Tracker("gs://bucket/run", total_steps=2, start_step=step - 1, config={}, name="t",
                          mode="disabled", show_progress=False, keep_until_step=step - 1 if step > 1 else None)
        tracker.log(step, {"loss": 1.0 / step})
        tracker.close()
    rows = [json.loads(line) for line in text(gcs, "bucket/run/metrics.jsonl").splitlines()]
    assert rows == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]


def write_record(directory, name, depth, width, loss):
    run = epath.Path(directory) / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "result.json").write_text(json.dumps({
        "status": "finished", "name": name, "run_id": name, "depth": depth, "width": width, "seed": 0,
        "params_non_embedding": 12 * depth * width ** 2, "final_eval_loss": loss, "data_fingerprint": "fp"}))


def test_analysis_loads_a_sweep_and_a_csv_from_gs(gcs):
    for depth in (2, 4):
        for width in (32, 64):
            write_record("gs://bucket/sweeps/demo", f"L{depth}-d{width}", depth, width, 3.0 - 0.01 * width)
    write_record("gs://bucket/sweeps/demo/nested", "L6-d32", 6, 32, 2.5)  # found however deep
    table = load_runs("gs://bucket/sweeps/demo")
    assert sorted(table.runs["name"]) == ["L2-d32", "L2-d64", "L4-d32", "L4-d64", "L6-d32"]
    assert table.source == "gs://bucket/sweeps/demo"

    epath.Path("gs://bucket/runs.csv").write_text("depth,width,params,seed,loss\n2,32,24576,0,3.0\n")
    assert load_runs("gs://bucket/runs.csv").runs["loss"].tolist() == [3.0]
    with pytest.raises(Exception, match="no such file"):
        load_runs("gs://bucket/missing")


def test_launcher_status_reads_run_records_from_gs(gcs, capsys):
    sweep_file = REPO / "sweeps" / "configs" / "smoke.py"
    runs = spec.load_sweep(sweep_file).expand().runs
    done = runs[0].run_dir("gs://bucket/runs")
    done.mkdir(parents=True)
    model = runs[0].config.model
    records.write_record(done, records.RunRecord(
        run_id=runs[0].run_id, status="finished", depth=model.depth, width=model.width, seed=0,
        params_non_embedding=12 * model.depth * model.width ** 2, name=runs[0].name, final_eval_loss=2.0))
    assert launch.main(["status", str(sweep_file), "--workdir", "gs://bucket/runs", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"]["finished"] == 1 and status["total"] == len(runs)
    finished = [row["name"] for row in status["runs"] if row["status"] == "finished"]
    assert finished == [runs[0].name]
