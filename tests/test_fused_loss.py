"""The fused (vocabulary-blocked) cross-entropies, plain JAX and Pallas (its kernels in Pallas' interpreter on
this CPU), against the chunked one: loss, gradients, padding, weights, sharding, both objectives, and a trainer's
losses over 50 steps."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import tiny
from model_params import init_params
from scaling.config import LOSS_IMPLS, MeshConfig, ModelConfig, TrainConfig, config_id
from scaling.model import fused_loss, mesh as mesh_lib, packed, pallas_loss
from scaling.model.loss import compute_loss, cross_entropy_sum, resolve_loss_impl
from scaling.model.transformer import Transformer, padded_vocab_size
from scaling.store.metrics_log import read_metrics

# (vocabulary, width, vocabulary block): the byte tokenizer's 260 ids (padded to 384) in blocks of 128, so the
# last block is partly padding; GPT-2's BPE ids with the paper sweep's 4 extra (50,261, padded to 50,304) in
# the default blocks (13 of 3,968, the last one padded with zero columns).
SHAPES = {"bytes": (260, 16, 128), "bpe-50k": (50261, 32, fused_loss.VOCAB_BLOCK)}
FUSED = ("fused", "pallas")  # the blocked implementations, each against the chunked loss


@pytest.fixture
def small_pallas_tiles(monkeypatch):
    """Pallas tiles of 128 rows and 128 ids, so that small inputs span several of each (the online
    log-sum-exp across vocabulary tiles, the accumulations across row tiles, the padded last tile of rows)."""
    monkeypatch.setattr(pallas_loss, "ROW_BLOCK", 128)
    monkeypatch.setattr(pallas_loss, "VOCAB_BLOCK", 128)


def inputs(vocab, width, batch=2, length=12, seed=0, dtype=jnp.float32):
    """Hidden states, a kernel whose padding columns are not zero (the mask, not the values, must keep them out),
    targets, and weights that are 0, 1 or fractional."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    hidden = jax.random.normal(keys[0], (batch, length, width), dtype)
    kernel = (0.5 * jax.random.normal(keys[1], (width, padded_vocab_size(vocab)))).astype(dtype)
    targets = jax.random.randint(keys[2], (batch, length), 0, vocab)
    targets = targets.at[0, :3].set(jnp.asarray([0, vocab - 1, vocab - 2]))  # the first and last real ids
    weights = jax.random.choice(keys[3], jnp.asarray([0.0, 1.0, 1.0, 0.5]), (batch, length))
    return hidden, kernel, targets, weights


def loss_and_grads(impl, vocab, block, args, compute_dtype="float32", chunk_tokens=8):
    def loss(hidden, kernel, weights):
        return cross_entropy_sum(hidden, kernel, args[2], weights, vocab_size=vocab, compute_dtype=compute_dtype,
                                 chunk_tokens=chunk_tokens, impl=impl, vocab_block=block)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(args[0], args[1], args[3])


def test_vocab_blocks_cover_the_padded_vocabulary_in_lane_multiples():
    assert fused_loss.vocab_blocks(50304, 4096) == (13, 3968)
    assert fused_loss.vocab_blocks(384, 4096) == (1, 384)
    assert fused_loss.vocab_blocks(384, 128) == (3, 128)
    assert fused_loss.vocab_blocks(384, 100) == (3, 128)  # rounded up to a lane multiple
    for padded in (128, 384, 50304, 256_000):
        count, size = fused_loss.vocab_blocks(padded, 3000)
        assert size % 128 == 0 and size <= 3072 and count * size >= padded > (count - 1) * size


