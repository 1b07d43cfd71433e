"""A transformer language model in Flax Linen, written to be read in one sitting.

One ``Transformer`` covers both objectives of the seeds:
- ``causal``: GPT-style next-token prediction, causal self-attention;
- ``masked``: BERT-style masked-LM, bidirectional self-attention; the batch
  is masked on device by ``scaling.model.loss.mask_for_mlm`` and only masked
  positions count.
The losses of both live in ``scaling.model.loss``, which never forms the whole
[batch, length, vocab] logits at once.

Each layer (``block="gpt"``) is the paper's block: multi-head softmax attention scaled by
1/sqrt(d_a), then a position-wise feed-forward of width ``ff_multiplier * d``,
each with a residual connection and LayerNorm (pre- or post-norm). With the
default ``ff_multiplier=4`` and no biases, one layer holds exactly 12·d²
weights in its attention and feed-forward kernels, which is the N = 12·L·d²
that every budget in this project counts. ``block="llama"`` is today's
variant: RMSNorm, a SwiGLU feed-forward whose hidden width keeps the layer at
12·d² weights as nearly as whole channels allow, rotary positions, no biases.

Every parameter carries logical axis names (``embed``, ``heads``, ``kv``,
``mlp``, ``vocab``, ``layers``, ...); ``scaling.model.mesh`` maps them to mesh axes.
With ``scan_layers=True`` the stack is one ``nn.scan`` over a single block, so
compile time does not grow with depth; parameters then have a leading
``layers`` axis. ``stack_layers`` / ``unstack_layers`` convert between the two
layouts. The vocabulary axis is stored padded to a multiple of 128 ids
(``padded_vocab_size``); padding ids start at zero and are masked out of
every softmax, so they change no result.

Activations are named too, at block boundaries, on q/k/v, on the
feed-forward hidden state and on the final hidden state and logits
(``scaling.model.mesh.constrain``; MaxText's ``with_logical_constraint`` is the
model for this): the batch is split over the data-parallel axes, heads and
the feed-forward width over ``tensor``. The residual stream's width is left
whole (``RESIDUAL``), as in Megatron-style tensor parallelism.

A parametrization other than the standard one (μP, CompleteP; see
``scaling.model.parametrization``) reaches the model as ``Multipliers``: scales of
the initial hidden matrices, of the attention logits, of each residual
branch and of the output, and whether the readout and the queries start at
zero. They are constants of the program; the defaults change nothing.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from scaling.config import ModelConfig
from scaling.model.attention import attention, platform
from scaling.model.cpu_matmul import dot_general_for
from scaling.model.mesh import constrain
from scaling.model.parametrization import Multipliers

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# Logical axes of the residual stream [batch, length, width]. The width has no
# name on purpose: "embed" shards weights over fsdp, while activations are
# split over the batch only.
RESIDUAL = ("batch", "length", None)

_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole block in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# PyTorch's default initializers, for ``init_scheme="torch"``. nn.Linear draws
# U(±1/sqrt(fan_in)), a variance of 1/(3·fan_in); nn.MultiheadAttention draws its
# packed [3d, d] input projection Xavier-uniform, U(±sqrt(6/(4d))), which on one
# [d, d] projection is a variance of 0.5/fan_avg; nn.Embedding draws N(0, 1).
# (nn.DenseGeneral hands its initializer the kernel flattened to [fan_in, fan_out].)
_TORCH_INITIALIZERS = {
    "linear": nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
    "attention_out": nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
    "qkv": nn.initializers.variance_scaling(0.5, "fan_avg", "uniform"),
    "embedding": nn.initializers.normal(1.0),
}


def _raw_init(config: ModelConfig, std: float | None = None, torch_kind: str = "linear"):
    """N(0, std or init_std) or, under ``init_scheme="torch"``, PyTorch's default for a weight of kind ``torch_kind``."""
    if config.init_scheme == "torch":
        return _TORCH_INITIALIZERS[torch_kind]
    return nn.initializers.normal(std or config.init_std)


def _init(config: ModelConfig, axes: tuple[str, ...], std: float | None = None, torch_kind: str = "linear"):
    """The initializer of one weight, carrying its logical axis names."""
    return nn.with_logical_partitioning(_raw_init(config, std, torch_kind), axes)


