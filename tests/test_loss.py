"""The loss: masked-LM positions, labels read from two logits, and the sliced cross-entropy (the same loss
and gradients as whole logits, one gather of the unembedding)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from model_params import init_params
from scaling.config import MeshConfig, ModelConfig
from scaling.model import mesh as mesh_lib
from scaling.model.loss import compute_loss, cross_entropy_sum, mask_for_mlm, slice_positions
from scaling.model.transformer import Transformer, unembed
from sweeps.preflight import hlo

VOCAB, PADDED, WIDTH = 300, 384, 32


def inputs(batch=4, length=10, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    hidden = jax.random.normal(keys[0], (batch, length, WIDTH))
    kernel = 0.3 * jax.random.normal(keys[1], (WIDTH, PADDED)) * (jnp.arange(PADDED) < VOCAB)
    targets = jax.random.randint(keys[2], (batch, length), 0, VOCAB)
    weights = (jax.random.uniform(keys[3], (batch, length)) < 0.8).astype(jnp.float32)
    return hidden, kernel, targets, weights


def whole_logits_loss(hidden, kernel, targets, weights, compute_dtype):
    """The loss as it was computed before slicing existed: float32 logits of every position at once."""
    logits = unembed(hidden, kernel, VOCAB, compute_dtype)
    return (optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights).sum()


@pytest.mark.parametrize("chunk_tokens", [8, 12, 1000])  # 2 positions a slice, 3 (10 is not a multiple), whole
def test_sliced_loss_and_gradients_equal_whole_logits_in_float32(chunk_tokens):
    args = inputs()
    sliced = lambda h, k: cross_entropy_sum(h, k, *args[2:], vocab_size=VOCAB, compute_dtype="float32",  # noqa: E731
                                            chunk_tokens=chunk_tokens)
    whole = lambda h, k: whole_logits_loss(h, k, *args[2:], "float32")  # noqa: E731
    loss, grads = jax.jit(jax.value_and_grad(sliced, argnums=(0, 1)))(*args[:2])
    expected, expected_grads = jax.value_and_grad(whole, argnums=(0, 1))(*args[:2])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert not np.any(grads[1][:, VOCAB:])  # padding ids are never predicted: no gradient reaches them


def test_bfloat16_loss_matches_the_old_bfloat16_logits():
    # Both round the logits to bf16 (the bf16 matmul always did); the sums run in float32.
    args = inputs(seed=1)
    loss = cross_entropy_sum(*args, vocab_size=VOCAB, compute_dtype="bfloat16", chunk_tokens=8)
    grads = jax.grad(lambda k: cross_entropy_sum(args[0], k, *args[2:], vocab_size=VOCAB,
                                                 compute_dtype="bfloat16", chunk_tokens=8))(args[1])
    expected = whole_logits_loss(*args, "bfloat16")
    expected_grads = jax.grad(lambda k: whole_logits_loss(args[0], k, *args[2:], "bfloat16"))(args[1])
    np.testing.assert_allclose(loss, expected, rtol=2e-3)
    np.testing.assert_allclose(grads, expected_grads, rtol=0.05, atol=2e-3 * float(jnp.abs(expected_grads).max()))


def test_slices_are_counted_in_one_devices_rows():
    # 256 sequences over 256 chips: one row each, so 8192 tokens are 8192 positions of it, not 32.
    assert slice_positions(256, 16384, 8192, batch_shards=256) == 8192
    assert slice_positions(256, 16384, 8192) == 32
    assert slice_positions(16, 100, 8192, batch_shards=4) == 100  # a device's rows fit: one piece


def test_the_unembedding_is_gathered_once_outside_the_slice_loop(eight_devices):
    mesh = mesh_lib.make_mesh(MeshConfig(data=1, fsdp=8), eight_devices)
    rules = MeshConfig().rules
    hidden, kernel, targets, weights = inputs(batch=8, length=16)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    kernel = jax.device_put(kernel, NamedSharding(mesh, PartitionSpec("fsdp")))

    def loss(h, k):
        with mesh_lib.activation_sharding(mesh, rules):
            return cross_entropy_sum(h, k, targets, weights, vocab_size=VOCAB, compute_dtype="float32",
                                     chunk_tokens=4)  # 4 positions of each device's row: 4 slices

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    module = hlo.parse(step.lower(jax.device_put(hidden, rows), kernel).compile().as_text())
    loops = {callee for c in module.computations.values() for i in c.instructions if i.opcode == "while"
             for role, callee in i.called()}
    in_loops, outside = 0, 0
    for computation in module.computations.values():
        for instruction in computation.instructions:
            if instruction.opcode.startswith("all-gather") and any(
                    a.dims == (WIDTH, PADDED) for a in instruction.arrays):
                in_loops += computation.name in loops
                outside += computation.name not in loops
    assert (in_loops, outside) == (0, 1)


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


LABELS = (48, 49)  # byte ids of '0' and '1'


def _label_batch(length=5, batch=4):
    rng = np.random.default_rng(0)
    tokens = rng.integers(48, 50, (batch, length)).astype(np.int32)
    tokens[:, 0] = 259
    targets = np.zeros((batch, length), np.int32)
    targets[:, 0] = np.where(rng.random(batch) < 0.5, *LABELS)
    weights = np.zeros((batch, length), np.float32)
    weights[:, 0] = 1.0
    return {"inputs": jnp.asarray(tokens), "targets": jnp.asarray(targets), "weights": jnp.asarray(weights),
            "input_mask": jnp.ones((batch, length), jnp.float32)}


def test_labels_are_read_from_the_two_label_logits_only():
    config = ModelConfig(depth=1, width=16, num_heads=1, objective="masked", max_seq_len=8)
    model, batch = Transformer(config), _label_batch()
    params = init_params(config, jax.random.PRNGKey(0))
    loss, aux = compute_loss(model, params, batch, label_ids=LABELS)
    # By hand: binary cross-entropy of the two label logits at CLS.
    logits = np.asarray(model.apply({"params": params}, batch["inputs"], batch["input_mask"]))[:, 0]
    pair = logits[:, list(LABELS)]
    classes = (np.asarray(batch["targets"][:, 0]) == LABELS[1]).astype(int)
    log_p = pair - np.logaddexp(pair[:, 0], pair[:, 1])[:, None]
    np.testing.assert_allclose(float(loss), -log_p[np.arange(4), classes].mean(), rtol=1e-5)
    assert float(aux["correct"]) == (pair.argmax(1) == classes).sum() and float(aux["tokens"]) == 4
    # Moving any other logit changes nothing; moving a label logit does.
    unembedding = params["unembedding"]["kernel"]
    other = jax.tree_util.tree_map(lambda x: x, params)
    other["unembedding"]["kernel"] = unembedding.at[0, 100].add(50.0).at[1, 259].add(-50.0)
    np.testing.assert_allclose(float(compute_loss(model, other, batch, label_ids=LABELS)[0]), float(loss), rtol=1e-6)
    moved = jax.tree_util.tree_map(lambda x: x, params)
    moved["unembedding"]["kernel"] = unembedding.at[0, LABELS[1]].add(5.0)
    assert abs(float(compute_loss(model, moved, batch, label_ids=LABELS)[0]) - float(loss)) > 1e-3
    # Without label_ids the loss is the softmax over the whole vocabulary: other logits count.
    assert float(compute_loss(model, other, batch)[0]) != pytest.approx(float(compute_loss(model, params, batch)[0]))
