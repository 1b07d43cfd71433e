"""Typed, frozen configuration for one training run.

Every dataclass validates itself in ``__post_init__`` and raises ``ValueError``
naming the offending field and the allowed values, so a bad sweep fails at
construction time, long before anything is compiled.

Units: widths and head sizes are in channels, sequence lengths in tokens,
batch sizes in sequences (global, across all hosts), learning rates are the
peak AdamW step size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any


def _require(ok: bool, field: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{field}={value!r} is invalid: allowed {allowed}")


def _choice(field: str, value: Any, options: tuple) -> None:
    _require(value in options, field, "one of " + ", ".join(map(repr, options)), value)


def _check_types(config) -> None:
    """Check every field against its annotation, before any range check compares values.

    Integral floats become ints (``1e3`` from a JSON file), other floats in an
    int field are refused (``steps: 10.7`` must not train 11 steps), floats
    must be finite, and nested sections must be their dataclass.
    """
    import math
    import types

    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None and type(None) in options:
            continue
        kind = next(t for t in options if t is not type(None))
        origin = typing.get_origin(kind) or kind
        name = f"{field.name}"
        if kind is bool:
            _require(isinstance(value, bool), name, "true or false", value)
        elif kind is int:
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                object.__setattr__(config, field.name, int(value))
                continue
            _require(isinstance(value, int) and not isinstance(value, bool), name, "an integer", value)
        elif kind is float:
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                     name, "a finite number", value)
            object.__setattr__(config, field.name, float(value))
        elif kind is str:
            _require(isinstance(value, str), name, "a string", value)
        elif origin is tuple:
            _require(isinstance(value, tuple), name, "a list", value)
        elif dataclasses.is_dataclass(kind):
            _require(isinstance(value, kind), name, f"a {kind.__name__} section (a mapping of its fields)", value)


def _tuplify(value):
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value


REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
POSITION_ENCODINGS = ("learned", "sinusoidal", "first_indicator")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and options of one transformer language model.

    ``depth`` is the number of self-attention layers L, ``width`` the residual
    width d_x. Exactly one of ``num_heads`` / ``head_dim`` decides the head
    split: ``num_heads`` wins when given, otherwise heads = width // head_dim.
    """

    depth: int = 2
    width: int = 64
    num_heads: int | None = None
    head_dim: int = 64
    ff_multiplier: int = 4
    vocab_size: int = 260
    max_seq_len: int = 256
    objective: str = "causal"  # causal | masked
    mask_rate: float = 0.15  # masked objective only: fraction of positions predicted
    norm: str = "pre"  # pre | post
    activation: str = "relu"  # relu | gelu
    # learned | sinusoidal | first_indicator. ``first_indicator``: no position
    # vector except a fixed 1 added to channel 0 at position 1 (the first bit after
    # CLS), the encoding the authors of "Overcoming a Theoretical Limitation of
    # Self-Attention" trained FIRST with; nothing about position is learned, so no
    # position is left untrained when testing on longer strings.
    position: str = "learned"
    attention_scale: str = "standard"  # standard | log_length
    use_bias: bool = False
    tie_embeddings: bool = False
    dropout: float = 0.0
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    # ``xla``: attention scores materialised by XLA; ``flash``: a fused kernel that
    # never writes them (Pallas splash attention on TPU, cuDNN on GPU, the splash
    # kernel interpreted on CPU, for tests); see ``scaling.attention``. The same
    # function either way, so not part of the run id.
    attention_impl: str = "xla"
    init_std: float = 0.02
    # ``normal``: every weight N(0, init_std²). ``torch``: PyTorch's defaults for
    # nn.TransformerEncoderLayer / nn.Linear / nn.Embedding (uniform ±1/sqrt(fan_in)
    # linears, Xavier-uniform attention projections, N(0, 1) embeddings), as
    # "Overcoming a Theoretical Limitation of Self-Attention" (section 4.1) trains with.
    init_scheme: str = "normal"
    # The loss forms logits for about this many tokens of one device's rows of the
    # (micro)batch at a time (``scaling.loss.cross_entropy_sum``): memory, not
    # results, depends on it.
    loss_chunk_tokens: int = 8192

    def __post_init__(self):
        _check_types(self)
        _require(isinstance(self.depth, int) and self.depth >= 1, "depth", "an integer >= 1", self.depth)
        _require(isinstance(self.width, int) and self.width >= 1, "width", "an integer >= 1", self.width)
        if self.num_heads is not None:
            _require(self.num_heads >= 1, "num_heads", "an integer >= 1 or None", self.num_heads)
            _require(self.width % self.num_heads == 0, "num_heads",
                     f"a divisor of width={self.width}", self.num_heads)
        else:
            _require(self.head_dim >= 1, "head_dim", "an integer >= 1", self.head_dim)
            _require(self.width % self.head_dim == 0 or self.width < self.head_dim, "head_dim",
                     f"a divisor of width={self.width} (or larger than width, giving one head)",
                     self.head_dim)
        _require(self.ff_multiplier >= 1, "ff_multiplier", "an integer >= 1", self.ff_multiplier)
        _require(self.vocab_size >= 2, "vocab_size", "an integer >= 2", self.vocab_size)
        _require(self.max_seq_len >= 1, "max_seq_len", "an integer >= 1", self.max_seq_len)
        _choice("objective", self.objective, ("causal", "masked"))
        _require(0.0 < self.mask_rate < 1.0, "mask_rate", "a fraction in (0, 1)", self.mask_rate)
        _choice("norm", self.norm, ("pre", "post"))
        _choice("activation", self.activation, ("relu", "gelu"))
        _choice("position", self.position, POSITION_ENCODINGS)
        _choice("attention_scale", self.attention_scale, ("standard", "log_length"))
        _require(0.0 <= self.dropout < 1.0, "dropout", "a probability in [0, 1)", self.dropout)
        _choice("param_dtype", self.param_dtype, ("float32", "bfloat16"))
        _choice("compute_dtype", self.compute_dtype, ("float32", "bfloat16"))
        _choice("remat", self.remat, REMAT_POLICIES)
        _choice("attention_impl", self.attention_impl, ("xla", "flash"))
        _require(self.init_std > 0, "init_std", "a positive float", self.init_std)
        _choice("init_scheme", self.init_scheme, ("normal", "torch"))
        _require(self.loss_chunk_tokens >= 1, "loss_chunk_tokens", "an integer >= 1", self.loss_chunk_tokens)

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
        return self.ff_multiplier * self.width


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are cut into sequences.

    ``source``: ``builtin`` (the offline English corpus shipped with the
    package), ``hub`` (a Hugging Face dataset, streamed), ``local`` (text /
    jsonl / parquet files), or a synthetic task: ``parity``, ``first``
    (classification, after "Overcoming a Theoretical Limitation of
    Self-Attention") or ``lookback`` (an LM task whose long-range dependency
    distance is controlled by ``lookback_distance``).
    ``tokenizer``: ``byte`` (default, no files), ``bpe`` (trained on the
    corpus and cached beside it) or ``hf:NAME_OR_PATH``.
    """

    source: str = "builtin"
    hub_name: str = ""
    hub_config: str = ""
    hub_split: str = "train"
    paths: tuple[str, ...] = ()
    text_field: str = "text"
    max_documents: int = 100_000  # hub and local sources: documents read from the stream
    validation_fraction: float = 0.02  # by document, for sources without a split
    tokenizer: str = "byte"
    bpe_vocab_size: int = 4096
    seq_len: int = 128  # tokens per training sequence
    synthetic_min_length: int = 8
    synthetic_max_length: int = 32
    synthetic_eval_min_length: int = 8
    synthetic_eval_max_length: int = 32
    lookback_distance: int = 16
    # parity/first: 0 draws a fresh string for every training example; K > 0
    # fixes a training set of K strings per seed, visited once per epoch in a
    # fresh random order (a finite training set, as in the classification papers).
    synthetic_train_size: int = 0
    # A token cache built by ``python -m scaling.data cache`` (local or gs://):
    # text sources then read only it. Not part of the run id (same tokens, same run).
    cache_dir: str = ""

    def __post_init__(self):
        _check_types(self)
        _choice("source", self.source, ("builtin", "hub", "local", "parity", "first", "lookback"))
        if self.source == "hub":
            _require(bool(self.hub_name), "hub_name", "a dataset name or path when source='hub'", self.hub_name)
        if self.source == "local":
            _require(len(self.paths) > 0, "paths", "at least one file when source='local'", self.paths)
        _require(self.max_documents >= 2, "max_documents", "an integer >= 2", self.max_documents)
        _require(0.0 < self.validation_fraction < 0.5, "validation_fraction", "a fraction in (0, 0.5)",
                 self.validation_fraction)
        _require(self.tokenizer in ("byte", "bpe") or self.tokenizer.startswith("hf:"), "tokenizer",
                 "'byte', 'bpe' or 'hf:NAME_OR_PATH'", self.tokenizer)
        _require(self.bpe_vocab_size >= 300, "bpe_vocab_size", "an integer >= 300", self.bpe_vocab_size)
        _require(self.seq_len >= 2, "seq_len", "an integer >= 2", self.seq_len)
        _require(1 <= self.synthetic_min_length <= self.synthetic_max_length, "synthetic_max_length",
                 f">= synthetic_min_length={self.synthetic_min_length} >= 1", self.synthetic_max_length)
        _require(1 <= self.synthetic_eval_min_length <= self.synthetic_eval_max_length,
                 "synthetic_eval_max_length",
                 f">= synthetic_eval_min_length={self.synthetic_eval_min_length} >= 1",
                 self.synthetic_eval_max_length)
        _require(self.lookback_distance >= 1, "lookback_distance", "an integer >= 1", self.lookback_distance)
        _require(self.synthetic_train_size >= 0, "synthetic_train_size",
                 "an integer >= 0 (0: a fresh string per example)", self.synthetic_train_size)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with warmup then decay, and the learning-rate rule across widths.

    ``lr_rule``:
    - ``constant``: every shape uses ``peak_lr``;
    - ``width_scaled``: ``peak_lr * base_width / width`` for all parameters;
    - ``mup``: μP-style per-layer rates: hidden matrices (attention and
      feed-forward kernels) get ``peak_lr * base_width / width``, embeddings,
      norms and biases keep ``peak_lr``.
    """

    peak_lr: float = 3e-3
    lr_rule: str = "constant"
    base_width: int = 64  # width at which the rule gives exactly peak_lr
    warmup_steps: int = 50
    schedule: str = "cosine"  # cosine | linear | constant
    end_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global-norm clip; 0 disables

    def __post_init__(self):
        _check_types(self)
        _require(self.peak_lr > 0, "peak_lr", "a positive float", self.peak_lr)
        _choice("lr_rule", self.lr_rule, ("constant", "width_scaled", "mup"))
        _require(self.base_width >= 1, "base_width", "an integer >= 1", self.base_width)
        _require(self.warmup_steps >= 0, "warmup_steps", "an integer >= 0", self.warmup_steps)
        _choice("schedule", self.schedule, ("cosine", "linear", "constant"))
        _require(0.0 <= self.end_lr_fraction <= 1.0, "end_lr_fraction", "a fraction in [0, 1]",
                 self.end_lr_fraction)
        _require(self.weight_decay >= 0, "weight_decay", "a float >= 0", self.weight_decay)
        _require(0 <= self.beta1 < 1, "beta1", "a float in [0, 1)", self.beta1)
        _require(0 <= self.beta2 < 1, "beta2", "a float in [0, 1)", self.beta2)
        _require(self.grad_clip >= 0, "grad_clip", "a float >= 0 (0 disables)", self.grad_clip)


