"""The optimizer: per-group step sizes under each learning-rate rule."""

import dataclasses

import jax
import numpy as np
import pytest

from scaling import train
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

def small_config(**changes) -> TrainConfig:
    base = TrainConfig(
        model=ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=64),
        data=DataConfig(source="builtin", seq_len=64),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=5),
        steps=20, batch_size=8, eval_every=0, eval_batches=2, checkpoint_every=10, log_every=1,
        wandb_mode="offline", name="test")
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("rule,hidden,other", [
    ("constant", 1e-2, 1e-2), ("width_scaled", 1e-2 * 16 / 64, 1e-2 * 16 / 64), ("mup", 1e-2 * 16 / 64, 1e-2)])
def test_learning_rate_rules_set_per_group_step_sizes(rule, hidden, other, eight_devices):
    """Adam's first update is lr·sign(g), so each group's step size shows in the update."""
    config = small_config(model=ModelConfig(depth=2, width=64, head_dim=16, max_seq_len=64),
                          optim=OptimConfig(peak_lr=1e-2, lr_rule=rule, base_width=16, warmup_steps=0,
                                            schedule="constant", weight_decay=0.0, grad_clip=0.0))
    mesh = train.mesh_lib.make_mesh(config.mesh, eight_devices[:1])
    program = train.build(config, mesh)
    state = program.init(jax.random.PRNGKey(0))
    before = jax.tree_util.tree_map(np.asarray, state["params"])
    batch = {key: np.asarray(value) for key, value in train.data.build(config.data).train_batch(0, 0, 8).items()}
    state, metrics = program.train_step(state, train.mesh_lib.global_batch(batch, mesh, 8))
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