@pytest.mark.parametrize("impl", FUSED)
@pytest.mark.parametrize("chunk_tokens", [8, 1000])  # 4 positions a slice (3 slices), and the whole sequence
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_loss_and_gradients_equal_the_chunked_ones_in_float32(shape, chunk_tokens, impl):
    vocab, width, block = SHAPES[shape]
    args = inputs(vocab, width)
    (loss, grads), (expected, expected_grads) = (loss_and_grads(each, vocab, block, args, chunk_tokens=chunk_tokens)
                                                 for each in (impl, "chunked"))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    for name, got, want in zip(("hidden", "kernel", "weights"), grads, expected_grads):
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    padded = padded_vocab_size(vocab)
    assert not np.any(grads[1][:, vocab:]) and padded > vocab  # padding ids are never predicted
    assert not np.any(grads[0][args[3] == 0])  # a weight-0 position has no gradient


def test_pallas_loss_spans_several_row_and_vocabulary_tiles(small_pallas_tiles):
    vocab, width, _ = SHAPES["bytes"]
    args = inputs(vocab, width, batch=4, length=80, seed=2)  # 320 rows: 3 tiles of 128, the last padded
    assert pallas_loss.row_block(320, width) == 128
    (loss, grads), (expected, expected_grads) = (loss_and_grads(each, vocab, None, args, chunk_tokens=64)
                                                 for each in ("pallas", "chunked"))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    for name, got, want in zip(("hidden", "kernel", "weights"), grads, expected_grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max()), err_msg=name)


def test_pallas_tiles_shrink_for_wide_models_and_short_inputs():
    """The tile sizes that fit v5e's scoped VMEM (``test_the_kernels_fit_a_v5e_chips_vmem``), where [512, 2048]
    float32 gradient tiles, 2,048-row tiles at d = 192 and 1,024-row ones at d = 448 did not."""
    assert pallas_loss.row_block(32768, 128) == 1024 and pallas_loss.row_block(32768, 2048) == 128
    assert pallas_loss.row_block(32768, 448) == 512  # 768 fits but does not divide the rows
    assert pallas_loss.row_block(32768, 320, itemsize=4) == 512  # float32 tiles: half the rows
    assert pallas_loss.row_block(24, 32) == 128  # one tile, padded
    assert pallas_loss.row_block(2048, 8192) == 128  # never below a lane's 128 rows
    assert [pallas_loss.vocab_block(w) for w in (128, 2048, 4096)] == [512, 512, 256]
    assert [pallas_loss.ids_block(w) for w in (128, 512, 1024, 2048)] == [512, 512, 256, 128]
    hidden, kernel, targets, weights = inputs(260, pallas_loss.MAX_WIDTH + 128, batch=1, length=4)
    with pytest.raises(ValueError, match="supports widths up to 4096"):
        pallas_loss.pallas_loss_sum(hidden, kernel, targets, weights, vocab_size=260)