# Logical axis names used by scaling.model, mapped to mesh axes. A value of
# None replicates that dimension. "batch" is an activation axis.
DEFAULT_SHARDING_RULES: tuple[tuple[str, Any], ...] = (
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


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape. One of the axes may be -1, meaning "all the rest"."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    rules: tuple[tuple[str, Any], ...] = DEFAULT_SHARDING_RULES

    def __post_init__(self):
        _check_types(self)
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            _require(size == -1 or size >= 1, f"mesh.{name}", "-1 or an integer >= 1", size)
        _require(sum(size == -1 for size in sizes.values()) <= 1, "mesh",
                 "at most one axis equal to -1", sizes)
        object.__setattr__(self, "rules", tuple((str(k), _tuplify(v)) for k, v in self.rules))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs. Budgets: ``steps`` optimizer steps of
    ``batch_size`` sequences of ``data.seq_len`` tokens each.

    ``microbatches`` k > 1 accumulates each step's gradient over k slices of
    its batch (``scaling.loss.loss_and_grads``): the same loss, gradient and
    data order as k = 1 with about 1/k of the activation memory, so it is not
    part of the run id. Every data-parallel shard's rows must split into k.
    """

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    seed: int = 0  # sets initialisation, data order and masking
    steps: int = 300
    batch_size: int = 16
    microbatches: int = 1
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batches: int = 8
    eval_at_start: bool = True  # evaluate the freshly initialised model (initial_eval_loss); costs one eval
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 10
    peak_flops: float = 2.2e11  # per device, for MFU; measured matmul peak of the dev CPU
    wandb_mode: str = "auto"  # auto (online only if an API key is set) | offline | online | disabled
    wandb_project: str = "depth-width-scaling"
    sweep_name: str = ""  # wandb group
    name: str = ""

    def __post_init__(self):
        _check_types(self)
        _require(self.steps >= 1, "steps", "an integer >= 1", self.steps)
        _require(self.batch_size >= 1, "batch_size", "an integer >= 1", self.batch_size)
        _require(1 <= self.microbatches <= self.batch_size and self.batch_size % self.microbatches == 0,
                 "microbatches", f"a divisor of batch_size={self.batch_size} (1 to {self.batch_size})",
                 self.microbatches)
        _require(self.eval_every >= 0, "eval_every", "an integer >= 0", self.eval_every)
        _require(self.eval_batches >= 1, "eval_batches", "an integer >= 1", self.eval_batches)
        _require(self.checkpoint_every >= 1, "checkpoint_every", "an integer >= 1", self.checkpoint_every)
        _require(self.keep_checkpoints >= 1, "keep_checkpoints", "an integer >= 1", self.keep_checkpoints)
        _require(self.log_every >= 1, "log_every", "an integer >= 1", self.log_every)
        _require(self.peak_flops > 0, "peak_flops", "a positive FLOP/s figure", self.peak_flops)
        _choice("wandb_mode", self.wandb_mode, ("auto", "offline", "online", "disabled"))
        _require(self.data.seq_len <= self.model.max_seq_len, "data.seq_len",
                 f"<= model.max_seq_len={self.model.max_seq_len}", self.data.seq_len)
        if self.model.attention_impl == "flash":  # the splash kernel tiles sequences in blocks of 128
            _require(self.data.seq_len % 128 == 0, "data.seq_len",
                     "a multiple of 128 with model.attention_impl='flash' (or use 'xla')", self.data.seq_len)


# ---------------------------------------------------------------------------
# dict / JSON round trip and dotted overrides (``--set optim.peak_lr=1e-3``)


def to_dict(config) -> dict:
    """A JSON-ready nested dict of a config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def from_dict(cls, data: dict):
    """Build ``cls`` (a config dataclass) from a nested dict, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)} for {cls.__name__}: allowed {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            try:
                value = from_dict(hint, value)
            except ValueError as error:  # name the section too: model.depth, not depth
                raise ValueError(f"{key}.{error}") from None
        kwargs[key] = _tuplify(value)
    return cls(**kwargs)


def _parse_scalar(text: str, current: Any):
    if isinstance(current, bool):
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"expected a boolean, got {text!r}")
    if isinstance(current, int) and not isinstance(current, bool):
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)  # 1e3 is a fine way to write 1000; 10.7 is refused by validation
            except ValueError:
                raise ValueError(f"expected an integer, got {text!r}") from None
            if not math.isfinite(number):
                raise ValueError(f"expected an integer, got {text!r}") from None
            return int(number) if number.is_integer() else number
    if isinstance(current, float):
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, got {text!r}")
        return number
    if isinstance(current, (tuple, list)):
        return tuple(part for part in text.split(",") if part)
    if current is None:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def override(config, assignments: list[str]):
    """Apply ``key.sub=value`` strings to a config, returning a new validated one."""
    data = to_dict(config)
    for assignment in assignments:
        if "=" not in assignment:
            raise ValueError(f"override {assignment!r} must look like key=value, e.g. optim.peak_lr=1e-3")
        key, text = assignment.split("=", 1)
        node, parts = data, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"override {key!r}: {part!r} is not a config section")
            node = node[part]
        if parts[-1] not in node:
            raise ValueError(f"override {key!r}: unknown field {parts[-1]!r}; allowed {sorted(node)}")
        if isinstance(node[parts[-1]], dict):
            raise ValueError(f"override {key!r}: {key} is a config section; set one of its fields, "
                             f"e.g. {key}.{next(iter(node[parts[-1]]))}=...")
        try:
            node[parts[-1]] = _parse_scalar(text, node[parts[-1]])
        except ValueError as error:
            raise ValueError(f"override {key}={text}: {error}") from None
    return from_dict(type(config), data)


# Fields that do not change what a run computes: two configs differing only
# here describe the same experiment (same run id, same results). Dotted names
# reach into sections. ``microbatches``, ``model.loss_chunk_tokens`` and
# ``model.attention_impl`` change only how a step is computed (float rounding
# aside; with dropout, microbatches also draw different dropout noise), never
# the data or the model.
_PRESENTATION_FIELDS = ("name", "wandb_mode", "wandb_project", "sweep_name", "log_every", "peak_flops",
                        "checkpoint_every", "keep_checkpoints", "mesh", "data.cache_dir", "eval_at_start",
                        "microbatches", "model.loss_chunk_tokens", "model.attention_impl")

# Fields added after run records were first committed, with the value that
# reproduces the old behaviour. A config holding that value hashes exactly as
# it did before the field existed, so adding a field never orphans records.
# Add every new result-changing field here with its default; never change an
# existing default (add a field instead).
_NEUTRAL_VALUES: dict[str, Any] = {"model.init_scheme": "normal", "data.synthetic_train_size": 0}


def _identity(config: TrainConfig) -> dict:
    data = to_dict(config)
    for dotted in _PRESENTATION_FIELDS:
        *sections, leaf = dotted.split(".")
        node = data
        for section in sections:
            node = node.get(section, {})
        node.pop(leaf, None)
    for dotted, neutral in _NEUTRAL_VALUES.items():
        *sections, leaf = dotted.split(".")
        node = data
        for section in sections:
            node = node.get(section, {})
        if leaf in node and node[leaf] == neutral:
            del node[leaf]
    return data


def config_id(config: TrainConfig, length: int = 12) -> str:
    """A stable hex id (``length`` characters) of everything in ``config`` that affects the trained model."""
    import hashlib

    return hashlib.sha256(json.dumps(_identity(config), sort_keys=True).encode()).hexdigest()[:length]
