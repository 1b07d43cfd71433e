"""The transformer family: parameter counting, objectives, layouts, learning."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scaling import budget
from scaling.config import ModelConfig
from scaling.model import (Transformer, attention_logit_scale, compute_loss, init_params, mask_for_mlm,
                           stack_layers, unstack_layers)

SHAPES = [(1, 64), (2, 128), (3, 320), (6, 192), (12, 768)]


def forward(config, params, tokens):
    """Jitted logits: eager op-by-op Flax is several times slower to test."""
    return _forward(config, params, tokens)


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, tokens):
    return Transformer(config).apply({"params": params}, tokens)


def _leaves_with_names(params):
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        yield [str(getattr(entry, "key", entry)) for entry in path], leaf


@pytest.mark.parametrize("depth,width", SHAPES)
@pytest.mark.parametrize("scan", [True, False])
def test_attention_and_feedforward_kernels_hold_twelve_l_d_squared(depth, width, scan):
    config = ModelConfig(depth=depth, width=width, scan_layers=scan)
    params = budget.abstract_params(config)
    kernel_total, tree_total = 0, 0
    for names, leaf in _leaves_with_names(params):
        size = int(np.prod(leaf.shape))
        tree_total += size
        if names[-1] == "kernel" and ("attention" in names or "mlp" in names):
            kernel_total += size
    assert kernel_total == 12 * depth * width**2 == budget.non_embedding_params(depth, width)
    counts = budget.count_params(config)
    assert counts["non_embedding"] == kernel_total
    assert counts["total"] == tree_total
    assert counts["total"] == counts["non_embedding"] + counts["embedding"] + counts["other"]
    # token embedding + position table + untied unembedding
    assert counts["embedding"] == 2 * config.vocab_size * width + config.max_seq_len * width


def test_biases_and_norms_are_counted_outside_the_budget():
    plain = budget.count_params(ModelConfig(depth=2, width=64))
    biased = budget.count_params(ModelConfig(depth=2, width=64, use_bias=True))
    assert biased["non_embedding"] == plain["non_embedding"]
    # per layer: q, k, v, out biases (4d) + ff biases (4d + d)
    assert biased["other"] - plain["other"] == 2 * (4 * 64 + 5 * 64)


def test_gpt3_175b_shape_is_counted_without_allocating():
    counts = budget.count_params(ModelConfig(depth=96, width=12288, vocab_size=50257, max_seq_len=2048))
    assert counts["non_embedding"] == 173946175488
    assert counts["embedding"] == 2 * 50257 * 12288 + 2048 * 12288


@pytest.mark.parametrize("objective_position", [("causal", "learned"), ("causal", "sinusoidal")])
def test_causal_logits_never_see_the_future(objective_position):
    _, position = objective_position
    config = ModelConfig(depth=2, width=64, position=position, norm="post")
    params = init_params(config, jax.random.PRNGKey(0))
    model = Transformer(config)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 24), 0, config.vocab_size)
    base = forward(config, params, tokens)
    for changed_position in (0, 7, 23):
        edited = tokens.at[:, changed_position].set((tokens[:, changed_position] + 5) % config.vocab_size)
        logits = forward(config, params, edited)
        np.testing.assert_array_equal(np.asarray(logits[:, :changed_position]),
                                      np.asarray(base[:, :changed_position]))
        assert not np.allclose(logits[:, changed_position], base[:, changed_position])


def test_masked_model_is_bidirectional():
    config = ModelConfig(depth=1, width=64, objective="masked")
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 16), 0, config.vocab_size)
    base = forward(config, params, tokens)
    edited = forward(config, params, tokens.at[:, 15].set((tokens[:, 15] + 1) % 200))
    assert not np.allclose(base[:, 0], edited[:, 0])


def test_mask_rate_and_loss_ignore_unmasked_positions():
    rate = 0.15
    tokens = jax.random.randint(jax.random.PRNGKey(0), (64, 128), 0, 256)
    masked, targets, weights = mask_for_mlm(jax.random.PRNGKey(1), tokens, None, rate=rate, mask_id=259,
                                            random_token_limit=256)
    realised = float(weights.mean())
    assert abs(realised - rate) < 0.01
    selected = np.asarray(weights) > 0
    replaced_by_mask = np.asarray(masked == 259)
    assert not replaced_by_mask[~selected].any()
    assert 0.75 < replaced_by_mask[selected].mean() < 0.85
    np.testing.assert_array_equal(np.asarray(targets), np.asarray(tokens))

    config = ModelConfig(depth=1, width=64, objective="masked", mask_rate=rate)
    params = init_params(config, jax.random.PRNGKey(0))
    model = Transformer(config)
    batch = {"inputs": tokens[:4, :32], "targets": tokens[:4, :32], "weights": jnp.ones((4, 32)),
             "input_mask": jnp.ones((4, 32))}
    rng = jax.random.PRNGKey(3)
    loss, metrics = compute_loss(model, params, batch, rng=rng, mask_id=259, random_token_limit=256)
    # Changing a target at a position the mask did not select must not change the loss.
    _, _, chosen = mask_for_mlm(jax.random.split(rng)[0], batch["inputs"], batch["input_mask"], rate=rate,
                                mask_id=259, random_token_limit=256)
    assert float(metrics["tokens"]) == float(chosen.sum()) > 0
    logits = model.apply({"params": params}, mask_for_mlm(jax.random.split(rng)[0], batch["inputs"], batch["input_mask"],
                                                          rate=rate, mask_id=259, random_token_limit=256)[0])
    per_position = optax.softmax_cross_entropy_with_integer_labels(logits, batch["inputs"])
    expected = float((per_position * chosen).sum() / chosen.sum())
    assert abs(float(loss) - expected) < 1e-5
    assert abs(float((per_position).mean()) - expected) > 1e-4  # unmasked positions would change it


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_scanned_and_unrolled_layers_agree(depth):
    scanned = ModelConfig(depth=depth, width=64, scan_layers=True)
    unrolled = ModelConfig(depth=depth, width=64, scan_layers=False)
    params = init_params(scanned, jax.random.PRNGKey(depth))
    tokens = jax.random.randint(jax.random.PRNGKey(7), (2, 32), 0, scanned.vocab_size)
    a = forward(scanned, params, tokens)
    b = forward(unrolled, unstack_layers(params, depth), tokens)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    restacked = stack_layers(unstack_layers(params, depth), depth)
    jax.tree_util.tree_map(np.testing.assert_array_equal, restacked, params)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_changes_nothing_numerically(remat):
    config = ModelConfig(depth=2, width=64)
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 256)
    batch = {"inputs": tokens, "targets": tokens, "weights": jnp.ones((2, 16))}

    def grads(cfg):
        return jax.jit(jax.grad(lambda p: compute_loss(Transformer(cfg), p, batch)[0]))(params)

    plain, rematted = grads(config), grads(ModelConfig(depth=2, width=64, remat=remat))
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), plain, rematted)


def _one_head_attention_by_hand(config, params, tokens):
    """Recompute the first layer's attention logits of a 1-layer, 1-head model in numpy."""
    p = jax.tree_util.tree_map(np.asarray, unstack_layers(params, 1))
    x = p["token_embedding"]["embedding"][np.asarray(tokens[0])] + p["position_embedding"][: tokens.shape[1]]
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    norm = p["layers_0"]["attention_norm"]
    h = (x - mean) / np.sqrt(var + 1e-5) * norm["scale"] + norm["bias"]
    q = h @ p["layers_0"]["attention"]["query"]["kernel"][:, 0, :]
    k = h @ p["layers_0"]["attention"]["key"]["kernel"][:, 0, :]
    return q @ k.T / math.sqrt(config.width)


