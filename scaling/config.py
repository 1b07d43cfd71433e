"""Typed, frozen configuration for one training run, and the run id it hashes to.

The sections are pydantic dataclasses: building one checks every field's type
(``Literal`` fields against their allowed values) and range, and raises a
``ValueError`` naming the field, so a bad sweep fails at construction, long
before anything is compiled. The same validation reads a run's ``config.json``
(``from_dict``) and the command line's ``--set KEY=VALUE``
(``scaling.overrides.override``).

Units: widths and head sizes are in channels, sequence lengths in tokens,
batch sizes in sequences (global, across all hosts), learning rates are the
peak AdamW step size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

# Every section refuses unknown keys and non-finite floats; lax mode turns
# integral floats into ints (``1e3`` in a JSON file) but refuses ``10.7`` steps.
_SECTION = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
_section = pydantic.dataclasses.dataclass(frozen=True, config=_SECTION)

Fraction = Annotated[float, Field(gt=0, lt=1)]
Probability = Annotated[float, Field(ge=0, lt=1)]

# Allowed values, each written once: the fields below, the model and the command
# lines read them from here (``choices``).
TEXT_SOURCES = ("builtin", "hub", "local")
CLASSIFICATION_SOURCES = ("parity", "first")
SYNTHETIC_SOURCES = CLASSIFICATION_SOURCES + ("lookback",)
Source = Literal[TEXT_SOURCES + SYNTHETIC_SOURCES]
RematPolicy = Literal["none", "full", "dots", "dots_no_batch"]
PositionEncoding = Literal["learned", "sinusoidal", "first_indicator", "rope"]
# ``gpt``: the paper's 2020 block (LayerNorm, ReLU/GELU feed-forward, additive positions, optional biases).
# ``llama``: RMSNorm, SwiGLU feed-forward, rotary positions, no biases (the block MaxText and Levanter train).
Block = Literal["gpt", "llama"]
# ``gelu`` is Flax's default, the tanh approximation, and keeps that meaning (and run ids) for old
# configs; ``gelu_tanh`` names the same function explicitly, ``gelu_exact`` is x·Φ(x) with the error function.
# ``swiglu`` is the llama block's gated feed-forward (SiLU gate), set by that block.
Activation = Literal["relu", "gelu", "gelu_tanh", "gelu_exact", "swiglu"]
AttentionScale = Literal["standard", "log_length"]
AttentionImpl = Literal["xla", "flash"]
# How the loss forms the logits (``scaling.model.loss.cross_entropy_sum``): ``chunked``, a slice of positions
# over the whole vocabulary at a time; ``fused``, also in blocks of the vocabulary (``scaling.model.fused_loss``);
# ``pallas``, the same blocks as TPU kernels that keep each block's logits on chip (``scaling.model.pallas_loss``);
# ``auto``, the one measured faster on the platform the step is compiled for (``scaling.model.loss.resolve_loss_impl``).
LOSS_IMPLS = ("auto", "chunked", "fused", "pallas")
LossImpl = Literal[LOSS_IMPLS]
Dtype = Literal["float32", "bfloat16"]
# How initialisation, rates and multipliers follow width and depth (``OptimConfig``, ``scaling.model.parametrization``).
Parametrization = Literal["standard", "mup", "completep"]


def choices(kind) -> tuple[str, ...]:
    """The allowed values of a ``Literal`` type above, in order."""
    return typing.get_args(kind)


def _require(ok: bool, field: str, allowed: str, value: Any) -> None:
    """Cross-field checks that a type cannot express; the message names the field."""
    if not ok:
        raise ValueError(f"{field}={value!r} is invalid: allowed {allowed}")


@_section
class ModelConfig:
    """Shape and options of one transformer language model.

    ``depth`` is the number of self-attention layers L, ``width`` the residual
    width d_x. Exactly one of ``num_heads`` / ``head_dim`` decides the head
    split: ``num_heads`` wins when given, otherwise heads = width // head_dim.
    """

    depth: PositiveInt = 2
    width: PositiveInt = 64
    num_heads: PositiveInt | None = None
    head_dim: PositiveInt = 64
    ff_multiplier: PositiveInt = 4
    block: Block = "gpt"
    vocab_size: Annotated[int, Field(ge=2)] = 260
    max_seq_len: PositiveInt = 256
    objective: Literal["causal", "masked"] = "causal"
    mask_rate: Fraction = 0.15  # masked objective only: fraction of positions predicted
    norm: Literal["pre", "post"] = "pre"
    activation: Activation = "relu"
    # ``first_indicator``: no position vector except a fixed 1 added to channel 0
    # at position 1 (the first bit after CLS), the encoding the authors of
    # "Overcoming a Theoretical Limitation of Self-Attention" trained FIRST with;
    # nothing about position is learned, so no position is left untrained when
    # testing on longer strings.
    position: PositionEncoding = "learned"
    attention_scale: AttentionScale = "standard"
    use_bias: bool = False
    tie_embeddings: bool = False
    dropout: Probability = 0.0
    param_dtype: Dtype = "float32"
    compute_dtype: Dtype = "float32"
    scan_layers: bool = True
    remat: RematPolicy = "none"
    # ``xla``: attention scores materialised by XLA; ``flash``: a fused kernel that
    # never writes them (Pallas splash attention on TPU, cuDNN on GPU, the splash
    # kernel interpreted on CPU, for tests); see ``scaling.model.attention``. The same
    # function either way, so not part of the run id.
    attention_impl: AttentionImpl = "xla"
    init_std: PositiveFloat = 0.02
    # ``normal``: every weight N(0, init_std²). ``torch``: PyTorch's defaults for
    # nn.TransformerEncoderLayer / nn.Linear / nn.Embedding (uniform ±1/sqrt(fan_in)
    # linears, Xavier-uniform attention projections, N(0, 1) embeddings), as
    # "Overcoming a Theoretical Limitation of Self-Attention" (section 4.1) trains with.
    init_scheme: Literal["normal", "torch"] = "normal"
    # The loss forms logits for about this many tokens of one device's rows of the
    # (micro)batch at a time (``scaling.model.loss.cross_entropy_sum``): memory, not
    # results, depends on it.
    loss_chunk_tokens: PositiveInt = 8192
    # ``auto``, ``chunked``, ``fused`` or ``pallas`` (``LOSS_IMPLS``): the same loss computed three ways, so not
    # part of the run id. ``fused`` never forms more than one vocabulary block of a slice's logits
    # (scaling/model/fused_loss.py); ``pallas`` keeps each tile of logits on a TPU's chip (pallas_loss.py).
    loss_impl: LossImpl = "auto"

    def __post_init__(self):
        if self.num_heads is not None:
            _require(self.width % self.num_heads == 0, "num_heads", f"a divisor of width={self.width}",
                     self.num_heads)
        else:
            _require(self.width % self.head_dim == 0 or self.width < self.head_dim, "head_dim",
                     f"a divisor of width={self.width} (or larger than width, giving one head)", self.head_dim)
        if self.block == "llama":
            # The llama block fixes its norm, feed-forward and positions: the gpt block's defaults
            # (pre-norm, relu, learned) stand for "the block's own" and become pre / swiglu / rope;
            # any other explicit choice contradicts the block and is refused.
            for field, gpt_default, own in (("norm", "pre", "pre"), ("activation", "relu", "swiglu"),
                                            ("position", "learned", "rope")):
                value = getattr(self, field)
                _require(value in (gpt_default, own), field, f"{own!r} with model.block='llama'", value)
                object.__setattr__(self, field, own)
            _require(not self.use_bias, "use_bias", "False with model.block='llama' (it has no biases)",
                     self.use_bias)
        else:
            _require(self.activation != "swiglu", "activation",
                     "'relu', 'gelu', 'gelu_tanh' or 'gelu_exact' with model.block='gpt'", self.activation)
        if self.position == "rope":
            _require(self.attention_head_dim % 2 == 0, "head_dim",
                     "an even head size with rotary positions (channels rotate in pairs)", self.attention_head_dim)

    @property
    def heads(self) -> int:
        if self.num_heads is not None:
            return self.num_heads
        return max(1, self.width // self.head_dim)

    @property
    def attention_head_dim(self) -> int:
        return self.width // self.heads

    @property
    def ff_width(self) -> int:
        """The feed-forward hidden width, in channels.

        The gpt block's two matrices hold 2·d·(ff_multiplier·d) weights. The
        llama block's three SwiGLU matrices (gate, up, down) hold 3·d·h, so
        h = 2·ff_multiplier·d/3 rounded to the nearest channel keeps the same
        count as closely as whole channels allow (8·d² for the default 4);
        ``scaling.model.budget.count_params`` reports the exact count.
        """
        if self.block == "llama":
            return max(1, round(2 * self.ff_multiplier * self.width / 3))
        return self.ff_multiplier * self.width

    @property
    def ff_matrices(self) -> int:
        """How many [width, ff_width]-sized matrices one feed-forward holds (2, or 3 for SwiGLU)."""
        return 3 if self.block == "llama" else 2


@_section
class DataConfig:
    """Where tokens come from and how they are cut into sequences.

    The field descriptions are the help of ``python -m scaling.data``'s options.
    """

    source: Source = Field("builtin", description=(
        "builtin (the offline English corpus shipped with the package), hub (a Hugging Face dataset, "
        "streamed), local (text / jsonl / parquet files), or a synthetic task: parity, first "
        "(classification, after 'Overcoming a Theoretical Limitation of Self-Attention') or lookback (an "
        "LM task whose dependency distance is lookback_distance)"))
    hub_name: str = Field("", description="hub dataset name or local folder, e.g. wikitext")
    hub_config: str = Field("", description="hub dataset config, e.g. wikitext-103-raw-v1")
    hub_split: str = Field("train", description="hub split to stream")
    paths: tuple[str, ...] = Field((), description="local .txt / .jsonl / .parquet files")
    text_field: str = Field("text", description="column holding the text")
    max_documents: Annotated[int, Field(ge=2)] = Field(
        100_000, description="hub and local sources: documents read from the stream")
    validation_fraction: Annotated[float, Field(gt=0, lt=0.5)] = Field(
        0.02, description="share of documents held out for validation, for sources without a split")
    tokenizer: str = Field("byte", description="byte (no files), bpe (trained on the corpus and cached "
                                               "beside it) or hf:NAME_OR_PATH")
    bpe_vocab_size: Annotated[int, Field(ge=300)] = Field(
        4096, description="tokens in a trained BPE vocabulary, the 256 bytes included")
    seq_len: Annotated[int, Field(ge=2)] = Field(128, description="tokens per training sequence")
    synthetic_min_length: PositiveInt = Field(8, description="parity/first: shortest training string, in bits")
    synthetic_max_length: PositiveInt = Field(32, description="parity/first: longest training string, in bits")
    synthetic_eval_min_length: PositiveInt = Field(8, description="parity/first: shortest validation string")
    synthetic_eval_max_length: PositiveInt = Field(32, description="parity/first: longest validation string")
    lookback_distance: PositiveInt = Field(16, description="lookback: the dependency distance, in tokens")
    synthetic_train_size: NonNegativeInt = Field(0, description=(
        "parity/first: 0 draws a fresh string for every training example; K > 0 fixes a training set of K "
        "strings per seed, visited once per epoch in a fresh random order (a finite training set, as in "
        "the classification papers)"))
    cache_dir: str = Field("", description=(
        "a token cache directory (local or gs://): `cache` builds it, the other commands and training "
        "read it instead of the source. Not part of the run id (same tokens, same run)"))

    def __post_init__(self):
        if self.source == "hub":
            _require(bool(self.hub_name), "hub_name", "a dataset name or path when source='hub'", self.hub_name)
        if self.source == "local":
            _require(len(self.paths) > 0, "paths", "at least one file when source='local'", self.paths)
        _require(self.tokenizer in ("byte", "bpe") or self.tokenizer.startswith("hf:"), "tokenizer",
                 "'byte', 'bpe' or 'hf:NAME_OR_PATH'", self.tokenizer)
        _require(self.synthetic_min_length <= self.synthetic_max_length, "synthetic_max_length",
                 f">= synthetic_min_length={self.synthetic_min_length}", self.synthetic_max_length)
        _require(self.synthetic_eval_min_length <= self.synthetic_eval_max_length, "synthetic_eval_max_length",
                 f">= synthetic_eval_min_length={self.synthetic_eval_min_length}", self.synthetic_eval_max_length)


@_section
class OptimConfig:
    """AdamW with warmup then decay, and how its numbers (and the model's scales) follow the shape.

    ``parametrization`` (``scaling.model.parametrization`` holds every rule, each cited):
    - ``standard``: initialisation and multipliers as ``model`` says, whatever the
      shape; only ``lr_rule`` scales the rates (today's behaviour, the default);
    - ``mup``: μP ("Tensor Programs V", Tables 3 and 8): hidden matrices' initial
      std × sqrt(base_width/width) and Adam rate × base_width/width, the output
      logits × base_width/width, attention logits 1/d_head (equal to 1/sqrt(d_head)
      at the base head size); embeddings, norms and biases keep theirs;
    - ``completep``: μP plus CompleteP's depth rules ("Don't be lazy: CompleteP
      enables compute-efficient deep transformers", Table 1): every residual branch
      × (base_depth/depth)^depth_alpha, and the rates, weight decay and epsilons it gives.
    Both equal ``standard`` at ``width == base_width`` (and ``depth == base_depth``).

    ``lr_rule`` (under ``parametrization="standard"``; the others set per-tensor
    rates themselves and take only ``constant``):
    - ``constant``: every shape uses ``peak_lr``;
    - ``width_scaled``: ``peak_lr * base_width / width`` for all parameters;
    - ``mup``: μP's rates only ("Tensor Programs V", Table 3), not μP:
      hidden matrices (attention and feed-forward kernels) get
      ``peak_lr * base_width / width``, embeddings, norms and biases keep ``peak_lr``;
      initialisation and multipliers stay standard (``parametrization="mup"`` is the whole of μP).
    """

    peak_lr: PositiveFloat = 3e-3
    lr_rule: Literal["constant", "width_scaled", "mup"] = "constant"
    base_width: PositiveInt = 64  # width at which the rule gives exactly peak_lr
    parametrization: Parametrization = "standard"
    base_depth: PositiveInt = 2  # depth at which completep's depth rules change nothing
    warmup_steps: NonNegativeInt = 50
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    end_lr_fraction: Annotated[float, Field(ge=0, le=1)] = 0.1
    weight_decay: NonNegativeFloat = 0.1
    beta1: Probability = 0.9
    beta2: Probability = 0.95
    eps: float = 1e-8  # base Adam epsilon (the CompleteP reference code's base is 1e-12)
    grad_clip: NonNegativeFloat = 1.0  # global-norm clip; 0 disables
    # Where the references differ, or this project first departed from them, a named choice; each default
    # is the first implementation's (results/hp_transfer). ``scaling.model.parametrization`` gives the reasons.
    depth_alpha: Annotated[float, Field(ge=0.5, le=1)] = 1.0  # completep: branches × (depth/base_depth)^-α
    eps_rule: Literal["first", "blocks", "all", "none"] = "first"  # where μP/CompleteP scale epsilon
    mup_weight_decay: Literal["constant", "width"] = "constant"  # mup: hidden weight decay × width/base_width?
    mup_out_init: Literal["gpt2", "base"] = "gpt2"  # mup: output projections' init std 1/sqrt(2·depth or base)
    output_multiplier: PositiveFloat = 1.0  # base readout multiplier (mup, completep: × base_width/width)
    zero_init_readout: bool = False  # "Tensor Programs V", section D.2: start the unembedding at zero
    zero_init_query: bool = False  # ... and the attention's query projections

    def __post_init__(self):
        if self.parametrization != "standard":
            _require(self.lr_rule == "constant", "lr_rule",
                     f"'constant' with optim.parametrization={self.parametrization!r} (it sets per-tensor rates "
                     "itself)", self.lr_rule)
        _require(self.depth_alpha == 1.0 or self.parametrization == "completep", "depth_alpha",
                 "1.0 unless optim.parametrization='completep' (the others have no depth rule)", self.depth_alpha)


# One rule maps a logical axis name of scaling.model.transformer to mesh axes: one, several,
# or None (replicated). "batch" is an activation axis.
ShardingRule = tuple[str, str | tuple[str, ...] | None]
DEFAULT_SHARDING_RULES: tuple[ShardingRule, ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("qkv", None),
)

@_section
class MeshConfig:
    """Device mesh shape. One of the axes may be -1, meaning "all the rest"."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    rules: tuple[ShardingRule, ...] = DEFAULT_SHARDING_RULES

    def __post_init__(self):
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            _require(size == -1 or size >= 1, name, "-1 or an integer >= 1", size)
        _require(sum(size == -1 for size in sizes.values()) <= 1, "mesh", "at most one axis equal to -1", sizes)


@_section
class TrainConfig:
    """Everything one training run needs. Budgets: ``steps`` optimizer steps of
    ``batch_size`` sequences of ``data.seq_len`` tokens each.

    ``microbatches`` k > 1 accumulates each step's gradient over k slices of
    its batch (``scaling.model.loss.loss_and_grads``): the same loss, gradient and
    data order as k = 1 with about 1/k of the activation memory, so it is not
    part of the run id. Every data-parallel shard's rows must split into k.
    """

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    seed: NonNegativeInt = 0  # sets initialisation, data order and masking
    steps: PositiveInt = 300
    batch_size: PositiveInt = 16
    microbatches: PositiveInt = 1
    eval_every: NonNegativeInt = 100  # 0: evaluate only at the end
    eval_batches: PositiveInt = 8
    eval_at_start: bool = True  # evaluate the freshly initialised model (initial_eval_loss); costs one eval
    checkpoint_every: PositiveInt = 50
    keep_checkpoints: PositiveInt = 2
    log_every: PositiveInt = 10
    # Per device, for MFU; None: the device's figure at model.compute_dtype from scaling.hardware.
    peak_flops: PositiveFloat | None = None
    wandb_mode: Literal["auto", "offline", "online", "disabled"] = "auto"  # auto: online only with an API key
    wandb_project: str = "depth-width-scaling"
    sweep_name: str = ""  # wandb group
    name: str = ""
    init_from: str = ""  # a run directory whose newest parameters a fresh start takes (weights only; in the id)

    def __post_init__(self):
        _require(self.microbatches <= self.batch_size and self.batch_size % self.microbatches == 0,
                 "microbatches", f"a divisor of batch_size={self.batch_size} (1 to {self.batch_size})",
                 self.microbatches)
        _require(self.data.seq_len <= self.model.max_seq_len, "data.seq_len",
                 f"<= model.max_seq_len={self.model.max_seq_len}", self.data.seq_len)
        if self.optim.parametrization != "standard":
            _require(self.model.init_scheme == "normal", "model.init_scheme",
                     f"'normal' with optim.parametrization={self.optim.parametrization!r} (it scales the "
                     "initial weights itself)", self.model.init_scheme)
        _require(not (self.optim.zero_init_readout and self.model.tie_embeddings), "optim.zero_init_readout",
                 "False with model.tie_embeddings (it would zero the embedding too)", self.optim.zero_init_readout)
        if self.model.attention_impl == "flash":  # the splash kernel tiles sequences in blocks of 128
            _require(self.data.seq_len % 128 == 0, "data.seq_len",
                     "a multiple of 128 with model.attention_impl='flash' (or use 'xla')", self.data.seq_len)

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step is planned for: ``batch_size`` sequences of ``data.seq_len`` tokens.
        (A classification task's rows can be shorter; the run record holds what was trained.)"""
        return self.batch_size * self.data.seq_len


# ---------------------------------------------------------------------------
# dict / JSON round trip (dotted ``--set`` overrides are in scaling/overrides.py)


def to_dict(config) -> dict:
    """A JSON-ready nested dict of a config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _one_line(error: pydantic.ValidationError) -> str:
    """Each failed check as ``section.field: why (got value)``, on one line for command lines."""
    problems = []
    for problem in error.errors():
        where = ".".join(map(str, problem["loc"]))
        if problem["type"] == "value_error":  # a __post_init__ check: its message names the field
            problems.append((where + "." if where else "") + str(problem["ctx"]["error"]))
        elif problem["type"] == "unexpected_keyword_argument":
            problems.append(f"{where}: unknown field")
        else:
            problems.append(f"{where}: {problem['msg']} (got {problem['input']!r})")
    return "; ".join(problems)


def from_dict(cls, data: dict):
    """Build ``cls`` (a config dataclass) from a nested dict such as a run's
    ``config.json``, validated; unknown keys are refused by name."""
    try:
        return pydantic.TypeAdapter(cls).validate_python(data)
    except pydantic.ValidationError as error:
        raise ValueError(f"{cls.__name__}: {_one_line(error)}") from None


# Fields that do not change what a run computes: two configs differing only
# here describe the same experiment (same run id, same results). Dotted names
# reach into sections. ``microbatches``, ``model.loss_chunk_tokens``, ``model.loss_impl`` and
# ``model.attention_impl`` change only how a step is computed (float rounding
# aside; with dropout, microbatches also draw different dropout noise), never
# the data or the model.
_PRESENTATION_FIELDS = ("name", "wandb_mode", "wandb_project", "sweep_name", "log_every", "peak_flops",
                        "checkpoint_every", "keep_checkpoints", "mesh", "data.cache_dir", "eval_at_start",
                        "microbatches", "model.loss_chunk_tokens", "model.attention_impl", "model.loss_impl")

# Fields added after run records were first committed, with the value that
# reproduces the old behaviour. A config holding that value hashes exactly as
# it did before the field existed, so adding a field never orphans records.
# Add every new result-changing field here with its default; never change an
# existing default (add a field instead).
_NEUTRAL_VALUES: dict[str, Any] = {"model.init_scheme": "normal", "data.synthetic_train_size": 0,
                                   "model.block": "gpt", "optim.parametrization": "standard",
                                   "optim.base_depth": 2, "init_from": "", "optim.depth_alpha": 1.0,
                                   "optim.eps_rule": "first", "optim.mup_weight_decay": "constant",
                                   "optim.mup_out_init": "gpt2", "optim.output_multiplier": 1.0,
                                   "optim.zero_init_readout": False, "optim.zero_init_query": False}
# Spellings of one model: hashed as the older name, so a config that names the same function
# anew keeps the run id of the records trained before the new name existed.
_SAME_AS: dict[str, dict[Any, Any]] = {"model.activation": {"gelu_tanh": "gelu"}}


def _parent(data: dict, dotted: str) -> tuple[dict, str]:
    """The dict holding a dotted field of ``data`` ({} when a section is missing), and the field's name."""
    *sections, leaf = dotted.split(".")
    for section_name in sections:
        data = data.get(section_name, {})
    return data, leaf


def _identity(config: TrainConfig) -> dict:
    data = to_dict(config)
    for dotted in _PRESENTATION_FIELDS:
        node, leaf = _parent(data, dotted)
        node.pop(leaf, None)
    for dotted, neutral in _NEUTRAL_VALUES.items():
        node, leaf = _parent(data, dotted)
        if leaf in node and node[leaf] == neutral:
            del node[leaf]
    for dotted, spellings in _SAME_AS.items():
        node, leaf = _parent(data, dotted)
        if node.get(leaf) in spellings:
            node[leaf] = spellings[node[leaf]]
    return data


def config_id(config: TrainConfig, length: int = 12) -> str:
    """A stable hex id (``length`` characters) of everything in ``config`` that affects the trained model."""
    return hashlib.sha256(json.dumps(_identity(config), sort_keys=True).encode()).hexdigest()[:length]
