"""Parameter budgets: the 12·L·d² accounting every sweep, table and fit uses.

One self-attention layer of width d has 4·d² attention weights (query, key,
value, output) and 8·d² feed-forward weights (d -> 4d -> d), so depth L gives
the *non-embedding* size N = 12·L·d². Embeddings (token, position,
unembedding) and the small LayerNorm / bias vectors are counted separately.

JAX and Flax are imported only by the functions that build the parameter
tree, so the launcher's listing and ``--help`` start without them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from scaling.config import ModelConfig

# Parameter-tree names that hold the 12·d² per layer.
_CORE_MODULES = ("attention", "mlp")
_EMBEDDING_NAMES = ("token_embedding", "position_embedding", "unembedding")


def non_embedding_params(depth: int, width: int) -> int:
    """N = 12·L·d² in parameters, for ``depth`` layers of ``width`` channels."""
    if depth < 1 or width < 1:
        raise ValueError(f"depth and width must be >= 1, got depth={depth}, width={width}")
    return 12 * int(depth) * int(width) ** 2


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def training_state_bytes(model: ModelConfig) -> int:
    """Bytes of a run's training state held whole on one chip: its parameters four times at
    ``model.param_dtype`` (each parameter, its gradient and AdamW's two moments, which optax keeps at the
    parameters' dtype). Parameters are counted by arithmetic, for deciding meshes while a sweep expands (no tree
    is built): the matrices ``scaling.model.flops`` counts plus token and position tables as if untied and learned;
    norms and biases are left out (under 1% for the gpt block, ``tests/test_parallelism.py``)."""
    from scaling.model.flops import training_flops_per_token

    per_token = training_flops_per_token(model, 1)  # 6 FLOPs per matrix parameter per trained token
    parameters = (per_token.layers + per_token.unembedding) / 6 + (model.vocab_size + model.max_seq_len) * model.width
    return int(4 * _DTYPE_BYTES[model.param_dtype] * parameters)


def abstract_params(config: ModelConfig, *, padded: bool = False) -> dict:
    """The parameter tree as ``jax.ShapeDtypeStruct`` leaves, without allocating it.

    Its vocabulary axes hold ``config.vocab_size`` ids, the parameters the
    model has; ``padded=True`` gives the tree as stored and trained, whose
    vocabulary axes are padded (``scaling.model.transformer.padded_vocab_size``).
    """
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from scaling.model.transformer import VOCAB_MULTIPLE, Transformer

    # The parameters do not depend on how attention is computed, and the fused kernel needs whole
    # 128-token blocks where this traces 8 tokens: trace the XLA path.
    config = dataclasses.replace(config, attention_impl="xla")
    model = Transformer(config, vocab_multiple=VOCAB_MULTIPLE if padded else 1)
    tokens = jax.ShapeDtypeStruct((1, min(config.max_seq_len, 8)), jnp.int32)
    variables = jax.eval_shape(lambda t: model.init(jax.random.PRNGKey(0), t), tokens)
    return nn.unbox(variables["params"])


def count_params(model_config: ModelConfig) -> dict:
    """Exact parameter counts of the real parameter tree, by group.

    Returns ``{"non_embedding", "embedding", "other", "total"}`` in parameters:
    ``non_embedding`` sums the attention and feed-forward kernels (12·L·d² for
    the default feed-forward multiplier of 4), ``embedding`` the token,
    position and unembedding tables, ``other`` LayerNorm scales/offsets and
    biases. Ids padding the vocabulary are not parameters and are not
    counted. Uses ``jax.eval_shape``, so a 175B-parameter shape costs no memory.
    """
    import jax

    counts = {"non_embedding": 0, "embedding": 0, "other": 0}
    leaves = jax.tree_util.tree_flatten_with_path(abstract_params(model_config))[0]
    for path, leaf in leaves:
        names = [jax.tree_util.keystr((entry,), simple=True) for entry in path]
        size = int(np.prod(leaf.shape, dtype=np.int64))
        if names[-1] == "kernel" and any(module in names for module in _CORE_MODULES):
            counts["non_embedding"] += size
        elif any(name in _EMBEDDING_NAMES for name in names):
            counts["embedding"] += size
        else:
            counts["other"] += size
    counts["total"] = sum(counts.values())
    return counts


def width_for_budget(depth: int, params: float, multiple_of: int = 64) -> int:
    """The width (a positive multiple of ``multiple_of`` channels) whose 12·L·d² is nearest ``params``.

    Nearness is measured in log N, so a budget between two candidate widths
    goes to the one within the smaller factor. Raises ``ValueError`` when even
    the narrowest allowed width overshoots the budget by more than 2×.
    """
    if not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth={depth!r} is invalid: allowed an integer >= 1")
    if not (params > 0) or not math.isfinite(params):
        raise ValueError(f"params={params!r} is invalid: allowed a positive, finite parameter count")
    if not isinstance(multiple_of, (int, np.integer)) or multiple_of < 1:
        raise ValueError(f"multiple_of={multiple_of!r} is invalid: allowed an integer >= 1")
    ideal = math.sqrt(params / (12 * depth))
    low = max(1, math.floor(ideal / multiple_of)) * multiple_of
    high = low + multiple_of
    candidates = [w for w in (low, high) if w >= multiple_of]
    best = min(candidates, key=lambda w: abs(math.log(non_embedding_params(depth, w) / params)))
    if non_embedding_params(depth, best) > 2 * params:
        raise ValueError(
            f"budget params={params:.3g} is too small for depth={depth}: the narrowest width "
            f"{multiple_of} already gives 12·L·d² = {non_embedding_params(depth, multiple_of):.3g}")
    return best


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One (depth, width) shape of a budget grid; ``params`` is its realised 12·L·d²."""

    depth: int
    width: int
    params: int
    budget: float

    def __iter__(self):  # unpacks as (depth, width, params)
        return iter((self.depth, self.width, self.params))


class Grid(list):
    """A list of ``GridPoint``; ``skipped`` holds (depth, budget, reason) for budgets a depth cannot meet."""

    def __init__(self, points=(), skipped=()):
        super().__init__(points)
        self.skipped = list(skipped)


def grid(depths, budgets, multiple_of: int = 64) -> Grid:
    """All (depth, width, realised N) shapes for ``depths`` × ``budgets`` (parameters).

    Widths come from ``width_for_budget``. Shapes that two budgets round to
    are kept once. A budget too small for a depth is recorded in
    ``.skipped`` with the reason (and is not an error), so a sweep can report it.
    """
    if not depths or not budgets:
        raise ValueError("grid needs at least one depth and one budget")
    result, seen = Grid(), set()
    for depth in sorted(set(depths)):
        for budget in sorted(budgets):
            try:
                width = width_for_budget(depth, budget, multiple_of)
            except ValueError as error:
                if "too small" not in str(error):
                    raise
                result.skipped.append((depth, budget, str(error)))
                continue
            if (depth, width) not in seen:
                seen.add((depth, width))
                result.append(GridPoint(depth, width, non_embedding_params(depth, width), budget))
    return result
