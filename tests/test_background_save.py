"""Checkpoints saved behind the training loop (scaling/store/background_save.py): newest only, errors raised
later, a stop's wait bounded."""

import threading
import time

import pytest

from scaling.store.background_save import BackgroundSaver


class SlowStorage:
    """A save function that blocks each save until released, recording the steps it saved."""

    def __init__(self):
        self.saved, self.started = [], threading.Event()
        self.release = threading.Event()

    def __call__(self, step, state, meta):
        self.started.set()
        assert self.release.wait(30)
        self.saved.append((step, state, meta))


def test_submit_returns_at_once_and_only_the_newest_waiting_checkpoint_is_saved(capsys):
    storage = SlowStorage()
    saver = BackgroundSaver(storage)
    began = time.monotonic()
    saver.submit(50, {"w": 1}, {"wall_seconds": 1.0})
    assert storage.started.wait(30)  # step 50 is being written; the loop goes on
    for step in (100, 150, 200):
        saver.submit(step, {"w": step}, {"wall_seconds": float(step)})
    assert time.monotonic() - began < 5
    storage.release.set()
    saver.wait_idle(lambda: False, lambda step: AssertionError(step))
    assert [step for step, _, _ in storage.saved] == [50, 200]
    assert storage.saved[1][1:] == ({"w": 200}, {"wall_seconds": 200.0})
    assert saver.skipped == [100, 150]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert len(warnings) == 1 and "step 100 skipped for step 150" in warnings[0]  # said once
    saver.close(5)


def test_a_failed_save_is_raised_on_the_training_thread_and_nothing_later_is_saved():
    saved = []

    def save(step, state, meta):
        if step == 4:
            raise OSError("No space left on device")
        saved.append(step)

    saver = BackgroundSaver(save)
    saver.submit(4, {}, {})
    with pytest.raises(OSError, match="No space left"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            saver.raise_error()
            time.sleep(0.01)
    saver.submit(8, {}, {})
    saver.wait_idle(lambda: False, lambda step: AssertionError(step))
    assert saved == []  # the run is failing: the saver writes nothing after a failure
    saver.close(5)


def test_a_stop_waits_for_the_write_under_way_at_most_half_the_grace_period(monkeypatch):
    monkeypatch.setenv("SCALING_STOP_GRACE_SECONDS", "2")
    storage = SlowStorage()  # never released: storage that does not answer
    saver = BackgroundSaver(storage)
    saver.submit(10, {}, {})
    assert storage.started.wait(30)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="step 10"):
        saver.wait_idle(lambda: True, lambda step: TimeoutError(f"step {step} given up on"))
    assert 0.9 < time.monotonic() - began < 10
    storage.release.set()
    saver.close(5)


def test_without_a_stop_the_wait_lasts_until_the_write_is_done(monkeypatch):
    monkeypatch.setenv("SCALING_STOP_GRACE_SECONDS", "0.2")
    storage = SlowStorage()
    saver = BackgroundSaver(storage)
    saver.submit(10, {}, {})
    assert storage.started.wait(30)
    threading.Timer(1.0, storage.release.set).start()  # longer than a stop would wait
    saver.wait_idle(lambda: False, lambda step: AssertionError(step))
    assert [step for step, _, _ in storage.saved] == [10]
    saver.close(5)
