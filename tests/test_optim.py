"""The optimizer: per-group step sizes under each learning-rate rule."""

import jax
import numpy as np
import pytest

import tiny
from scaling.config import OptimConfig
from scaling.data import pipeline as data
from scaling.model import mesh as mesh_lib, program as program_lib


@pytest.mark.parametrize("rule,hidden,other", [
    ("constant", 1e-2, 1e-2), ("width_scaled", 1e-2 * 64 / 16, 1e-2 * 64 / 16), ("mup", 1e-2 * 64 / 16, 1e-2)])
def test_learning_rate_rules_set_per_group_step_sizes(rule, hidden, other):
    """Adam's first update is lr·sign(g), so each group's step size shows in the trainer's first step
    (width 16 against a base width of 64: scaled rates are 4 times the peak; an epsilon far below the
    width-16 model's smallest gradients keeps the update at lr·sign(g))."""
    config = tiny.config(optim=OptimConfig(peak_lr=1e-2, lr_rule=rule, base_width=64, warmup_steps=0,
                                           schedule="constant", weight_decay=0.0, grad_clip=0.0, eps=1e-14))
    mesh = mesh_lib.make_mesh(config.mesh, tiny.one_device())
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
