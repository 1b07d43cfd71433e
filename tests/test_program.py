"""The compiled program: one per shape, its numbers (seed, learning rates, schedule) given as arguments."""

import json

import jax
import numpy as np
import pytest

import tiny
from sweeps import launch

# A shape no other test trains (width 24, sequence 24), so this process has not built it yet: three seeds
# and two learning rates of it.
SWEEP = tiny.sweep_text("shared", "depths=(1,), widths={1: (24,)}, seeds=(0, 1, 2), lr_grid=(1e-3, 3e-3)",
                        steps=3, checkpoint_every=3, warmup_steps=1, head_dim=8, seq_len=24, eval_at_start=False)


@pytest.fixture
def compiles():
    """Names of the functions that XLA compiled (or read from the persistent cache) and that JAX
    traced, while the test runs: one backend-compile event per program handed to XLA."""
    seen = {"compiled": [], "traced": []}

    def listen(event, duration, **fields):
        if event == "/jax/core/compile/backend_compile_duration":
            seen["compiled"].append(fields.get("fun_name"))
        elif event == "/jax/core/compile/jaxpr_trace_duration":
            seen["traced"].append(fields.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield seen
    jax.monitoring.unregister_event_duration_listener(listen)


def test_a_sweep_of_one_shape_compiles_its_train_step_once(tmp_path, compiles, capsys):
    sweep_file = tmp_path / "shared.py"
    sweep_file.write_text(SWEEP)
    assert launch.main(["run", str(sweep_file), "--workdir", str(tmp_path / "runs"), "--no-progress"]) == 0
    records = [json.loads(path.read_text()) for path in (tmp_path / "runs" / "shared").glob("*/result.json")]
    assert len(records) == 6 and {record["status"] for record in records} == {"finished"}
    # The seeds and rates reached the shared program: six runs, six different trainings.
    assert len({record["final_train_loss"] for record in records}) == 6
    assert compiles["compiled"].count("jit(train_step)") == 1, compiles["compiled"]
    assert compiles["traced"].count("train_step") == 1  # built once in the process: not even traced again


def test_the_schedule_follows_optax():
    """``optim.learning_rate`` on traced step counts against optax's schedules with the counts as constants."""
    import optax

    from scaling.model import optim
    from scaling.config import ModelConfig, OptimConfig

    model = ModelConfig(width=128)
    for schedule, warmup in (("cosine", 10), ("linear", 7), ("constant", 0), ("cosine", 200)):
        config = OptimConfig(peak_lr=3e-3, warmup_steps=warmup, schedule=schedule, end_lr_fraction=0.1,
                             lr_rule="mup")
        hparams = optim.hyperparameters(config, model, total_steps=100)
        rates = optim.learning_rates(config, model)
        steps = np.arange(0, 120)
        ours = jax.jit(lambda step, hp: optim.learning_rate(step, hp, "hidden", schedule))(steps, hparams)
        peak, cut = rates["hidden"], min(warmup, 99)
        decay = {"cosine": optax.cosine_decay_schedule(peak, 100 - cut, alpha=0.1),
                 "linear": optax.linear_schedule(peak, peak * 0.1, 100 - cut),
                 "constant": optax.constant_schedule(peak)}[schedule]
        theirs = optax.join_schedules([optax.linear_schedule(0.0, peak, cut), decay], [cut]) if cut else decay
        # Within a millionth of the peak: the warmup's (peak - peak * (1 - t/T)) loses bits to cancellation
        # near t = 0 whichever way it is computed, so there a relative bound alone would be too strict.
        np.testing.assert_allclose(ours, np.asarray([theirs(step) for step in steps]), rtol=1e-6, atol=1e-6 * peak)
