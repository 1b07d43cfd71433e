"""The transformer family: parameter counting, objectives, layouts, learning."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from model_params import init_params
from scaling.config import ModelConfig
from scaling.model import budget
from scaling.model.loss import compute_loss
from scaling.model.transformer import Transformer, attention_logit_scale, stack_layers, unstack_layers

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


def _one_head_attention_by_hand(config, params, tokens, logit_scale):
    """The first layer's attention output of a 1-layer, 1-head pre-LN model, in numpy,
    with q·k logits multiplied by ``logit_scale`` ([query, key] or a scalar)."""
    p = jax.tree_util.tree_map(np.asarray, unstack_layers(params, 1))
    length = tokens.shape[1]
    x = p["token_embedding"]["embedding"][np.asarray(tokens[0])] + p["position_embedding"][:length]
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    norm = p["layers_0"]["attention_norm"]
    h = (x - mean) / np.sqrt(var + 1e-5) * norm["scale"] + norm["bias"]
    attention = p["layers_0"]["attention"]
    q, k, v = (h @ attention[name]["kernel"][:, 0, :] for name in ("query", "key", "value"))
    logits = q @ k.T * logit_scale
    if config.objective == "causal":
        logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights @ v) @ attention["out"]["kernel"][0]


def _model_attention_output(config, params, tokens):
    """What the model's first attention sublayer really outputs (captured from a forward pass)."""
    unrolled = dataclasses.replace(config, scan_layers=False)
    _, state = Transformer(unrolled).apply({"params": unstack_layers(params, 1)}, tokens,
                                           capture_intermediates=True, mutable=["intermediates"])
    return np.asarray(state["intermediates"]["layers_0"]["attention"]["__call__"][0][0])


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_log_length_scaling_matches_hand_computation(objective):
    length = 6
    config = ModelConfig(depth=1, width=32, num_heads=1, objective=objective, attention_scale="log_length",
                         init_std=0.5)  # large weights: sharp attention, so a wrong scale shows
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, length), 0, 256)
    # log n: n = keys a query sees (i + 1 under causal attention, all 6 tokens bidirectionally)
    log_n = np.log(np.arange(1, length + 1))[:, None] if objective == "causal" else np.log(length)
    expected = _one_head_attention_by_hand(config, params, tokens, log_n / math.sqrt(config.width))
    np.testing.assert_allclose(_model_attention_output(config, params, tokens), expected, rtol=1e-4, atol=1e-5)
    # The same weights without the log factor give the standard model, and differ from it.
    standard_config = dataclasses.replace(config, attention_scale="standard")
    standard = _one_head_attention_by_hand(config, params, tokens, 1 / math.sqrt(config.width))
    np.testing.assert_allclose(_model_attention_output(standard_config, params, tokens), standard,
                               rtol=1e-4, atol=1e-5)
    assert np.abs(expected - standard).max() > 1e-2


def test_log_length_counts_only_real_tokens_under_padding():
    config = ModelConfig(depth=1, width=32, num_heads=1, objective="masked", attention_scale="log_length")
    input_mask = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.float32)
    scale = np.asarray(attention_logit_scale(config, 6, input_mask)).reshape(-1) * math.sqrt(config.width)
    np.testing.assert_allclose(scale, np.log([3.0, 6.0]), rtol=1e-6)


def test_torch_init_draws_pytorch_default_ranges():
    config = ModelConfig(depth=1, width=64, num_heads=4, init_scheme="torch", use_bias=True, scan_layers=False)
    p = init_params(config, jax.random.PRNGKey(0))
    bound = lambda x: float(np.abs(np.asarray(x)).max())  # noqa: E731
    assert 0.9 / 8 < bound(p["layers_0"]["mlp"]["wi"]["kernel"]) <= 1 / 8  # U(±1/sqrt(64))
    assert 0.9 / 16 < bound(p["layers_0"]["mlp"]["wo"]["kernel"]) <= 1 / 16  # fan_in 256
    assert 0.9 / 8 < bound(p["layers_0"]["attention"]["out"]["kernel"]) <= 1 / 8
    xavier = math.sqrt(6 / (64 + 3 * 64))  # the packed [3d, d] in-projection
    assert 0.9 * xavier < bound(p["layers_0"]["attention"]["query"]["kernel"]) <= xavier
    real_ids = slice(0, config.vocab_size)  # the rows padding the vocabulary are zeros
    assert abs(float(np.std(np.asarray(p["token_embedding"]["embedding"][real_ids]))) - 1.0) < 0.05
    normal = init_params(dataclasses.replace(config, init_scheme="normal"), jax.random.PRNGKey(0))
    assert abs(float(np.std(np.asarray(normal["token_embedding"]["embedding"][real_ids]))) - 0.02) < 0.002


def test_it_learns_a_fixed_batch():
    config = ModelConfig(depth=2, width=64, max_seq_len=64)
    model = Transformer(config)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (8, 33), 0, 256)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": jnp.ones((8, 32))}
    params = init_params(config, jax.random.PRNGKey(1))
    optimizer = optax.adam(1e-2)  # the loss is below 0.1 after about 20 steps
    state = optimizer.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: compute_loss(model, p, batch)[0])(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    for _ in range(60):
        params, state, loss = step(params, state)
    assert float(loss) < 0.1


def test_first_indicator_positions_mark_position_one_only_and_learn_nothing():
    """The FIRST authors' position code: a model that sees tokens and "is this position 1" only,
    so the CLS output cannot depend on the order of the bits after the first one."""
    config = ModelConfig(depth=2, width=16, num_heads=1, objective="masked", norm="post", use_bias=True,
                         position="first_indicator", init_scheme="torch", max_seq_len=64)
    params = init_params(config, jax.random.PRNGKey(0))
    assert "position_embedding" not in params
    tokens = jnp.concatenate([jnp.array([[2]]), 48 + jax.random.randint(jax.random.PRNGKey(1), (1, 40), 0, 2)], 1)
    tokens = tokens.at[0, 1].set(49).at[0, 2].set(48)  # first bit 1, second bit 0
    base = forward(config, params, tokens)[:, 0]
    later = np.array(tokens[0, 2:])
    shuffled = tokens.at[0, 2:].set(later[np.random.default_rng(0).permutation(len(later))])
    np.testing.assert_allclose(forward(config, params, shuffled)[:, 0], base, atol=1e-5)
    swapped = tokens.at[0, 1].set(48).at[0, 2].set(49)  # same multiset of bits, other bit at position 1
    assert not np.allclose(forward(config, params, swapped)[:, 0], base, atol=1e-3)
    # with learned positions, order after position 1 does matter (the test above can fail)
    learned = dataclasses.replace(config, position="learned")
    learned_params = init_params(learned, jax.random.PRNGKey(0))
    assert not np.allclose(forward(learned, learned_params, shuffled)[:, 0],
                           forward(learned, learned_params, tokens)[:, 0], atol=1e-3)


def test_sequence_longer_than_max_is_rejected():
    config = ModelConfig(depth=1, width=64, max_seq_len=8)
    params = init_params(config, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        Transformer(config).apply({"params": params}, jnp.zeros((1, 9), jnp.int32))
