"""Parametrizations (``optim.parametrization``): μP's and CompleteP's rules, and standard left as it was."""

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

import tiny
from model_params import init_params
from scaling.config import ModelConfig, OptimConfig, TrainConfig, _identity, config_id
from scaling.overrides import override
from scaling.data import pipeline as data
from scaling.model import mesh as mesh_lib, optim as optim_lib, parametrization, program as program_lib
from scaling.model.parametrization import Multipliers
from scaling.model.transformer import Block, Transformer, attention_logit_scale


def test_standard_keeps_every_run_id_and_the_others_get_new_ones():
    """A standard config hashes as before the fields existed: they are left out of its identity."""
    base = TrainConfig()
    assert "parametrization" not in _identity(base)["optim"] and "base_depth" not in _identity(base)["optim"]
    ids = {config_id(override(base, [f"optim.parametrization={name}"])) for name in ("standard", "mup", "completep")}
    assert len(ids) == 3 and config_id(base) in ids
    assert config_id(override(base, ["optim.base_depth=4"])) != config_id(base)


@pytest.mark.parametrize("assignments,field", [
    (["optim.parametrization=mup", "optim.lr_rule=width_scaled"], "lr_rule"),
    (["optim.parametrization=completep", "optim.lr_rule=mup"], "lr_rule"),
    (["optim.parametrization=mup", "model.init_scheme=torch"], "init_scheme"),
    (["optim.parametrization=sometimes"], "parametrization"),
    (["optim.base_depth=0"], "base_depth"),
])
def test_contradicting_settings_are_refused_in_one_line_naming_the_field(assignments, field):
    with pytest.raises(ValueError, match=field) as error:
        override(TrainConfig(), assignments)
    assert "\n" not in str(error.value)


def test_standard_lr_rules_work_as_before():
    model = ModelConfig(width=256)
    for rule, hidden, other in (("constant", 1.0, 1.0), ("width_scaled", 0.25, 0.25), ("mup", 0.25, 1.0)):
        rates = optim_lib.learning_rates(OptimConfig(peak_lr=1.0, lr_rule=rule, base_width=64), model)
        assert rates == {"hidden": hidden, "other": other}
        assert optim_lib.rule_name(OptimConfig(lr_rule=rule)) == rule
    assert parametrization.multipliers(OptimConfig(lr_rule="mup", base_width=64), model) == Multipliers()
    assert optim_lib.rule_name(OptimConfig(parametrization="completep")) == "parametrization=completep"


def test_mup_and_completep_numbers_by_hand():
    """m_N = 4 (width 256 over 64), m_L = 4 (depth 8 over 2); heads of 16 channels at every width."""
    model = ModelConfig(depth=8, width=256, head_dim=16)
    mup = OptimConfig(peak_lr=1.0, weight_decay=0.1, eps=1e-8, parametrization="mup", base_width=64, base_depth=2)
    hp = optim_lib.hyperparameters(mup, model, total_steps=10)
    assert hp["lr_hidden"] == pytest.approx(0.25) and hp["lr_other"] == pytest.approx(1.0)
    assert hp["weight_decay_hidden"] == hp["weight_decay_other"] == pytest.approx(0.1)
    assert hp["eps_hidden"] == hp["eps_other"] == pytest.approx(1e-8)
    assert parametrization.multipliers(mup, model) == pytest.approx(
        Multipliers(hidden_init=0.5, attention=1.0, output=0.25))

    complete = dataclasses.replace(mup, parametrization="completep")
    hp = optim_lib.hyperparameters(complete, model, total_steps=10)
    assert (hp["lr_hidden"], hp["lr_block"], hp["lr_other"]) == pytest.approx((0.25, 1.0, 1.0))
    assert (hp["weight_decay_hidden"], hp["weight_decay_block"], hp["weight_decay_other"]) == pytest.approx(
        (0.4, 0.1, 0.1))  # × m_N on hidden matrices; the block group's norms and biases never decay anyway
    assert (hp["eps_hidden"], hp["eps_block"], hp["eps_other"]) == pytest.approx((1e-8 / 16, 1e-8 / 16, 1e-8 / 4))
    scales = parametrization.multipliers(complete, model)
    assert scales == pytest.approx(Multipliers(hidden_init=0.5, branch_init_depth=2, attention=1.0, residual=0.25,
                                               output=0.25))


