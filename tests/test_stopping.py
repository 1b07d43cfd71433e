"""Stopping: one ``Stop`` per process, shared by the sweep launcher and every run it trains."""

import json
import os
import signal

import pytest

from scaling import records, train
from scaling.stopping import PREEMPTED_EXIT_CODE, Stop
from sweeps import launch

SWEEP = '''"""Two tiny runs."""
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep


def sweep():
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=32), data=DataConfig(source="builtin", seq_len=32),
        optim=OptimConfig(warmup_steps=1), steps=2, batch_size=8, eval_every=0, eval_batches=1,
        eval_at_start=False, checkpoint_every=2, log_every=1, wandb_mode="disabled")
    return Sweep(name="two", base=base, depths=(1,), widths={1: (16, 32)}, multiple_of=16)
'''


def test_listening_nests_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    stop = Stop()
    with stop.listening():
        handler = signal.getsignal(signal.SIGTERM)
        with stop.listening():  # as when the launcher's Stop reaches train.run
            assert signal.getsignal(signal.SIGTERM) is handler
        assert signal.getsignal(signal.SIGTERM) is handler and not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("moment", ["final evaluation", "record"])
def test_sigterm_at_the_end_of_a_run_stops_the_launcher_before_the_next_run(tmp_path, monkeypatch, capsys, moment):
    """The run finishes (only its final evaluation or record was left), and no further run starts."""
    sent = []

    def sigterm_first(function):
        def wrapped(*args, **kwargs):
            if not sent:
                sent.append(moment)
                os.kill(os.getpid(), signal.SIGTERM)
            return function(*args, **kwargs)
        return wrapped

    if moment == "final evaluation":
        monkeypatch.setattr(train, "evaluate_metrics", sigterm_first(train.evaluate_metrics))
    else:
        monkeypatch.setattr(records, "write_record", sigterm_first(records.write_record))
    sweep_file = tmp_path / "two.py"
    sweep_file.write_text(SWEEP)
    code = launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs"), "--no-progress"])
    out = capsys.readouterr().out
    assert sent and code == PREEMPTED_EXIT_CODE, out
    results = [json.loads(path.read_text()) for path in (tmp_path / "runs" / "two").glob("*/result.json")]
    assert [(r["name"], r["status"], r["steps"]) for r in results] == [("L1-d16-s0", "finished", 2)]
    assert "stopping after L1-d16-s0: SIGTERM received" in out
