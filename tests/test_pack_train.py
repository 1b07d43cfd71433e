"""Packs of runs trained together (scaling/run/train.py, scaling/run/loop.py): each run keeps a solo run's record, metrics,
checkpoints and end, and follows the run trained alone.

Tolerance. A packed run's losses equal its solo run's to a relative 1e-5 over the 8 steps, not
bitwise: the packed step is compiled into other fusions than the solo step, so its sums run in another
order (tests/test_packed.py measures ~1e-7 after 5 steps; Adam carries it on). A pack stopped and
resumed is compared with the same pack never stopped: the same program on the same numbers, so bitwise.
"""

import dataclasses
import time

import jax
import numpy as np
import pytest

import tiny
from scaling.run import loop, train as pack_train
from scaling.run.ending import AlreadyFinished, ResumesElsewhere
from scaling.run.stopping import Preempted, Stop
from scaling.store import records

RTOL = 1e-5  # see the module docstring
RATES = ((0, 3e-3), (1, 1e-3), (2, 1e-2))


def configs(*runs):
    """``tiny.config()`` with each (seed, peak learning rate) of ``runs``, named after them."""
    base = tiny.config()
    return [dataclasses.replace(base, seed=seed, name=f"s{seed}-lr{lr:g}",
                                optim=dataclasses.replace(base.optim, peak_lr=lr)) for seed, lr in runs]


def losses(run_dir) -> list[float]:
    return tiny.losses(run_dir)


def pack(cfgs, tmp_path, folder="pack", **kwargs):
    """``run_pack`` of ``cfgs`` on one device into ``tmp_path/folder/<i>``: (outcomes, run directories)."""
    dirs = [tmp_path / folder / str(i) for i in range(len(cfgs))]
    kwargs = {"devices": tiny.one_device(), "show_progress": False, **kwargs}
    return pack_train.run_pack(cfgs, dirs, **kwargs), dirs


@pytest.fixture(scope="module")
def solo(tmp_path_factory):
    """Each of ``RATES`` trained alone: run directory per (seed, rate)."""
    root = tmp_path_factory.mktemp("solo")
    dirs = {}
    for config in configs(*RATES):
        dirs[config.seed] = root / config.name
        tiny.run(config, dirs[config.seed])
    return dirs


def test_a_pack_trains_each_run_as_it_trains_alone(solo, tmp_path):
    started = time.perf_counter()
    outcomes, dirs = pack(configs(*RATES), tmp_path)
    elapsed = time.perf_counter() - started
    for (seed, _), outcome, run_dir in zip(RATES, outcomes, dirs):
        alone = records.read_record(solo[seed])
        assert isinstance(outcome, records.RunRecord) and outcome == records.read_record(run_dir)
        assert (outcome.status, outcome.steps, outcome.pack_size, alone.pack_size) == ("finished", tiny.STEPS, 3, 1)
        assert outcome.run_id == alone.run_id  # its own identity: the solo run's
        assert 0 < outcome.train_seconds <= outcome.wall_seconds <= elapsed  # counted once, not per checkpoint
        assert tiny.metric_steps(run_dir) == list(range(tiny.STEPS + 1))  # one row per step
        np.testing.assert_allclose(losses(run_dir), losses(solo[seed]), rtol=RTOL)
        np.testing.assert_allclose(outcome.final_eval_loss, alone.final_eval_loss, rtol=RTOL)
        # Its checkpoint is a solo run's state: it restores alone, as the solo run's does.
        step, params = tiny.final_params(run_dir)
        _, params_alone = tiny.final_params(solo[seed])
        assert step == tiny.STEPS
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params,
                               params_alone)
    assert len({o.wandb_id for o in outcomes}) == 3  # a wandb run each


def test_a_diverging_run_is_recorded_at_once_and_the_others_go_on(solo, tmp_path):
    diverging = configs((2, 1e30))[0]
    alone = tiny.run(diverging, tmp_path / "alone")
    outcomes, dirs = pack([*configs(*RATES[:2]), diverging], tmp_path)
    assert [o.status for o in outcomes] == ["finished", "finished", "diverged"]
    assert (outcomes[2].steps, outcomes[2].final_eval_loss) == (alone.steps, None)
    assert tiny.metric_steps(dirs[2]) == tiny.metric_steps(tmp_path / "alone")
    for (seed, _), run_dir in zip(RATES[:2], dirs):
        np.testing.assert_allclose(losses(run_dir), losses(solo[seed]), rtol=RTOL)