def test_attention_is_one_over_head_size_equal_to_standard_at_the_base_head_size():
    """Two heads at every width: head size 64 at width 128, 32 at the base width 64."""
    model = ModelConfig(width=128, num_heads=2)
    scales = parametrization.multipliers(OptimConfig(parametrization="mup", base_width=64), model)
    scale = float(attention_logit_scale(model, 8, None, scales.attention))
    assert scale == pytest.approx(math.sqrt(32) / 64)
    base = ModelConfig(width=64, num_heads=2)
    at_base = parametrization.multipliers(OptimConfig(parametrization="mup", base_width=64), base)
    assert float(attention_logit_scale(base, 8, None, at_base.attention)) == pytest.approx(1 / math.sqrt(32))


@pytest.mark.parametrize("block", ["gpt", "llama"])
@pytest.mark.parametrize("name", ["mup", "completep"])
def test_at_the_base_shape_every_parametrization_is_the_standard_model(block, name):
    """Same initial weights, same losses over two steps (wd and epsilon included): a rate tuned at the base
    shape means the same thing in each."""
    model = ModelConfig(depth=2, width=32, head_dim=16, max_seq_len=32, block=block)
    optim = OptimConfig(peak_lr=1e-2, warmup_steps=0, weight_decay=0.1, base_width=32, base_depth=2)
    standard = tiny.config(model=model, optim=optim)
    other = tiny.config(model=model, optim=dataclasses.replace(optim, parametrization=name))
    assert not optim_lib.grouped(other.optim, other.model)
    results = [_train(config, steps=2) for config in (standard, other)]
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), results[0][0], results[1][0])


def _train(config, steps):
    mesh = mesh_lib.make_mesh(config.mesh, tiny.one_device())
    program = program_lib.build(config, mesh)
    state = program.init(jax.random.PRNGKey(0))
    initial = jax.tree_util.tree_map(np.asarray, state["params"])
    batch = {key: np.asarray(value) for key, value in data.build(config.data).train_batch(0, 0, 8).items()}
    losses = []
    for _ in range(steps):
        state, metrics = program.train_step(state, mesh_lib.global_batch(batch, mesh, 8),
                                            program_lib.hyperparameters(config))
        losses.append(float(metrics["loss"]))
    return initial, losses, jax.tree_util.tree_map(np.asarray, state["params"])


def test_mup_initial_scales_by_tensor():
    """Width 256 over a base of 64: hidden matrices start at half the std, the branches' output projections
    also keep the standard 1/sqrt(2·depth); embeddings and unembedding keep init_std."""
    model = ModelConfig(depth=2, width=256, head_dim=16, max_seq_len=32)
    scales = parametrization.multipliers(OptimConfig(parametrization="mup", base_width=64), model)
    params = init_params(model, jax.random.PRNGKey(0), multipliers=scales)
    std = lambda *path: float(np.std(_at(params, path)))  # noqa: E731
    assert std("layers", "attention", "query", "kernel") == pytest.approx(0.01, rel=0.05)
    assert std("layers", "mlp", "wi", "kernel") == pytest.approx(0.01, rel=0.05)
    assert std("layers", "mlp", "wo", "kernel") == pytest.approx(0.01 / 2, rel=0.05)
    real = model.vocab_size
    assert float(np.std(_at(params, ("token_embedding", "embedding"))[:real])) == pytest.approx(0.02, rel=0.05)
    assert float(np.std(_at(params, ("unembedding", "kernel"))[:, :real])) == pytest.approx(0.02, rel=0.05)