def test_log_length_scaling_matches_hand_computation():
    length = 6
    for objective in ("causal", "masked"):
        config = ModelConfig(depth=1, width=32, num_heads=1, objective=objective, attention_scale="log_length")
        params = init_params(config, jax.random.PRNGKey(0))
        tokens = jax.random.randint(jax.random.PRNGKey(1), (1, length), 0, 256)
        standard = _one_head_attention_by_hand(config, params, tokens)
        if objective == "causal":
            expected = standard * np.log(np.arange(1, length + 1))[:, None]
        else:
            expected = standard * np.log(length)
        scale = attention_logit_scale(config, length, None) * math.sqrt(config.width)
        np.testing.assert_allclose(np.broadcast_to(np.asarray(scale)[0, 0] if np.ndim(scale) else scale,
                                                   (length, length)) * standard, expected, rtol=1e-6)
        # and the model really applies it
        standard_config = ModelConfig(depth=1, width=32, num_heads=1, objective=objective)
        out_log = forward(config, params, tokens)
        out_std = forward(standard_config, params, tokens)
        assert not np.allclose(out_log, out_std)


def test_it_learns_a_fixed_batch():
    config = ModelConfig(depth=2, width=64, max_seq_len=64)
    model = Transformer(config)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (16, 65), 0, 256)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": jnp.ones((16, 64))}
    params = init_params(config, jax.random.PRNGKey(1))
    optimizer = optax.adam(3e-3)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: compute_loss(model, p, batch)[0])(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    for _ in range(300):
        params, state, loss = step(params, state)
    assert float(loss) < 0.1


@pytest.mark.parametrize("field,kwargs", [
    ("depth", {"depth": 0}),
    ("num_heads", {"width": 64, "num_heads": 3}),
    ("head_dim", {"width": 96, "head_dim": 64}),
    ("objective", {"objective": "seq2seq"}),
    ("norm", {"norm": "sandwich"}),
    ("activation", {"activation": "swish"}),
    ("position", {"position": "rope"}),
    ("attention_scale", {"attention_scale": "cosine"}),
    ("dropout", {"dropout": 1.5}),
    ("remat", {"remat": "sometimes"}),
])
def test_bad_model_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_sequence_longer_than_max_is_rejected():
    config = ModelConfig(depth=1, width=64, max_seq_len=8)
    params = init_params(config, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        Transformer(config).apply({"params": params}, jnp.zeros((1, 9), jnp.int32))