def _stop_after(monkeypatch, stop: Stop, step: int) -> None:
    """SIGTERM, as the loop sees it, once ``step`` steps are done."""
    real = loop.Training.between_steps

    def between_steps(self, done):
        if done == step:
            stop.signal = "SIGTERM"
        return real(self, done)

    monkeypatch.setattr(loop.Training, "between_steps", between_steps)


def test_a_stop_checkpoints_every_run_and_the_pack_resumes_exactly(tmp_path, monkeypatch):
    cfgs = configs(*RATES)
    reference, reference_dirs = pack(cfgs, tmp_path, "reference")
    stop = Stop()
    _stop_after(monkeypatch, stop, 3)
    stopped, dirs = pack(cfgs, tmp_path, stop=stop)
    assert all(isinstance(outcome, Preempted) for outcome in stopped)
    assert [records.read_record(d).status for d in dirs] == ["stopped"] * 3
    assert all((d / "checkpoints" / "3").exists() for d in dirs)  # every run saved the stop's step
    monkeypatch.undo()
    resumed, _ = pack(cfgs, tmp_path)
    for outcome, expected, run_dir, reference_dir in zip(resumed, reference, dirs, reference_dirs):
        assert (outcome.status, outcome.steps) == ("finished", tiny.STEPS)
        assert tiny.metric_steps(run_dir) == list(range(tiny.STEPS + 1))
        assert losses(run_dir) == losses(reference_dir)  # bitwise: the same program on the same numbers
        assert outcome.final_eval_loss == expected.final_eval_loss


def test_a_run_resuming_at_another_step_leaves_the_pack_and_resumes_alone(solo, tmp_path, monkeypatch):
    cfgs = configs(*RATES)
    stop = Stop()
    _stop_after(monkeypatch, stop, 4)
    first, _ = pack(cfgs[:1], tmp_path, "early", stop=stop)  # run 0 alone (a pack of one) to step 4
    assert isinstance(first[0], Preempted)
    monkeypatch.undo()
    early = tmp_path / "early" / "0"
    outcomes = pack_train.run_pack(cfgs, [early, tmp_path / "1", tmp_path / "2"], devices=tiny.one_device(),
                                   show_progress=False)
    assert isinstance(outcomes[0], ResumesElsewhere) and "step 4" in str(outcomes[0])
    assert records.read_record(early).status == "stopped"  # untouched by the pack
    assert [o.status for o in outcomes[1:]] == ["finished", "finished"]
    resumed = tiny.run(cfgs[0], early)
    assert (resumed.status, resumed.steps) == ("finished", tiny.STEPS)
    np.testing.assert_allclose(losses(early), losses(solo[0]), rtol=RTOL)


def test_finished_and_refused_runs_leave_the_pack_and_the_rest_trains(solo, tmp_path):
    import shutil

    cfgs = configs(*RATES)
    shutil.copytree(solo[1], tmp_path / "pack" / "1")  # run 1 already finished there
    outcomes, _ = pack(cfgs, tmp_path)
    assert isinstance(outcomes[1], AlreadyFinished) and outcomes[1].record.status == "finished"
    assert [outcomes[0].status, outcomes[2].status] == ["finished", "finished"]
    assert outcomes[0].pack_size == 2


def test_runs_of_different_shapes_or_one_directory_cannot_share_a_pack(tmp_path):
    wide = dataclasses.replace(tiny.config(), model=dataclasses.replace(tiny.config().model, width=32))
    with pytest.raises(ValueError, match=r"configs\[1\].*differ in model"):
        pack_train.run_pack([tiny.config(), wide], [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match="differ in steps"):
        pack_train.run_pack([tiny.config(), tiny.config(steps=4)], [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match="share a run directory"):
        pack_train.run_pack(configs(*RATES[:2]), [tmp_path / "a", tmp_path / "a"])
    assert not (tmp_path / "a").exists()  # refused before anything was touched


def test_a_pack_on_eight_devices_trains_whole_runs_per_device_group(solo, tmp_path, eight_devices):
    cfgs = configs(*RATES, (3, 2e-3))
    outcomes, dirs = pack(cfgs, tmp_path, devices=eight_devices, runs_axis=4)  # 4 groups of 2 devices
    assert [o.status for o in outcomes] == ["finished"] * 4
    for (seed, _), run_dir in zip(RATES, dirs):
        np.testing.assert_allclose(losses(run_dir), losses(solo[seed]), rtol=RTOL)
