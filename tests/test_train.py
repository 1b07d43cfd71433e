"""The trainer: learning, sharding equivalence, multi-host, resume, preemption, divergence, wandb."""

import dataclasses
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from scaling import data, mesh as mesh_lib, program as program_lib, records, train
from scaling.config import DataConfig, MeshConfig, ModelConfig, OptimConfig, TrainConfig
from scaling.stopping import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parents[1]


def small_config(**changes) -> TrainConfig:
    base = TrainConfig(
        model=ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=64),
        data=DataConfig(source="builtin", seq_len=64),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=5),
        steps=20, batch_size=8, eval_every=0, eval_batches=2, checkpoint_every=10, log_every=1,
        wandb_mode="offline", name="test")
    return dataclasses.replace(base, **changes)


def losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return env


def _cli(workdir, config: TrainConfig, *extra) -> list[str]:
    config_path = Path(workdir).parent / (Path(workdir).name + "-config.json")
    config_path.write_text(json.dumps(dataclasses.asdict(config)))
    return [sys.executable, "-m", "scaling.train", "--config", str(config_path), "--workdir", str(workdir),
            "--no-progress", *extra]


def test_eval_loss_falls_by_a_third(tmp_path):
    config = small_config(steps=150, eval_batches=4, model=ModelConfig(depth=2, width=64, head_dim=16,
                                                                        max_seq_len=64))
    result = train.run(config, tmp_path / "run", show_progress=False)
    assert result.status == "finished"
    assert result.final_eval_loss < 0.7 * result.initial_eval_loss
    for key in ("depth", "width", "params_non_embedding", "params_total", "final_eval_loss", "tokens", "steps",
                "wall_seconds", "code_version", "data_fingerprint"):
        assert getattr(result, key) not in (None, "")
    assert result.params_non_embedding == 12 * 2 * 64**2
    assert result.tokens == 150 * 8 * 64
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["final_eval_loss"] == result.final_eval_loss
    assert (tmp_path / "run" / "config.json").exists()


def test_one_device_and_eight_device_mesh_give_the_same_losses(tmp_path, eight_devices):
    single = train.run(small_config(), tmp_path / "one", show_progress=False, devices=eight_devices[:1])
    sharded_config = small_config(mesh=MeshConfig(data=2, fsdp=2, tensor=2))
    sharded = train.run(sharded_config, tmp_path / "eight", show_progress=False, devices=eight_devices)
    a, b = losses(tmp_path / "one"), losses(tmp_path / "eight")
    assert len(a) == len(b) == 20
    np.testing.assert_allclose(a, b, rtol=1e-4)
    assert abs(single.final_eval_loss - sharded.final_eval_loss) < 1e-4 * single.final_eval_loss


