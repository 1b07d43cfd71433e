"""Pod-wide mode without a TPU: two local CPU processes (gloo, 4 devices each) as one JAX job.

- The launcher's run list comes from process 0, so a host that sees a stale
  ``result.json`` still trains the same runs as the others.
- The training loop's stop-for-SIGTERM check makes no cross-process transfer
  except on the check steps every process agreed on beforehand.
- ``make_mesh`` refuses a device layout it cannot build instead of reshaping.
"""

import json
import signal
import sys
import textwrap
import time

import numpy as np
import pytest

import helpers
from scaling import multihost
from scaling.config import MeshConfig
from scaling.model import mesh as mesh_lib
from scaling.run import stopping
from scaling.store import records
from sweeps import spec

SWEEP = '''"""Two tiny runs for the pod-wide test."""
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep():
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=32), data=DataConfig(source="builtin", seq_len=32),
        optim=OptimConfig(warmup_steps=2, peak_lr=3e-3), steps=12, batch_size=8, eval_every=0,
        eval_batches=1, checkpoint_every=4, log_every=3, wandb_mode="disabled")
    return Sweep(name="pod", base=base, depths=(1,), widths={1: (16, 32)}, multiple_of=16)
'''

# Runs the launcher in one process of the pair and reports, as JSON, which runs
# train.run trained there and where the loop made cross-process transfers.
DRIVER = textwrap.dedent('''
    import json, os, sys
    from jax.experimental import multihost_utils
    from scaling.run import stopping, train
    from sweeps import launch

    report = {"trained": [], "loop_transfers": [], "checked_steps": []}
    real_allgather, real_broadcast = multihost_utils.process_allgather, multihost_utils.broadcast_one_to_all

    def loop_call():
        """(step, "file:function" of the caller) when called from inside the training loop, else None."""
        frame = caller = sys._getframe(2)
        while caller.f_code.co_filename.endswith("multihost.py"):  # the function that asked scaling.multihost
            caller = caller.f_back
        while frame is not None:
            if frame.f_code.co_qualname in ("Training.steps", "Training.end", "Training.train"):
                where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_code.co_name}"
                return [frame.f_locals.get("done"), where]
            frame = frame.f_back
        return None

    def allgather(value, *args, **kwargs):
        call = loop_call()
        if call:
            report["loop_transfers"].append(call)
        return real_allgather(value, *args, **kwargs)

    def broadcast(value, *args, **kwargs):
        call = loop_call()
        if call:
            report["loop_transfers"].append(call)
        return real_broadcast(value, *args, **kwargs)

    multihost_utils.process_allgather, multihost_utils.broadcast_one_to_all = allgather, broadcast
    real_agree, real_run = stopping.StopCheck.agree, train.run

    def agree(self, flag, step):
        report["checked_steps"].append(step)
        return real_agree(self, flag, step)

    def run(config, run_dir, **kwargs):
        result = real_run(config, run_dir, **kwargs)
        report["trained"].append([config.name, result.status, result.steps, result.final_eval_loss])
        return result

    stopping.StopCheck.agree, train.run = agree, run
    code = launch.main(sys.argv[1:])
    with open(os.environ["POD_TEST_REPORT"], "w") as handle:
        json.dump({"exit": code, **report}, handle)
    sys.exit(code)
''')


def start_pair(tmp_path, sweep_file, workdirs) -> list:
    """Two launcher processes, ``run --pod-wide``, as one JAX job on 2 × 4 CPU devices (gloo)."""
    port, processes = helpers.free_port(), []
    for index, workdir in enumerate(workdirs):
        env = helpers.with_checkout(helpers.clean_env(
            JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index),
            POD_TEST_REPORT=str(tmp_path / f"report{index}.json"), WANDB_MODE="disabled"))
        processes.append(helpers.start([sys.executable, tmp_path / "driver.py", "run", sweep_file, "--workdir",
                                        workdir, "--pod-wide"], env=env, merge_stderr=True))
    return processes