def test_completep_branch_outputs_start_the_same_at_every_depth():
    optim = OptimConfig(parametrization="completep", base_width=64, base_depth=2)
    stds = {}
    for depth in (2, 8):
        model = ModelConfig(depth=depth, width=64, head_dim=16, max_seq_len=32)
        params = init_params(model, jax.random.PRNGKey(0), multipliers=parametrization.multipliers(optim, model))
        stds[depth] = float(np.std(_at(params, ("layers", "mlp", "wo", "kernel"))))
    assert stds[8] == pytest.approx(stds[2], rel=0.05) and stds[2] == pytest.approx(0.01, rel=0.05)
    standard = init_params(ModelConfig(depth=8, width=64, head_dim=16, max_seq_len=32), jax.random.PRNGKey(0))
    assert float(np.std(_at(standard, ("layers", "mlp", "wo", "kernel")))) == pytest.approx(0.005, rel=0.05)


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return np.asarray(tree)


@pytest.mark.parametrize("block", ["gpt", "llama"])
def test_output_multiplier_scales_the_logits(block):
    model = ModelConfig(depth=1, width=32, head_dim=16, max_seq_len=16, block=block)
    params = init_params(model, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, model.vocab_size)
    plain = Transformer(model).apply({"params": params}, tokens)
    scaled = Transformer(model, multipliers=Multipliers(output=0.25)).apply({"params": params}, tokens)
    np.testing.assert_allclose(np.asarray(scaled), 0.25 * np.asarray(plain), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_residual_multiplier_scales_each_branch(norm):
    """With the feed-forward's output projection zeroed, what a pre-norm block adds to the stream is its
    attention branch alone, scaled by r; post-norm normalises after the scaled sum, so it changes too."""
    model = ModelConfig(depth=1, width=32, head_dim=16, norm=norm)
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 32))
    mlp_off = jax.tree_util.tree_map(np.asarray, nn.unbox(Block(model).init(jax.random.PRNGKey(0), x, None)))
    mlp_off["params"]["mlp"]["wo"]["kernel"] = np.zeros_like(mlp_off["params"]["mlp"]["wo"]["kernel"])
    plain, _ = Block(model).apply(mlp_off, x, None)
    scaled, _ = Block(model, multipliers=Multipliers(residual=0.25)).apply(mlp_off, x, None)
    if norm == "pre":
        np.testing.assert_allclose(np.asarray(scaled - x), 0.25 * np.asarray(plain - x), rtol=1e-4, atol=1e-6)
    else:
        assert not np.allclose(np.asarray(scaled), np.asarray(plain), atol=1e-3)


@pytest.mark.parametrize("name,hidden,other", [("mup", 1e-2 / 4, 1e-2), ("completep", 1e-2 / 4, 1e-2)])
def test_first_adam_steps_per_group_in_the_trainer(name, hidden, other):
    """Adam's first update is lr·sign(g): width 64 over a base width of 16 gives hidden matrices a quarter
    of the rate and embeddings, unembedding and norms the whole (an epsilon far below every gradient)."""
    config = tiny.config(model=ModelConfig(depth=1, width=64, head_dim=16, max_seq_len=32),
                         optim=OptimConfig(peak_lr=1e-2, parametrization=name, base_width=16, base_depth=1,
                                           warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0,
                                           eps=1e-16))
    before, _, after = _train(config, steps=1)

    def step_size(*path):
        moved = np.abs(_at(after, path) - _at(before, path))
        return float(np.median(moved[moved > 0]))  # unused embedding rows get no gradient

    assert step_size("layers", "mlp", "wi", "kernel") == pytest.approx(hidden, rel=1e-3)
    assert step_size("layers", "attention", "key", "kernel") == pytest.approx(hidden, rel=1e-3)
    assert step_size("token_embedding", "embedding") == pytest.approx(other, rel=1e-3)
    assert step_size("unembedding", "kernel") == pytest.approx(other, rel=1e-3)
    assert step_size("layers", "mlp_norm", "scale") == pytest.approx(other, rel=1e-3)