VOCAB_MULTIPLE = 128  # TPU lanes: a vocabulary axis of this granularity tiles and shards evenly


def padded_vocab_size(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` ids: the stored size of the vocabulary axis."""
    return -(-vocab_size // multiple) * multiple


def _vocab_init(config: ModelConfig, axes: tuple[str, ...], padded: int, torch_kind: str):
    """An initializer for a table whose ``vocab`` axis is padded to ``padded`` ids.

    The real ids' entries are drawn exactly as for an unpadded table of
    ``config.vocab_size`` ids (same key, same shape), and the padding entries
    are zeros, so padding changes neither the initial model nor, since the
    loss masks padding ids out of the softmax, anything it learns.
    """
    base, axis = _raw_init(config, torch_kind=torch_kind), axes.index("vocab")

    def init(key, shape, dtype=jnp.float32):
        real_shape = tuple(config.vocab_size if i == axis else size for i, size in enumerate(shape))
        widths = [(0, padded - config.vocab_size if i == axis else 0) for i in range(len(shape))]
        return jnp.pad(base(key, real_shape, dtype), widths)

    return nn.with_logical_partitioning(init, axes)


def _zeros(axes: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _layer_norm(config: ModelConfig, name: str) -> nn.Module:
    """The block's normalisation: LayerNorm (gpt) or RMSNorm without an offset (llama)."""
    if config.block == "llama":
        return nn.RMSNorm(epsilon=1e-5, dtype=_DTYPES[config.compute_dtype], param_dtype=_DTYPES[config.param_dtype],
                          scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)), name=name)
    return nn.LayerNorm(
        epsilon=1e-5,
        use_bias=True,
        dtype=_DTYPES[config.compute_dtype],
        param_dtype=_DTYPES[config.param_dtype],
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
        bias_init=_zeros(("norm",)),
        name=name,
    )


def attention_logit_scale(config: ModelConfig, length: int, input_mask: jax.Array | None,
                          multiplier: float = 1.0) -> jax.Array:
    """The factor multiplying q·k logits, broadcastable to [batch, heads, query, key].

    ``standard`` is ``multiplier``/sqrt(d_a) (1/sqrt(d_a) by default; μP's
    ``multiplier`` makes it sqrt(d_base)/d_a, see ``scaling.model.parametrization``).
    ``log_length`` ("Overcoming a Theoretical Limitation of Self-Attention",
    section 4.3, Eq. 1) also multiplies by log n, where n is the number of
    keys a query can see: i+1
    for the query at position i under causal attention, and the number of
    real (unpadded) tokens of the sequence under bidirectional attention.
    """
    scale = multiplier / math.sqrt(config.attention_head_dim)
    if config.attention_scale == "standard":
        return jnp.asarray(scale, jnp.float32)
    if config.objective == "causal":
        visible_keys = jnp.arange(1, length + 1, dtype=jnp.float32)
        return scale * jnp.log(visible_keys)[None, None, :, None]
    if input_mask is None:
        return jnp.asarray(scale * math.log(length), jnp.float32)
    real_tokens = jnp.maximum(input_mask.astype(jnp.float32).sum(axis=-1), 1.0)
    return scale * jnp.log(real_tokens)[:, None, None, None]


# Recomputing GELU in the backward pass keeps one [tokens, ff_width] array
# alive instead of the five intermediates autodiff would save; on CPU that is
# both less memory and faster (the same numbers, computed twice).
_ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": jax.checkpoint(functools.partial(nn.gelu, approximate=True)),  # the tanh approximation
    "gelu_tanh": jax.checkpoint(functools.partial(nn.gelu, approximate=True)),
    "gelu_exact": jax.checkpoint(functools.partial(nn.gelu, approximate=False)),  # x·Φ(x), with erf
}

ROPE_BASE = 10000.0  # the rotary base of "RoFormer: Enhanced Transformer with Rotary Position Embedding", section 3.2.2


def rotary_positions(x: jax.Array, base: float = ROPE_BASE) -> jax.Array:
    """Rotary position embedding of queries or keys ``x`` [batch, length, heads, head_dim].

    Channel i of the first half and channel i of the second half form a pair,
    rotated by the angle position·base^(-2i/head_dim) (the "rotate half"
    layout of GPT-NeoX and Llama; RoFormer, section 3.4.2, pairs neighbours
    instead, the same rotation on permuted channels). Computed in float32, so
    q·k depends on the positions only through their difference.
    """
    half = x.shape[-1] // 2
    frequency = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * frequency[None, :]  # [length, half]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    first, second = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


def _branch_out_std(config: ModelConfig, multipliers: Multipliers) -> float:
    """Initial std of a residual branch's output projection: scaled down with depth (GPT-2 style) so the
    residual stream's variance does not grow with L, at a fixed depth under CompleteP (whose branch
    multiplier scales with depth instead), and by the hidden matrices' width factor."""
    depth = multipliers.branch_init_depth or config.depth
    return config.init_std * multipliers.hidden_init / math.sqrt(2 * depth)


class SelfAttention(nn.Module):
    config: ModelConfig
    multipliers: Multipliers = Multipliers()

    @nn.compact
    def __call__(self, x, input_mask):
        cfg = self.config
        dense = functools.partial(
            nn.DenseGeneral,
            use_bias=cfg.use_bias,
            dtype=_DTYPES[cfg.compute_dtype],
            param_dtype=_DTYPES[cfg.param_dtype],
            dot_general=dot_general_for(platform()),
        )
        heads, head_dim = cfg.heads, cfg.attention_head_dim
        qkv_axes = ("embed", "heads", "kv")

        batch, length, width = x.shape
        # Projections run on [tokens, width]: XLA:CPU's dot kernels are much
        # faster on 2-D operands than on [batch, length, width] ones, whose
        # backward pass it lowers with slow strided transposes.
        tokens = x.reshape(batch * length, width)

        hidden_std = cfg.init_std * self.multipliers.hidden_init

        def projection(name):
            kernel_init = _init(cfg, qkv_axes, hidden_std, "qkv")
            if name == "query" and self.multipliers.zero_query:  # "Tensor Programs V", section D.2
                kernel_init = _zeros(qkv_axes)
            out = dense(features=(heads, head_dim), kernel_init=kernel_init,
                        bias_init=_zeros(("heads", "kv")), name=name)(tokens)
            return constrain(out.reshape(batch, length, heads, head_dim), ("batch", "length", "heads", "kv"))

        query, key, value = projection("query"), projection("key"), projection("value")
        if cfg.position == "rope":
            query, key = rotary_positions(query), rotary_positions(key)
        logit_scale = attention_logit_scale(cfg, length, input_mask, self.multipliers.attention)
        mixed = attention(query, key, value, logit_scale,
                          causal=cfg.objective == "causal", input_mask=input_mask,
                          implementation=cfg.attention_impl)
        mixed = constrain(mixed, ("batch", "length", "heads", "kv"))
        out_init = _init(cfg, ("heads", "kv", "embed"), _branch_out_std(cfg, self.multipliers), "attention_out")
        out = dense(features=cfg.width, axis=(-2, -1), kernel_init=out_init,
                    bias_init=_zeros(("embed",)), name="out")(mixed.reshape(batch * length, heads, head_dim))
        return out.reshape(batch, length, width)


class FeedForward(nn.Module):
    config: ModelConfig
    multipliers: Multipliers = Multipliers()

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dense = functools.partial(nn.Dense, use_bias=cfg.use_bias, dtype=_DTYPES[cfg.compute_dtype],
                                  param_dtype=_DTYPES[cfg.param_dtype], dot_general=dot_general_for(platform()))
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # 2-D matmuls, as in SelfAttention
        def expand(name):
            hidden_init = _init(cfg, ("embed", "mlp"), cfg.init_std * self.multipliers.hidden_init)
            hidden = dense(cfg.ff_width, kernel_init=hidden_init,
                           bias_init=_zeros(("mlp",)), name=name)(tokens)
            # Tokens are batch-major, so splitting them in contiguous blocks is splitting the batch.
            return constrain(hidden, ("batch", "mlp"))

        if cfg.activation == "swiglu":  # "GLU Variants Improve Transformer", section 2: SiLU(x·W)⊙(x·V)
            hidden = nn.silu(expand("wi_gate")) * expand("wi")
        else:
            hidden = _ACTIVATIONS[cfg.activation](expand("wi"))
        out = dense(cfg.width, kernel_init=_init(cfg, ("mlp", "embed"), _branch_out_std(cfg, self.multipliers)),
                    bias_init=_zeros(("embed",)), name="wo")(hidden)
        return out.reshape(shape)


class Block(nn.Module):
    """One self-attention layer. Returns ``(x, None)`` so it can be scanned."""

    config: ModelConfig
    deterministic: bool = True
    multipliers: Multipliers = Multipliers()

    @nn.compact
    def __call__(self, x, input_mask):
        cfg, scales = self.config, self.multipliers
        drop = nn.Dropout(cfg.dropout, deterministic=self.deterministic)
        attend = SelfAttention(cfg, scales, name="attention")
        feed_forward = FeedForward(cfg, scales, name="mlp")

        def branch(out):  # CompleteP scales each residual branch with depth; a constant 1 is left out
            return drop(out) if scales.residual == 1.0 else scales.residual * drop(out)

        x = constrain(x, RESIDUAL)
        if cfg.norm == "pre":
            x = x + branch(attend(_layer_norm(cfg, "attention_norm")(x), input_mask))
            x = x + branch(feed_forward(_layer_norm(cfg, "mlp_norm")(x)))
        else:
            x = _layer_norm(cfg, "attention_norm")(x + branch(attend(x, input_mask)))
            x = _layer_norm(cfg, "mlp_norm")(x + branch(feed_forward(x)))
        return constrain(x, RESIDUAL), None


def sinusoidal_positions(length: int, width: int) -> jax.Array:
    """Fixed sin/cos position codes, [length, width]."""
    position = jnp.arange(length, dtype=jnp.float32)[:, None]
    frequency = jnp.exp(-math.log(10000.0) * jnp.arange(0, width, 2, dtype=jnp.float32) / width)
    codes = jnp.zeros((length, width), jnp.float32)
    codes = codes.at[:, 0::2].set(jnp.sin(position * frequency))
    return codes.at[:, 1::2].set(jnp.cos(position * frequency[: width // 2]))


def first_indicator_positions(length: int, width: int) -> jax.Array:
    """Fixed position codes [length, width] that only mark position 1: channel 0
    is 1 there and every other entry is 0.

    With CLS at position 0 this tells the model which token is the first bit
    and nothing else, as in the FIRST training script that accompanies
    "Overcoming a Theoretical Limitation of Self-Attention" (Chiang and Cholak,
    2022; github.com/ndnlp/parity, first.py). CLS is told apart by its token.
    """
    return (jnp.arange(length) == 1)[:, None] * (jnp.arange(width) == 0)[None, :].astype(jnp.float32)


class Unembedding(nn.Module):
    """The untied output projection's kernel, [width, padded vocabulary]; the loss applies it."""

    config: ModelConfig
    padded_vocab: int
    zero: bool = False  # start at zero ("Tensor Programs V", section D.2)

    @nn.compact
    def __call__(self):
        cfg = self.config
        init = _zeros(("embed", "vocab")) if self.zero else _vocab_init(cfg, ("embed", "vocab"), self.padded_vocab,
                                                                         "linear")
        return self.param("kernel", init, (cfg.width, self.padded_vocab), _DTYPES[cfg.param_dtype])


def unembed(hidden: jax.Array, kernel: jax.Array, vocab_size: int, compute_dtype: str) -> jax.Array:
    """Float32 logits [..., padded vocabulary] of final hidden states [..., width].

    Ids at or beyond ``vocab_size`` (the padding) get a large negative logit,
    so a softmax gives them zero probability and zero gradient.
    """
    dtype = _DTYPES[compute_dtype]
    logits = jnp.dot(hidden.astype(dtype), kernel.astype(dtype)).astype(jnp.float32)
    if kernel.shape[-1] == vocab_size:
        return logits
    real = jnp.arange(kernel.shape[-1]) < vocab_size
    return jnp.where(real, logits, _PADDING_LOGIT)


_PADDING_LOGIT = -1e30  # finite: exp() of it underflows to 0 without an inf reaching the arithmetic


class Transformer(nn.Module):
    """Token ids [batch, length] -> logits [batch, length, vocab] (float32).

    With ``return_hidden=True`` it returns ``(hidden, kernel)`` instead: the
    final hidden states [batch, length, width] and the unembedding kernel
    [width, padded vocabulary], so a loss can form the logits a slice at a
    time (``scaling.model.loss``) rather than all at once. The vocabulary axis of
    the embedding and unembedding is stored padded to a multiple of
    ``vocab_multiple`` ids (``padded_vocab_size``); the padding never
    changes a logit of a real id or the loss. ``multipliers`` are the
    parametrization's scales (``scaling.model.parametrization``); the returned
    hidden states already carry its output multiplier.
    """

    config: ModelConfig
    vocab_multiple: int = VOCAB_MULTIPLE
    multipliers: Multipliers = Multipliers()

    @nn.compact
    def __call__(self, tokens, input_mask=None, *, deterministic: bool = True, return_hidden: bool = False):
        cfg = self.config
        length = tokens.shape[1]
        if length > cfg.max_seq_len:
            raise ValueError(f"sequence length {length} exceeds model.max_seq_len={cfg.max_seq_len}")
        padded_vocab = padded_vocab_size(cfg.vocab_size, self.vocab_multiple)
        embed = nn.Embed(padded_vocab, cfg.width,
                         embedding_init=_vocab_init(cfg, ("vocab", "embed"), padded_vocab, "embedding"),
                         dtype=_DTYPES[cfg.compute_dtype], param_dtype=_DTYPES[cfg.param_dtype],
                         name="token_embedding")
        x = embed(tokens)
        if cfg.position == "learned":
            table = self.param("position_embedding", _init(cfg, ("length", "embed"), torch_kind="embedding"),
                               (cfg.max_seq_len, cfg.width), _DTYPES[cfg.param_dtype])
            x = x + table[:length].astype(x.dtype)
        elif cfg.position == "sinusoidal":
            x = x + sinusoidal_positions(length, cfg.width).astype(x.dtype)
        elif cfg.position == "first_indicator":
            x = x + first_indicator_positions(length, cfg.width).astype(x.dtype)
        # "rope": nothing is added here; the attention rotates queries and keys by position
        x = constrain(nn.Dropout(cfg.dropout, deterministic=deterministic)(x), RESIDUAL)
        self.sow("intermediates", "embedded", x)  # for probes (benchmarks/coord_check.py); a no-op otherwise

        block = Block
        if cfg.remat != "none":
            block = nn.remat(Block, policy=_REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
        if cfg.scan_layers:
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                            in_axes=nn.broadcast, length=cfg.depth,
                            metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = stack(cfg, deterministic, self.multipliers, name="layers")(x, input_mask)
        else:
            for index in range(cfg.depth):
                x, _ = block(cfg, deterministic, self.multipliers, name=f"layers_{index}")(x, input_mask)

        if cfg.norm == "pre":
            x = _layer_norm(cfg, "final_norm")(x)
        if self.multipliers.output != 1.0:
            # μP's output multiplier on the hidden state, which scales the logits and the unembedding's
            # gradient alike (scaling.model.parametrization), and leaves the loss's sliced logits untouched.
            x = x * jnp.asarray(self.multipliers.output, x.dtype)
        x = constrain(x, RESIDUAL)
        if cfg.tie_embeddings:
            kernel = embed.embedding.T
        else:
            kernel = Unembedding(cfg, padded_vocab, self.multipliers.zero_readout, name="unembedding")()
        if return_hidden:
            return x, kernel
        logits = unembed(x, kernel, cfg.vocab_size, cfg.compute_dtype)[..., :cfg.vocab_size]
        return constrain(logits, ("batch", "length", "vocab"))


# ---------------------------------------------------------------------------
# Parameter layouts


def unstack_layers(params: dict, depth: int) -> dict:
    """Scanned layout (``layers`` with a leading depth axis) -> ``layers_0..layers_{L-1}``."""
    params = dict(params)
    stacked = params.pop("layers")
    for index in range(depth):
        params[f"layers_{index}"] = jax.tree_util.tree_map(lambda leaf, i=index: leaf[i], stacked)
    return params


def stack_layers(params: dict, depth: int) -> dict:
    """Unrolled layout (``layers_0..``) -> scanned layout with a leading depth axis."""
    params = dict(params)
    layers = [params.pop(f"layers_{index}") for index in range(depth)]
    params["layers"] = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *layers)
    return params