@pytest.mark.slow
def test_two_processes_pod_wide_train_the_same_runs_despite_a_stale_record(tmp_path):
    sweep_file = tmp_path / "pod.py"
    sweep_file.write_text(SWEEP)
    (tmp_path / "driver.py").write_text(DRIVER)
    runs = sorted(spec.load_sweep(sweep_file).expand().runs, key=lambda r: r.flops)
    stale_run = runs[0]  # the first run trained

    # Process 0 sees the shared work directory as it is. Process 1 sees the same
    # directories through symlinks, except that for the first run it also sees a
    # result.json saying "finished": the record another host has not seen yet.
    shared, view = tmp_path / "shared", tmp_path / "view"
    for run in runs:
        (shared / "pod" / run.run_id / "checkpoints").mkdir(parents=True)
        (view / "pod").mkdir(parents=True, exist_ok=True)
        if run is stale_run:
            (view / "pod" / run.run_id).mkdir()
            (view / "pod" / run.run_id / "checkpoints").symlink_to(shared / "pod" / run.run_id / "checkpoints")
        else:
            (view / "pod" / run.run_id).symlink_to(shared / "pod" / run.run_id)
    stale = records.RunRecord(run_id=stale_run.run_id, status="finished", depth=1, width=stale_run.width, seed=0,
                              params_non_embedding=stale_run.params, name=stale_run.name, sweep="pod", steps=12,
                              point_id=stale_run.run_id, lr_rule="constant", peak_lr=1e-3, planned_steps=12,
                              final_eval_loss=9.5)
    records.write_record(view / "pod" / stale_run.run_id, stale)

    started = time.perf_counter()
    processes = start_pair(tmp_path, sweep_file, (shared, view))
    outputs = [done.stdout for done in helpers.finish(processes, timeout=400)]
    print(f"two-process pod-wide sweep: {time.perf_counter() - started:.1f} s")
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    reports = [json.loads((tmp_path / f"report{i}.json").read_text()) for i in range(2)]

    names = [run.name for run in runs]
    for report in reports:  # both processes trained both runs, in process 0's order, to the end
        assert [entry[0] for entry in report["trained"]] == names
        assert all(entry[1:3] == ["finished", 12] for entry in report["trained"])
    # The stale record did not stop process 1: it trained and got process 0's (replicated) loss.
    assert reports[1]["trained"][0][3] == pytest.approx(reports[0]["trained"][0][3])
    assert reports[1]["trained"][0][3] != 9.5
    assert "sweep pod: all 2 runs; 2 to train" in outputs[0]

    for run in runs:  # process 0 wrote the records; every process wrote its part of each async checkpoint
        record = records.read_record(shared / "pod" / run.run_id)
        assert (record.status, record.steps) == ("finished", 12)
        final = shared / "pod" / run.run_id / "checkpoints" / "12" / "state"
        assert sorted(p.name for p in final.glob("ocdbt.process_*")) == ["ocdbt.process_0", "ocdbt.process_1"]

    # Inside the loop, cross-process transfers happen only at the check steps agreed beforehand (the stop
    # check) and at checkpoint steps (orbax's own barriers); never on the steps in between.
    checkpoint_steps = {4, 8, 12}
    for report in reports:  # (both runs together; the check before the first step is step 0)
        transfers = [(0 if step is None else step, where) for step, where in report["loop_transfers"]]
        assert [step for step, where in transfers if where == "stopping.py:agree"] == report["checked_steps"]
        assert {step for step, where in transfers if where != "stopping.py:agree"} <= checkpoint_steps, transfers
        quiet = set(range(1, 13)) - {step for step, _ in transfers}
        assert len(quiet) >= 4, transfers  # most steps make no cross-process transfer at all
    assert reports[0]["checked_steps"] == reports[1]["checked_steps"]
    print("stop checks at steps (both runs):", reports[0]["checked_steps"],
          "; loop transfers:", reports[0]["loop_transfers"])


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_the_same_checkpoint(tmp_path):
    sweep_file = tmp_path / "pod.py"
    sweep_file.write_text(SWEEP.replace("steps=12", "steps=400").replace('widths={1: (16, 32)}', 'widths={1: (16,)}'))
    (tmp_path / "driver.py").write_text(DRIVER)
    [run] = spec.load_sweep(sweep_file).expand().runs
    checkpoints = tmp_path / "runs" / "pod" / run.run_id / "checkpoints"
    processes = start_pair(tmp_path, sweep_file, (tmp_path / "runs", tmp_path / "runs"))
    deadline = time.time() + 300
    while not (checkpoints / "8").exists():  # well inside the loop
        assert time.time() < deadline and all(p.poll() is None for p in processes), "no checkpoint appeared"
        time.sleep(0.2)
    processes[1].send_signal(signal.SIGTERM)  # only process 1 hears it, as when one host is preempted
    outputs = [done.stdout for done in helpers.finish(processes, timeout=300)]
    assert [p.returncode for p in processes] == [stopping.PREEMPTED_EXIT_CODE] * 2, outputs[0][-2000:] + outputs[1][-2000:]
    reports = [json.loads((tmp_path / f"report{i}.json").read_text()) for i in range(2)]
    assert reports[0]["checked_steps"] == reports[1]["checked_steps"]  # the same check steps on both
    stopped_at = reports[0]["checked_steps"][-1]
    assert f"stopped by SIGTERM after step {stopped_at}; checkpoint saved" in outputs[0]
    saved = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    assert saved == stopped_at < 400
    assert sorted(p.name for p in (checkpoints / str(saved) / "state").glob("ocdbt.process_*")) == [
        "ocdbt.process_0", "ocdbt.process_1"]