def test_params_are_created_sharded(eight_devices):
    config = small_config(mesh=MeshConfig(data=2, fsdp=2, tensor=2))
    mesh = mesh_lib.make_mesh(config.mesh, eight_devices)
    program = program_lib.build(config, mesh)
    state = program.init(jax.random.PRNGKey(0))
    kernel = state["params"]["layers"]["mlp"]["wi"]["kernel"]  # [layers, embed, mlp]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert kernel.addressable_shards[0].data.shape == (2, 16, 64)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_reproduce_the_eight_device_run(tmp_path, eight_devices):
    config = small_config(steps=10, mesh=MeshConfig(data=2, fsdp=2, tensor=2))
    train.run(config, tmp_path / "single", show_progress=False, devices=eight_devices)
    port = _free_port()
    workdir = tmp_path / "multi"
    procs = [subprocess.Popen(_cli(workdir, config, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                   "--process-id", str(i)),
                              cwd=REPO, env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    np.testing.assert_allclose(losses(workdir), losses(tmp_path / "single"), rtol=1e-4)


def _final_params(run_dir):
    manager = ocp.CheckpointManager(Path(run_dir) / "checkpoints", item_names=("state", "meta"))
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return step, restored["state"]["params"]


def _wait_for(predicate, timeout, proc):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.communicate()[0]}")
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_sigkill_then_restart_matches_an_uninterrupted_run(tmp_path):
    config = small_config(steps=60, log_every=2, eval_every=30, checkpoint_every=30)
    # The reference runs in the same kind of process as the killed run (one CPU device).
    subprocess.run(_cli(tmp_path / "reference", config), cwd=REPO, env=_env(1), check=True, capture_output=True)
    reference = json.loads((tmp_path / "reference" / "result.json").read_text())
    workdir = tmp_path / "killed"
    proc = subprocess.Popen(_cli(workdir, config), cwd=REPO, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    def logged_steps():
        text = (workdir / "metrics.jsonl").read_text() if (workdir / "metrics.jsonl").exists() else ""
        return [json.loads(line)["step"] for line in text.splitlines() if line.endswith("}")]

    # Kill once rows past the checkpoint of step 30 are on disk, so the resume must cut them.
    _wait_for(lambda: (workdir / "checkpoints" / "30").exists() and max(logged_steps(), default=0) >= 36, 240, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # like a machine dying: the trainer and its helpers
    proc.wait()
    assert not (workdir / "result.json").exists()
    assert max(logged_steps()) > 30 and not (workdir / "checkpoints" / "60").exists()
    restarted = subprocess.run(_cli(workdir, config), cwd=REPO, env=_env(1), capture_output=True, text=True)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    resumed = json.loads((workdir / "result.json").read_text())
    assert resumed["final_eval_loss"] == reference["final_eval_loss"]  # bitwise on CPU
    step_a, params_a = _final_params(tmp_path / "reference")
    step_b, params_b = _final_params(workdir)
    assert step_a == step_b == 60
    jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)
    assert _wandb_run_ids(workdir) == {resumed["wandb_id"]}  # the restart continued the same wandb run
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    reference_steps = [json.loads(line)["step"] for line in
                       (tmp_path / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert steps == reference_steps and len(steps) == len(set(steps))  # one row per step, none repeated


def test_sigterm_saves_and_exits_then_resumes(tmp_path):
    config = small_config(steps=400, log_every=5, checkpoint_every=1000)
    workdir = tmp_path / "preempted"
    proc = subprocess.Popen(_cli(workdir, config), cwd=REPO, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = workdir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(losses(workdir)) >= 2, 240, proc)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert time.time() - sent < 30
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(saved) == 1 and 0 < saved[0] < 400
    wandb_id_before = _wandb_run_ids(workdir)
    finished = subprocess.run(_cli(workdir, small_config(steps=400, log_every=5, checkpoint_every=1000)),
                              cwd=REPO, env=_env(1), capture_output=True, text=True)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_logged = [row["step"] for row in rows if "loss" in row]
    # the resumed process starts right after the saved step: no step is logged twice
    assert len(steps_logged) == len(set(steps_logged))
    assert min(s for s in steps_logged if s > saved[0]) == (saved[0] // 5 + 1) * 5
    assert json.loads((workdir / "result.json").read_text())["steps"] == 400
    assert _wandb_run_ids(workdir) == wandb_id_before  # one wandb id across the restart


def test_ctrl_c_stops_like_sigterm_and_a_second_one_exits_at_once(tmp_path):
    config = small_config(steps=400, log_every=5, checkpoint_every=1000, wandb_mode="disabled")
    workdir = tmp_path / "interrupted"
    proc = subprocess.Popen(_cli(workdir, config), cwd=REPO, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (workdir / "metrics.jsonl").exists() and len(losses(workdir)) >= 2, 240, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    [line] = [line for line in err.splitlines() if "stopped by" in line]
    assert line.startswith("stopped by SIGINT after step ") and line.endswith("checkpoint saved")
    record = json.loads((workdir / "result.json").read_text())
    assert record["status"] == "stopped" and record["error"] == line  # resumable, not failed
    saved = [p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1

    # Two presses: the first asks for a checkpoint, the second exits at once. (Two signals sent back to
    # back reach Python's handler as one, so they are sent from inside, a moment apart.)
    code = textwrap.dedent("""
        import os, signal, time
        from scaling.stopping import Stop
        stop = Stop()
        with stop.listening():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            print("asked to stop:", stop.requested, stop.signal, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
            print("still running", flush=True)
    """)
    sent = time.time()
    twice = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(1), capture_output=True, text=True,
                           timeout=60)
    assert twice.returncode == 130 and time.time() - sent < 25, twice.stderr
    assert twice.stdout == "asked to stop: True SIGINT\n" and "interrupted again: exiting now" in twice.stderr


def _wandb_records(path: Path):
    """Records of a wandb transaction log (leveldb-style 32 KiB blocks of CRC/length/type-framed chunks)."""
    from wandb.proto import wandb_internal_pb2

    raw, position, block, pending = path.read_bytes(), 7, 32768, b""
    while position + 7 <= len(raw):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        chunk = raw[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        elif kind in (2, 3):
            pending += chunk


def _wandb_run_ids(run_dir) -> set:
    return {p.name.rsplit("-", 1)[-1] for p in (Path(run_dir) / "wandb").glob("offline-run-*")}


def test_wandb_offline_run_holds_the_loss_history(tmp_path):
    config = small_config(steps=10, log_every=2, sweep_name="unit-sweep")
    result = train.run(config, tmp_path / "run", show_progress=False)
    run_files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    logged, group = [], None
    for record in _wandb_records(run_files[0]):
        if record.WhichOneof("record_type") == "history":
            values = {"/".join(item.nested_key) or item.key: item.value_json for item in record.history.item}
            if "loss" in values:
                logged.append(float(values["loss"]))
        if record.WhichOneof("record_type") == "run":
            group = record.run.run_group
            assert record.run.run_id == result.wandb_id
    np.testing.assert_allclose(logged, losses(tmp_path / "run"), rtol=1e-6)
    assert len(logged) == 5
    assert group == "unit-sweep"


def test_absurd_learning_rate_diverges_and_leaves_finite_checkpoints(tmp_path):
    # Warmup lets a few steps pass before the rate explodes, so checkpoints exist before the divergence.
    config = small_config(steps=30, checkpoint_every=2, log_every=1,
                          optim=OptimConfig(peak_lr=1e5, warmup_steps=10, schedule="constant", grad_clip=0.0,
                                            weight_decay=0.0))
    result = train.run(config, tmp_path / "run", show_progress=False)
    assert result.status == "diverged"
    assert 2 <= result.steps < 30
    step, params = _final_params(tmp_path / "run")
    assert step >= 2
    assert all(np.isfinite(leaf).all() for leaf in jax.tree_util.tree_leaves(params))
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "diverged"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["diverged"] == 1.0 and rows[-1]["loss"] is None  # strict JSON: no bare NaN


def test_rerun_of_a_finished_run_does_nothing(tmp_path):
    config = small_config(steps=4)
    first = train.run(config, tmp_path / "run", show_progress=False)
    stamp = (tmp_path / "run" / "result.json").stat().st_mtime_ns
    again = train.run(config, tmp_path / "run", show_progress=False)
    assert again == first
    assert (tmp_path / "run" / "result.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("changes,field", [
    ({"batch_size": 6, "mesh": MeshConfig(data=4)}, "batch_size"),
    ({"mesh": MeshConfig(data=3)}, "mesh"),
])
def test_bad_config_fails_before_compiling(tmp_path, eight_devices, changes, field, monkeypatch):
    compiled = []
    monkeypatch.setattr(train, "build", lambda *a, **k: compiled.append(1))
    devices = eight_devices[:4]
    with pytest.raises(ValueError, match=field):
        train.run(small_config(**changes), tmp_path / "run", show_progress=False, devices=devices)
    assert not compiled
    record = records.read_record(tmp_path / "run")  # the launcher's status shows why it failed
    assert record.status == "failed" and field in record.error and record.steps == 0


def test_cli_reports_bad_overrides_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "scaling.train", "--config", "tiny", "--workdir",
                          str(tmp_path / "x"), "--set", "optim.lr_rule=sometimes"],
                         cwd=REPO, env=_env(1), capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "lr_rule" in out.stderr


@pytest.mark.parametrize("rule,hidden,other", [
    ("constant", 1e-2, 1e-2), ("width_scaled", 1e-2 * 16 / 64, 1e-2 * 16 / 64), ("mup", 1e-2 * 16 / 64, 1e-2)])
def test_learning_rate_rules_set_per_group_step_sizes(rule, hidden, other, eight_devices):
    """Adam's first update is lr·sign(g), so each group's step size shows in the update."""
    config = small_config(model=ModelConfig(depth=2, width=64, head_dim=16, max_seq_len=64),
                          optim=OptimConfig(peak_lr=1e-2, lr_rule=rule, base_width=16, warmup_steps=0,
                                            schedule="constant", weight_decay=0.0, grad_clip=0.0))
    mesh = mesh_lib.make_mesh(config.mesh, eight_devices[:1])
    program = program_lib.build(config, mesh)
    state = program.init(jax.random.PRNGKey(0))
    before = jax.tree_util.tree_map(np.asarray, state["params"])
    batch = {key: np.asarray(value) for key, value in data.build(config.data).train_batch(0, 0, 8).items()}
    state, metrics = program.train_step(state, mesh_lib.global_batch(batch, mesh, 8),
                                        program_lib.hyperparameters(config))
    after = state["params"]

    def step_size(path):
        node_before, node_after = before, after
        for key in path:
            node_before, node_after = node_before[key], node_after[key]
        moved = np.abs(np.asarray(node_after) - node_before)
        return float(np.median(moved[moved > 0]))  # unused embedding rows get no gradient

    assert step_size(["layers", "mlp", "wi", "kernel"]) == pytest.approx(hidden, rel=1e-3)
    assert step_size(["layers", "attention", "query", "kernel"]) == pytest.approx(hidden, rel=1e-3)
    assert step_size(["token_embedding", "embedding"]) == pytest.approx(other, rel=1e-3)
    assert step_size(["unembedding", "kernel"]) == pytest.approx(other, rel=1e-3)


def test_classification_record_holds_accuracy_and_bits(tmp_path):
    """FIRST, learnable in a few hundred steps: the record's accuracy and bits are the eval's."""
    config = TrainConfig(
        model=ModelConfig(depth=2, width=16, num_heads=1, max_seq_len=33, objective="masked", norm="post"),
        data=DataConfig(source="first", seq_len=33, synthetic_min_length=8, synthetic_max_length=8,
                        synthetic_eval_min_length=8, synthetic_eval_max_length=8),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=0, weight_decay=0.0),
        steps=300, batch_size=16, eval_every=0, eval_batches=8, checkpoint_every=300, log_every=50,
        wandb_mode="disabled", name="first")
    result = train.run(config, tmp_path / "run", show_progress=False)
    assert result.status == "finished"
    assert result.final_eval_accuracy > 0.95  # chance is 0.5
    assert result.final_eval_bits == pytest.approx(result.final_eval_loss / np.log(2))
    assert result.final_eval_bits < 0.3  # of at most ~1 bit at chance
    assert result.tokens_per_step == 16 * 9  # rows of 8 bits and CLS, not seq_len
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["final_eval_accuracy"] == result.final_eval_accuracy
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["eval_accuracy"] == result.final_eval_accuracy


def test_language_model_record_has_no_accuracy(tmp_path):
    result = train.run(small_config(steps=2, checkpoint_every=2), tmp_path / "run", show_progress=False)
    assert result.status == "finished"
    assert result.final_eval_accuracy is None and result.final_eval_bits is None