def test_pallas_loss_is_refused_on_a_gpu_rather_than_interpreted(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    hidden, kernel, targets, weights = inputs(260, 16)
    with pytest.raises(ValueError, match="on gpu use loss_impl='auto', 'chunked' or 'fused'"):
        pallas_loss.pallas_loss_sum(hidden, kernel, targets, weights, vocab_size=260)


@pytest.mark.parametrize("impl", FUSED)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_loss_in_bfloat16_agrees_with_the_chunked_one_to_a_rounding_of_bfloat16(shape, impl):
    """bfloat16 compute: both impls round each logit to bf16 in the same matmul and sum exponentials in float32,
    so the loss agrees to float32 summation order (rtol 1e-5). The gradients may differ by where a backend
    rounds: the chunked loss's hidden gradient is one bf16 matmul over the whole vocabulary, the fused one sums
    float32 block products and rounds once; both round each logit's gradient to bf16 before the matmuls. A
    backend that rounds each matmul's bf16 output differs by about one bf16 rounding, 2^-8 to 2^-9 of an
    entry, so the tolerance is 1% of the gradient's largest entry (atol) and 1% of each entry (rtol). On
    this project's CPU the two agree to 1e-9 of the largest entry (XLA:CPU multiplies bf16 in float32)."""
    vocab, width, block = SHAPES[shape]
    args = inputs(vocab, width, seed=1)
    (loss, grads), (expected, expected_grads) = (loss_and_grads(each, vocab, block, args, "bfloat16")
                                                 for each in (impl, "chunked"))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    for name, got, want in zip(("hidden", "kernel", "weights"), grads, expected_grads):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        np.testing.assert_allclose(got, want, rtol=0.01, atol=0.01 * np.abs(want).max(), err_msg=name)


def test_an_unknown_loss_impl_is_refused_by_name():
    args = inputs(260, 16)
    with pytest.raises(ValueError, match="impl='tokamax'"):
        cross_entropy_sum(*args, vocab_size=260, compute_dtype="float32", chunk_tokens=8, impl="tokamax")
    with pytest.raises(ValueError, match="loss_impl"):
        ModelConfig(loss_impl="tokamax")


def test_the_loss_impl_is_not_part_of_the_run_id():
    base = TrainConfig()
    assert set(LOSS_IMPLS) == {"auto", "chunked", "fused", "pallas"} and base.model.loss_impl == "auto"
    for impl in LOSS_IMPLS:
        assert config_id(dataclasses.replace(base, model=dataclasses.replace(base.model, loss_impl=impl))) \
            == config_id(base)


def test_auto_is_pallas_on_tpu_when_a_devices_tokens_outnumber_its_width_and_chunked_elsewhere():
    from test_preflight import require_libtpu

    assert resolve_loss_impl("auto", 32768, 128) == "chunked"  # no mesh: this CPU
    assert resolve_loss_impl("chunked", 32768, 128) == "chunked" and resolve_loss_impl("fused", 1, 1) == "fused"
    require_libtpu()
    from sweeps import preflight

    tpu = mesh_lib.make_mesh(MeshConfig(), preflight.topology_devices(preflight.parse_topology("v5e:2x2")))
    with mesh_lib.activation_sharding(tpu, MeshConfig().rules):  # a TPU program compiled ahead of time here
        assert resolve_loss_impl("auto", 32768, 128) == "pallas"  # the paper sweep's L6-d128 on v5e:2x4
        assert resolve_loss_impl("auto", 2048, 2048) == "chunked"  # GPT-3 XL at fsdp=256
        assert resolve_loss_impl("auto", 32768, 128, vocab_shards=2) == "chunked"  # tensor parallelism


@pytest.mark.parametrize("impl", FUSED)
def test_the_fused_loss_sharded_over_the_batch_equals_it_on_one_device(eight_devices, impl):
    vocab, width, block = SHAPES["bytes"]
    hidden, kernel, targets, weights = inputs(vocab, width, batch=8, length=16)
    mesh = mesh_lib.make_mesh(MeshConfig(data=2, fsdp=4), eight_devices)

    def loss(h, k):
        with mesh_lib.activation_sharding(mesh, MeshConfig().rules):
            return cross_entropy_sum(h, k, targets, weights, vocab_size=vocab, compute_dtype="float32",
                                     chunk_tokens=8, impl=impl, vocab_block=block)

    rows, columns = (NamedSharding(mesh, PartitionSpec(axes)) for axes in (("data", "fsdp"), "fsdp"))
    sharded = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(jax.device_put(hidden, rows),
                                                               jax.device_put(kernel, columns))
    alone = jax.value_and_grad(loss, argnums=(0, 1))(hidden, kernel)
    np.testing.assert_allclose(sharded[0], alone[0], rtol=1e-5)
    for got, want in zip(sharded[1], alone[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", FUSED)
@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_both_objectives_give_the_same_loss_and_gradient_with_either_impl(objective, impl):
    tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 32), 0, 256)
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1),
             "weights": jnp.ones((4, 32)).at[:, -3:].set(0.0), "input_mask": jnp.ones((4, 32))}
    results = []
    for each in ("chunked", impl):
        config = ModelConfig(depth=1, width=32, objective=objective, max_seq_len=32, loss_chunk_tokens=32,
                             loss_impl=each)
        params = init_params(config, jax.random.PRNGKey(0))

        def loss(p, config=config):
            return compute_loss(Transformer(config), p, batch, rng=jax.random.PRNGKey(3), mask_id=259,
                                random_token_limit=256)[0]

        results.append(jax.value_and_grad(loss)(params))
    (fused, fused_grads), (chunked, chunked_grads) = results[::-1]
    np.testing.assert_allclose(fused, chunked, rtol=1e-5)
    for got, want in zip(jax.tree_util.tree_leaves(fused_grads), jax.tree_util.tree_leaves(chunked_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(jnp.abs(want).max()))


def test_label_logits_loss_is_unchanged_by_the_loss_impl():
    labels = (48, 49)
    batch = {"inputs": jnp.full((4, 5), 48).at[:, 0].set(259), "targets": jnp.zeros((4, 5), jnp.int32).at[:, 0].set(
        jnp.asarray([48, 49, 49, 48])), "weights": jnp.zeros((4, 5)).at[:, 0].set(1.0), "input_mask": jnp.ones((4, 5))}
    losses = []
    for impl in ("chunked", *FUSED):
        config = ModelConfig(depth=1, width=16, num_heads=1, objective="masked", max_seq_len=8, loss_impl=impl)
        losses.append(compute_loss(Transformer(config), init_params(config, jax.random.PRNGKey(0)), batch,
                                   label_ids=labels)[0])
    assert float(losses[0]) == float(losses[1]) == float(losses[2])


def test_a_trainer_run_gives_the_same_losses_over_50_steps_with_either_impl(tmp_path, monkeypatch,
                                                                          small_pallas_tiles):
    monkeypatch.setattr(fused_loss, "VOCAB_BLOCK", 128)  # the byte vocabulary's 384 ids in 3 blocks
    losses = {}
    for impl in ("chunked", *FUSED):
        base = tiny.config(steps=50, checkpoint_every=50, keep_checkpoints=1)
        config = dataclasses.replace(base, model=dataclasses.replace(base.model, loss_impl=impl))
        tiny.run(config, tmp_path / impl)
        losses[impl] = [row["loss"] for row in read_metrics(tmp_path / impl) if row.get("loss") is not None]
    for impl in FUSED:
        assert len(losses[impl]) == 50
        np.testing.assert_allclose(losses[impl], losses["chunked"], rtol=1e-5, err_msg=impl)


def test_the_pallas_loss_compiles_for_a_tpu_without_whole_logits_and_declares_its_costs():
    """Ahead of time for v5e with libtpu (nothing runs on a TPU): the loss and both gradients become two
    kernels, each carrying the cost estimate the preflight prices it by (matmul FLOPs: two passes in each,
    the forward one's second giving the hidden states' gradient), and no array of the compiled program holds
    logits for all positions (as many elements as the positions times a vocabulary tile, without the width
    among its dimensions); the chunked loss's program does."""
    from test_preflight import require_libtpu

    require_libtpu()
    from sweeps import preflight
    from sweeps.preflight import hlo, kernels

    devices = preflight.topology_devices(preflight.parse_topology("v5e:1x1"))
    mesh = mesh_lib.make_mesh(MeshConfig(), devices)
    batch, length, width, vocab = 8, 1024, 128, 50261
    whole = NamedSharding(mesh, PartitionSpec())
    shapes = [((batch, length, width), jnp.bfloat16), ((width, padded_vocab_size(vocab)), jnp.bfloat16),
              ((batch, length), jnp.int32), ((batch, length), jnp.float32)]
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=whole) for shape, dtype in shapes]
    rows = batch * length

    def compiled(impl):
        def loss(hidden, kernel, targets, weights):
            with mesh_lib.activation_sharding(mesh, MeshConfig().rules):
                return cross_entropy_sum(hidden, kernel, targets, weights, vocab_size=vocab,
                                         compute_dtype="bfloat16", chunk_tokens=rows, impl=impl)

        return hlo.parse(jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile().as_text())

    def logits_arrays(module):
        return [(i.name, a) for c in module.computations.values() for i in c.instructions for a in i.arrays
                if a.elements >= rows * pallas_loss.VOCAB_BLOCK and width not in a.dims]

    module = compiled("pallas")
    calls = [i for c in module.computations.values() for i in c.instructions
             if i.opcode == "custom-call" and "tpu_custom_call" in i.attributes]
    priced = {}
    for call in calls:
        name, flops, _ = kernels.declared_cost(call)
        assert kernels.cost_source(name) == "cost estimate"
        priced[re.search(r"pallas_ce_\w+", name).group(0)] = flops  # without jvp(...) or transpose(...)
    ids = -(-padded_vocab_size(vocab) // pallas_loss.VOCAB_BLOCK) * pallas_loss.VOCAB_BLOCK
    one_pass = 2 * rows * width * ids
    assert priced == {"pallas_ce_forward_expectation": 2 * one_pass, "pallas_ce_kernel_grad": 2 * one_pass}
    assert logits_arrays(module) == []
    assert logits_arrays(compiled("chunked"))  # the check can fail: the chunked loss forms whole logits


def test_a_pack_with_the_pallas_loss_trains_as_its_members_do_alone_with_the_chunked_one(eight_devices):
    """Packed runs vmap the step over a ``runs`` mesh axis (``scaling.model.packed``): the kernels' shard_map
    and custom VJP must batch, each group of 2 devices summing only its own run's unembedding gradient.
    Tolerance as tests/test_packed.py's (summation order only)."""
    import test_packed

    runs = test_packed.configs((0, 3e-3), (1, 1e-3), (2, 1e-2), (3, 2e-3))
    kernels_ = [dataclasses.replace(c, model=dataclasses.replace(c.model, loss_impl="pallas")) for c in runs]
    mesh = mesh_lib.make_packed_mesh(MeshConfig(), runs=4, devices=eight_devices)
    pack = packed.build_packed(packed.pack_shape(kernels_, **test_packed.arguments(kernels_[0])), mesh, 4)
    rows, _ = test_packed.train_packed(pack, kernels_, steps=3)
    for member, config in enumerate(runs):
        losses, _ = test_packed.train_solo(config, mesh_lib.group_mesh(mesh, 0), steps=3)
        np.testing.assert_allclose([row[member]["loss"] for row in rows], losses, rtol=test_packed.RTOL)


@pytest.mark.parametrize("width, dtype", [(128, "bfloat16"), (192, "bfloat16"), (448, "bfloat16"),
                                          (2048, "bfloat16"), (4096, "bfloat16"), (320, "float32")])
def test_the_kernels_fit_a_v5e_chips_vmem(width, dtype):
    """Compiled ahead of time for v5e with libtpu: libtpu refuses a kernel whose tiles, scratch and temporaries
    exceed the scoped VMEM, so each width's tiles (``row_block``, ``vocab_block``, ``ids_block``) compile or
    this fails. The tiles do not depend on the rows beyond the first tile's worth."""
    from test_preflight import require_libtpu

    require_libtpu()
    from sweeps import preflight

    devices = preflight.topology_devices(preflight.parse_topology("v5e:1x1"))
    whole = NamedSharding(mesh_lib.make_mesh(MeshConfig(), devices), PartitionSpec())
    compute = jnp.dtype(dtype)
    shapes = [((4, 1024, width), compute), ((width, padded_vocab_size(50261)), compute), ((4, 1024), jnp.int32),
              ((4, 1024), jnp.float32)]
    args = [jax.ShapeDtypeStruct(shape, kind, sharding=whole) for shape, kind in shapes]

    def loss(hidden, kernel, targets, weights):
        return pallas_loss.pallas_loss_sum(hidden, kernel, targets, weights, vocab_size=50261, interpret=False)

    jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile()