class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_stop_check_transfers_only_on_agreed_steps(monkeypatch):
    """The loop's pattern (``due`` every step, ``agree`` only when due) with two simulated processes."""
    clock, gathered = _FakeClock(), []

    def allgather(value, *args, **kwargs):  # the other process's flag and proposal are the same as ours
        gathered.append(int(clock.now * 1000))
        return np.stack([value, value])

    from jax.experimental import multihost_utils

    monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    monkeypatch.setattr(stopping.time, "perf_counter", clock)
    check = stopping.StopCheck(start_step=0)
    assert not check.agree(False, 0)  # before the loop: the first check, nothing measured yet
    checked = []
    for done in range(1, 2001):
        clock.now += 1 / 64  # seconds per step (exact in binary)
        if check.due(done):
            checked.append(done)
            assert not check.agree(False, done)
    assert len(gathered) == len(checked) + 1
    # One check per CHECK_SECONDS (5 s = 320 steps) once the speed is known, none in between.
    assert checked[0] == 1 and set(np.diff(checked).tolist()) == {320}
    due_step = checked[-1] + 320
    assert not check.due(due_step - 1) and check.due(due_step)


def test_stop_check_agrees_when_any_process_saw_sigterm(monkeypatch):
    from jax.experimental import multihost_utils

    monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather",
                        lambda value: np.stack([value, np.array([1, 3], np.int32)]))  # the other host: SIGTERM
    check = stopping.StopCheck(start_step=10)
    assert check.agree(False, 10) and check.next_step == 11  # the smallest proposal wins
    monkeypatch.setattr(multihost.jax, "process_count", lambda: 1)
    assert stopping.StopCheck(0).due(5) and stopping.StopCheck(0).agree(True, 5)  # one process: the local flag


def test_make_mesh_fails_loudly_when_the_topology_does_not_fit(monkeypatch):
    from jax.experimental import mesh_utils

    class FakeTpu:
        platform, device_kind = "tpu", "TPU v5 lite"

        def __init__(self, i):
            self.id = i

    def refuse(*args, **kwargs):
        raise NotImplementedError("Failed to find assignment for logical_axis_index 1")

    monkeypatch.setattr(mesh_utils, "create_device_mesh", refuse)
    with pytest.raises(ValueError, match=r"mesh data×fsdp×tensor = 2×1×4 cannot be laid out on the 8 TPU v5 lite"):
        mesh_lib.make_mesh(MeshConfig(data=2, fsdp=1, tensor=4), devices=[FakeTpu(i) for i in range(8)])


def test_make_mesh_refuses_a_layout_the_tpu_topology_cannot_take():
    # Real TPU device descriptions from libtpu (ahead of time, no TPU): 6 chips of a v5e 4x4 slice cannot
    # form a 2x3 grid of neighbours; a 4x4 slice takes a 4x4 mesh.
    pytest.importorskip("libtpu", reason='needs libtpu: pip install -e ".[tpu]" (CI installs it)')
    from sweeps import preflight

    devices = preflight.topology_devices(preflight.parse_topology("v5e:4x4"))
    assert dict(mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=4), devices).shape) == {
        "data": 4, "fsdp": 1, "tensor": 4}
    with pytest.raises(ValueError, match=r"2×1×3 cannot be laid out on the 6 TPU v5 lite devices"):
        mesh_lib.make_mesh(MeshConfig(data=2, fsdp=1, tensor=3), devices[:6])
